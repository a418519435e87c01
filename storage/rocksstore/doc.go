// Package rocksstore is the embedded RocksDB implementation of
// storage.Store, leaseq's default backend. It is the only package that
// imports grocksdb; RocksDB errors are translated once, in translate.
//
// # Layout
//
// One column family; every namespace is a key prefix laid out by dbkeys
// (available, visibility, in_progress, leases, lease_expiry, dlq, dedup,
// dedup_expiry, delayed, payload, meta). An item's state is where its record
// lives; indexes point at it:
//
//   - available items have one visibility entry (queue, priority,
//     visible_at, id), and a delayed entry (visible_at, queue, id) while they
//     count as delayed; the sweeper removes delayed entries that came due,
//     which moves the item from the delayed to the ready counter;
//   - inflight items carry their lease token; the lease record lists them
//     and has one lease_expiry entry;
//   - dead items carry reason and dead_at.
//
// Payloads up to defaultInlineMax bytes are stored inside the item record;
// larger ones under a payload key written once at enqueue and deleted at
// ack or dead purge, so poll, nack and expiry do not rewrite them.
//
// # Transactions and concurrency
//
// Every mutating call is one RocksDB transaction (Purge and Sweep use one
// per bounded chunk). Reads that decide a change use GetForUpdate. Counters
// (ready, delayed, inflight, dead, leases and the lifetime totals) are
// merge operands written into the transaction's batch without locking
// (countersMerge adds them), so they commit atomically with the change but
// concurrent commits on one queue do not serialize on the counters key and
// can share an fsync. An in-memory mirror serves Stats in O(1); Open reads
// the merged counters, never the items.
//
// Polls on one queue coalesce: the first poller becomes the leader and
// claims, in one transaction with one commit, for every poll waiting when
// its pass starts; each gets its own lease. When the pass ends the next
// waiter leads. Concurrent claims therefore never fight over the head.
//
// The head of a queue is deleted forever, so a scan from the start of the
// visibility index would walk every tombstone. Each queue keeps, per
// priority, a lower bound (head) below which only deleted entries remain;
// a claim pass starts there and moves it past what it claimed. Writers
// lower the bound before committing an entry below it, and a pass that ran
// concurrently keeps the lowest such entry, so no entry is ever skipped.
// The global time indexes (lease_expiry, delayed, dedup_expiry) have the
// same kind of cursor for the sweeper. Every iterator has explicit lower
// and upper bounds. SSTs with many deletions are compacted early
// (CompactOnDeletionCollector), so tombstones also leave the LSM.
//
// Lock order: Store.life (shared) -> queueState.claim -> Store.mu ->
// queueState.mu; Store.ids, Store.txns, the cursors' and sweepMu's locks
// are leaves or taken without others held except life. RocksDB row locks
// are taken inside transactions with no Go lock held, except sweepMu.
//
// # Durability
//
// With SyncAlways every commit waits for the WAL fsync before the call
// returns; RocksDB's write groups let concurrent commits share one fsync
// (Metrics.WALSyncs < SyncCommits under load). With SyncNone the WAL is
// written but not synced.
//
// # Measurements
//
// See measurements.md in this directory for the numbers behind the choices
// (transaction DB flavour, payload layout, head cursor and compaction).
package rocksstore
