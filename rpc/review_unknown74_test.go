package rpc

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/schema"
)

// Review (session 74) of the outcome-unknown change (50a5478): edges of
// when a call that changes the queue wraps ErrOutcomeUnknown.

// stallNode is a node that answers the bootstrap and then reads nothing
// until the test reads from its end of the connection (a partition, or a
// node that stopped reading).
type stallNode struct {
	addr  string
	conns chan net.Conn
}

// startStallNode listens on 127.0.0.1, over TLS when cfg is not nil.
func startStallNode(t *testing.T, cfg *tls.Config) *stallNode {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	n := &stallNode{addr: ln.Addr().String(), conns: make(chan net.Conn, 1)}
	boot := bootstrapReturnBytes(t, 0)
	done := make(chan struct{})
	var accepted []net.Conn
	go func() {
		defer close(done)
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		accepted = append(accepted, conn)
		if cfg != nil {
			conn = tls.Server(conn, cfg)
		}
		// The decoder reads no more than the message: the rest of the
		// stream is the test's.
		if _, err := capnp.NewDecoder(conn).Decode(); err != nil {
			return
		}
		if _, err := conn.Write(boot); err != nil {
			return
		}
		n.conns <- conn
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		for _, c := range accepted {
			_ = c.Close()
		}
	})
	return n
}

func (n *stallNode) conn(t *testing.T) net.Conn {
	t.Helper()
	select {
	case c := <-n.conns:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no connection")
		return nil
	}
}

// readEnqueueCall decodes messages from r until a Call, and returns its
// method and the size of its first item's payload.
func readEnqueueCall(t *testing.T, r io.Reader) (uint16, int) {
	t.Helper()
	dec := capnp.NewDecoder(r)
	dec.MaxMessageSize = 1 << 30
	for {
		msg, err := dec.Decode()
		require.NoError(t, err, "the rest of the call never came")
		m, err := rpccp.ReadRootMessage(msg)
		require.NoError(t, err)
		if m.Which() != rpccp.Message_Which_call {
			msg.Release()
			continue
		}
		c, err := m.Call()
		require.NoError(t, err)
		p, err := c.Params()
		require.NoError(t, err)
		ct, err := p.Content()
		require.NoError(t, err)
		items, err := schema.Queue_enqueue_Params(ct.Struct()).Items()
		require.NoError(t, err)
		require.Equal(t, 1, items.Len())
		pl, err := items.At(0).Payload()
		require.NoError(t, err)
		method, size := c.MethodId(), len(pl)
		msg.Release()
		return method, size
	}
}

// TestReviewUnknown74_CutWriteIsUnknown: an Enqueue whose ctx ends while
// its request is half written (the node stopped reading) was sent: on a
// plain socket the rest goes out in the background (the README's "a
// request half written then is finished in the background"), and the
// node reads the whole call and may apply it; on TLS the connection ends
// with half a request on it. Both wrap ErrOutcomeUnknown and the ctx's
// error. (Checked right: the lean engine's abandoned and cutLost sends
// count as sent. The go-capnp engine is left out: its call did not
// return within 20 s of its ctx's end here, see the report.)
func TestReviewUnknown74_CutWriteIsUnknown(t *testing.T) {
	t.Parallel()
	const size = 24 << 20 // far over the loopback socket buffers
	item := payloads(1, size)
	for _, tc := range []struct {
		name   string
		engine string
		tls    bool
	}{
		{"lean-plain", ClientEngineLean, false},
		{"lean-tls", ClientEngineLean, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var scfg *tls.Config
			opts := ClientOptions{Engine: tc.engine}
			if tc.tls {
				x := newRvcTLS(t)
				scfg = x.server
				opts.TLS = x.client(t)
			}
			n := startStallNode(t, scfg)
			dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
			c, err := Dial(dctx, n.addr, opts)
			dcancel()
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			nc := n.conn(t)

			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errc := rpctest.Go(func() error {
				_, err := c.Enqueue(ctx, "q", item)
				return err
			})
			// Some of the request came: its write has begun, and cannot
			// end while the node does not read.
			head := make([]byte, 64<<10)
			_, err = io.ReadFull(nc, head)
			require.NoError(t, err)
			cancel()
			err = rpctest.Recv(t, errc, 20*time.Second)
			require.ErrorIs(t, err, ErrOutcomeUnknown, "the request was half written: %v", err)
			require.ErrorIs(t, err, context.Canceled)

			switch {
			case tc.tls:
				// A cut TLS write cannot go on: the connection ends.
				select {
				case <-c.Done():
				case <-time.After(20 * time.Second):
					t.Fatal("the client's TLS connection did not end after a cut write")
				}
			default:
				// The rest goes out: the node reads the whole call, and
				// would apply it.
				method, got := readEnqueueCall(t, io.MultiReader(bytes.NewReader(head), nc))
				require.Equal(t, mEnqueue.id, method)
				require.Equal(t, size, got)
			}
		})
	}
}

// typedExceptionBytes is a Return of qid holding an exception of type typ.
func typedExceptionBytes(t *testing.T, qid uint32, typ rpccp.Exception_Type) []byte {
	t.Helper()
	msg, err := exceptionReturn(qid, "from the test")
	require.NoError(t, err)
	defer msg.Release()
	m, err := rpccp.ReadRootMessage(msg)
	require.NoError(t, err)
	ret, err := m.Return()
	require.NoError(t, err)
	e, err := ret.Exception()
	require.NoError(t, err)
	e.SetType(typ)
	b, err := msg.Marshal()
	require.NoError(t, err)
	return b
}

// TestReviewUnknown74_ExceptionTypes: an exception the node answers a
// call with is an answer: of type overloaded, failed or unimplemented it
// does not wrap ErrOutcomeUnknown. One of type disconnected does (as
// documented at ErrOutcomeUnknown: it reads as a lost connection, and
// the node sends it only for calls cut by its connection's end), keeping
// the old IsDisconnected. Checked right, on both engines.
func TestReviewUnknown74_ExceptionTypes(t *testing.T) {
	t.Parallel()
	for _, engine := range []string{ClientEngineLean, ClientEngineGoCapnp} {
		for _, tc := range []struct {
			typ     rpccp.Exception_Type
			unknown bool
		}{
			{rpccp.Exception_Type_overloaded, false},
			{rpccp.Exception_Type_failed, false},
			{rpccp.Exception_Type_unimplemented, false},
			{rpccp.Exception_Type_disconnected, true},
		} {
			t.Run(engine+"/"+tc.typ.String(), func(t *testing.T) {
				t.Parallel()
				op := mutatingOps()[0] // enqueue
				c, hc := dialOutcome(t, engine, ClientOptions{})
				errc, call := startOp(t, c, hc, op, ctxT(t))
				hc.send(t, typedExceptionBytes(t, call.qid, tc.typ))
				err := rpctest.Recv(t, errc, 10*time.Second)
				require.ErrorContains(t, err, "from the test")
				if tc.unknown {
					require.ErrorIs(t, err, ErrOutcomeUnknown, "%v", err)
					require.True(t, IsDisconnected(err), "%v", err)
				} else {
					require.NotErrorIs(t, err, ErrOutcomeUnknown, "the node answered: %v", err)
				}
			})
		}
	}
}
