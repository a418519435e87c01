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

// TestSubscribe_UndeliveredBatchGoesBack: a consumer whose Deliver fails
// (answers with an exception) did not take its batch, and the pusher
// claimed the next batch before it learnt so: both go back (ready again,
// their claims not counted) instead of staying leased for their hour.
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
	// Neither the batch the consumer refused nor the one never delivered
	// may sit inflight for an hour.
	assert.Zero(t, st[0].Inflight, "an item the consumer did not take stays leased")
	// Their claims are taken back: no attempt counted, no nack.
	assert.Zero(t, st[0].Nacked)
	peek, err := c.Peek(ctx, storage.PeekParams{Queue: "q", Limit: 10})
	require.NoError(t, err)
	require.Len(t, peek, 2)
	for _, it := range peek {
		assert.Zero(t, it.Attempts, "the claim of an item the consumer did not take counted as an attempt")
	}
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

// TestSubscribe_CancelGivesBackABatchCHadNoRoomFor: a batch the node
// pushed while C was full, which the client's Deliver drops when the
// subscription is cancelled, was seen by nobody: it goes back (ready, no
// attempt counted, as the node does for a batch it claimed but could not
// deliver) instead of staying leased to nobody (found by review).
func TestSubscribe_CancelGivesBackABatchCHadNoRoomFor(t *testing.T) {
	b := setup(t, bundleOpts{})
	c := b.dial()
	ctx := ctxT(t)
	_, err := c.Enqueue(ctx, "q", payloads(1, 8)) // A
	require.NoError(t, err)
	sub, err := c.Subscribe(ctx, SubscribeOptions{Queue: "q", Prefetch: 1, Lease: time.Second})
	require.NoError(t, err)
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().ItemsPushed == 1 })
	time.Sleep(100 * time.Millisecond) // A sits in C (capacity 1), unread
	// A's lease runs out: its credit returns. B, enqueued then, is claimed
	// (under a lease that has not run out) and pushed, and its Deliver
	// blocks on the full C.
	b.clock.Add(2 * time.Second)
	_, err = c.Enqueue(ctx, "q", payloads(1, 8)) // B
	require.NoError(t, err)
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().ItemsPushed == 2 })
	time.Sleep(200 * time.Millisecond) // B's Deliver reaches the client
	sub.Cancel()
	var got []Delivery
	for d := range sub.C() {
		got = append(got, d)
	}
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Subscriptions == 0 })
	t.Logf("deliveries read after cancel: %d", len(got))
	if len(got) == 2 {
		return // B made it into C: the user holds it
	}
	// B was dropped by the client: it must be ready again. Peek is what
	// waits: a store's counters may show the give-back (Stats) a moment
	// before its write can be read (rocksstore's doc).
	var peek []storage.Item
	rpctest.Eventually(t, 10*time.Second, func() bool {
		peek, err = c.Peek(ctx, storage.PeekParams{Queue: "q", Limit: 10})
		return err == nil && len(peek) == 1
	}, "a pushed batch the client dropped on Cancel stays leased to nobody")
	require.Zero(t, peek[0].Attempts)
}

// TestSubscribe_HugePrefetchIsAnError: Prefetch is 1..MaxBatch; a larger
// one is an error, not a panic (the client sizes C by it before asking the
// node).
func TestSubscribe_HugePrefetchIsAnError(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c := b.dial()
	ctx := ctxT(t)
	var err error
	require.NotPanics(t, func() {
		_, err = c.Subscribe(ctx, SubscribeOptions{Queue: "q", Prefetch: 1 << 42})
	})
	require.Error(t, err)
}

// TestSubscribe_DeliverParamsSize: the pusher sends Consumer.deliver's
// parameters at the size the generated code gives them.
func TestSubscribe_DeliverParamsSize(t *testing.T) {
	_, seg := capnp.NewSingleSegmentMessage(nil)
	p, err := schema.NewRootConsumer_deliver_Params(seg)
	require.NoError(t, err)
	require.Equal(t, capnp.Struct(p).Size(), consumerDeliverSize)
}

// takingConsumer takes every delivery (it holds the batch from the
// moment Deliver runs) and answers after answerDelay: its answer is on
// its way, as over any network.
type takingConsumer struct {
	took        chan struct{}
	answerDelay time.Duration
}

func (c *takingConsumer) Deliver(ctx context.Context, call schema.Consumer_deliver) error {
	select {
	case c.took <- struct{}{}:
	default:
	}
	time.Sleep(c.answerDelay)
	return nil
}

func (c *takingConsumer) Done(context.Context, schema.Consumer_done) error { return nil }

// TestSubscribe_StopLeavesABatchTheConsumerMayHold: a consumer that took
// a pushed batch (its deliver ran) but whose answer has not reached the
// node when the node stops may hold the batch, as when the connection is
// lost: Stop ends the pending deliver calls, and that is no refusal, so
// the batch stays leased (found by review: it was given back).
func TestSubscribe_StopLeavesABatchTheConsumerMayHold(t *testing.T) {
	b := setup(t, bundleOpts{})
	c := b.dial()
	ctx := ctxT(t)
	cons := &takingConsumer{took: make(chan struct{}, 1), answerDelay: 500 * time.Millisecond}
	_, release := subscribeHourLeases(t, ctx, c, schema.Consumer_ServerToClient(cons))
	defer release()
	_, err := c.Enqueue(ctx, "q", payloads(1, 8))
	require.NoError(t, err)
	select {
	case <-cons.took:
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery")
	}
	b.srv.Stop() // while the consumer's answer is on its way
	st, err := b.store.Stats(ctx, storage.StatsParams{Queue: "q", Now: b.clock.Now()})
	require.NoError(t, err)
	require.Len(t, st, 1)
	t.Logf("after stop: inflight=%d ready=%d delivered=%d", st[0].Inflight, st[0].Ready, st[0].Delivered)
	require.EqualValues(t, 1, st[0].Inflight, "the node took back (undelivered nack) a batch its consumer holds, because Stop cancelled the deliver call")
}

// TestSubscribe_CloseGivesBackABatchCHadNoRoomFor: Close alone gives back
// a batch whose Deliver waits on a full C: it cancels the subscription,
// waits for the node to end it and for the Deliver's give-back (found by
// review: the Deliver woke once Close had closed the client, too late to
// give back, and the batch stayed leased to nobody).
func TestSubscribe_CloseGivesBackABatchCHadNoRoomFor(t *testing.T) {
	b := setup(t, bundleOpts{})
	c := b.dial()
	watch := b.dial()
	ctx := ctxT(t)
	_, err := c.Enqueue(ctx, "q", payloads(1, 8)) // A
	require.NoError(t, err)
	_, err = c.Subscribe(ctx, SubscribeOptions{Queue: "q", Prefetch: 1, Lease: time.Second})
	require.NoError(t, err)
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().ItemsPushed == 1 })
	time.Sleep(100 * time.Millisecond)           // A sits in C (room 1), unread
	b.clock.Add(2 * time.Second)                 // A's lease ends (unswept: it stays inflight): its credit returns
	_, err = c.Enqueue(ctx, "q", payloads(1, 8)) // B is claimed and pushed; its Deliver waits on the full C
	require.NoError(t, err)
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().ItemsPushed == 2 })
	time.Sleep(200 * time.Millisecond) // the Deliver reaches the client and blocks
	require.NoError(t, c.Close())      // the consumer stops
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Subscriptions == 0 })
	var st []storage.QueueStats
	ok := false
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		st, err = watch.Stats(ctx, "q")
		require.NoError(t, err)
		if st[0].Ready == 1 { // B is ready again
			ok = true
			break
		}
	}
	t.Logf("inflight=%d ready=%d", st[0].Inflight, st[0].Ready)
	require.True(t, ok, "the batch whose Deliver waited on a full C stays leased to nobody: Close skipped its give-back")
}
