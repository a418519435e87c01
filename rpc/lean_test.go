package rpc

import (
	"net"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/schema"
)

// Protocol-level tests of the lean engine: raw rpc.capnp messages for what
// the Go client never sends (an early Finish, a Release of the bootstrap
// capability, unknown ids, an Abort).

// rawRPC is a hand-driven Cap'n Proto RPC client.
type rawRPC struct {
	t    *testing.T
	conn net.Conn
	dec  *capnp.Decoder
}

// newRaw opens a raw connection to b's server.
func newRaw(t *testing.T, b *testBundle) *rawRPC {
	t.Helper()
	conn := rawConn(t, b)
	return &rawRPC{t: t, conn: conn, dec: capnp.NewDecoder(conn)}
}

func (r *rawRPC) send(build func(m rpccp.Message) error) {
	r.t.Helper()
	msg, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	require.NoError(r.t, err)
	m, err := rpccp.NewRootMessage(seg)
	require.NoError(r.t, err)
	require.NoError(r.t, build(m))
	require.NoError(r.t, capnp.NewEncoder(r.conn).Encode(msg))
}

func (r *rawRPC) recv() rpccp.Message {
	r.t.Helper()
	require.NoError(r.t, r.conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	msg, err := r.dec.Decode()
	require.NoError(r.t, err)
	m, err := rpccp.ReadRootMessage(msg)
	require.NoError(r.t, err)
	return m
}

// recvReturn reads messages until the Return of question qid.
func (r *rawRPC) recvReturn(qid uint32) rpccp.Return {
	r.t.Helper()
	for {
		m := r.recv()
		if m.Which() != rpccp.Message_Which_return {
			continue
		}
		ret, err := m.Return()
		require.NoError(r.t, err)
		if ret.AnswerId() == qid {
			return ret
		}
	}
}

// recvAbort reads until an Abort and returns its reason, then expects the
// server to close.
func (r *rawRPC) recvAbort() string {
	r.t.Helper()
	for {
		m := r.recv()
		if m.Which() == rpccp.Message_Which_abort {
			ab, err := m.Abort()
			require.NoError(r.t, err)
			reason, err := ab.Reason()
			require.NoError(r.t, err)
			requireClosedByServer(r.t, r.conn)
			return reason
		}
	}
}

// bootstrap asks for the Queue as question qid and returns its import id.
func (r *rawRPC) bootstrap(qid uint32) uint32 {
	r.t.Helper()
	r.send(func(m rpccp.Message) error {
		b, err := m.NewBootstrap()
		b.SetQuestionId(qid)
		return err
	})
	ret := r.recvReturn(qid)
	require.Equal(r.t, rpccp.Return_Which_results, ret.Which())
	p, err := ret.Results()
	require.NoError(r.t, err)
	ct, err := p.CapTable()
	require.NoError(r.t, err)
	require.Equal(r.t, 1, ct.Len())
	require.Equal(r.t, rpccp.CapDescriptor_Which_senderHosted, ct.At(0).Which())
	return ct.At(0).SenderHosted()
}

// call sends a Queue call of method as question qid on target, with params
// filled by place (nil: empty).
func (r *rawRPC) call(qid uint32, method uint16, target func(rpccp.MessageTarget) error, place func(capnp.Struct) error) {
	r.t.Helper()
	r.send(func(m rpccp.Message) error {
		c, err := m.NewCall()
		if err != nil {
			return err
		}
		c.SetQuestionId(qid)
		c.SetInterfaceId(schema.Queue_TypeID)
		c.SetMethodId(method)
		tg, err := c.NewTarget()
		if err != nil {
			return err
		}
		if err := target(tg); err != nil {
			return err
		}
		p, err := c.NewParams()
		if err != nil {
			return err
		}
		args, err := capnp.NewStruct(c.Segment(), capnp.ObjectSize{DataSize: 24, PointerCount: 4})
		if err != nil {
			return err
		}
		if place != nil {
			if err := place(args); err != nil {
				return err
			}
		}
		return p.SetContent(args.ToPtr())
	})
}

func onImport(id uint32) func(rpccp.MessageTarget) error {
	return func(t rpccp.MessageTarget) error { t.SetImportedCap(id); return nil }
}

// finish sends the Finish of qid; releaseCaps releases the capabilities
// of its results (the protocol's default; a client that keeps them, as
// after a bootstrap, says false).
func (r *rawRPC) finish(qid uint32, releaseCaps bool) {
	r.t.Helper()
	r.send(func(m rpccp.Message) error {
		f, err := m.NewFinish()
		f.SetQuestionId(qid)
		f.SetReleaseResultCaps(releaseCaps)
		return err
	})
}

// requireNodeInfo checks that the Return of qid carries nodeInfo results.
func requireNodeInfoReturn(t *testing.T, ret rpccp.Return) {
	t.Helper()
	require.Equal(t, rpccp.Return_Which_results, ret.Which(), "%v", ret)
	p, err := ret.Results()
	require.NoError(t, err)
	c, err := p.Content()
	require.NoError(t, err)
	info, err := schema.Queue_nodeInfo_Results(c.Struct()).Info()
	require.NoError(t, err)
	require.Equal(t, uint32(1000), info.MaxBatch())
}

func requireException(t *testing.T, ret rpccp.Return, contains string) {
	t.Helper()
	require.Equal(t, rpccp.Return_Which_exception, ret.Which())
	e, err := ret.Exception()
	require.NoError(t, err)
	reason, err := e.Reason()
	require.NoError(t, err)
	require.Contains(t, reason, contains)
}

const (
	methodPoll     = 1
	methodNodeInfo = 15
)

func TestLean_Protocol(t *testing.T) {
	t.Parallel()
	lean := bundleOpts{mutate: func(c *ServerConfig) { c.Engine = EngineLean }}

	t.Run("PipelinedOnBootstrap", func(t *testing.T) {
		t.Parallel()
		b := setup(t, lean)
		r := newRaw(t, b)
		r.send(func(m rpccp.Message) error {
			bs, err := m.NewBootstrap()
			bs.SetQuestionId(0)
			return err
		})
		r.call(1, methodNodeInfo, func(tg rpccp.MessageTarget) error {
			pa, err := tg.NewPromisedAnswer()
			pa.SetQuestionId(0)
			return err
		}, nil)
		requireNodeInfoReturn(t, r.recvReturn(1))
	})

	t.Run("FinishBeforeReturnEndsParkedPoll", func(t *testing.T) {
		t.Parallel()
		b := setup(t, lean)
		r := newRaw(t, b)
		boot := r.bootstrap(0)
		r.call(1, methodPoll, onImport(boot), func(s capnp.Struct) error {
			p := schema.Queue_poll_Params(s)
			p.SetMax(1)
			p.SetWaitMs(50_000)
			return p.SetQueue("q")
		})
		rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		r.finish(1, true)
		r.recvReturn(1) // a Return still comes, whatever it says
		rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Waiters == 0 })
		// The question id is free again.
		r.call(1, methodNodeInfo, onImport(boot), nil)
		requireNodeInfoReturn(t, r.recvReturn(1))
	})

	t.Run("ReleaseOfBootstrapCap", func(t *testing.T) {
		t.Parallel()
		b := setup(t, lean)
		r := newRaw(t, b)
		boot := r.bootstrap(0)
		r.finish(0, false)
		r.send(func(m rpccp.Message) error {
			rel, err := m.NewRelease()
			rel.SetId(boot)
			rel.SetReferenceCount(1)
			return err
		})
		r.call(1, methodNodeInfo, onImport(boot), nil)
		requireException(t, r.recvReturn(1), "unknown export")
		// A new bootstrap serves again.
		boot = r.bootstrap(2)
		r.call(3, methodNodeInfo, onImport(boot), nil)
		requireNodeInfoReturn(t, r.recvReturn(3))
	})

	t.Run("CallOnUnknownImport", func(t *testing.T) {
		t.Parallel()
		b := setup(t, lean)
		r := newRaw(t, b)
		boot := r.bootstrap(0)
		r.call(1, methodNodeInfo, onImport(boot+77), nil)
		requireException(t, r.recvReturn(1), "unknown export")
		r.call(2, 99, onImport(boot), nil)
		requireException(t, r.recvReturn(2), "not implemented")
		r.call(3, methodNodeInfo, onImport(boot), nil)
		requireNodeInfoReturn(t, r.recvReturn(3))
	})

	t.Run("CallPipelinedOnUnknownQuestion", func(t *testing.T) {
		t.Parallel()
		b := setup(t, lean)
		r := newRaw(t, b)
		r.call(1, methodNodeInfo, func(tg rpccp.MessageTarget) error {
			pa, err := tg.NewPromisedAnswer()
			pa.SetQuestionId(42)
			return err
		}, nil)
		requireException(t, r.recvReturn(1), "unknown or finished question id 42")
	})

	t.Run("FinishOfUnknownQuestionAborts", func(t *testing.T) {
		t.Parallel()
		b := setup(t, lean)
		r := newRaw(t, b)
		r.bootstrap(0)
		r.finish(999, true)
		require.Contains(t, r.recvAbort(), "finish of unknown question id 999")
		requireServing(t, b)
	})

	// Questions without a Finish are bounded: the node keeps an answer
	// for each until its Finish. Finished ones make room again.
	t.Run("TooManyOpenQuestionsAborts", func(t *testing.T) {
		t.Parallel()
		const limit = 8
		b := setup(t, bundleOpts{mutate: func(c *ServerConfig) { c.Engine, c.maxOpenQuestions = EngineLean, limit }})
		require.Contains(t, abortPastOpenQuestions(t, b, limit), "more than 8 questions without a Finish")
		requireServing(t, b)
	})

	t.Run("DuplicateQuestionAborts", func(t *testing.T) {
		t.Parallel()
		b := setup(t, lean)
		r := newRaw(t, b)
		r.bootstrap(0)
		r.send(func(m rpccp.Message) error {
			bs, err := m.NewBootstrap()
			bs.SetQuestionId(0) // not finished: still in use
			return err
		})
		require.Contains(t, r.recvAbort(), "question id 0 is in use")
	})

	t.Run("ReleaseOfUnknownExportAborts", func(t *testing.T) {
		t.Parallel()
		b := setup(t, lean)
		r := newRaw(t, b)
		boot := r.bootstrap(0)
		r.send(func(m rpccp.Message) error {
			rel, err := m.NewRelease()
			rel.SetId(boot)
			rel.SetReferenceCount(2)
			return err
		})
		require.Contains(t, r.recvAbort(), "release of 2 references")
	})

	t.Run("AbortFromClientCloses", func(t *testing.T) {
		t.Parallel()
		b := setup(t, lean)
		r := newRaw(t, b)
		r.bootstrap(0)
		r.send(func(m rpccp.Message) error {
			ab, err := m.NewAbort()
			if err != nil {
				return err
			}
			return ab.SetReason("bye")
		})
		requireClosedByServer(t, r.conn)
		rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 0 })
	})

	t.Run("UnknownMessageIsEchoedUnimplemented", func(t *testing.T) {
		t.Parallel()
		b := setup(t, lean)
		r := newRaw(t, b)
		r.send(func(m rpccp.Message) error {
			p, err := m.NewProvide()
			p.SetQuestionId(7)
			return err
		})
		m := r.recv()
		require.Equal(t, rpccp.Message_Which_unimplemented, m.Which())
		u, err := m.Unimplemented()
		require.NoError(t, err)
		require.Equal(t, rpccp.Message_Which_provide, u.Which())
		// The connection goes on.
		boot := r.bootstrap(0)
		r.call(1, methodNodeInfo, onImport(boot), nil)
		requireNodeInfoReturn(t, r.recvReturn(1))
	})

	t.Run("GarbageAbortsWithReason", func(t *testing.T) {
		t.Parallel()
		b := setup(t, lean)
		r := newRaw(t, b)
		// A well-framed Message saying "call" whose call pointer points
		// past the end of the segment.
		_, err := r.conn.Write([]byte{
			0, 0, 0, 0, 3, 0, 0, 0, // header: one segment of 3 words
			0, 0, 0, 0, 1, 0, 1, 0, // root: struct, 1 data word, 1 pointer
			2, 0, 0, 0, 0, 0, 0, 0, // which = call
			0xa0, 0x0f, 0, 0, 1, 0, 0, 0, // struct pointer 1000 words on
		})
		require.NoError(t, err)
		require.Contains(t, r.recvAbort(), "read call")
		requireServing(t, b)
	})
}

// TestSubscribe_PipelinedCancel: subscribe(...).subscription.cancel() sent
// before subscribe returns (promise pipelining on a returned capability)
// ends the subscription, and the consumer is released.
func TestSubscribe_PipelinedCancel(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c := b.dial()
	ctx := ctxT(t)
	q, done, err := c.capnpConn(ctx)
	require.NoError(t, err)
	sub := &Subscription{c: c, queue: "q", ch: make(chan Delivery, 1), stop: make(chan struct{}), connDone: done, ended: make(chan struct{})}
	consumer := schema.Consumer_ServerToClient(consumerServer{sub: sub})
	f, release := q.Subscribe(ctx, func(p schema.Queue_subscribe_Params) error {
		p.SetPrefetch(1)
		if err := p.SetConsumer(consumer); err != nil {
			return err
		}
		return p.SetQueue("q")
	})
	defer release()
	cf, cancelRelease := f.Subscription().Cancel(ctx, nil)
	defer cancelRelease()
	_, err = cf.Struct()
	require.NoError(t, err)
	res, err := f.Struct()
	require.NoError(t, err)
	st, err := res.Status()
	require.NoError(t, err)
	require.Equal(t, schema.ErrorCode_none, st.Code())
	// The pusher ends and drops the consumer: its channel closes.
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Subscriptions == 0 })
	select {
	case _, ok := <-sub.ch:
		require.False(t, ok, "a delivery on a cancelled subscription")
	case <-time.After(10 * time.Second):
		t.Fatal("the consumer was not released")
	}
}
