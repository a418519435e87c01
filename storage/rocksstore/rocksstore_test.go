package rocksstore

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/storagetest"
)

var t0 = time.Date(2031, time.March, 4, 5, 6, 7, 123456789, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

// testBundle is one store under test.
type testBundle struct {
	t    *testing.T
	dir  string
	opts Options
	s    *Store
	ctx  context.Context
}

type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

func testOptions(t *testing.T) Options {
	return Options{
		Sync:       SyncNone,
		Logger:     slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		JitterFunc: func() float64 { return 0.5 },
		CacheBytes: 8 << 20,
	}
}

func setup(t *testing.T, mod ...func(*Options)) *testBundle {
	t.Helper()
	return setupDir(t, t.TempDir(), mod...)
}

// setupDir is setup on the database in dir.
func setupDir(t *testing.T, dir string, mod ...func(*Options)) *testBundle {
	t.Helper()
	b := &testBundle{t: t, dir: dir, opts: testOptions(t), ctx: context.Background()}
	for _, m := range mod {
		m(&b.opts)
	}
	s, err := Open(b.dir, b.opts)
	require.NoError(t, err)
	b.s = s
	t.Cleanup(func() {
		b.check()
		require.NoError(t, b.s.Close())
	})
	return b
}

func (b *testBundle) check() {
	b.t.Helper()
	rep, err := b.s.Check(b.ctx)
	require.NoError(b.t, err)
	require.True(b.t, rep.OK(), "violations: %v", rep.Violations)
}

func (b *testBundle) reopen() {
	b.t.Helper()
	b.check()
	require.NoError(b.t, b.s.Close())
	s, err := Open(b.dir, b.opts)
	require.NoError(b.t, err)
	b.s = s
}

func (b *testBundle) enqueue(q string, now time.Time, items ...storage.EnqueueItem) []storage.ItemID {
	b.t.Helper()
	res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: q, Items: items, Now: now})
	require.NoError(b.t, err)
	ids := make([]storage.ItemID, len(res))
	for i, r := range res {
		require.Equal(b.t, storage.CodeOK, r.Code, r.Err)
		ids[i] = r.ID
	}
	return ids
}

func (b *testBundle) enqueueN(q string, now time.Time, n int) []storage.ItemID {
	b.t.Helper()
	items := make([]storage.EnqueueItem, n)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: []byte(fmt.Sprintf("p%d", i))}
	}
	return b.enqueue(q, now, items...)
}

func (b *testBundle) poll(q string, max int, lease time.Duration, now time.Time) storage.PollResult {
	b.t.Helper()
	res, err := b.s.Poll(b.ctx, storage.PollParams{Queue: q, Max: max, Lease: lease, Now: now})
	require.NoError(b.t, err)
	return res
}

func (b *testBundle) ack(q string, l storage.LeaseID, now time.Time, ids ...storage.ItemID) []storage.Code {
	b.t.Helper()
	c, err := b.s.Ack(b.ctx, storage.AckParams{Queue: q, Lease: l, IDs: ids, Now: now})
	require.NoError(b.t, err)
	return c
}

func (b *testBundle) nack(q string, l storage.LeaseID, delay *time.Duration, now time.Time, ids ...storage.ItemID) []storage.Code {
	b.t.Helper()
	c, err := b.s.Nack(b.ctx, storage.NackParams{Queue: q, Lease: l, IDs: ids, Delay: delay, Reason: "boom", Now: now})
	require.NoError(b.t, err)
	return c
}

func (b *testBundle) sweep(now time.Time) storage.SweepResult {
	b.t.Helper()
	r, err := b.s.Sweep(b.ctx, storage.SweepParams{Now: now})
	require.NoError(b.t, err)
	return r
}

func (b *testBundle) stats(q string, now time.Time) storage.QueueStats {
	b.t.Helper()
	st, err := b.s.Stats(b.ctx, storage.StatsParams{Queue: q, Now: now})
	require.NoError(b.t, err)
	require.Len(b.t, st, 1)
	return st[0]
}

func itemIDs(items []storage.Item) []storage.ItemID {
	out := make([]storage.ItemID, len(items))
	for i, it := range items {
		out[i] = it.ID
	}
	return out
}

func dur(d time.Duration) *time.Duration { return &d }

func TestRocksStore_Lifecycle(t *testing.T) {
	t.Parallel()
	for _, inline := range []int{0, -1} {
		{
			t.Run(fmt.Sprintf("inline=%d", inline), func(t *testing.T) {
				t.Parallel()
				b := setup(t, func(o *Options) { o.inlineMax = inline })
				ids := b.enqueue("q", at(0),
					storage.EnqueueItem{Payload: []byte("a")},
					storage.EnqueueItem{Payload: []byte("b"), DedupKey: "k"},
					storage.EnqueueItem{Payload: nil})
				require.Len(t, ids, 3)
				for i := 1; i < len(ids); i++ {
					require.Negative(t, bytes.Compare(ids[i-1][:], ids[i][:]), "ids increase")
				}
				res := b.poll("q", 10, time.Second, at(1))
				require.Equal(t, ids, itemIDs(res.Items))
				require.Equal(t, []byte("a"), res.Items[0].Payload)
				require.Equal(t, []byte{}, res.Items[2].Payload)
				require.Equal(t, "k", res.Items[1].DedupKey)
				require.Equal(t, uint32(1), res.Items[0].Attempts)
				require.Equal(t, storage.StateInflight, res.Items[0].State)
				require.Equal(t, at(1).Add(time.Second), res.ExpiresAt)
				require.Equal(t, at(0), res.Items[0].EnqueuedAt)
				st := b.stats("q", at(1))
				require.Equal(t, int64(3), st.Inflight)
				require.Equal(t, int64(1), st.Leases)
				require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK}, b.ack("q", res.Lease, at(2), ids[0], ids[1]))
				require.Equal(t, []storage.Code{storage.CodeOK}, b.nack("q", res.Lease, dur(0), at(2), ids[2]))
				st = b.stats("q", at(2))
				require.Equal(t, storage.QueueStats{Queue: "q", Ready: 1, Enqueued: 3, Delivered: 3, Acked: 2, Nacked: 1,
					Config: storage.DefaultQueueConfig()}, st)
				b.check()
				b.reopen()
				require.Equal(t, st, b.stats("q", at(2)), "counters survive reopen")
				more := b.enqueueN("q", at(3), 1)
				require.Positive(t, bytes.Compare(more[0][:], ids[2][:]), "ids keep increasing after reopen")
				res = b.poll("q", 10, time.Second, at(3))
				require.Equal(t, []storage.ItemID{ids[2], more[0]}, itemIDs(res.Items))
				require.Equal(t, "boom", res.Items[0].LastError)
				require.Equal(t, uint32(2), res.Items[0].Attempts)
			})
		}
	}
}

func TestRocksStore_ServeOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Priority first, then visible_at, then id.
	late := b.enqueue("q", at(0), storage.EnqueueItem{Priority: 1, Delay: 2 * time.Millisecond})
	p1 := b.enqueue("q", at(0), storage.EnqueueItem{Priority: 1})
	p0 := b.enqueue("q", at(1*time.Millisecond), storage.EnqueueItem{Priority: 0}, storage.EnqueueItem{Priority: 0})
	p7 := b.enqueue("q", at(0), storage.EnqueueItem{Priority: 7})
	delayed := b.enqueue("q", at(0), storage.EnqueueItem{Priority: 0, Delay: time.Hour})
	res := b.poll("q", 100, time.Second, at(2*time.Millisecond))
	want := append(append(append(append([]storage.ItemID{}, p0...), p1...), late...), p7...)
	require.Equal(t, want, itemIDs(res.Items))
	require.Empty(t, b.poll("q", 100, time.Second, at(time.Hour-1)).Items)
	got := b.poll("q", 100, time.Second, at(time.Hour))
	require.Equal(t, delayed, itemIDs(got.Items), "a delayed item is served exactly at VisibleAt")
	st := b.stats("q", at(time.Hour))
	require.Equal(t, int64(0), st.Delayed, "claiming an unpromoted delayed item uncounts it as delayed")
	require.Equal(t, int64(0), st.Ready)
}

func TestRocksStore_LeaseDeadline(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueueN("q", at(0), 2)
	res := b.poll("q", 2, 30*time.Second, at(0))
	deadline := at(30 * time.Second)
	require.Equal(t, deadline, res.ExpiresAt)
	require.Equal(t, []storage.Code{storage.CodeOK}, b.ack("q", res.Lease, deadline.Add(-1), ids[0]))
	require.Equal(t, []storage.Code{storage.CodeLeaseExpired}, b.ack("q", res.Lease, deadline, ids[1]),
		"a lease is dead at exactly its expiry, before any sweep")
	_, err := b.s.ExtendLease(b.ctx, storage.ExtendParams{Queue: "q", Lease: res.Lease, Duration: time.Second, Now: deadline})
	require.ErrorIs(t, err, storage.ErrLeaseExpired)
	sw := b.sweep(deadline.Add(-1))
	require.Zero(t, sw.LeasesExpired)
	require.Equal(t, deadline, sw.Next)
	require.False(t, sw.More)
	sw = b.sweep(deadline)
	require.Equal(t, 1, sw.LeasesExpired)
	require.Equal(t, 1, sw.Requeued)
	require.Equal(t, []string{"q"}, sw.ReadyQueues)
	again := b.poll("q", 2, time.Second, deadline)
	require.Equal(t, ids[1:], itemIDs(again.Items))
	require.Equal(t, deadline, again.Items[0].VisibleAt, "requeued at the lease's expiry")
	require.Equal(t, uint32(2), again.Items[0].Attempts)
}

func TestRocksStore_TokenRules(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueueN("q", at(0), 3)
	l1 := b.poll("q", 1, time.Second, at(0))
	l2 := b.poll("q", 1, time.Minute, at(0))
	var never storage.LeaseID
	never[0] = 1
	// ids[2] is available; ids[0] under l1, ids[1] under l2.
	missing := storage.ItemID{0xEE}
	require.Equal(t,
		[]storage.Code{storage.CodeLeaseMismatch, storage.CodeLeaseMismatch, storage.CodeNotFound},
		b.ack("q", l1.Lease, at(1), ids[1], ids[2], missing))
	require.Equal(t,
		[]storage.Code{storage.CodeLeaseMismatch, storage.CodeLeaseExpired, storage.CodeLeaseMismatch},
		b.ack("q", never, at(1), ids[0], ids[2], ids[1]),
	)
	// l1 expired (not swept): its own item is LeaseExpired, an available
	// item LeaseExpired, another lease's item LeaseMismatch.
	after := at(2 * time.Second)
	require.Equal(t,
		[]storage.Code{storage.CodeLeaseExpired, storage.CodeLeaseExpired, storage.CodeLeaseMismatch},
		b.ack("q", l1.Lease, after, ids[0], ids[2], ids[1]))
	_, err := b.s.ExtendLease(b.ctx, storage.ExtendParams{Queue: "other", Lease: l2.Lease, Duration: time.Second, Now: after})
	require.ErrorIs(t, err, storage.ErrLeaseMismatch)
	exp, err := b.s.ExtendLease(b.ctx, storage.ExtendParams{Queue: "q", Lease: l2.Lease, Duration: time.Second, Now: after})
	require.NoError(t, err)
	require.Equal(t, after.Add(time.Second), exp)
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeNotFound}, b.ack("q", l2.Lease, after, ids[1], ids[1]))
	require.Equal(t, []storage.Code{storage.CodeNotFound}, b.ack("nosuchqueue", l2.Lease, after, ids[1]))
	// A fully acked lease is no longer live.
	_, err = b.s.ExtendLease(b.ctx, storage.ExtendParams{Queue: "q", Lease: l2.Lease, Duration: time.Second, Now: after})
	require.ErrorIs(t, err, storage.ErrLeaseExpired)
}

func TestRocksStore_DeadLetterRedrivePurge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueue("q", at(0), storage.EnqueueItem{Payload: []byte("x"), MaxAttempts: 2}, storage.EnqueueItem{Payload: []byte("y"), Priority: 1})
	r := b.poll("q", 1, time.Second, at(0))
	require.Equal(t, []storage.Code{storage.CodeOK}, b.nack("q", r.Lease, nil, at(0), ids[0]))
	st := b.stats("q", at(0))
	require.Equal(t, int64(1), st.Delayed, "backoff 0.5*min(500ms*2,30s) delays the item")
	r = b.poll("q", 1, time.Second, at(time.Second))
	require.Equal(t, ids[:1], itemIDs(r.Items))
	sw := b.sweep(at(2 * time.Second))
	require.Equal(t, 1, sw.DeadLettered)
	dead, err := b.s.DeadList(b.ctx, storage.DeadListParams{Queue: "q", Limit: 10})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, "lease expired", dead[0].Reason)
	require.Equal(t, at(2*time.Second), dead[0].DeadAt)
	require.Equal(t, []byte("x"), dead[0].Payload)
	require.Equal(t, storage.StateDead, dead[0].State)
	rr, err := b.s.Redrive(b.ctx, storage.RedriveParams{Queue: "q", IDs: []storage.ItemID{ids[0], ids[0], ids[1]}, Now: at(3 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeNotFound, storage.CodeNotFound}, rr.Codes)
	require.Equal(t, 1, rr.Moved)
	peek, err := b.s.Peek(b.ctx, storage.PeekParams{Queue: "q", Limit: 10, Now: at(3 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, ids, itemIDs(peek))
	require.Equal(t, uint32(0), peek[0].Attempts)
	require.Equal(t, storage.StateReady, peek[0].State)
	r = b.poll("q", 1, time.Minute, at(3*time.Second))
	n, err := b.s.Purge(b.ctx, storage.PurgeParams{Queue: "q", Now: at(3 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, 2, n)
	st = b.stats("q", at(3*time.Second))
	require.Equal(t, storage.QueueStats{Queue: "q", Enqueued: 2, Delivered: 3, Nacked: 1, Expired: 1, DeadLettered: 1, Redriven: 1, Purged: 2,
		Config: storage.DefaultQueueConfig()}, st)
	require.Equal(t, []storage.Code{storage.CodeNotFound}, b.ack("q", r.Lease, at(3*time.Second), r.Items[0].ID))
}

func TestRocksStore_DedupAndDelayedPromotion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.enqueue("q", at(0), storage.EnqueueItem{DedupKey: "k", Delay: time.Second})
	res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Now: at(time.Minute), Items: []storage.EnqueueItem{{DedupKey: "k"}, {DedupKey: "j"}, {DedupKey: "j"}}})
	require.NoError(t, err)
	require.True(t, res[0].Duplicate)
	require.Equal(t, first[0], res[0].ID)
	require.False(t, res[1].Duplicate)
	require.True(t, res[2].Duplicate)
	require.Equal(t, res[1].ID, res[2].ID)
	sw := b.sweep(at(time.Second))
	require.Equal(t, 1, sw.Promoted)
	require.Equal(t, []string{"q"}, sw.ReadyQueues)
	st := b.stats("q", at(time.Minute))
	require.Equal(t, int64(2), st.Ready)
	require.Equal(t, uint64(2), st.Duplicates)
	sw = b.sweep(at(5 * time.Minute))
	require.Equal(t, 1, sw.DedupDropped)
	require.Equal(t, at(6*time.Minute), sw.Next)
	again := b.enqueue("q", at(5*time.Minute), storage.EnqueueItem{DedupKey: "k"})
	require.NotEqual(t, first[0], again[0])
}

func TestRocksStore_Invalid(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *Options) { o.Limits = storage.DefaultLimits; o.Limits.MaxPayload = 4 })
	res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Now: at(0), Items: []storage.EnqueueItem{{Payload: []byte("12345")}, {Payload: []byte("1")}}})
	require.NoError(t, err)
	require.Equal(t, storage.CodeInvalid, res[0].Code)
	require.NotEmpty(t, res[0].Err)
	require.Equal(t, storage.CodeOK, res[1].Code)
	_, err = b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "bad/name", Now: at(0)})
	require.ErrorIs(t, err, storage.ErrInvalidArgument)
	_, err = b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 0, Now: at(0)})
	require.ErrorIs(t, err, storage.ErrInvalidArgument)
	_, err = b.s.Stats(b.ctx, storage.StatsParams{Queue: "nope"})
	require.ErrorIs(t, err, storage.ErrNotFound)
	_, err = b.s.QueueConfig(b.ctx, "nope")
	require.ErrorIs(t, err, storage.ErrNotFound)
	empty := b.poll("nope", 1, 0, at(0))
	require.True(t, empty.Lease.IsZero())
}

func TestRocksStore_Closed(t *testing.T) {
	t.Parallel()
	s, err := Open(t.TempDir(), testOptions(t))
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close is idempotent")
	_, err = s.Poll(context.Background(), storage.PollParams{Queue: "q", Max: 1})
	require.ErrorIs(t, err, storage.ErrClosed)
	_, err = s.Check(context.Background())
	require.ErrorIs(t, err, storage.ErrClosed)
}

func TestRocksStore_SyncModes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want SyncMode
	}{{"always", SyncAlways}, {"none", SyncNone}} {
		m, err := ParseSyncMode(c.in)
		require.NoError(t, err)
		require.Equal(t, c.want, m)
		require.Equal(t, c.in, m.String())
	}
	_, err := ParseSyncMode("sometimes")
	require.ErrorIs(t, err, storage.ErrInvalidArgument)
	require.Equal(t, SyncAlways, SyncMode(0), "zero value is the safe default")
	require.Equal(t, 3, SuggestedProcs(SyncAlways, 2), "one P more for the fsyncs")
	require.Equal(t, 2, SuggestedProcs(SyncNone, 2))

	b := setup(t, func(o *Options) {
		o.Sync = SyncAlways
		o.Now = time.Now
	})
	b.enqueueN("q", at(0), 1) // creates the queue and reserves ids
	before := b.s.Metrics()
	b.enqueueN("q", at(0), 10)
	d := b.s.Metrics().Sub(before)
	require.Equal(t, uint64(1), d.Commits)
	require.Equal(t, uint64(1), d.SyncCommits)
	require.Equal(t, uint64(1), d.WALSyncs, "one commit, one fsync")
	require.Positive(t, d.SyncTime)
	require.Positive(t, d.CommitTime)
	last := b.s.Metrics()
	require.NoError(t, b.s.Close())
	require.Equal(t, last, b.s.Metrics(), "metrics survive Close and never go backwards")
	s, err := Open(b.dir, b.opts)
	require.NoError(t, err)
	b.s = s
}

func TestRocksStore_ServeOrderAfterDrain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Drain most of a queue, then check that entries inserted below what
	// was served (an older Now), nacked and expired entries are served in
	// visible_at order.
	const n = 2000
	for i := 0; i < n; i += 100 {
		b.enqueueN("q", at(time.Duration(i)), 100)
	}
	var lastLease storage.PollResult
	for i := 0; i < n; i += 100 {
		r := b.poll("q", 100, time.Hour, at(time.Hour))
		require.Len(t, r.Items, 100)
		if i+100 < n {
			require.Equal(t, []storage.Code{storage.CodeOK}, b.ack("q", r.Lease, at(time.Hour), itemIDs(r.Items)[:1]...))
			require.Len(t, b.ack("q", r.Lease, at(time.Hour), itemIDs(r.Items)[1:]...), 99)
		} else {
			lastLease = r
		}
	}
	// An entry below the head (enqueued with an older Now) is still
	// served first; a nacked entry and entries requeued by expiry follow
	// in visible_at order.
	below := b.enqueueN("q", at(0), 1)
	ids := itemIDs(lastLease.Items)
	require.Equal(t, []storage.Code{storage.CodeOK}, b.nack("q", lastLease.Lease, dur(0), at(90*time.Minute), ids[0]))
	sw := b.sweep(at(3 * time.Hour))
	require.Equal(t, 1, sw.LeasesExpired)
	r := b.poll("q", 200, time.Second, at(3*time.Hour))
	require.Len(t, r.Items, 101)
	require.Equal(t, below[0], r.Items[0].ID)
	require.Equal(t, ids[0], r.Items[1].ID)
	require.Equal(t, ids[1:], itemIDs(r.Items[2:]))
	st := b.stats("q", at(3*time.Hour))
	require.Equal(t, int64(0), st.Ready)
	require.Equal(t, int64(101), st.Inflight)
}

func TestRocksStore_ConcurrentPollsCoalesce(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		max int
	}{{7}, {1000}} {
		t.Run(fmt.Sprintf("max=%d", c.max), func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(o *Options) { o.Sync = SyncAlways })
			n, workers := 2000, 8
			if c.max == 1000 {
				n = 12000 // more than one capped batch (maxBatchItems) of 8 polls
			}
			for i := 0; i < n; i += 1000 {
				b.enqueueN("q", at(0), 1000)
			}
			var mu sync.Mutex
			seen := map[storage.ItemID]bool{}
			var wg sync.WaitGroup
			for w := 0; w < workers; w++ {
				wg.Go(func() {
					for {
						r, err := b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: c.max, Lease: time.Minute, Now: at(time.Second)})
						if err != nil {
							t.Error(err)
							return
						}
						if len(r.Items) > c.max {
							t.Errorf("poll of max %d got %d items", c.max, len(r.Items))
						}
						if len(r.Items) == 0 {
							return
						}
						mu.Lock()
						for _, it := range r.Items {
							if seen[it.ID] {
								t.Errorf("item %s delivered twice", it.ID)
							}
							seen[it.ID] = true
						}
						mu.Unlock()
						codes, err := b.s.Ack(b.ctx, storage.AckParams{Queue: "q", Lease: r.Lease, IDs: itemIDs(r.Items), Now: at(time.Second)})
						if err != nil {
							t.Error(err)
							return
						}
						for _, c := range codes {
							if c != storage.CodeOK {
								t.Errorf("ack: %v", c)
							}
						}
					}
				})
			}
			wg.Wait()
			require.Len(t, seen, n)
			m := b.s.Metrics()
			t.Logf("polls=%d claim passes=%d commits=%d wal syncs=%d", m.Polls, m.ClaimPasses, m.Commits, m.WALSyncs)
			require.LessOrEqual(t, m.ClaimPasses, m.Polls)
			st := b.stats("q", at(time.Second))
			require.Equal(t, uint64(n), st.Acked)
			require.Zero(t, st.Inflight+st.Ready+st.Leases)
		})
	}
}

func TestRocksStore_OnDeadline(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []time.Time
	b := setup(t, func(o *Options) {
		o.OnDeadline = func(d time.Time) {
			mu.Lock()
			got = append(got, d)
			mu.Unlock()
		}
	})
	ids := b.enqueue("q", at(0), storage.EnqueueItem{}, storage.EnqueueItem{Delay: time.Minute})
	r := b.poll("q", 1, 10*time.Second, at(0))
	_, err := b.s.ExtendLease(b.ctx, storage.ExtendParams{Queue: "q", Lease: r.Lease, Duration: 20 * time.Second, Now: at(time.Second)})
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK}, b.nack("q", r.Lease, dur(5*time.Second), at(2*time.Second), ids[0]))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []time.Time{at(time.Minute), at(10 * time.Second), at(21 * time.Second), at(7 * time.Second)}, got)
}

func TestRocksStore_ReopenKeepsLeasesAndIndexes(t *testing.T) {
	t.Parallel()
	{
		t.Run("reopen", func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ids := b.enqueueN("q", at(0), 5)
			b.enqueue("q", at(0), storage.EnqueueItem{Delay: time.Hour, DedupKey: "d"})
			r := b.poll("q", 2, time.Minute, at(0))
			b.poll("q", 2, time.Minute, at(0))
			before := b.stats("q", at(0))
			b.reopen()
			require.Equal(t, before, b.stats("q", at(0)))
			require.Equal(t, []storage.Code{storage.CodeOK}, b.ack("q", r.Lease, at(time.Second), ids[0]))
			res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{DedupKey: "d"}}, Now: at(time.Minute)})
			require.NoError(t, err)
			require.True(t, res[0].Duplicate, "dedup keys survive reopen")
			sw := b.sweep(at(time.Hour))
			require.Equal(t, 2, sw.LeasesExpired)
			require.Equal(t, 3, sw.Requeued)
			require.Equal(t, 1, sw.Promoted)
			require.Equal(t, 1, sw.DedupDropped)
			got := b.poll("q", 10, time.Minute, at(time.Hour))
			require.Len(t, got.Items, 5)
			m := b.s.Metrics()
			require.Positive(t, m.Commits)
		})
	}
}

// TestRocksStore_PurgeUnderLoad runs purges, sweeps and redrives
// against concurrent enqueues, polls, acks and nacks, all interleaved in
// the committer's batches: no call fails, and every invariant holds
// afterwards.
func TestRocksStore_PurgeUnderLoad(t *testing.T) {
	t.Parallel()
	{
		t.Run("load", func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := b.ctx
			var clk benchNow
			b.enqueueN("q", clk.now(), 50)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			fail := func(op string, err error) {
				if err != nil {
					t.Errorf("%s: %v", op, err)
				}
			}
			for w := 0; w < 3; w++ {
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						_, err := b.s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: benchPayloadItems(8, 16), Now: clk.now()})
						fail("enqueue", err)
						r, err := b.s.Poll(ctx, storage.PollParams{Queue: "q", Max: 8, Lease: 100 * time.Millisecond, Now: clk.now()})
						fail("poll", err)
						if len(r.Items) == 0 {
							continue
						}
						ids := itemIDs(r.Items)
						if i%3 == 0 {
							_, err = b.s.Nack(ctx, storage.NackParams{Queue: "q", Lease: r.Lease, IDs: ids, Delay: dur(0), Now: clk.now()})
							fail("nack", err)
						} else {
							_, err = b.s.Ack(ctx, storage.AckParams{Queue: "q", Lease: r.Lease, IDs: ids, Now: clk.now()})
							fail("ack", err)
						}
					}
				})
			}
			wg.Go(func() {
				for i := 0; i < 30; i++ {
					_, err := b.s.Purge(ctx, storage.PurgeParams{Queue: "q", Now: clk.now()})
					fail("purge", err)
					_, err = b.s.Sweep(ctx, storage.SweepParams{Now: clk.now().Add(time.Second)})
					fail("sweep", err)
					_, err = b.s.Redrive(ctx, storage.RedriveParams{Queue: "q", Limit: 100, Now: clk.now()})
					fail("redrive", err)
				}
				close(stop)
			})
			wg.Wait()
			b.check()
			st := b.stats("q", clk.now())
			t.Logf("stats after load: %+v; metrics %+v", st, b.s.Metrics())
			// Every enqueued item is accounted for exactly once.
			require.Equal(t, int64(st.Enqueued), int64(st.Acked)+int64(st.Purged)+st.Ready+st.Delayed+st.Inflight+st.Dead)
		})
	}
}

func TestRocksStore_Limits(t *testing.T) {
	t.Parallel()
	open := func(t *testing.T, lim storage.Limits) storage.Store {
		return setup(t, func(o *Options) { o.Limits = lim }).s
	}
	t.Run("MaxQueues", func(t *testing.T) { storagetest.RunMaxQueues(t, open) })
	t.Run("PartialLimits", func(t *testing.T) { storagetest.RunPartialLimits(t, open) })
	t.Run("NewQueueWithinLimits", func(t *testing.T) { storagetest.RunNewQueueWithinLimits(t, open) })
}

// TestReopen_LowerMaxLeaseLeasesWithinIt: a queue created under
// the default limits keeps its persisted config (default lease 30 s); a
// node reopened with a lower MaxLease must not lease longer than it allows
// when a poll asks for the queue's lease (as new queues are kept within
// the limits, Limits.DefaultQueueConfig): Open brings configs within
// its limits (Limits.ClampQueueConfig).
func TestReopen_LowerMaxLeaseLeasesWithinIt(t *testing.T) {
	b := setup(t)
	b.enqueueN("q", at(0), 1)
	require.NoError(t, b.s.Close())
	b.opts.Limits = storage.Limits{MaxLease: 10 * time.Second}
	s, err := Open(b.dir, b.opts)
	require.NoError(t, err)
	b.s = s
	res, err := b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 1, Now: at(time.Second)})
	require.NoError(t, err)
	require.Len(t, res.Items, 1)
	require.LessOrEqual(t, res.ExpiresAt.Sub(at(time.Second)), 10*time.Second,
		"leased for %v under MaxLease 10s", res.ExpiresAt.Sub(at(time.Second)))
}
