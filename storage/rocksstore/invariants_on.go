//go:build invariants

package rocksstore

// invariants turns on checkIndexes after every batch (make test builds
// with -tags invariants).
const invariants = true
