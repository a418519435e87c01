// rdb.h: leaseq's own C binding over RocksDB's public C++ API (rdb.cc),
// for storage/rocksstore only. It exists because RocksDB's C API cannot
// write a transaction's batch without indexing it (see rdb.go).
#ifndef LEASEQ_RDB_H
#define LEASEQ_RDB_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lq_db lq_db;
typedef struct lq_txn lq_txn;
typedef struct lq_iter lq_iter;
typedef struct lq_snap lq_snap;

enum { LQ_TXN_DB = 0, LQ_PLAIN_DB = 1, LQ_READ_ONLY = 2 };

typedef struct {
	int mode;             // LQ_TXN_DB, LQ_PLAIN_DB or LQ_READ_ONLY
	int64_t cache_bytes;  // block cache; 0: RocksDB's default
	int64_t memtable;     // write_buffer_size; 0: RocksDB's default
	int stats;            // keep statistics (lq_statistics)
	int del_compact;      // compact-on-deletion collector (1000, 500)
	int point_in_time;    // WAL recovery: point in time (else tolerate a corrupted tail)
	int64_t lock_timeout; // transaction lock timeout, ms
	const char* log_dir;  // RocksDB's info log directory; NULL: the database's
	int64_t zeroed_wal;   // LQ_TXN_DB: new WALs are created over zeros of this size (zerowal.h); 0: empty
} lq_options;

// Every call that can fail returns 0 (or a count) on success and -1 with
// *err set to a malloc'd message (free with lq_free) on failure.

lq_db* lq_open(const char* dir, const lq_options* o, const char* const* families, int n, char** err);
void lq_close(lq_db* db);
// lq_list_families returns the database's family names, each ended by a
// NUL, in a malloc'd buffer of *len bytes.
char* lq_list_families(const char* dir, size_t* len, char** err);
// lq_route sends keys whose first byte is ns to family (an index into
// lq_open's families); -1 removes the route.
void lq_route(lq_db* db, int ns, int family);
void lq_free(void* p);

// Reads. snap may be NULL (the latest state). lq_get reads k from family
// (-1: the family of k's first byte), copies the value to out when it fits
// in cap and returns its length; -2: not found.
int64_t lq_get(lq_db* db, const lq_snap* snap, int family, const char* k, size_t kl, char* out, size_t cap, char** err);
const lq_snap* lq_snapshot(lq_db* db);
void lq_release_snapshot(lq_db* db, const lq_snap* snap);

// Writes outside transactions. buf holds encoded writes (see
// lq_txn_write); sync: fsync the WAL before returning; mark: the batch's
// number for lq_wait_logged (0: none).
// lq_write and lq_flush_wal return NULL, or the error (malloc'd): no
// out-parameter, so a Go caller passes no pointer of its own (a Go local
// whose address goes to C is moved to the heap: an allocation per batch).
char* lq_write(lq_db* db, const char* buf, size_t n, int sync, uint64_t mark);
char* lq_flush_wal(lq_db* db, int sync);
// lq_can_wait_logged reports whether lq_wait_logged can tell when a
// marked commit's record is in the WAL file (a store opened with
// lq_options.zeroed_wal, whose logs do the telling: zerowal.h,
// WALProgress).
int lq_can_wait_logged(lq_db* db);
// lq_wait_logged blocks until the commit marked mark (lq_write,
// lq_txn_commit) has its record in the WAL file (returns 1: an fsync from
// now on covers it) or ended without one (returns 0). lq_mark_done ends
// a mark whose batch committed nothing.
int lq_wait_logged(lq_db* db, uint64_t mark);
void lq_mark_done(lq_db* db, uint64_t mark);
// lq_marks_logged counts the times a marked commit was told logged: one
// per marked commit (for tests).
uint64_t lq_marks_logged(lq_db* db);
int lq_flush(lq_db* db, char** err);
int lq_compact_family(lq_db* db, int family, char** err);
// lq_statistics returns RocksDB's statistics dump (malloc'd), or NULL.
char* lq_statistics(lq_db* db);
// lq_wal_files reports how many WALs this open created over a zero-filled
// spare and how many empty (both 0 without lq_options.zeroed_wal).
void lq_wal_files(lq_db* db, int64_t* zeroed, int64_t* plain);
// lq_wal_synced reports the last WAL made durable as the next was created
// (rdb.cc, OrderedLogs): its number and its size then (0 and -1: none).
void lq_wal_synced(lq_db* db, uint64_t* log, int64_t* size);
// lq_property returns a property of a family (malloc'd), or NULL.
char* lq_property(lq_db* db, int family, const char* name);
// lq_write_stall_micros is the time writes have waited on RocksDB's
// write stalls (slowed down or stopped) since open.
int64_t lq_write_stall_micros(lq_db* db);
// lq_pause_background pauses (1) or resumes (0) flushes and compactions.
void lq_pause_background(lq_db* db, int pause);

// Iterators over one family, between lower (inclusive) and upper
// (exclusive; NULL: none). once: a single pass that does not fill the
// block cache and reads ahead. The bounds are copied.
lq_iter* lq_iter_new(lq_db* db, const lq_snap* snap, int family, const char* lower, size_t ll,
		const char* upper, size_t ul, int once);
// lq_entry is where an iterator leaves its current entry: k/v are valid
// until the iterator moves; err (malloc'd) is set after a -1.
typedef struct {
  const char* k;
  size_t kl;
  const char* v;
  size_t vl;
  char* err;
} lq_entry;
// lq_iter_entry returns the iterator's entry, in C memory for the
// iterator's life: callers read it after each move without passing
// pointers of their own.
lq_entry* lq_iter_entry(lq_iter* it);
// lq_iter_seek positions at the first key >= k (k NULL: the first key);
// lq_iter_next moves on. Both return 1 with the entry in lq_iter_entry,
// 0 at the end, -1 on error.
int lq_iter_seek(lq_iter* it, const char* k, size_t kl);
int lq_iter_next(lq_iter* it);
void lq_iter_destroy(lq_iter* it);

// Transactions (LQ_TXN_DB only). lq_txn_begin reuses old when not NULL.
lq_txn* lq_txn_begin(lq_db* db, lq_txn* old);
void lq_txn_destroy(lq_txn* t);
// lq_txn_write appends encoded writes to the transaction's batch: per
// write an op byte ('p' put, 'd' delete, 's' single delete, 'm' merge), a
// uint32 key length, the key, and for put and merge a uint32 value length
// and the value (host byte order). The key's first byte picks its family
// (lq_route), except for 'D': a delete whose op byte is followed by its
// family's index. The writes are neither locked nor
// indexed: later reads in the transaction do not see them.
void lq_txn_write(lq_txn* t, const char* buf, size_t n);
// lq_txn_get_for_update reads keys start..n-1 with an exclusive
// GetForUpdate. Key i is keys[koff[i]:koff[i+1]]. Each value found is
// copied to out at *used (vlen[i] its length; -1: not found) until one does
// not fit in cap: then vlen[i] is the length it needs and i is returned.
// Returns n when every key is read, -1 on error.
int64_t lq_txn_get_for_update(lq_txn* t, const char* keys, const uint32_t* koff, int64_t start, int64_t n,
		char* out, size_t cap, size_t* used, int64_t* vlen, char** err);
// lq_txn_lock locks keys 0..n-1 (as lq_txn_get_for_update) without
// reading them: GetForUpdate with no value. Returns 0, or -1 on error.
int lq_txn_lock(lq_txn* t, const char* keys, const uint32_t* koff, int64_t n, char** err);
// lq_txn_get reads one key in the transaction without locking it, as
// lq_get.
int64_t lq_txn_get(lq_txn* t, const char* k, size_t kl, char* out, size_t cap, char** err);
int lq_txn_commit(lq_txn* t, uint64_t mark, char** err);
int lq_txn_rollback(lq_txn* t, char** err);

#ifdef __cplusplus
}
#endif
#endif
