package rpc

import (
	"slices"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc/transport"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// Review tests (session 74) of Server.Stop writing the answers owed
// before it closes each connection (lean.go stopReading, lean_write.go
// flushAtStop, server.go owedReturns).

// TestReviewStop74_FinishedPollAnswerWrittenAtStopGivenBack: a client
// that reads nothing has a big poll answer on its way and a small one
// queued behind it, and finishes both polls; then the node stops, and the
// client reads again. Stop now writes the small answer (the client needs
// its Return) instead of dropping it with the connection; the client
// finished its question before a byte of it was written, so its items are
// ready again at once, as on a connection that serves on
// (TestLean_FinishedPollAnswerNotWrittenGivenBack).
// Found by review (session 74): finishedUnwritten skipped every answer
// once the connection's end had begun (c.mu.closed), which, since Stop
// writes the queued answers, left the items leased, to a client that had
// dropped them, for the whole lease.
func TestReviewStop74_FinishedPollAnswerWrittenAtStopGivenBack(t *testing.T) {
	t.Parallel()
	for _, f := range stallStores() {
		t.Run("store="+f.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, bundleOpts{factory: f, transport: "unix", mutate: func(c *ServerConfig) { c.Engine = EngineLean }})
			c := b.dial()
			ctx := ctxT(t)
			_, err := c.Enqueue(ctx, "big", payloads(4, 512<<10))
			require.NoError(t, err)
			_, err = c.Enqueue(ctx, "small", payloads(3, 8))
			require.NoError(t, err)
			require.NoError(t, c.Close())

			conn := rawDial(t, b)
			_, err = conn.Write(slices.Concat(bootstrapMsg(t), pollMsg(t, 1, "big", 4)))
			require.NoError(t, err)
			rpctest.Eventually(t, 10*time.Second, func() bool { return peekLen(t, conn) > 1<<10 }, "the big answer was not written")
			_, err = conn.Write(pollMsg(t, 2, "small", 3))
			require.NoError(t, err)
			rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Ops[OpPoll].Count == 2 },
				"the reader read no more once the big answer filled the socket")
			_, err = conn.Write(slices.Concat(luFinish(t, 1), luFinish(t, 2), pipelinedCall(t, 3, 0, 15 /* nodeInfo */, nil)))
			require.NoError(t, err)
			rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Ops[OpNodeInfo].Count == 1 },
				"the Finishes were not read")

			stopped := make(chan struct{})
			go func() {
				b.srv.Stop()
				close(stopped)
			}()
			<-b.srv.closeAll
			require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
			got := luReadReturns(t, capnp.NewDecoder(conn), 1, 2, 3)
			require.Equal(t, map[uint32]int{1: 4, 2: 3, 3: 0}, got, "items in each Return")
			<-stopped

			luRequireGivenBack(t, b, "small", 3)
			st, err := b.store.Stats(ctx, storage.StatsParams{Queue: "big", Now: b.clock.Now()})
			require.NoError(t, err)
			require.EqualValues(t, 4, st[0].Inflight, "the items of an answer partly written when its Finish came are the client's")
		})
	}
}

// rs74Transport is a transport.Transport whose RecvMessage hands out the
// messages of in and whose Send runs onSend (under test control).
type rs74Transport struct {
	transport.Transport // nil: only the methods below are used
	in                  chan *capnp.Message
	onSend              func()
}

type rs74In struct{ m *capnp.Message }

func (i rs74In) Message() rpccp.Message {
	r, _ := rpccp.ReadRootMessage(i.m)
	return r
}
func (rs74In) Release() {}

type rs74Out struct {
	t *rs74Transport
	m rpccp.Message
}

func (o rs74Out) Send() error {
	o.t.onSend()
	return nil
}
func (o rs74Out) Message() rpccp.Message { return o.m }
func (rs74Out) Release()                 {}

func (t *rs74Transport) RecvMessage() (transport.IncomingMessage, error) {
	return rs74In{<-t.in}, nil
}

func (t *rs74Transport) NewMessage() (transport.OutgoingMessage, error) {
	_, seg := capnp.NewMultiSegmentMessage(nil)
	m, err := rpccp.NewRootMessage(seg)
	if err != nil {
		return nil, err
	}
	return rs74Out{t: t, m: m}, nil
}

func rs74Call(t *testing.T, qid uint32) *capnp.Message {
	t.Helper()
	msg, seg := capnp.NewMultiSegmentMessage(nil)
	m, err := rpccp.NewRootMessage(seg)
	require.NoError(t, err)
	call, err := m.NewCall()
	require.NoError(t, err)
	call.SetQuestionId(qid)
	return msg
}

// TestReviewStop74_OwedReturnsReusedQuestionID: the client reuses a
// question id as soon as it has the Return (and sent its Finish), which
// may be before the node's Send of that Return has come back. The new
// call under the id is owed its answer all the same: Stop must wait for
// it, not close the connection with it unanswered.
// Found by review (session 74): owedReturns kept a set of ids, and the
// late paid() of the first Return removed the second call's entry.
func TestReviewStop74_OwedReturnsReusedQuestionID(t *testing.T) {
	t.Parallel()
	tr := &rs74Transport{in: make(chan *capnp.Message, 2)}
	owed := newOwedReturns(ctxT(t), tr)
	tr.in <- rs74Call(t, 7)
	_, err := owed.RecvMessage()
	require.NoError(t, err)

	out, err := owed.NewMessage()
	require.NoError(t, err)
	ret, err := out.Message().NewReturn()
	require.NoError(t, err)
	ret.SetAnswerId(7)
	// While the Return is being written, the client has read it and
	// sends its next call under the same id.
	tr.onSend = func() {
		tr.in <- rs74Call(t, 7)
		_, err := owed.RecvMessage()
		require.NoError(t, err)
	}
	require.NoError(t, out.Send())
	out.Release()

	select {
	case <-owed.stop():
		t.Fatal("Stop would close the connection with the second call under id 7 unanswered")
	default:
	}
}
