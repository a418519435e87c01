package rpc

import (
	"net"
	"testing"
	"time"

	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// sendCalls bootstraps (question 0) and sends n calls of method on the
// bootstrap answer (questions 1..n), their parameters set by params,
// never reading anything back. A write that fails (the node closed the
// connection) ends it quietly when quiet, else fails the test.
func sendCalls(t *testing.T, conn net.Conn, n int, method uint16, quiet bool, params func(rpccp.Payload) error) {
	t.Helper()
	_, err := conn.Write(bootstrapMsg(t))
	require.NoError(t, err)
	for i := 1; i <= n; i++ {
		_, err := conn.Write(pipelinedCall(t, uint32(i), 0, method, params))
		if err != nil && quiet {
			return
		}
		require.NoError(t, err)
	}
}

// sendPeeks sends n peek calls of limit items on queue (sendCalls).
func sendPeeks(t *testing.T, conn net.Conn, queue string, n int, limit uint32) {
	t.Helper()
	sendCalls(t, conn, n, 7 /* peek */, false, func(params rpccp.Payload) error {
		p, err := schema.NewQueue_peek_Params(params.Segment())
		if err != nil {
			return err
		}
		if err := p.SetQueue(queue); err != nil {
			return err
		}
		p.SetLimit(limit)
		return params.SetContent(p.ToPtr())
	})
}

// TestServer_UnreadAnswersAreBounded: a client that sends peeks of ~100
// KiB answers and never reads them makes the server stop reading its calls
// once its unsent answers pass ConnReplyLimitBytes, instead of building
// every answer in memory; other clients are served meanwhile; after
// ReplyStallTimeout the connection is closed.
func TestServer_UnreadAnswersAreBounded(t *testing.T) {
	t.Parallel()
	const limit = 1 << 20
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) {
		c.ConnReplyLimitBytes = limit
		c.ReplyStallTimeout = time.Minute
	}})
	c := b.dial()
	ctx := ctxT(t)
	for range 10 {
		_, err := c.Enqueue(ctx, "big", payloads(10, 1<<10))
		require.NoError(t, err)
	}
	const calls = 400 // 400 answers of ~100 KiB: 40 MiB if all were built
	conn := rawConn(t, b)
	go sendPeeks(t, conn, "big", calls, 100)

	peeks := func() uint64 { return b.srv.Metrics().Ops[OpPeek].Count }
	// The server answers until the socket buffers and the budget are full,
	// then stops reading the connection.
	var last uint64
	rpctest.Eventually(t, 30*time.Second, func() bool {
		n := peeks()
		stable := n > 0 && n == last
		last = n
		time.Sleep(100 * time.Millisecond) // observation interval, not synchronisation
		return stable
	})
	t.Logf("peeks %d errors %d queued %d", peeks(), b.srv.Metrics().Ops[OpPeek].Errors, b.srv.Metrics().ReplyBytesQueued)
	require.Less(t, peeks(), uint64(calls), "every call was answered: the server kept reading")
	require.LessOrEqual(t, b.srv.Metrics().ReplyBytesQueued, int64(limit+maxBuilding*120<<10), "unsent answers over the budget (limit + the answers in the making)")

	// Another client is served meanwhile.
	_, err := c.Stats(ctx, "big")
	require.NoError(t, err)

	// The stalled connection is dropped after ReplyStallTimeout (advanced
	// repeatedly: a waiter may arm its timer after an earlier advance).
	rpctest.Eventually(t, 30*time.Second, func() bool {
		b.clock.Add(time.Minute)
		return b.srv.Metrics().ConnsOpen == 1 // only c is left
	})
	requireClosedByServer(t, conn)
	rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().ReplyBytesQueued == 0 })
	_, err = c.Stats(ctx, "big")
	require.NoError(t, err)
}

// TestServer_NodeInflightBudget: calls parked on one connection (long
// polls) hold the node-wide budget of unanswered request bytes; once it is
// spent the server reads no more calls from any connection, and reading
// resumes when parked calls are answered.
func TestServer_NodeInflightBudget(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) { c.MaxInflightBytes = 2 << 10 }})
	parker, other := b.dial(), b.dial()
	ctx := ctxT(t)
	// Park long polls until the budget is spent (one poll request is a
	// few hundred bytes): the last ones are not even read.
	var polls []<-chan pollOut
	for range 30 {
		polls = append(polls, goPoll(parker, "q", 1, 50*time.Second))
	}
	// Wait until the number of parked polls stops growing: the reader
	// has reached the budget.
	last := -1
	rpctest.Eventually(t, 30*time.Second, func() bool {
		n := b.srv.Metrics().Waiters
		stable := n > 0 && n == last
		last = n
		time.Sleep(200 * time.Millisecond) // observation interval, not synchronisation
		return stable
	})
	parked := b.srv.Metrics().Waiters
	require.Less(t, parked, 30, "every poll was read: no node budget")

	done := make(chan error, 1)
	go func() {
		_, err := other.Stats(ctx, "q")
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("another connection's call was read over the node budget (err %v)", err)
	case <-time.After(300 * time.Millisecond):
	}
	// Items arrive (through the store, as the sweeper would): polls are
	// answered, the budget frees, everything moves again.
	_, err := b.store.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: payloads(30, 8), Now: b.clock.Now()})
	require.NoError(t, err)
	b.srv.Wake([]string{"q"})
	require.NoError(t, <-done)
	got := 0
	for _, ch := range polls {
		o := recvPoll(t, ch)
		require.NoError(t, o.err)
		got += len(o.pr.Items)
	}
	require.Equal(t, 30, got)
}
