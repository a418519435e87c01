package rpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// gatedClock is a mock clock whose AfterFunc callbacks wait for gate
// before they run: the state of a real timer whose goroutine has started
// but not yet taken the Producer's lock.
type gatedClock struct {
	*clock.Mock
	gate chan struct{}
}

func (g *gatedClock) AfterFunc(d time.Duration, f func()) *clock.Timer {
	return g.Mock.AfterFunc(d, func() { <-g.gate; f() })
}

// TestProducer_DueItemSentAfterHeadCancelled: A and B wait for company
// (Linger). A's linger timer fires, but before its callback takes the
// producer's lock A's ctx ends, so A leaves and B, whose linger has run
// out too, becomes the head with no timer left; the late callback finds
// its timer replaced. B must be sent all the same.
func TestProducer_DueItemSentAfterHeadCancelled(t *testing.T) {
	b := setup(t, bundleOpts{factory: memFactory()})
	c := b.dial()
	mock := clock.NewMock()
	mock.Set(testStart)
	gc := &gatedClock{Mock: mock, gate: make(chan struct{})}
	p, _ := newProducer(t, c, ProducerOptions{Linger: 10 * time.Millisecond, Clock: gc, MaxBatch: 16})

	type result struct {
		res storage.EnqueueResult
		err error
	}
	ctxA, cancelA := context.WithCancel(ctxT(t))
	defer cancelA()
	resA := make(chan result, 1)
	go func() {
		r, err := p.Enqueue(ctxA, storage.EnqueueItem{Payload: []byte("a")})
		resA <- result{r, err}
	}()
	waitPending(t, p, 1)
	resB := make(chan result, 1)
	go func() {
		r, err := p.Enqueue(ctxT(t), storage.EnqueueItem{Payload: []byte("b")})
		resB <- result{r, err}
	}()
	waitPending(t, p, 2)

	mock.Add(10 * time.Millisecond) // A's linger timer fires; its callback is held at the gate
	cancelA()
	select {
	case r := <-resA:
		require.ErrorIs(t, r.err, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("A did not return after its ctx ended")
	}
	close(gc.gate) // the late callback runs now

	select {
	case r := <-resB:
		require.NoError(t, r.err)
	case <-time.After(3 * time.Second):
		p.mu.Lock()
		st := fmt.Sprintf("pending=%d inflight=%d due=%v timer=%v", len(p.pending), p.inflight, p.due, p.timer != nil)
		p.mu.Unlock()
		t.Fatalf("B, whose linger ran out, was never sent (%s)", st)
	}
}

// TestLeanClient_DialEndsWhenCancelled: a Dial whose ctx has no deadline
// ends when the ctx is cancelled, even against a peer that accepts and
// never answers the bootstrap.
func TestLeanClient_DialEndsWhenCancelled(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	dialed := make(chan error, 1)
	go func() {
		c, err := Dial(ctx, ln.Addr().String(), ClientOptions{})
		if c != nil {
			_ = c.Close()
		}
		dialed <- err
	}()
	sc := <-accepted
	defer sc.Close()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-dialed:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(3 * time.Second):
		_ = sc.Close() // let Dial end
		<-dialed
		t.Fatal("Dial did not return within 3s of its ctx being cancelled")
	}
}

// TestLeanClient_CallPairTakesFlowInOneStep: another caller's call that
// asks for more flow bytes than are left, while a pair (AckPoll) is being
// built, must not wedge the pair: the pair takes both calls' bytes at
// once, so it never holds the first call's bytes, unsent, while waiting
// behind the other caller for the second's (the limiter serves in order).
func TestLeanClient_CallPairTakesFlowInOneStep(t *testing.T) {
	b := setup(t, bundleOpts{factory: memFactory()})
	const limit = 256 << 10
	c, err := b.dialErr(ClientOptions{FlowLimitBytes: limit})
	require.NoError(t, err)
	require.NotNil(t, c.lean)
	l := c.lean

	ids := make([]storage.ItemID, 5000) // an ack of ~120 KB
	var lease storage.LeaseID
	big := []storage.EnqueueItem{{Payload: make([]byte, 150<<10)}} // fits alone, not beside the ack
	enq := make(chan error, 1)
	enqDone := make(chan struct{})
	b2 := leanBuild(mPoll, func(p schema.Queue_poll_Params) error {
		// The first call's bytes are held now. Another caller's call
		// asks for its bytes here.
		go func() {
			_, err := c.Enqueue(ctxT(t), "q", big)
			enq <- err
			close(enqDone)
		}()
		deadline := time.Now().Add(2 * time.Second)
		for time.Now().Before(deadline) {
			select {
			case <-enqDone:
				return pollParams("q", 1, time.Minute, 0)(p) // it did not have to wait
			default:
			}
			if !l.flow.TryAcquire(1) {
				break // the enqueue waits for flow bytes
			}
			l.flow.Release(1)
			time.Sleep(time.Millisecond)
		}
		return pollParams("q", 1, time.Minute, 0)(p)
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r1, r2 := l.callPair(ctx, mAck.id, leanBuild(mAck, ackParams("q", lease, ids)), mPoll.id, b2)
	if r1.release != nil {
		r1.release()
	}
	if r2.release != nil {
		r2.release()
	}
	require.NoError(t, <-enq)
	require.NoError(t, r1.err, "ack of the pair")
	require.NoError(t, r2.err, "poll of the pair")
}

// nodeLoop plays a node on conn: it answers the bootstrap, and writes
// what onCall returns for each Call (nothing for nil); onCall's stop ends
// the loop, as does a read or write that fails.
func nodeLoop(t *testing.T, conn net.Conn, onCall func(call rpccp.Call) (out []byte, stop bool)) {
	dec := capnp.NewDecoder(conn)
	for {
		msg, err := dec.Decode()
		if err != nil {
			return
		}
		m, err := rpccp.ReadRootMessage(msg)
		if err != nil {
			msg.Release()
			return
		}
		var out []byte
		stop := false
		switch m.Which() {
		case rpccp.Message_Which_bootstrap:
			bs, _ := m.Bootstrap()
			out = bootstrapReturnBytes(t, bs.QuestionId())
		case rpccp.Message_Which_call:
			call, _ := m.Call()
			out, stop = onCall(call)
		}
		msg.Release()
		if stop {
			return
		}
		if out != nil {
			if _, err := conn.Write(out); err != nil {
				return
			}
		}
	}
}

// fakeNode plays a node on conn: it answers the bootstrap, then
// answers every Call with results whose content reply builds (twice
// with dup: a node that breaks the protocol).
func fakeNode(t *testing.T, conn net.Conn, dup bool, reply func(method uint16, seg *capnp.Segment) (capnp.Ptr, error)) {
	nodeLoop(t, conn, func(call rpccp.Call) ([]byte, bool) {
		qid, method := call.QuestionId(), call.MethodId()
		out := returnBytes(t, qid, func(p rpccp.Payload) error {
			content, err := reply(method, p.Segment())
			if err != nil {
				return err
			}
			return p.SetContent(content)
		})
		if dup {
			out = append(out, out...)
		}
		return out, false
	})
}

// TestConsume_NackAnswerWithoutCodes: a node that answers a nack with
// status OK and no codes (a malformed reply) makes Nack fail with
// ErrCorrupt, and the consumer logs it instead of indexing the codes.
func TestConsume_NackAnswerWithoutCodes(t *testing.T) {
	cc, sc := connPair(t, "tcp")
	defer cc.Close()
	defer sc.Close()
	go fakeNode(t, sc, false, func(method uint16, seg *capnp.Segment) (capnp.Ptr, error) {
		switch method {
		case mNack.id:
			r, err := schema.NewQueue_nack_Results(seg) // status none, no codes
			return r.ToPtr(), err
		default:
			return capnp.Ptr{}, errors.New("unexpected call")
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := newLeanClient(ctx, cc, DefaultMaxMessageBytes, DefaultMaxReplyBytes, clock.New())
	require.NoError(t, err)
	c := &Client{lean: l, log: discardLogger(), limit: DefaultMaxMessageBytes, readLimit: DefaultMaxReplyBytes, closed: make(chan struct{})}
	defer c.Close()

	var failed []error
	cfg := ConsumerConfig{
		Queue:   "q",
		Lease:   time.Minute,
		Clock:   clock.NewMock(),
		Logger:  discardLogger(),
		Handler: func(context.Context, storage.Item) error { return errors.New("boom") },
		OnSettleFailed: func(id storage.ItemID, ack bool, err error) {
			require.Equal(t, storage.ItemID{2}, id)
			require.False(t, ack)
			failed = append(failed, err)
		},
	}
	pr := storage.PollResult{Lease: storage.LeaseID{1}, ExpiresAt: testStart.Add(time.Minute), Items: []storage.Item{{ID: storage.ItemID{2}, Queue: "q"}}}
	var panicked any
	func() {
		defer func() { panicked = recover() }()
		newConsumer(c, cfg).handleBatch(ctx, pr, cfg.Clock.Now())
	}()
	require.Nil(t, panicked, "handleBatch panicked on a nack answer without codes")
	require.Len(t, failed, 1, "the failed nack is reported")
	require.ErrorIs(t, failed[0], storage.ErrCorrupt)
	_, err = c.Nack(ctx, "q", pr.Lease, []storage.ItemID{{2}}, nil, "boom")
	require.ErrorIs(t, err, storage.ErrCorrupt)
}

// TestLeanClient_DuplicateReturnEndsConnection: a node that sends a
// second Return for a question whose first its caller has not taken yet
// breaks the protocol: handling it fails (the connection ends) instead of
// blocking on the caller's full reply slot with the client's lock held.
func TestLeanClient_DuplicateReturnEndsConnection(t *testing.T) {
	cc, sc := connPair(t, "tcp")
	defer cc.Close()
	defer sc.Close()
	go fakeNode(t, sc, false, func(method uint16, seg *capnp.Segment) (capnp.Ptr, error) {
		return capnp.Ptr{}, errors.New("unexpected call")
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := newLeanClient(ctx, cc, DefaultMaxMessageBytes, DefaultMaxReplyBytes, clock.New())
	require.NoError(t, err)
	defer l.close()
	lc, err := l.prepare(ctx, mQueues.id, leanBuild(mQueues, func(schema.Queue_queues_Params) error { return nil }))
	require.NoError(t, err)
	lc.msg.Release()
	ret := func() *capnp.Message {
		b := returnBytes(t, lc.qid, func(rpccp.Payload) error { return nil })
		msg, err := capnp.Unmarshal(b)
		require.NoError(t, err)
		return msg
	}
	handled := make(chan error, 2)
	go func() {
		handled <- l.handle(ret())
		handled <- l.handle(ret())
	}()
	require.NoError(t, <-handled, "the first Return")
	select {
	case err := <-handled:
		require.Error(t, err, "the second Return")
	case <-time.After(5 * time.Second):
		t.Fatal("handling a second Return for an answered question blocked")
	}
}
