package fdbsync_test

// Queue removal against what session 69's removal history left out:
// queues whose config holds no incarnation, delayed items, and a forced
// removal outpaced by producers. Nodes and hooks as in interleave_test.go.

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync"
	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

// incarnationSize is the versionstamp at the end of a config written by
// this version (kv.VersionstampSize); older nodes' configs end before it.
const incarnationSize = kv.VersionstampSize

// stripIncarnation rewrites q's config as an older node writes it: the
// same fields, no incarnation (what an older node's enqueue creating the
// queue, or its SetQueueConfig, leaves).
func stripIncarnation(t *testing.T, db kv.DB, q string) {
	t.Helper()
	key := rawStr(rawNS('q'), q)
	tx, err := db.CreateTransaction()
	require.NoError(t, err)
	v, err := tx.Get(key, false)
	require.NoError(t, err)
	require.NotNil(t, v, "queue %q has no config", q)
	require.Greater(t, len(v), incarnationSize)
	tx.Set(key, v[:len(v)-incarnationSize])
	require.NoError(t, tx.Commit())
}

// dedupKeys returns the dedup keys stored for q, raw.
func dedupKeys(t *testing.T, db kv.DB, q string) []string {
	t.Helper()
	pre := rawStr(rawNS('u'), q)
	var out []string
	for _, r := range rawRange(t, db, pre, kv.PrefixEnd(pre)) {
		out = append(out, string(r.Key[len(pre):len(r.Key)-1]))
	}
	return out
}

// fillDedup enqueues n items with dedup keys k0000... on q and purges
// them: an empty queue whose dedup keys stay for their window.
func fillDedup(t *testing.T, s *fdbsync.Store, q string, n int, now time.Time) {
	t.Helper()
	ctx := context.Background()
	for start := 0; start < n; start += 500 {
		var in []storage.EnqueueItem
		for i := start; i < min(n, start+500); i++ {
			in = append(in, storage.EnqueueItem{Payload: []byte("p"), DedupKey: fmt.Sprintf("k%04d", i)})
		}
		_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: in, Now: now})
		require.NoError(t, err)
	}
	purged, err := s.Purge(ctx, storage.PurgeParams{Queue: q, Now: now})
	require.NoError(t, err)
	require.Equal(t, n, purged)
}

// TestFDBDeleteQueue_RecreatedWithoutIncarnation: found by review (session
// 70). The transactions after the removal judged which dedup keys were
// the removed queue's by the config of the queue of that name created
// meanwhile; created by an older node (or its config rewritten by one), it
// holds no incarnation, so every old key was kept: not cleared by the
// removal, and taken as the new queue's, refusing its enqueues as
// duplicates until the old keys expired. The keys written before the
// removal's commit are the removed queue's, whatever the config says
// (also when that commit was reported as commit_unknown_result).
func TestFDBDeleteQueue_RecreatedWithoutIncarnation(t *testing.T) {
	t.Parallel()
	db, rdb, a, others := hookNodes(t, 1)
	b := others[0]
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)
	const q = "old"
	fillDedup(t, a, q, 1500, now) // more than one removal transaction clears
	stripIncarnation(t, db, q)    // the queue dates from an older node

	qkey := rawStr(rawNS('q'), q)
	fired := false
	rdb.after = func(info *hookTxInfo, err error) error {
		if err != nil || fired || !anyKey(info.clears, qkey) {
			return err
		}
		fired = true
		// The queue is gone, 1000 of its 1500 dedup keys with it. An older
		// node enqueues: the queue comes to be again, without incarnation.
		_, eerr := b.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{
			{Payload: []byte("new"), DedupKey: "fresh"},
		}, Now: now.Add(time.Second)})
		require.NoError(t, eerr)
		stripIncarnation(t, db, q)
		// And the removal's client learns of its commit only on retry:
		// the bound it clears by comes from its marker.
		return kv.Error{Code: kv.CodeCommitUnknownResult}
	}
	_, err := a.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: q, Now: now.Add(time.Second)})
	require.NoError(t, err)
	require.True(t, fired)
	rdb.mu.Lock()
	rdb.after = nil
	rdb.mu.Unlock()

	require.Equal(t, []string{"fresh"}, dedupKeys(t, db, q), "the removed queue's dedup keys were left behind")
	res, err := b.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{
		{Payload: []byte("again"), DedupKey: "k1200"}, {Payload: []byte("again"), DedupKey: "fresh"},
	}, Now: now.Add(time.Minute)})
	require.NoError(t, err)
	require.False(t, res[0].Duplicate, "k1200 belonged to the removed queue: refused as a duplicate in the new one")
	require.True(t, res[1].Duplicate, "the new queue's own dedup key holds")
	requireCheckClean(t, b)
}

// TestFDBDeleteQueue_NodeStopsAfterRemovingOldQueue: found by review
// (session 70), correct as it was; kept as a regression test. A queue
// dating from an older node (no incarnation) is removed, and the node
// stops before clearing the rest of its dedup keys. A queue of that name
// created again has an incarnation, so the old keys neither suppress its
// enqueues nor count in Check, and the sweeper drops them when they
// expire; the new queue's own keys stay.
func TestFDBDeleteQueue_NodeStopsAfterRemovingOldQueue(t *testing.T) {
	t.Parallel()
	db, rdb, a, others := hookNodes(t, 1)
	b := others[0]
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)
	const q = "old"
	fillDedup(t, a, q, 1500, now)
	stripIncarnation(t, db, q)

	qkey := rawStr(rawNS('q'), q)
	stopped := errors.New("node stopped")
	fired := false
	rdb.after = func(info *hookTxInfo, err error) error {
		if err != nil || fired || !anyKey(info.clears, qkey) {
			return err
		}
		fired = true
		return stopped // committed; the node goes no further
	}
	_, err := a.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: q, Now: now.Add(time.Second)})
	require.ErrorIs(t, err, stopped)
	require.True(t, fired)
	require.Len(t, dedupKeys(t, db, q), 500, "the removal committed; the rest of the keys wait")
	rep, err := b.Check(ctx)
	require.NoError(t, err)
	require.Empty(t, rep.Violations, "keys of a removed queue are not violations")

	later := now.Add(time.Minute)
	res, err := b.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{
		{Payload: []byte("new"), DedupKey: "k1200"}, {Payload: []byte("new"), DedupKey: "fresh"},
	}, Now: later})
	require.NoError(t, err)
	require.False(t, res[0].Duplicate, "a removed queue's dedup key held in the queue created anew")
	require.False(t, res[1].Duplicate)
	res, err = b.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{
		{Payload: []byte("new"), DedupKey: "k1300"}, {Payload: []byte("again"), DedupKey: "k1200"},
	}, Now: later})
	require.NoError(t, err)
	require.False(t, res[0].Duplicate, "a removed queue's dedup key held in the queue created anew")
	require.True(t, res[1].Duplicate, "the new queue's own dedup key holds")
	requireCheckClean(t, b)

	// Past the old keys' window (5 min from now), before the new ones'.
	sw, err := b.Sweep(ctx, storage.SweepParams{Now: now.Add(5*time.Minute + time.Second), Limit: 1000})
	require.NoError(t, err)
	require.Equal(t, 498, sw.DedupDropped, "the old keys left (k1000..k1499 but k1200 and k1300, taken by the new queue)")
	require.ElementsMatch(t, []string{"fresh", "k1200", "k1300"}, dedupKeys(t, db, q))
	requireCheckClean(t, b)
}

// TestFDBDeleteQueue_DelayedItemsOfARemovedQueue: found by review (session
// 70), correct as it was; kept as a regression test. A forced removal
// deletes delayed items with both their index entries (per queue d, and
// the sweeper's global D), also the delayed item another node enqueues
// just as the removal commits (which aborts it; the next round deletes
// it). No entry survives, so the sweeper promotes nothing of the old
// queue into a queue of that name created again.
func TestFDBDeleteQueue_DelayedItemsOfARemovedQueue(t *testing.T) {
	t.Parallel()
	db, rdb, a, others := hookNodes(t, 1)
	b := others[0]
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)
	const q = "later"
	var in []storage.EnqueueItem
	for i := 0; i < 5; i++ {
		in = append(in, storage.EnqueueItem{Payload: []byte("delayed"), Delay: time.Duration(i+1) * time.Minute})
	}
	in = append(in, storage.EnqueueItem{Payload: []byte("ready")})
	_, err := a.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: in, Now: now})
	require.NoError(t, err)
	// One item is inflight and nacked with a delay while the removal runs.
	p, err := b.Poll(ctx, storage.PollParams{Queue: q, Max: 1, Now: now})
	require.NoError(t, err)
	require.Len(t, p.Items, 1)

	qkey := rawStr(rawNS('q'), q)
	purgeInflight := rawStr(rawNS('i'), q)
	nacked, raced := false, false
	rdb.before = func(info *hookTxInfo) {
		switch {
		case !nacked && info.readRangeAt(purgeInflight):
			nacked = true
			codes, err := b.Nack(ctx, storage.NackParams{Queue: q, Lease: p.Lease, IDs: []storage.ItemID{p.Items[0].ID}, Delay: ptr(time.Minute), Now: now})
			require.NoError(t, err)
			require.Equal(t, []storage.Code{storage.CodeOK}, codes)
		case !raced && anyKey(info.clears, qkey):
			raced = true
			_, err := b.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{
				{Payload: []byte("just in time"), Delay: 30 * time.Second},
			}, Now: now})
			require.NoError(t, err)
		}
	}
	n, err := a.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: q, Force: true, Now: now})
	require.NoError(t, err)
	require.True(t, nacked && raced)
	require.Equal(t, 7, n, "5 delayed, 1 nacked with a delay, 1 enqueued during the removal")
	rdb.mu.Lock()
	rdb.before = nil
	rdb.mu.Unlock()

	for _, tag := range []byte{'a', 'r', 'd', 'i', 'x', 'u', 'c'} {
		pre := rawStr(rawNS(tag), q)
		require.Empty(t, rawRange(t, db, pre, kv.PrefixEnd(pre)), "namespace %c of the removed queue", tag)
	}
	require.Empty(t, rawRange(t, db, rawNS('D'), kv.PrefixEnd(rawNS('D'))), "global delayed index entries of the removed queue")

	_, err = b.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{{Payload: []byte("new")}}, Now: now.Add(time.Second)})
	require.NoError(t, err)
	sw, err := b.Sweep(ctx, storage.SweepParams{Now: now.Add(10 * time.Minute)})
	require.NoError(t, err)
	require.Zero(t, sw.Promoted, "a delayed item of the removed queue was promoted")
	st, err := b.Stats(ctx, storage.StatsParams{Queue: q, Now: now.Add(10 * time.Minute)})
	require.NoError(t, err)
	require.Equal(t, int64(1), st[0].Ready)
	require.Zero(t, st[0].Delayed)
	got, err := b.Poll(ctx, storage.PollParams{Queue: q, Max: 10, Now: now.Add(10 * time.Minute)})
	require.NoError(t, err)
	require.Len(t, got.Items, 1)
	require.Equal(t, []byte("new"), got.Items[0].Payload)
	requireCheckClean(t, b)
}

// TestFDBDeleteQueue_ForceOutpacedByProducers: found by review (session
// 70). A forced DeleteQueue whose every removal another node's enqueue
// beats gives up after its rounds with ErrNotEmpty, and the message told
// the caller, who had forced, to "delete them first or force". It now
// says why and what was done. Nothing is half deleted: the queue stands
// with its config and dedup keys and the items enqueued since the last
// round; the items deleted before are gone, counted in the result.
func TestFDBDeleteQueue_ForceOutpacedByProducers(t *testing.T) {
	t.Parallel()
	_, rdb, a, others := hookNodes(t, 1)
	b := others[0]
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)
	const q = "busy"
	cfg := storage.DefaultQueueConfig()
	cfg.MaxAttempts = 7
	require.NoError(t, a.SetQueueConfig(ctx, q, cfg))
	var in []storage.EnqueueItem
	for i := 0; i < 10; i++ {
		in = append(in, storage.EnqueueItem{Payload: []byte("p"), DedupKey: fmt.Sprintf("k%d", i)})
	}
	_, err := a.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: in, Now: now})
	require.NoError(t, err)

	qkey := rawStr(rawNS('q'), q)
	beats := 0
	rdb.before = func(info *hookTxInfo) {
		if !anyKey(info.clears, qkey) {
			return
		}
		// Each removal about to commit: a producer's enqueue lands first.
		beats++
		_, err := b.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{
			{Payload: []byte("more"), DedupKey: fmt.Sprintf("m%d", beats)},
		}, Now: now})
		require.NoError(t, err)
	}
	n, err := a.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: q, Force: true, Now: now})
	require.ErrorIs(t, err, storage.ErrNotEmpty)
	require.NotContains(t, err.Error(), "or force", "the caller forced")
	require.Contains(t, err.Error(), "forced rounds")
	require.Contains(t, err.Error(), "stop its producers")
	rdb.mu.Lock()
	rdb.before = nil
	rdb.mu.Unlock()
	require.Equal(t, 4, beats, "one removal per round")
	require.Equal(t, 13, n, "the 10 items and those enqueued in the first 3 rounds")

	got, err := a.QueueConfig(ctx, q)
	require.NoError(t, err, "the queue stands")
	require.Equal(t, uint32(7), got.MaxAttempts)
	items, err := a.Peek(ctx, storage.PeekParams{Queue: q, Limit: 10, Now: now})
	require.NoError(t, err)
	require.Len(t, items, 1, "the item enqueued in the last round is still there")
	res, err := a.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{{Payload: []byte("p"), DedupKey: "k3"}}, Now: now})
	require.NoError(t, err)
	require.True(t, res[0].Duplicate, "the queue's dedup keys stand")
	requireCheckClean(t, a)

	// With the producers stopped, it goes.
	n, err = a.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: q, Force: true, Now: now})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = a.QueueConfig(ctx, q)
	require.ErrorIs(t, err, storage.ErrNotFound)
}

func anyKey(keys [][]byte, k []byte) bool {
	for _, x := range keys {
		if string(x) == string(k) {
			return true
		}
	}
	return false
}

func ptr[T any](v T) *T { return &v }

// requireCheckClean requires s's invariant check to find nothing wrong.
func requireCheckClean(t *testing.T, s *fdbsync.Store) {
	t.Helper()
	rep, err := s.Check(context.Background())
	require.NoError(t, err)
	require.Empty(t, rep.Violations)
}
