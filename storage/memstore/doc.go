// Package memstore is an in-memory storage.Store: the reference model of
// the storage contract. It is what storagetest.RunModel compares every other
// backend against, the store behind other packages' unit tests (sweeper,
// rpc), and the baseline of the storage benchmarks. It favours being
// obviously correct over being fast, but the hot path (Enqueue, Poll, Ack,
// Nack, ExtendLease, Sweep) costs O(k log n) for k items touched, whatever
// the backlog. The admin calls (Peek, DeadList, Purge, Redrive and
// PurgeDead without ids, Check) scan and sort one queue per call.
//
// Nothing is persistent: Close drops everything, and there is no Reopen.
//
// Concurrency: every method takes the one mutex Store.mu for its whole
// duration, so calls are linearizable. Options.OnDeadline is called after
// the mutex is released. There is one lock, so there is no lock order.
//
// Model, per queue:
//   - every item is in one map (queue.items) and has one location:
//     available, inflight or dead;
//   - available items sit in one heap per priority ordered by
//     (VisibleAt, ID), so the ready items of a priority are a prefix of its
//     heap and Poll pops them in serve order;
//   - available items written with VisibleAt > now are "counted delayed"
//     and also sit in the store-wide delayed heap until Sweep promotes them
//     (or Poll, Purge takes them); this is what makes QueueStats.Delayed a
//     counter rather than a function of time, as storage.Store.Stats says;
//   - every inflight item is listed by exactly one lease; leases sit in a
//     store-wide heap by expiry; dedup keys in a store-wide heap by expiry.
//
// Check turns these structures into storage/check facts, where the
// invariants live; it reports only what is memstore's own (an entry filed
// under another id, a heap out of order or holding a stale object).
//
// Choices where the storage contract is silent are listed in the
// storagetest package documentation, which pins them with tests.
package memstore
