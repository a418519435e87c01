package rpc

import (
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// Messages the node starts, on the lean Go client's connection. The
// client asks and the node answers, but the protocol lets the node send
// more: a message kind newer than the client's rpc.capnp, which the
// client must echo in an Unimplemented (how a newer node learns to fall
// back), or a Call or a Bootstrap, which wait for a Return.

// nodeInfoReturnBytes is a framed nodeInfo Return for question qid whose
// info has maxBatch set.
func nodeInfoReturnBytes(t *testing.T, qid uint32, maxBatch uint32) []byte {
	return returnBytes(t, qid, func(p rpccp.Payload) error {
		res, err := schema.NewQueue_nodeInfo_Results(p.Segment())
		if err != nil {
			return err
		}
		info, err := res.NewInfo()
		if err != nil {
			return err
		}
		info.SetMaxBatch(maxBatch)
		return p.SetContent(res.ToPtr())
	})
}

// requireExceptionReturn checks that m is a Return of question qid
// holding an exception.
func requireExceptionReturn(t *testing.T, m rpccp.Message, qid uint32) {
	t.Helper()
	require.Equal(t, rpccp.Message_Which_return, m.Which())
	ret, err := m.Return()
	require.NoError(t, err)
	require.Equal(t, qid, ret.AnswerId())
	require.Equal(t, rpccp.Return_Which_exception, ret.Which())
	e, err := ret.Exception()
	require.NoError(t, err)
	reason, _ := e.Reason()
	require.Contains(t, reason, "client")
}

// requireEcho checks that m is an Unimplemented echo of
// unknownMessage(which).
func requireEcho(t *testing.T, m rpccp.Message, which uint16) {
	t.Helper()
	require.Equal(t, rpccp.Message_Which_unimplemented, m.Which())
	u, err := m.Unimplemented()
	require.NoError(t, err)
	require.Equal(t, rpccp.Message_Which(which), u.Which())
	p, err := capnp.Struct(u).Ptr(0)
	require.NoError(t, err)
	require.Equal(t, uint64(42), p.Struct().Uint64(0))
}

// Found by review (session 72): a node newer than the client sends a
// Message member the client's rpc.capnp does not know. The protocol has
// the receiver answer it with an Unimplemented echo (that is how a newer
// peer learns to fall back); the lean Go client dropped it without a word
// (leanClient.handle's default branch released it and went on).
func TestLeanClient_EchoesUnknownMessage(t *testing.T) {
	f := newEvoNode(t)
	done := make(chan error, 1)
	var got []rpccp.Message_Which
	go func() {
		f.accept()
		f.serveBootstrap()
		calls := 0
		for {
			m, err := f.recv()
			if err != nil {
				done <- err
				return
			}
			got = append(got, m.Which())
			if m.Which() != rpccp.Message_Which_call {
				continue
			}
			calls++
			if calls == 2 {
				// Whatever the client answered to the first call's
				// stream came before its second call.
				done <- nil
				return
			}
			call, err := m.Call()
			if err != nil {
				done <- err
				return
			}
			// Something new first, then the answer.
			f.send(unknownMessage(200))
			if _, err := f.conn.Write(nodeInfoReturnBytes(t, call.QuestionId(), 7)); err != nil {
				done <- err
				return
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := f.dial(ctx)
	ni, err := c.NodeInfo(ctx)
	require.NoError(t, err)
	require.Equal(t, 7, ni.MaxBatch)
	ctx2, cancel2 := context.WithCancel(ctx)
	second := make(chan struct{})
	go func() { defer close(second); _, _ = c.NodeInfo(ctx2) }() // never answered
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("fake node did not see the second call")
	}
	cancel2()
	<-second
	_ = c.Close()
	require.Contains(t, got, rpccp.Message_Which_unimplemented,
		"the client must echo a message it does not know as Unimplemented; it sent %v", got)
}

// Found by review (session 72): a Call or a Bootstrap from the node fell
// into the same silent branch, so a node would wait for its Return
// forever. The client hosts no capabilities on this connection
// (subscriptions' Consumer lives on a go-capnp connection of its own), so
// both get a Return with an exception; an Unimplemented and a Finish get
// no reply (an echo of an Unimplemented would loop). All of it is
// answered during the bootstrap as after it.
func TestLeanClient_AnswersNodeCallAndBootstrap(t *testing.T) {
	f := newEvoNode(t)
	done := make(chan error, 1)
	go func() {
		done <- func() error {
			f.accept()
			// During the client's bootstrap: an unknown message and a
			// Bootstrap of the node's own before the answer.
			m, err := f.recv()
			if err != nil {
				return err
			}
			require.Equal(t, rpccp.Message_Which_bootstrap, m.Which())
			bs, _ := m.Bootstrap()
			f.send(unknownMessage(200))
			f.send(func(m rpccp.Message) error {
				b, err := m.NewBootstrap()
				b.SetQuestionId(6)
				return err
			})
			m, err = f.recv()
			if err != nil {
				return err
			}
			requireEcho(t, m, 200)
			if err := f.recvExceptionReturn(6); err != nil {
				return err
			}
			if _, err := f.conn.Write(bootstrapReturnBytes(t, bs.QuestionId())); err != nil {
				return err
			}
			// After it: a Call and a Bootstrap to the client while its
			// first call waits, then an Unimplemented and Finishes,
			// which must get no reply.
			var qid uint32
			for {
				m, err = f.recv()
				if err != nil {
					return err
				}
				if m.Which() == rpccp.Message_Which_call {
					call, _ := m.Call()
					qid = call.QuestionId()
					break
				}
			}
			f.send(func(m rpccp.Message) error {
				c, err := m.NewCall()
				if err != nil {
					return err
				}
				c.SetQuestionId(5)
				c.SetInterfaceId(schema.Consumer_TypeID)
				tg, err := c.NewTarget()
				if err != nil {
					return err
				}
				tg.SetImportedCap(0)
				_, err = c.NewParams()
				return err
			})
			f.send(func(m rpccp.Message) error {
				b, err := m.NewBootstrap()
				b.SetQuestionId(7)
				return err
			})
			if err := f.recvExceptionReturn(5); err != nil {
				return err
			}
			if err := f.recvExceptionReturn(7); err != nil {
				return err
			}
			f.send(func(m rpccp.Message) error {
				u, err := m.NewUnimplemented()
				if err != nil {
					return err
				}
				fin, err := u.NewFinish()
				fin.SetQuestionId(qid)
				return err
			})
			for _, id := range []uint32{5, 6, 7} {
				f.send(func(m rpccp.Message) error {
					fin, err := m.NewFinish()
					fin.SetQuestionId(id)
					return err
				})
			}
			if _, err := f.conn.Write(nodeInfoReturnBytes(t, qid, 7)); err != nil {
				return err
			}
			// Up to the second call: the first call's Finish only.
			for {
				m, err = f.recv()
				if err != nil {
					return err
				}
				if m.Which() == rpccp.Message_Which_call {
					call, _ := m.Call()
					_, err = f.conn.Write(nodeInfoReturnBytes(t, call.QuestionId(), 8))
					return err
				}
				require.Equal(t, rpccp.Message_Which_finish, m.Which(), "the client answered a message that needs no answer")
			}
		}()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := f.dial(ctx)
	ni, err := c.NodeInfo(ctx)
	require.NoError(t, err)
	require.Equal(t, 7, ni.MaxBatch)
	ni, err = c.NodeInfo(ctx)
	require.NoError(t, err)
	require.Equal(t, 8, ni.MaxBatch)
	require.NoError(t, <-done)
}

// Found by review (session 72): each message the client must answer
// costs it a write, so a node sending them without end would keep the client writing without bound. Past
// maxNodeReplies per connection the client ends the connection, as the
// node bounds its own echoes.
func TestLeanClient_NodeReplyCap(t *testing.T) {
	f := newEvoNode(t)
	echoes := make(chan int, 1)
	go func() {
		f.accept()
		f.serveBootstrap()
		for {
			m, err := f.recv()
			if err != nil {
				echoes <- -1
				return
			}
			if m.Which() == rpccp.Message_Which_call {
				break
			}
		}
		// The first call is never answered: unknown messages instead,
		// one more than the client answers. A client that stops reading
		// or writing here blocks these writes; the deadline ends them.
		_ = f.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
		frame := rpcMessageBytes(t, unknownMessage(200))
		for i := 0; i <= maxNodeReplies; i++ {
			if _, err := f.conn.Write(frame); err != nil {
				break
			}
		}
		n := 0
		for {
			m, err := f.recv()
			if err != nil {
				break // the client ended the connection
			}
			if m.Which() == rpccp.Message_Which_unimplemented {
				n++
			}
		}
		echoes <- n
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := f.dial(ctx)
	_, err := c.NodeInfo(ctx)
	require.Error(t, err)
	require.Contains(t, err.Error(), "more than")
	require.Equal(t, maxNodeReplies, <-echoes)
}

// bigUnknownMessage is a Message member the client does not know, whose
// body holds a text of n bytes: its echo is larger than writeBufSize.
func bigUnknownMessage(which uint16, n int) func(rpccp.Message) error {
	return unknownMessageWith(which, strings.Repeat("x", n))
}

// Found by review (session 72): writePending appended the replies to
// the node's messages to the buffer whole (an echo may be larger than
// writeBufSize), then encoded the waiting Finishes through
// clientWrites.Write. With the buffer already past writeBufSize and
// neither cut nor later set, Write's default branch computed
// k := writeBufSize - len(w.buf) < 0 and sliced p[:k]: a panic in the
// goroutine holding the write lock, which killed the client's process.
// Here: a caller's large Enqueue holds the lock on a full socket; the
// node sends a message of a kind the client does not know (about 20 KiB)
// and the Return of another call, whose Finish must wait for the lock;
// when the socket drains, the Enqueue's caller writes both.
func TestLeanClient_EchoLargerThanBufferWithPendingFinish(t *testing.T) {
	f := newEvoNode(t)
	gotCall := make(chan uint32, 1)
	node := make(chan error, 1)
	go func() {
		f.accept()
		if tc, ok := f.conn.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(64 << 10)
		}
		f.serveBootstrap()
		var m rpccp.Message
		for {
			var err error
			m, err = f.recv()
			if err != nil {
				node <- err
				return
			}
			if m.Which() == rpccp.Message_Which_call {
				break
			}
		}
		call, err := m.Call()
		if err != nil {
			node <- err
			return
		}
		gotCall <- call.QuestionId()
		node <- nil
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := f.dial(ctx)
	l := c.lean
	require.NotNil(t, l, "the lean engine")

	// Call A, unanswered for now.
	first := make(chan error, 1)
	go func() { _, err := c.NodeInfo(ctx); first <- err }()
	var qidA uint32
	select {
	case qidA = <-gotCall:
	case <-ctx.Done():
		t.Fatal("the node did not see the first call")
	}
	require.NoError(t, <-node)

	// The node stops reading: a large Enqueue fills the socket and holds
	// the write lock.
	ectx, ecancel := context.WithCancel(ctx)
	defer ecancel()
	enq := make(chan error, 1)
	go func() {
		_, err := c.Enqueue(ectx, "q", []storage.EnqueueItem{{Payload: make([]byte, 24<<20)}})
		enq <- err
	}()
	// Its first byte on the wire says the Enqueue took the lock and wrote
	// what waited before it (nothing): from there its write, more than
	// the sockets' buffers hold, keeps the lock until the node reads, so
	// the echo and the Finish below must wait for it (had they come
	// before, the Enqueue's caller would have written them ahead of its
	// call, not the path this test is about).
	require.NoError(t, f.conn.SetReadDeadline(time.Now().Add(60*time.Second)))
	var oneByte [1]byte
	_, err := io.ReadFull(f.conn, oneByte[:])
	require.NoError(t, err, "the Enqueue's first byte")
	require.NoError(t, f.conn.SetReadDeadline(time.Time{}))
	require.Len(t, l.w.lock, 1, "the Enqueue holds the write lock")

	// Something new from the node, then call A's Return: the echo and
	// call A's Finish both wait for the lock.
	f.send(bigUnknownMessage(200, 20<<10))
	_, err = f.conn.Write(nodeInfoReturnBytes(t, qidA, 7))
	require.NoError(t, err)
	select {
	case err := <-first:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("call A not answered")
	}
	rpctest.Eventually(t, 20*time.Second, func() bool { return l.pendN.Load() == 2 }, "the echo and the Finish to wait for the lock")

	// The node reads again: the Enqueue's write completes and its caller
	// writes what waited.
	go func() { _, _ = io.Copy(io.Discard, f.conn) }()
	rpctest.Eventually(t, 20*time.Second, func() bool { return l.pendN.Load() == 0 && len(l.w.lock) == 0 }, "what waited to be written")
	ecancel()
	<-enq
	l.mu.Lock()
	lostErr := l.err
	l.mu.Unlock()
	require.NoError(t, lostErr, "the connection ended")
}

// Found by review (session 72): clientWrites.Write sliced p[:k] with
// k := writeBufSize - len(w.buf), negative when the buffer already held
// more than writeBufSize with neither cut nor later set (replies to the
// node's messages are appended whole). Whatever puts the buffer there, a
// message encoded after it must go in behind it, without a panic and
// without waiting on the socket (the holder may be the reader).
func TestLeanClient_WriteAfterBufferPastItsSize(t *testing.T) {
	cc, sc := connPair(t, "tcp")
	t.Cleanup(func() { _ = sc.Close() })
	resume := make(chan struct{})
	close(resume)
	seen := make(chan uint32, 16)
	go stallingNodeSeeing(t, sc, 0, resume, func(qid uint32) { seen <- qid })
	ctx := ctxT(t)
	l, err := newLeanClient(ctx, cc, DefaultMaxMessageBytes, DefaultMaxReplyBytes, clock.New())
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.close() })

	require.True(t, l.tryLockWrite())
	// A message of a kind the node ignores, larger than the buffer, put
	// there whole as writePending puts a reply.
	big := rpcMessageBytes(t, bigUnknownMessage(200, 20<<10))
	require.Greater(t, len(big), writeBufSize)
	l.w.buf = append(l.w.buf, big...)
	require.NoError(t, l.w.encodeFinish(7, true))
	require.Greater(t, len(l.w.buf), len(big), "the Finish is in the buffer")
	require.Equal(t, big, l.w.buf[:len(big)], "behind the message, nothing sent yet")
	l.w.flushNow()
	require.NoError(t, l.w.err)
	l.handOn()
	select {
	case qid := <-seen:
		require.Equal(t, uint32(7), qid)
	case <-ctx.Done():
		t.Fatal("the Finish was not written")
	}
}
