package rpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// callSizes records the size of every call a Producer makes.
type callSizes struct {
	mu    sync.Mutex
	sizes []int
}

func (c *callSizes) add(n int) {
	c.mu.Lock()
	c.sizes = append(c.sizes, n)
	c.mu.Unlock()
}

func (c *callSizes) get() []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.sizes...)
}

func newProducer(t *testing.T, c *Client, opts ProducerOptions) (*Producer, *callSizes) {
	t.Helper()
	p, err := c.Producer("q", opts)
	require.NoError(t, err)
	cs := &callSizes{}
	p.onCall = cs.add
	t.Cleanup(func() { _ = p.Close() })
	return p, cs
}

func TestProducer(t *testing.T) {
	t.Parallel()

	t.Run("ConcurrentCallersShareCalls", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{factory: rocksFactory()})
		c := b.dial()
		ctx := ctxT(t)
		p, cs := newProducer(t, c, ProducerOptions{MaxBatch: 16, MaxInflight: 1})
		const callers, each = 32, 20
		var mu sync.Mutex
		ids := map[storage.ItemID]string{}
		var wg sync.WaitGroup
		for g := 0; g < callers; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < each; i++ {
					body := fmt.Sprintf("%d/%d", g, i)
					res, err := p.Enqueue(ctx, storage.EnqueueItem{Payload: []byte(body)})
					if !assertNoErr(t, err) {
						return
					}
					mu.Lock()
					ids[res.ID] = body
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		require.NoError(t, p.Close())
		require.Len(t, ids, callers*each, "every caller got its own id")
		sizes := cs.get()
		total := 0
		for _, n := range sizes {
			require.LessOrEqual(t, n, 16)
			total += n
		}
		require.Equal(t, callers*each, total)
		require.Less(t, len(sizes), callers*each/2, "calls were shared: %d calls for %d items", len(sizes), total)

		// Every id holds the payload its caller sent.
		r, err := c.Poll(ctx, "q", 1000, time.Minute, 0)
		require.NoError(t, err)
		require.Len(t, r.Items, callers*each)
		for _, it := range r.Items {
			require.Equal(t, ids[it.ID], string(it.Payload))
		}
	})

	t.Run("RefusedItemFailsAlone", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ctx := ctxT(t)
		p, _ := newProducer(t, c, ProducerOptions{Linger: time.Second, Clock: b.clock})
		type out struct {
			res storage.EnqueueResult
			err error
		}
		outs := make([]chan out, 3)
		for i := range outs {
			outs[i] = make(chan out, 1)
			it := storage.EnqueueItem{Payload: []byte("ok")}
			if i == 1 {
				it.Delay = storage.DefaultLimits.MaxDelay + time.Hour
			}
			go func() {
				res, err := p.Enqueue(ctx, it)
				outs[i] <- out{res, err}
			}()
		}
		waitPending(t, p, 3)
		b.clock.Add(time.Second)
		for i, ch := range outs {
			o := <-ch
			if i == 1 {
				require.Error(t, o.err)
				require.Equal(t, storage.CodeInvalid, o.res.Code)
				require.Contains(t, o.res.Err, "delay")
				continue
			}
			require.NoError(t, o.err)
			require.Equal(t, storage.CodeOK, o.res.Code)
		}
		st, err := c.Stats(ctx, "q")
		require.NoError(t, err)
		require.Equal(t, int64(2), st[0].Ready)
	})

	t.Run("LingerWaitsForCompanyThenSends", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ctx := ctxT(t)
		p, cs := newProducer(t, c, ProducerOptions{Linger: 50 * time.Millisecond, Clock: b.clock, MaxBatch: 4})
		done := make(chan error, 6)
		for i := 0; i < 6; i++ {
			go func() {
				_, err := p.Enqueue(ctx, storage.EnqueueItem{Payload: []byte{byte(i)}})
				done <- err
			}()
		}
		// Four fill a call at once; the other two wait for their linger.
		for i := 0; i < 4; i++ {
			require.NoError(t, <-done)
		}
		require.Equal(t, []int{4}, cs.get())
		waitPending(t, p, 2)
		select {
		case err := <-done:
			t.Fatalf("an item left before its linger ran out (err %v)", err)
		case <-time.After(50 * time.Millisecond):
		}
		b.clock.Add(50 * time.Millisecond)
		require.NoError(t, <-done)
		require.NoError(t, <-done)
		require.Equal(t, []int{4, 2}, cs.get())
	})

	t.Run("MaxBytesSplitsCalls", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ctx := ctxT(t)
		p, cs := newProducer(t, c, ProducerOptions{MaxBytes: 1000, Linger: time.Second, Clock: b.clock})
		var wg sync.WaitGroup
		for i := 0; i < 5; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := p.Enqueue(ctx, storage.EnqueueItem{Payload: make([]byte, 400)})
				assertNoErr(t, err)
			}()
		}
		rpctest.Eventually(t, 5*time.Second, func() bool { return len(cs.get()) == 2 })
		// 400+400 fit in 1000 bytes, a third does not: two full calls left
		// at once, the fifth item waits for its linger.
		require.Equal(t, []int{2, 2}, cs.get())
		waitPending(t, p, 1)
		b.clock.Add(time.Second)
		wg.Wait()
		require.Equal(t, []int{2, 2, 1}, cs.get())
	})

	t.Run("CancelledBeforeSendIsNotSent", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		p, cs := newProducer(t, c, ProducerOptions{Linger: time.Hour, Clock: b.clock})
		ctx, cancel := context.WithCancel(ctxT(t))
		errc := make(chan error, 1)
		go func() {
			_, err := p.Enqueue(ctx, storage.EnqueueItem{Payload: []byte("x")})
			errc <- err
		}()
		waitPending(t, p, 1)
		cancel()
		require.ErrorIs(t, <-errc, context.Canceled)
		require.NoError(t, p.Close())
		require.Empty(t, cs.get())
		_, err := c.Stats(ctxT(t), "q")
		require.ErrorIs(t, err, storage.ErrNotFound, "the queue was never created")
	})

	t.Run("CloseFlushesAndRefusesLater", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ctx := ctxT(t)
		p, cs := newProducer(t, c, ProducerOptions{Linger: time.Hour, Clock: b.clock})
		var got atomic.Int32
		var wg sync.WaitGroup
		for i := 0; i < 3; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := p.Enqueue(ctx, storage.EnqueueItem{Payload: []byte("x")}); assertNoErr(t, err) {
					got.Add(1)
				}
			}()
		}
		waitPending(t, p, 3)
		require.NoError(t, p.Close()) // no clock advance: Close sends them
		wg.Wait()
		require.Equal(t, int32(3), got.Load())
		require.Equal(t, []int{3}, cs.get())
		_, err := p.Enqueue(ctx, storage.EnqueueItem{Payload: []byte("late")})
		require.ErrorIs(t, err, storage.ErrClosed)
		require.NoError(t, p.Close(), "Close twice")
	})

	t.Run("ConnectionLossFailsEveryCaller", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ctx := ctxT(t)
		p, _ := newProducer(t, c, ProducerOptions{Linger: time.Hour, Clock: b.clock})
		errs := make(chan error, 4)
		for i := 0; i < 4; i++ {
			go func() {
				_, err := p.Enqueue(ctx, storage.EnqueueItem{Payload: []byte("x")})
				errs <- err
			}()
		}
		waitPending(t, p, 4)
		require.NoError(t, c.Close())
		b.clock.Add(time.Hour)
		for i := 0; i < 4; i++ {
			err := <-errs
			require.Error(t, err)
			require.False(t, errors.Is(err, context.Canceled), "%v", err)
		}
	})

	t.Run("BadOptions", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		for _, o := range []ProducerOptions{{MaxBatch: -1}, {Linger: time.Second}, {MaxInflight: -2}} {
			_, err := c.Producer("q", o)
			require.ErrorIs(t, err, storage.ErrInvalidArgument, "%+v", o)
		}
		_, err := c.Producer("", ProducerOptions{})
		require.ErrorIs(t, err, storage.ErrInvalidArgument)
	})
}

// assertNoErr is require.NoError for goroutines other than the test's:
// it reports and returns false instead of stopping the goroutine.
func assertNoErr(t *testing.T, err error) bool {
	t.Helper()
	if err != nil {
		t.Errorf("unexpected error: %v", err)
		return false
	}
	return true
}

// waitPending waits until n items are queued in p, not yet sent.
func waitPending(t *testing.T, p *Producer, n int) {
	t.Helper()
	rpctest.Eventually(t, 5*time.Second, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.pending) == n
	})
}

// TestProducer_BadItemFailsOnlyItsCaller: an item Client.Enqueue would
// refuse for its whole call (a negative delay, or one over the flow limit)
// is refused to its own caller at once; it used to join a call and fail
// every caller sharing it.
func TestProducer_BadItemFailsOnlyItsCaller(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c := b.dial()
	ctx := ctxT(t)
	p, cs := newProducer(t, c, ProducerOptions{MaxBatch: 3, Linger: time.Hour, Clock: b.clock})
	good := make(chan error, 1)
	go func() {
		_, err := p.Enqueue(ctx, storage.EnqueueItem{Payload: []byte("good")})
		good <- err
	}()
	rpctest.Eventually(t, 10*time.Second, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.pending) == 1
	}, "the good item is not pending")
	_, err := p.Enqueue(ctx, storage.EnqueueItem{Payload: []byte("bad"), Delay: -time.Second})
	require.ErrorIs(t, err, storage.ErrInvalidArgument)
	_, err = p.Enqueue(ctx, storage.EnqueueItem{Payload: make([]byte, c.limit)})
	require.ErrorIs(t, err, storage.ErrInvalidArgument)
	b.clock.Add(time.Hour) // the linger ends: the good item goes alone
	select {
	case err := <-good:
		require.NoError(t, err, "the good caller got another caller's error")
	case <-time.After(10 * time.Second):
		t.Fatal("the good item was not sent")
	}
	require.Equal(t, []int{1}, cs.get())
}
