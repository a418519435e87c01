// Package storagetest is the conformance suite every storage.Store passes
// (memstore, rocksstore, fdbsync), imported only from _test.go files:
//
//   - Run: one parallel subtest per rule of the storage contract, named as
//     behaviours, each on a fresh store, each ending with Check;
//   - RunModel: seeded random operation sequences compared step by step
//     with the memstore reference model;
//   - RunHistory: concurrent workers and a sweeper on a shared logical
//     clock, with the recorded history checked afterwards;
//   - Bench: the shared Store benchmarks.
//
// A backend wires it in from a test file:
//
//	h := storagetest.Harness{
//		New:    func(t testing.TB) storage.Store { return open(t, t.TempDir()) },
//		Reopen: func(t testing.TB, s storage.Store) storage.Store { ... },
//	}
//	func TestConformanceX(t *testing.T)        { storagetest.Run(t, h) }
//	func TestConformanceXModel(t *testing.T)   { storagetest.RunModel(t, h) }
//	func TestConformanceXHistory(t *testing.T) { storagetest.RunHistory(t, h, storagetest.HistoryConfig{}) }
//	func BenchmarkX(b *testing.B)              { storagetest.Bench(b, h) }
//
// Every instant is computed from a fixed base time plus offsets; nothing
// reads the wall clock (benchmarks use b.Elapsed). RunModel always runs
// seeds 1 and 2 plus one random seed, RunHistory one random seed; both log
// them, and -storagetest.seed=N replays one (-storagetest.ops=N sets the
// RunModel sequence length).
//
// Where the storage contract (storage/*.go) and DESIGN.md are silent, the
// suite pins these choices, which memstore implements:
//
//   - A Poll, Peek, DeadList, Purge, Ack or Nack naming a queue that does
//     not exist is not an error: no items, 0 purged, CodeNotFound per id.
//     Stats of one unknown queue and QueueConfig are ErrNotFound.
//   - Poll.Max, Peek.Limit, DeadList.Limit, and Redrive/PurgeDead.Limit
//     without ids must be in 1..Limits.MaxBatch, else ErrInvalidArgument.
//   - ExtendLease with Duration 0 extends by the queue's default lease, as
//     Poll does with Lease 0 (Limits.ValidateLease accepts 0 as "default").
//   - An explicit nack delay out of range fails the whole call with
//     ErrInvalidArgument (it is one argument for the whole batch).
//   - Purge keeps dedup keys: a producer retrying an enqueue it already
//     made is still suppressed within the window.
//   - A lease expiry does not change LastError; only nack sets it.
//   - DeadAt is the Now of the call that dead-lettered the item (the nack,
//     or the Sweep that expired the lease).
//   - Redrive keeps LastError and the item's own MaxAttempts.
//   - OldestReadyAge is Now minus the earliest VisibleAt among available
//     items with VisibleAt <= Now (how long the longest-waiting servable
//     item has been servable); 0 when there is none.
//   - SweepResult.More: true whenever due work is left after the pass;
//     RunModel sweeps until More is false and compares totals, so a store
//     may also report More when a limit was hit exactly.
//   - A dedup key is not recorded when the queue's DedupWindow is 0.
//   - Now need not increase from call to call: concurrent callers read the
//     clock before the store orders their calls. A deadline written with a
//     Now earlier than a Sweep that already ran (so already due) must still
//     be found by the next Sweep.
//   - Reasons longer than Limits.MaxReason are cut to MaxReason bytes (on a
//     UTF-8 rune boundary in memstore; the suite only checks ASCII).
package storagetest
