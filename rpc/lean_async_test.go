package rpc

import (
	"context"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/schema"
)

// TestServer_UnreadAnswersDoNotStallDurableCalls: on a RocksDB store with
// sync=always, the goroutine that fsyncs answers the calls of every
// connection (lean_async.go). A client that polls large batches and never
// reads its answers fills its socket; the fsync's goroutine must leave
// that socket to the connection, so that other clients' durable calls are
// still answered.
func TestServer_UnreadAnswersDoNotStallDurableCalls(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{factory: rocksFactory(), mutate: func(c *ServerConfig) {
		c.ReplyStallTimeout = time.Hour // the stuck client is never dropped here
	}})
	c := b.dial()
	ctx := ctxT(t)
	const polls, max, size = 24, 32, 16 << 10 // 12 MiB of answers
	for range polls {
		_, err := c.Enqueue(ctx, "big", payloads(max, size))
		require.NoError(t, err)
	}
	conn := rawConn(t, b)
	_, err := conn.Write(bootstrapMsg(t))
	require.NoError(t, err)
	for i := 1; i <= polls; i++ {
		_, err := conn.Write(pipelinedCall(t, uint32(i), 0, 1 /* poll */, func(params rpccp.Payload) error {
			p, err := schema.NewQueue_poll_Params(params.Segment())
			if err != nil {
				return err
			}
			if err := p.SetQueue("big"); err != nil {
				return err
			}
			p.SetMax(max)
			p.SetLeaseMs(60_000)
			return params.SetContent(p.ToPtr())
		}))
		require.NoError(t, err)
		// One at a time, so that the node's reader waits for the next
		// call when the answer is sent: whoever completes the poll
		// writes it.
		time.Sleep(10 * time.Millisecond)
	}
	// The polls are answered until the client's socket is full; then the
	// connection stops (its reader may be the one waiting to write, which
	// holds up only this connection). Wait until no more are claimed.
	last := int64(-1)
	rpctest.Eventually(t, 30*time.Second, func() bool {
		st, err := c.Stats(ctx, "big")
		if err != nil || len(st) != 1 {
			return false
		}
		n := st[0].Inflight
		stable := n > 0 && n == last
		last = n
		time.Sleep(200 * time.Millisecond) // observation interval, not synchronisation
		return stable
	})
	// Another client's durable calls are answered meanwhile.
	other := b.dial()
	for range 20 {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		_, err := other.Enqueue(cctx, "small", payloads(1, 8))
		cancel()
		require.NoError(t, err)
	}
	// Every answer reaches the stuck client intact once it reads: what
	// the socket did not take at once was written after, in order.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	dec := capnp.NewDecoder(conn)
	dec.MaxMessageSize = 64 << 20
	items := 0
	for answered := 0; answered < polls; {
		msg, err := dec.Decode()
		require.NoError(t, err)
		m, err := rpccp.ReadRootMessage(msg)
		require.NoError(t, err)
		if m.Which() != rpccp.Message_Which_return {
			continue
		}
		ret, err := m.Return()
		require.NoError(t, err)
		if ret.AnswerId() == 0 {
			continue // the bootstrap
		}
		require.Equal(t, rpccp.Return_Which_results, ret.Which())
		p, err := ret.Results()
		require.NoError(t, err)
		content, err := p.Content()
		require.NoError(t, err)
		l, err := schema.Queue_poll_Results(content.Struct()).Items()
		require.NoError(t, err)
		for i := 0; i < l.Len(); i++ {
			pl, err := l.At(i).Payload()
			require.NoError(t, err)
			require.Len(t, pl, size)
		}
		items += l.Len()
		answered++
	}
	require.Equal(t, polls*max, items)
}
