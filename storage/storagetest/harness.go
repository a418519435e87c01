package storagetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// Harness tells the suites how to make the Store under test.
type Harness struct {
	// New returns a fresh, empty store. The suite closes it in t.Cleanup
	// (after running Check) unless the test closed it already; New itself
	// need not register a Close. The store must enforce Limits. t is a
	// *testing.T, or a *testing.B under Bench: use t.TempDir for data.
	New func(t testing.TB) storage.Store
	// Reopen closes s and opens a store over the same data; nil for stores
	// that do not persist. The suite closes the returned store.
	Reopen func(t testing.TB, s storage.Store) storage.Store
	// Limits the stores from New enforce; the zero value means
	// storage.DefaultLimits.
	Limits storage.Limits
	// DataDir, if set, returns the directory holding s's data. RunHistory
	// copies it somewhere that outlives the test when the check fails.
	DataDir func(s storage.Store) string
}

// limits is h.Limits with storage.DefaultLimits for every field left
// zero, as the stores fill them.
func (h Harness) limits() storage.Limits { return h.Limits.WithDefaults() }

// base is the instant every test starts at: far from the Unix epoch and with
// a nanosecond part, so an encoding that drops precision shows up.
var base = time.Date(2031, time.March, 4, 5, 6, 7, 123456789, time.UTC)

// at returns base + d.
func at(d time.Duration) time.Time { return base.Add(d) }

// fixture is one store under test plus helpers that fail the test on an
// unexpected error.
type fixture struct {
	t      *testing.T
	h      Harness
	s      storage.Store
	ctx    context.Context
	closed bool
}

// newFixture makes a store and registers a cleanup that runs Check and then
// closes it.
func newFixture(t *testing.T, h Harness) *fixture {
	t.Helper()
	f := &fixture{t: t, h: h, ctx: context.Background()}
	f.s = h.New(t)
	require.NotNil(t, f.s, "Harness.New returned nil")
	t.Cleanup(func() {
		if f.closed {
			return
		}
		rep, err := f.s.Check(context.Background())
		require.NoError(t, err, "Check at the end of the test")
		require.True(t, rep.OK(), "Check violations at the end of the test: %v", rep.Violations)
		require.NoError(t, f.s.Close())
	})
	return f
}

// reopen closes and reopens the store through Harness.Reopen.
func (f *fixture) reopen() {
	f.t.Helper()
	f.s = f.h.Reopen(f.t, f.s)
	require.NotNil(f.t, f.s, "Harness.Reopen returned nil")
}

func (f *fixture) check() {
	f.t.Helper()
	rep, err := f.s.Check(f.ctx)
	require.NoError(f.t, err)
	require.True(f.t, rep.OK(), "Check violations: %v", rep.Violations)
}

func (f *fixture) enqueue(queue string, now time.Time, items ...storage.EnqueueItem) []storage.EnqueueResult {
	f.t.Helper()
	res, err := f.s.Enqueue(f.ctx, storage.EnqueueParams{Queue: queue, Items: items, Now: now})
	require.NoError(f.t, err, "enqueue")
	require.Len(f.t, res, len(items))
	return res
}

// enqueueIDs enqueues items that must all be accepted as new and returns
// their ids.
func (f *fixture) enqueueIDs(queue string, now time.Time, items ...storage.EnqueueItem) []storage.ItemID {
	f.t.Helper()
	res := f.enqueue(queue, now, items...)
	ids := make([]storage.ItemID, len(res))
	for i, r := range res {
		require.Equal(f.t, storage.CodeOK, r.Code, "item %d: %s", i, r.Err)
		require.False(f.t, r.Duplicate, "item %d", i)
		require.False(f.t, r.ID.IsZero(), "item %d", i)
		ids[i] = r.ID
	}
	return ids
}

// enqueueN enqueues n ready items with payloads p0, p1, ...
func (f *fixture) enqueueN(queue string, now time.Time, n int) []storage.ItemID {
	f.t.Helper()
	items := make([]storage.EnqueueItem, n)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: payload(i)}
	}
	return f.enqueueIDs(queue, now, items...)
}

func payload(i int) []byte { return []byte(fmt.Sprintf("p%d", i)) }

func (f *fixture) poll(queue string, max int, lease time.Duration, now time.Time) storage.PollResult {
	f.t.Helper()
	res, err := f.s.Poll(f.ctx, storage.PollParams{Queue: queue, Max: max, Lease: lease, Now: now})
	require.NoError(f.t, err, "poll")
	if len(res.Items) == 0 {
		require.True(f.t, res.Lease.IsZero(), "an empty poll must carry a zero lease")
	} else {
		require.False(f.t, res.Lease.IsZero(), "a poll with items must carry a lease")
	}
	return res
}

func (f *fixture) ack(queue string, lease storage.LeaseID, now time.Time, ids ...storage.ItemID) []storage.Code {
	f.t.Helper()
	codes, err := f.s.Ack(f.ctx, storage.AckParams{Queue: queue, Lease: lease, IDs: ids, Now: now})
	require.NoError(f.t, err, "ack")
	require.Len(f.t, codes, len(ids))
	return codes
}

func (f *fixture) nack(queue string, lease storage.LeaseID, delay *time.Duration, reason string, now time.Time, ids ...storage.ItemID) []storage.Code {
	f.t.Helper()
	codes, err := f.s.Nack(f.ctx, storage.NackParams{Queue: queue, Lease: lease, IDs: ids, Delay: delay, Reason: reason, Now: now})
	require.NoError(f.t, err, "nack")
	require.Len(f.t, codes, len(ids))
	return codes
}

func (f *fixture) extend(queue string, lease storage.LeaseID, d time.Duration, now time.Time) (time.Time, error) {
	f.t.Helper()
	return f.s.ExtendLease(f.ctx, storage.ExtendParams{Queue: queue, Lease: lease, Duration: d, Now: now})
}

func (f *fixture) sweep(now time.Time, limit int) storage.SweepResult {
	f.t.Helper()
	res, err := f.s.Sweep(f.ctx, storage.SweepParams{Now: now, Limit: limit})
	require.NoError(f.t, err, "sweep")
	return res
}

func (f *fixture) stats(queue string, now time.Time) storage.QueueStats {
	f.t.Helper()
	st, err := f.s.Stats(f.ctx, storage.StatsParams{Queue: queue, Now: now})
	require.NoError(f.t, err, "stats")
	require.Len(f.t, st, 1)
	require.Equal(f.t, queue, st[0].Queue)
	return st[0]
}

func (f *fixture) peek(queue string, inflight bool, after storage.ItemID, limit int, now time.Time) []storage.Item {
	f.t.Helper()
	items, err := f.s.Peek(f.ctx, storage.PeekParams{Queue: queue, Inflight: inflight, After: after, Limit: limit, Now: now})
	require.NoError(f.t, err, "peek")
	return items
}

func (f *fixture) deadList(queue string, after storage.ItemID, limit int) []storage.DeadItem {
	f.t.Helper()
	items, err := f.s.DeadList(f.ctx, storage.DeadListParams{Queue: queue, After: after, Limit: limit})
	require.NoError(f.t, err, "dead list")
	return items
}

func (f *fixture) setConfig(queue string, c storage.QueueConfig) {
	f.t.Helper()
	require.NoError(f.t, f.s.SetQueueConfig(f.ctx, queue, c), "set queue config")
}

// counts is the gauge part of QueueStats, for compact assertions.
type counts struct {
	Ready, Delayed, Inflight, Dead, Leases int64
}

func gauges(st storage.QueueStats) counts {
	return counts{st.Ready, st.Delayed, st.Inflight, st.Dead, st.Leases}
}

// lifetime is the counter part of QueueStats.
type lifetime struct {
	Enqueued, Duplicates, Delivered, Acked, Nacked, Expired, DeadLettered, Redriven, Purged uint64
}

func counters(st storage.QueueStats) lifetime {
	return lifetime{st.Enqueued, st.Duplicates, st.Delivered, st.Acked, st.Nacked, st.Expired, st.DeadLettered, st.Redriven, st.Purged}
}

// requireTime compares instants by value: stores may return another
// location or drop the monotonic reading.
func requireTime(t *testing.T, want, got time.Time, msgAndArgs ...any) {
	t.Helper()
	require.True(t, want.Equal(got), "want %v, got %v: %s", want, got, message(msgAndArgs))
}

func requireIs(t *testing.T, err, target error, msgAndArgs ...any) {
	t.Helper()
	require.Error(t, err, msgAndArgs...)
	require.ErrorIs(t, err, target, msgAndArgs...)
}

// message renders testify-style msgAndArgs: a format and its arguments.
func message(msgAndArgs []any) string {
	if len(msgAndArgs) == 0 {
		return ""
	}
	if format, ok := msgAndArgs[0].(string); ok && len(msgAndArgs) > 1 {
		return fmt.Sprintf(format, msgAndArgs[1:]...)
	}
	return fmt.Sprint(msgAndArgs...)
}

func ids(items []storage.Item) []storage.ItemID {
	out := make([]storage.ItemID, len(items))
	for i, it := range items {
		out[i] = it.ID
	}
	return out
}

func durp(d time.Duration) *time.Duration { return &d }

func codes(cs ...storage.Code) []storage.Code { return cs }
