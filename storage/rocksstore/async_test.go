package rocksstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/storagetest"
)

// asyncStore is a Store whose Enqueue, EnqueueClaim, Poll and Ack go
// through the asynchronous calls (async.go) and wait for their done, so
// that the conformance suites check those paths. It fails the test when a
// done runs twice.
type asyncStore struct {
	*Store
	t testing.TB
}

// await runs call and waits for the one done it must call.
func await[T any](t testing.TB, call func(done func(T))) T {
	var calls atomic.Int32
	ch := make(chan T, 2)
	call(func(v T) {
		if calls.Add(1) > 1 {
			t.Errorf("done called %d times", calls.Load())
		}
		ch <- v
	})
	return <-ch
}

type enqueued struct {
	res []storage.EnqueueResult
	err error
}

func (a asyncStore) Enqueue(ctx context.Context, p storage.EnqueueParams) ([]storage.EnqueueResult, error) {
	r := await(a.t, func(done func(enqueued)) {
		a.EnqueueAsync(ctx, p, func(res []storage.EnqueueResult, err error) { done(enqueued{res, err}) })
	})
	return r.res, r.err
}

type claimedAll struct {
	res []storage.EnqueueResult
	prs []storage.PollResult
	err error
}

func (a asyncStore) EnqueueClaim(ctx context.Context, p storage.EnqueueParams, polls []storage.PollParams) ([]storage.EnqueueResult, []storage.PollResult, error) {
	r := await(a.t, func(done func(claimedAll)) {
		a.EnqueueClaimAsync(ctx, p, polls, func(res []storage.EnqueueResult, prs []storage.PollResult, err error) {
			done(claimedAll{res, prs, err})
		})
	})
	return r.res, r.prs, r.err
}

type polled struct {
	res storage.PollResult
	err error
}

func (a asyncStore) Poll(ctx context.Context, p storage.PollParams) (storage.PollResult, error) {
	r := await(a.t, func(done func(polled)) {
		a.PollAsync(ctx, p, func(res storage.PollResult, err error) { done(polled{res, err}) })
	})
	return r.res, r.err
}

type acked struct {
	codes []storage.Code
	err   error
}

func (a asyncStore) Ack(ctx context.Context, p storage.AckParams) ([]storage.Code, error) {
	r := await(a.t, func(done func(acked)) {
		a.AckAsync(ctx, p, func(codes []storage.Code, err error) { done(acked{codes, err}) })
	})
	return r.codes, r.err
}

// asyncHarness is harness with the stores wrapped in asyncStore.
func asyncHarness(opts func(t testing.TB) Options) storagetest.Harness {
	h := harness(opts)
	unwrap := func(s storage.Store) storage.Store { return s.(asyncStore).Store }
	return storagetest.Harness{
		New: func(t testing.TB) storage.Store { return asyncStore{h.New(t).(*Store), t} },
		Reopen: func(t testing.TB, s storage.Store) storage.Store {
			return asyncStore{h.Reopen(t, unwrap(s)).(*Store), t}
		},
		DataDir: func(s storage.Store) string { return h.DataDir(unwrap(s)) },
	}
}

func TestConformanceRocksAsync(t *testing.T) {
	t.Parallel()
	for _, sync := range []SyncMode{SyncNone, SyncAlways} {
		t.Run("sync="+sync.String(), func(t *testing.T) {
			t.Parallel()
			storagetest.Run(t, asyncHarness(conformanceOptions(sync)))
		})
	}
}

func TestConformanceRocksAsyncModel(t *testing.T) {
	t.Parallel()
	storagetest.RunModel(t, asyncHarness(conformanceOptions(SyncAlways)))
}

func TestConformanceRocksAsyncHistory(t *testing.T) {
	t.Parallel()
	storagetest.RunHistory(t, asyncHarness(conformanceOptions(SyncAlways)), storagetest.HistoryConfig{})
}

// TestRocksStore_AsyncAnsweredAfterFsync: an asynchronous enqueue returns
// at once, and its done runs only after the fsync of its batch, on the
// goroutine that fsynced; a synchronous call queued behind it shares the
// pipeline and is answered too.
func TestRocksStore_AsyncAnsweredAfterFsync(t *testing.T) {
	t.Parallel()
	b, h := setupHeldSync(t)
	done := make(chan enqueued, 1)
	b.s.EnqueueAsync(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("x")}}, Now: at(0)},
		func(res []storage.EnqueueResult, err error) { done <- enqueued{res, err} })
	<-h.entered // written, its fsync held by the syncer goroutine
	require.Equal(t, int64(1), b.stats("q", at(0)).Ready, "visible before its fsync")
	select {
	case r := <-done:
		t.Fatalf("answered before its fsync: %+v", r)
	default:
	}
	h.release <- nil
	r := <-done
	require.NoError(t, r.err)
	require.Len(t, r.res, 1)
	require.Equal(t, storage.CodeOK, r.res[0].Code)
	require.Equal(t, int64(1), h.synced.Load())

	// Poll and ack asynchronously, each answered after its own fsync.
	pc := make(chan polled, 1)
	b.s.PollAsync(b.ctx, storage.PollParams{Queue: "q", Max: 1, Lease: time.Minute, Now: at(time.Second)},
		func(res storage.PollResult, err error) { pc <- polled{res, err} })
	<-h.entered
	h.release <- nil
	p := <-pc
	require.NoError(t, p.err)
	require.Equal(t, []storage.ItemID{r.res[0].ID}, itemIDs(p.res.Items))
	ac := make(chan acked, 1)
	b.s.AckAsync(b.ctx, storage.AckParams{Queue: "q", Lease: p.res.Lease, IDs: itemIDs(p.res.Items), Now: at(2 * time.Second)},
		func(codes []storage.Code, err error) { ac <- acked{codes, err} })
	<-h.entered
	h.release <- nil
	a := <-ac
	require.NoError(t, a.err)
	require.Equal(t, []storage.Code{storage.CodeOK}, a.codes)
	require.Equal(t, int64(3), h.synced.Load())
	h.free.Store(true)
	st := b.stats("q", at(3*time.Second))
	require.Zero(t, st.Ready+st.Inflight)
}

// TestRocksStore_AsyncFsyncFailure: when the fsync of an asynchronous
// call's batch fails, its done gets the error, and the store refuses
// later asynchronous calls at once (done runs before the call returns).
func TestRocksStore_AsyncFsyncFailure(t *testing.T) {
	t.Parallel()
	b, h := setupHeldSync(t)
	done := make(chan enqueued, 1)
	b.s.EnqueueAsync(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("x")}}, Now: at(0)},
		func(res []storage.EnqueueResult, err error) { done <- enqueued{res, err} })
	<-h.entered
	h.release <- errors.New("injected: disk gone")
	r := <-done
	require.ErrorIs(t, r.err, storage.ErrUnavailable)
	require.Nil(t, r.res)

	var got error
	b.s.AckAsync(b.ctx, storage.AckParams{Queue: "q", Lease: storage.LeaseID{1}, IDs: []storage.ItemID{{1}}, Now: at(time.Second)},
		func(_ []storage.Code, err error) { got = err })
	require.ErrorIs(t, got, storage.ErrUnavailable, "answered before AckAsync returned")

	// Reopen (the failing hook gone): the cleanup's check must pass.
	b.reopenWithoutSyncHook()
}

// TestRocksStore_AsyncClosed: an asynchronous call on a closed store is
// answered at once with ErrClosed.
func TestRocksStore_AsyncClosed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(dir, testOptions(t))
	require.NoError(t, err)
	require.NoError(t, s.Close())
	var got error
	s.EnqueueAsync(context.Background(), storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{}}, Now: at(0)},
		func(_ []storage.EnqueueResult, err error) { got = err })
	require.ErrorIs(t, got, storage.ErrClosed)
	s.PollAsync(context.Background(), storage.PollParams{Queue: "q", Max: 1, Now: at(0)},
		func(_ storage.PollResult, err error) { got = err })
	require.ErrorIs(t, got, storage.ErrClosed)
}

// TestRocksStore_AsyncAndSyncMixed: synchronous and asynchronous callers
// share the pipeline (an asynchronous op can be next in line when a
// synchronous leader has built maxLeadBatches batches, and the other way
// round); every item is enqueued once, claimed once and acked once, and
// the store's invariants hold (the cleanup's check).
func TestRocksStore_AsyncAndSyncMixed(t *testing.T) {
	t.Parallel()
	for _, mode := range []SyncMode{SyncNone, SyncAlways} {
		t.Run("sync="+mode.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(o *Options) { o.Sync = mode })
			const workers, perWorker = 8, 200
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					s := storage.Store(b.s)
					if w%2 == 1 {
						s = asyncStore{b.s, t}
					}
					for i := range perWorker {
						_, err := s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte{byte(w), byte(i)}}}, Now: at(0)})
						if err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			var acked atomic.Int64
			for w := range workers {
				wg.Go(func() {
					s := storage.Store(b.s)
					if w%2 == 0 {
						s = asyncStore{b.s, t}
					}
					for {
						res, err := s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 3, Lease: time.Minute, Now: at(time.Second)})
						if err != nil {
							t.Error(err)
							return
						}
						if len(res.Items) == 0 {
							return
						}
						codes, err := s.Ack(b.ctx, storage.AckParams{Queue: "q", Lease: res.Lease, IDs: itemIDs(res.Items), Now: at(2 * time.Second)})
						if err != nil {
							t.Error(err)
							return
						}
						for _, c := range codes {
							if c == storage.CodeOK {
								acked.Add(1)
							}
						}
					}
				})
			}
			wg.Wait()
			require.Equal(t, int64(workers*perWorker), acked.Load())
			st := b.stats("q", at(3*time.Second))
			require.Zero(t, st.Ready+st.Inflight)
		})
	}
}
