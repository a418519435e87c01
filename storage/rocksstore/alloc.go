package rocksstore

/*
#include "alloc.h"
*/
import "C"

import (
	"os"
	"strings"
)

// Memory freed by flushed memtables, kept for the next ones.
//
// RocksDB fills each memtable from an arena of 1 MiB blocks taken from
// malloc, and frees them when the memtable has been flushed. glibc's
// malloc gives freed memory at the top of a heap back to the kernel as
// soon as more than a few MiB of it is free there (its trim threshold,
// which it sets to twice the largest block it has had to map on its own),
// so every new memtable started on fresh memory again: a page fault for
// every 4 KiB the commit wrote into it, on the commit pipeline's serial
// path, where a fault costs 3-10 µs in a VM. Under e2e over RPC such
// faults were 4.1 % of the node's samples.
//
// KeepFreedMemory sets malloc's trim threshold to 32 MiB, its mmap
// threshold to 8 MiB (above the arena's blocks; setting either stops
// glibc adjusting them) and its arenas to at most 2, so that each of at
// most two heaps keeps up to 32 MiB of freed memory at its top for the
// next memtable: at most 64 MiB more than glibc's defaults keep. An e2e
// row in process then took a third fewer page faults (44k against 67k in
// 6 s), and in pairs against the build before the e2e rows made 5-12 %
// more items/s for 10-40 MB more peak RSS. Without the arena limit a heap
// for each of up to eight threads per CPU could keep its share: 64 MiB
// per heap cost the in-process harness 274 MB more peak RSS after a
// produce-b100 row. docs/BENCHMARKS.md, session 57, "Flushed memtables'
// memory kept in malloc", has the measurements.
//
// It changes the process's malloc for every library in it, so the store
// does not call it on its own: `leaseq serve` does at start, and an
// application embedding a store may, as with SuggestedProcs. An operator
// whose GLIBC_TUNABLES sets any of the three keeps them all: KeepFreedMemory
// then changes nothing. It reports whether it changed the settings (never
// where the C library is not glibc).
func KeepFreedMemory() bool { return keepFreedMemory(os.Getenv("GLIBC_TUNABLES")) }

// The settings KeepFreedMemory makes.
const (
	keptMmapThreshold = 8 << 20
	keptTrimThreshold = 32 << 20
	keptArenas        = 2
)

func keepFreedMemory(tunables string) bool {
	if tunablesSetMalloc(tunables) {
		return false
	}
	return C.lq_keep_freed_memory(C.size_t(keptMmapThreshold), C.size_t(keptTrimThreshold), C.int(keptArenas)) == 1
}

// tunablesSetMalloc reports whether a GLIBC_TUNABLES value sets malloc's
// mmap threshold, trim threshold or arena limit.
func tunablesSetMalloc(v string) bool {
	for _, kv := range strings.Split(v, ":") {
		switch name, _, _ := strings.Cut(kv, "="); name {
		case "glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold", "glibc.malloc.arena_max":
			return true
		}
	}
	return false
}

// mallocChurnKept allocates, writes and frees n blocks of size bytes and
// returns how many of those bytes malloc still holds free (-1 where the C
// library is not glibc); for tests.
func mallocChurnKept(n, size int) int64 {
	return int64(C.lq_malloc_churn_kept(C.int(n), C.size_t(size)))
}
