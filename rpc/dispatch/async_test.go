package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

type enqueueOut struct {
	res []storage.EnqueueResult
	err error
}

// With a store whose calls complete asynchronously (a RocksDB store that
// fsyncs), EnqueueAsync claims for a parked poll in the enqueue's own
// commit, and PollAsync's attempts go through the store's asynchronous
// poll: both complete without a goroutine waiting in the store.
func TestDispatcher_AsyncStore(t *testing.T) {
	t.Parallel()
	s, err := rocksstore.Open(t.TempDir(), rocksstore.Options{Sync: rocksstore.SyncAlways})
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	clk := clock.NewMock()
	d, err := New(Config{Store: s, Clock: clk})
	require.NoError(t, err)
	defer d.Close()
	require.NotNil(t, d.async, "the store's calls wait for an fsync: the dispatcher uses its asynchronous calls")

	parked := make(chan out, 1)
	d.PollAsync(context.Background(), storage.PollParams{Queue: "q", Max: 4, Lease: time.Minute}, time.Minute,
		func(res storage.PollResult, err error) { parked <- out{res, err} })
	require.Equal(t, 1, d.Waiters(), "nothing ready: the poll parked")

	enq := func(n int) []storage.EnqueueResult {
		t.Helper()
		ch := make(chan enqueueOut, 1)
		d.EnqueueAsync(context.Background(), s, storage.EnqueueParams{Queue: "q", Items: make([]storage.EnqueueItem, n), Now: clk.Now()},
			func(res []storage.EnqueueResult, err error) { ch <- enqueueOut{res, err} })
		r := <-ch
		require.NoError(t, r.err)
		require.Len(t, r.res, n)
		return r.res
	}
	first := enq(1)
	got := recv(t, parked)
	require.NoError(t, got.err)
	require.Len(t, got.res.Items, 1)
	require.Equal(t, first[0].ID, got.res.Items[0].ID, "claimed in the enqueue's commit")
	require.Zero(t, d.Waiters())

	more := enq(2)
	polled := make(chan out, 1)
	d.PollAsync(context.Background(), storage.PollParams{Queue: "q", Max: 4, Lease: time.Minute}, 0,
		func(res storage.PollResult, err error) { polled <- out{res, err} })
	got = recv(t, polled)
	require.NoError(t, got.err)
	require.Len(t, got.res.Items, 2)
	require.Equal(t, more[0].ID, got.res.Items[0].ID)
	require.Equal(t, more[1].ID, got.res.Items[1].ID)

	// Nothing left: a poll without a wait answers empty.
	d.PollAsync(context.Background(), storage.PollParams{Queue: "q", Max: 4, Lease: time.Minute}, 0,
		func(res storage.PollResult, err error) { polled <- out{res, err} })
	got = recv(t, polled)
	require.NoError(t, got.err)
	require.Empty(t, got.res.Items)
}
