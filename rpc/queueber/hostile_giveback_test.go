package queueber

import (
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/rpc/rpctest"
	qbschema "github.com/leaseq/leaseq/schema/queueber"
	"github.com/leaseq/leaseq/storage"
)

// Review (session 70, hostile Queueber clients), continued: what the
// go-capnp engine, which serves every Queueber connection, does with the
// answers it has built once the client stops reading or never finishes.

// TestReviewHostile_StopGivesBackUnwrittenAnswers: Queueber polls answered
// with items while their client reads nothing, then Stop. Answers not a
// byte of which was written go nowhere; their items must be ready again
// (as the Queue interface's lean engine does at Stop), not stay leased for
// the poll's lease (an hour here). Stop must not hang on the blocked
// writer either.
// Found by review (session 70): go-capnp dropped the queued Returns when
// the connection closed, and their items stayed leased for the poll's
// whole lease.
func TestReviewHostile_StopGivesBackUnwrittenAnswers(t *testing.T) {
	t.Parallel()
	const n = 48
	// Stop waits up to ReplyStallTimeout for the client to read the
	// answers owed to it; this one reads nothing until Stop returns, so
	// the clock moves past that bound (a minute: the polls' hour-long
	// leases hold).
	b, conn := answersPiledUp(t, n, time.Minute)

	stopped := rpctest.Go(func() struct{} { b.srv.Stop(); return struct{}{} })
	rpctest.Eventually(t, 30*time.Second, func() bool {
		select {
		case <-stopped:
			return true
		default:
			b.clock.Add(5 * time.Second)
			return false
		}
	}, "Stop hung")

	// Read what the client got: every complete poll answer with an item.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	dec := capnp.NewDecoder(conn)
	dec.MaxMessageSize = 1 << 30
	got := 0
	for {
		msg, err := dec.Decode()
		if err != nil {
			var ne net.Error
			require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server did not close the connection")
			if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Logf("read ended: %v", err)
			}
			break
		}
		m, err := rpccp.ReadRootMessage(msg)
		require.NoError(t, err)
		if m.Which() == rpccp.Message_Which_return {
			ret, err := m.Return()
			require.NoError(t, err)
			if ret.Which() == rpccp.Return_Which_results && ret.AnswerId() != 0 {
				res, err := ret.Results()
				require.NoError(t, err)
				c, err := res.Content()
				require.NoError(t, err)
				r, err := qbschema.Queue_poll_Results(c.Struct()).Resp()
				require.NoError(t, err)
				items, err := r.Items()
				require.NoError(t, err)
				got += items.Len()
			}
		}
		msg.Release()
	}

	st, err := b.store.Stats(ctxT(t), storage.StatsParams{Queue: testQueue, Now: b.clock.Now()})
	require.NoError(t, err)
	t.Logf("client received %d items in whole answers; store: inflight %d, ready %d", got, st[0].Inflight, st[0].Ready)
	// One answer may have been cut mid-write: the client's, it stays leased.
	require.LessOrEqual(t, st[0].Inflight, int64(got+1),
		"%d items stay leased for an hour though their answers were never written (the client got %d)", st[0].Inflight, got)
}

// rvFinish is the Finish of question qid.
func rvFinish(t testing.TB, qid uint32) []byte {
	return rvRPCMessage(t, func(m rpccp.Message) error {
		f, err := m.NewFinish()
		if err != nil {
			return err
		}
		f.SetQuestionId(qid)
		return nil
	})
}

// rvHeap is the Go heap in use after garbage collection.
func rvHeap() uint64 {
	var ms runtime.MemStats
	for range 3 {
		runtime.GC()
	}
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// TestReviewHostile_UnfinishedQuestionsHoldAnswers: a Queueber client that
// reads every answer but never sends Finish. The node's memory must stay
// within its reply budget: an answer without capabilities is not kept
// once it is written.
// Found by review (session 70): go-capnp's rpc.Conn (which serves every
// Queueber connection) keeps each Return message, payloads and all, until
// the question's Finish; the reply budget stops counting an answer once it
// is written (gatedMsg.Send), and nothing bounds the questions left open.
// So the node held every poll answer the connection ever got, without
// bound (up to MaxBatch x MaxPayload = 1 GiB per poll). Not parallel: it
// measures the heap.
func TestReviewHostile_UnfinishedQuestionsHoldAnswers(t *testing.T) {
	const n, size = 24, 1 << 20
	const limit = 1 << 20
	b := setupWith(t, func(c *rpc.ServerConfig) { c.ConnReplyLimitBytes = limit })
	for range n / 8 {
		items := make([]storage.EnqueueItem, 8)
		for i := range items {
			items[i] = storage.EnqueueItem{Payload: make([]byte, size)}
		}
		_, err := b.leaseq().Enqueue(ctxT(t), testQueue, items)
		require.NoError(t, err)
	}
	conn, err := net.Dial("tcp", b.qb)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	// Read and drop every answer; count the poll answers with an item.
	answered := make(chan uint32, n+1)
	go func() {
		dec := capnp.NewDecoder(conn)
		dec.MaxMessageSize = 1 << 30
		for {
			msg, err := dec.Decode()
			if err != nil {
				close(answered)
				return
			}
			if m, err := rpccp.ReadRootMessage(msg); err == nil && m.Which() == rpccp.Message_Which_return {
				if ret, err := m.Return(); err == nil && ret.AnswerId() != 0 {
					answered <- ret.AnswerId()
				}
			}
			msg.Release()
		}
	}()
	before := rvHeap()
	_, err = conn.Write(rvBootstrap(t))
	require.NoError(t, err)
	for i := 1; i <= n; i++ {
		_, err := conn.Write(rvPollCall(t, uint32(i), 60, 1, 1))
		require.NoError(t, err)
		rpctest.Recv(t, answered, 30*time.Second) // one at a time: the budget never holds them back
	}
	open := rvHeap()
	for i := 1; i <= n; i++ {
		_, err := conn.Write(rvFinish(t, uint32(i)))
		require.NoError(t, err)
	}
	// A probe answered (an exception: lease 0) after the Finishes were read.
	_, err = conn.Write(rvPollCall(t, n+1, 0, 1, 1))
	require.NoError(t, err)
	rpctest.Recv(t, answered, 30*time.Second)
	finished := rvHeap()
	held := int64(open) - int64(finished)
	t.Logf("heap: before %d MiB, %d answers read and not finished %d MiB, after their Finish %d MiB", before>>20, n, open>>20, finished>>20)
	require.Less(t, held, int64(4*limit),
		"the node held %d MiB of answers already written, for questions the client never finished (reply budget %d MiB)", held>>20, limit>>20)
}

// rvReturnOf reads conn until the Return of question qid and reports
// whether it came (false: the connection ended first).
func rvReturnOf(t *testing.T, conn net.Conn, qid uint32) bool {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
	dec := capnp.NewDecoder(conn)
	dec.MaxMessageSize = 1 << 30
	for {
		msg, err := dec.Decode()
		if err != nil {
			var ne net.Error
			require.False(t, errors.As(err, &ne) && ne.Timeout(), "no Return of question %d and the connection is open", qid)
			return false
		}
		m, err := rpccp.ReadRootMessage(msg)
		require.NoError(t, err)
		if m.Which() == rpccp.Message_Which_return {
			ret, err := m.Return()
			require.NoError(t, err)
			if ret.AnswerId() == qid {
				msg.Release()
				return true
			}
		}
		msg.Release()
	}
}

// TestReviewHostile_CapabilityOnAWrittenAnswer: a call whose parameters
// name a capability in the results of a poll answered already (a
// receiverAnswer descriptor). The node releases an answer without
// capabilities once it is written (TestReviewHostile_UnfinishedQuestionsHoldAnswers),
// and go-capnp would read that answer to find the capability: the
// connection ends instead, and the node serves on. Found by review
// (session 70), with the fix of the test above: without the transport's
// check the node read a released message.
func TestReviewHostile_CapabilityOnAWrittenAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, storage.Limits{})
	_, err := b.leaseq().Enqueue(ctxT(t), testQueue, []storage.EnqueueItem{{Payload: []byte("x")}})
	require.NoError(t, err)
	conn, err := net.Dial("tcp", b.qb)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	_, err = conn.Write(append(rvBootstrap(t), rvPollCall(t, 1, 60, 1, 1)...))
	require.NoError(t, err)
	require.True(t, rvReturnOf(t, conn, 1), "the poll was answered")

	// Question 2: a poll whose parameters carry the results of question 1
	// as a capability.
	call := rvRPCMessage(t, func(m rpccp.Message) error {
		c, err := m.NewCall()
		if err != nil {
			return err
		}
		c.SetQuestionId(2)
		c.SetInterfaceId(qbschema.Queue_TypeID)
		c.SetMethodId(2) // poll
		tgt, err := c.NewTarget()
		if err != nil {
			return err
		}
		tgt.SetImportedCap(0)
		p, err := c.NewParams()
		if err != nil {
			return err
		}
		ct, err := p.NewCapTable(1)
		if err != nil {
			return err
		}
		pa, err := ct.At(0).NewReceiverAnswer()
		if err != nil {
			return err
		}
		pa.SetQuestionId(1)
		_, err = pa.NewTransform(0)
		return err
	})
	_, err = conn.Write(call)
	require.NoError(t, err)
	require.False(t, rvReturnOf(t, conn, 2), "the connection ends")

	// The node serves on.
	ids, err := add(ctxT(t), b.dial(), addItem{contents: "y"})
	require.NoError(t, err)
	p, err := poll(ctxT(t), b.dial(), 30, 1, 1)
	require.NoError(t, err)
	require.Equal(t, ids, p.ids)
}

// TestHostile_FinishedPollAnswerGivenBack: a Queueber client finishes
// (cancels) its polls while their answers, with items, wait unwritten
// behind answers it has not read yet. Per Cap'n Proto the caller will not
// use the results of a question it finished, and Queueber has no verb to
// give items back (no nack): the items of an answer not a byte of which
// was written when its Finish came are ready again at once, and those of
// the answers already in the sockets stay leased (the client's). The
// answers still go out, every one (the client needs each Return to reuse
// its question ids), and no item is given back twice.
// Found by review (session 73): the node gave items back only when an
// answer was dropped, its write failed or the connection ended, never on
// a Finish; the answers stayed queued, were written whenever the client
// read again (and discarded by its RPC library), and their items stayed
// leased for the poll's lease (an hour here) with an attempt counted.
func TestHostile_FinishedPollAnswerGivenBack(t *testing.T) {
	t.Parallel()
	const n = 48
	b, conn := answersPiledUp(t, n, time.Hour)
	// The client gives up every poll.
	for i := 1; i <= n; i++ {
		_, err := conn.Write(rvFinish(t, uint32(i)))
		require.NoError(t, err)
	}
	// At most ~4 MiB (16 answers) went into the sockets; the rest were
	// not written when their Finish came.
	var st storage.QueueStats
	rpctest.Eventually(t, 30*time.Second, func() bool {
		sts, err := b.store.Stats(ctxT(t), storage.StatsParams{Queue: testQueue, Now: b.clock.Now()})
		require.NoError(t, err)
		st = sts[0]
		return st.Ready >= n/2
	}, "the items of poll answers not written when their Finish came stay leased for the poll's hour")

	// The client reads again: every poll is still answered, and the
	// connection serves on (a probe: an exception, lease 0).
	_, err := conn.Write(rvPollCall(t, n+1, 0, 1, 1))
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(60*time.Second)))
	dec := capnp.NewDecoder(conn)
	dec.MaxMessageSize = 1 << 30
	answered, withItems := 0, 0
	for answered < n+1 {
		msg, err := dec.Decode()
		require.NoError(t, err, "%d of %d questions answered", answered, n+1)
		m, err := rpccp.ReadRootMessage(msg)
		require.NoError(t, err)
		if m.Which() == rpccp.Message_Which_return {
			ret, err := m.Return()
			require.NoError(t, err)
			if ret.AnswerId() != 0 {
				answered++
				if ret.Which() == rpccp.Return_Which_results && ret.AnswerId() <= n {
					withItems++
				}
			}
		}
		msg.Release()
	}
	require.Equal(t, n, withItems, "every poll's answer went out")
	sts, err := b.store.Stats(ctxT(t), storage.StatsParams{Queue: testQueue, Now: b.clock.Now()})
	require.NoError(t, err)
	st = sts[0]
	t.Logf("after the answers were read: inflight %d, ready %d", st.Inflight, st.Ready)
	require.Equal(t, int64(n), st.Ready+st.Inflight)
	// The first answer was being written when the Finishes came (the
	// sockets took its first bytes at least): the client's, still leased.
	require.GreaterOrEqual(t, st.Inflight, int64(1), "an answer partly written was given back")
}

// answersPiledUp parks n polls of an hour's lease on a connection that
// reads nothing and fills them with items of 256 KiB: 12 MiB of answers,
// of which the sockets hold about 4 MiB, the rest queued on the node.
func answersPiledUp(t *testing.T, n int, stall time.Duration) (*testBundle, net.Conn) {
	t.Helper()
	b := setupWith(t, func(c *rpc.ServerConfig) {
		c.ConnReplyLimitBytes = 1 << 30 // the budget plays no part here
		c.ReplyStallTimeout = stall
	})
	conn := b.rvNoReadConn()
	b.rvParkPolls(conn, n)
	b.rvFill(n, 256<<10)
	rpctest.Eventually(t, 60*time.Second, func() bool {
		m := b.srv.Metrics()
		return m.Waiters == 0 && m.Ops[rpc.OpPoll].Count == uint64(n)
	}, "every parked poll completed")
	return b, conn
}
