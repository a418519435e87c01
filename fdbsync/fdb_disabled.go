//go:build !fdb

package fdbsync

// OpenCluster connects to a FoundationDB cluster. This build has no
// FoundationDB client (it was built without the fdb tag), so it always
// returns ErrNoFDB; `make build-fdb` builds the real one.
func OpenCluster(clusterFile string, o Options) (*Store, error) {
	return nil, ErrNoFDB
}
