package rocksstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// failWrite makes one write fail with an injected fsync failure: an
// enqueue into another queue, so that q's items are left alone.
func (b *testBundle) failWrite(now time.Time) {
	b.t.Helper()
	_, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "other", Items: []storage.EnqueueItem{{}}, Now: now})
	require.ErrorIs(b.t, err, storage.ErrUnavailable)
	require.Error(b.t, b.s.Failed())
}

// recoverStore reopens the failed store and requires that it did.
func (b *testBundle) recoverStore() {
	b.t.Helper()
	ok, err := b.s.Recover()
	require.NoError(b.t, err)
	require.True(b.t, ok)
	require.NoError(b.t, b.s.Failed())
}

// requireNothingHeld requires that q's items other than the first two
// (ids[2:]) are available at their first attempt, with no lease left, at
// now: a consumer polling for something else than what was claimed
// ahead gets the head at once, and Check finds no lease.
func (b *testBundle) requireNothingHeld(ids []storage.ItemID, now time.Time) {
	b.t.Helper()
	st := b.stats("q", now)
	require.EqualValues(b.t, len(ids)-2, st.Ready, "the batch claimed ahead is available again")
	require.Zero(b.t, st.Inflight)
	require.Zero(b.t, st.Leases)
	require.EqualValues(b.t, 2, st.Delivered, "the claim ahead delivered nothing")
	rep, err := b.s.Check(b.ctx)
	require.NoError(b.t, err)
	require.True(b.t, rep.OK(), "violations: %v", rep.Violations)
	require.Zero(b.t, rep.Leases)

	r := b.poll("q", 3, 30*time.Second, now)
	require.Equal(b.t, ids[2:5], itemIDs(r.Items))
	for _, it := range r.Items {
		require.EqualValues(b.t, 1, it.Attempts, "no attempt counted for the claim ahead")
	}
}

// TestRecover_GivesBackBatchesClaimedAhead: a batch claimed ahead and
// durable when a later write fails is an ordinary lease in the database
// that no consumer holds; Recover gives it back as Close would, so its
// items are available at once, at the attempt they were.
func TestRecover_GivesBackBatchesClaimedAhead(t *testing.T) {
	t.Parallel()
	b, failing := setupFailingSync(t)
	ids := b.enqueueN("q", at(0), 8)
	b.pollAck(2, at(time.Second))
	require.EqualValues(t, 1, b.s.Metrics().Prefetched)

	failing.Store(true)
	b.failWrite(at(time.Second))
	failing.Store(false)
	b.recoverStore()
	b.requireNothingHeld(ids, at(time.Second+time.Millisecond))
	require.EqualValues(t, 1, b.s.Metrics().PrefetchReleased)
}

// TestRecover_GivesBackBatchesClaimedAheadByAFailedAck: the ack that
// claimed a batch ahead fails at its fsync. Its caller is told so, yet
// its write reached the WAL, so the reopened database holds the claim:
// Recover gives that batch back too.
func TestRecover_GivesBackBatchesClaimedAheadByAFailedAck(t *testing.T) {
	t.Parallel()
	b, failing := setupFailingSync(t)
	ids := b.enqueueN("q", at(0), 8)
	r := b.poll("q", 2, time.Minute, at(time.Second))
	require.Equal(t, ids[:2], itemIDs(r.Items))

	failing.Store(true)
	_, err := b.s.Ack(b.ctx, storage.AckParams{Queue: "q", Lease: r.Lease, IDs: itemIDs(r.Items), Now: at(time.Second)})
	require.ErrorIs(t, err, storage.ErrUnavailable)
	require.EqualValues(t, 1, b.s.Metrics().Prefetched, "the failed ack's batch claimed ahead")
	failing.Store(false)
	b.recoverStore()
	// The ack's write is in the database (the fsync failed, not the
	// write), so the first two items are gone.
	b.requireNothingHeld(ids, at(time.Second+time.Millisecond))
}

// TestRecover_GivesBackOnceWhenItsGiveBackFails: Recover's own give-back
// fails at its fsync, after its write reached the WAL. The next Recover
// finds the lease ended in the database and gives nothing back twice.
func TestRecover_GivesBackOnceWhenItsGiveBackFails(t *testing.T) {
	t.Parallel()
	b, failing := setupFailingSync(t)
	ids := b.enqueueN("q", at(0), 8)
	b.pollAck(2, at(time.Second))
	require.EqualValues(t, 1, b.s.Metrics().Prefetched)

	failing.Store(true)
	b.failWrite(at(time.Second))
	ok, err := b.s.Recover()
	require.ErrorIs(t, err, storage.ErrUnavailable, "the give-back's fsync failed")
	require.False(t, ok)
	require.Error(t, b.s.Failed(), "failed again: the next Recover reopens")
	failing.Store(false)
	b.recoverStore()
	b.requireNothingHeld(ids, at(time.Second+time.Millisecond))
}

// TestRecover_KeepsPromisedExpiries: a poll answered with a batch claimed
// ahead was promised an expiry later than the claim's, which the
// database keeps until the lease is next written. Recover writes the
// promise as Close does: a sweep between the two expiries leaves the
// lease alone, and its ack counts.
func TestRecover_KeepsPromisedExpiries(t *testing.T) {
	t.Parallel()
	b, failing := setupFailingSync(t)
	ids := b.enqueueN("q", at(0), 8)
	b.pollAck(2, at(time.Second))
	require.EqualValues(t, 1, b.s.Metrics().Prefetched)
	took := at(time.Second + 10*time.Millisecond)
	r := b.poll("q", 2, time.Minute, took)
	require.Equal(t, ids[2:4], itemIDs(r.Items))
	require.EqualValues(t, 1, b.s.Metrics().PrefetchHits)
	require.Equal(t, took.Add(time.Minute), r.ExpiresAt)

	failing.Store(true)
	b.failWrite(took)
	failing.Store(false)
	b.recoverStore()
	b.check()
	v, found, err := b.s.getRaw(dbkeys.LeaseKey(r.Lease))
	require.NoError(t, err)
	require.True(t, found)
	rec, err := dbkeys.DecodeLease(v)
	require.NoError(t, err)
	require.Equal(t, nanos(r.ExpiresAt), rec.ExpiresAt, "the database has the promised expiry")

	between := at(time.Second + time.Minute + 5*time.Millisecond)
	require.Zero(t, b.sweep(between).LeasesExpired)
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK}, b.ack("q", r.Lease, between, itemIDs(r.Items)...))
	b.check()
}
