package fdbsync_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync"
	"github.com/leaseq/leaseq/fdbsync/fdbmodel"
	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

func TestFDBOpenClusterWithoutTagSaysHowToRebuild(t *testing.T) {
	t.Parallel()
	s, err := fdbsync.OpenCluster("/etc/foundationdb/fdb.cluster", fdbsync.Options{})
	if err == nil {
		// Built with -tags fdb against a reachable cluster: nothing to
		// check here (the conformance suite covers it).
		require.NoError(t, s.Close())
		return
	}
	require.ErrorIs(t, err, fdbsync.ErrNoFDB)
	require.Contains(t, err.Error(), "make build-fdb")
	require.Nil(t, s)
}

func TestFDBWatchReadyWakesOtherNodes(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2, fdbmodel.Faults{})
	ctx := context.Background()
	a, b := c.stores[0], c.stores[1]
	// The subtests are sequential (no t.Parallel): each builds on the queue
	// state the previous one left.
	t.Run("FiresOnEnqueueElsewhere", func(t *testing.T) {
		ch, err := a.WatchReady(ctx, "w1")
		require.NoError(t, err)
		select {
		case <-ch:
			t.Fatal("fired on an empty queue")
		default:
		}
		_, err = b.Enqueue(ctx, storage.EnqueueParams{Queue: "w1", Items: []storage.EnqueueItem{{Payload: []byte("x")}}, Now: c.clk.now()})
		require.NoError(t, err)
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("watch did not fire after an enqueue on another node")
		}
	})
	t.Run("ClosedAtOnceWhenItemsAreReady", func(t *testing.T) {
		ch, err := a.WatchReady(ctx, "w1")
		require.NoError(t, err)
		select {
		case <-ch:
		default:
			t.Fatal("a queue with ready items must not wait")
		}
	})
	t.Run("FiresWhenALeaseExpiresElsewhere", func(t *testing.T) {
		now := c.clk.now()
		p, err := a.Poll(ctx, storage.PollParams{Queue: "w1", Max: 10, Lease: time.Second, Now: now})
		require.NoError(t, err)
		require.Len(t, p.Items, 1)
		ch, err := a.WatchReady(ctx, "w1")
		require.NoError(t, err)
		res, err := b.Sweep(ctx, storage.SweepParams{Now: p.ExpiresAt, Limit: 10})
		require.NoError(t, err)
		require.Equal(t, 1, res.Requeued)
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("watch did not fire after a sweep on another node requeued an item")
		}
	})
	t.Run("EndsWithContextAndClose", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		ch, err := a.WatchReady(cctx, "w-empty")
		require.NoError(t, err)
		cancel()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("watch did not end with its context")
		}
		s, err := fdbsync.New(c.db, fdbsync.Options{})
		require.NoError(t, err)
		ch, err = s.WatchReady(ctx, "w-empty")
		require.NoError(t, err)
		require.NoError(t, s.Close())
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal("watch did not end with Close")
		}
		_, err = s.WatchReady(ctx, "w-empty")
		require.ErrorIs(t, err, storage.ErrClosed)
	})
}

func TestFDBLargePayloadsAreChunkedAndTransactionsStaySmall(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 1, fdbmodel.Faults{Seed: 5, UnknownResult: 0.1, UnknownApplied: 0.5})
	s := c.stores[0]
	ctx := context.Background()
	var items []storage.EnqueueItem
	for i, n := range []int{0, 1, 16 << 10, 16<<10 + 1, 90_000, 250_000, 1 << 20, 1 << 20} {
		p := bytes.Repeat([]byte{byte('a' + i)}, n)
		items = append(items, storage.EnqueueItem{Payload: p})
	}
	// 40 more of 1 MiB: 40 MiB in one call, far over FDB's 10 MB, must be
	// spread over many small transactions.
	for i := 0; i < 40; i++ {
		items = append(items, storage.EnqueueItem{Payload: bytes.Repeat([]byte{byte(i)}, 1<<20)})
	}
	res, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "big", Items: items, Now: c.clk.now()})
	require.NoError(t, err)
	for i := 1; i < len(res); i++ {
		require.Equal(t, storage.CodeOK, res[i].Code)
		require.Equal(t, -1, bytes.Compare(res[i-1].ID[:], res[i].ID[:]), "ids increase in enqueue order")
	}
	var got [][]byte
	for len(got) < len(items) {
		p, err := s.Poll(ctx, storage.PollParams{Queue: "big", Max: 1000, Lease: time.Minute, Now: c.clk.now()})
		require.NoError(t, err)
		require.NotEmpty(t, p.Items)
		ids := make([]storage.ItemID, len(p.Items))
		for i, it := range p.Items {
			got = append(got, it.Payload)
			ids[i] = it.ID
		}
		codes, err := s.Ack(ctx, storage.AckParams{Queue: "big", Lease: p.Lease, IDs: ids, Now: c.clk.now()})
		require.NoError(t, err)
		for _, code := range codes {
			require.Equal(t, storage.CodeOK, code)
		}
	}
	for i := range items {
		require.True(t, bytes.Equal(items[i].Payload, got[i]), "payload %d (%d bytes) round-trips", i, len(items[i].Payload))
	}
	rep, err := s.Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Violations)
	st := c.db.Stats()
	require.Zero(t, st.TxnsOver1MB)
	require.Less(t, st.MaxTxnSize, 300_000, "every transaction is planned within a 256 KiB budget")
	m := s.Metrics()
	require.Greater(t, m.UploadTxns, int64(40), "large payloads go through upload transactions")
	t.Logf("max transaction %d bytes, %d upload transactions, %d keys left", st.MaxTxnSize, m.UploadTxns, st.Keys)
}

// TestFDBEveryCallIsIdempotentUnderUnknownResults makes every commit
// report commit_unknown_result (applied or not, by a seeded coin): each
// call must still return exactly what one clean execution returns, and
// the data must stay consistent.
func TestFDBEveryCallIsIdempotentUnderUnknownResults(t *testing.T) {
	t.Parallel()
	c := newCluster(t, 2, fdbmodel.Faults{Seed: 9, UnknownResult: 1, UnknownApplied: 0.5})
	a, b := c.stores[0], c.stores[1]
	ctx := context.Background()
	now := c.clk.now()
	cfg := storage.DefaultQueueConfig()
	cfg.MaxAttempts = 2
	require.NoError(t, a.SetQueueConfig(ctx, "u", cfg))
	in := []storage.EnqueueItem{{Payload: []byte("a"), DedupKey: "k"}, {Payload: []byte("b")}, {Payload: []byte("c"), DedupKey: "k"}}
	res, err := a.Enqueue(ctx, storage.EnqueueParams{Queue: "u", Items: in, Now: now})
	require.NoError(t, err)
	require.False(t, res[0].Duplicate)
	require.False(t, res[1].Duplicate)
	require.True(t, res[2].Duplicate)
	require.Equal(t, res[0].ID, res[2].ID)
	again, err := b.Enqueue(ctx, storage.EnqueueParams{Queue: "u", Items: in[:1], Now: now})
	require.NoError(t, err)
	require.True(t, again[0].Duplicate)
	require.Equal(t, res[0].ID, again[0].ID)

	p, err := b.Poll(ctx, storage.PollParams{Queue: "u", Max: 10, Lease: time.Second, Now: now})
	require.NoError(t, err)
	require.Len(t, p.Items, 2, "both items, each claimed once")
	exp, err := a.ExtendLease(ctx, storage.ExtendParams{Queue: "u", Lease: p.Lease, Duration: 2 * time.Second, Now: now})
	require.NoError(t, err)
	require.True(t, exp.Equal(now.Add(2*time.Second)))
	codes, err := a.Ack(ctx, storage.AckParams{Queue: "u", Lease: p.Lease, IDs: []storage.ItemID{res[0].ID}, Now: now})
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK}, codes)
	zero := time.Duration(0)
	codes, err = b.Nack(ctx, storage.NackParams{Queue: "u", Lease: p.Lease, IDs: []storage.ItemID{res[1].ID}, Delay: &zero, Reason: "r", Now: now})
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK}, codes)

	p2, err := a.Poll(ctx, storage.PollParams{Queue: "u", Max: 10, Lease: time.Second, Now: now})
	require.NoError(t, err)
	require.Len(t, p2.Items, 1)
	require.Equal(t, uint32(2), p2.Items[0].Attempts, "one delivery per poll, none lost or doubled")
	sw, err := b.Sweep(ctx, storage.SweepParams{Now: p2.ExpiresAt, Limit: 10})
	require.NoError(t, err)
	require.Equal(t, 1, sw.LeasesExpired)
	require.Equal(t, 1, sw.DeadLettered)
	rr, err := a.Redrive(ctx, storage.RedriveParams{Queue: "u", IDs: []storage.ItemID{res[1].ID}, Now: p2.ExpiresAt})
	require.NoError(t, err)
	require.Equal(t, 1, rr.Moved)
	n, err := b.Purge(ctx, storage.PurgeParams{Queue: "u", Now: p2.ExpiresAt})
	require.NoError(t, err)
	require.Equal(t, 1, n)

	st, err := a.Stats(ctx, storage.StatsParams{Queue: "u", Now: p2.ExpiresAt})
	require.NoError(t, err)
	require.Equal(t, uint64(2), st[0].Enqueued)
	require.Equal(t, uint64(2), st[0].Duplicates)
	require.Equal(t, uint64(3), st[0].Delivered)
	require.Equal(t, uint64(1), st[0].Acked)
	require.Equal(t, uint64(1), st[0].Nacked)
	require.Equal(t, uint64(1), st[0].Expired)
	require.Equal(t, uint64(1), st[0].DeadLettered)
	require.Equal(t, uint64(1), st[0].Redriven)
	require.Equal(t, uint64(1), st[0].Purged)
	require.Zero(t, st[0].Ready+st[0].Delayed+st[0].Inflight+st[0].Dead+st[0].Leases)
	rep, err := a.Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Violations)
	ms := c.db.Stats()
	require.Positive(t, ms.InjUnknownApplied)
	require.Less(t, ms.InjUnknownApplied, ms.InjUnknown)
}

func TestFDBClosedStoreReturnsErrClosed(t *testing.T) {
	t.Parallel()
	db := fdbmodel.New(fdbmodel.Options{Clock: clock.NewMock()})
	s, err := fdbsync.New(db, fdbsync.Options{})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close is idempotent")
	_, err = s.Poll(context.Background(), storage.PollParams{Queue: "q", Max: 1, Now: base})
	require.True(t, errors.Is(err, storage.ErrClosed))
}

// countKeys counts the keys under prefix in the model.
func countKeys(t *testing.T, db kv.DB, prefix []byte) int {
	t.Helper()
	v, err := kv.NewRetrier(db, kv.RetrierOptions{}).Transact(context.Background(), func(tx kv.Tx) (any, error) {
		rows, err := tx.GetRange(prefix, kv.PrefixEnd(prefix), kv.RangeOptions{Snapshot: true})
		return len(rows), err
	})
	require.NoError(t, err)
	return v.(int)
}

func TestFDBSweepCollectsGarbage(t *testing.T) {
	t.Parallel()
	mock := clock.NewMock()
	db := fdbmodel.New(fdbmodel.Options{Clock: mock})
	s, err := fdbsync.New(db, fdbsync.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	c := &cluster{db: db, stores: []*fdbsync.Store{s}}
	ctx := context.Background()
	now := base
	// A poll on a queue that never existed still registers the node as a
	// poller; every call leaves a marker.
	_, err = s.Poll(ctx, storage.PollParams{Queue: "ghost", Max: 1, Now: now})
	require.NoError(t, err)
	_, err = s.Enqueue(ctx, storage.EnqueueParams{Queue: "real", Items: []storage.EnqueueItem{{Payload: []byte("x")}}, Now: now})
	require.NoError(t, err)
	pre := []byte(fdbsync.DefaultPrefix)
	require.Equal(t, 1, countKeys(t, c.db, append(pre, 'n')))
	require.Equal(t, 2, countKeys(t, c.db, append(pre, 't')), "heartbeat and enqueue markers")
	// Markers age by the cluster's versions, which follow the model's
	// clock; heartbeats by the callers' time.
	mock.Add(2 * time.Hour)
	_, err = s.Sweep(ctx, storage.SweepParams{Now: now.Add(2 * time.Hour)})
	require.NoError(t, err)
	require.Zero(t, countKeys(t, c.db, append(pre, 'n')), "stale heartbeat dropped")
	require.Equal(t, 1, countKeys(t, c.db, append(pre, 't')), "old markers dropped; only the sweep's own is left")
}
