// Package rocksstore is the embedded RocksDB implementation of
// storage.Store, leaseq's default backend. It is the only package that
// imports grocksdb; RocksDB errors are translated once, in translate.
//
// # Layout
//
// One column family; every namespace is a key prefix laid out by dbkeys
// (available, visibility, in_progress, leases, lease_expiry, dlq, dedup,
// dedup_expiry, delayed, payload, meta). Prefixes rather than column
// families: every transaction touches several namespaces, all share one
// WAL either way, and one family keeps one memtable and one set of
// compactions on a 2-core box (not measured against column families).
// An item's state is where its record lives; indexes point at it:
//
//   - available items have one visibility entry (queue, priority,
//     visible_at, id), and a delayed entry (visible_at, queue, id) while they
//     count as delayed; the sweeper removes delayed entries that came due,
//     which moves the item from the delayed to the ready counter;
//   - inflight items carry their lease token; the lease record lists them
//     and has one lease_expiry entry;
//   - dead items carry reason and dead_at.
//
// Payloads up to defaultInlineMax (4 KiB) are stored inside the item
// record; larger ones under a payload key written once at enqueue and
// deleted at ack or dead purge, so poll, nack and expiry do not rewrite
// them (see Measurements).
//
// Ids are a big-endian sequence number (reserved in blocks of idBlock with
// one synced meta write per block, so Open reads one key instead of
// scanning) followed by the enqueue instant. Lease tokens are 16 bytes from
// crypto/rand.
//
// # Transactions and concurrency
//
// Every mutating call is one RocksDB transaction on a pessimistic
// TransactionDB (Purge and Sweep use one per bounded chunk); reads that
// decide a change use GetForUpdate, which locks the item, lease or dedup
// key that owns everything the transaction then writes. A transaction
// buffers its writes (reads see them first) and at commit puts them into
// its write batch in key order and untracked: sorted, the memtable inserts
// a run instead of searching its skiplist from the top for every key;
// untracked, the lock manager is skipped for keys that are either fresh
// (new ids, lease tokens and their index entries) or covered by the
// GetForUpdate on their owner. An enqueue without dedup keys reads nothing
// and commits as such a blind batch without any GetForUpdate.
// Counters (ready, delayed, inflight, dead, leases and the lifetime totals)
// are merge operands in the same batch (countersMerge adds them), so they
// commit atomically with the change, but concurrent commits on one queue
// never wait for each other on the counters key and so share fsyncs. (A
// TransactionDB write batch would lock every key in it, the counters key
// included, through the fsync: measured, 16 concurrent synced enqueues then
// got 1.0 fsync per commit instead of 0.16.) An in-memory mirror serves
// Stats in O(1); Open reads the merged counters, never the items.
//
// Polls on one queue coalesce: the first poller becomes the leader and
// claims, in one transaction with one commit, for every poll waiting when
// its pass starts (up to maxPassItems); each gets its own lease. When the
// pass ends the next waiter leads. Concurrent claims therefore never fight
// over the head.
//
// The head of a queue is deleted forever, so a scan from the start of the
// visibility index would walk every tombstone. Each queue keeps, per
// priority, a lower bound (head) below which only deleted entries remain;
// a claim pass starts there and moves it past what it claimed. Writers
// announce an entry before committing it (lowering the bound) and retire
// the announcement after; a pass never moves a head above an entry that
// was announced when it began or during it, so no entry is skipped. The
// global time indexes (lease_expiry, delayed, dedup_expiry) have the same
// kind of cursor for the sweeper. Every iterator has explicit lower and
// upper bounds. SSTs dense with deletions are compacted early
// (CompactOnDeletionCollector: 500 deletions in any 1000 entries), so
// tombstones also leave the LSM.
//
// Lock order: Store.life (shared) -> queueState.claim -> Store.mu ->
// queueState.mu. Store.ids, Store.txns and the cursors' locks are leaves;
// sweepMu is taken before any transaction of a sweep. RocksDB row locks
// are taken inside transactions with no Go lock held except sweepMu;
// lock-wait deadlocks between transactions (purge locks item then lease,
// ack lease then item) are detected by RocksDB and retried.
//
// # Durability
//
// With SyncAlways every commit waits for the WAL fsync before the call
// returns; RocksDB's write groups let concurrent commits share one fsync
// (Metrics.WALSyncs < Metrics.SyncCommits under load). With SyncNone the
// WAL is written but not synced. Metrics times fsyncs and writes with
// RocksDB's statistics; the store never reads a clock.
//
// # Measurements
//
// Numbers from go test -bench on the project's 2-core VM while five other
// engineers ran builds and tests (load average 6-14): absolute rates are
// 4-10x below a quiet machine (a raw RocksDB WriteBatch of 100 synced
// values managed 27k values/s here, against 300k/s measured on a quiet
// machine of the same kind), so choices were made on ratios and on CPU
// time per item (cpu-µs/item, process user+system time).
//
// Transaction DB: pessimistic TransactionDB, measured twice. First, with
// every write going through the transaction's Put (locked or tracked):
// BenchmarkCycle (enqueue, poll, ack in batches of 32 x 256 B, sync=none)
// cost 67-71 cpu-µs/item on TransactionDB against 76-87 on
// OptimisticTransactionDB with one worker and 58-65 against 95-99 with four
// on one queue; an optimistic commit validated every written key against
// the memtable. After writes became untracked (see above) the gap closed:
// one worker 42-43 against 52-59 cpu-µs/item; four workers, sync=always,
// 68-76 against 71-91 cpu-µs/item and 9.5-13.7k against 7.9-16.5k items/s
// in alternating runs (noise larger than the difference); blind enqueues
// (batches of 100, sync=always) 9.6-11 against 8.2-9.3 cpu-µs/item, where
// the optimistic base DB writes a plain batch. With claims serialized per
// queue by the combiner there are few conflicts for optimism to save, and
// a pessimistic commit never fails for lack of memtable history, so the
// default stays pessimistic. The optimistic engine stays behind an
// unexported option: the focused tests, Run, RunModel and RunHistory pass
// on both.
//
// Payload layout: BenchmarkPayloadLayout (enqueue, poll, nack, poll, ack;
// sync=none): at 256 B inline costs 136 cpu-µs/item against 170 external
// (an extra key written, read and deleted per item); at 64 KiB inline
// costs 1643 against 631 external (the payload is rewritten by every
// poll and nack). Hence inline up to 4 KiB, external above.
//
// Head cursor and compaction: BenchmarkPollAckAfterChurn (poll+ack,
// batches of 32, sync=none, 200k ready backlog). With heads and deletion
// compaction, poll+ack after 1M completed items ran at 0.93x the rate of a
// fresh database (18.8k against 20.1k items/s; CPU per item 51.7 against
// 57.0 µs, so 1.10x lower) in the final run, 1.87x in an earlier one under
// heavy load; after 200k, 0.87x (CPU 0.93x): flat within the noise. Without heads but with deletion compaction, the
// claim scan walks the tombstones still in the memtable and L0: 576
// items/s against 4769 with heads (594 against 76 cpu-µs/item), building
// the 200k churn took 4m13s against 46s, and a profile shows 97% of the
// time in DBIter::FindNextUserEntry. So compaction alone does not keep
// poll cost flat; the heads do (the collector stays on to shed tombstones
// from SSTs; its own effect with heads on was not measured separately).
//
// Group commit: BenchmarkGroupCommit, one-item synced enqueues: 1 worker
// 1.0 fsync per commit (8.5k items/s, fsync ~90 µs at a quiet moment);
// 16 workers 0.16 fsyncs per commit (19.9k items/s).
//
// Memtable: BenchmarkMemtableSize (cycle, sync=none) found no difference
// between 4, 8, 32 and 64 MiB memtables (47-56 cpu-µs/item each, within
// noise); 32 MiB keeps flushes and L0 files few.
//
// Statistics: RocksDB statistics (which Metrics reads) cost nothing
// measurable in BenchmarkStatisticsCost (62-71 against 64-73 cpu-µs/item).
//
// Open: BenchmarkOpenBacklog, a fresh process opening a database with 1M
// ready items: 83 ms after a clean Close (which flushes the memtables),
// 659 ms when the memtables were left to WAL replay as after a crash; RSS
// after open and one poll 29-31 MiB, against 22.5 MiB with 100k items.
package rocksstore
