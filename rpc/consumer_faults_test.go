package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// TestConsumer_RetryAfterNilErr (found by review, session 69):
// RetryAfter(d, nil) (a handler that only wants its item retried later,
// without a cause) must not crash: Consume's nack takes the error's text
// outside the handler's recover, on a worker goroutine, so a panic there
// killed the process.
func TestConsumer_RetryAfterNilErr(t *testing.T) {
	t.Parallel()
	err := RetryAfter(time.Second, nil)
	var text string
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("RetryAfter(d, nil).Error() panics (Consume's nack calls it on a worker goroutine, outside any recover: the process dies): %v", r)
			}
		}()
		text = err.Error()
	}()
	require.Equal(t, "retry after 1s", text)
	require.Equal(t, time.Second, *nackDelay(ConsumerConfig{}, err))
}

// nilPtrErr is an error whose Error method panics on a nil receiver.
type nilPtrErr struct{ msg string }

func (e *nilPtrErr) Error() string { return e.msg }

// TestConsumer_HandlerErrorThatPanics: a handler that returns a typed nil
// pointer as its error gets a nack whose reason says so, not a crash.
func TestConsumer_HandlerErrorThatPanics(t *testing.T) {
	t.Parallel()
	err := callHandler(context.Background(), func(context.Context, storage.Item) error {
		var e *nilPtrErr
		return e
	}, storage.Item{})
	require.Error(t, err)
	require.Contains(t, err.Error(), "whose Error method panicked")
}

// TestConsumer_HandlerCtxEndsAWholeLeaseAfterTheConnection (from a
// review, session 69): once the connection is gone, no extend goes
// through, so the lease counts as lost a whole Lease after the last one
// that did, on the consumer's clock: the handler's ctx ends then and a
// cancelled Consume returns. (The review proposed ending it at once with
// the connection; that would also kill the command of a `leaseq work`
// whose node restarts, which the lease's own rule leaves running.)
func TestConsumer_HandlerCtxEndsAWholeLeaseAfterTheConnection(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c := b.dial()
	ctx := ctxT(t)
	_, err := c.Enqueue(ctx, "q", payloads(1, 8))
	require.NoError(t, err)
	mc := clock.NewMock()
	const lease = 3 * time.Second
	started, cancelled := make(chan struct{}), make(chan struct{})
	r := startConsume(c, ConsumerConfig{
		Queue: "q", Lease: lease, Clock: mc, Logger: rpctest.Logger(t),
		Handler: func(hctx context.Context, it storage.Item) error {
			close(started)
			select {
			case <-hctx.Done():
				close(cancelled)
			case <-time.After(30 * time.Second): // let the test end
			}
			return hctx.Err()
		},
	})
	<-started
	b.srv.Stop()
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the client did not see the connection end")
	}
	r.cancel()
	select {
	case <-cancelled:
		t.Fatal("the handler's ctx ended before its lease could have")
	default:
	}
	mc.Add(lease)
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's ctx outlived a whole Lease with no extend through")
	}
	select {
	case <-r.done:
	case <-time.After(10 * time.Second):
		t.Fatal("Consume did not return")
	}
}

// TestConsumer_MaxItemsReturnsWhileAWorkerPauses (found by review,
// session 69): with MaxItems,
// Consume returns once every item taken is settled. A worker paused after
// a refused poll (tooManyWaiters: the other worker's poll is parked)
// gave its share of the budget back; the other worker takes it and the
// whole budget is spent and settled, yet Consume waited for the paused
// worker's pause on the clock (up to 5 s; never on a mock clock that is
// not advanced).
func TestConsumer_MaxItemsReturnsWhileAWorkerPauses(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{mutate: func(cfg *ServerConfig) { cfg.MaxWaitersPerQueue = 1 }})
	c := b.dial()
	ctx := ctxT(t)
	var logs lockedBuf
	var handled atomic.Int32
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(ctx, ConsumerConfig{
			Queue: "q", Workers: 2, MaxItems: 2, Lease: time.Minute, Clock: clock.NewMock(),
			Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			Handler: func(context.Context, storage.Item) error {
				handled.Add(1)
				return nil
			},
		})
	}()
	// One worker parks, the other is refused and pauses (after giving its
	// budget back: the warning comes after).
	rpctest.Eventually(t, 30*time.Second, func() bool {
		return b.srv.Metrics().Waiters == 1 && logs.count("poll refused, polling again after a pause") == 1
	}, "one worker parked and the other paused")
	_, err := c.Enqueue(ctx, "q", payloads(2, 8))
	require.NoError(t, err)
	rpctest.Eventually(t, 30*time.Second, func() bool {
		st, err := c.Stats(ctx, "q")
		return err == nil && len(st) == 1 && st[0].Acked == 2
	}, "both items handled and acked")
	require.Equal(t, int32(2), handled.Load())
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Consume did not return after MaxItems items were taken and settled: a worker still waits out its pause on the clock")
	}
}

// TestConsumer_SettleMatchesOutcome: across workers and batches,
// every success is acked, every failure (error, panic, RetryAfter) is
// nacked, none both, and the nack reasons are the handlers'.
func TestConsumer_SettleMatchesOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c := b.dial()
	ctx := ctxT(t)
	const n = 40
	items := make([]storage.EnqueueItem, n)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: []byte(fmt.Sprintf("%d", i))}
	}
	res, err := c.Enqueue(ctx, "q", items)
	require.NoError(t, err)
	hour := time.Hour
	var mu sync.Mutex
	outcome := map[storage.ItemID]string{}
	var rec settleRecorder
	cfg := ConsumerConfig{
		Queue: "q", Workers: 3, Batch: 4, MaxItems: n, Lease: time.Minute, Clock: b.clock, NackDelay: &hour,
		Logger: rpctest.Logger(t),
		Handler: func(_ context.Context, it storage.Item) error {
			var i int
			_, _ = fmt.Sscanf(string(it.Payload), "%d", &i)
			kind := []string{"ok", "err", "panic", "retry"}[i%4]
			mu.Lock()
			_, dup := outcome[it.ID]
			outcome[it.ID] = kind
			mu.Unlock()
			require.False(t, dup, "delivered twice")
			switch kind {
			case "err":
				return errors.New("boom")
			case "panic":
				panic("kaboom")
			case "retry":
				return fmt.Errorf("wrapped: %w", RetryAfter(2*time.Hour, errors.New("later")))
			}
			return nil
		},
	}
	rec.hook(&cfg)
	require.NoError(t, c.Consume(ctx, cfg))
	require.Empty(t, rec.failures())
	require.Len(t, outcome, n)
	st, err := c.Stats(ctx, "q")
	require.NoError(t, err)
	require.Equal(t, uint64(n/4), st[0].Acked)
	require.Equal(t, uint64(3*n/4), st[0].Nacked)
	peek, err := c.Peek(ctx, storage.PeekParams{Queue: "q", Limit: n})
	require.NoError(t, err)
	require.Len(t, peek, 3*n/4)
	for _, it := range peek {
		switch outcome[it.ID] {
		case "err":
			require.Equal(t, "boom", it.LastError)
			require.Equal(t, testStart.Add(time.Hour), it.VisibleAt)
		case "panic":
			require.Equal(t, "panic: kaboom", it.LastError)
		case "retry":
			require.Equal(t, "wrapped: later", it.LastError)
			require.Equal(t, testStart.Add(2*time.Hour), it.VisibleAt)
		default:
			t.Fatalf("a success is still queued: %v", it.ID)
		}
	}
	_ = res
}

// TestConsumer_NoExtendAfterSettle: once a batch's handlers are
// done, its lease is extended no more, however far the clock goes.
func TestConsumer_NoExtendAfterSettle(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c := b.dial()
	ctx := ctxT(t)
	_, err := c.Enqueue(ctx, "q", payloads(1, 8))
	require.NoError(t, err)
	cClock := clock.NewMock()
	var exts atomic.Int32
	handled := make(chan struct{})
	r := startConsume(c, ConsumerConfig{
		Queue: "q", Lease: 3 * time.Second, Clock: cClock, Logger: rpctest.Logger(t),
		OnExtend: func(storage.LeaseID, time.Time, error) { exts.Add(1) },
		Handler:  func(context.Context, storage.Item) error { close(handled); return nil },
	})
	<-handled
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 }, "the next poll parked")
	for range 10 {
		cClock.Add(time.Second)
	}
	require.NoError(t, r.stop(t))
	require.Zero(t, exts.Load())
	st, err := c.Stats(ctx, "q")
	require.NoError(t, err)
	require.Equal(t, uint64(1), st[0].Acked)
}

// TestProducer_EachCallerItsOwn: many concurrent callers through a
// lingering producer: each gets its own id, none dropped or duplicated;
// Close flushes what lingers (the mock clock never advances) and later
// Enqueues are refused.
func TestProducer_EachCallerItsOwn(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c := b.dial()
	ctx := ctxT(t)
	mock := clock.NewMock()
	p, err := c.Producer("q", ProducerOptions{MaxBatch: 7, Linger: time.Hour, MaxInflight: 2, Clock: mock})
	require.NoError(t, err)
	const n = 60
	ids := make([]storage.ItemID, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := p.Enqueue(ctx, storage.EnqueueItem{Payload: []byte(fmt.Sprintf("p%d", i))})
			ids[i], errs[i] = res.ID, err
		}()
	}
	// 60 = 8 full calls of 7 + 4 lingering for an hour.
	rpctest.Eventually(t, 10*time.Second, func() bool {
		st, err := c.Stats(ctx, "q")
		return err == nil && len(st) == 1 && st[0].Ready == 56
	}, "the full calls went")
	require.NoError(t, p.Close())
	wg.Wait()
	seen := map[storage.ItemID]bool{}
	for i := range n {
		require.NoError(t, errs[i])
		require.False(t, seen[ids[i]], "one id for two callers")
		seen[ids[i]] = true
	}
	peek, err := c.Peek(ctx, storage.PeekParams{Queue: "q", Limit: 100})
	require.NoError(t, err)
	require.Len(t, peek, n)
	for _, it := range peek {
		require.True(t, seen[it.ID])
	}
	byID := map[storage.ItemID]string{}
	for _, it := range peek {
		byID[it.ID] = string(it.Payload)
	}
	for i := range n {
		require.Equal(t, fmt.Sprintf("p%d", i), byID[ids[i]], "caller %d got another's id", i)
	}
	_, err = p.Enqueue(ctx, storage.EnqueueItem{Payload: []byte("late")})
	require.ErrorIs(t, err, storage.ErrClosed)
}
