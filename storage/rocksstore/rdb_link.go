//go:build !leaseq_no_link

package rocksstore

// The dynamic link against the system's RocksDB. A static build (make
// static) sets the tag leaseq_no_link and passes its own flags in
// CGO_LDFLAGS instead.

// #cgo LDFLAGS: -lrocksdb -lstdc++ -lm -pthread
import "C"
