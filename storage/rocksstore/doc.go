// Package rocksstore is the embedded RocksDB implementation of
// storage.Store, leaseq's default backend. It is the only package that
// talks to RocksDB, through a binding of its own (rdb.go, rdb.cc: a small
// C++ file over RocksDB's public C++ API); RocksDB errors are translated
// once, in translate.
//
// # Layout
//
// Every namespace laid out by dbkeys (available, visibility, in_progress,
// leases, lease_expiry, dlq, dedup, dedup_expiry, delayed, payload, meta)
// is a column family of its own (families.go); keys keep their namespace
// byte, so dbkeys' encoding is the same in every family. All families
// share one WAL, so a batch that touches several namespaces is still one
// atomic write. Format 1 databases (one family, namespaces as key
// prefixes) are moved to this layout by the first Open (migrate.go). A
// key there in no namespace (damage, or another program's) blocks the
// move: Open refuses the database before it moves anything, naming the
// key, and leaseq check reports the key.
//
// Before Open writes anything (checkFamilies, rdb.cc's lq_open) it
// refuses, leaving the directory as it found it: a directory another
// process (or another store in this process) holds, by taking RocksDB's
// LOCK before it touches the WAL spare or the info log; a database a
// newer leaseq wrote (ErrNewerFormat, not storage.ErrCorrupt: its format
// key is above formatVersion, or it has column families this build does
// not know, in which case the format is read read-only first); and
// another application's RocksDB database (only the default family, with
// keys but no format 1 layout), which Open would otherwise have given
// leaseq's families.
//
// Why families: with a single one, every flushed table held keys of
// several namespaces and overlapped every other table, so compaction
// rewrote the whole backlog level by level. With a family per namespace a
// growing backlog appends to the tails of available and visibility, a
// flushed table overlaps nothing before it, and compaction moves it down
// without rewriting it. Measured in process, produce-b100 (4 producers,
// batches of 100, nobody consuming), three interleaved pairs of 6 s:
// sync=always 339k, 342k, 303k items/s on one family against 397k, 387k,
// 407k on families, with 25 % less CPU per item; sync=none 546k, 518k,
// 515k against 610k, 590k, 590k. perf over 4 s of the sync=always row:
// compaction went from 35.6 % of the process's samples to 0.02 % (every
// table moved down whole), flushes from 6.8 % to 12.2 % (more items
// flushed per second). e2e did not move (items die in the memtable
// either way).
//
// A TransactionDB keeps, per family, up to max_write_buffer_number
// flushed memtables in memory as history for the write-conflict checks of
// transactions that take a snapshot. leaseq's transactions take none, so
// Open keeps none (max_write_buffer_size_to_maintain 1 byte): with eleven
// families the history grew the e2e row's RSS from 200 MB to 410 MB in 6
// s; without history it stays at 150 MB.
//
// An item's state is where its record lives; indexes point at it:
//
//   - available items have one visibility entry (queue, priority,
//     visible_at, id), and a delayed entry (visible_at, queue, id) while they
//     count as delayed;
//   - inflight items carry their lease token; the lease record lists them
//     and has one lease_expiry entry;
//   - dead items carry reason and dead_at.
//
// Check (check.go) scans these namespaces in one snapshot into
// storage/check facts, where the invariants live; only the decoding is
// here. An available record keeps its Delayed flag when the sweeper
// promotes it, so Check counts it delayed only while its delayed entry is
// there.
//
// Payloads up to defaultInlineMax (4 KiB) live inside the item record;
// larger ones under a payload key written once at enqueue and deleted at
// ack or dead purge, so poll, nack and expiry do not rewrite them.
// Ids are a big-endian sequence number (reserved in blocks of idBlock with
// one meta write per block) followed by the enqueue instant. Lease tokens
// are 16 bytes: 8 that count up from a random start, so a new lease's
// keys land at the end of their memtables, and 8 from crypto/rand
// (newToken). Per-queue counters are one value under
// the queue's counters key, written whole by every batch that changes
// them (the leader's in-memory counters, which a failed commit never gets
// ahead of: it fails the store), so Stats is O(1) and Open reads them
// instead of counting. Until 2026-11-29 each batch wrote a merge operand
// instead (CountersMerge in rdb.cc); a flush then summed one operand per
// batch. The merge operator stays registered so that databases holding
// such operands still open to their sum.
//
// DeleteQueue (admin.go) drops an empty queue's dedup keys in ops of
// purgeChunk keys and removes its config, counters and the rest in a last
// op. An op before the first chunk marks the queue deleting, in
// memory (ensureQueue refuses enqueues with ErrUnavailable) and on disk
// (dbkeys.DeletingKey, deletemark.go), and
// the last op deletes the mark with the config; a delete that fails undoes
// the mark in both. Open (and Recover) finish the delete of a queue they
// find marked, which a crash between the two left with part of its dedup
// keys gone; leaseq check accepts the mark of an existing queue. A binary
// from before the mark (2026-12-07) opens such a database with the queue
// as it was left, and its check reports the mark as an unknown meta key.
//
// # The commit pipeline (commit.go; its fsyncs in syncer.go)
//
// Every mutating call (enqueue, poll, ack, nack, extend, sweep, redrive,
// purge, config) is an op handed to the store's pipeline. Ops are
// combined: the caller that finds nobody leading becomes the leader and
// applies every pending op, in arrival order, to one RocksDB transaction,
// then commits it once without fsync (a batch that read nothing through
// the transaction, enqueues and acks alone, never begins one: its writes
// go to RocksDB as one plain write batch, which cut a single-item
// enqueue's CPU by a tenth in process and 2 µs per call over RPC); callers
// arriving meanwhile queue up and the leader builds their batch too (up to
// maxLeadBatches) before it hands the lead to the first of them. A caller
// that takes the lead for a call of fewer than yieldBelowItems items
// yields its P once first (runtime.Gosched), so goroutines already
// runnable (connection readers woken by the same network poll, say) pend
// their calls into its first batch: 9-10 % less CPU per single-item
// enqueue over RPC with sync=none and in process, a fifth less per item
// in e2e in process with sync=always (docs/BENCHMARKS.md, "A leader that
// yields first"). Calls of many items and asynchronous callers do not
// yield, nor, with sync=none, a caller that has had the store to itself
// for more than aloneCalls calls in a row (enterCall): with nobody about
// to join its batch the yield only woke a thread that found nothing to
// do, and a lone single-item consumer spends about 40 % less CPU per item
// without it ("A lone leader's yield"). The brief
// for this engine asked for a committer goroutine; combining gives the
// same batches without a goroutine hand-off per call, so an uncontended
// call crosses no goroutine.
//
// Within a batch each op works on an opTx (optx.go): reads go to the batch's
// overlay first, then to the transaction (GetForUpdate for the records a
// decision rests on: the available record a poll takes, a dedup record);
// writes go to the overlay, and every overlay write and in-memory index
// change has an undo, so an op that fails (a corrupt record, say) leaves
// the rest of its batch intact. The keys of a newly enqueued item cannot
// be in the batch yet, so they are appended without the overlay's map,
// which takes them in only if a later op of the batch reads or writes
// the overlay: a batch of enqueues alone builds no map (produce-b100 in
// process, seven interleaved pairs: 468k against 425k items/s with
// sync=always, 614k against 594k with sync=none). Likewise, until an op
// of the batch writes a key of an older item or a lease through the map
// (a nack, an expiry, a redrive or an admin op does), the keys a claim
// writes for items enqueued before the batch, and an ack's keys under a
// lease no earlier op of the batch wrote, cannot be in the overlay
// either, and go in without the map (opTx.untouched says why): a batch of
// enqueues, polls and acks builds no map at all, which took an eighth off
// the Go part of the serial batch path in e2e in process. At commit the
// overlay's keys are sorted and put into the transaction's batch
// untracked: sorted, the memtable
// inserts them along one skiplist path; untracked, the lock manager is
// skipped (one batch is applied at a time, and the records it changes were
// read with GetForUpdate).
//
// The claims' transactions are a TransactionDB's (pessimistic: GetForUpdate
// takes a row lock), not an OptimisticTransactionDB's, by measurement
// (DESIGN.md leaves the choice to one): with optimistic transactions each
// commit checks every key read for update against the memtables
// (DBImpl::GetLatestSequenceForKey, a third of the samples in a profile),
// and e2e in process made 56.2k and 50.0k items/s against 98.8k and 79.4k
// with sync=always, 72.6k and 65.3k against 148.8k and 124.9k with
// sync=none (interleaved pairs; docs/BENCHMARKS.md, "A trace reader in the
// harness, and where e2e inproc-always's time goes").
//
// With SyncAlways one goroutine at a time fsyncs the WAL, once for every
// batch written since its previous fsync, and only then answers their
// callers. While nobody fsyncs, a leader that finds callers waiting once
// its batch is written builds their batch before it fsyncs, so one fsync
// covers both (BenchmarkCycle sync=always, 4 workers: 61 became 91-95
// items per fsync). A leader with nobody waiting behind it runs the fsync
// itself, so a lone caller crosses no goroutine (Metrics.InlineSyncs
// counts these); a leader that hands the lead on leaves it to the syncer
// goroutine, which fsyncs while the next leader builds the next batch. The fsync is one
// cgo call (FlushWAL) per group, never one inside every caller's commit. (An fsync thread in C, woken through a
// pipe so that no goroutine sits in cgo, measured worse; see
// Measurements.) With SyncNone callers are
// answered as soon as their batch is written.
//
// With SyncAlways the fsyncing goroutine and the leader's commit often
// hold a P each in cgo at once; with no P idle, Go's sysmon retakes one
// and then wakes every 20 µs. SuggestedProcs (one P more than Go's
// default) is what `leaseq serve` runs with and what an application
// embedding a SyncAlways store should set: in process on 2 CPUs, in
// interleaved pairs, e2e made 14 % more items/s at less CPU per item
// with 3 Ps (docs/BENCHMARKS.md, session 51).
//
// KeepFreedMemory is the other process setting the package suggests: it
// has glibc's malloc keep the memory of flushed memtables (RocksDB's 1 MiB
// arena blocks) for the next ones, instead of handing it back to the
// kernel and faulting it in again on the commit's serial path (alloc.go
// says what it sets and what it costs). `leaseq serve` calls it.
//
// A batch of 32 items or more that would be fsynced right after its
// commit (nobody fsyncs, the leader builds no batch after it, and it is
// not a lone synchronous call's, which fsyncs inline) has its
// fsync begun early: the leader kicks a syncer before it builds the
// batch, and the syncer fsyncs as soon as the batch's record is in the
// WAL file, while the commit still inserts the record into the memtables
// (a third of such a batch's time: 67 of 208 µs in e2e inproc-always).
// The WAL's logs tell when that is (zerowal.h, WALProgress: the commit
// runs marked with its batch's number, and the log publishes the mark at
// the flush that ends the record). The syncer then waits for the leader to
// be done with the batch and answers the batches written up to it, as
// after any fsync: no caller is answered before an fsync that began after
// its batch's record was written, and none before its batch is visible.
// Measured on e2e inproc-always: median 86.1k against 79.7k items/s in
// six rotated runs (docs/BENCHMARKS.md, "An fsync begun at the WAL
// write"). Metrics.EarlySyncs counts these fsyncs. A lone synchronous
// call keeps its inline fsync (woken twice, syncer and caller, it lost
// more than the overlap saved: produce-b100 in process -7 %), and so do
// smaller batches (with every batch early, produce-b1 and latency-max
// gained nothing).
//
// Enqueue, EnqueueClaim, Poll and Ack also come asynchronously
// (storage.Async, async.go): the same ops, whose done callback runs on the
// goroutine that completes them instead of waking a waiting caller. The
// lean RPC engine hands a durable call over this way from its connection
// reader, and the syncer that fsynced a group builds and sends the
// group's answers. A syncer that has at least handOffItems items of such
// calls to complete, with batches written behind them, first hands the
// next fsync to the second syncer goroutine, so that answering one group
// does not delay the next group's fsync.
//
// With SyncAlways, new WAL files are zero-filled spares made ahead of time
// (zerowal.h), so that the fdatasync of a commit overwrites blocks the
// file already has and does not also commit a new file size: produce-b1
// in process did 60 % more items/s. A spare is written 64 KiB per
// write(2), so the page cache holds it in folios of at most 64 KiB: in
// 1 MiB folios (ext4 since Linux 6.16) every small append and every
// writeback walked the folio's 256 block buffers, about a tenth of a
// durable single-item call's CPU (docs/BENCHMARKS.md). Zeros double the bytes written, so a
// log is made over zeros only while RocksDB syncs at least every 16 KiB of
// it; a crash then leaves zeros after the last record, and Open cuts a
// torn last record followed by zeros off the log (walTornTail,
// cutTornTail) and replays up to it, as it would to one at the file's end.
// RocksDB starts a new log at a memtable switch without syncing the one
// before it, and the pipeline writes into the new log before the fsync
// that covers both, so a power loss could keep the newer log and lose the
// older log's end: a plain log cut there reads as a clean end, and
// RocksDB replayed the newer log past the hole. So a read-write open's
// file system (OrderedLogs in rdb.cc, in both sync modes) fdatasyncs the
// older log, then fsyncs the directory, before RocksDB writes a record to
// the newer one; the directory fsync also makes a log taken from the
// spare durable under its new name (a spare that holds records is never
// reused: ZeroedWALs.Prepare). A torn log that is not the newest can
// still come from a build without that: Open also drops the records that
// newer logs hold after the tear, none of them acknowledged (the fsync
// that would have answered them syncs the older log too), unless their
// sequence numbers show them written after a recovery that stopped at the
// tear. That rule needs every log with
// records to be one this opening of the database wrote: the TransactionDB
// keeps the logs it replays at Open (after flushing their records to
// synced tables), and one that the open read whole from the page cache
// could be torn on the disk by a power failure, so a read-write open
// empties every log older than its own before the store writes anything
// (emptyReplayedLogs in rdb.cc). A batch's writes are visible
// to later batches before its fsync (see storage.Store for why that is
// safe); a batch that wrote nothing still waits for the fsync of earlier
// batches, since its answers may rest on their writes. A failed write or
// fsync fails the store: the in-memory indexes may be ahead of the
// database, so every later call fails until it is reopened.
//
// A batch's hot-path keys and item records are carved from two arenas
// that the next batch reuses (keyArena), a claim's lists of the items it
// takes and of their keys and values come from scratch lists the next
// batch reuses too (opTx.claimBuf), and the undo steps every item needs
// are plain values rather than closures, so an item's life allocates
// little beyond what reaches the caller; a value read back from the
// overlay is therefore copied before anyone sees it. The batch itself,
// the transaction's error slot, each queue's counters key, a completed
// fsync group's lists and a synchronous op's wake channel are reused too,
// and an op's closure captures copies of the values it needs rather than
// the call's parameters (a captured parameter moves to the heap): a
// single-item enqueue costs the store 4 allocations (BenchmarkEnqueue).
//
// An item's available record and visibility entry, its in_progress record
// and a lease's lease_expiry entry are written once between deletes
// (dbkeys.SingleDeletable), so the batch deletes them with RocksDB's
// SingleDelete: when the delete meets its write in a flush or compaction
// both are dropped, instead of the delete marker living on until the
// bottom level. An item consumed within one memtable's life leaves no
// trace in the tables (TestRocksStore_ConsumedItemsLeaveNoTombstones).
// A key the batch deletes and writes again (an extend landing on the
// same expiry) gets a single delete before its new write, since the
// older write may already be in a table
// (TestRocksStore_ExtendToSameExpiryThenAck). A key the batch writes
// for the first time and then deletes (an item claimed by a poll in the
// batch that enqueued it) reaches RocksDB not at all, neither write nor
// single delete (TestRocksStore_ClaimInEnqueueBatchWritesNoIndexEntries).
// With -tags invariants,
// every other write of such a key is checked to find nothing in the
// database (checkWriteOnce). Lease records, dedup keys and counters are
// rewritten in place and keep ordinary deletes.
//
// A run of deleted available or in_progress records of one queue whose
// ids have consecutive sequence numbers (a claim of the head of a queue
// filled in order, the ack of its lease) is one range tombstone instead of
// a single delete per record (idRun, writeBuf.delThrough). Ids are unique
// per sequence number, so no other record lies inside such a range,
// whatever the batch does not know about
// (TestRocksStore_RangeDeletesSkipItemsLeftBetween); a run breaks at any
// gap. A run of four or more is written so. Inserting one tombstone costs
// the memtable about what one single delete does, so a claim of 32 and
// its ack insert 3 entries instead of 64; the tombstones outlive the flush
// (one per run in the tables until compaction takes them to the bottom
// level), and tombstone churn stays flat (docs/BENCHMARKS.md, "Range
// tombstones for runs of records"). The visibility entries a claim or a
// purge deletes are a run too, though their keys sort by priority and
// time first: claims take a queue's head, and the serve order mirrors
// the visibility entries, so every entry of that queue and priority the
// database keeps after the batch sorts at or after the serve order's
// head, or is a write of the batch, which ends the run (batch.headRun,
// TestHeadRun). Such a run of four or more is one range tombstone as
// well. Reads for update of records the store's memory holds skip range
// tombstones (rdbTxn.getManyForUpdate; rdb.cc says why); every other
// read honours them; nothing but Open and Check reads the visibility
// entries.
//
// A batch crosses into C once for all its writes and a claim pass once for
// all its reads (rdb.go), instead of once or twice per key. The writes go
// into the transaction's batch neither locked nor indexed: RocksDB's C API
// cannot do that, which is why the binding is C++ (rdb.go says why it is
// safe; it took a quarter off RocksDB's own cost per item in
// bench/scripts/rocksdb_floor.cc and 10-16 % off e2e in process,
// docs/BENCHMARKS.md). The memtable keeps an insert hint per namespace (the
// key's first byte, memtable_insert_with_hint_prefix_extractor): a batch
// deletes keys that each sit right behind their own older put, and
// without a hint RocksDB's skiplist searched from the top for each of
// them. A range tombstone's begin key gets no hint (HintByNamespace in
// rdb.cc): RocksDB 7.8.3 shares one hint per prefix between a memtable's
// point and range tombstone skiplists, and a hint from the one corrupts
// an insert into the other.
//
// In a Go execution trace (leaseq serve --pprof), each batch is a
// "rocksstore.batch" region, logged with its number of calls, and each WAL
// fsync a "rocksstore.fsync" region (TestRocksStore_TraceRegions;
// TraceBatchRegion, TraceFsyncRegion). `leaseq bench -read-trace FILE`
// (package bench/tracestat) sums them up: how busy each kept the
// pipeline and how much they overlapped.
//
// # In-memory indexes (index.go, rebuild.go)
//
// Each queue keeps its serve order in memory, per priority: a sorted run
// of (visible_at, id) that in-order arrivals append to (an array, then
// chunks of 4096 entries once a backlog passes 65,536, so that a growing
// backlog is never copied), plus a min-heap for the entries that arrive
// out of order (readyHeap). The store keeps
// every live lease (token, queue, expiry, ids), a map from inflight id to
// lease, and two timed heaps (lease expiry, delayed items coming due) for
// the sweeper. So a claim pops ids from the serve order and reads each record
// with one GetForUpdate, an ack needs no read at all, and no iterator ever
// walks the tombstones at a queue's head. The ready-record cache
// (readycache.go) keeps a copy of the available records the leader wrote,
// up to 4096 per queue and Options.ReadyCacheBytes (32 MiB) in all, so a
// claim of a recently enqueued, nacked or expired item locks its record
// with a GetForUpdate that reads nothing (Metrics.ClaimReads counts the
// records claims still read). New items' records, which come in id
// order and are mostly claimed in it, are kept in an ordered slice rather
// than a map, so caching and claiming them hashes nothing (e2e in
// process: +4-10 % items/s). While a queue's cache has room, its
// enqueuers encode their items' records on their own goroutines, and the
// cache keeps those buffers, so the leader neither encodes nor copies
// them (putAvailable took half its time before in a profile of e2e in
// process). The database stays the source of
// truth: Open rebuilds every index by reading the visibility, delayed,
// lease and in_progress namespaces once (never an available record), so
// after any crash the in-memory state is what the database says. Only the
// leader changes the indexes; Stats reads a queue's under queueState.mu.
// A batch's changes to the counters show in Stats as the batch is built,
// a moment before its writes can be read (Peek, DeadList): an op later in
// the same batch must see them (removing a queue checks it is empty).
// The dedup_expiry index stays on disk (it can be large and is only
// swept), with a cursor below which only deleted entries remain.
//
// With -tags invariants (make test), every batch ends with checkIndexes:
// each touched queue's serve order, delayed set and leases must agree with
// its counters, or the engine panics.
//
// Lock order: Store.life (shared) -> pipeline.mu; the leader takes
// Store.mu -> queueState.mu inside an op. sweepMu serializes sweeps. No Go
// lock is held across a RocksDB call except by the leader, and RocksDB row
// locks never wait: one transaction is open at a time.
//
// # Claims ahead (prefetch.go)
//
// With SyncAlways a poll waits for the fsync of its claim, so a consumer
// looping poll, ack, poll waits for an fsync at every call, and four such
// consumers bound durable e2e at about 32 items per fsync
// (docs/BENCHMARKS.md, session 58). An ack that ends a poll's lease
// therefore runs a second op in its batch that claims the next batch for
// the same max and lease (when two are ready), kept in the queue's
// prefetch list; once durable, the consumer's next poll (within
// Options.PrefetchHold, 20 ms) takes it without a batch of its own. The
// held batch is an ordinary lease, hidden from every caller: Stats counts
// its items as available, checkItem answers for them as for available
// items, a poll that does not match (another max or lease, or a ready
// item, or an item of a held batch that cannot answer it, stale or
// claimed for another max or lease, that comes before the batch's last
// one in serve order; of several that match, the one whose first item
// comes first answers, whichever consumer's ack claimed it) gives every
// held batch back in its op
// before it claims (so it takes the head, as the model says; claimHead,
// also for the claim an enqueue makes for a parked poll), and Peek,
// Purge, Check, a sweep (for stale batches and those holding unpromoted
// delayed items; at its expiry step, any it finds due, counted against the
// sweep's limit and naming their queues in ReadyQueues, which the sweeper
// takes as progress though no lease expired) and Close give
// them back first (from the moment Close begins, acks claim nothing
// ahead); Recover, which cannot write before it reopens a failed store,
// notes them first and gives back once reopened those whose claim the
// database holds (setAside). The claim marks the lease record
// (dbkeys.LeaseRecord.Ahead) until its next write, so that a batch held
// at a crash, which Open cannot tell from one a consumer took, gives its
// items back at its expiry with no attempt counted, rather than
// dead-lettering items nobody may have received (prefetch.go). A binary
// from before the mark (2026-12-07) cannot open a database holding a
// marked record, which only a crash while a batch was held leaves, until
// that lease is acted on or ends. Until the op that gives a batch back lands
// its counters, Stats still hides it (queueState.returning). A poll
// answered from one is promised an expiry counted from its own instant
// (leaseState.promised, read through deadline), which the database learns
// only when the lease is next written (a partial ack or nack, an extend,
// a clean Close: keepPromise, or a Recover). The conformance suites run
// with it on (the SyncAlways ones); prefetch_test.go tests what it does,
// prefetch_recover_test.go what Recover does with it.
//
// # RocksDB operations per item life
//
// Enqueue in batches of 32, poll 32, ack the 32 (BenchmarkCycle). Per item
// unless it says per call; every per-call write is shared by 32 items.
//
//	                       before (one transaction per call)   now (pipeline)
//	enqueue                2 puts                              2 puts
//	poll                   visibility iterator (seek + next),   1 GetForUpdate, 1 put; per run
//	                       1 GetForUpdate, 2 deletes, 1 put     2 range tombstones (records, visibility)
//	  per lease            2 puts                              2 puts
//	ack                    1 GetForUpdate, 1 delete            per run of ids 1 range tombstone
//	  per lease            1 GetForUpdate, 2 deletes or a put  1 delete + 1 single delete, or a put
//	counters               1 merge per call                    1 put per queue per batch
//	commits, WAL writes    3 per cycle (one per call)          one per batch of pending calls
//	fsyncs (sync=always)   shared by RocksDB's write groups    one per group of written batches
//
// So per item: 2 reads and ~3 iterator steps became 1 read, and the
// lock-tracked, indexed transaction writes became sorted untracked ones.
// The key layout did not change (the namespaces of DESIGN.md stay, and
// Check verifies the same invariants); an item still costs 6 writes
// (2 puts at enqueue, 2 deletes and 1 put at poll, 1 delete at ack), which
// is the floor the layout allows with a separate visibility index. With
// the ready-record cache (2026-11-24), the poll's GetForUpdate locks
// without reading for every item still in the cache: in BenchmarkCycle and
// the e2e rows, all of them. Since
// 2026-11-24 the three deletes are single deletes, so an item whose life
// fits in one memtable costs the flush nothing: BenchmarkCycle sync=none,
// 4 workers, 10.0-10.8 against 10.8-12.3 cpu-µs/item (three pairs). Since
// 2026-11-29 the two record deletes of a run of consecutive ids are a
// range tombstone each per run, and so are the visibility entries a
// claim takes from a queue's head: an item fed and consumed in order
// costs 3 writes (2 puts at enqueue, a put at poll) and its run 3
// tombstones.
//
// # Embedding the store
//
// Every mutating call enters cgo for its commit. In a process whose Ps are
// all idle between calls, Go's sysmon sleeps until a cgo call wakes it
// and then polls every 20 µs for a millisecond: 15-20 % of the node's CPU
// when calls came one at a time. `leaseq serve` runs with
// GODEBUG=schedtrace=2147483647, which keeps sysmon from that sleep
// (sysmon.go at the repository root, docs/BENCHMARKS.md "Go's sysmon
// between calls"); an application that embeds the store and is often
// idle may set the same variable. The store itself leaves the process's
// runtime settings alone.
//
// # Measurements
//
// docs/BENCHMARKS.md ("Storage engine: commit pipeline and release
// RocksDB") has the figures behind these choices: CPU per item and
// throughput of BenchmarkCycle against the previous engine and Debian's
// library, BenchmarkSmallPolls, BenchmarkOpenBacklog (open time and RSS
// with 1M ready items), tombstone churn, and the variants measured and
// rejected (a C fsync thread, overlapping commit with build).
package rocksstore
