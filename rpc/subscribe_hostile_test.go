package rpc

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	capnprpc "capnproto.org/go/capnp/v3/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// floodQueue is a go-capnp node whose subscribe pushes n batches of one
// item of size bytes at once, ignoring the subscriber's prefetch: it
// sends every deliver call without waiting for any answer (no flow limit
// on the stream), then waits for all the answers and counts them.
type floodQueue struct {
	schema.Queue_Server
	n, size int

	mu                 sync.Mutex
	accepted, refused  int
	answered, released chan struct{} // every push answered; the consumer dropped
}

func (q *floodQueue) Subscribe(_ context.Context, call schema.Queue_subscribe) error {
	consumer := call.Args().Consumer().AddRef()
	go func() {
		defer close(q.released)
		defer consumer.Release()
		payload := bytes.Repeat([]byte{'z'}, q.size)
		type push struct {
			ans     *capnp.Answer
			release capnp.ReleaseFunc
		}
		pushes := make([]push, 0, q.n)
		for i := 0; i < q.n; i++ {
			ans, release := capnp.Client(consumer).SendCall(context.Background(), capnp.Send{
				Method: capnp.Method{InterfaceID: schema.Consumer_TypeID, MethodID: 0,
					InterfaceName: "queue.capnp:Consumer", MethodName: "deliver"},
				ArgsSize: consumerDeliverSize,
				PlaceArgs: func(st capnp.Struct) error {
					p := schema.Consumer_deliver_Params(st)
					if err := p.SetLease(bytes.Repeat([]byte{3}, 16)); err != nil {
						return err
					}
					p.SetExpiresAt(uint64(testStart.Add(time.Minute).UnixMilli()))
					items, err := p.NewItems(1)
					if err != nil {
						return err
					}
					if err := items.At(0).SetId(hnID(i)); err != nil {
						return err
					}
					if err := items.At(0).SetQueue("q"); err != nil {
						return err
					}
					return items.At(0).SetPayload(payload)
				},
			})
			pushes = append(pushes, push{ans, release})
		}
		for _, p := range pushes {
			_, err := p.ans.Struct()
			p.release()
			q.mu.Lock()
			if err == nil {
				q.accepted++
			} else {
				q.refused++
			}
			q.mu.Unlock()
		}
		close(q.answered)
	}()
	return nil
}

// Nack refuses the client's give-backs: this node keeps nothing.
func (q *floodQueue) Nack(context.Context, schema.Queue_nack) error {
	return errors.New("no nacks here")
}

// startFloodNode serves q over go-capnp on 127.0.0.1 and returns its
// address.
func startFloodNode(t *testing.T, q *floodQueue) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []*capnprpc.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			rc := capnprpc.NewConn(capnprpc.NewStreamTransport(conn), &capnprpc.Options{
				BootstrapClient: capnp.Client(schema.Queue_ServerToClient(q)),
			})
			mu.Lock()
			conns = append(conns, rc)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, rc := range conns {
			_ = rc.Close()
		}
	})
	return ln.Addr().String()
}

// TestHostileNode_SubscribePushFloodBounded: found by review (session
// 70): a node that ignores a subscription's prefetch and pushes deliver
// calls without waiting for their answers made the client hold every
// pushed batch in memory: consumerServer.Deliver blocked while C was
// full, and go-capnp queued the further calls behind it, each with its
// whole message, unbounded (600 pushes of 128 KiB to a Prefetch 1
// subscriber that did not read C grew its heap by the full 75 MiB). Now
// the client holds what C takes plus at most 2*Prefetch items waiting,
// refuses the pushes past that (so nothing waits unanswered in its
// memory, and the node keeps those items), and ends the subscription
// with ErrPrefetchExceeded.
func TestHostileNode_SubscribePushFloodBounded(t *testing.T) {
	const pushes, size, prefetch = 300, 16 << 10, 2
	q := &floodQueue{n: pushes, size: size, answered: make(chan struct{}), released: make(chan struct{})}
	addr := startFloodNode(t, q)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, ClientOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	// The node pushes from its subscribe handler on, so the flood may
	// pass the bound before the client has the node's answer: then
	// Subscribe itself fails with the reason.
	sub, err := c.Subscribe(ctx, SubscribeOptions{Queue: "q", Prefetch: prefetch})
	if err != nil {
		require.ErrorIs(t, err, ErrPrefetchExceeded)
		sub = nil
	} else {
		defer sub.Cancel()
	}

	// Nobody reads C. Every push must still be answered: a push that is
	// neither taken nor refused waits in the client's memory.
	select {
	case <-q.answered:
	case <-time.After(30 * time.Second):
		q.mu.Lock()
		defer q.mu.Unlock()
		t.Fatalf("%d of %d pushes past a prefetch of %d still unanswered: the client holds them all (accepted %d, refused %d)",
			pushes-q.accepted-q.refused, pushes, prefetch, q.accepted, q.refused)
	}
	q.mu.Lock()
	accepted, refused := q.accepted, q.refused
	q.mu.Unlock()
	t.Logf("accepted %d, refused %d of %d pushes", accepted, refused, pushes)
	// Taken: C's prefetch batches, and the pushes that waited for room
	// (at most 2*prefetch items), which the client gave back.
	require.LessOrEqual(t, accepted, prefetch+2*prefetch, "the client took more pushes than C and its bound hold")
	require.Equal(t, pushes, accepted+refused)

	// The batches already in C can be read; C closes once the node lets
	// go, and Err says why the subscription ended.
	select {
	case <-q.released:
	case <-time.After(30 * time.Second):
		t.Fatal("the node did not drop the consumer")
	}
	if sub == nil {
		return
	}
	got := 0
	for range sub.C() {
		got++
	}
	require.LessOrEqual(t, got, prefetch)
	require.ErrorIs(t, sub.Err(), ErrPrefetchExceeded)
}

// TestSubscribe_StalledConsumerWithinPushBound: the bound of
// TestHostileNode_SubscribePushFloodBounded never ends a subscription to
// a leaseq node. A consumer that stops reading C while its leases expire
// (the node regains credit, and pushes again once its pushes are
// answered) is still within it: once it reads again it gets every item,
// and Err stays nil.
func TestSubscribe_StalledConsumerWithinPushBound(t *testing.T) {
	const total, prefetch = 12, 2
	b := setup(t, bundleOpts{})
	c := b.dial()
	ctx := ctxT(t)
	_, err := c.Enqueue(ctx, "q", payloads(total, 8))
	require.NoError(t, err)
	sub, err := c.Subscribe(ctx, SubscribeOptions{Queue: "q", Prefetch: prefetch, Lease: time.Second})
	require.NoError(t, err)
	defer sub.Cancel()
	require.Eventually(t, func() bool { return b.srv.Metrics().ItemsPushed >= 1 }, 10*time.Second, time.Millisecond)
	// expire ends every lease and makes the items ready again.
	expire := func() {
		b.clock.Add(time.Second)
		res, err := b.store.Sweep(ctx, storage.SweepParams{Now: b.clock.Now(), Limit: 1000})
		require.NoError(t, err)
		b.srv.Dispatcher().Notify(res.ReadyQueues...)
	}
	// Nothing reads C for several lease periods: the node pushes until C
	// is full and one push waits.
	for i := 0; i < 6; i++ {
		want := b.srv.Metrics().ItemsPushed + 1
		expire()
		if !pushedWithin(b, want, time.Second) {
			break // C full and a push unanswered: the node waits
		}
	}
	t.Logf("items pushed to a consumer that read none: %d", b.srv.Metrics().ItemsPushed)
	acked := map[storage.ItemID]bool{}
	for len(acked) < total {
		select {
		case d, ok := <-sub.C():
			require.True(t, ok, "the subscription ended: %v", sub.Err())
			codes, err := c.Ack(ctx, "q", d.Lease, itemIDs(d.Items))
			require.NoError(t, err)
			for i, code := range codes {
				if code == storage.CodeOK {
					acked[d.Items[i].ID] = true
				}
			}
		case <-time.After(200 * time.Millisecond):
			expire() // the batches read late had expired: they come again
		}
	}
	require.NoError(t, sub.Err())
}

// pushedWithin reports whether the node has pushed want items in all
// within d.
func pushedWithin(b *testBundle, want uint64, d time.Duration) bool {
	deadline := time.After(d)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for b.srv.Metrics().ItemsPushed < want {
		select {
		case <-deadline:
			return false
		case <-tick.C:
		}
	}
	return true
}
