package rpc

import (
	"context"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/schema"
)

// TestLean_ReplyNotHeldByPartialFrame: the answer to a call that came in
// the same read as the first half of the next call is written before the
// reader waits for the second half.
func TestLean_ReplyNotHeldByPartialFrame(t *testing.T) {
	t.Parallel()
	next := pipelinedCall(t, 2, 0, 15 /* nodeInfo */, nil)
	half := len(next) / 2
	// One write: a whole call, then the first half of the next one.
	_, conn, r := leanCallThenPart(t, memFactory(), next[:half])

	require.NoError(t, conn.SetReadDeadline(time.Now().Add(3*time.Second)))
	msg, err := r.dec.Decode()
	require.NoError(t, err, "the answer to question 1 is held until the rest of question 2 arrives")
	m, err := rpccp.ReadRootMessage(msg)
	require.NoError(t, err)
	require.Equal(t, rpccp.Message_Which_return, m.Which())

	_, err = conn.Write(next[half:])
	require.NoError(t, err)
	r.recvReturn(2)
}

// TestLean_StopNotHeldByConsumerThatNeverAnswers: Server.Stop ends a
// subscription with Consumer.done under a one-second timeout; a consumer
// that reads but never answers must not hold Stop past that timeout.
func TestLean_StopNotHeldByConsumerThatNeverAnswers(t *testing.T) {
	t.Parallel()
	// Lean only: go-capnp's engine polls the mock clock's context's Err
	// while the mock cancels it, a data race inside benbjohnson/clock.
	b := setup(t, bundleOpts{factory: memFactory(), mutate: func(c *ServerConfig) { c.Engine = EngineLean }})
	conn := rawConn(t, b)
	r := &rawRPC{t: t, conn: conn, dec: capnp.NewDecoder(conn)}
	_, err := conn.Write(slices.Concat(bootstrapMsg(t), consumerSubscribe(t, "q", senderHosted(7))))
	require.NoError(t, err)
	ret := r.recvReturn(1)
	require.Equal(t, rpccp.Return_Which_results, ret.Which())

	stopped := make(chan struct{})
	go func() {
		b.srv.Stop()
		close(stopped)
	}()
	// The client reads (so no write stalls) but answers no call.
	var sawDone atomic.Bool
	go func() {
		for {
			msg, err := r.dec.Decode()
			if err != nil {
				return
			}
			if m, err := rpccp.ReadRootMessage(msg); err == nil && m.Which() == rpccp.Message_Which_call {
				if c, err := m.Call(); err == nil && c.MethodId() == 1 /* Consumer.done */ {
					sawDone.Store(true)
				}
			}
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-stopped:
			return
		case <-time.After(50 * time.Millisecond):
			b.clock.Add(time.Second) // well past done's one-second timeout
		}
	}
	t.Fatalf("Server.Stop still waits for a consumer that never answers done, past done's timeout (done sent: %v)", sawDone.Load())
}

// TestLean_ParamCapReleasesDoNotStallSyncer: a durable call the store
// completes on its syncer, which serves every connection, releases the
// capabilities its params carried (a Release message each) on that
// syncer. Clients that send such calls and never read fill their sockets;
// another client's durable calls must still be answered.
func TestLean_ParamCapReleasesDoNotStallSyncer(t *testing.T) {
	t.Parallel()
	b, _ := setupLeanRocksAlways(t)
	other := b.dial()
	ctx := ctxT(t)
	_, err := other.Enqueue(ctx, "warm", payloads(1, 8))
	require.NoError(t, err)

	const caps = 2048
	call := func(qid uint32) []byte {
		return pipelinedCall(t, qid, 0, 0 /* enqueue */, func(p rpccp.Payload) error {
			args, err := schema.NewQueue_enqueue_Params(p.Segment())
			if err != nil {
				return err
			}
			if err := args.SetQueue("x"); err != nil {
				return err
			}
			items, err := args.NewItems(1)
			if err != nil {
				return err
			}
			if err := items.At(0).SetPayload([]byte("p")); err != nil {
				return err
			}
			// Capabilities the call does not use: the node releases each.
			ct, err := p.NewCapTable(caps)
			if err != nil {
				return err
			}
			for i := 0; i < caps; i++ {
				ct.At(i).SetSenderHosted(uint32(i))
			}
			return p.SetContent(args.ToPtr())
		})
	}
	var wg sync.WaitGroup
	for range 4 { // each a chance that a syncer is the writer when its socket fills
		conn, err := net.Dial("tcp", b.addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		_ = conn.(*net.TCPConn).SetReadBuffer(4 << 10)
		_, err = conn.Write(bootstrapMsg(t))
		require.NoError(t, err)
		// Never read: the answers and Releases fill the socket.
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := uint32(1); i <= 60; i++ {
				_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
				if _, err := conn.Write(call(i)); err != nil {
					return
				}
				time.Sleep(30 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	// Another client's durable calls are answered meanwhile.
	for range 10 {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := other.Enqueue(cctx, "small", payloads(1, 8))
		cancel()
		if err != nil {
			// Show where the store's syncers are.
			buf := make([]byte, 64<<20)
			buf = buf[:runtime.Stack(buf, true)]
			for _, g := range strings.Split(string(buf), "\n\n") {
				if strings.Contains(g, "syncLoop") {
					t.Log(g)
				}
			}
		}
		require.NoError(t, err, "a syncer waits for the socket of a client that does not read")
	}
}

// leanCallThenPart starts a lean server on factory's store, bootstraps a
// raw connection to it and writes, in one write, a nodeInfo call
// (question 1) followed by part, the start of a next message.
func leanCallThenPart(t *testing.T, factory storeFactory, part []byte) (*testBundle, net.Conn, *rawRPC) {
	t.Helper()
	b := setup(t, bundleOpts{factory: factory, mutate: func(c *ServerConfig) { c.Engine = EngineLean }})
	conn := rawConn(t, b)
	r := &rawRPC{t: t, conn: conn, dec: capnp.NewDecoder(conn)}
	_, err := conn.Write(bootstrapMsg(t))
	require.NoError(t, err)
	r.recvReturn(0)
	info := pipelinedCall(t, 1, 0, 15 /* nodeInfo */, nil)
	_, err = conn.Write(slices.Concat(info, part))
	require.NoError(t, err)
	return b, conn, r
}
