package rpc

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
)

// Review (session 74): on the go-capnp engine a call did not return when
// its ctx ended while go-capnp's send was blocked (the node stopped
// reading): its future waited for the send. README: "Every call returns
// when its ctx ends, also when the node stopped reading".

// TestCapnpCtx_CallsReturnWhenNodeStopsReading: an Enqueue of 24 MiB to a
// node that stopped reading, half written, returns once its ctx ends, as
// ErrOutcomeUnknown and the ctx's error; a Stats and a Poll queued behind
// it return at their ctx's end too, with its error (not sent: no unknown
// for them, they do not change the queue).
func TestCapnpCtx_CallsReturnWhenNodeStopsReading(t *testing.T) {
	t.Parallel()
	n := startStallNode(t, nil)
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	c, err := Dial(dctx, n.addr, ClientOptions{Engine: ClientEngineGoCapnp})
	dcancel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	nc := n.conn(t)
	// Runs before c.Close: the connection's end ends the go-capnp calls
	// left running in the background.
	t.Cleanup(func() { _ = nc.Close() })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := rpctest.Go(func() error {
		_, err := c.Enqueue(ctx, "q", payloads(1, 24<<20))
		return err
	})
	head := make([]byte, 64<<10)
	_, err = io.ReadFull(nc, head) // the write has begun, and stalls
	require.NoError(t, err)

	sctx, scancel := context.WithCancel(context.Background())
	statsc := rpctest.Go(func() error {
		_, err := c.Stats(sctx, "q")
		return err
	})
	pctx, pcancel := context.WithCancel(context.Background())
	pollc := rpctest.Go(func() error {
		_, err := c.Poll(pctx, "q", 1, time.Second, 0)
		return err
	})

	cancel()
	err = rpctest.Recv(t, errc, 20*time.Second)
	require.ErrorIs(t, err, ErrOutcomeUnknown, "the request was half written: %v", err)
	require.ErrorIs(t, err, context.Canceled)

	scancel()
	err = rpctest.Recv(t, statsc, 20*time.Second)
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, ErrOutcomeUnknown)

	pcancel()
	err = rpctest.Recv(t, pollc, 20*time.Second)
	require.ErrorIs(t, err, context.Canceled)
}

// TestCapnpCtx_WaitReleasesWhenCallEnds: a call given up for its ctx
// keeps running; its release runs only once it has ended, and its result,
// not the caller's, goes to after (taken false: a poll's answer is then
// given back).
func TestCapnpCtx_WaitReleasesWhenCallEnds(t *testing.T) {
	t.Parallel()
	unblock := make(chan struct{})
	released := make(chan struct{})
	type res struct {
		err   error
		taken bool
	}
	afterc := make(chan res, 1)
	w := &capnpWait[int]{
		get:     func() (int, error) { <-unblock; return 7, nil },
		release: func() { close(released) },
		after: func(r int, err error, taken bool) (int, error) {
			afterc <- res{err, taken}
			return r, err
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	waitc := rpctest.Go(func() error {
		_, err := w.wait(ctx)
		return err
	})
	cancel()
	require.ErrorIs(t, rpctest.Recv(t, waitc, 10*time.Second), context.Canceled)
	w.releaseOnce()
	select {
	case <-released:
		t.Fatal("released while the call still runs")
	default:
	}
	close(unblock)
	rpctest.Recv(t, released, 10*time.Second)
	got := rpctest.Recv(t, afterc, 10*time.Second)
	require.False(t, got.taken)
	require.NoError(t, got.err)
	w.releaseOnce() // once only: a second close would panic

	// A result that came first is the caller's, released when it asks.
	released2 := make(chan struct{})
	w2 := &capnpWait[int]{get: func() (int, error) { return 0, errors.New("boom") }, release: func() { close(released2) }}
	_, err := w2.wait(context.Background())
	require.EqualError(t, err, "boom")
	select {
	case <-released2:
		t.Fatal("released before the caller asked")
	default:
	}
	w2.releaseOnce()
	rpctest.Recv(t, released2, 10*time.Second)
}
