package storagetest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// Queue lifecycle: DeleteQueue.

func testDeleteQueueRefusesItemsUnlessForced(t *testing.T, f *fixture) {
	dead := killAll(t, f, "q", 1, at(0))
	require.Len(t, dead, 1)
	f.enqueueN("q", at(0), 2)
	f.enqueueIDs("q", at(0), storage.EnqueueItem{Payload: []byte("later"), Delay: time.Hour, DedupKey: "k"})
	p := f.poll("q", 1, time.Minute, at(0))
	require.Len(t, p.Items, 1)
	f.enqueueN("other", at(0), 1)
	before := gauges(f.stats("q", at(time.Second)))

	n, err := f.s.DeleteQueue(f.ctx, storage.DeleteQueueParams{Queue: "q", Now: at(time.Second)})
	requireIs(t, err, storage.ErrNotEmpty, "a queue with items needs Force")
	require.Zero(t, n)
	require.Equal(t, before, gauges(f.stats("q", at(time.Second))), "a refused delete changes nothing")

	n, err = f.s.DeleteQueue(f.ctx, storage.DeleteQueueParams{Queue: "q", Force: true, Now: at(time.Second)})
	require.NoError(t, err)
	require.Equal(t, 4, n, "every item: dead, inflight, ready and delayed")
	names, err := f.s.Queues(f.ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"other"}, names)
	_, err = f.s.Stats(f.ctx, storage.StatsParams{Queue: "q", Now: at(time.Second)})
	requireIs(t, err, storage.ErrNotFound)
	_, err = f.s.QueueConfig(f.ctx, "q")
	requireIs(t, err, storage.ErrNotFound)
	require.Equal(t, codes(storage.CodeNotFound), f.ack("q", p.Lease, at(time.Second), p.Items[0].ID))
	_, err = f.extend("q", p.Lease, time.Minute, at(time.Second))
	requireIs(t, err, storage.ErrLeaseExpired, "the deleted queue's lease is gone")
	res := f.sweep(at(2*time.Hour), 100)
	require.Zero(t, res.LeasesExpired, "no lease expiry left behind")
	require.Zero(t, res.Promoted, "no delayed entry left behind")
	require.Empty(t, res.ReadyQueues)

	// The queue comes back fresh: default config, zero counters, no dedup
	// memory of the deleted items.
	again := f.enqueue("q", at(2*time.Hour), storage.EnqueueItem{Payload: []byte("later"), DedupKey: "k"})
	require.False(t, again[0].Duplicate, "dedup keys went with the queue")
	st := f.stats("q", at(2*time.Hour))
	require.Equal(t, counts{Ready: 1}, gauges(st))
	require.Equal(t, uint64(1), st.Enqueued)
	require.Equal(t, f.h.limits().DefaultQueueConfig(), st.Config)
	require.Equal(t, counts{Ready: 1}, gauges(f.stats("other", at(2*time.Hour))), "other queues are untouched")
}

func testDeleteEmptyQueue(t *testing.T, f *fixture) {
	f.setConfig("empty", storage.DefaultQueueConfig())
	ids := f.enqueueN("drained", at(0), 2)
	p := f.poll("drained", 2, time.Minute, at(0))
	require.Equal(t, codes(storage.CodeOK, storage.CodeOK), f.ack("drained", p.Lease, at(0), ids...))

	for _, q := range []string{"empty", "drained"} {
		n, err := f.s.DeleteQueue(f.ctx, storage.DeleteQueueParams{Queue: q, Now: at(time.Second)})
		require.NoError(t, err, q)
		require.Zero(t, n, q)
		_, err = f.s.DeleteQueue(f.ctx, storage.DeleteQueueParams{Queue: q, Force: true, Now: at(time.Second)})
		requireIs(t, err, storage.ErrNotFound, "deleting twice")
	}
	_, err := f.s.DeleteQueue(f.ctx, storage.DeleteQueueParams{Queue: "ghost", Now: at(0)})
	requireIs(t, err, storage.ErrNotFound)
	_, err = f.s.DeleteQueue(f.ctx, storage.DeleteQueueParams{Queue: "", Now: at(0)})
	requireIs(t, err, storage.ErrInvalidArgument)
	names, err := f.s.Queues(f.ctx)
	require.NoError(t, err)
	require.Empty(t, names)
}

// testDeleteManyItems deletes a queue larger than one internal chunk of
// any backend.
func testDeleteManyItems(t *testing.T, f *fixture) {
	const n = 2500
	for i := 0; i < n; i += 500 {
		f.enqueueN("big", at(0), 500)
	}
	p := f.poll("big", 100, time.Minute, at(0))
	require.Len(t, p.Items, 100)
	got, err := f.s.DeleteQueue(f.ctx, storage.DeleteQueueParams{Queue: "big", Force: true, Now: at(time.Second)})
	require.NoError(t, err)
	require.Equal(t, n, got)
	names, err := f.s.Queues(f.ctx)
	require.NoError(t, err)
	require.Empty(t, names)
}

// deleteFreesQueueSlot checks that a deleted queue no longer counts
// against Limits.MaxQueues (called from RunMaxQueues).
func deleteFreesQueueSlot(t *testing.T, ctx context.Context, s storage.Store, now time.Time) {
	t.Helper()
	_, err := s.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: "q0", Force: true, Now: now})
	require.NoError(t, err)
	_, err = s.Enqueue(ctx, storage.EnqueueParams{Queue: "q2", Items: []storage.EnqueueItem{{Payload: []byte("x")}}, Now: now})
	require.NoError(t, err, "the deleted queue's slot is free again")
	names, err := s.Queues(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"q1", "q2"}, names)
}

func testDeletedQueueStaysDeletedAfterReopen(t *testing.T, f *fixture) {
	f.enqueueIDs("gone", at(0), storage.EnqueueItem{Payload: []byte("x"), DedupKey: "k"})
	f.enqueueN("kept", at(0), 1)
	_, err := f.s.DeleteQueue(f.ctx, storage.DeleteQueueParams{Queue: "gone", Force: true, Now: at(0)})
	require.NoError(t, err)
	f.reopen()
	names, err := f.s.Queues(f.ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"kept"}, names)
	again := f.enqueue("gone", at(time.Second), storage.EnqueueItem{Payload: []byte("x"), DedupKey: "k"})
	require.False(t, again[0].Duplicate)
	require.Equal(t, counts{Ready: 1}, gauges(f.stats("gone", at(time.Second))))
}
