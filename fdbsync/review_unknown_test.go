package fdbsync_test

// Review (session 74) of commit_unknown_result and of clock skew between
// nodes. The model already injects commit_unknown_result with the commit
// applied (Faults.UnknownApplied); with UnknownResult and UnknownApplied
// both 1, every write commit is applied and reported unknown, so every
// mutating call takes the replay path of its marker, deterministically.

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync"
	"github.com/leaseq/leaseq/fdbsync/fdbmodel"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/memstore"
)

// allUnknownApplied: every write commit is applied and reported as
// commit_unknown_result.
var allUnknownApplied = fdbmodel.Faults{Seed: 74, UnknownResult: 1, UnknownApplied: 1}

// deadlines records what a store reported through OnDeadline.
type deadlines struct {
	mu sync.Mutex
	ts []time.Time
}

func (d *deadlines) add(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ts = append(d.ts, t.UTC())
}

// take returns the instants reported since the last take.
func (d *deadlines) take() []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.ts
	d.ts = nil
	return out
}

// pair runs every call on memstore (the reference) and on fdbsync over a
// model whose every write commit is applied and reported unknown, and
// compares the outcomes. ids differ between the backends: memIDs[i] and
// fdbIDs[i] are the same item.
type pair struct {
	t        *testing.T
	ctx      context.Context
	mem      storage.Store
	fdb      *fdbsync.Store
	db       *fdbmodel.DB
	memDL    *deadlines
	fdbDL    *deadlines
	ids      map[storage.ItemID]storage.ItemID // fdb id -> mem id
	memLease map[storage.LeaseID]storage.LeaseID
}

func newPair(t *testing.T) *pair {
	t.Helper()
	p := &pair{t: t, ctx: context.Background(), memDL: &deadlines{}, fdbDL: &deadlines{},
		ids: map[storage.ItemID]storage.ItemID{}, memLease: map[storage.LeaseID]storage.LeaseID{}}
	p.mem = memstore.New(memstore.Options{OnDeadline: p.memDL.add, JitterFunc: func() float64 { return 0.5 }})
	p.db = fdbmodel.New(fdbmodel.Options{Clock: clock.NewMock(), Faults: allUnknownApplied})
	s, err := fdbsync.New(p.db, fdbsync.Options{OnDeadline: p.fdbDL.add, Seed: 1})
	require.NoError(t, err)
	p.fdb = s
	t.Cleanup(func() {
		p.db.SetFaults(fdbmodel.Faults{})
		require.NoError(t, s.Close())
		require.NoError(t, p.mem.Close())
	})
	return p
}

// memIDs maps fdb ids to the reference's.
func (p *pair) memIDs(ids []storage.ItemID) []storage.ItemID {
	out := make([]storage.ItemID, len(ids))
	for i, id := range ids {
		m, ok := p.ids[id]
		if !ok {
			m = storage.ItemID{0xff, byte(i)} // unknown on both sides
		}
		out[i] = m
	}
	return out
}

// unknownApplied reports the applied unknown results injected so far; a
// step asserts that it took at least one (its own commit's).
func (p *pair) unknownApplied() int64 { return p.db.Stats().InjUnknownApplied }

// step runs one mutating call on both and requires the fdb side to have
// gone through at least one applied commit_unknown_result.
func (p *pair) step(name string, fn func()) {
	p.t.Helper()
	before := p.unknownApplied()
	fn()
	require.Greater(p.t, p.unknownApplied(), before, "%s: no commit of it was reported unknown", name)
	p.sameState(name)
}

// sameState compares the stats of every queue and requires Check clean.
func (p *pair) sameState(name string) {
	p.t.Helper()
	now := time.Unix(1_800_000_000, 0)
	ms, err := p.mem.Stats(p.ctx, storage.StatsParams{Now: now})
	require.NoError(p.t, err)
	fs, err := p.fdb.Stats(p.ctx, storage.StatsParams{Now: now})
	require.NoError(p.t, err)
	for i := range ms {
		ms[i].OldestReadyAge = 0
	}
	for i := range fs {
		fs[i].OldestReadyAge = 0
	}
	require.Equal(p.t, ms, fs, "%s: stats differ from the reference (counters applied twice or lost?)", name)
	rep, err := p.fdb.Check(p.ctx)
	require.NoError(p.t, err)
	require.True(p.t, rep.OK(), "%s: %v", name, rep.Violations)
}

func (p *pair) enqueue(params storage.EnqueueParams) []storage.EnqueueResult {
	p.t.Helper()
	var mr, fr []storage.EnqueueResult
	p.step("enqueue", func() {
		var err error
		mr, err = p.mem.Enqueue(p.ctx, params)
		require.NoError(p.t, err)
		fr, err = p.fdb.Enqueue(p.ctx, params)
		require.NoError(p.t, err)
	})
	require.Len(p.t, fr, len(mr))
	for i := range mr {
		require.Equal(p.t, mr[i].Code, fr[i].Code, "item %d", i)
		require.Equal(p.t, mr[i].Duplicate, fr[i].Duplicate, "item %d", i)
		if m, ok := p.ids[fr[i].ID]; ok {
			require.Equal(p.t, m, mr[i].ID, "item %d: a duplicate names another item", i)
		} else {
			require.False(p.t, fr[i].Duplicate, "item %d: duplicate of an unknown id", i)
			p.ids[fr[i].ID] = mr[i].ID
		}
	}
	return fr
}

// sameItems compares claimed or listed items field by field, ids mapped.
func (p *pair) sameItems(m, f []storage.Item) {
	p.t.Helper()
	require.Len(p.t, f, len(m))
	for i := range m {
		require.Equal(p.t, m[i].ID, p.ids[f[i].ID], "item %d", i)
		require.True(p.t, bytes.Equal(m[i].Payload, f[i].Payload), "item %d payload", i)
		require.Equal(p.t, m[i].Attempts, f[i].Attempts, "item %d attempts", i)
		require.Equal(p.t, m[i].State, f[i].State, "item %d state", i)
		require.True(p.t, m[i].VisibleAt.Equal(f[i].VisibleAt), "item %d visible at", i)
	}
}

func (p *pair) poll(params storage.PollParams) storage.PollResult {
	p.t.Helper()
	var mr, fr storage.PollResult
	p.step("poll", func() {
		var err error
		mr, err = p.mem.Poll(p.ctx, params)
		require.NoError(p.t, err)
		fr, err = p.fdb.Poll(p.ctx, params)
		require.NoError(p.t, err)
	})
	p.sameItems(mr.Items, fr.Items)
	require.True(p.t, mr.ExpiresAt.Equal(fr.ExpiresAt))
	p.memLease[fr.Lease] = mr.Lease
	return fr
}

func (p *pair) codes(name string, fn func(s storage.Store, lease storage.LeaseID, ids []storage.ItemID) ([]storage.Code, error), lease storage.LeaseID, ids []storage.ItemID) []storage.Code {
	p.t.Helper()
	var mc, fc []storage.Code
	p.step(name, func() {
		var err error
		mc, err = fn(p.mem, p.memLease[lease], p.memIDs(ids))
		require.NoError(p.t, err)
		fc, err = fn(p.fdb, lease, ids)
		require.NoError(p.t, err)
	})
	require.Equal(p.t, mc, fc, "%s: codes differ from the reference (a replay judged its own applied call?)", name)
	return fc
}

// TestReview_UnknownAppliedEveryMutation runs each mutating call with its
// commit applied and reported as commit_unknown_result, side by side with
// memstore, which has no such outcome: the same results, the same
// counters, a clean Check, and the same deadlines reported to the sweeper.
func TestReview_UnknownAppliedEveryMutation(t *testing.T) {
	t.Parallel()
	p := newPair(t)
	ctx := p.ctx
	t0 := time.Unix(1_700_000_000, 0).UTC()
	cfg := storage.DefaultQueueConfig()
	cfg.MaxAttempts = 2
	p.step("set config", func() {
		require.NoError(t, p.mem.SetQueueConfig(ctx, "q", cfg))
		require.NoError(t, p.fdb.SetQueueConfig(ctx, "q", cfg))
	})
	big := bytes.Repeat([]byte("B"), 40_000) // chunked: uploads in their own transactions
	res := p.enqueue(storage.EnqueueParams{Queue: "q", Now: t0, Items: []storage.EnqueueItem{
		{Payload: []byte("a"), DedupKey: "k1"},
		{Payload: []byte("b")},
		{Payload: []byte("c"), DedupKey: "k1"}, // a duplicate of a, in the same commit
		{Payload: []byte("d"), Delay: 10 * time.Second},
		{Payload: big},
	}})
	require.True(t, res[2].Duplicate)
	require.Equal(t, res[0].ID, res[2].ID)
	require.Equal(t, []time.Time{t0.Add(10 * time.Second)}, p.memDL.take())
	require.Equal(t, []time.Time{t0.Add(10 * time.Second)}, p.fdbDL.take(), "the delayed item's deadline was not reported to the sweeper after a replayed enqueue")
	again := p.enqueue(storage.EnqueueParams{Queue: "q", Now: t0, Items: []storage.EnqueueItem{{Payload: []byte("a2"), DedupKey: "k1"}}})
	require.True(t, again[0].Duplicate, "only duplicates: the counter is applied once")
	require.Equal(t, res[0].ID, again[0].ID)

	pr := p.poll(storage.PollParams{Queue: "q", Max: 10, Lease: 30 * time.Second, Now: t0})
	require.Len(t, pr.Items, 3, "a, b and the large one, each claimed once")
	require.Equal(t, []time.Time{t0.Add(30 * time.Second)}, p.fdbDL.take())
	p.memDL.take()

	var mexp, fexp time.Time
	p.step("extend", func() {
		var err error
		mexp, err = p.mem.ExtendLease(ctx, storage.ExtendParams{Queue: "q", Lease: p.memLease[pr.Lease], Duration: time.Minute, Now: t0})
		require.NoError(t, err)
		fexp, err = p.fdb.ExtendLease(ctx, storage.ExtendParams{Queue: "q", Lease: pr.Lease, Duration: time.Minute, Now: t0})
		require.NoError(t, err, "a replayed extend found the expiry it had itself moved")
	})
	require.True(t, mexp.Equal(fexp))
	require.Equal(t, []time.Time{t0.Add(time.Minute)}, p.fdbDL.take())
	p.memDL.take()

	ack := func(s storage.Store, l storage.LeaseID, ids []storage.ItemID) ([]storage.Code, error) {
		return s.Ack(ctx, storage.AckParams{Queue: "q", Lease: l, IDs: ids, Now: t0})
	}
	// a twice in one call: the second is judged after the first.
	codes := p.codes("ack", ack, pr.Lease, []storage.ItemID{res[0].ID, res[0].ID})
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeNotFound}, codes)

	five := 5 * time.Second
	nack := func(s storage.Store, l storage.LeaseID, ids []storage.ItemID) ([]storage.Code, error) {
		return s.Nack(ctx, storage.NackParams{Queue: "q", Lease: l, IDs: ids, Delay: &five, Reason: "r", Now: t0})
	}
	codes = p.codes("nack", nack, pr.Lease, []storage.ItemID{res[1].ID})
	require.Equal(t, []storage.Code{storage.CodeOK}, codes)
	require.Equal(t, []time.Time{t0.Add(5 * time.Second)}, p.memDL.take())
	require.Equal(t, []time.Time{t0.Add(5 * time.Second)}, p.fdbDL.take(), "the nacked item's deadline was not reported to the sweeper after a replayed nack")

	giveBack := func(s storage.Store, l storage.LeaseID, ids []storage.ItemID) ([]storage.Code, error) {
		return s.Nack(ctx, storage.NackParams{Queue: "q", Lease: l, IDs: ids, Undelivered: true, Now: t0})
	}
	codes = p.codes("nack undelivered", giveBack, pr.Lease, []storage.ItemID{res[4].ID})
	require.Equal(t, []storage.Code{storage.CodeOK}, codes, "the lease's last item: the lease ends once")

	// d and b come due; the sweep promotes them.
	t1 := t0.Add(20 * time.Second)
	sweep := func(now time.Time) storage.SweepResult {
		var mr, fr storage.SweepResult
		p.step("sweep", func() {
			var err error
			mr, err = p.mem.Sweep(ctx, storage.SweepParams{Now: now, Limit: 100})
			require.NoError(t, err)
			fr, err = p.fdb.Sweep(ctx, storage.SweepParams{Now: now, Limit: 100})
			require.NoError(t, err)
		})
		mr.Next, fr.Next = time.Time{}, time.Time{}
		require.Equal(t, mr, fr)
		return fr
	}
	sw := sweep(t1)
	require.Equal(t, 2, sw.Promoted)

	pr2 := p.poll(storage.PollParams{Queue: "q", Max: 10, Lease: time.Second, Now: t1})
	require.Len(t, pr2.Items, 3)
	p.memDL.take()
	p.fdbDL.take()
	// The lease runs out: b (second delivery, max 2) dies, the others
	// come back.
	sw = sweep(t1.Add(2 * time.Second))
	require.Equal(t, 1, sw.LeasesExpired)
	require.Equal(t, 1, sw.DeadLettered)
	require.Equal(t, 2, sw.Requeued)

	t2 := t1.Add(3 * time.Second)
	var mrr, frr storage.RedriveResult
	p.step("redrive", func() {
		var err error
		ids := []storage.ItemID{res[1].ID, res[0].ID}
		mrr, err = p.mem.Redrive(ctx, storage.RedriveParams{Queue: "q", IDs: p.memIDs(ids), Now: t2})
		require.NoError(t, err)
		frr, err = p.fdb.Redrive(ctx, storage.RedriveParams{Queue: "q", IDs: ids, Now: t2})
		require.NoError(t, err)
	})
	require.Equal(t, mrr, frr)
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeNotFound}, frr.Codes)

	// b again, to the dead letters by nack this time, then purged there.
	pr3 := p.poll(storage.PollParams{Queue: "q", Max: 1, Lease: time.Minute, Now: t2})
	require.Len(t, pr3.Items, 1)
	one := p.codes("nack", func(s storage.Store, l storage.LeaseID, ids []storage.ItemID) ([]storage.Code, error) {
		return s.Nack(ctx, storage.NackParams{Queue: "q", Lease: l, IDs: ids, Reason: "no", Now: t2})
	}, pr3.Lease, []storage.ItemID{pr3.Items[0].ID})
	require.Equal(t, []storage.Code{storage.CodeOK}, one)
	p.step("purge dead", func() {
		mr, err := p.mem.PurgeDead(ctx, storage.RedriveParams{Queue: "q", Limit: 10, Now: t2})
		require.NoError(t, err)
		fr, err := p.fdb.PurgeDead(ctx, storage.RedriveParams{Queue: "q", Limit: 10, Now: t2})
		require.NoError(t, err)
		require.Equal(t, mr, fr)
	})

	// One item leased, the rest available: a purge takes both kinds.
	p.poll(storage.PollParams{Queue: "q", Max: 1, Lease: time.Minute, Now: t2})
	p.step("purge", func() {
		mn, err := p.mem.Purge(ctx, storage.PurgeParams{Queue: "q", Now: t2})
		require.NoError(t, err)
		fn, err := p.fdb.Purge(ctx, storage.PurgeParams{Queue: "q", Now: t2})
		require.NoError(t, err)
		require.Equal(t, mn, fn, "purged counts")
	})
	// The dedup key's window ends.
	sw = sweep(t0.Add(6 * time.Minute))
	require.Equal(t, 1, sw.DedupDropped)
	p.step("delete queue", func() {
		mn, err := p.mem.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: "q", Now: t0.Add(6 * time.Minute)})
		require.NoError(t, err)
		fn, err := p.fdb.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: "q", Now: t0.Add(6 * time.Minute)})
		require.NoError(t, err, "a replayed removal found its own queue gone")
		require.Equal(t, mn, fn)
	})
	// A forced delete of a queue with items.
	p.enqueue(storage.EnqueueParams{Queue: "f", Now: t0, Items: []storage.EnqueueItem{{Payload: []byte("x")}, {Payload: []byte("y"), DedupKey: "z"}}})
	p.step("delete queue forced", func() {
		mn, err := p.mem.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: "f", Force: true, Now: t0})
		require.NoError(t, err)
		fn, err := p.fdb.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: "f", Force: true, Now: t0})
		require.NoError(t, err)
		require.Equal(t, mn, fn)
	})
	st := p.db.Stats()
	require.Equal(t, st.Committed, st.InjUnknownApplied, "every write commit of the run was an applied unknown result")
	t.Logf("%d write commits, all applied and reported unknown", st.Committed)
}

// TestReview_WatchReadyOnAnItemFromANodeAhead: node A's clock runs 10 s
// ahead of node B's. An item A enqueues is in the ready index with a
// visible_at B's polls do not serve for 10 s (ready means visible_at <=
// now, as on every backend). B's WatchReady closed its channel at once
// because the ready index was not empty, so the dispatcher polled (empty),
// watched (closed at once) and polled again: a busy loop of transactions
// for the whole skew, on every poll parked on the queue. Judged by B's
// clock (Options.Clock, the node's clock), the item is not ready: the
// watch waits, and wakes when B's clock reaches its visible_at.
func TestReview_WatchReadyOnAnItemFromANodeAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	mock := clock.NewMock()
	t0 := time.Unix(1_700_000_000, 0).UTC()
	mock.Set(t0)
	db := fdbmodel.New(fdbmodel.Options{Clock: clock.NewMock()})
	a, err := fdbsync.New(db, fdbsync.Options{Seed: 1})
	require.NoError(t, err)
	b, err := fdbsync.New(db, fdbsync.Options{Seed: 2, Clock: mock})
	require.NoError(t, err)
	t.Cleanup(func() {
		require.NoError(t, a.Close())
		require.NoError(t, b.Close())
	})
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	ahead := t0.Add(10 * time.Second)
	_, err = a.Enqueue(ctx, storage.EnqueueParams{Queue: "s", Now: ahead, Items: []storage.EnqueueItem{{Payload: []byte("x")}}})
	require.NoError(t, err)
	p, err := b.Poll(ctx, storage.PollParams{Queue: "s", Max: 1, Now: mock.Now()})
	require.NoError(t, err)
	require.Empty(t, p.Items, "not visible by B's clock")
	ch, err := b.WatchReady(ctx, "s")
	require.NoError(t, err)
	require.False(t, closed(ch), "WatchReady woke at once for an item B's poll does not serve: the parked poll spins")

	// A lower priority item that is visible: ready at once, although the
	// first entry of the index is not (the scan looks at each priority).
	_, err = a.Enqueue(ctx, storage.EnqueueParams{Queue: "s", Now: t0, Items: []storage.EnqueueItem{{Payload: []byte("y"), Priority: 9}}})
	require.NoError(t, err)
	select {
	case <-ch: // the enqueue bumped the wake key
	case <-time.After(10 * time.Second):
		t.Fatal("the watch missed an enqueue")
	}
	ch2, err := b.WatchReady(ctx, "s")
	require.NoError(t, err)
	require.True(t, closed(ch2), "a ready item of a lower priority was not seen")
	p, err = b.Poll(ctx, storage.PollParams{Queue: "s", Max: 10, Now: mock.Now()})
	require.NoError(t, err)
	require.Len(t, p.Items, 1)
	require.Equal(t, "y", string(p.Items[0].Payload))

	// Only the item from ahead is left: the watch wakes when B's clock
	// reaches its visible_at, with no change to the queue.
	ch3, err := b.WatchReady(ctx, "s")
	require.NoError(t, err)
	require.False(t, closed(ch3))
	mock.Add(9 * time.Second)
	require.False(t, closed(ch3), "woke before the item is visible")
	mock.Add(time.Second)
	select {
	case <-ch3:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not wake when the item became visible by B's clock")
	}
	p, err = b.Poll(ctx, storage.PollParams{Queue: "s", Max: 10, Now: mock.Now()})
	require.NoError(t, err)
	require.Len(t, p.Items, 1)
	require.Equal(t, "x", string(p.Items[0].Payload))
}
