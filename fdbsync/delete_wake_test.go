package fdbsync_test

// A removed queue's wake key, and every other key a queue owns, against
// its removal. Nodes and hooks as in interleave_test.go.

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync"
	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

// wakeKey is q's wake key, raw.
func wakeKey(q string) []byte { return rawStr(rawNS('w'), q) }

// hasKey says whether key is in the model.
func hasKey(t *testing.T, db kv.DB, key []byte) bool {
	t.Helper()
	return len(rawRange(t, db, key, kv.KeyAfter(key))) == 1
}

// requireFired waits for a watch channel, bounded so a watch that never
// fires fails the test instead of hanging it.
func requireFired(t *testing.T, ch <-chan struct{}, msg string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal(msg)
	}
}

func requireParked(t *testing.T, ch <-chan struct{}, msg string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatal(msg)
	default:
	}
}

// parkedWatch sets a watch on q from s that must not have fired yet.
func parkedWatch(t *testing.T, s *fdbsync.Store, q string) <-chan struct{} {
	t.Helper()
	ch, err := s.WatchReady(context.Background(), q)
	require.NoError(t, err)
	requireParked(t, ch, "the watch fired on an empty queue")
	return ch
}

// requireGone requires q removed as seen from s: no config, nothing to
// poll, not listed.
func requireGone(t *testing.T, s *fdbsync.Store, q string, now time.Time) {
	t.Helper()
	ctx := context.Background()
	_, err := s.QueueConfig(ctx, q)
	require.ErrorIs(t, err, storage.ErrNotFound)
	p, err := s.Poll(ctx, storage.PollParams{Queue: q, Max: 10, Now: now})
	require.NoError(t, err)
	require.Empty(t, p.Items)
	names, err := s.Queues(ctx)
	require.NoError(t, err)
	require.NotContains(t, names, q)
}

// TestFDBDeleteQueue_ClearsWakeKey: found by review (session 72). A
// removal cleared the queue's config, counters and dedup keys but not its
// wake key, which stayed in the database for good: one key per queue name
// ever removed, without bound where every job has a queue of its own. A
// polled queue and a queue whose removal takes several transactions (its
// dedup keys) both leave nothing under w.
func TestFDBDeleteQueue_ClearsWakeKey(t *testing.T) {
	t.Parallel()
	db, _, a, others := hookNodes(t, 1)
	b := others[0]
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)

	// Per-job queues: enqueue, serve, remove.
	for _, q := range []string{"job-1", "job-2", "job-3"} {
		_, err := b.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{{Payload: []byte("work")}}, Now: now})
		require.NoError(t, err)
		p, err := a.Poll(ctx, storage.PollParams{Queue: q, Max: 1, Now: now})
		require.NoError(t, err)
		require.Len(t, p.Items, 1)
		codes, err := a.Ack(ctx, storage.AckParams{Queue: q, Lease: p.Lease, IDs: []storage.ItemID{p.Items[0].ID}, Now: now})
		require.NoError(t, err)
		require.Equal(t, []storage.Code{storage.CodeOK}, codes)
		require.True(t, hasKey(t, db, wakeKey(q)))
		_, err = a.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: q, Now: now})
		require.NoError(t, err)
	}
	// A removal that spans transactions, forced.
	fillDedup(t, a, "many-keys", 1500, now)
	require.True(t, hasKey(t, db, wakeKey("many-keys")))
	_, err := a.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: "many-keys", Force: true, Now: now})
	require.NoError(t, err)

	require.Empty(t, rawRange(t, db, rawNS('w'), kv.PrefixEnd(rawNS('w'))), "wake keys of removed queues stayed")
	requireCheckClean(t, b)
}

// TestFDBDeleteQueue_WakesParkedPollsOnEveryNode: found by review
// (session 72), with the wake key cleared at the removal. Polls parked on
// the queue on other nodes are woken by the removal itself (the clear
// fires their watches) and find the queue gone; parked again on the name,
// they are woken by the first enqueue of a queue created again, by this
// version or by an older node (whose config holds no incarnation), and
// get its items.
func TestFDBDeleteQueue_WakesParkedPollsOnEveryNode(t *testing.T) {
	t.Parallel()
	db, _, a, others := hookNodes(t, 2)
	b, c := others[0], others[1]
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)
	const q = "job"

	_, err := a.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{{Payload: []byte("x")}}, Now: now})
	require.NoError(t, err)
	purged, err := a.Purge(ctx, storage.PurgeParams{Queue: q, Now: now})
	require.NoError(t, err)
	require.Equal(t, 1, purged)
	onB, onC := parkedWatch(t, b, q), parkedWatch(t, c, q)

	_, err = a.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: q, Now: now})
	require.NoError(t, err)
	requireFired(t, onB, "a poll parked on node B was not woken by the removal")
	requireFired(t, onC, "a poll parked on node C was not woken by the removal")
	requireGone(t, b, q, now)
	requireGone(t, c, q, now)
	require.False(t, hasKey(t, db, wakeKey(q)))

	// Created again by this version: a poll parked on the name before the
	// queue exists is woken by its first enqueue.
	onB = parkedWatch(t, b, q)
	_, err = c.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{{Payload: []byte("again")}}, Now: now})
	require.NoError(t, err)
	requireFired(t, onB, "the first enqueue of the queue created again did not wake a parked poll")
	p, err := b.Poll(ctx, storage.PollParams{Queue: q, Max: 10, Now: now})
	require.NoError(t, err)
	require.Len(t, p.Items, 1)
	_, err = b.Ack(ctx, storage.AckParams{Queue: q, Lease: p.Lease, IDs: []storage.ItemID{p.Items[0].ID}, Now: now})
	require.NoError(t, err)
	// And woken again by later enqueues, as any queue.
	onB = parkedWatch(t, b, q)
	_, err = c.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{{Payload: []byte("more")}}, Now: now})
	require.NoError(t, err)
	requireFired(t, onB, "an enqueue on the queue created again did not wake a parked poll")
	n, err := a.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: q, Force: true, Now: now})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.False(t, hasKey(t, db, wakeKey(q)))

	// Created again by an older node: the same wake key, written by its
	// enqueue's ADD, with a config that holds no incarnation.
	onB = parkedWatch(t, b, q)
	_, err = c.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{{Payload: []byte("old")}}, Now: now})
	require.NoError(t, err)
	stripIncarnation(t, db, q)
	requireFired(t, onB, "an older node's enqueue creating the queue again did not wake a parked poll")
	p, err = b.Poll(ctx, storage.PollParams{Queue: q, Max: 10, Now: now})
	require.NoError(t, err)
	require.Len(t, p.Items, 1)
	_, err = b.Ack(ctx, storage.AckParams{Queue: q, Lease: p.Lease, IDs: []storage.ItemID{p.Items[0].ID}, Now: now})
	require.NoError(t, err)
	onB = parkedWatch(t, b, q)
	_, err = c.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{{Payload: []byte("old 2")}}, Now: now})
	require.NoError(t, err)
	requireFired(t, onB, "an enqueue on the queue an older node created again did not wake a parked poll")
	// Removed once more (an older config): the key goes, parked polls wake.
	p, err = b.Poll(ctx, storage.PollParams{Queue: q, Max: 10, Now: now})
	require.NoError(t, err)
	require.Len(t, p.Items, 1)
	_, err = b.Ack(ctx, storage.AckParams{Queue: q, Lease: p.Lease, IDs: []storage.ItemID{p.Items[0].ID}, Now: now})
	require.NoError(t, err)
	onC = parkedWatch(t, c, q)
	_, err = a.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: q, Now: now})
	require.NoError(t, err)
	requireFired(t, onC, "a poll parked on a queue an older node created was not woken by its removal")
	requireGone(t, c, q, now)
	require.False(t, hasKey(t, db, wakeKey(q)))
	requireCheckClean(t, b)
}

// TestFDBDeleteQueue_RecreatedDuringRemovalKeepsItsWakeKey: found by
// review (session 72), correct with the wake key cleared in the removal's
// first transaction (with the config) rather than its last. A queue of
// that name created again while the removal still clears old dedup keys
// owns the wake key from its first enqueue; the removal's later
// transactions leave it, and polls parked on the new queue are woken by
// its enqueues.
func TestFDBDeleteQueue_RecreatedDuringRemovalKeepsItsWakeKey(t *testing.T) {
	t.Parallel()
	db, rdb, a, others := hookNodes(t, 1)
	b := others[0]
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)
	const q = "job"
	fillDedup(t, a, q, 1500, now) // more than one removal transaction clears

	qkey := rawStr(rawNS('q'), q)
	fired := false
	var wakeAfterRecreate []byte
	rdb.after = func(info *hookTxInfo, err error) error {
		if err != nil || fired || !anyKey(info.clears, qkey) {
			return err
		}
		fired = true
		require.Len(t, rawRange(t, db, wakeKey(q), kv.KeyAfter(wakeKey(q))), 0, "the removal's first transaction left the wake key")
		_, eerr := b.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{{Payload: []byte("new")}}, Now: now})
		require.NoError(t, eerr)
		rows := rawRange(t, db, wakeKey(q), kv.KeyAfter(wakeKey(q)))
		require.Len(t, rows, 1, "the queue created again has no wake key")
		wakeAfterRecreate = rows[0].Value
		return err
	}
	_, err := a.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: q, Now: now})
	require.NoError(t, err)
	require.True(t, fired)
	rdb.mu.Lock()
	rdb.after = nil
	rdb.mu.Unlock()
	require.Empty(t, dedupKeys(t, db, q), "the removed queue's dedup keys stayed")

	rows := rawRange(t, db, wakeKey(q), kv.KeyAfter(wakeKey(q)))
	require.Len(t, rows, 1, "the removal's later transactions cleared the new queue's wake key")
	require.True(t, bytes.Equal(wakeAfterRecreate, rows[0].Value), "the removal's later transactions touched the new queue's wake key")
	p, err := b.Poll(ctx, storage.PollParams{Queue: q, Max: 10, Now: now})
	require.NoError(t, err)
	require.Len(t, p.Items, 1)
	_, err = b.Ack(ctx, storage.AckParams{Queue: q, Lease: p.Lease, IDs: []storage.ItemID{p.Items[0].ID}, Now: now})
	require.NoError(t, err)
	onA := parkedWatch(t, a, q)
	_, err = b.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{{Payload: []byte("next")}}, Now: now})
	require.NoError(t, err)
	requireFired(t, onA, "an enqueue on the queue created during the removal did not wake a parked poll")
	requireCheckClean(t, b)
}

// TestFDBDeleteQueue_WatchSetBeforeRemovalWokenByRecreatedQueue: found by
// review (session 72), with the wake key cleared at the removal. The
// key's value is then no longer monotonic: a queue removed and created
// again gets the same wake value back after as many bumps as the old one
// had (here 1 -> absent -> 1). A watch whose transaction read the old
// value before the removal and is registered after the new queue's first
// enqueue saw the value it read (FDB's ABA: a watch fires only if the
// value differs), so the parked poll was not woken although an item was
// ready, and waited for its whole long-poll wait. WatchReady now watches
// the queue's config too, which the re-creation writes with a new
// incarnation; the watch still pending is released once one fires.
func TestFDBDeleteQueue_WatchSetBeforeRemovalWokenByRecreatedQueue(t *testing.T) {
	t.Parallel()
	db, rdb, a, others := hookNodes(t, 1)
	b := others[0]
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)
	const q = "job"

	// The old queue: one enqueue (wake = 1), served, empty.
	_, err := b.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{{Payload: []byte("old")}}, Now: now})
	require.NoError(t, err)
	p, err := b.Poll(ctx, storage.PollParams{Queue: q, Max: 1, Now: now})
	require.NoError(t, err)
	require.Len(t, p.Items, 1)
	_, err = b.Ack(ctx, storage.AckParams{Queue: q, Lease: p.Lease, IDs: []storage.ItemID{p.Items[0].ID}, Now: now})
	require.NoError(t, err)

	// Node A sets a watch (ready index empty, wake read as 1); before its
	// transaction commits, node B removes the queue and creates it again
	// with one item.
	var once sync.Once
	var hookErr error
	rdb.mu.Lock()
	rdb.before = func(*hookTxInfo) {
		once.Do(func() {
			if _, err := b.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: q, Now: now}); err != nil {
				hookErr = err
				return
			}
			_, hookErr = b.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{{Payload: []byte("new")}}, Now: now})
		})
	}
	rdb.mu.Unlock()
	ch, err := a.WatchReady(ctx, q)
	require.NoError(t, err)
	rdb.mu.Lock()
	rdb.before = nil
	rdb.mu.Unlock()
	require.NoError(t, hookErr)
	require.Equal(t, []byte{1, 0, 0, 0, 0, 0, 0, 0}, rawRange(t, db, wakeKey(q), kv.KeyAfter(wakeKey(q)))[0].Value,
		"the wake key is not back at the value the watch read: the test no longer shows the ABA")

	// The item is there.
	st, err := b.Stats(ctx, storage.StatsParams{Queue: q, Now: now})
	require.NoError(t, err)
	require.Len(t, st, 1)
	require.Equal(t, int64(1), st[0].Ready)

	requireFired(t, ch, "a poll parked on the queue was not woken by the first enqueue of the queue created again: the wake key came back to the value its watch read")
	require.Zero(t, db.Stats().Watches, "the wake key's watch stayed registered after the config's fired")
	p, err = a.Poll(ctx, storage.PollParams{Queue: q, Max: 10, Now: now})
	require.NoError(t, err)
	require.Len(t, p.Items, 1)
}

// TestFDBWatchReady_ReleasesBothWatches: found by review (session 72),
// with WatchReady setting two watches (wake key and config). Whichever
// way a watch ends (the wake key's fires, the caller's context ends, the
// store closes), the channel closes and neither watch stays registered.
func TestFDBWatchReady_ReleasesBothWatches(t *testing.T) {
	t.Parallel()
	db, _, a, others := hookNodes(t, 1)
	b := others[0]
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)
	const q = "job"
	require.NoError(t, b.SetQueueConfig(ctx, q, storage.DefaultQueueConfig()))

	// Fired by an enqueue (the wake key's watch).
	ch := parkedWatch(t, a, q)
	require.Equal(t, 2, db.Stats().Watches)
	_, err := b.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{{Payload: []byte("x")}}, Now: now})
	require.NoError(t, err)
	requireFired(t, ch, "an enqueue did not wake a parked poll")
	require.Zero(t, db.Stats().Watches, "the config's watch stayed registered after the wake key's fired")
	purged, err := b.Purge(ctx, storage.PurgeParams{Queue: q, Now: now})
	require.NoError(t, err)
	require.Equal(t, 1, purged)

	// The caller stops waiting.
	wctx, cancel := context.WithCancel(ctx)
	ch, err = a.WatchReady(wctx, q)
	require.NoError(t, err)
	requireParked(t, ch, "the watch fired on an empty queue")
	require.Equal(t, 2, db.Stats().Watches)
	cancel()
	requireFired(t, ch, "a watch whose context ended did not close its channel")
	require.Zero(t, db.Stats().Watches, "watches stayed registered after their caller stopped waiting")

	// The store closes.
	ch = parkedWatch(t, a, q)
	require.Equal(t, 2, db.Stats().Watches)
	require.NoError(t, a.Close())
	requireFired(t, ch, "a watch did not end with its store")
	require.Zero(t, db.Stats().Watches, "watches stayed registered after their store closed")
}

// TestFDBDeleteQueue_NothingOfTheQueueOutlivesIt: found by review
// (session 72). Every key family a queue owns, under its name or in a
// global index, is gone once a forced removal of a queue holding items
// of every kind (ready, delayed, inflight under a lease, dead, chunked
// payloads, dedup keys) completes; only the calls' idempotency markers
// and the pollers' heartbeats stay, which the sweeper collects (after 10
// minutes and an hour).
func TestFDBDeleteQueue_NothingOfTheQueueOutlivesIt(t *testing.T) {
	t.Parallel()
	db, _, a, others := hookNodes(t, 1)
	b := others[0]
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)
	const q = "job"
	cfg := storage.DefaultQueueConfig()
	cfg.MaxAttempts = 1
	require.NoError(t, a.SetQueueConfig(ctx, q, cfg))
	big := bytes.Repeat([]byte("b"), 40_000) // chunked (over 16 KiB)
	_, err := a.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{
		{Payload: []byte("to dead"), DedupKey: "k1"},
		{Payload: big, DedupKey: "k2"},
		{Payload: []byte("ready"), DedupKey: "k3"},
		{Payload: big, Delay: time.Minute},
	}, Now: now})
	require.NoError(t, err)
	p, err := b.Poll(ctx, storage.PollParams{Queue: q, Max: 1, Now: now})
	require.NoError(t, err)
	require.Len(t, p.Items, 1)
	codes, err := b.Nack(ctx, storage.NackParams{Queue: q, Lease: p.Lease, IDs: []storage.ItemID{p.Items[0].ID}, Now: now})
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK}, codes)
	p, err = b.Poll(ctx, storage.PollParams{Queue: q, Max: 1, Now: now}) // the big one, inflight
	require.NoError(t, err)
	require.Len(t, p.Items, 1)
	st, err := a.Stats(ctx, storage.StatsParams{Queue: q, Now: now})
	require.NoError(t, err)
	require.Equal(t, [4]int64{1, 1, 1, 1}, [4]int64{st[0].Ready, st[0].Delayed, st[0].Inflight, st[0].Dead})

	n, err := a.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: q, Force: true, Now: now})
	require.NoError(t, err)
	require.Equal(t, 4, n)

	stays := map[byte]bool{'t': true, 'n': true} // markers, heartbeats
	pre := []byte(fdbsync.DefaultPrefix)
	for _, r := range rawRange(t, db, pre, kv.PrefixEnd(pre)) {
		tag := r.Key[len(pre)]
		require.True(t, stays[tag], "key %q outlived the queue's removal", r.Key)
	}
	requireCheckClean(t, b)
}
