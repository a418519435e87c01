package rpc

import (
	"context"
	"slices"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// Review of session 74's own changes: the Producer's CallTimeout and
// CloseContext (producer.go), and the lean engine's give-back of poll
// answers whose question the client finished before their write started
// (lean_write.go finishedUnwritten, lean_calls.go settle).

// TestReviewS74_CloseContextAfterFlushReturnsNil: found by review
// (session 74): CloseContext waited in one select for the flush's end
// and for ctx's, and when both had come (a ctx that ended already, on a
// producer with nothing to flush) Go picks either: about one call in two
// reported ctx's error for a flush that had ended, nothing given up.
func TestReviewS74_CloseContextAfterFlushReturnsNil(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c := b.dial()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for i := 0; i < 100; i++ {
		p, err := c.Producer("q", ProducerOptions{})
		require.NoError(t, err)
		if i%2 == 1 {
			// With a flush that ended before CloseContext too.
			_, err := p.Enqueue(ctxT(t), storage.EnqueueItem{Payload: []byte("x")})
			require.NoError(t, err)
		}
		require.NoError(t, p.CloseContext(ended), "round %d: nothing was left to flush", i)
		_, err = p.Enqueue(ctxT(t), storage.EnqueueItem{Payload: []byte("late")})
		require.ErrorIs(t, err, storage.ErrClosed)
	}
}

// TestReviewS74_CallGivenUpBeforeItWasMadeIsNotUnknown: found by review
// (session 74): a call that CloseContext gave up after the producer had
// made it up (the items taken from pending) but before it was sent was
// still made, on an ended ctx, and its callers heard that the outcome was
// unknown. It is not made, and they hear their items were not enqueued:
// the node has none of them.
func TestReviewS74_CallGivenUpBeforeItWasMadeIsNotUnknown(t *testing.T) {
	t.Parallel()
	for _, engine := range []string{ClientEngineLean, ClientEngineGoCapnp} {
		t.Run("engine="+engine, func(t *testing.T) {
			t.Parallel()
			b := setup(t, bundleOpts{})
			c, err := b.dialErr(ClientOptions{Engine: engine})
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			p, err := c.Producer("q", ProducerOptions{MaxInflight: 1})
			require.NoError(t, err)
			entered, release := make(chan struct{}), make(chan struct{})
			p.onCall = func(int) {
				close(entered)
				<-release
			}
			errs := make(chan error, 1)
			enqueueBg(p, errs)
			<-entered // the call is made up and registered, not yet sent

			// The call's cancel, seen: CloseContext gives the call up.
			givenUp := make(chan struct{})
			p.mu.Lock()
			require.Len(t, p.calls, 1)
			for k, cf := range p.calls {
				p.calls[k] = func(cause error) {
					cf(cause)
					close(givenUp)
				}
			}
			p.mu.Unlock()
			ended, cancel := context.WithCancel(context.Background())
			cancel()
			closed := make(chan error, 1)
			go func() { closed <- p.CloseContext(ended) }()
			<-givenUp
			close(release)
			err = recvErr(t, errs, "the Enqueue whose call was given up")
			require.ErrorIs(t, err, storage.ErrClosed)
			require.NotErrorIs(t, err, ErrOutcomeUnknown, "nothing was sent: %v", err)
			require.Contains(t, err.Error(), "not enqueued")
			require.ErrorIs(t, <-closed, context.Canceled)
			requireDrained(t, p)

			// The queue does not exist (not found), or holds nothing.
			st, err := b.store.Stats(ctxT(t), storage.StatsParams{Queue: "q", Now: b.clock.Now()})
			if err != nil {
				require.ErrorIs(t, err, storage.ErrNotFound)
			}
			for _, s := range st {
				require.Zero(t, s.Ready+s.Inflight+s.Delayed, "the item given up was enqueued: %+v", s)
			}
		})
	}
}

// TestReviewS74_ProducerUnknownOutcomesWrapErrOutcomeUnknown: the errors
// of an item whose call went out and whose answer did not come wrap
// ErrOutcomeUnknown (as Client.Ack's): cut by CallTimeout, given up by
// CloseContext, or its caller's ctx ending while its call was in flight
// (found by review, session 74: ctx's error alone, as for an item not
// sent). An item not sent (its caller's ctx ended while it was pending,
// or CloseContext failed it) does not.
func TestReviewS74_ProducerUnknownOutcomesWrapErrOutcomeUnknown(t *testing.T) {
	t.Parallel()
	for _, engine := range []string{ClientEngineLean, ClientEngineGoCapnp} {
		t.Run("engine="+engine, func(t *testing.T) {
			t.Parallel()
			c, hc := dialStalled(t, engine)
			clk := clock.NewMock()
			p, err := c.Producer("q", ProducerOptions{MaxInflight: 1, MaxBatch: 1, CallTimeout: time.Minute, Clock: clk})
			require.NoError(t, err)

			// A caller whose ctx ends while its call is in flight.
			ctx1, cancel1 := context.WithCancel(context.Background())
			first := make(chan error, 1)
			go func() {
				_, err := p.Enqueue(ctx1, storage.EnqueueItem{Payload: []byte("1")})
				first <- err
			}()
			awaitEnqueueCall(t, hc)
			// A caller whose ctx ends while its item is pending.
			ctx2, cancel2 := context.WithCancel(context.Background())
			second := make(chan error, 1)
			go func() {
				_, err := p.Enqueue(ctx2, storage.EnqueueItem{Payload: []byte("2")})
				second <- err
			}()
			waitPending(t, p, 1)
			cancel1()
			err = recvErr(t, first, "an Enqueue whose ctx ended")
			require.ErrorIs(t, err, context.Canceled)
			require.ErrorIs(t, err, ErrOutcomeUnknown, "its call was in flight: %v", err)
			cancel2()
			err = recvErr(t, second, "an Enqueue whose ctx ended")
			require.ErrorIs(t, err, context.Canceled)
			require.NotErrorIs(t, err, ErrOutcomeUnknown, "its item was not sent: %v", err)

			// The call of the first caller ends at its CallTimeout; the
			// next call goes out then.
			third := make(chan error, 1)
			enqueueBg(p, third)
			waitPending(t, p, 1)
			clk.Add(time.Minute)
			awaitEnqueueCall(t, hc)
			// The third's call is in flight; a fourth item waits.
			fourth := make(chan error, 1)
			enqueueBg(p, fourth)
			waitPending(t, p, 1)
			clk.Add(time.Minute)
			err = recvErr(t, third, "an Enqueue whose call timed out")
			requireUnknownOutcome(t, err)
			require.ErrorIs(t, err, ErrOutcomeUnknown)

			// The fourth's call is in flight; a fifth waits; CloseContext
			// gives up both.
			awaitEnqueueCall(t, hc)
			fifth := make(chan error, 1)
			enqueueBg(p, fifth)
			waitPending(t, p, 1)
			ended, cancel := context.WithCancel(context.Background())
			cancel()
			require.ErrorIs(t, p.CloseContext(ended), context.Canceled)
			err = recvErr(t, fourth, "an Enqueue given up by CloseContext")
			require.ErrorIs(t, err, storage.ErrClosed)
			require.ErrorIs(t, err, ErrOutcomeUnknown, "its call was in flight: %v", err)
			require.NotErrorIs(t, err, context.DeadlineExceeded)
			err = recvErr(t, fifth, "an Enqueue failed by CloseContext")
			require.ErrorIs(t, err, storage.ErrClosed)
			require.NotErrorIs(t, err, ErrOutcomeUnknown, "its item was not sent: %v", err)
			requireDrained(t, p)
		})
	}
}

// TestReviewS74_LeanReusedQuestionIDKeepsItems: a client that finishes a
// poll once it has read its answer and reuses the question id for the
// next poll in the same write (as it may: it has both the Return and its
// Finish) keeps that next poll's items: the answer under the id is the
// new question's, which is open. Right as written (checked in review,
// session 74): only an answer whose own question was finished goes back.
func TestReviewS74_LeanReusedQuestionIDKeepsItems(t *testing.T) {
	t.Parallel()
	for _, f := range []storeFactory{memFactory(), rocksFactory()} {
		t.Run("store="+f.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, bundleOpts{factory: f, mutate: func(c *ServerConfig) { c.Engine = EngineLean }})
			c := b.dial()
			ctx := ctxT(t)
			_, err := c.Enqueue(ctx, "a", payloads(2, 8))
			require.NoError(t, err)
			_, err = c.Enqueue(ctx, "b", payloads(3, 8))
			require.NoError(t, err)

			conn := rawDial(t, b)
			require.NoError(t, conn.SetReadDeadline(time.Now().Add(30*time.Second)))
			dec := capnp.NewDecoder(conn)
			_, err = conn.Write(slices.Concat(bootstrapMsg(t), pollMsg(t, 1, "a", 2)))
			require.NoError(t, err)
			require.Equal(t, map[uint32]int{1: 2}, luReadReturns(t, dec, 1))
			// Finish and reuse, in one write, several times over.
			for i := 0; i < 3; i++ {
				queue, n := "b", 3
				if i > 0 {
					queue, n = "empty", 0
				}
				_, err = conn.Write(slices.Concat(luFinish(t, 1), pollMsg(t, 1, queue, 3)))
				require.NoError(t, err)
				require.Equal(t, map[uint32]int{1: n}, luReadReturns(t, dec, 1))
			}
			_, err = conn.Write(pipelinedCall(t, 2, 0, 15 /* nodeInfo */, nil))
			require.NoError(t, err)
			require.Equal(t, map[uint32]int{2: 0}, luReadReturns(t, dec, 2))
			for q, n := range map[string]int64{"a": 2, "b": 3} {
				st, err := b.store.Stats(ctx, storage.StatsParams{Queue: q, Now: b.clock.Now()})
				require.NoError(t, err)
				require.Len(t, st, 1)
				require.EqualValues(t, n, st[0].Inflight, "queue %s: the items of an answer the client read are the client's", q)
				require.Zero(t, st[0].Ready, "queue %s", q)
			}
		})
	}
}

// TestReviewS74_LeanGoClientPollsKeepTheirItems: the Go clients finish a
// question only once they have its Return (the lean one lazily, with the
// next call, for a small one), so on the lean engine none of their polls'
// items is given back behind their back: sequential polls, AckPolls (an
// ack and a poll in one write) and polls from many goroutines at once all
// keep what they got. Right as written (checked in review, session 74).
func TestReviewS74_LeanGoClientPollsKeepTheirItems(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		f      storeFactory
		engine string
	}{{memFactory(), ClientEngineLean}, {rocksFactory(), ClientEngineLean}, {memFactory(), ClientEngineGoCapnp}} {
		t.Run("store="+tc.f.name+"/client="+tc.engine, func(t *testing.T) {
			t.Parallel()
			b := setup(t, bundleOpts{factory: tc.f, mutate: func(c *ServerConfig) { c.Engine = EngineLean }})
			c, err := b.dialErr(ClientOptions{Engine: tc.engine})
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			ctx := ctxT(t)
			const n = 60
			_, err = c.Enqueue(ctx, "q", payloads(n, 8))
			require.NoError(t, err)

			got, acked := 0, 0
			for i := 0; i < n/3; i++ {
				res, err := c.Poll(ctx, "q", 1, time.Minute, 0)
				require.NoError(t, err)
				require.Len(t, res.Items, 1)
				got++
			}
			// Each AckPoll acks the item the one before got, and keeps
			// its own.
			res, err := c.Poll(ctx, "q", 1, time.Minute, 0)
			require.NoError(t, err)
			require.Len(t, res.Items, 1)
			got++
			for i := 0; i < n/3-1; i++ {
				codes, next, err := c.AckPoll(ctx, "q", res.Lease, []storage.ItemID{res.Items[0].ID}, 1, time.Minute, 0)
				require.NoError(t, err)
				require.Equal(t, []storage.Code{storage.CodeOK}, codes)
				require.Len(t, next.Items, 1)
				got++
				acked++
				res = next
			}
			errs := make(chan error, n/3)
			for i := 0; i < n/3; i++ {
				go func() {
					res, err := c.Poll(ctx, "q", 1, time.Minute, 0)
					if err == nil && len(res.Items) != 1 {
						err = storage.ErrCorrupt
					}
					errs <- err
				}()
			}
			for i := 0; i < n/3; i++ {
				require.NoError(t, <-errs)
				got++
			}
			// A round trip more: the lazy Finishes go out, and a
			// give-back, were there one, had its worker's time.
			_, err = c.Stats(ctx, "q")
			require.NoError(t, err)
			st, err := b.store.Stats(ctx, storage.StatsParams{Queue: "q", Now: b.clock.Now()})
			require.NoError(t, err)
			require.Len(t, st, 1)
			require.EqualValues(t, got-acked, st[0].Inflight)
			require.Zero(t, st[0].Ready, "items of answers the client used were given back")
		})
	}
}

// TestReviewS74_SecondGiveBackOfTheSameAnswerIsHarmless: the node gives
// back the items of an answer the client finished before its write
// started, and the Go client, which drops such an answer, gives them back
// too (leanClient.abandoned). The second give-back, under the old lease,
// changes nothing, even once another consumer holds the items: their
// claim is not taken back twice, and the new holder keeps them. Right as
// written (checked in review, session 74).
func TestReviewS74_SecondGiveBackOfTheSameAnswerIsHarmless(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) { c.Engine = EngineLean }})
	ctx := ctxT(t)
	_, err := b.store.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: payloads(2, 8), Now: b.clock.Now()})
	require.NoError(t, err)
	first, err := b.store.Poll(ctx, storage.PollParams{Queue: "q", Max: 2, Lease: time.Minute, Now: b.clock.Now()})
	require.NoError(t, err)
	require.Len(t, first.Items, 2)
	ids := []storage.ItemID{first.Items[0].ID, first.Items[1].ID}

	b.srv.giveBack("q", first.Lease, ids, reasonFinished)
	b.srv.giveBack("q", first.Lease, ids, reasonFinished) // at once
	second, err := b.store.Poll(ctx, storage.PollParams{Queue: "q", Max: 2, Lease: time.Minute, Now: b.clock.Now()})
	require.NoError(t, err)
	require.Len(t, second.Items, 2)
	for _, it := range second.Items {
		require.EqualValues(t, 1, it.Attempts, "a claim taken back once, not twice")
	}
	b.srv.giveBack("q", first.Lease, ids, reasonFinished) // once another holds them
	st, err := b.store.Stats(ctx, storage.StatsParams{Queue: "q", Now: b.clock.Now()})
	require.NoError(t, err)
	require.EqualValues(t, 2, st[0].Inflight)
	require.Zero(t, st[0].Ready, "a give-back under the old lease took the items from their new holder")
	codes, err := b.store.Ack(ctx, storage.AckParams{Queue: "q", Lease: second.Lease, IDs: ids})
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK}, codes)
}
