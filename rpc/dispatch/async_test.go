package dispatch

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/memstore"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

type enqueueOut struct {
	res []storage.EnqueueResult
	err error
}

// newSyncedDispatcher returns a RocksDB store that fsyncs every commit (its
// calls complete asynchronously) in a temporary directory, and a
// dispatcher over it on a mock clock; both close when the test ends.
func newSyncedDispatcher(t *testing.T) (*rocksstore.Store, *Dispatcher, *clock.Mock) {
	t.Helper()
	s, err := rocksstore.Open(t.TempDir(), rocksstore.Options{Sync: rocksstore.SyncAlways})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	clk := clock.NewMock()
	d, err := New(Config{Store: s, Clock: clk})
	require.NoError(t, err)
	t.Cleanup(d.Close)
	return s, d, clk
}

// With a store whose calls complete asynchronously (a RocksDB store that
// fsyncs), EnqueueAsync claims for a parked poll in the enqueue's own
// commit, and PollAsync's attempts go through the store's asynchronous
// poll: both complete without a goroutine waiting in the store.
func TestDispatcher_AsyncStore(t *testing.T) {
	t.Parallel()
	s, d, clk := newSyncedDispatcher(t)
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

// An enqueue that claims for parked polls in its own commit is answered
// before the polls it served: its producer's next call then tends to reach
// the node before the consumers' acks (see EnqueueAsync).
func TestDispatcher_EnqueueAnsweredBeforeItsClaims(t *testing.T) {
	t.Parallel()
	s, d, clk := newSyncedDispatcher(t)

	var seq atomic.Int32
	type answered struct {
		at    int32
		items int
		err   error
	}
	polls := make(chan answered, 2)
	for range 2 {
		d.PollAsync(context.Background(), storage.PollParams{Queue: "q", Max: 1, Lease: time.Minute}, time.Minute,
			func(res storage.PollResult, err error) { polls <- answered{seq.Add(1), len(res.Items), err} })
	}
	require.Equal(t, 2, d.Waiters())

	enq := make(chan answered, 1)
	d.EnqueueAsync(context.Background(), s, storage.EnqueueParams{Queue: "q", Items: make([]storage.EnqueueItem, 2), Now: clk.Now()},
		func(res []storage.EnqueueResult, err error) { enq <- answered{seq.Add(1), len(res), err} })
	e := <-enq
	require.NoError(t, e.err)
	require.Equal(t, 2, e.items)
	for range 2 {
		p := <-polls
		require.NoError(t, p.err)
		require.Equal(t, 1, p.items, "claimed in the enqueue's commit")
		require.Greater(t, p.at, e.at, "the enqueue was answered first")
	}
	require.Equal(t, int32(1), e.at)
	require.Zero(t, d.Waiters())
}

// lateAsync is a memory store whose first asynchronous poll finds nothing
// while an item arrives, and completes on another goroutine while
// PollAsync has not returned yet; later polls complete at once.
type lateAsync struct {
	*memstore.Store
	d     *Dispatcher
	first atomic.Bool
}

func (s *lateAsync) Nonblocking() bool { return false } // so the dispatcher uses PollAsync

func (s *lateAsync) PollAsync(ctx context.Context, p storage.PollParams, done func(storage.PollResult, error)) {
	if !s.first.CompareAndSwap(false, true) {
		r, err := s.Poll(ctx, p)
		done(r, err)
		return
	}
	go func() {
		_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: p.Queue, Items: make([]storage.EnqueueItem, 1), Now: p.Now})
		if err != nil {
			done(storage.PollResult{}, err)
			return
		}
		s.d.Notify(p.Queue)
		done(storage.PollResult{}, nil)
	}()
	// Return after the attempt completed, without waiting for it in a way
	// that would order its last writes before this return: the race
	// detector then sees an outcome passed outside the atomic swap.
	time.Sleep(20 * time.Millisecond)
}

func (s *lateAsync) EnqueueAsync(ctx context.Context, p storage.EnqueueParams, done func([]storage.EnqueueResult, error)) {
	done(s.Enqueue(ctx, p))
}

func (s *lateAsync) EnqueueClaimAsync(ctx context.Context, p storage.EnqueueParams, polls []storage.PollParams, done func([]storage.EnqueueResult, []storage.PollResult, error)) {
	res, err := s.Enqueue(ctx, p) // claims nothing for the polls (this test parks none)
	done(res, make([]storage.PollResult, len(polls)), err)
}

func (s *lateAsync) AckAsync(ctx context.Context, p storage.AckParams, done func([]storage.Code, error)) {
	done(s.Ack(ctx, p))
}

// An attempt that found nothing while an item arrived, completed on the
// store's goroutine before PollAsync returned: the poll goes on with
// another attempt and gets the item (it used to pass "go on" in a flag
// written after the swap, which this goroutine could read unwritten).
func TestDispatcher_PollAsyncCompletedElsewhere(t *testing.T) {
	t.Parallel()
	s := &lateAsync{Store: memstore.New(memstore.Options{})}
	d, err := New(Config{Store: s, Clock: clock.NewMock()})
	require.NoError(t, err)
	defer d.Close()
	s.d = d
	require.NotNil(t, d.async)

	got := make(chan out, 1)
	d.PollAsync(context.Background(), storage.PollParams{Queue: "q", Max: 4, Lease: time.Minute}, time.Minute,
		func(res storage.PollResult, err error) { got <- out{res, err} })
	r := recv(t, got)
	require.NoError(t, r.err)
	require.Len(t, r.res.Items, 1, "the item that arrived during the first attempt")
	require.Zero(t, d.Waiters())
}
