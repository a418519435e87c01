package memstore_test

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/memstore"
)

var t0 = time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)

func TestMemstore_OnDeadlineReportsEarliestNewDeadline(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []time.Time
	s := memstore.New(memstore.Options{OnDeadline: func(d time.Time) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, d)
	}})
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	take := func() []time.Time {
		mu.Lock()
		defer mu.Unlock()
		out := got
		got = nil
		return out
	}
	ctx := context.Background()
	_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Now: t0, Items: []storage.EnqueueItem{{Payload: []byte("a")}}})
	require.NoError(t, err)
	require.Empty(t, take(), "a ready item creates no deadline")

	_, err = s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Now: t0, Items: []storage.EnqueueItem{
		{Payload: []byte("b"), Delay: 5 * time.Second}, {Payload: []byte("c"), Delay: 2 * time.Second},
	}})
	require.NoError(t, err)
	require.Equal(t, []time.Time{t0.Add(2 * time.Second)}, take(), "one call with the earliest")

	p, err := s.Poll(ctx, storage.PollParams{Queue: "q", Max: 1, Lease: 10 * time.Second, Now: t0})
	require.NoError(t, err)
	require.Equal(t, []time.Time{t0.Add(10 * time.Second)}, take())

	_, err = s.ExtendLease(ctx, storage.ExtendParams{Queue: "q", Lease: p.Lease, Duration: 20 * time.Second, Now: t0})
	require.NoError(t, err)
	require.Equal(t, []time.Time{t0.Add(20 * time.Second)}, take())

	zero := time.Duration(0)
	_, err = s.Nack(ctx, storage.NackParams{Queue: "q", Lease: p.Lease, IDs: []storage.ItemID{p.Items[0].ID}, Delay: &zero, Now: t0})
	require.NoError(t, err)
	require.Empty(t, take(), "a nack without delay makes the item ready: no deadline")

	p, err = s.Poll(ctx, storage.PollParams{Queue: "q", Max: 1, Lease: time.Second, Now: t0})
	require.NoError(t, err)
	require.Len(t, take(), 1)
	delay := 3 * time.Second
	_, err = s.Nack(ctx, storage.NackParams{Queue: "q", Lease: p.Lease, IDs: []storage.ItemID{p.Items[0].ID}, Delay: &delay, Now: t0})
	require.NoError(t, err)
	require.Equal(t, []time.Time{t0.Add(3 * time.Second)}, take())

	p, err = s.Poll(ctx, storage.PollParams{Queue: "empty", Max: 1, Now: t0})
	require.NoError(t, err)
	require.Empty(t, p.Items)
	require.Empty(t, take(), "an empty poll creates no lease")
}

func TestMemstore_JitterFuncDrivesBackoff(t *testing.T) {
	t.Parallel()
	s := memstore.New(memstore.Options{JitterFunc: func() float64 { return 0.5 }})
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	ctx := context.Background()
	c := storage.DefaultQueueConfig()
	c.BackoffBase = 100 * time.Millisecond
	require.NoError(t, s.SetQueueConfig(ctx, "q", c))
	_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Now: t0, Items: []storage.EnqueueItem{{Payload: []byte("a")}}})
	require.NoError(t, err)
	p, err := s.Poll(ctx, storage.PollParams{Queue: "q", Max: 1, Now: t0})
	require.NoError(t, err)
	_, err = s.Nack(ctx, storage.NackParams{Queue: "q", Lease: p.Lease, IDs: []storage.ItemID{p.Items[0].ID}, Now: t0})
	require.NoError(t, err)
	items, err := s.Peek(ctx, storage.PeekParams{Queue: "q", Limit: 1, Now: t0})
	require.NoError(t, err)
	// attempts 1: ceiling base*2 = 200ms; half of it.
	require.Equal(t, t0.Add(100*time.Millisecond), items[0].VisibleAt)
}

func TestMemstore_LimitsOptionIsEnforced(t *testing.T) {
	t.Parallel()
	s := memstore.New(memstore.Options{Limits: storage.Limits{MaxBatch: 2, MaxPayload: 4}})
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	require.Equal(t, 2, s.Limits().MaxBatch)
	require.Equal(t, storage.DefaultLimits.MaxLease, s.Limits().MaxLease, "zero fields take the defaults")
	ctx := context.Background()
	_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Now: t0, Items: make([]storage.EnqueueItem, 3)})
	require.ErrorIs(t, err, storage.ErrInvalidArgument)
	res, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Now: t0, Items: []storage.EnqueueItem{{Payload: []byte("12345")}, {Payload: []byte("1234")}}})
	require.NoError(t, err)
	require.Equal(t, storage.CodeInvalid, res[0].Code)
	require.Equal(t, storage.CodeOK, res[1].Code)
}

func TestMemstore_IDsAreABigEndianCounter(t *testing.T) {
	t.Parallel()
	s := memstore.New(memstore.Options{})
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	res, err := s.Enqueue(context.Background(), storage.EnqueueParams{Queue: "q", Now: t0, Items: make([]storage.EnqueueItem, 2)})
	require.NoError(t, err)
	require.Equal(t, storage.ItemID{15: 1}, res[0].ID)
	require.Equal(t, storage.ItemID{15: 2}, res[1].ID)
}

// TestMemstore_LargeBacklogDrainsInServeOrder drains 100k items of mixed
// priority and delay, checking serve order at scale (the heaps) and that
// draining stays cheap: it would take minutes if a poll were O(n). (10k
// under the race detector, which only needs to see the code run.)
func TestMemstore_LargeBacklogDrainsInServeOrder(t *testing.T) {
	t.Parallel()
	n := 100_000
	if raceEnabled {
		n = 10_000
	}
	s := memstore.New(memstore.Options{})
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	ctx := context.Background()
	for i := 0; i < n; i += 1000 {
		items := make([]storage.EnqueueItem, 1000)
		for j := range items {
			k := i + j
			items[j] = storage.EnqueueItem{Payload: []byte{byte(k)}, Priority: uint8(k % 7), Delay: time.Duration(k%13) * time.Millisecond}
		}
		_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Now: t0, Items: items})
		require.NoError(t, err)
	}
	now := t0.Add(time.Second)
	var prev storage.Item
	seen := 0
	for {
		p, err := s.Poll(ctx, storage.PollParams{Queue: "q", Max: 1000, Lease: time.Minute, Now: now})
		require.NoError(t, err)
		if len(p.Items) == 0 {
			break
		}
		for _, it := range p.Items {
			if seen > 0 {
				ok := prev.Priority < it.Priority ||
					prev.Priority == it.Priority && (prev.VisibleAt.Before(it.VisibleAt) ||
						prev.VisibleAt.Equal(it.VisibleAt) && bytes.Compare(prev.ID[:], it.ID[:]) < 0)
				if !ok {
					t.Fatalf("item %d out of serve order: %+v after %+v", seen, it, prev)
				}
			}
			prev = it
			seen++
		}
		ids := make([]storage.ItemID, len(p.Items))
		for i, it := range p.Items {
			ids[i] = it.ID
		}
		_, err = s.Ack(ctx, storage.AckParams{Queue: "q", Lease: p.Lease, IDs: ids, Now: now})
		require.NoError(t, err)
	}
	require.Equal(t, n, seen)
	rep, err := s.Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Violations)
}
