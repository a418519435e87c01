package main

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// The node's clock never steps back (storage/steadyclock), found by
// review (session 70): a wall clock stepped back an hour hid every item
// enqueued in the hour before the step (ready means visible_at <= now),
// and served those enqueued after it first.
func TestServe_WallClockSteppedBackKeepsReadyItems(t *testing.T) {
	clk := newMock()
	n := startMetricsNode(t, filepath.Join(t.TempDir(), "data"), clk, "--sync", "none")
	ctx := context.Background()
	first, err := n.c.Enqueue(ctx, "q", []storage.EnqueueItem{{Payload: []byte("a")}, {Payload: []byte("b")}})
	require.NoError(t, err)
	clk.Add(10 * time.Second)
	clk.Set(clk.Now().Add(-time.Hour)) // an NTP step back
	second, err := n.c.Enqueue(ctx, "q", []storage.EnqueueItem{{Payload: []byte("c")}})
	require.NoError(t, err)
	res, err := n.c.Poll(ctx, "q", 10, 30*time.Second, 0)
	require.NoError(t, err)
	var got []storage.ItemID
	for _, it := range res.Items {
		got = append(got, it.ID)
	}
	require.Equal(t, []storage.ItemID{first[0].ID, first[1].ID, second[0].ID}, got,
		"every ready item, in the order enqueued, after the wall clock stepped back")
}

// A node restarted with a clock behind its data (a device booted without
// a battery-backed clock) serves the items its data holds ready, from the
// data's time on (rocksstore.Store.Latest).
func TestServe_RestartWithClockBehindTheData(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	clk := newMock()
	n := startMetricsNode(t, data, clk, "--sync", "none")
	ctx := context.Background()
	ids, err := n.c.Enqueue(ctx, "q", []storage.EnqueueItem{{Payload: []byte("a")}, {Payload: []byte("b")}})
	require.NoError(t, err)
	enqueuedAt := clk.Now()
	n.stop()

	boot := clock.NewMock()
	boot.Set(enqueuedAt.Add(-24 * time.Hour))
	n = startMetricsNode(t, data, boot, "--sync", "none")
	require.Contains(t, n.te.errOut.String()+n.te.out.String(), "the clock reads earlier than the data")
	res, err := n.c.Poll(ctx, "q", 10, 30*time.Second, 0)
	require.NoError(t, err)
	require.Len(t, res.Items, 2, "the data's ready items are served")
	require.Equal(t, ids[0].ID, res.Items[0].ID)
	// The lease runs from the data's time: 30 s, not 24 h and 30 s.
	require.Equal(t, enqueuedAt.Add(30*time.Second).UnixMilli(), res.ExpiresAt.UnixMilli())
}
