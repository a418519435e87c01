package storagetest

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// snapshot is everything observable about a store at one instant.
type snapshot struct {
	Queues   []string
	Stats    []storage.QueueStats
	Configs  []storage.QueueConfig
	Ready    map[string][]storage.Item
	Inflight map[string][]storage.Item
	Dead     map[string][]storage.DeadItem
	Next     time.Time
}

// canon makes instants comparable with require.Equal: UTC, no monotonic
// reading, nanoseconds only.
func canon(t time.Time) time.Time {
	if t.IsZero() {
		return time.Time{}
	}
	return time.Unix(0, t.UnixNano()).UTC()
}

func canonItem(it storage.Item) storage.Item {
	it.EnqueuedAt = canon(it.EnqueuedAt)
	it.VisibleAt = canon(it.VisibleAt)
	return it
}

func (f *fixture) snapshot(now time.Time) snapshot {
	f.t.Helper()
	lim := f.h.limits()
	qs, err := f.s.Queues(f.ctx)
	require.NoError(f.t, err)
	sn := snapshot{Queues: qs, Ready: map[string][]storage.Item{}, Inflight: map[string][]storage.Item{}, Dead: map[string][]storage.DeadItem{}}
	sn.Stats, err = f.s.Stats(f.ctx, storage.StatsParams{Now: now})
	require.NoError(f.t, err)
	for _, q := range qs {
		c, err := f.s.QueueConfig(f.ctx, q)
		require.NoError(f.t, err)
		sn.Configs = append(sn.Configs, c)
		for _, it := range f.peek(q, false, storage.ItemID{}, lim.MaxBatch, now) {
			sn.Ready[q] = append(sn.Ready[q], canonItem(it))
		}
		for _, it := range f.peek(q, true, storage.ItemID{}, lim.MaxBatch, now) {
			sn.Inflight[q] = append(sn.Inflight[q], canonItem(it))
		}
		for _, d := range f.deadList(q, storage.ItemID{}, lim.MaxBatch) {
			d.Item = canonItem(d.Item)
			d.DeadAt = canon(d.DeadAt)
			sn.Dead[q] = append(sn.Dead[q], d)
		}
	}
	// Sweep at an instant when nothing is due only reports Next.
	res := f.sweep(base.Add(-time.Hour), 1)
	require.Zero(f.t, res.LeasesExpired+res.Promoted+res.DedupDropped)
	sn.Next = canon(res.Next)
	return sn
}

func testReopenKeepsEverything(t *testing.T, f *fixture) {
	cfg := storage.QueueConfig{MaxAttempts: 4, LeaseDuration: 45 * time.Second, DedupWindow: time.Hour, BackoffBase: time.Second, BackoffMax: 10 * time.Second}
	f.setConfig("q", cfg)
	all := f.enqueueIDs("q", at(0),
		storage.EnqueueItem{Payload: []byte("ready"), Priority: 2, DedupKey: "k"},
		storage.EnqueueItem{Payload: []byte("later"), Delay: time.Hour, MaxAttempts: 9},
		storage.EnqueueItem{Payload: []byte("held")},
		storage.EnqueueItem{Payload: []byte("nacked")},
	)
	p := f.poll("q", 2, 0, at(time.Second)) // held, nacked
	require.Equal(t, all[2:], ids(p.Items))
	f.nack("q", p.Lease, durp(time.Minute), "retry", at(time.Second), all[3])
	dead := killAll(t, f, "dlq", 2, at(0))
	now := at(2 * time.Second)
	before := f.snapshot(now)

	f.reopen()
	after := f.snapshot(now)
	require.Equal(t, before, after, "everything observable survives a close and reopen")
	f.check()

	// The lease is still live and still the fence.
	require.Equal(t, codes(storage.CodeLeaseMismatch), f.ack("q", forgedLease, now, all[2]))
	require.Equal(t, codes(storage.CodeOK), f.ack("q", p.Lease, now, all[2]))
	// The dedup key still suppresses.
	res := f.enqueue("q", now, storage.EnqueueItem{Payload: []byte("again"), DedupKey: "k"})
	require.True(t, res[0].Duplicate)
	require.Equal(t, all[0], res[0].ID)
	// Ids keep increasing.
	fresh := f.enqueueN("q", now, 1)[0]
	for _, old := range append(all, dead...) {
		require.Positive(t, bytes.Compare(fresh[:], old[:]), "new id %s after reopen must exceed %s", fresh, old)
	}
	// Dead items can still be redriven.
	rr, err := f.s.Redrive(f.ctx, storage.RedriveParams{Queue: "dlq", IDs: dead[:1], Now: now})
	require.NoError(t, err)
	require.Equal(t, 1, rr.Moved)

	// A second reopen keeps the changes made after the first.
	before = f.snapshot(now)
	f.reopen()
	require.Equal(t, before, f.snapshot(now))
}

func testReopenedLeaseExpires(t *testing.T, f *fixture) {
	id := f.enqueueN("q", at(0), 1)[0]
	f.poll("q", 1, 10*time.Second, at(0))
	f.reopen()
	res := f.sweep(at(10*time.Second-1), 100)
	require.Zero(t, res.LeasesExpired)
	requireTime(t, at(10*time.Second), res.Next)
	res = f.sweep(at(10*time.Second), 100)
	require.Equal(t, 1, res.LeasesExpired)
	p := f.poll("q", 1, time.Minute, at(10*time.Second))
	require.Equal(t, []storage.ItemID{id}, ids(p.Items))
	require.Equal(t, uint32(2), p.Items[0].Attempts)
}
