package rpc

import (
	"context"
	"slices"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// Tests of what Server.Stop promises a call that ran: "running calls
// finish" means their answers reach the client too. A call the node
// applied (an enqueue, an ack) whose answer the shutdown threw away is
// one the client must treat as failed, retry (a duplicate) or give up on
// (an item it thinks it lost is in the queue). Found by review (session
// 74): Stop counted a call as done when its handler returned and then
// closed every connection, before the answer left: on the lean engine the
// connection's closer did not wait for its writer, and go-capnp's Close
// drops the Returns still queued.

// saStopGatedStore is a store whose enqueue waits until the test
// releases it (once the server is stopping), then goes through: it
// returns as Stop begins waiting for the calls. It hides the store's
// Nonblocking and Async (it embeds only storage.Store), so the lean
// engine runs the enqueue on a goroutine of its own, which writes the
// answer once the handler returned.
type saStopGatedStore struct {
	storage.Store
	entered, release chan struct{}
}

func (s *saStopGatedStore) Enqueue(ctx context.Context, p storage.EnqueueParams) ([]storage.EnqueueResult, error) {
	close(s.entered)
	<-s.release
	return s.Store.Enqueue(ctx, p)
}

// TestShutdown_CallReturningAsStopBeginsIsAnswered: an enqueue whose
// store call returns just as Stop begins waiting for the running calls
// was applied, so its client must get its answer (the item's id), not
// "connection lost". Several rounds, as the handler's return and the
// closing of the connection race.
func TestShutdown_CallReturningAsStopBeginsIsAnswered(t *testing.T) {
	t.Parallel()
	for round := range 12 {
		gated := &saStopGatedStore{entered: make(chan struct{}), release: make(chan struct{})}
		b := setup(t, bundleOpts{factory: storeFactory{"gated", func(t *testing.T) storage.Store {
			gated.Store = memFactory().open(t)
			return gated
		}}})
		c := b.dial()
		type result struct {
			res []storage.EnqueueResult
			err error
		}
		done := make(chan result, 1)
		ctx := ctxT(t)
		go func() {
			res, err := c.Enqueue(ctx, "q", payloads(1, 8))
			done <- result{res, err}
		}()
		<-gated.entered
		stopped := make(chan struct{})
		go func() {
			b.srv.Stop()
			close(stopped)
		}()
		rpctest.Eventually(t, 10*time.Second, b.srv.isStopping, "Stop never began")
		close(gated.release)
		<-stopped
		r := <-done
		require.NoError(t, r.err, "round %d: the enqueue was applied, but its answer never came", round)
		require.Len(t, r.res, 1)
		require.Equal(t, storage.CodeOK, r.res[0].Code)
		st, err := b.store.Stats(ctx, storage.StatsParams{Queue: "q", Now: b.clock.Now()})
		require.NoError(t, err)
		require.Len(t, st, 1)
		require.EqualValues(t, 1, st[0].Ready, "round %d", round)
	}
}

// TestShutdown_AnswerQueuedBehindUnreadAnswersIsWritten: a client has a
// 4 MiB poll answer on its way (more than the socket buffers hold) and
// enqueues applied behind it, whose answers wait in the node's queue,
// when Stop comes. The client reads only once Stop has closed (and so
// would have closed the connection). It must get every answer, the
// enqueues' included, before the connection ends.
func TestShutdown_AnswerQueuedBehindUnreadAnswersIsWritten(t *testing.T) {
	t.Parallel()
	const enqueues = 16
	b := setup(t, bundleOpts{factory: memFactory(), transport: "unix"})
	ctx := ctxT(t)
	c := b.dial()
	_, err := c.Enqueue(ctx, "big", payloads(8, 512<<10))
	require.NoError(t, err)
	require.NoError(t, c.Close())

	conn := rawDial(t, b)
	_, err = conn.Write(slices.Concat(bootstrapMsg(t), pipelinedCall(t, 1, 0, 1 /* poll */, pollParamsRaw("big", 8))))
	require.NoError(t, err)
	// The enqueues go once the big answer fills the socket: their
	// answers wait behind it.
	rpctest.Eventually(t, 10*time.Second, func() bool { return peekLen(t, conn) > 1<<10 }, "the big answer was not written")
	var calls [][]byte
	want := []uint32{0, 1}
	for i := range uint32(enqueues) {
		calls = append(calls, pipelinedCall(t, 2+i, 0, 0 /* enqueue */, rvhEnqueueArg("small", 1)))
		want = append(want, 2+i)
	}
	_, err = conn.Write(slices.Concat(calls...))
	require.NoError(t, err)
	rpctest.Eventually(t, 10*time.Second, func() bool {
		st, err := b.store.Stats(ctx, storage.StatsParams{Queue: "small", Now: b.clock.Now()})
		return err == nil && len(st) == 1 && st[0].Ready == enqueues
	}, "the enqueues were not applied")

	stopped := make(chan struct{})
	go func() {
		b.srv.Stop()
		close(stopped)
	}()
	<-b.srv.closeAll // the calls are drained: the connections go
	got := luReadReturns(t, capnp.NewDecoder(conn), want...)
	require.Equal(t, 8, got[1], "the poll's answer")
	<-stopped
}

// TestShutdown_ClientNotReadingDoesNotHoldStop: a client that reads none
// of its answers holds Stop for ReplyStallTimeout at most (here with no
// reply budget, so no stall watchdog either: only Stop's own bound). Its
// answers then go as when any connection ends: a poll answer of which
// not a byte was written gives its items back (ready again at once, the
// claim taken back), and one partly written is the client's.
func TestShutdown_ClientNotReadingDoesNotHoldStop(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{factory: memFactory(), transport: "unix", mutate: func(c *ServerConfig) {
		c.ConnReplyLimitBytes = -1
		// Short, so that the steps below (the bound may be armed after
		// the first) cannot reach the polls' 60 s leases.
		c.ReplyStallTimeout = time.Millisecond
	}})
	ctx := ctxT(t)
	c := b.dial()
	_, err := c.Enqueue(ctx, "big", payloads(8, 512<<10))
	require.NoError(t, err)
	_, err = c.Enqueue(ctx, "small", payloads(3, 8))
	require.NoError(t, err)
	require.NoError(t, c.Close())

	conn := rawDial(t, b)
	_, err = conn.Write(slices.Concat(bootstrapMsg(t), pipelinedCall(t, 1, 0, 1 /* poll */, pollParamsRaw("big", 8))))
	require.NoError(t, err)
	// The small poll goes once the big answer fills the socket: its
	// answer waits behind, not a byte of it written.
	rpctest.Eventually(t, 10*time.Second, func() bool { return peekLen(t, conn) > 1<<10 }, "the big answer was not written")
	_, err = conn.Write(pipelinedCall(t, 2, 0, 1 /* poll */, pollParamsRaw("small", 3)))
	require.NoError(t, err)
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Ops[OpPoll].Count == 2 })

	stopped := make(chan struct{})
	go func() {
		b.srv.Stop()
		close(stopped)
	}()
	<-b.srv.closeAll
	// The bound is armed as the connection's end begins: advance until
	// it fires.
	rpctest.Eventually(t, 10*time.Second, func() bool {
		b.clock.Add(time.Millisecond)
		select {
		case <-stopped:
			return true
		default:
			return false
		}
	}, "Stop is held by a client that reads nothing")

	st, err := b.store.Stats(ctx, storage.StatsParams{Queue: "small", Now: b.clock.Now()})
	require.NoError(t, err)
	require.EqualValues(t, 3, st[0].Ready, "the items of a poll answer never written are given back")
	pr, err := b.store.Poll(ctx, storage.PollParams{Queue: "small", Max: 10, Lease: time.Minute, Now: b.clock.Now()})
	require.NoError(t, err)
	require.Len(t, pr.Items, 3)
	for _, it := range pr.Items {
		require.EqualValues(t, 1, it.Attempts, "the claim of the answer never written is taken back")
	}
	st, err = b.store.Stats(ctx, storage.StatsParams{Queue: "big", Now: b.clock.Now()})
	require.NoError(t, err)
	require.EqualValues(t, 8, st[0].Inflight, "the items of a partly written answer are the client's")
}
