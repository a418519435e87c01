package rocksstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// Tests of DESIGN.md's rules, one each, written by a review of the code
// against DESIGN.md (session 70) that found no divergence: they stay as
// regression tests.

// DESIGN.md "Operations", enqueue: a dedupKey suppresses an item only when
// it was seen (written) before; an item refused by a limit writes nothing,
// so a later item of the batch with the same key is new.
func TestDesign_DedupKeyOfInvalidItemDoesNotSuppress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	big := make([]byte, storage.DefaultLimits.MaxPayload+1)
	res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Now: at(0), Items: []storage.EnqueueItem{
		{Payload: big, DedupKey: "k"},
		{Payload: []byte("ok"), DedupKey: "k"},
	}})
	require.NoError(t, err)
	require.Equal(t, storage.CodeInvalid, res[0].Code)
	require.Equal(t, storage.CodeOK, res[1].Code)
	require.False(t, res[1].Duplicate, "the first item was never written")
	require.False(t, res[1].ID.IsZero())
	got := b.poll("q", 10, time.Second, at(0))
	require.Len(t, got.Items, 1)
}

// Serve order is priority, then visible_at, then id: a nacked item (old
// id, new visible_at) comes after an item that became ready before it.
func TestDesign_NackedItemServedByVisibleAtNotID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	x := b.enqueueN("q", at(0), 1)
	r := b.poll("q", 1, time.Minute, at(0))
	y := b.enqueueN("q", at(time.Second), 1)
	require.Equal(t, []storage.Code{storage.CodeOK}, b.nack("q", r.Lease, dur(0), at(5*time.Second), x[0]))
	got := b.poll("q", 2, time.Minute, at(6*time.Second))
	require.Equal(t, []storage.ItemID{y[0], x[0]}, itemIDs(got.Items))
}

// Redrive sends a dead item back to ready with attempts reset, and an item
// that was ready before it is served first (visible_at order).
func TestDesign_RedriveResetsAttemptsAndOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	x := b.enqueue("q", at(0), storage.EnqueueItem{Payload: []byte("x"), MaxAttempts: 1})
	r := b.poll("q", 1, time.Minute, at(0))
	require.Equal(t, []storage.Code{storage.CodeOK}, b.nack("q", r.Lease, nil, at(time.Second), x[0]))
	dead, err := b.s.DeadList(b.ctx, storage.DeadListParams{Queue: "q", Limit: 10})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, "nack: boom", dead[0].Reason)
	require.Equal(t, "boom", dead[0].LastError)
	y := b.enqueueN("q", at(2*time.Second), 1)
	rr, err := b.s.Redrive(b.ctx, storage.RedriveParams{Queue: "q", Limit: 10, Now: at(3 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, 1, rr.Moved)
	st := b.stats("q", at(3*time.Second))
	require.Equal(t, int64(2), st.Ready)
	require.Equal(t, int64(0), st.Dead)
	got := b.poll("q", 2, time.Minute, at(3*time.Second))
	require.Equal(t, []storage.ItemID{y[0], x[0]}, itemIDs(got.Items))
	require.Equal(t, uint32(1), got.Items[1].Attempts, "attempts reset by redrive, then this delivery")
}

// Backoff without delay: random(0, min(base*2^attempts, max)) with the
// queue's configured base and max (jitter fixed at 0.5 by testOptions).
func TestDesign_NackBackoffUsesQueueConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := storage.DefaultQueueConfig()
	cfg.BackoffBase, cfg.BackoffMax = time.Second, 3*time.Second
	cfg.MaxAttempts = 10
	require.NoError(t, b.s.SetQueueConfig(b.ctx, "q", cfg))
	x := b.enqueueN("q", at(0), 1)
	now := at(0)
	for attempt, want := range []time.Duration{time.Second, 1500 * time.Millisecond, 1500 * time.Millisecond} {
		r := b.poll("q", 1, time.Minute, now)
		require.Len(t, r.Items, 1, "attempt %d", attempt+1)
		require.Equal(t, []storage.Code{storage.CodeOK}, b.nack("q", r.Lease, nil, now, x[0]))
		peek, err := b.s.Peek(b.ctx, storage.PeekParams{Queue: "q", Limit: 1, Now: now})
		require.NoError(t, err)
		require.Equal(t, now.Add(want), peek[0].VisibleAt, "attempt %d", attempt+1)
		require.Equal(t, storage.StateDelayed, peek[0].State)
		require.Empty(t, b.poll("q", 1, time.Minute, now.Add(want-1)).Items)
		now = now.Add(want)
	}
}

// Queue config changes take effect: a new default lease for polls asking
// 0, and a lowered max_attempts at the next end of delivery.
func TestDesign_QueueConfigChangeApplies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	x := b.enqueueN("q", at(0), 2)
	r := b.poll("q", 1, time.Minute, at(0))
	require.Equal(t, []storage.Code{storage.CodeOK}, b.nack("q", r.Lease, dur(0), at(0), x[0]))
	cfg := storage.DefaultQueueConfig()
	cfg.MaxAttempts = 2
	cfg.LeaseDuration = 7 * time.Second
	require.NoError(t, b.s.SetQueueConfig(b.ctx, "q", cfg))
	r = b.poll("q", 1, 0, at(time.Second))
	require.Equal(t, x[:1], itemIDs(r.Items))
	require.Equal(t, at(8*time.Second), r.ExpiresAt, "poll lease 0 uses the new default")
	sw := b.sweep(at(8 * time.Second))
	require.Equal(t, 1, sw.DeadLettered, "attempts 2 >= new max 2")
	st := b.stats("q", at(8*time.Second))
	require.Equal(t, int64(1), st.Dead)
	require.Equal(t, int64(1), st.Ready)
}

// A deleted queue's dedup keys go with it; a later enqueue makes a new
// item.
func TestDesign_DeleteQueueDropsDedup(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.enqueue("q", at(0), storage.EnqueueItem{DedupKey: "k"})
	r := b.poll("q", 1, time.Minute, at(0))
	n, err := b.s.DeleteQueue(b.ctx, storage.DeleteQueueParams{Queue: "q", Force: true, Now: at(time.Second)})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, []storage.Code{storage.CodeNotFound}, b.ack("q", r.Lease, at(time.Second), first[0]))
	res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Now: at(2 * time.Second), Items: []storage.EnqueueItem{{DedupKey: "k"}}})
	require.NoError(t, err)
	require.False(t, res[0].Duplicate)
	require.NotEqual(t, first[0], res[0].ID)
	st := b.stats("q", at(2*time.Second))
	require.Equal(t, uint64(1), st.Enqueued)
	require.Equal(t, int64(0), st.Leases)
}

// Extend: a lease whose items were all nacked is finished (leaseExpired);
// a partially settled lease can still be extended and its remaining items
// acked after the original expiry.
func TestDesign_ExtendAfterPartialSettle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	x := b.enqueueN("q", at(0), 2)
	r := b.poll("q", 2, time.Second, at(0))
	require.Equal(t, []storage.Code{storage.CodeOK}, b.nack("q", r.Lease, dur(0), at(100*time.Millisecond), x[0]))
	exp, err := b.s.ExtendLease(b.ctx, storage.ExtendParams{Queue: "q", Lease: r.Lease, Duration: 10 * time.Second, Now: at(500 * time.Millisecond)})
	require.NoError(t, err)
	require.Equal(t, at(10500*time.Millisecond), exp)
	sw := b.sweep(at(2 * time.Second))
	require.Zero(t, sw.LeasesExpired, "extended lease is not expired at its old deadline")
	require.Equal(t, []storage.Code{storage.CodeOK}, b.ack("q", r.Lease, at(5*time.Second), x[1]))
	_, err = b.s.ExtendLease(b.ctx, storage.ExtendParams{Queue: "q", Lease: r.Lease, Duration: time.Second, Now: at(5 * time.Second)})
	require.ErrorIs(t, err, storage.ErrLeaseExpired, "a finished lease is not live")
	st := b.stats("q", at(5*time.Second))
	require.Equal(t, int64(0), st.Leases)
	require.Equal(t, int64(0), st.Inflight)
	require.Equal(t, int64(1), st.Ready)
}

// Undelivered give-back on the last attempt never dead-letters.
func TestDesign_UndeliveredOnLastAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	x := b.enqueue("q", at(0), storage.EnqueueItem{MaxAttempts: 1})
	r := b.poll("q", 1, time.Minute, at(0))
	c, err := b.s.Nack(b.ctx, storage.NackParams{Queue: "q", Lease: r.Lease, IDs: x, Undelivered: true, Now: at(time.Second)})
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK}, c)
	st := b.stats("q", at(time.Second))
	require.Equal(t, int64(0), st.Dead)
	require.Equal(t, int64(1), st.Ready)
	got := b.poll("q", 1, time.Minute, at(time.Second))
	require.Equal(t, uint32(1), got.Items[0].Attempts)
	require.Equal(t, at(0), got.Items[0].VisibleAt)
}

// Stats: oldest ready age counts from visible_at; a delayed item past its
// visible_at is ready for Peek.
func TestDesign_PeekAndOldestReadyAge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue("q", at(0), storage.EnqueueItem{Delay: time.Second})
	peek, err := b.s.Peek(b.ctx, storage.PeekParams{Queue: "q", Limit: 10, Now: at(500 * time.Millisecond)})
	require.NoError(t, err)
	require.Equal(t, storage.StateDelayed, peek[0].State)
	peek, err = b.s.Peek(b.ctx, storage.PeekParams{Queue: "q", Limit: 10, Now: at(3 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, storage.StateReady, peek[0].State)
	b.sweep(at(3 * time.Second))
	st := b.stats("q", at(4*time.Second))
	require.Equal(t, int64(1), st.Ready)
	require.Equal(t, 3*time.Second, st.OldestReadyAge)
}

// With claims ahead (SyncAlways), a batch held for the next poll is
// invisible to stats: DESIGN.md's stats count what callers hold.
func TestDesign_StatsHideBatchClaimedAhead(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *Options) { o.Sync = SyncAlways; o.PrefetchHold = 10 * time.Millisecond })
	ids := b.enqueueN("q", at(0), 6)
	r := b.poll("q", 2, time.Minute, at(0))
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK}, b.ack("q", r.Lease, at(time.Millisecond), ids[0], ids[1]))
	require.Equal(t, uint64(1), b.s.m.prefetched.Load(), "the ack claimed a batch ahead")
	st := b.stats("q", at(time.Millisecond))
	require.Equal(t, int64(4), st.Ready)
	require.Equal(t, int64(0), st.Inflight)
	require.Equal(t, int64(0), st.Leases)
	require.Equal(t, uint64(2), st.Delivered)
	// A poll with another max is served from the head, not the held batch.
	got := b.poll("q", 3, time.Minute, at(2*time.Millisecond))
	require.Equal(t, ids[2:5], itemIDs(got.Items))
	require.Equal(t, uint32(1), got.Items[0].Attempts)
}
