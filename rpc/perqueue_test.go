package rpc

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// reviewServerSizes is the server's and client's per-queue, per-lease and
// per-subscription bookkeeping.
type reviewServerSizes struct {
	dispWaiters, tracked, subs, clientSubs, clientQs, perAddr int
}

func reviewServerMeasure(b *testBundle, c *Client) reviewServerSizes {
	var z reviewServerSizes
	d := b.srv.Dispatcher()
	z.dispWaiters = d.Waiters()
	b.srv.tracker.mu.Lock()
	z.tracked = len(b.srv.tracker.leases)
	b.srv.tracker.mu.Unlock()
	b.srv.mu.Lock()
	z.subs, z.perAddr = b.srv.mu.subs, len(b.srv.mu.perAddr)
	b.srv.mu.Unlock()
	c.gbMu.Lock()
	z.clientSubs = len(c.subs)
	c.gbMu.Unlock()
	if c.lean != nil {
		c.lean.mu.Lock()
		z.clientQs = len(c.lean.qs)
		c.lean.mu.Unlock()
	}
	return z
}

// Short-lived per-job queues through a real server on RocksDB: enqueue,
// a poll and ack, a long poll parked then woken, a subscription pushed to,
// acked and cancelled, a force delete; repeated. The server's and client's
// per-queue state is back to its baseline once the queues are gone.
func TestPerQueue_ServerQueueChurn(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{factory: rocksFactory()})
	c := b.dial()
	ctx := ctxT(t)
	base := reviewServerMeasure(b, c)
	const n = 300
	for i := 0; i < n; i++ {
		q := fmt.Sprintf("job-%05d", i)
		_, err := c.Enqueue(ctx, q, payloads(3, 16))
		require.NoError(t, err)
		r, err := c.Poll(ctx, q, 1, time.Minute, 0)
		require.NoError(t, err)
		require.Len(t, r.Items, 1)
		_, err = c.Ack(ctx, q, r.Lease, []storage.ItemID{r.Items[0].ID})
		require.NoError(t, err)

		sub, err := c.Subscribe(ctx, SubscribeOptions{Queue: q, Prefetch: 1, Lease: time.Minute})
		require.NoError(t, err, "subscription %d", i)
		d := recvDelivery(t, sub)
		_, err = c.Ack(ctx, q, d.Lease, itemIDs(d.Items))
		require.NoError(t, err)
		d = recvDelivery(t, sub)
		_, err = c.Ack(ctx, q, d.Lease, itemIDs(d.Items))
		require.NoError(t, err)
		sub.Cancel()
		requireEnded(t, sub)

		// A long poll parks on the empty queue and an enqueue wakes it.
		polled := make(chan storage.PollResult, 1)
		go func() {
			r, err := c.Poll(ctx, q, 1, time.Minute, 30*time.Second)
			if err != nil {
				t.Error(err)
			}
			polled <- r
		}()
		rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Dispatcher().QueueWaiters(q) == 1 })
		_, err = c.Enqueue(ctx, q, payloads(1, 16))
		require.NoError(t, err)
		r = <-polled
		require.Len(t, r.Items, 1)
		// Left leased: the force delete takes it.
		_, err = c.DeleteQueue(ctx, q, true)
		require.NoError(t, err)
	}
	rpctest.Eventually(t, 10*time.Second, func() bool { return reviewServerMeasure(b, c) == base })
	after := reviewServerMeasure(b, c)
	t.Logf("after %d queues: %+v (baseline %+v)", n, after, base)
	require.Equal(t, base, after)
}

// A subscription's pushed leases that are never settled on the node (the
// consumer crashed: it neither acks nor nacks, the subscription stays) are
// tracked until they expire; with the clock past their expiry the tracker
// holds nothing of them.
func TestPerQueue_TrackerLeasesExpire(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{factory: rocksFactory()})
	c := b.dial()
	ctx := ctxT(t)
	base := reviewServerMeasure(b, c)
	const n = 200
	for i := 0; i < n; i++ {
		q := fmt.Sprintf("job-%05d", i)
		_, err := c.Enqueue(ctx, q, payloads(1, 16))
		require.NoError(t, err)
		sub, err := c.Subscribe(ctx, SubscribeOptions{Queue: q, Prefetch: 1, Lease: time.Minute})
		require.NoError(t, err)
		recvDelivery(t, sub) // never settled
		sub.Cancel()
		requireEnded(t, sub)
		_, err = c.DeleteQueue(ctx, q, true)
		require.NoError(t, err)
	}
	b.clock.Add(2 * time.Minute)
	rpctest.Eventually(t, 10*time.Second, func() bool { return reviewServerMeasure(b, c) == base })
	require.Equal(t, base, reviewServerMeasure(b, c))
}

// Connections opened and closed: the server's per-address count and the
// dispatcher hold nothing of them afterwards.
func TestPerQueue_ConnChurn(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{factory: rocksFactory()})
	c0 := b.dial()
	ctx := ctxT(t)
	base := reviewServerMeasure(b, c0)
	for i := 0; i < 200; i++ {
		c, err := b.dialErr(ClientOptions{})
		require.NoError(t, err)
		q := fmt.Sprintf("conn-%d", i)
		_, err = c.Enqueue(ctx, q, payloads(1, 8))
		require.NoError(t, err)
		go func() { _, _ = c.Poll(ctx, q+"-empty", 1, time.Minute, 30*time.Second) }()
		rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Dispatcher().QueueWaiters(q+"-empty") == 1 })
		require.NoError(t, c.Close())
	}
	rpctest.Eventually(t, 10*time.Second, func() bool {
		z := reviewServerMeasure(b, c0)
		b.srv.mu.Lock()
		conns := b.srv.mu.conns
		b.srv.mu.Unlock()
		return z == base && conns == 1
	})
}
