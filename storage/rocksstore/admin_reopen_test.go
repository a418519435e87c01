package rocksstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// DeleteQueue with Force over dedup, delayed, leased and dead items, then
// the queue made again: the dedup key is gone and Stats agree before and
// after a sweep and a reopen.
func TestAdmin_DeleteQueueForceThenRecreate(t *testing.T) {
	b := setup(t)
	b.enqueue("q", at(0), storage.EnqueueItem{Payload: []byte("a"), DedupKey: "k"},
		storage.EnqueueItem{Payload: []byte("b"), Delay: time.Hour},
		storage.EnqueueItem{Payload: []byte("c"), MaxAttempts: 1},
		storage.EnqueueItem{Payload: make([]byte, 100000)})
	r := b.poll("q", 2, time.Minute, at(0))
	require.Len(t, r.Items, 2)
	b.nack("q", r.Lease, nil, at(0), r.Items[1].ID)
	r2 := b.poll("q", 1, time.Minute, at(0))
	_ = r2
	n, err := b.s.DeleteQueue(b.ctx, storage.DeleteQueueParams{Queue: "q", Force: true, Now: at(0)})
	require.NoError(t, err)
	require.Equal(t, 4, n)
	res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Now: at(time.Second), Items: []storage.EnqueueItem{{DedupKey: "k"}}})
	require.NoError(t, err)
	require.False(t, res[0].Duplicate)
	st := b.stats("q", at(time.Second))
	b.sweep(at(2 * time.Hour))
	st2 := b.stats("q", at(time.Second))
	require.Equal(t, st, st2)
	b.reopen()
	require.Equal(t, st, b.stats("q", at(time.Second)))
	require.Equal(t, int64(1), st.Ready)
	require.Equal(t, uint64(1), st.Enqueued)
}

// Purge, then a reopen, then a redrive: Stats agree across the reopen.
func TestAdmin_PurgeReopen(t *testing.T) {
	b := setup(t)
	b.enqueue("q", at(0), storage.EnqueueItem{Payload: []byte("a"), DedupKey: "k"},
		storage.EnqueueItem{Payload: []byte("b"), Delay: time.Hour},
		storage.EnqueueItem{Payload: []byte("c"), MaxAttempts: 1},
		storage.EnqueueItem{Payload: make([]byte, 100000)})
	r := b.poll("q", 2, time.Minute, at(0))
	b.nack("q", r.Lease, nil, at(0), r.Items[1].ID)
	n, err := b.s.Purge(b.ctx, storage.PurgeParams{Queue: "q", Now: at(0)})
	require.NoError(t, err)
	require.Equal(t, 3, n)
	st := b.stats("q", at(time.Second))
	b.reopen()
	require.Equal(t, st, b.stats("q", at(time.Second)))
	b.sweep(at(2 * time.Hour))
	st.OldestReadyAge = 0
	require.Equal(t, st, b.stats("q", at(time.Second)))
	rr, err := b.s.Redrive(b.ctx, storage.RedriveParams{Queue: "q", Limit: 10, Now: at(3 * time.Hour)})
	require.NoError(t, err)
	require.Equal(t, 1, rr.Moved)
	st = b.stats("q", at(3*time.Hour))
	b.reopen()
	require.Equal(t, st, b.stats("q", at(3*time.Hour)))
	p := b.poll("q", 5, time.Minute, at(3*time.Hour))
	require.Len(t, p.Items, 1)
}

// A poll answered with a batch claimed ahead is promised an expiry counted
// from its own instant, later than the claim's that the database holds; a
// clean Close writes the promise, so after a reopen an ack inside the
// promised lease succeeds.
func TestPrefetch_PromisedExpirySurvivesCleanReopen(t *testing.T) {
	b, _, _ := prefetchSetup(t, 8)
	b.pollAck(2, at(time.Second))
	require.EqualValues(t, 1, b.s.Metrics().Prefetched)
	pollAt := at(time.Second + 10*time.Millisecond)
	r, err := b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 2, Lease: time.Minute, Now: pollAt})
	require.NoError(t, err)
	require.EqualValues(t, 1, b.s.Metrics().PrefetchHits)
	require.Equal(t, pollAt.Add(time.Minute), r.ExpiresAt)
	b.reopen()
	inside := r.ExpiresAt.Add(-time.Millisecond) // before the promised expiry
	codes, err := b.s.Ack(b.ctx, storage.AckParams{Queue: "q", Lease: r.Lease, IDs: itemIDs(r.Items), Now: inside})
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK}, codes)
}

// DeleteQueue with a batch claimed ahead and held, then a reopen.
func TestAdmin_DeleteQueueWithHeldBatch(t *testing.T) {
	b, _, _ := prefetchSetup(t, 8)
	b.pollAck(2, at(time.Second))
	require.EqualValues(t, 1, b.s.Metrics().Prefetched)
	n, err := b.s.DeleteQueue(b.ctx, storage.DeleteQueueParams{Queue: "q", Force: true, Now: at(time.Second)})
	require.NoError(t, err)
	require.Equal(t, 6, n)
	b.enqueueN("q", at(2*time.Second), 3)
	st := b.stats("q", at(2*time.Second))
	require.EqualValues(t, 3, st.Ready)
	require.EqualValues(t, 0, st.Delivered)
	b.reopen()
	require.Equal(t, st, b.stats("q", at(2*time.Second)))
	r := b.poll("q", 5, time.Minute, at(2*time.Second))
	require.Len(t, r.Items, 3)
}
