package rpc

import (
	"sync/atomic"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"

	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// TestReplyGate_SpentBudgetPollsClaimNothing: a client that never reads
// its answers, with its reply budget spent (one poll's answer of 16 MiB
// waits for a socket that takes no more), sends many pipelined polls on a
// queue with items ready: the poll the reader still takes is answered
// empty without touching the store, and the reader takes no more.
// Found by review (session 70): such a poll claimed its items (a store
// write, and an attempt counted) only for trimPoll to give them back (a
// second write) because the budget was spent, and a client that went on
// sending polls made the node churn its queue's items without progress.
func TestReplyGate_SpentBudgetPollsClaimNothing(t *testing.T) {
	t.Parallel()
	var rs *rocksstore.Store
	f := rocksWith(rocksstore.Options{Sync: rocksstore.SyncAlways}, &rs)
	const limit = 256 << 10
	b := setup(t, bundleOpts{factory: f, mutate: func(c *ServerConfig) {
		c.Engine = EngineLean
		c.ConnReplyLimitBytes = limit
		c.ReplyStallTimeout = time.Hour // the mock clock never gets there
	}})
	c := b.dial()
	ctx := ctxT(t)
	_, err := c.Enqueue(ctx, "big", payloads(64, 256<<10)) // 16 MiB
	require.NoError(t, err)
	_, err = c.Enqueue(ctx, "small", payloads(64, 64))
	require.NoError(t, err)

	// One poll takes all of "big": more than the socket's buffers hold.
	// A writer of the connection waits for the socket with the rest of it
	// (lean_write.go, spill), and answers made meanwhile queue behind it.
	conn := rawConn(t, b)
	sendPolls(t, conn, "big", 1, 64)
	m := b.srv.Metrics
	polls := func() uint64 { return m().Ops[OpPoll].Count }
	rpctest.Eventually(t, 30*time.Second, func() bool { return polls() == 1 && m().ReplyBytesQueued == 0 })
	// A long poll parks, and the reader goes back to reading the socket;
	// items it claims then make an answer of 1 MiB, queued: the budget is
	// spent while the reader reads.
	_, err = conn.Write(pipelinedCall(t, 2, 0, 1 /* poll */, waitPollParams("later", 64, time.Minute)))
	require.NoError(t, err)
	rpctest.Eventually(t, 30*time.Second, func() bool { return m().Waiters == 1 })
	_, err = c.Enqueue(ctx, "later", payloads(64, 16<<10))
	require.NoError(t, err)
	rpctest.Eventually(t, 30*time.Second, func() bool { return polls() == 2 && m().ReplyBytesQueued > limit })
	before := rs.Metrics()

	// The budget is spent: polls of "small", pipelined.
	const more = 50
	for i := range more {
		_, err := conn.Write(pipelinedCall(t, uint32(100+i), 0, 1 /* poll */, waitPollParams("small", 4, 0)))
		require.NoError(t, err)
	}
	// The reader was reading the socket when the budget was spent: it
	// takes the first of them, answers it, and then waits for the budget.
	rpctest.Eventually(t, 30*time.Second, func() bool { return polls() == 3 })
	after := rs.Metrics()
	require.Equal(t, before.Polls, after.Polls, "a poll taken while the budget was spent reached the store")
	require.Equal(t, before.Claimed, after.Claimed, "a poll taken while the budget was spent claimed items")
	st, err := c.Stats(ctx, "small")
	require.NoError(t, err)
	require.Len(t, st, 1)
	require.Zero(t, st[0].Delivered, "no item of \"small\" was delivered")
}

// waitPollParams builds a poll's params: max items of queue, leased for an
// hour, waiting up to wait.
func waitPollParams(queue string, max uint32, wait time.Duration) func(rpccp.Payload) error {
	return func(params rpccp.Payload) error {
		p, err := schema.NewQueue_poll_Params(params.Segment())
		if err != nil {
			return err
		}
		if err := p.SetQueue(queue); err != nil {
			return err
		}
		p.SetMax(max)
		p.SetLeaseMs(uint64(time.Hour / time.Millisecond))
		p.SetWaitMs(uint64(wait / time.Millisecond))
		return params.SetContent(p.ToPtr())
	}
}

// TestReplyGate_SpentBudgetGoCapnpPollsClaimNothing: on the go-capnp
// engine (its Queue interface, and Queueber's polls through Conn.Poll),
// a poll taken while the connection's reply budget is spent answers
// empty without calling the store, as on the lean engine. Found by review
// (session 70) on the lean engine; the go-capnp paths had the same claim
// and give-back for nothing.
func TestReplyGate_SpentBudgetGoCapnpPollsClaimNothing(t *testing.T) {
	t.Parallel()
	var rs *rocksstore.Store
	f := rocksWith(rocksstore.Options{Sync: rocksstore.SyncNone}, &rs)
	b := setup(t, bundleOpts{factory: f, mutate: func(c *ServerConfig) { c.Engine = EngineGoCapnp }})
	ctx := ctxT(t)
	_, err := b.srv.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: payloads(4, 64)})
	require.NoError(t, err)

	// A gate whose budget one unwritten answer has spent.
	var total atomic.Int64
	gate := newReplyGate(ctx, func() {}, 1, time.Hour, b.clock, &total)
	held, seg := capnp.NewSingleSegmentMessage(nil)
	_, err = capnp.NewRootStruct(seg, capnp.ObjectSize{DataSize: 8})
	require.NoError(t, err)
	gate.add(held)
	require.True(t, gate.over())

	before := rs.Metrics()
	p := storage.PollParams{Queue: "q", Max: 4, Lease: time.Minute}
	c := &Conn{s: b.srv, gate: gate, ctx: ctx}
	pr, err := c.Poll(ctx, nil, p, 0)
	require.NoError(t, err)
	require.Empty(t, pr.Items, "Conn.Poll with the budget spent")

	q := &queueServer{s: b.srv, gate: gate, connCtx: ctx}
	_, seg = capnp.NewSingleSegmentMessage(nil)
	args, err := schema.NewRootQueue_poll_Params(seg)
	require.NoError(t, err)
	require.NoError(t, args.SetQueue("q"))
	args.SetMax(4)
	args.SetLeaseMs(60_000)
	_, seg = capnp.NewSingleSegmentMessage(nil)
	res, err := schema.NewRootQueue_poll_Results(seg)
	require.NoError(t, err)
	require.NoError(t, q.poll(ctx, args, res))
	items, err := res.Items()
	require.NoError(t, err)
	require.Zero(t, items.Len(), "the Queue interface's poll with the budget spent")

	after := rs.Metrics()
	require.Equal(t, before.Polls, after.Polls, "a poll taken while the budget was spent reached the store")
	require.Equal(t, before.Claimed, after.Claimed, "a poll taken while the budget was spent claimed items")
}

// TestReplyGate_ListingAnswerCountedBeforeItsSlotIsFreed: on the lean
// engine (a connection that counts its frames when it queues them) a
// peek's answer is counted in the reply budget before its building slot
// is given up. It was counted only when queued, after the slot was free:
// peeks running on goroutines of their own (RocksDB with sync=always)
// each built an answer in that gap, past the budget
// (TestServer_UnreadAnswersAreBounded failed in CI, session 73).
func TestReplyGate_ListingAnswerCountedBeforeItsSlotIsFreed(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	ctx := ctxT(t)
	var total atomic.Int64
	gate := newReplyGate(ctx, func() {}, 1<<20, time.Hour, b.clock, &total)
	q := &queueServer{s: b.srv, gate: gate, connCtx: ctx, framesCounted: true}
	for _, op := range []Op{OpPeek, OpDeadList, OpStats} {
		_, seg := capnp.NewSingleSegmentMessage(nil)
		res, err := schema.NewRootQueue_peek_Results(seg)
		require.NoError(t, err)
		require.NoError(t, q.begin(op).finish(res, nil, func() error {
			_, err := res.NewItems(100)
			return err
		}))
		if op == OpStats {
			// Not a listing: counted when the connection queues it.
			require.Zero(t, gate.Pending(), "%v counted twice", op)
			continue
		}
		require.Positive(t, gate.Pending(), "%v: its slot is free and its answer counted nowhere", op)
		gate.done(res.Message())
	}
}
