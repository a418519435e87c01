package rpc

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// A Producer against a node that accepts its calls and never answers them
// (hostileNode: a real socket): every call ends at its CallTimeout, every
// caller hears that its item's outcome is unknown, and Close and
// CloseContext return.

// dialStalled dials a hostile node that answers the bootstrap and nothing
// else, on the client engine given, and returns the client and the node's
// side of its connection.
func dialStalled(t *testing.T, engine string) (*Client, *hnConn) {
	t.Helper()
	n := startHostileNode(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, n.addr, ClientOptions{Engine: engine})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c, n.conn(t)
}

// enqueueBg enqueues one item without a deadline, and sends its error.
func enqueueBg(p *Producer, errs chan<- error) {
	go func() {
		_, err := p.Enqueue(context.Background(), storage.EnqueueItem{Payload: []byte("x")})
		errs <- err
	}()
}

// recvErr waits for an Enqueue's error; what says what waited.
func recvErr(t *testing.T, errs <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-errs:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s still waits on a node that never answers", what)
		return nil
	}
}

// awaitEnqueueCall waits for the node to read an enqueue call.
func awaitEnqueueCall(t *testing.T, hc *hnConn) {
	t.Helper()
	call := hc.call(t)
	require.Equal(t, mEnqueue.id, call.method)
}

// requireClosed waits until p is closed (Close or CloseContext has
// begun).
func requireClosed(t *testing.T, p *Producer) {
	t.Helper()
	rpctest.Eventually(t, 10*time.Second, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.closed
	}, "the producer was not closed")
}

// requireDrained checks that p has nothing pending, no call in flight and
// no call's cancel left.
func requireDrained(t *testing.T, p *Producer) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	require.Empty(t, p.pending)
	require.Zero(t, p.inflight)
	require.Empty(t, p.calls)
}

// TestProducer_StalledNodeCallTimesOut: found by review (session 74): the
// Producer made its enqueue calls without a bound (context.Background),
// so against a node that never answered every Enqueue without a deadline,
// and Close, waited for good. Each call now ends at CallTimeout (on the
// producer's clock): its callers get an error wrapping
// context.DeadlineExceeded that says the outcome is unknown, the items
// waiting behind it go out in the slot it frees, and Close returns once
// they have ended too. No goroutine is left.
//
// Not parallel: verifyNoLeaks counts every goroutine of the process.
func TestProducer_StalledNodeCallTimesOut(t *testing.T) {
	for _, engine := range []string{ClientEngineLean, ClientEngineGoCapnp} {
		t.Run("engine="+engine, func(t *testing.T) {
			verifyNoLeaks(t)
			c, hc := dialStalled(t, engine)
			clk := clock.NewMock()
			p, err := c.Producer("q", ProducerOptions{MaxInflight: 1, MaxBatch: 2, CallTimeout: time.Minute, Clock: clk})
			require.NoError(t, err)

			first := make(chan error, 1)
			enqueueBg(p, first)
			// The call reaching the node means its bound is armed: send
			// arms it before it calls.
			awaitEnqueueCall(t, hc)
			rest := make(chan error, 2)
			enqueueBg(p, rest)
			enqueueBg(p, rest)
			waitPending(t, p, 2) // behind the call in flight (MaxInflight 1)
			closed := make(chan error, 1)
			go func() { closed <- p.Close() }()
			requireClosed(t, p)

			clk.Add(time.Minute - time.Millisecond)
			select {
			case err := <-first:
				t.Fatalf("the call ended before its CallTimeout: %v", err)
			default:
			}
			clk.Add(time.Millisecond)
			requireUnknownOutcome(t, recvErr(t, first, "an Enqueue without a deadline"))

			// The two waiting items share the next call, in the slot the
			// first one freed; it is bounded the same way.
			awaitEnqueueCall(t, hc)
			clk.Add(time.Minute)
			for i := 0; i < 2; i++ {
				requireUnknownOutcome(t, recvErr(t, rest, "an Enqueue without a deadline"))
			}
			select {
			case err := <-closed:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("Close still waits on a node that never answers")
			}
			requireDrained(t, p)
		})
	}
}

// requireUnknownOutcome checks the error of an item whose call was not
// answered within CallTimeout.
func requireUnknownOutcome(t *testing.T, err error) {
	t.Helper()
	require.Error(t, err)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.False(t, errors.Is(err, context.Canceled), "%v", err)
	require.Contains(t, err.Error(), "outcome unknown")
	require.Contains(t, err.Error(), "1m0s")
}

// TestProducer_CloseContextGivesUpStalledCalls: CloseContext bounds the
// flush by its ctx: once that ends, the call in flight is given up (its
// caller hears the outcome is unknown), the items not yet sent are
// failed as not sent, and it returns the ctx's error, with no goroutine
// left behind. The default CallTimeout (never reached here: the mock
// clock does not move) does not hold it.
//
// Not parallel: verifyNoLeaks counts every goroutine of the process.
func TestProducer_CloseContextGivesUpStalledCalls(t *testing.T) {
	for _, engine := range []string{ClientEngineLean, ClientEngineGoCapnp} {
		t.Run("engine="+engine, func(t *testing.T) {
			verifyNoLeaks(t)
			c, hc := dialStalled(t, engine)
			p, err := c.Producer("q", ProducerOptions{MaxInflight: 1, Clock: clock.NewMock()})
			require.NoError(t, err)
			require.Equal(t, DefaultProducerCallTimeout, p.opts.CallTimeout)

			inflight := make(chan error, 1)
			enqueueBg(p, inflight)
			awaitEnqueueCall(t, hc)
			pending := make(chan error, 2)
			enqueueBg(p, pending)
			enqueueBg(p, pending)
			waitPending(t, p, 2)

			ctx, cancel := context.WithCancel(context.Background())
			closed := make(chan error, 1)
			go func() { closed <- p.CloseContext(ctx) }()
			requireClosed(t, p)
			cancel()
			select {
			case err := <-closed:
				require.ErrorIs(t, err, context.Canceled)
			case <-time.After(10 * time.Second):
				t.Fatal("CloseContext still waits after its ctx ended")
			}

			err = recvErr(t, inflight, "the Enqueue in flight")
			require.ErrorIs(t, err, storage.ErrClosed)
			require.Contains(t, err.Error(), "outcome unknown")
			for i := 0; i < 2; i++ {
				err := recvErr(t, pending, "a pending Enqueue")
				require.ErrorIs(t, err, storage.ErrClosed)
				require.Contains(t, err.Error(), "not enqueued")
			}
			requireDrained(t, p)

			_, err = p.Enqueue(context.Background(), storage.EnqueueItem{Payload: []byte("late")})
			require.ErrorIs(t, err, storage.ErrClosed)
			require.NoError(t, p.Close(), "Close after CloseContext: nothing left to wait for")
		})
	}
}

// TestProducer_CallTimeoutOption: CallTimeout 0 takes the default; a
// negative one is refused.
func TestProducer_CallTimeoutOption(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c := b.dial()
	p, err := c.Producer("q", ProducerOptions{})
	require.NoError(t, err)
	require.Equal(t, DefaultProducerCallTimeout, p.opts.CallTimeout)
	require.NoError(t, p.Close())
	p, err = c.Producer("q", ProducerOptions{CallTimeout: time.Second})
	require.NoError(t, err)
	require.Equal(t, time.Second, p.opts.CallTimeout)
	require.NoError(t, p.Close())
	_, err = c.Producer("q", ProducerOptions{CallTimeout: -time.Second})
	require.ErrorIs(t, err, storage.ErrInvalidArgument)
}
