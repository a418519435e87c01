package rpc

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

func recvDelivery(t *testing.T, sub *Subscription) Delivery {
	t.Helper()
	select {
	case d, ok := <-sub.C():
		require.True(t, ok, "subscription ended: %v", sub.Err())
		return d
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery")
	}
	return Delivery{}
}

func requireEnded(t *testing.T, sub *Subscription) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case _, ok := <-sub.C():
			if !ok {
				return
			}
		case <-timeout:
			t.Fatal("subscription did not end")
		}
	}
}

func TestSubscribe(t *testing.T) {
	t.Parallel()

	t.Run("PushHonoursPrefetchCredit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c, other := b.dial(), b.dial()
		ctx := ctxT(t)
		const total, prefetch = 20, 3
		_, err := c.Enqueue(ctx, "q", payloads(total, 256))
		require.NoError(t, err)
		sub, err := c.Subscribe(ctx, SubscribeOptions{Queue: "q", Prefetch: prefetch, Lease: time.Minute})
		require.NoError(t, err)
		defer sub.Cancel()

		seen := map[storage.ItemID]bool{}
		acked := 0
		for len(seen) < total {
			d := recvDelivery(t, sub)
			require.NotEmpty(t, d.Items)
			require.False(t, d.Lease.IsZero())
			require.Equal(t, testStart.Add(time.Minute), d.ExpiresAt)
			for _, it := range d.Items {
				require.False(t, seen[it.ID], "item delivered twice")
				seen[it.ID] = true
				require.Len(t, it.Payload, 256)
			}
			// Never more than prefetch items pushed and not yet settled.
			require.LessOrEqual(t, int(b.srv.Metrics().ItemsPushed)-acked, prefetch)
			// Settle one item at a time, alternating connections and
			// ack/nack: every settle on any connection returns credit.
			for i, it := range d.Items {
				cl := c
				if i%2 == 1 {
					cl = other
				}
				codes, err := cl.Ack(ctx, "q", d.Lease, []storage.ItemID{it.ID})
				require.NoError(t, err)
				require.Equal(t, []storage.Code{storage.CodeOK}, codes)
				acked++
				require.LessOrEqual(t, int(b.srv.Metrics().ItemsPushed)-acked, prefetch)
			}
		}
		require.Equal(t, uint64(total), b.srv.Metrics().ItemsPushed)
		require.Equal(t, 1, b.srv.Metrics().Subscriptions)
	})

	t.Run("LeaseExpiryReturnsCredit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ctx := ctxT(t)
		_, err := c.Enqueue(ctx, "q", payloads(4, 8))
		require.NoError(t, err)
		sub, err := c.Subscribe(ctx, SubscribeOptions{Queue: "q", Prefetch: 2, Lease: time.Second})
		require.NoError(t, err)
		defer sub.Cancel()
		got := 0
		for got < 2 {
			got += len(recvDelivery(t, sub).Items)
		}
		require.Equal(t, 2, got)
		require.Equal(t, uint64(2), b.srv.Metrics().ItemsPushed)
		// Nothing acked; once the lease runs out its items stop counting.
		b.clock.Add(time.Second)
		for got < 4 {
			got += len(recvDelivery(t, sub).Items)
		}
		require.Equal(t, uint64(4), b.srv.Metrics().ItemsPushed)
	})

	t.Run("NackReturnsCreditAndRedelivers", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ctx := ctxT(t)
		res, err := c.Enqueue(ctx, "q", payloads(1, 8))
		require.NoError(t, err)
		sub, err := c.Subscribe(ctx, SubscribeOptions{Queue: "q", Prefetch: 1, Lease: time.Minute})
		require.NoError(t, err)
		defer sub.Cancel()
		d := recvDelivery(t, sub)
		zero := time.Duration(0)
		codes, err := c.Nack(ctx, "q", d.Lease, []storage.ItemID{res[0].ID}, &zero, "retry")
		require.NoError(t, err)
		require.Equal(t, []storage.Code{storage.CodeOK}, codes)
		d2 := recvDelivery(t, sub)
		require.Equal(t, res[0].ID, d2.Items[0].ID)
		require.Equal(t, uint32(2), d2.Items[0].Attempts)
		require.Equal(t, "retry", d2.Items[0].LastError)
		require.NotEqual(t, d.Lease, d2.Lease)
	})

	t.Run("WakesOnEnqueue", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ctx := ctxT(t)
		sub, err := c.Subscribe(ctx, SubscribeOptions{Queue: "q", Prefetch: 8})
		require.NoError(t, err)
		defer sub.Cancel()
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		res, err := c.Enqueue(ctx, "q", payloads(1, 8))
		require.NoError(t, err)
		d := recvDelivery(t, sub)
		require.Equal(t, res[0].ID, d.Items[0].ID)
		// Lease 0 is the queue default.
		require.Equal(t, testStart.Add(storage.DefaultLeaseDuration), d.ExpiresAt)
	})

	t.Run("CancelEnds", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		sub, err := c.Subscribe(ctxT(t), SubscribeOptions{Queue: "q", Prefetch: 1})
		require.NoError(t, err)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Subscriptions == 1 })
		sub.Cancel()
		sub.Cancel()
		requireEnded(t, sub)
		require.NoError(t, sub.Err())
		rpctest.Eventually(t, 30*time.Second, func() bool {
			m := b.srv.Metrics()
			return m.Subscriptions == 0 && m.Waiters == 0
		})
	})

	t.Run("DisconnectEnds", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		sub, err := c.Subscribe(ctxT(t), SubscribeOptions{Queue: "q", Prefetch: 1})
		require.NoError(t, err)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Subscriptions == 1 })
		require.NoError(t, c.Close())
		requireEnded(t, sub)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Subscriptions == 0 })
		sub.Cancel() // harmless after the end
	})

	t.Run("ServerStopTellsConsumer", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		sub, err := c.Subscribe(ctxT(t), SubscribeOptions{Queue: "q", Prefetch: 1})
		require.NoError(t, err)
		defer sub.Cancel()
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		b.srv.Stop()
		requireEnded(t, sub)
		require.ErrorIs(t, sub.Err(), ErrUnavailable)
	})

	t.Run("SlowConsumerIsNotFlooded", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ctx := ctxT(t)
		_, err := c.Enqueue(ctx, "q", payloads(50, 1024))
		require.NoError(t, err)
		sub, err := c.Subscribe(ctx, SubscribeOptions{Queue: "q", Prefetch: 5, Lease: time.Minute})
		require.NoError(t, err)
		defer sub.Cancel()
		// The consumer reads nothing: pushes stop at the credit.
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().ItemsPushed == 5 })
		st, err := c.Stats(ctx, "q")
		require.NoError(t, err)
		require.Equal(t, int64(5), st[0].Inflight)
		require.Equal(t, int64(45), st[0].Ready)
	})

	t.Run("DeliveryLargerThanWindow", func(t *testing.T) {
		t.Parallel()
		// A 4 KiB window and 10 KiB deliveries: pushes go one at a time
		// instead of panicking in the flow limiter.
		b := setup(t, bundleOpts{mutate: func(c *ServerConfig) { c.ConnFlowLimitBytes = 4 << 10 }})
		c := b.dial()
		ctx := ctxT(t)
		_, err := c.Enqueue(ctx, "q", payloads(30, 1024))
		require.NoError(t, err)
		sub, err := c.Subscribe(ctx, SubscribeOptions{Queue: "q", Prefetch: 10, Lease: time.Minute})
		require.NoError(t, err)
		defer sub.Cancel()
		got := 0
		for got < 30 {
			d := recvDelivery(t, sub)
			ids := make([]storage.ItemID, len(d.Items))
			for i, it := range d.Items {
				ids[i] = it.ID
			}
			got += len(ids)
			_, err := c.Ack(ctx, "q", d.Lease, ids)
			require.NoError(t, err)
		}
		require.Equal(t, 30, got)
	})

	t.Run("TooManyWaiters", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{mutate: func(c *ServerConfig) { c.MaxWaitersPerQueue = 1 }})
		c := b.dial()
		sub, err := c.Subscribe(ctxT(t), SubscribeOptions{Queue: "q", Prefetch: 1})
		require.NoError(t, err)
		defer sub.Cancel()
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		_, err = c.Subscribe(ctxT(t), SubscribeOptions{Queue: "q", Prefetch: 1})
		require.ErrorIs(t, err, ErrTooManyWaiters)
		_, err = c.Poll(context.Background(), "q", 1, 0, time.Second)
		require.ErrorIs(t, err, ErrTooManyWaiters)
	})
}

// TestServer_SharedWithOtherFrontEnds: what another front end of the node
// (the HTTP API) does through the accessors reaches this server: a settle
// reported with LeaseSettled returns a subscription's credit, a Notify on
// Dispatcher wakes its long polls, and the in-flight budget is the one of
// MaxInflightBytes.
func TestServer_SharedWithOtherFrontEnds(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) { c.MaxInflightBytes = 1 << 20 }})
	sem, size := b.srv.InflightBudget()
	require.NotNil(t, sem)
	require.Equal(t, int64(1<<20), size)

	c := b.dial()
	ctx := ctxT(t)
	_, err := c.Enqueue(ctx, "q", payloads(2, 8))
	require.NoError(t, err)
	sub, err := c.Subscribe(ctx, SubscribeOptions{Queue: "q", Prefetch: 1, Lease: time.Minute})
	require.NoError(t, err)
	defer sub.Cancel()
	d := recvDelivery(t, sub)
	require.Len(t, d.Items, 1)
	// Acked behind the server's back, as another front end would, then
	// reported: the second item is pushed.
	codes, err := b.store.Ack(ctx, storage.AckParams{Queue: "q", Lease: d.Lease, IDs: []storage.ItemID{d.Items[0].ID}, Now: b.clock.Now()})
	require.NoError(t, err)
	b.srv.LeaseSettled(d.Lease, codes)
	require.Len(t, recvDelivery(t, sub).Items, 1)

	// A poll parked on the server wakes on a Notify from elsewhere.
	done := make(chan []storage.Item, 1)
	go func() {
		res, err := c.Poll(ctx, "p", 1, time.Minute, 30*time.Second)
		if err != nil {
			t.Error(err)
		}
		done <- res.Items
	}()
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Dispatcher().QueueWaiters("p") == 1 })
	_, err = b.store.Enqueue(ctx, storage.EnqueueParams{Queue: "p", Items: payloads(1, 8), Now: b.clock.Now()})
	require.NoError(t, err)
	b.srv.Dispatcher().Notify("p")
	select {
	case items := <-done:
		require.Len(t, items, 1)
	case <-time.After(10 * time.Second):
		t.Fatal("the parked poll was not woken")
	}

	unbounded := setup(t, bundleOpts{mutate: func(c *ServerConfig) { c.MaxInflightBytes = -1 }})
	sem, size = unbounded.srv.InflightBudget()
	require.Nil(t, sem)
	require.Zero(t, size)
}
