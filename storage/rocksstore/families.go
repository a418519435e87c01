package rocksstore

// #include <rocksdb/c.h>
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/linxGnu/grocksdb"
)

// Column families. Each namespace of dbkeys lives in its own column
// family, named below; keys keep their namespace byte, so every encoder
// and decoder of dbkeys is the same whatever family a key is in. A family
// per namespace keeps a namespace's appended tail (an available record, a
// visibility entry) out of other namespaces' key ranges: a flushed table
// then holds one namespace, does not overlap the tables flushed before it,
// and compaction moves it down a level instead of rewriting it (see
// doc.go for the measurement).
//
// RocksDB requires the family "default". Format 1 databases keep every
// namespace there; Open moves them into their families (migrate.go).

// familyNames maps a namespace byte to its column family's name. Part of
// the on-disk format: never rename.
var familyNames = map[byte]string{
	dbkeys.NsMeta:        "meta",
	dbkeys.NsAvailable:   "available",
	dbkeys.NsVisibility:  "visibility_index",
	dbkeys.NsInProgress:  "in_progress",
	dbkeys.NsLeases:      "leases",
	dbkeys.NsLeaseExpiry: "lease_expiry",
	dbkeys.NsDLQ:         "dlq",
	dbkeys.NsDedup:       "dedup",
	dbkeys.NsDedupExpiry: "dedup_expiry",
	dbkeys.NsDelayed:     "delayed",
	dbkeys.NsPayload:     "payload",
}

// defaultFamily is RocksDB's own family: empty in format 2.
const defaultFamily = "default"

// families routes a key to its column family by its namespace byte.
type families struct {
	byNs    [256]*grocksdb.ColumnFamilyHandle
	c       *[256]*C.rocksdb_column_family_handle_t // byNs's C handles, for batchio: an allocation of its own, holding no Go pointer, so cgo may be passed it
	handles []*grocksdb.ColumnFamilyHandle          // as opened, for flushes and Destroy
	def     *grocksdb.ColumnFamilyHandle            // "default"
}

// familyList returns every family's name, default first: what Open opens
// (creating those that are missing).
func familyList() []string {
	names := []string{defaultFamily}
	for ns := 0; ns < 256; ns++ {
		if n, ok := familyNames[byte(ns)]; ok {
			names = append(names, n)
		}
	}
	return names
}

// newFamilies indexes handles, opened with names. A namespace whose
// family was not opened has no route (of panics); CheckDir opens only the
// families a database has.
func newFamilies(names []string, handles []*grocksdb.ColumnFamilyHandle) *families {
	ns := make(map[string]byte, len(familyNames))
	for b, n := range familyNames {
		ns[n] = b
	}
	f := &families{handles: handles, c: new([256]*C.rocksdb_column_family_handle_t)}
	for i, h := range handles {
		if names[i] == defaultFamily {
			f.def = h
			continue
		}
		if b, ok := ns[names[i]]; ok {
			f.byNs[b] = h
			f.c[b] = cFamily(h)
		}
	}
	return f
}

// singleFamily routes every namespace to the default family: format 1,
// read as it is by CheckDir.
func (f *families) singleFamily() {
	for b := range familyNames {
		f.byNs[b] = f.def
		f.c[b] = cFamily(f.def)
	}
}

// of returns key's family. Every key starts with a namespace byte of
// dbkeys; a key without one is a bug.
func (f *families) of(key []byte) *grocksdb.ColumnFamilyHandle {
	h := f.byNs[key[0]]
	if h == nil {
		panic(fmt.Sprintf("rocksstore: key %x outside every open column family", key))
	}
	return h
}

// flush flushes every family's memtables with flushCF (a DB's or a
// TransactionDB's FlushCF) and waits for them.
func (f *families) flush(flushCF func(*grocksdb.ColumnFamilyHandle, *grocksdb.FlushOptions) error) error {
	fo := grocksdb.NewDefaultFlushOptions()
	defer fo.Destroy()
	fo.SetWait(true)
	for _, h := range f.handles {
		if err := flushCF(h, fo); err != nil {
			return err
		}
	}
	return nil
}

func (f *families) destroy() {
	for _, h := range f.handles {
		h.Destroy()
	}
}

// familyOptions returns o once per name, as RocksDB's open wants it: every
// family has the same options.
func familyOptions(o *grocksdb.Options, names []string) []*grocksdb.Options {
	opts := make([]*grocksdb.Options, len(names))
	for i := range opts {
		opts[i] = o
	}
	return opts
}

// cFamily is the C handle inside grocksdb's ColumnFamilyHandle (its first
// field, like the handles of batchio.go; TestBatchIO checks it).
func cFamily(h *grocksdb.ColumnFamilyHandle) *C.rocksdb_column_family_handle_t {
	return *(**C.rocksdb_column_family_handle_t)(unsafe.Pointer(h))
}

// cTable is f's C table for batchio's C helpers.
func (f *families) cTable() **C.rocksdb_column_family_handle_t {
	return &f.c[0]
}
