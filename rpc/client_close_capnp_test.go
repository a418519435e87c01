package rpc

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// The go-capnp client engine's Close and its polls in flight, as
// client_close_test.go for the lean engine (client_drain_capnp.go).

// dialCapnp dials addr with the go-capnp client engine, its give-back
// bounds on a mock clock that never moves.
func dialCapnp(t *testing.T, addr string) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, ClientOptions{Logger: rpctest.Logger(t), Clock: clock.NewMock(), Engine: ClientEngineGoCapnp})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.Nil(t, c.lean)
	require.NotNil(t, c.cpolls)
	return c
}

// pollFunc is a poll of up to 3 items of "q" under an hour's lease: by
// Poll, or by AckPoll.
type pollFunc func(ctx context.Context, c *Client) (storage.PollResult, error)

func pollThree(ctx context.Context, c *Client) (storage.PollResult, error) {
	return c.Poll(ctx, "q", 3, time.Hour, 0)
}

func ackPollThree(ctx context.Context, c *Client) (storage.PollResult, error) {
	_, res, errP := c.AckPoll(ctx, "q", storage.LeaseID{}, nil, 3, time.Hour, 0)
	return res, errP
}

// capnpPollOnTheWire starts poll on a go-capnp engine client through a
// proxy that holds what the node writes, and returns once the node has
// claimed the 3 items of "q" and written its answer (held). giveUp: the
// poll's context ends then, and the poll has returned its error.
func capnpPollOnTheWire(t *testing.T, poll pollFunc, giveUp bool) (b *testBundle, obs, c *Client, p *holdCutProxy, polled chan error) {
	b = setup(t, bundleOpts{})
	obs = b.dial()
	p = newHoldCutProxy(t, b.addr)
	c = dialCapnp(t, p.addr())
	_, err := c.Enqueue(ctxT(t), "q", payloads(3, 8))
	require.NoError(t, err)

	return b, obs, c, p, pollHeldOnTheWire(t, obs, c, p, poll, giveUp)
}

// pollHeldOnTheWire starts poll on c through p, which holds what the node
// writes, and returns once the node has claimed the 3 items of "q" (as
// obs sees) and written its answer (held). giveUp: the poll's context
// ends then, and the poll has returned its error. polled gets the poll's
// error (one for items received through the held proxy).
func pollHeldOnTheWire(t *testing.T, obs, c *Client, p *holdCutProxy, poll pollFunc, giveUp bool) (polled chan error) {
	t.Helper()
	p.hold()
	pctx, pcancel := context.WithCancel(context.Background())
	t.Cleanup(pcancel)
	polled = make(chan error, 1)
	go func() {
		res, err := poll(pctx, c)
		if err == nil {
			err = fmt.Errorf("the poll got %d items through a held proxy", len(res.Items))
		}
		polled <- err
	}()
	rpctest.Eventually(t, 10*time.Second, func() bool {
		_, inflight := queueCounts(t, obs)
		return inflight == 3
	}, "the node did not claim the items")
	rpctest.Eventually(t, 10*time.Second, func() bool { return p.heldBytes() > 0 }, "the node did not write its answer")
	if giveUp {
		pcancel()
		require.ErrorIs(t, rpctest.Recv(t, polled, 10*time.Second), context.Canceled)
	}
	return polled
}

// closeWithCapnpPollAnswerOnTheWire is closeWithPollAnswerOnTheWire on
// the go-capnp client engine: Close comes while the node's answer to a
// poll, holding the 3 items it claimed, is on the wire; the answer is let
// through once Close has begun waiting for it (or has returned without
// waiting: the defect). When the client's connection is gone, the 3
// items must be ready again: nobody received them.
func closeWithCapnpPollAnswerOnTheWire(t *testing.T, poll pollFunc, giveUp bool) {
	b, obs, c, p, polled := capnpPollOnTheWire(t, poll, giveUp)
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	rpctest.Eventually(t, 10*time.Second, func() bool {
		select {
		case err := <-closed:
			closed <- err
			return true
		default:
			return c.cpolls.drainingPolls()
		}
	}, "Close neither returned nor began to wait for the poll's answer")
	p.release() // the answer reaches the client, if it still listens
	require.NoError(t, rpctest.Recv(t, closed, 10*time.Second))
	if !giveUp {
		err := rpctest.Recv(t, polled, 10*time.Second)
		require.True(t, IsDisconnected(err), "the poll Close stopped: %v", err)
	}
	// The client's connection has ended at the node (obs is the other).
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 1 })
	ready, inflight := queueCounts(t, obs)
	require.Equal(t, [2]int64{3, 0}, [2]int64{ready, inflight},
		"ready/inflight after Close: the items of a poll nobody received stay leased to nobody until the lease ends (an hour)")
}

// Found by review (session 74): on the go-capnp client engine, Close
// dropped a poll's answer already on the wire. A consumer stops (its
// poll's context ends) and closes its client at once, while the node's
// answer, holding the items it claimed, is on the wire: go-capnp had
// sent a Finish when the context ended and released the Return unread
// when it came, and Close did not wait for it at all, so the items stayed
// leased until the lease ended.
func TestClientClose_CapnpGivesBackGivenUpPollOnTheWire(t *testing.T) {
	t.Parallel()
	closeWithCapnpPollAnswerOnTheWire(t, pollThree, true)
}

// Found by review (session 74): as above, but Close comes while the
// poll's caller still waits: rpc.Conn.Close failed the call and dropped
// the answer with the connection.
func TestClientClose_CapnpGivesBackOpenPollOnTheWire(t *testing.T) {
	t.Parallel()
	closeWithCapnpPollAnswerOnTheWire(t, pollThree, false)
}

// Found by review (session 74): as above, for the poll of an AckPoll
// (a Consumer's usual call) that Close stops.
func TestClientClose_CapnpGivesBackOpenAckPollOnTheWire(t *testing.T) {
	t.Parallel()
	closeWithCapnpPollAnswerOnTheWire(t, ackPollThree, false)
}

// TestClient_CapnpGivesBackGivenUpPoll: without Close, the answer of a
// poll whose caller gave up (go-capnp sent a Finish and drops the Return)
// is given back when it comes, as on the lean engine
// (leanClient.abandoned), instead of staying leased until the lease ends.
func TestClient_CapnpGivesBackGivenUpPoll(t *testing.T) {
	t.Parallel()
	_, obs, c, p, _ := capnpPollOnTheWire(t, pollThree, true)
	p.release()
	rpctest.Eventually(t, 10*time.Second, func() bool {
		ready, inflight := queueCounts(t, obs)
		return ready == 3 && inflight == 0
	}, "the items of a poll whose caller gave up were not given back")
	// The client goes on: the items are its to poll again.
	res, err := c.Poll(ctxT(t), "q", 3, time.Hour, 0)
	require.NoError(t, err)
	require.Len(t, res.Items, 3)
}

// TestClientClose_CapnpEndsLongPollAtOnce: on the go-capnp engine too,
// Close, which waits for the answers of the polls in flight, tells the
// node to cancel them, so a long poll with nothing to hand out does not
// hold it up. The node's and the client's clocks never move: only the
// cancel can end the poll. A poll once Close has begun is refused.
func TestClientClose_CapnpEndsLongPollAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c := dialCapnp(t, b.addr)
	polled := make(chan error, 1)
	go func() {
		_, err := c.Poll(context.Background(), "q", 1, time.Hour, time.Minute)
		polled <- err
	}()
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 }, "the poll did not reach the node")
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	require.NoError(t, rpctest.Recv(t, closed, 10*time.Second))
	require.True(t, IsDisconnected(rpctest.Recv(t, polled, 10*time.Second)))
	_, err := c.Poll(context.Background(), "q", 1, time.Hour, 0)
	require.True(t, IsDisconnected(err), "a poll after Close: %v", err)
}

// TestClientClose_CapnpPollAnsweredBeforeCloseIsDelivered: a poll whose
// answer its caller read is its caller's: Close gives nothing back.
func TestClientClose_CapnpPollAnsweredBeforeCloseIsDelivered(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	obs := b.dial()
	c := dialCapnp(t, b.addr)
	_, err := c.Enqueue(ctxT(t), "q", payloads(3, 8))
	require.NoError(t, err)
	res, err := c.Poll(ctxT(t), "q", 3, time.Hour, 0)
	require.NoError(t, err)
	require.Len(t, res.Items, 3)
	require.NoError(t, c.Close())
	ready, inflight := queueCounts(t, obs)
	require.Equal(t, [2]int64{0, 3}, [2]int64{ready, inflight}, "ready/inflight after Close")
}
