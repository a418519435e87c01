package rocksstore

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/steadyclock"
)

// bootBehind reopens b's store and starts a node clock that reads behind
// by a day at start (a device booted without a battery-backed clock),
// raised to the data's Latest as serve.go raises it. It returns the mock
// wall clock under it and the node's clock.
func (b *testBundle) bootBehind() (*clock.Mock, *steadyclock.Clock) {
	b.t.Helper()
	b.reopen()
	mock := clock.NewMock()
	mock.Set(at(-24 * time.Hour))
	clk := steadyclock.New(mock)
	if latest := b.s.Latest(); latest.After(clk.Now()) {
		clk.AtLeast(latest)
	}
	return mock, clk
}

// enqueueKey enqueues one item with dedup key k into q at now.
func (b *testBundle) enqueueKey(q, k string, now time.Time) storage.EnqueueResult {
	b.t.Helper()
	res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{{Payload: []byte(k), DedupKey: k}}, Now: now})
	require.NoError(b.t, err)
	require.Len(b.t, res, 1)
	require.Equal(b.t, storage.CodeOK, res[0].Code)
	return res[0]
}

// A restart behind data holding only a delayed item and a dedup key (the
// items polled and acked): the node's time goes on from their enqueue
// instant. The delayed item is ready an hour of node time later, not a
// day and an hour (for good, with a clock booted at 1970), and the key
// stops making duplicates after its window, not after the lag.
func TestReviewClock_DelayedAndDedupOnlyRaiseTheClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	t0 := at(0)
	later := b.enqueue("q", t0, storage.EnqueueItem{Payload: []byte("later"), Delay: time.Hour})
	first := b.enqueueKey("d", "k", t0)
	r := b.poll("d", 1, 30*time.Second, t0)
	require.Equal(t, []storage.ItemID{first.ID}, itemIDs(r.Items))
	require.Equal(t, []storage.Code{storage.CodeOK}, b.ack("d", r.Lease, t0, first.ID))

	mock, clk := b.bootBehind()
	require.True(t, b.s.Latest().Equal(t0), "Latest %v", b.s.Latest())
	require.True(t, clk.Now().Equal(t0), "the node's time goes on from the data's: %v", clk.Now())
	dup := b.enqueueKey("d", "k", clk.Now())
	require.True(t, dup.Duplicate, "within the window")
	require.Equal(t, first.ID, dup.ID)
	require.Empty(t, b.poll("q", 1, 30*time.Second, clk.Now()).Items, "not yet due")

	mock.Add(5 * time.Minute) // the dedup window (the default)
	b.sweep(clk.Now())
	fresh := b.enqueueKey("d", "k", clk.Now())
	require.False(t, fresh.Duplicate, "the window has passed in node time")
	mock.Add(55 * time.Minute)
	require.EqualValues(t, 1, b.sweep(clk.Now()).Promoted)
	got := b.poll("q", 1, 30*time.Second, clk.Now())
	require.Equal(t, later, itemIDs(got.Items), "due an hour after its enqueue")
}

// With only dedup keys left (every item acked), Latest is the enqueue
// instant of the key that expires last, which a binary search of the
// dedup_expiry index finds among keys of queues with other windows and
// keys swept away: here a's key, enqueued 10 s before b's whose window is
// shorter.
func TestReviewClock_DedupKeysOnlyLatestIsTheLastExpiring(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for q, w := range map[string]time.Duration{"a": 5 * time.Minute, "b": time.Minute, "c": time.Second} {
		c := b.s.limits.DefaultQueueConfig()
		c.DedupWindow = w
		require.NoError(t, b.s.SetQueueConfig(b.ctx, q, c))
	}
	gone := b.enqueueKey("c", "gone", at(-time.Hour)) // swept: its entry is a tombstone
	r := b.poll("c", 1, 30*time.Second, at(-time.Hour))
	require.Equal(t, []storage.Code{storage.CodeOK}, b.ack("c", r.Lease, at(-time.Hour), gone.ID))
	require.EqualValues(t, 1, b.sweep(at(-time.Hour+time.Minute)).DedupDropped)
	for i, e := range []struct {
		q, k string
		now  time.Time
	}{{"b", "x", at(-20 * time.Second)}, {"a", "y", at(-10 * time.Second)}, {"b", "z", at(0)}} {
		res := b.enqueueKey(e.q, e.k, e.now)
		r := b.poll(e.q, 1, 30*time.Second, e.now)
		require.Equal(t, []storage.ItemID{res.ID}, itemIDs(r.Items), "item %d", i)
		require.Equal(t, []storage.Code{storage.CodeOK}, b.ack(e.q, r.Lease, e.now, res.ID))
	}
	mock, clk := b.bootBehind()
	require.True(t, b.s.Latest().Equal(at(-10*time.Second)), "Latest %v", b.s.Latest())
	require.True(t, b.enqueueKey("b", "z", clk.Now()).Duplicate)
	mock.Add(time.Minute + 10*time.Second) // b's window after z's enqueue, in node time
	b.sweep(clk.Now())
	require.False(t, b.enqueueKey("b", "z", clk.Now()).Duplicate)
	require.True(t, b.enqueueKey("a", "y", clk.Now()).Duplicate, "a's 5 minutes have not passed")
}

// A lease across a restart behind the data never ends early and never
// sticks: by the node's clock it is live until the expiry its poll was
// given (an ack works), and then expires, its item ready again and
// delivered once more. The data holds no claim instant, only the item's
// visible_at (here the enqueue, 10 s before the claim), so the node's time
// goes on from there and the lease outlives the restart by up to that
// much more than it had left (a bounded edge, not a loss: see the report
// of session 74).
func TestReviewClock_LeaseAcrossRestartBehind(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueueN("q", at(0), 2)
	r := b.poll("q", 2, 30*time.Second, at(10*time.Second))
	require.Equal(t, ids, itemIDs(r.Items))
	require.True(t, r.ExpiresAt.Equal(at(40*time.Second)))

	mock, clk := b.bootBehind()
	require.True(t, clk.Now().Equal(at(0)), "node time %v", clk.Now())
	mock.Add(40*time.Second - time.Nanosecond)
	require.Zero(t, b.sweep(clk.Now()).LeasesExpired, "live until its expiry")
	require.Empty(t, b.poll("q", 2, 30*time.Second, clk.Now()).Items, "both items are leased")
	require.Equal(t, []storage.Code{storage.CodeOK}, b.ack("q", r.Lease, clk.Now(), ids[0]))
	mock.Add(time.Nanosecond)
	require.Equal(t, 1, b.sweep(clk.Now()).LeasesExpired)
	got := b.poll("q", 2, 30*time.Second, clk.Now())
	require.Equal(t, ids[1:], itemIDs(got.Items), "the unacked item comes back once")
	require.EqualValues(t, 2, got.Items[0].Attempts)
}

// peekIDs lists the ids Peek shows of q (available, or inflight) at now.
func (b *testBundle) peekIDs(inflight bool, now time.Time) []storage.ItemID {
	b.t.Helper()
	items, err := b.s.Peek(b.ctx, storage.PeekParams{Queue: "q", Inflight: inflight, Limit: 100, Now: now})
	require.NoError(b.t, err)
	return itemIDs(items)
}

// Peek gives back the batches claimed ahead before it reads, so a held
// batch's items show as the available items they are (prefetch.go: no
// caller can tell a batch was held). An ack that ends a lease while
// Peek's give-back waits for its fsync, before Peek's scan, must not
// claim ahead again: its batch would be in neither listing, items no
// consumer holds hidden from the admin's view of available items (and
// shown as inflight).
func TestReviewPeek_AckClaimingAheadDuringPeekHidesNothing(t *testing.T) {
	t.Parallel()
	b, h, res := prefetchSetup(t, 8)
	now := at(time.Second)
	held := b.poll("q", 2, time.Minute, now) // items 0, 1: a consumer's lease
	require.Equal(t, []storage.ItemID{res[0].ID, res[1].ID}, itemIDs(held.Items))
	b.pollAck(2, now) // delivers 2, 3 and claims 4, 5 ahead
	require.EqualValues(t, 1, b.s.Metrics().Prefetched)

	h.free.Store(false) // from here every fsync waits for a release
	type page struct {
		ids []storage.ItemID
		err error
	}
	peeked := make(chan page, 1)
	go func() {
		items, err := b.s.Peek(context.Background(), storage.PeekParams{Queue: "q", Limit: 100, Now: now})
		peeked <- page{itemIDs(items), err}
	}()
	<-h.entered // Peek's give-back is written and waits for its fsync
	acked := make(chan error, 1)
	go func() {
		_, err := b.s.Ack(b.ctx, storage.AckParams{Queue: "q", Lease: held.Lease, IDs: itemIDs(held.Items), Now: now})
		acked <- err
	}()
	waitUnsynced(t, b.s, 1) // the ack's batch is written behind it (Peek's is being fsynced)
	h.free.Store(true)
	h.release <- nil
	require.NoError(t, <-acked)
	p := <-peeked
	require.NoError(t, p.err)

	want := []storage.ItemID{res[4].ID, res[5].ID, res[6].ID, res[7].ID}
	require.Equal(t, want, p.ids, "Peek lists every item no consumer holds")
	// And after the race, with nothing in flight: the same, and nothing
	// shows as inflight (the ack ended the only consumer-held lease).
	require.Equal(t, want, b.peekIDs(false, now))
	require.Empty(t, b.peekIDs(true, now))
	st := b.stats("q", now)
	require.EqualValues(t, 4, st.Ready)
	require.EqualValues(t, 0, st.Inflight)
	// Claims ahead resume once no Peek reads: an ack claims the next.
	b.pollAck(1, now)
	require.EqualValues(t, 2, b.s.Metrics().Prefetched)
}
