#include "alloc.h"

#include <stdlib.h>
#include <string.h>

#if defined(__GLIBC__)
#include <malloc.h>

int lq_keep_freed_memory(size_t mmap_threshold, size_t trim_threshold, int arena_max) {
  if (mallopt(M_ARENA_MAX, arena_max) != 1) return 0;
  if (mallopt(M_MMAP_THRESHOLD, (int)mmap_threshold) != 1) return 0;
  if (mallopt(M_TRIM_THRESHOLD, (int)trim_threshold) != 1) return 0;
  return 1;
}

int64_t lq_malloc_churn_kept(int n, size_t size) {
  char* blocks[64];
  if (n > 64) n = 64;
  struct mallinfo2 before = mallinfo2();
  for (int i = 0; i < n; i++) {
    blocks[i] = malloc(size);
    if (blocks[i] != NULL) memset(blocks[i], 1, size);
  }
  for (int i = 0; i < n; i++) free(blocks[i]);
  struct mallinfo2 after = mallinfo2();
  return (int64_t)after.fordblks - (int64_t)before.fordblks;
}

#else

int lq_keep_freed_memory(size_t mmap_threshold, size_t trim_threshold, int arena_max) {
  (void)mmap_threshold;
  (void)trim_threshold;
  (void)arena_max;
  return 0;
}

int64_t lq_malloc_churn_kept(int n, size_t size) {
  (void)n;
  (void)size;
  return -1;
}

#endif
