// Package sweeper runs the deadline work of a leaseq node: it expires leases
// whose time is up (their items go back to ready, or to dead once they are
// out of attempts), lets delayed items become ready, and drops expired dedup
// keys. All of that is done by the store in Store.Sweep; the sweeper decides
// when to call it.
//
// # Scheduling
//
// A pass (runOnce) calls Store.Sweep with the clock's now and a bounded
// batch limit, again and again while the store reports More, checking the
// context between batches so shutdown is never stuck behind a backlog. It
// then tells OnReady which queues gained ready items, so the RPC dispatcher
// can wake long-pollers.
//
// After a pass the loop arms exactly one clock timer, for the earliest of
// the store's next pending deadline (SweepResult.Next) and now+SweepInterval.
// The interval is only a cap: a lease set for 30 s is reclaimed when the
// timer fires at its deadline, within milliseconds, not on a fixed tick.
// Deadlines created after the pass (a poll, an extend, a delayed enqueue or
// a nack) reach the sweeper through Notify, which the store calls via its
// storage.DeadlineFunc; if the new deadline is earlier than the armed timer
// the loop re-arms. On a Sweep failure the loop retries with exponential
// backoff capped at SweepInterval, logging Warn, and Error once the failures
// persist. A batch that reports More but did nothing (expired, promoted and
// dropped nothing, and made no queue gain ready items) counts as a failure
// (ErrNoProgress), so a stuck store costs a retry every few milliseconds to a
// second instead of a spinning core.
//
// # Concurrency model
//
// One goroutine per Sweeper, started by Start and joined by Stop. It is the
// only caller of Store.Sweep, OnReady and the TestSignals callbacks, so those
// are never called concurrently with themselves. Notify and Metrics may be
// called from any goroutine at any time (Notify also on a nil *Sweeper); they
// take only s.mu and never block: Notify records the deadline and does a
// non-blocking send on a one-slot wake channel.
//
// # Lock order
//
// Sweeper.mu is a leaf lock:
//
//	store locks -> (store calls DeadlineFunc outside its locks) -> Sweeper.mu
//
// Sweeper.mu is never held while calling Store.Sweep, OnReady, a TestSignals
// callback, the logger, or any clock method that may block. The lifecycle
// lock (Sweeper.life) is taken only by Start and Stop and is never held
// together with Sweeper.mu.
package sweeper
