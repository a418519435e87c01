package fdbsync

import "errors"

// ErrNoFDB is returned by OpenCluster in a build without FoundationDB
// support (no fdb build tag).
var ErrNoFDB = errors.New("leaseq was built without FoundationDB support; rebuild with `make build-fdb` (needs the FoundationDB client library libfdb_c)")

// ClusterTimeout bounds every transaction on a real cluster (FDB's
// transaction timeout option, error 1031 when hit, not retried): a call
// never hangs on an unreachable cluster for longer than this.
const ClusterTimeout = 10_000 // milliseconds
