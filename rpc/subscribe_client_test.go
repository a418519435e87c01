package rpc

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
)

// Found by review (session 73): with the lean engine, Subscribe runs on a
// second, go-capnp connection opened on first use (capnpConn). When that
// connection alone ended (a NAT or firewall drops the idle subscription
// socket, the node cuts it for a push over the client's read limit) while
// the lean connection was fine, capnpConn kept handing out the dead
// connection's capability: every later Subscribe (and Queue()) failed as
// disconnected for the Client's whole life, while Done() stayed open and
// every other call worked, so a caller watching Done() never learned it
// had to redial. capnpConn now opens a new go-capnp connection once the
// old one's Done is closed.
func TestSubscribe_RedialsAfterCapnpConnLost(t *testing.T) {
	b := setup(t, bundleOpts{})
	p := newHoldCutProxy(t, b.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	c, err := Dial(ctx, p.addr(), ClientOptions{Logger: rpctest.Logger(t)})
	cancel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NotNil(t, c.lean)

	sub, err := c.Subscribe(ctxT(t), SubscribeOptions{Queue: "q", Prefetch: 1})
	require.NoError(t, err)
	require.Equal(t, 2, p.accepted(), "the lean connection and Subscribe's go-capnp one")
	sub.Cancel()
	for range sub.C() {
	}

	// The go-capnp connection alone is cut.
	c.gcMu.Lock()
	done := c.rc.Done()
	c.gcMu.Unlock()
	p.cut(1)
	rpctest.Recv(t, done, 10*time.Second)

	_, err = c.Enqueue(ctxT(t), "q", payloads(1, 8))
	require.NoError(t, err, "the lean connection is fine")
	select {
	case <-c.Done():
		t.Fatal("Done closed: the lean connection is fine")
	default:
	}
	sub, err = c.Subscribe(ctxT(t), SubscribeOptions{Queue: "q", Prefetch: 1})
	require.NoError(t, err, "Subscribe on a live Client whose go-capnp connection once ended")
	require.Equal(t, 3, p.accepted(), "a new go-capnp connection")
	d := recvDelivery(t, sub)
	require.Len(t, d.Items, 1)
	sub.Cancel()
}

// Found by review (session 73): a Subscribe that failed (here its ctx
// ended after the node took the call, before its answer came; also a ctx
// that ended before, or a go-capnp connection that had ended) returned
// an error and no Subscription, but addSub had registered it in c.subs
// and nothing removed it: its Consumer's Shutdown, which calls dropSub,
// runs only once the node lets go of it. Close then cancelled it and
// waited the whole giveBackTimeout (5 s, on ClientOptions.Clock) for an
// end that never came: every Close after a failed Subscribe took 5 s.
func TestSubscribe_FailedIsForgotten(t *testing.T) {
	b := setup(t, bundleOpts{})
	p := newHoldCutProxy(t, b.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	mock := clock.NewMock()
	c, err := Dial(ctx, p.addr(), ClientOptions{Logger: rpctest.Logger(t), Clock: mock})
	cancel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, _, err = c.capnpConn(ctxT(t))
	require.NoError(t, err)

	p.hold() // the node's answer waits in the proxy
	sctx, scancel := context.WithCancel(ctxT(t))
	defer scancel()
	subscribed := make(chan error, 1)
	go func() {
		_, err := c.Subscribe(sctx, SubscribeOptions{Queue: "q", Prefetch: 1})
		subscribed <- err
	}()
	rpctest.Eventually(t, 10*time.Second, func() bool { return p.heldBytes() > 0 }, "the node did not answer the subscribe")
	scancel()
	require.ErrorIs(t, rpctest.Recv(t, subscribed, 10*time.Second), context.Canceled)
	c.gbMu.Lock()
	n := len(c.subs)
	c.gbMu.Unlock()
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case <-closed:
	case <-time.After(3 * time.Second):
		mock.Add(giveBackTimeout) // let it go
		rpctest.Recv(t, closed, 10*time.Second)
		t.Fatalf("Close waited until giveBackTimeout passed for a Subscription that failed to start (%d left registered in c.subs)", n)
	}
	require.Zero(t, n, "a failed Subscribe left its Subscription registered")
}

// Found by review (session 73): as above, with a Subscribe whose context
// had already ended.
func TestSubscribe_CancelledIsForgotten(t *testing.T) {
	b := setup(t, bundleOpts{})
	c := b.dial()
	_, _, err := c.capnpConn(ctxT(t))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = c.Subscribe(ctx, SubscribeOptions{Queue: "q", Prefetch: 1})
	require.Error(t, err)
	c.gbMu.Lock()
	defer c.gbMu.Unlock()
	require.Empty(t, c.subs, "a Subscribe cancelled before it was sent left its Subscription registered: Close will wait 5 s for it")
}
