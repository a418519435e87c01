package fdbsync_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync"
	"github.com/leaseq/leaseq/fdbsync/fdbmodel"
	"github.com/leaseq/leaseq/storage"
)

// Two priorities whose entries are both ahead of the node's clock: the
// watch wakes at the earlier of the two, which is in the later priority
// (readyNow takes the minimum over priorities, not the first one's). A
// watch still waiting when its store closes ends with it, and its timer
// firing afterwards is harmless.
func TestReviewWatch74_EarliestOverPrioritiesAndClose(t *testing.T) {
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
	defer func() { require.NoError(t, a.Close()) }()
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	_, err = a.Enqueue(ctx, storage.EnqueueParams{Queue: "s", Now: t0.Add(20 * time.Second), Items: []storage.EnqueueItem{{Payload: []byte("p0")}}})
	require.NoError(t, err)
	_, err = a.Enqueue(ctx, storage.EnqueueParams{Queue: "s", Now: t0.Add(5 * time.Second), Items: []storage.EnqueueItem{{Payload: []byte("p9"), Priority: 9}}})
	require.NoError(t, err)
	ch, err := b.WatchReady(ctx, "s")
	require.NoError(t, err)
	require.False(t, closed(ch))
	mock.Add(4 * time.Second)
	require.False(t, closed(ch), "woke before any entry is visible")
	mock.Add(time.Second)
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch did not wake at the earliest entry (priority 9, 5 s)")
	}

	// Only the 20 s entry is left unserved by B's clock once p9 is taken.
	p, err := b.Poll(ctx, storage.PollParams{Queue: "s", Max: 10, Now: mock.Now()})
	require.NoError(t, err)
	require.Len(t, p.Items, 1)
	require.Equal(t, "p9", string(p.Items[0].Payload))
	ch2, err := b.WatchReady(ctx, "s")
	require.NoError(t, err)
	require.False(t, closed(ch2))
	require.NoError(t, b.Close())
	select {
	case <-ch2:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the watch")
	}
	mock.Add(time.Minute) // the stopped timer's instant passes: nothing to do
	_, err = b.WatchReady(ctx, "s")
	require.ErrorIs(t, err, storage.ErrClosed)
}
