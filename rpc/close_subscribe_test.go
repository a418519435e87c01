package rpc

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	capnprpc "capnproto.org/go/capnp/v3/rpc"
	"capnproto.org/go/capnp/v3/rpc/transport"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// fakeSubNode is a node whose Subscribe keeps the consumer (the test
// pushes to it) and whose subscriptions ignore Cancel, so it ends them
// only when the connection ends. The other methods are a real server's.
type fakeSubNode struct {
	*queueServer
	mu        sync.Mutex
	consumers []schema.Consumer
	entered   chan struct{}
	gate      chan struct{} // nil: Subscribe answers at once
}

type ignoreCancel struct{}

func (ignoreCancel) Cancel(context.Context, schema.Subscription_cancel) error { return nil }

func (n *fakeSubNode) Subscribe(ctx context.Context, call schema.Queue_subscribe) error {
	cons := call.Args().Consumer().AddRef()
	n.mu.Lock()
	n.consumers = append(n.consumers, cons)
	gate := n.gate
	n.mu.Unlock()
	select {
	case n.entered <- struct{}{}:
	default:
	}
	if gate != nil {
		<-gate
	}
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return res.SetSubscription(schema.Subscription_ServerToClient(ignoreCancel{}))
}

func (n *fakeSubNode) consumer(i int) schema.Consumer {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.consumers[i]
}

// fakeSubClient connects a go-capnp Client to node over a pipe.
func fakeSubClient(t *testing.T, node *fakeSubNode, clk clock.Clock) *Client {
	t.Helper()
	b := setup(t, bundleOpts{transport: "pipe"})
	node.queueServer = &queueServer{s: b.srv, remote: "fake"}
	cs, ss := net.Pipe()
	sc := capnprpc.NewConn(transport.NewStream(ss), &capnprpc.Options{
		BootstrapClient: capnp.Client(schema.Queue_ServerToClient(node)),
	})
	t.Cleanup(func() { _ = sc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := NewClient(ctx, cs, ClientOptions{Clock: clk, Logger: discardLogger()})
	require.NoError(t, err)
	return c
}

func fakePush(ctx context.Context, cons schema.Consumer) error {
	var id storage.ItemID
	id[15] = 1
	lease := storage.LeaseID{1}
	return cons.Deliver(ctx, func(p schema.Consumer_deliver_Params) error {
		if err := p.SetLease(lease[:]); err != nil {
			return err
		}
		p.SetExpiresAt(uint64(time.Now().Add(time.Hour).UnixMilli()))
		l, err := p.NewItems(1)
		if err != nil {
			return err
		}
		if err := l.At(0).SetId(id[:]); err != nil {
			return err
		}
		return l.At(0).SetPayload([]byte("x"))
	})
}

// startClose runs c.Close on a goroutine of its own and returns its
// result's channel once Close has taken the subscriptions to cancel.
func startClose(t *testing.T, c *Client) <-chan error {
	t.Helper()
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	require.Eventually(t, func() bool {
		c.gbMu.Lock()
		defer c.gbMu.Unlock()
		return c.subs == nil
	}, 5*time.Second, time.Millisecond, "Close took the subscriptions")
	return closed
}

// TestClient_CloseRefusesASubscribeMadeWhileItWaits: Close takes the
// subscriptions to cancel and waits for the node to end them before it
// closes; a Subscribe in that window is refused (found by review: it was
// taken and never cancelled, and its Deliver blocked on a full C kept
// Close waiting for ever).
func TestClient_CloseRefusesASubscribeMadeWhileItWaits(t *testing.T) {
	mock := clock.NewMock()
	node := &fakeSubNode{entered: make(chan struct{}, 4)}
	c := fakeSubClient(t, node, mock)
	ctx := ctxT(t)

	_, err := c.Subscribe(ctx, SubscribeOptions{Queue: "a", Prefetch: 1})
	require.NoError(t, err)

	closed := startClose(t, c)

	// The application (re)subscribes as Close waits for the node: that
	// Subscribe is refused (it was taken, never cancelled, and a Deliver
	// of it blocked on a full C kept Close waiting for ever).
	_, err = c.Subscribe(ctx, SubscribeOptions{Queue: "b", Prefetch: 1})
	require.ErrorIs(t, err, storage.ErrClosed, "a Subscribe once Close has begun")

	// endSubs gives up on subscription a (whose node ignores Cancel) once
	// its timer, on the mock clock, runs out.
	deadline := time.After(10 * time.Second)
	for {
		select {
		case err := <-closed:
			require.NoError(t, err)
			return
		case <-deadline:
			_ = c.conn.Close() // unblock, so that the test can clean up
			t.Fatal("Client.Close hangs")
		case <-time.After(10 * time.Millisecond):
			mock.Add(giveBackTimeout)
		}
	}
}

// TestClient_CloseCancelsASubscribeAwaitingItsAnswer: Close cancels a
// subscription whose Subscribe awaits the node's answer: Subscribe then
// cancels it on the node and fails (found by review: Cancel read s.cap
// as Subscribe wrote it, and the subscription returned was live and
// never cancelled).
func TestClient_CloseCancelsASubscribeAwaitingItsAnswer(t *testing.T) {
	mock := clock.NewMock()
	node := &fakeSubNode{entered: make(chan struct{}, 4), gate: make(chan struct{})}
	c := fakeSubClient(t, node, mock)
	ctx := ctxT(t)

	subDone := make(chan error, 1)
	go func() {
		_, err := c.Subscribe(ctx, SubscribeOptions{Queue: "a", Prefetch: 1})
		subDone <- err
	}()
	<-node.entered // addSub has run; the answer waits
	closed := startClose(t, c)
	time.Sleep(100 * time.Millisecond) // Cancel has run, on a null s.cap
	close(node.gate)
	err := <-subDone
	mock.Add(giveBackTimeout)
	require.NoError(t, <-closed)
	require.Error(t, err, "Subscribe returned a live subscription on a client Close had cancelled")
}
