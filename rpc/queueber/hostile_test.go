package queueber

import (
	"net"
	"syscall"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/exc"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/rpc/rpctest"
	qbschema "github.com/leaseq/leaseq/schema/queueber"
	"github.com/leaseq/leaseq/storage"
)

// Review (session 70, hostile Queueber clients): raw-socket clients that
// pipeline Queueber calls and never read the answers.

// rvRPCMessage returns the framed bytes of one rpc.capnp Message.
func rvRPCMessage(t testing.TB, build func(rpccp.Message) error) []byte {
	t.Helper()
	msg, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	require.NoError(t, err)
	defer msg.Release()
	m, err := rpccp.NewRootMessage(seg)
	require.NoError(t, err)
	require.NoError(t, build(m))
	b, err := msg.Marshal()
	require.NoError(t, err)
	return b
}

// rvBootstrap is the Bootstrap of question 0.
func rvBootstrap(t testing.TB) []byte {
	return rvRPCMessage(t, func(m rpccp.Message) error {
		bs, err := m.NewBootstrap()
		if err != nil {
			return err
		}
		bs.SetQuestionId(0)
		return nil
	})
}

// rvPollCall is a Queueber poll as question qid on the bootstrap's promised
// answer (question 0).
func rvPollCall(t testing.TB, qid uint32, leaseSecs uint64, n uint32, timeoutSecs uint64) []byte {
	return rvRPCMessage(t, func(m rpccp.Message) error {
		c, err := m.NewCall()
		if err != nil {
			return err
		}
		c.SetQuestionId(qid)
		c.SetInterfaceId(qbschema.Queue_TypeID)
		c.SetMethodId(2) // poll
		tgt, err := c.NewTarget()
		if err != nil {
			return err
		}
		pa, err := tgt.NewPromisedAnswer()
		if err != nil {
			return err
		}
		pa.SetQuestionId(0)
		p, err := c.NewParams()
		if err != nil {
			return err
		}
		params, err := qbschema.NewQueue_poll_Params(p.Segment())
		if err != nil {
			return err
		}
		req, err := params.NewReq()
		if err != nil {
			return err
		}
		req.SetLeaseValiditySecs(leaseSecs)
		req.SetNumItems(n)
		req.SetTimeoutSecs(timeoutSecs)
		return p.SetContent(params.ToPtr())
	})
}

// rvNoReadConn dials the Queueber listener with a small receive buffer
// (set before connecting, so the kernel does not grow it): a client that
// does not read fills it at once.
func (b *testBundle) rvNoReadConn() net.Conn {
	b.t.Helper()
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}); err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", b.qb)
	require.NoError(b.t, err)
	b.t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// rvParkPolls sends the bootstrap and n polls of one item each on conn,
// and waits until all n are parked in the dispatcher.
func (b *testBundle) rvParkPolls(conn net.Conn, n int) {
	b.t.Helper()
	_, err := conn.Write(rvBootstrap(b.t))
	require.NoError(b.t, err)
	for i := 1; i <= n; i++ {
		_, err := conn.Write(rvPollCall(b.t, uint32(i), 3600, 1, 3600))
		require.NoError(b.t, err)
	}
	rpctest.Eventually(b.t, 60*time.Second, func() bool { return b.srv.Metrics().Waiters == n },
		"%d polls parked", n)
}

// rvFill enqueues n items of size bytes each through the Queue interface,
// which wakes the parked polls.
func (b *testBundle) rvFill(n, size int) {
	b.t.Helper()
	items := make([]storage.EnqueueItem, n)
	for i := range items {
		p := make([]byte, size)
		p[0] = byte(i)
		items[i] = storage.EnqueueItem{Payload: p}
	}
	_, err := b.leaseq().Enqueue(ctxT(b.t), testQueue, items)
	require.NoError(b.t, err)
}

// TestHostile_UnreadPollAnswersOverBudget: a Queueber client that parks
// polls and never reads the answers: a poll that completes while the
// connection's unread answers are over its reply budget gives its items
// back and answers empty (rpc.Conn.Poll), as on the Queue interface.
// Found by review (session 70): every parked poll claimed its item and
// queued an answer, so the node held many times the budget in answers no
// one read, and the items stayed leased (here for an hour).
func TestHostile_UnreadPollAnswersOverBudget(t *testing.T) {
	t.Parallel()
	const limit = 64 << 10
	const n, size = 64, 256 << 10 // 16 MiB of answers if all were built
	b := setupWith(t, func(c *rpc.ServerConfig) {
		c.ConnReplyLimitBytes = limit
		c.ReplyStallTimeout = time.Hour
	})
	conn := b.rvNoReadConn()
	b.rvParkPolls(conn, n)
	b.rvFill(n, size)
	rpctest.Eventually(t, 60*time.Second, func() bool {
		m := b.srv.Metrics()
		return m.Waiters == 0 && m.Ops[rpc.OpPoll].Count == n
	}, "every parked poll completed")

	queued := b.srv.Metrics().ReplyBytesQueued
	st := b.stats()
	t.Logf("reply bytes queued %d (budget %d); items inflight %d, ready %d", queued, limit, st.Inflight, st.Ready)
	// A few answers may race past the check (they are counted when their
	// handler returns): allow 4 answers over the budget.
	bound := int64(limit + 4*(size+64<<10))
	require.LessOrEqual(t, queued, bound,
		"a Queueber client that reads nothing made the node hold %d bytes of poll answers, over its reply budget of %d; the Queue interface gives such items back", queued, limit)
}

// TestHostile_ClosedConnFreesParkedPolls: polls parked by a client
// that goes away leave the dispatcher, and the next item goes to a live
// poller rather than to the dead connection (checked: correct).
func TestHostile_ClosedConnFreesParkedPolls(t *testing.T) {
	t.Parallel()
	b := setup(t, storage.Limits{})
	conn, err := net.Dial("tcp", b.qb)
	require.NoError(t, err)
	b.rvParkPolls(conn, 8)
	require.NoError(t, conn.Close())
	rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 0 })
	ch := goPoll(b.dial(), 30, 1, 30)
	rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
	ids, err := add(ctxT(t), b.dial(), addItem{contents: "x"})
	require.NoError(t, err)
	o := recvPoll(t, ch)
	require.NoError(t, o.err)
	require.Equal(t, ids, o.p.ids)
}

// TestHostile_ExpiredUnsweptLease: remove and extend under a lease
// whose time is up but which the sweeper has not expired yet answer false,
// and the item comes back after the sweep (checked: correct).
func TestHostile_ExpiredUnsweptLease(t *testing.T) {
	t.Parallel()
	b := setup(t, storage.Limits{})
	q := b.dial()
	ctx := ctxT(t)
	ids, err := add(ctx, q, addItem{contents: "x"})
	require.NoError(t, err)
	p, err := poll(ctx, q, 30, 1, 1)
	require.NoError(t, err)
	b.clock.Add(31 * time.Second)
	ok, err := extend(ctx, q, p.lease, 30)
	require.NoError(t, err)
	require.False(t, ok)
	removed, err := remove(ctx, q, ids[0], p.lease)
	require.NoError(t, err)
	require.False(t, removed)
	b.sweep()
	p2, err := poll(ctx, q, 30, 1, 1)
	require.NoError(t, err)
	require.Equal(t, ids, p2.ids)
}

// TestHostile_TooManyWaitersIsOverloaded: a poll over the queue's
// waiter limit is an "overloaded" exception (checked: correct).
func TestHostile_TooManyWaitersIsOverloaded(t *testing.T) {
	t.Parallel()
	b := setupWith(t, func(c *rpc.ServerConfig) { c.MaxWaitersPerQueue = 1 })
	ch := goPoll(b.dial(), 30, 1, 30)
	rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
	_, err := poll(ctxT(t), b.dial(), 30, 1, 30)
	requireException(t, err, exc.Overloaded, "")
	b.srv.Stop()
	recvPoll(t, ch)
}

// TestHostile_ZeroLeaseRemovesNothing: the all-zero lease (what a
// ready item holds no lease as) removes no ready item and extends nothing
// (checked: correct).
func TestHostile_ZeroLeaseRemovesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, storage.Limits{})
	q := b.dial()
	ctx := ctxT(t)
	ids, err := add(ctx, q, addItem{contents: "x"}, addItem{contents: "y", delay: 60})
	require.NoError(t, err)
	zero := make([]byte, 16)
	for _, id := range ids {
		removed, err := remove(ctx, q, id, zero)
		require.NoError(t, err)
		require.False(t, removed)
	}
	ok, err := extend(ctx, q, zero, 30)
	require.NoError(t, err)
	require.False(t, ok)
	st := b.stats()
	require.Equal(t, int64(1), st.Ready)
	require.Equal(t, int64(1), st.Delayed)
}
