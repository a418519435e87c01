// alloc.h: the C allocator's settings for a process that embeds a store
// (alloc.go). RocksDB allocates through malloc; these tell glibc's malloc
// to keep the memory of flushed memtables for the next ones.
#ifndef LEASEQ_ALLOC_H
#define LEASEQ_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// lq_keep_freed_memory sets malloc's mmap threshold, trim threshold and
// arena limit (mallopt M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, M_ARENA_MAX)
// and returns 1, or returns 0 where the C library is not glibc.
int lq_keep_freed_memory(size_t mmap_threshold, size_t trim_threshold, int arena_max);

// lq_malloc_churn_kept allocates n blocks of size bytes (n at most 64),
// writes to each, frees them all and returns how many of those bytes
// malloc still holds free afterwards, for the package's tests; -1 where
// the C library is not glibc.
int64_t lq_malloc_churn_kept(int n, size_t size);

#ifdef __cplusplus
}
#endif

#endif
