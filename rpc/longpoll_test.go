package rpc

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// countingStore counts Poll calls reaching the store.
type countingStore struct {
	storage.Store
	polls atomic.Int64
}

func (s *countingStore) Poll(ctx context.Context, p storage.PollParams) (storage.PollResult, error) {
	s.polls.Add(1)
	return s.Store.Poll(ctx, p)
}

type pollOut struct {
	pr  storage.PollResult
	err error
}

func goPoll(c *Client, queue string, max int, wait time.Duration) <-chan pollOut {
	return rpctest.Go(func() pollOut {
		pr, err := c.Poll(context.Background(), queue, max, time.Minute, wait)
		return pollOut{pr, err}
	})
}

func recvPoll(t *testing.T, ch <-chan pollOut) pollOut {
	t.Helper()
	return rpctest.Recv(t, ch, 10*time.Second)
}

func TestLongPoll(t *testing.T) {
	t.Parallel()

	t.Run("WakeByEnqueue", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		consumer, producer := b.dial(), b.dial()
		ch := goPoll(consumer, "q", 10, 30*time.Second)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		res, err := producer.Enqueue(ctxT(t), "q", payloads(1, 8))
		require.NoError(t, err)
		o := recvPoll(t, ch)
		require.NoError(t, o.err)
		require.Len(t, o.pr.Items, 1)
		require.Equal(t, res[0].ID, o.pr.Items[0].ID)
		require.Equal(t, 0, b.srv.Metrics().Waiters)
	})

	t.Run("WakeBySweeperHook", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ch := goPoll(c, "q", 10, 30*time.Second)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		// Straight into the store: no notification, as when a delayed item
		// becomes ready. Only Wake (the sweeper's OnReady) tells the waiter.
		_, err := b.store.Enqueue(ctxT(t), storage.EnqueueParams{Queue: "q", Items: payloads(1, 8), Now: b.clock.Now()})
		require.NoError(t, err)
		select {
		case o := <-ch:
			t.Fatalf("poll returned without a wake: %+v", o)
		default:
		}
		b.srv.Wake([]string{"other", "q"})
		o := recvPoll(t, ch)
		require.NoError(t, o.err)
		require.Len(t, o.pr.Items, 1)
	})

	t.Run("WakeByNack", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		waiter, worker := b.dial(), b.dial()
		ctx := ctxT(t)
		res, err := worker.Enqueue(ctx, "q", payloads(1, 8))
		require.NoError(t, err)
		held, err := worker.Poll(ctx, "q", 1, time.Minute, 0)
		require.NoError(t, err)
		require.Len(t, held.Items, 1)
		ch := goPoll(waiter, "q", 10, 30*time.Second)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		zero := time.Duration(0)
		codes, err := worker.Nack(ctx, "q", held.Lease, []storage.ItemID{res[0].ID}, &zero, "retry")
		require.NoError(t, err)
		require.Equal(t, []storage.Code{storage.CodeOK}, codes)
		o := recvPoll(t, ch)
		require.NoError(t, o.err)
		require.Len(t, o.pr.Items, 1)
		require.Equal(t, res[0].ID, o.pr.Items[0].ID)
		require.Equal(t, uint32(2), o.pr.Items[0].Attempts)
	})

	t.Run("WakeByRedrive", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		waiter, worker := b.dial(), b.dial()
		ctx := ctxT(t)
		res, err := worker.Enqueue(ctx, "q", []storage.EnqueueItem{{Payload: []byte("x"), MaxAttempts: 1}})
		require.NoError(t, err)
		held, err := worker.Poll(ctx, "q", 1, time.Minute, 0)
		require.NoError(t, err)
		zero := time.Duration(0)
		_, err = worker.Nack(ctx, "q", held.Lease, []storage.ItemID{res[0].ID}, &zero, "fatal")
		require.NoError(t, err)
		st, err := worker.Stats(ctx, "q")
		require.NoError(t, err)
		require.Equal(t, int64(1), st[0].Dead)

		ch := goPoll(waiter, "q", 10, 30*time.Second)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		rr, err := worker.Redrive(ctx, storage.RedriveParams{Queue: "q", IDs: []storage.ItemID{res[0].ID}})
		require.NoError(t, err)
		require.Equal(t, []storage.Code{storage.CodeOK}, rr.Codes)
		o := recvPoll(t, ch)
		require.NoError(t, o.err)
		require.Len(t, o.pr.Items, 1)
		require.Equal(t, res[0].ID, o.pr.Items[0].ID)
		require.Equal(t, uint32(1), o.pr.Items[0].Attempts, "redrive resets attempts")
	})

	t.Run("ZeroWaitReturnsAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		pr, err := c.Poll(ctxT(t), "q", 10, 0, 0)
		require.NoError(t, err)
		require.Empty(t, pr.Items)
		require.True(t, pr.Lease.IsZero())
		require.Equal(t, 0, b.srv.Metrics().Waiters)
	})

	t.Run("WaitTimeoutReturnsEmpty", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ch := goPoll(c, "q", 10, 5*time.Second)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		b.clock.Add(5 * time.Second)
		o := recvPoll(t, ch)
		require.NoError(t, o.err)
		require.Empty(t, o.pr.Items)
		require.Equal(t, 0, b.srv.Metrics().Waiters)
	})

	t.Run("DisconnectCancelsWaiter", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ch := goPoll(c, "q", 10, 60*time.Second)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		require.NoError(t, c.Close())
		o := recvPoll(t, ch)
		require.Error(t, o.err)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 0 })
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 0 })
		// The server serves others as before.
		c2 := b.dial()
		_, err := c2.Enqueue(ctxT(t), "q", payloads(1, 8))
		require.NoError(t, err)
	})

	t.Run("ClientCancelCancelsWaiter", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := c.Poll(ctx, "q", 1, 0, 60*time.Second)
			done <- err
		}()
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		cancel()
		require.Error(t, <-done)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 0 })
	})

	t.Run("MaxWaitersPerQueue", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{mutate: func(c *ServerConfig) { c.MaxWaitersPerQueue = 2 }})
		c := b.dial()
		ch1 := goPoll(c, "q", 1, 60*time.Second)
		ch2 := goPoll(c, "q", 1, 60*time.Second)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 2 })
		_, err := c.Poll(ctxT(t), "q", 1, 0, time.Second)
		require.ErrorIs(t, err, ErrTooManyWaiters)
		// Another queue is not affected, nor a poll that does not wait.
		_, err = c.Poll(ctxT(t), "q", 1, 0, 0)
		require.NoError(t, err)
		ch3 := goPoll(c, "other", 1, 60*time.Second)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 3 })
		_, err = c.Enqueue(ctxT(t), "q", payloads(2, 8))
		require.NoError(t, err)
		_, err = c.Enqueue(ctxT(t), "other", payloads(1, 8))
		require.NoError(t, err)
		for _, ch := range []<-chan pollOut{ch1, ch2, ch3} {
			o := recvPoll(t, ch)
			require.NoError(t, o.err)
			require.Len(t, o.pr.Items, 1)
		}
	})

	t.Run("OneWakePerNotifyNoThunderingHerd", func(t *testing.T) {
		t.Parallel()
		cs := &countingStore{}
		b := setup(t, bundleOpts{factory: storeFactory{"mem", func(t *testing.T) storage.Store {
			cs.Store = memFactory().open(t)
			return cs
		}}})
		c := b.dial()
		const n = 8
		chans := make([]<-chan pollOut, n)
		for i := range chans {
			chans[i] = goPoll(c, "q", 1, 60*time.Second)
		}
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == n })
		before := cs.polls.Load()
		_, err := c.Enqueue(ctxT(t), "q", payloads(1, 8))
		require.NoError(t, err)
		// Exactly one poller gets the item; the others stay parked.
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == n-1 && cs.polls.Load()-before >= 1 })
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == n-1 })
		// The winner polled once and passed the wake on to at most one
		// more, which found nothing: never n store polls for one item.
		require.LessOrEqual(t, cs.polls.Load()-before, int64(2))

		// Each of n-1 items in separate calls reaches a distinct waiter.
		for range n - 1 {
			_, err := c.Enqueue(ctxT(t), "q", payloads(1, 8))
			require.NoError(t, err)
		}
		got := 0
		for _, ch := range chans {
			o := recvPoll(t, ch)
			require.NoError(t, o.err)
			got += len(o.pr.Items)
		}
		require.Equal(t, n, got)
	})

	t.Run("BurstWakesChain", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		const n = 4
		chans := make([]<-chan pollOut, n)
		for i := range chans {
			chans[i] = goPoll(c, "q", 1, 60*time.Second)
		}
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == n })
		// One enqueue call of n items notifies once; the woken waiters
		// pass the wake along while they find items.
		_, err := c.Enqueue(ctxT(t), "q", payloads(n, 8))
		require.NoError(t, err)
		var mu sync.Mutex
		seen := map[storage.ItemID]bool{}
		for _, ch := range chans {
			o := recvPoll(t, ch)
			require.NoError(t, o.err)
			require.Len(t, o.pr.Items, 1)
			mu.Lock()
			seen[o.pr.Items[0].ID] = true
			mu.Unlock()
		}
		require.Len(t, seen, n)
	})

	t.Run("StopReleasesWaiters", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ch := goPoll(c, "q", 1, 60*time.Second)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		b.srv.Stop()
		o := recvPoll(t, ch)
		// Either the empty answer arrived before the connection closed,
		// or the close won: both end the wait at once.
		if o.err == nil {
			require.Empty(t, o.pr.Items)
		}
		b.srv.Stop() // idempotent
	})
}

func TestServer_MaxConns(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) { c.MaxConns = 1 }})
	c1 := b.dial()
	_, err := b.dialErr(ClientOptions{})
	require.ErrorIs(t, err, ErrTooManyConns)
	require.Contains(t, err.Error(), "too many connections")
	rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().ConnsRefused == 1 })
	// The admitted client is unaffected.
	_, err = c1.Enqueue(ctxT(t), "q", payloads(1, 8))
	require.NoError(t, err)
	require.NoError(t, c1.Close())
	rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 0 })
	c3 := b.dial()
	_, err = c3.Queues(ctxT(t))
	require.NoError(t, err)
}

func TestServer_StopBeforeStart(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{transport: "pipe"})
	b.srv.Stop()
	ln, err := Listen("127.0.0.1:0")
	require.NoError(t, err)
	require.ErrorIs(t, b.srv.Start(context.Background(), ln), ErrUnavailable)
}
