package rpc

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// TestLeanClient_GiveUpThenReuse: a call whose context ends returns the
// context's error at once (its Finish cancels it on the node); question
// ids are reused and later calls, more than the lazy Finishes allowed,
// work on the same connection.
func TestLeanClient_GiveUpThenReuse(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c := b.dial()
	require.NotNil(t, c.lean, "Dial runs the lean engine by default")
	ctx, cancel := context.WithTimeout(ctxT(t), 100*time.Millisecond)
	defer cancel()
	_, err := c.Poll(ctx, "q", 1, time.Minute, 30*time.Second)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	for i := range 3 * maxLazyFinishes {
		res, err := c.Enqueue(ctxT(t), "q", payloads(1, 8))
		require.NoError(t, err, "call %d", i)
		require.Equal(t, storage.CodeOK, res[0].Code)
	}
	got, err := c.Poll(ctxT(t), "q", 1000, time.Minute, 0)
	require.NoError(t, err)
	require.Len(t, got.Items, 3*maxLazyFinishes)
	c.lean.mu.Lock()
	open := len(c.lean.qs)
	c.lean.mu.Unlock()
	require.Zero(t, open, "no question left open")
}

// TestLeanClient_ConnectionLost: when the node goes away, a parked poll
// ends (the node answers it empty as it stops, or it fails disconnected,
// or, when Stop began before the node read it, unavailable), Done
// closes, and every later call fails with a disconnected error.
func TestLeanClient_ConnectionLost(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c := b.dial()
	type polled struct {
		res storage.PollResult
		err error
	}
	pc := make(chan polled, 1)
	go func() {
		res, err := c.Poll(ctxT(t), "q", 1, time.Minute, 30*time.Second)
		pc <- polled{res, err}
	}()
	rpctest.Eventually(t, 30*time.Second, func() bool {
		c.lean.mu.Lock()
		defer c.lean.mu.Unlock()
		return len(c.lean.qs) == 1
	})
	b.srv.Stop()
	p := rpctest.Recv(t, pc, 30*time.Second)
	if p.err != nil {
		// The client counts the question open once it wrote the call, so
		// Stop may come before the node reads it: then the poll is
		// refused as the node stops (Server.Stop's contract).
		require.True(t, IsDisconnected(p.err) || errors.Is(p.err, ErrUnavailable), "%v", p.err)
	} else {
		require.Empty(t, p.res.Items)
	}
	rpctest.Eventually(t, 30*time.Second, func() bool {
		select {
		case <-c.Done():
			return true
		default:
			return false
		}
	}, "Done not closed after the connection was lost")
	_, err := c.Queues(ctxT(t))
	require.Error(t, err)
	require.True(t, IsDisconnected(err), "%v", err)
}

// TestLeanClient_SubscribeOpensCapnpConn: Subscribe, which needs
// capabilities the lean engine does not host, opens a go-capnp connection
// of its own on first use; the lean one keeps serving.
func TestLeanClient_SubscribeOpensCapnpConn(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c := b.dial()
	_, err := c.Enqueue(ctxT(t), "q", payloads(1, 8))
	require.NoError(t, err)
	require.EqualValues(t, 1, b.srv.Metrics().ConnsOpen)
	sub, err := c.Subscribe(ctxT(t), SubscribeOptions{Queue: "q", Prefetch: 1, Lease: time.Minute})
	require.NoError(t, err)
	d := <-sub.C()
	require.Len(t, d.Items, 1)
	require.Equal(t, payloads(1, 8)[0].Payload, d.Items[0].Payload)
	require.EqualValues(t, 2, b.srv.Metrics().ConnsOpen)
	codes, err := c.Ack(ctxT(t), "q", d.Lease, []storage.ItemID{d.Items[0].ID})
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK}, codes)
	sub.Cancel()
	require.NoError(t, c.Close())
	rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 0 })
}

// TestDial_Engines: the go-capnp engine still serves, and an unknown one
// is refused.
func TestDial_Engines(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c, err := b.dialErr(ClientOptions{Engine: ClientEngineGoCapnp})
	require.NoError(t, err)
	require.Nil(t, c.lean)
	_, err = c.Enqueue(ctxT(t), "q", payloads(2, 8))
	require.NoError(t, err)
	_, err = b.dialErr(ClientOptions{Engine: "fast"})
	require.ErrorIs(t, err, storage.ErrInvalidArgument)
	require.False(t, errors.Is(err, ErrTooManyConns))
}
