package rpc

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// failingConsumer rejects every delivery.
type failingConsumer struct {
	delivers atomic.Int32
	dones    atomic.Int32
}

func (f *failingConsumer) Deliver(ctx context.Context, call schema.Consumer_deliver) error {
	f.delivers.Add(1)
	return errors.New("consumer rejects")
}

func (f *failingConsumer) Done(ctx context.Context, call schema.Consumer_done) error {
	f.dones.Add(1)
	return nil
}

// TestSubscribe_UndeliveredBatchGoesBack: Consumer.deliver is a stream
// call, so a consumer's failure shows only at the next Deliver, after the
// pusher claimed the next batch. That batch, never delivered, goes back
// (ready again) instead of staying leased for its hour.
func TestSubscribe_UndeliveredBatchGoesBack(t *testing.T) {
	b := setup(t, bundleOpts{})
	c := b.dial()
	ctx := ctxT(t)
	fc := &failingConsumer{}
	_, release := subscribeHourLeases(t, ctx, c, schema.Consumer_ServerToClient(fc))
	defer release()

	_, err := c.Enqueue(ctx, "q", payloads(1, 8))
	require.NoError(t, err)
	rpctest.Eventually(t, 10*time.Second, func() bool { return fc.delivers.Load() == 1 })
	time.Sleep(300 * time.Millisecond) // the failed Return reaches the node

	// The consumer has failed (the subscription learns it at its next
	// delivery).
	subsAfterFailure := b.srv.Metrics().Subscriptions

	_, err = c.Enqueue(ctx, "q", payloads(1, 8))
	require.NoError(t, err)
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Subscriptions == 0 })
	time.Sleep(100 * time.Millisecond)

	st, err := c.Stats(ctx, "q")
	require.NoError(t, err)
	require.Len(t, st, 1)
	t.Logf("subs after failure=%d delivers=%d inflight=%d ready=%d", subsAfterFailure, fc.delivers.Load(), st[0].Inflight, st[0].Ready)
	require.Equal(t, int32(1), fc.delivers.Load())
	// Only the item handed to the consumer may stay leased; the second was
	// never delivered and must not sit inflight for an hour.
	assert.EqualValues(t, 1, st[0].Inflight, "an item claimed by the ended subscription but never delivered stays leased")
	// Its claim is taken back: no attempt counted, no nack.
	assert.Zero(t, st[0].Nacked)
	peek, err := c.Peek(ctx, storage.PeekParams{Queue: "q", Limit: 10})
	require.NoError(t, err)
	require.Len(t, peek, 1)
	assert.Zero(t, peek[0].Attempts, "the undelivered item's claim counted as an attempt")
}

// gatedStore holds a Poll that claimed items until the test lets it go.
type gatedStore struct {
	storage.Store
	claimed chan struct{}
	release chan struct{}
	armed   atomic.Bool
}

func (g *gatedStore) Poll(ctx context.Context, p storage.PollParams) (storage.PollResult, error) {
	res, err := g.Store.Poll(ctx, p)
	if err == nil && len(res.Items) > 0 && g.armed.CompareAndSwap(true, false) {
		close(g.claimed)
		<-g.release
	}
	return res, err
}

type countingConsumer struct{ delivers atomic.Int32 }

func (c *countingConsumer) Deliver(ctx context.Context, call schema.Consumer_deliver) error {
	c.delivers.Add(1)
	return nil
}
func (c *countingConsumer) Done(ctx context.Context, call schema.Consumer_done) error { return nil }

// TestSubscribe_NoDeliveryAfterCancel: the pusher's poll has claimed a
// batch when the client's cancel returns; the batch is not delivered (the
// schema: cancel stops the pushes) but goes back, ready again.
func TestSubscribe_NoDeliveryAfterCancel(t *testing.T) {
	g := &gatedStore{claimed: make(chan struct{}), release: make(chan struct{})}
	g.armed.Store(true)
	b := setup(t, bundleOpts{factory: storeFactory{"gated", func(t *testing.T) storage.Store {
		g.Store = memFactory().open(t)
		return g
	}}})
	c := b.dial()
	ctx := ctxT(t)
	cc := &countingConsumer{}
	f, release := subscribeHourLeases(t, ctx, c, schema.Consumer_ServerToClient(cc))
	defer release()
	_, err := c.Enqueue(ctx, "q", payloads(1, 8))
	require.NoError(t, err)
	<-g.claimed
	cf, crel := f.Subscription().Cancel(ctx, nil)
	_, err = cf.Struct()
	crel()
	require.NoError(t, err)
	close(g.release) // cancel has returned to the client
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Subscriptions == 0 })
	time.Sleep(300 * time.Millisecond)
	st, err := c.Stats(ctx, "q")
	require.NoError(t, err)
	t.Logf("delivers after cancel=%d inflight=%d ready=%d", cc.delivers.Load(), st[0].Inflight, st[0].Ready)
	assert.Zero(t, cc.delivers.Load(), "Consumer.deliver after cancel returned")
	assert.EqualValues(t, 0, st[0].Inflight, "the undelivered batch stays leased after cancel")
}

// subscribeHourLeases subscribes consumer to queue "q" (prefetch 10,
// leases of an hour) over c's go-capnp connection and waits for the
// answer.
func subscribeHourLeases(t *testing.T, ctx context.Context, c *Client, consumer schema.Consumer) (schema.Queue_subscribe_Results_Future, capnp.ReleaseFunc) {
	t.Helper()
	q, _, err := c.capnpConn(ctx)
	require.NoError(t, err)
	f, release := q.Subscribe(ctx, func(p schema.Queue_subscribe_Params) error {
		p.SetPrefetch(10)
		p.SetLeaseMs(uint64(time.Hour / time.Millisecond))
		if err := p.SetConsumer(consumer); err != nil {
			return err
		}
		return p.SetQueue("q")
	})
	_, err = f.Struct()
	require.NoError(t, err)
	return f, release
}
