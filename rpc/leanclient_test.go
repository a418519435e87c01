package rpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// TestLeanClient_GivenUpCallsFinishBeforeTheirIDIsReused: many callers
// whose contexts end around the time their Return comes. A caller that
// gives up must have its Finish on the wire before the question id can be
// freed: the reader frees it when the Return comes, and a Call that reuses
// it ahead of the Finish is a protocol error on the node ("question id in
// use", which aborts the connection), and the late Finish would cancel the
// new call. Every call either answers or ends with its context's error,
// and the connection stays up.
func TestLeanClient_GivenUpCallsFinishBeforeTheirIDIsReused(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c := b.dial()
	require.NotNil(t, c.lean)
	const callers, calls = 8, 400
	var gaveUp, answered atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, callers)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				// Deadlines from 0 to 1 ms, around a round trip here.
				d := time.Duration((g*calls+i)%21) * 50 * time.Microsecond
				ctx, cancel := context.WithTimeout(ctxT(t), d)
				_, err := c.NodeInfo(ctx)
				cancel()
				switch {
				case err == nil:
					answered.Add(1)
				case errors.Is(err, context.DeadlineExceeded):
					gaveUp.Add(1)
				default:
					errc <- fmt.Errorf("call %d: %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
	t.Logf("%d answered, %d given up", answered.Load(), gaveUp.Load())
	require.Positive(t, gaveUp.Load(), "some calls must give up for the test to mean anything")
	_, err := c.NodeInfo(ctxT(t))
	require.NoError(t, err, "the connection is still up")
}

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
	rpctest.Eventually(t, 30*time.Second, func() bool { return isClosed(c.Done()) }, "Done not closed after the connection was lost")
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

// TestLeanClient_CallersShareTheReadSide: on one plain socket, producers,
// long-polling consumers and callers whose context ends while they read
// share the connection. Each caller gets its own answer, every item
// delivered comes once and intact, a caller whose read is interrupted
// leaves the stream whole for the next reader, and at the end no question
// is open and nobody holds the read side. (A poll given up after the node
// claimed items for it gives them back, and the node's clock here never
// expires a lease: every item ends delivered and acked, none dead.)
func TestLeanClient_CallersShareTheReadSide(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c := b.dial()
	require.True(t, c.lean.callersRead, "a TCP connection is read by its callers")
	const producers, perProducer = 4, 50
	want := make(map[string]bool)
	var mu sync.Mutex
	got := make(map[string]int)
	errc := make(chan error, 16)
	var pwg, cwg sync.WaitGroup
	for p := range producers {
		for i := range perProducer {
			want[fmt.Sprintf("p%d-%d", p, i)] = true
		}
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			for i := range perProducer {
				res, err := c.Enqueue(ctxT(t), "q", []storage.EnqueueItem{{Payload: []byte(fmt.Sprintf("p%d-%d", p, i))}})
				if err == nil && res[0].Code != storage.CodeOK {
					err = fmt.Errorf("enqueue: %v", res[0].Code)
				}
				if err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	var stop atomic.Bool
	var cancels atomic.Int64
	for range 4 {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			for !stop.Load() {
				// A short context: some polls end while their caller reads.
				ctx, cancel := context.WithTimeout(ctxT(t), 20*time.Millisecond)
				res, err := c.Poll(ctx, "q", 3, time.Minute, 30*time.Second)
				cancel()
				if errors.Is(err, context.DeadlineExceeded) {
					cancels.Add(1)
					continue
				}
				if err != nil {
					errc <- err
					return
				}
				ids := make([]storage.ItemID, len(res.Items))
				mu.Lock()
				for i, it := range res.Items {
					got[string(it.Payload)]++
					ids[i] = it.ID
				}
				mu.Unlock()
				if len(ids) == 0 {
					continue
				}
				codes, err := c.Ack(ctxT(t), "q", res.Lease, ids)
				if err != nil {
					errc <- err
					return
				}
				for _, code := range codes {
					if code != storage.CodeOK {
						errc <- fmt.Errorf("ack: %v", code)
						return
					}
				}
			}
		}()
	}
	pwg.Wait()
	// Every item ends delivered once and acked: a poll given up after its
	// items were claimed gives them back (nothing stays in flight), their
	// claim taken back, so however many polls give an item up (many, on a
	// loaded machine: -race, the suite's parallel tests) it is never
	// dead-lettered for them.
	var inflight, dead int64
	var last storage.QueueStats
	rpctest.Eventually(t, 30*time.Second, func() bool {
		st, err := c.Stats(ctxT(t), "q")
		if err != nil || len(st) != 1 {
			return false
		}
		mu.Lock()
		n := len(got)
		mu.Unlock()
		inflight, dead = st[0].Inflight, st[0].Dead
		last = st[0]
		return st[0].Ready == 0 && inflight == 0 && dead == 0 && n == len(want) && st[0].Acked == uint64(n)
	}, "items not delivered, dead-lettered by give-backs, or given back by no one")
	t.Logf("stats %+v", last)
	stop.Store(true)
	cwg.Wait()
	close(errc)
	for err := range errc {
		require.NoError(t, err)
	}
	for k, n := range got {
		require.True(t, want[k], "unknown payload %q", k)
		require.Equal(t, 1, n, "item %s delivered twice", k)
	}
	// Polls of an empty queue that all give up while one of them reads.
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(ctxT(t), 50*time.Millisecond)
			defer cancel()
			_, err := c.Poll(ctx, "q", 1, time.Minute, 30*time.Second)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
		}()
	}
	wg.Wait()
	res, err := c.Enqueue(ctxT(t), "q", payloads(1, 8))
	require.NoError(t, err)
	require.Equal(t, storage.CodeOK, res[0].Code)
	rpctest.Eventually(t, 30*time.Second, func() bool {
		c.lean.mu.Lock()
		defer c.lean.mu.Unlock()
		return len(c.lean.qs) == 0 && c.lean.pending == 0 && !c.lean.reading
	}, "questions left open or the read side held")
	t.Logf("polls given up: %d; items dead-lettered after polls given up: %d", cancels.Load(), dead)
}

// TestLeanClient_IdleWatch: a connection with no call open goes unread
// until it has been idle for idleWatch (on the client's clock); then the
// reader goroutine reads, hands the read side back at the next Return, and
// sees the connection end.
func TestLeanClient_IdleWatch(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	mock := clock.NewMock()
	c, err := b.dialErr(ClientOptions{Clock: mock})
	require.NoError(t, err)
	readers := func() bool {
		c.lean.mu.Lock()
		defer c.lean.mu.Unlock()
		return c.lean.reading
	}
	_, err = c.Queues(ctxT(t))
	require.NoError(t, err)
	require.False(t, readers(), "nobody reads an idle connection")
	mock.Add(idleWatch) // the mock runs the watch on a goroutine of its own
	rpctest.Eventually(t, 30*time.Second, readers, "the reader goroutine does not watch an idle connection")
	// A call while it watches: answered through the reader goroutine,
	// which gives the read side back after.
	_, err = c.Queues(ctxT(t))
	require.NoError(t, err)
	rpctest.Eventually(t, 30*time.Second, func() bool { return !readers() }, "the read side was not given back")
	b.srv.Stop()
	require.False(t, isClosed(c.Done()), "Done closed while nobody read")
	mock.Add(idleWatch)
	rpctest.Eventually(t, 30*time.Second, func() bool { return isClosed(c.Done()) }, "Done not closed after the idle connection ended")
	_, err = c.Queues(ctxT(t))
	require.True(t, IsDisconnected(err), "%v", err)
}

// isClosed reports whether ch is closed (or has a value ready).
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
