package rocksstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// extendAt extends lease l of queue q by d at now.
func extendAt(b *testBundle, q string, l storage.LeaseID, d time.Duration, now time.Time) (time.Time, error) {
	return b.s.ExtendLease(b.ctx, storage.ExtendParams{Queue: q, Lease: l, Duration: d, Now: now})
}

// An extended lease is not expired at its old expiry, also after a
// reopen, and its ack sticks.
func TestSweepEdges_ExtendSurvivesSweepAndReopen(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"syncnone", "prefetch"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var b *testBundle
			if name == "prefetch" {
				b, _ = prefetchStore(t)
			} else {
				b = setup(t)
			}
			ids := b.enqueueN("q", at(0), 3)
			r := b.poll("q", 3, 30*time.Second, at(0))
			require.Len(t, r.Items, 3)
			exp, err := extendAt(b, "q", r.Lease, 30*time.Second, at(20*time.Second))
			require.NoError(t, err)
			require.Equal(t, at(50*time.Second), exp)
			sw := b.sweep(at(30 * time.Second))
			require.Zero(t, sw.LeasesExpired)
			require.Equal(t, at(50*time.Second), sw.Next)
			b.reopen()
			sw = b.sweep(at(40 * time.Second))
			require.Zero(t, sw.LeasesExpired)
			require.Equal(t, at(50*time.Second), sw.Next)
			require.Equal(t, []storage.Code{storage.CodeOK}, b.ack("q", r.Lease, at(45*time.Second), ids[0]))
			// shorter extend
			exp, err = extendAt(b, "q", r.Lease, time.Second, at(46*time.Second))
			require.NoError(t, err)
			require.Equal(t, at(47*time.Second), exp)
			sw = b.sweep(at(47*time.Second - 1))
			require.Zero(t, sw.LeasesExpired)
			require.Equal(t, at(47*time.Second), sw.Next)
			sw = b.sweep(at(47 * time.Second))
			require.Equal(t, 1, sw.LeasesExpired)
			require.Equal(t, 2, sw.Requeued)
			got := b.poll("q", 10, time.Minute, at(48*time.Second))
			require.ElementsMatch(t, ids[1:], itemIDs(got.Items))
		})
	}
}

// A lease taken from a batch claimed ahead keeps its promised expiry
// through a partial ack, an extend and a clean reopen.
func TestSweepEdges_PrefetchPromiseKeptThroughPartialAckAndReopen(t *testing.T) {
	t.Parallel()
	b, _, _ := prefetchSetup(t, 8)
	b.pollAck(2, at(time.Second))
	require.EqualValues(t, 1, b.s.Metrics().Prefetched)
	pollAt := at(time.Second + 10*time.Millisecond)
	r := b.poll("q", 2, time.Minute, pollAt)
	require.EqualValues(t, 1, b.s.Metrics().PrefetchHits)
	require.Equal(t, pollAt.Add(time.Minute), r.ExpiresAt)
	require.Equal(t, []storage.Code{storage.CodeOK}, b.ack("q", r.Lease, pollAt, r.Items[0].ID))
	b.reopen()
	between := at(time.Second + time.Minute + 5*time.Millisecond)
	sw := b.sweep(between)
	require.Zero(t, sw.LeasesExpired, "expired before the promised expiry")
	require.Equal(t, []storage.Code{storage.CodeOK}, b.ack("q", r.Lease, between, r.Items[1].ID))
}

// The taken lease (no partial ack) survives a clean reopen with its
// promise, and its expiry counts the attempt.
func TestSweepEdges_PrefetchTakenLeaseExpiresOnTimeAfterReopen(t *testing.T) {
	t.Parallel()
	b, _, _ := prefetchSetup(t, 8)
	b.pollAck(2, at(time.Second))
	pollAt := at(time.Second + 10*time.Millisecond)
	r := b.poll("q", 2, time.Minute, pollAt)
	require.EqualValues(t, 1, b.s.Metrics().PrefetchHits)
	b.reopen()
	sw := b.sweep(at(time.Second + time.Minute + 5*time.Millisecond))
	require.Zero(t, sw.LeasesExpired)
	sw = b.sweep(pollAt.Add(time.Minute))
	require.Equal(t, 1, sw.LeasesExpired)
	require.Equal(t, 2, sw.Requeued)
	got := b.poll("q", 10, time.Minute, pollAt.Add(time.Minute))
	n := 0
	for _, it := range got.Items {
		if it.ID == r.Items[0].ID || it.ID == r.Items[1].ID {
			n++
			require.EqualValues(t, 2, it.Attempts, "the taken delivery counts")
		}
	}
	require.Equal(t, 2, n)
}

// Dedup keys expire exactly at enqueue + window, not before.
func TestSweepEdges_DedupKeyExpiresExactlyAtWindowEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := storage.DefaultDedupWindow
	first := b.enqueue("q", at(0), storage.EnqueueItem{DedupKey: "k"})
	sw := b.sweep(at(w - 1))
	require.Zero(t, sw.DedupDropped)
	require.Equal(t, at(w), sw.Next)
	res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{DedupKey: "k"}}, Now: at(w - 1)})
	require.NoError(t, err)
	require.True(t, res[0].Duplicate)
	require.Equal(t, first[0], res[0].ID)
	b.reopen()
	sw = b.sweep(at(w))
	require.Equal(t, 1, sw.DedupDropped)
	res, err = b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{DedupKey: "k"}}, Now: at(w)})
	require.NoError(t, err)
	require.False(t, res[0].Duplicate)
}

// A dedup key written at an instant before the sweep's (clock went
// back) is still dropped at its expiry.
func TestSweepEdges_DedupKeyWrittenBehindTheSweepIsStillDropped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := storage.DefaultDedupWindow
	b.enqueue("q", at(0), storage.EnqueueItem{DedupKey: "a"})
	sw := b.sweep(at(time.Hour))
	require.Equal(t, 1, sw.DedupDropped)
	b.enqueue("q", at(time.Minute), storage.EnqueueItem{DedupKey: "b"})
	sw = b.sweep(at(time.Minute + w))
	require.Equal(t, 1, sw.DedupDropped)
	sw = b.sweep(at(2 * time.Hour))
	require.Zero(t, sw.DedupDropped)
	require.True(t, sw.Next.IsZero())
}

// Delayed items: Next names their time, also after a reopen, and a poll
// at that time gets them.
func TestSweepEdges_DelayedNextAfterReopen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.enqueue("q", at(0), storage.EnqueueItem{Delay: 10 * time.Second, Priority: 0})
	other := b.enqueue("q", at(0), storage.EnqueueItem{Priority: 5})
	sw := b.sweep(at(0))
	require.Equal(t, at(10*time.Second), sw.Next)
	b.reopen()
	sw = b.sweep(at(time.Second))
	require.Equal(t, at(10*time.Second), sw.Next)
	got := b.poll("q", 1, time.Minute, at(2*time.Second))
	require.Equal(t, other, itemIDs(got.Items))
	got = b.poll("q", 1, time.Minute, at(10*time.Second))
	require.Equal(t, id, itemIDs(got.Items))
}

// MaxAttempts: an expiry at the last attempt dead-letters once.
func TestSweepEdges_ExpiryAtMaxAttemptsDeadLettersOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue("q", at(0), storage.EnqueueItem{MaxAttempts: 2})
	r := b.poll("q", 1, time.Second, at(0))
	sw := b.sweep(at(time.Second))
	require.Equal(t, 1, sw.Requeued)
	r = b.poll("q", 1, time.Second, at(time.Second))
	require.Len(t, r.Items, 1)
	require.EqualValues(t, 2, r.Items[0].Attempts)
	b.reopen()
	sw = b.sweep(at(2 * time.Second))
	require.Equal(t, 1, sw.DeadLettered)
	require.Zero(t, sw.Requeued)
	sw = b.sweep(at(3 * time.Second))
	require.Zero(t, sw.DeadLettered+sw.LeasesExpired)
	st := b.stats("q", at(3*time.Second))
	require.EqualValues(t, 1, st.Dead)
	require.EqualValues(t, 1, st.DeadLettered)
	require.EqualValues(t, 2, st.Expired)
	require.Zero(t, st.Inflight+st.Ready+st.Leases)
}

// The lease boundary: valid while now < expiresAt.
func TestSweepEdges_LeaseValidWhileNowBeforeExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueueN("q", at(0), 2)
	r := b.poll("q", 2, time.Second, at(0))
	require.Equal(t, []storage.Code{storage.CodeOK}, b.ack("q", r.Lease, at(time.Second-1), ids[0]))
	require.Equal(t, []storage.Code{storage.CodeLeaseExpired}, b.ack("q", r.Lease, at(time.Second), ids[1]))
	_, err := extendAt(b, "q", r.Lease, time.Second, at(time.Second))
	require.ErrorIs(t, err, storage.ErrLeaseExpired)
	sw := b.sweep(at(time.Second))
	require.Equal(t, 1, sw.Requeued)
}

// Found by review (session 73): shortening a queue's dedup window (or
// setting it to 0, which turns dedup off) did not apply to keys already
// seen. storage.Store.Enqueue: "An item whose DedupKey was enqueued in the
// same queue less than the queue's DedupWindow ago (judged at p.Now) is
// not written", but the dedup record's expiry was fixed by the window in
// force at the first enqueue and the current window was never consulted:
// a key enqueued 1m ago under the old 5m window still came back as a
// duplicate of the first item, and the producer's new item was silently
// dropped. The key's window now runs from its first item's enqueue, read
// back from the item's id, so the judgement also holds after a reopen.
func TestSweepEdges_ShortenedDedupWindowAppliesToKeysAlreadySeen(t *testing.T) {
	t.Parallel()
	for _, w := range []time.Duration{time.Second, 0} {
		t.Run(w.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			first := b.enqueue("q", at(0), storage.EnqueueItem{Payload: []byte("a"), DedupKey: "k"})
			cfg := storage.DefaultQueueConfig()
			cfg.DedupWindow = w
			require.NoError(t, b.s.SetQueueConfig(b.ctx, "q", cfg))
			b.reopen()
			res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("b"), DedupKey: "k"}}, Now: at(time.Minute)})
			require.NoError(t, err)
			require.False(t, res[0].Duplicate, "key enqueued 1m ago, queue's dedup window %v: not a duplicate (got id of %v)", w, first[0])
			require.NotEqual(t, first[0], res[0].ID)
			require.EqualValues(t, 2, b.stats("q", at(time.Minute)).Ready, "the new item was written")
		})
	}
}
