package rocksstore

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// TestBounds_PurgedDelayedEntriesLeaveTheHeap: the deadline heaps drop
// stale entries once they outnumber the live ones (compactDeadlines).
// Found by review (session 70): stale entries were dropped only from the
// head, so delayed items purged (or whose queue was deleted) left their
// entries, each pointing at its queue's state, until their visible_at
// passed (up to --max-delay, 168h) whenever an earlier live delayed item
// sat at the head: one entry per item, and every deleted queue's state.
func TestBounds_PurgedDelayedEntriesLeaveTheHeap(t *testing.T) {
	b := setup(t)
	now := at(0)
	b.enqueue("anchor", now, storage.EnqueueItem{Payload: []byte("a"), Delay: time.Hour})
	const rounds, per = 5, 1000
	for r := 0; r < rounds; r++ {
		q := fmt.Sprintf("churn%d", r)
		items := make([]storage.EnqueueItem, per)
		for i := range items {
			items[i] = storage.EnqueueItem{Payload: []byte("x"), Delay: 2 * time.Hour}
		}
		b.enqueue(q, now, items...)
		_, err := b.s.DeleteQueue(b.ctx, storage.DeleteQueueParams{Queue: q, Force: true, Now: now})
		require.NoError(t, err)
	}
	// A sweep drops what stale entries it can (nextDeadline).
	res := b.sweep(now.Add(time.Minute))
	require.Equal(t, at(time.Hour), res.Next)

	var heapLen int
	deleted := map[*queueState]bool{}
	_, err := b.s.submit("", 0, func(o *opTx) error {
		heapLen = len(b.s.delayed)
		for _, e := range b.s.delayed {
			if !b.s.live(e.q) {
				deleted[e.q] = true
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, int64(1), b.stats("anchor", now).Delayed)
	require.LessOrEqual(t, heapLen, 2*1+compactSlack,
		"the delayed heap holds %d entries for 1 delayed item after %d items were enqueued delayed and deleted", heapLen, rounds*per)
	// What stays is bounded: at most compactSlack stale entries, each of
	// which may keep a deleted queue's state.
	require.LessOrEqual(t, len(deleted), compactSlack)
}

// TestBounds_ExtendedLeasesLeaveTheHeap: every ExtendLease (and every
// lease acked before its expiry) leaves a stale entry in the expiry heap;
// found by review (session 70): behind one live lease with an earlier
// expiry they piled up for as long as that lease lived (up to
// --max-lease, 12h).
func TestBounds_ExtendedLeasesLeaveTheHeap(t *testing.T) {
	b := setup(t)
	now := at(0)
	b.enqueueN("q", now, 2)
	anchor := b.poll("q", 1, time.Hour, now) // a consumer holding one lease
	require.Len(t, anchor.Items, 1)
	busy := b.poll("q", 1, 2*time.Hour, now)
	require.Len(t, busy.Items, 1)
	const extends = 3000
	for i := 1; i <= extends; i++ {
		_, err := b.s.ExtendLease(b.ctx, storage.ExtendParams{Queue: "q", Lease: busy.Lease, Duration: 2 * time.Hour, Now: now.Add(time.Duration(i) * time.Millisecond)})
		require.NoError(t, err)
	}
	b.sweep(now.Add(4 * time.Second))
	var heapLen int
	_, err := b.s.submit("", 0, func(o *opTx) error {
		heapLen = len(b.s.expiry)
		return nil
	})
	require.NoError(t, err)
	require.LessOrEqual(t, heapLen, 2*2+compactSlack,
		"the expiry heap holds %d entries for 2 live leases after %d extends", heapLen, extends)
}

// TestBounds_AckedLeasesLeaveTheHeap: the ordinary poll/ack cycle
// leaves one stale expiry entry per acked lease; found by review (session
// 70): behind one consumer that held a lease (never acked, up to
// --max-lease) they accumulated, about 40 B per poll for the held lease's
// whole life.
func TestBounds_AckedLeasesLeaveTheHeap(t *testing.T) {
	b := setup(t)
	now := at(0)
	const cycles = 2000
	b.enqueueN("q", now, 1)
	stuck := b.poll("q", 1, time.Hour, now)
	require.Len(t, stuck.Items, 1)
	for i := 0; i < cycles; i += 500 {
		b.enqueueN("q", now, 500)
	}
	for i := 1; i <= cycles; i++ {
		t := now.Add(time.Duration(i) * time.Millisecond)
		p := b.poll("q", 1, time.Hour, t)
		require.Len(b.t, p.Items, 1)
		require.Equal(b.t, []storage.Code{storage.CodeOK}, b.ack("q", p.Lease, t, p.Items[0].ID))
	}
	b.sweep(now.Add(4 * time.Second))
	var heapLen int
	_, err := b.s.submit("", 0, func(o *opTx) error {
		heapLen = len(b.s.expiry)
		return nil
	})
	require.NoError(t, err)
	require.LessOrEqual(t, heapLen, 2*1+compactSlack,
		"the expiry heap holds %d entries for 1 live lease after %d poll/ack cycles", heapLen, cycles)
}

// TestBounds_DeleteQueueDedupKeysInChunks: DeleteQueue of an empty queue
// that still holds many dedup keys (items enqueued with keys, then purged
// or acked, within the dedup window) deletes them in ops of purgeChunk
// keys, as Purge deletes items. Found by review (session 70): it read
// every key into one Go map and deleted them all in one op (8,000 keys of
// 1 KiB: 140 MiB allocated, one commit); a queue's dedup keys are bounded
// only by its enqueue rate times its dedup window.
func TestBounds_DeleteQueueDedupKeysInChunks(t *testing.T) {
	b := setup(t)
	const n = 8000
	key := strings.Repeat("k", storage.DefaultLimits.MaxDedupKey-8)
	now := at(0)
	for i := 0; i < n; i += 1000 {
		items := make([]storage.EnqueueItem, 1000)
		for j := range items {
			items[j] = storage.EnqueueItem{Payload: []byte("p"), DedupKey: fmt.Sprintf("%s%08d", key, i+j)}
		}
		b.enqueue("dq", now, items...)
	}
	purged, err := b.s.Purge(b.ctx, storage.PurgeParams{Queue: "dq", Now: now})
	require.NoError(t, err)
	require.Equal(t, n, purged)

	before := b.s.Metrics().Commits
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	_, err = b.s.DeleteQueue(b.ctx, storage.DeleteQueueParams{Queue: "dq", Now: now})
	require.NoError(t, err)
	runtime.ReadMemStats(&m1)
	commits := b.s.Metrics().Commits - before
	alloc := m1.TotalAlloc - m0.TotalAlloc
	t.Logf("DeleteQueue of %d dedup keys of %d B: %d commit(s), %.1f MiB allocated", n, len(key)+8, commits, float64(alloc)/(1<<20))
	require.GreaterOrEqual(t, commits, uint64(n/purgeChunk),
		"DeleteQueue deleted %d dedup keys (%.1f MiB allocated) in %d commit(s): one op holds every key (removeQueue), unlike purge's chunks of %d",
		n, float64(alloc)/(1<<20), commits, purgeChunk)
}

// A queue refused as not empty keeps its dedup keys: an enqueue of a
// key it holds is still a duplicate.
func TestBounds_DeleteQueueNotEmptyKeepsDedupKeys(t *testing.T) {
	b := setup(t)
	now := at(0)
	items := make([]storage.EnqueueItem, 2*purgeChunk)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: []byte("p"), DedupKey: fmt.Sprintf("k%d", i)}
	}
	b.enqueue("dq", now, items...)
	_, err := b.s.DeleteQueue(b.ctx, storage.DeleteQueueParams{Queue: "dq", Now: now})
	require.ErrorIs(t, err, storage.ErrNotEmpty)
	res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "dq", Items: items[:1], Now: now})
	require.NoError(t, err)
	require.True(t, res[0].Duplicate, "the refused delete dropped the dedup keys")
	b.check()
}

// dedupQueue fills queue q with n items with dedup keys k0..k(n-1),
// then claims and acks them all: q is empty and holds n live dedup keys.
func dedupQueue(b *testBundle, q string, n int) {
	b.t.Helper()
	for i := 0; i < n; i += 100 {
		items := make([]storage.EnqueueItem, 0, 100)
		for j := i; j < min(n, i+100); j++ {
			items = append(items, storage.EnqueueItem{Payload: []byte("p"), DedupKey: fmt.Sprintf("k%d", j)})
		}
		b.enqueue(q, at(0), items...)
	}
	for left := n; left > 0; {
		res := b.poll(q, 100, time.Minute, at(time.Second))
		require.NotEmpty(b.t, res.Items)
		for _, c := range b.ack(q, res.Lease, at(time.Second), itemIDs(res.Items)...) {
			require.Equal(b.t, storage.CodeOK, c)
		}
		left -= len(res.Items)
	}
	require.Equal(b.t, int64(0), b.stats(q, at(time.Second)).Ready)
}

// A DeleteQueue that has begun to drop an empty queue's dedup keys
// finishes: an enqueue meanwhile is refused (the queue is being deleted)
// rather than landing in a queue whose keys are partly gone, and one
// after the delete creates the queue anew. Found by the review of the
// chunked delete (session 70): the enqueue landed, the delete was
// refused as not empty, and the queue stayed without the dedup keys
// dropped so far, so re-enqueues within the window were new items.
func TestBounds_DeleteQueueRefusesEnqueuesBetweenChunks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 2*purgeChunk + 10
	dedupQueue(b, "q", n)
	var during error
	chunks := 0
	b.s.afterDedupChunk = func() {
		if chunks++; chunks == 1 { // between the first chunk and the second
			_, during = b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Now: at(time.Second),
				Items: []storage.EnqueueItem{{Payload: []byte("late"), DedupKey: "k0"}}})
		}
	}
	_, err := b.s.DeleteQueue(b.ctx, storage.DeleteQueueParams{Queue: "q", Now: at(time.Second)})
	require.NoError(t, err)
	require.Equal(t, 4, chunks) // the op that marks the queue, then three chunks
	require.ErrorIs(t, during, storage.ErrUnavailable, "an enqueue into a queue being deleted")
	res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Now: at(2 * time.Second),
		Items: []storage.EnqueueItem{{Payload: []byte("new"), DedupKey: "k0"}}})
	require.NoError(t, err)
	require.False(t, res[0].Duplicate, "the queue created anew has no dedup keys")
	b.check()
}

// A DeleteQueue whose context ends once it has begun to drop the dedup
// keys finishes all the same (found by the review of the chunked delete:
// it returned with the queue in place and some of its keys gone).
func TestBounds_DeleteQueueFinishesPastItsContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = purgeChunk + 10
	dedupQueue(b, "q", n)
	ctx, cancel := context.WithCancel(context.Background())
	b.s.afterDedupChunk = cancel // the caller goes away after the first chunk
	_, err := b.s.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: "q", Now: at(time.Second)})
	require.NoError(t, err)
	_, err = b.s.Stats(b.ctx, storage.StatsParams{Queue: "q", Now: at(time.Second)})
	require.ErrorIs(t, err, storage.ErrNotFound, "the queue is gone")
	b.check()
}
