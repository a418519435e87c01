package rpc

import (
	"context"
	"sync"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// Review (session 74) of the go-capnp client engine's poll tracking
// (client_drain_capnp.go): edges checked and found right.

// reviewPolls is a capnpPolls whose give-backs are recorded.
func reviewPolls() (*capnpPolls, *[]pollGiveBack, *sync.Mutex) {
	p := newCapnpPolls(DefaultMaxReplyBytes)
	var mu sync.Mutex
	var gbs []pollGiveBack
	p.setGiveBack(func(g pollGiveBack) {
		mu.Lock()
		gbs = append(gbs, g)
		mu.Unlock()
	})
	return p, &gbs, &mu
}

// reviewRec opens a tracked poll, as call does, and builds and sends its
// Call with question id qid.
func reviewRec(t *testing.T, p *capnpPolls, qid uint32, sent bool) *capnpPoll {
	t.Helper()
	rec := &capnpPoll{cancel: func() {}}
	p.mu.Lock()
	p.open[rec] = struct{}{}
	p.mu.Unlock()
	msg, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	require.NoError(t, err)
	m, err := rpccp.NewRootMessage(seg)
	require.NoError(t, err)
	call, err := m.NewCall()
	require.NoError(t, err)
	call.SetQuestionId(qid)
	call.SetInterfaceId(schema.Queue_TypeID)
	call.SetMethodId(mPoll.id)
	p.built(rec, msg)
	p.mu.Lock()
	require.True(t, rec.built)
	p.mu.Unlock()
	if sent {
		require.Same(t, rec, p.sending(m))
		p.sent(rec)
	}
	return rec
}

// reviewReturn is a Return for question qid; fill sets its results'
// content (nil: a Return carrying an exception).
func reviewReturn(t *testing.T, qid uint32, fill func(seg *capnp.Segment, payload rpccp.Payload)) rpccp.Return {
	t.Helper()
	_, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	require.NoError(t, err)
	m, err := rpccp.NewRootMessage(seg)
	require.NoError(t, err)
	ret, err := m.NewReturn()
	require.NoError(t, err)
	ret.SetAnswerId(qid)
	if fill == nil {
		exc, err := ret.NewException()
		require.NoError(t, err)
		require.NoError(t, exc.SetReason("no"))
		return ret
	}
	payload, err := ret.NewResults()
	require.NoError(t, err)
	fill(seg, payload)
	return ret
}

// pollResults fills a poll's results: lease, and items with ids (each
// of queue "q").
func pollResults(t *testing.T, lease []byte, ids ...[]byte) func(*capnp.Segment, rpccp.Payload) {
	return func(seg *capnp.Segment, payload rpccp.Payload) {
		res, err := schema.NewQueue_poll_Results(seg)
		require.NoError(t, err)
		require.NoError(t, res.SetLease(lease))
		items, err := res.NewItems(int32(len(ids)))
		require.NoError(t, err)
		for i, id := range ids {
			require.NoError(t, items.At(i).SetId(id))
			require.NoError(t, items.At(i).SetQueue("q"))
		}
		require.NoError(t, payload.SetContent(res.ToPtr()))
	}
}

func reviewID(b byte) []byte {
	id := make([]byte, len(storage.ItemID{}))
	id[0] = b
	return id
}

func reviewLease() []byte { return make([]byte, len(storage.LeaseID{})) }

func requireSettledEmpty(t *testing.T, p *capnpPolls) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	require.Empty(t, p.open, "records not settled")
	require.Empty(t, p.qs, "question ids still tracked")
}

// TestReviewClient74_DeliveredAnswerIsNeverGivenBack: the worst outcome
// (an answer its caller received given back, its items leased to someone
// else while the caller works on them) cannot come from a stop that races
// with the delivery: whether Close (drain) or the caller's ctx stopped the
// call, and whether the Return was read before or after, an answer go-capnp
// delivered is the caller's.
func TestReviewClient74_DeliveredAnswerIsNeverGivenBack(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		run  func(p *capnpPolls, rec *capnpPoll, ret func())
	}{
		{"closeAfterReturn", func(p *capnpPolls, rec *capnpPoll, ret func()) {
			ret()
			done := p.drain()
			require.False(t, isClosedChan(done))
			p.finish(rec, true)
			require.True(t, isClosedChan(done), "Close still waits for a delivered poll")
		}},
		{"closeBeforeReturn", func(p *capnpPolls, rec *capnpPoll, ret func()) {
			done := p.drain()
			ret()
			byClose, _ := p.finish(rec, true)
			require.True(t, byClose)
			require.True(t, isClosedChan(done))
		}},
		{"callerStopBeforeReturn", func(p *capnpPolls, rec *capnpPoll, ret func()) {
			p.stop(rec)
			ret()
			_, byCaller := p.finish(rec, true)
			require.True(t, byCaller)
		}},
		{"releaseAfterDelivery", func(p *capnpPolls, rec *capnpPoll, ret func()) {
			ret()
			p.finish(rec, true)
			p.stop(rec) // the release func: stop, then finish(false)
			p.finish(rec, false)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, gbs, mu := reviewPolls()
			rec := reviewRec(t, p, 7, true)
			tc.run(p, rec, func() { p.returned(reviewReturn(t, 7, pollResults(t, reviewLease(), reviewID(1)))) })
			mu.Lock()
			require.Empty(t, *gbs, "an answer its caller received was given back")
			mu.Unlock()
			requireSettledEmpty(t, p)
		})
	}
}

// TestReviewClient74_UndeliveredAnswerGivenBackOnce: an answer that
// comes after its caller failed is given back once, also when a hostile
// node repeats the Return; a poll never sent settles at once (no Return
// will come) and frees its id; a Return for an id not tracked is ignored.
func TestReviewClient74_UndeliveredAnswerGivenBackOnce(t *testing.T) {
	t.Parallel()
	p, gbs, mu := reviewPolls()
	rec := reviewRec(t, p, 3, true)
	p.stop(rec)
	p.finish(rec, false)
	p.mu.Lock()
	require.False(t, rec.settled, "settled before its answer came")
	p.mu.Unlock()
	for range 2 {
		p.returned(reviewReturn(t, 3, pollResults(t, reviewLease(), reviewID(1), reviewID(2))))
	}
	p.returned(reviewReturn(t, 99, pollResults(t, reviewLease(), reviewID(9))))
	mu.Lock()
	require.Len(t, *gbs, 1)
	require.Len(t, (*gbs)[0].ids, 2)
	require.Equal(t, "q", (*gbs)[0].queue)
	mu.Unlock()

	unsent := reviewRec(t, p, 4, false)
	p.finish(unsent, false)
	requireSettledEmpty(t, p)
}

// TestReviewClient74_HostilePollAnswersDoNotPanic: a node's malformed
// poll answers (wrong lease or id size, an item list of the wrong kind, a
// result that is no struct, an exception) give nothing back, do not
// panic, and settle the poll.
func TestReviewClient74_HostilePollAnswersDoNotPanic(t *testing.T) {
	t.Parallel()
	fills := map[string]func(*capnp.Segment, rpccp.Payload){
		"exception":  nil,
		"shortLease": pollResults(t, []byte{1, 2, 3}, reviewID(1)),
		"shortID":    pollResults(t, reviewLease(), reviewID(1), []byte{1}),
		"noItems":    pollResults(t, reviewLease()),
		"textContent": func(seg *capnp.Segment, payload rpccp.Payload) {
			txt, err := capnp.NewText(seg, "not a struct")
			require.NoError(t, err)
			require.NoError(t, payload.SetContent(txt.ToPtr()))
		},
		"itemsAsBytes": func(seg *capnp.Segment, payload rpccp.Payload) {
			res, err := schema.NewQueue_poll_Results(seg)
			require.NoError(t, err)
			require.NoError(t, res.SetLease(reviewLease()))
			d, err := capnp.NewData(seg, make([]byte, 64))
			require.NoError(t, err)
			require.NoError(t, capnp.Struct(res).SetPtr(2, d.ToPtr()))
			require.NoError(t, payload.SetContent(res.ToPtr()))
		},
	}
	for name, fill := range fills {
		t.Run(name, func(t *testing.T) {
			p, gbs, mu := reviewPolls()
			rec := reviewRec(t, p, 1, true)
			require.NotPanics(t, func() { p.returned(reviewReturn(t, 1, fill)) })
			p.finish(rec, false)
			mu.Lock()
			require.Empty(t, *gbs)
			mu.Unlock()
			requireSettledEmpty(t, p)
		})
	}
}

// TestReviewClient74_RecordsDoNotLeak: on a real connection, polls that
// are answered, given up while they wait (go-capnp sends a Finish and the
// node answers the cancel), and given up before they were made leave no
// record behind (a long-lived client's memory does not grow with them).
func TestReviewClient74_RecordsDoNotLeak(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c := dialCapnp(t, b.addr)
	_, err := c.Enqueue(ctxT(t), "q", payloads(5, 8))
	require.NoError(t, err)
	for range 5 {
		res, err := c.Poll(ctxT(t), "q", 1, time.Hour, 0)
		require.NoError(t, err)
		require.Len(t, res.Items, 1)
	}
	for range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		polled := make(chan error, 1)
		go func() {
			_, err := c.Poll(ctx, "q", 1, time.Hour, time.Minute)
			polled <- err
		}()
		rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 }, "the poll did not reach the node")
		cancel()
		require.ErrorIs(t, rpctest.Recv(t, polled, 10*time.Second), context.Canceled)
		rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Waiters == 0 }, "the node kept the poll")
	}
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for range 5 {
		_, err := c.Poll(done, "q", 1, time.Hour, 0)
		require.ErrorIs(t, err, context.Canceled)
	}
	rpctest.Eventually(t, 10*time.Second, func() bool {
		c.cpolls.mu.Lock()
		defer c.cpolls.mu.Unlock()
		return len(c.cpolls.open) == 0 && len(c.cpolls.qs) == 0
	}, "poll records leaked")
}

// TestReviewClient74_ConcurrentPollsAndClose: polls racing with Close
// (under -race): each poll's items are either its caller's (leased) or
// ready again once Close returns; none is leased to nobody, and none a
// caller received is given back.
func TestReviewClient74_ConcurrentPollsAndClose(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	obs := b.dial()
	c := dialCapnp(t, b.addr)
	const n = 40
	_, err := c.Enqueue(ctxT(t), "q", payloads(n, 8))
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	got := 0
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				res, err := c.Poll(context.Background(), "q", 1, time.Hour, 0)
				if err != nil {
					return
				}
				mu.Lock()
				got += len(res.Items)
				mu.Unlock()
			}
		}()
	}
	rpctest.Eventually(t, 10*time.Second, func() bool {
		_, inflight := queueCounts(t, obs)
		return inflight > 0
	}, "no poll went through")
	require.NoError(t, c.Close())
	wg.Wait()
	ready, inflight := queueCounts(t, obs)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, [2]int64{int64(n - got), int64(got)}, [2]int64{ready, inflight}, "ready/inflight after Close, %d items received", got)
}

// Found by review (session 74): on the go-capnp engine, a poll whose ctx
// had ended already was made anyway (its call runs on a context of its
// own, which the caller's ending cancels on a goroutine, a moment later):
// it could lease items and answer them as a success to a caller that had
// given up, where go-capnp (and the lean engine) fail such a call at once,
// unsent. Each try may race; many tries make the defect show.
func TestReviewClient74_PollWithEndedCtxIsNotMade(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	obs := b.dial()
	c := dialCapnp(t, b.addr)
	_, err := c.Enqueue(ctxT(t), "q", payloads(3, 8))
	require.NoError(t, err)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for range 30 {
		res, err := c.Poll(done, "q", 3, time.Hour, 0)
		require.ErrorIs(t, err, context.Canceled, "a poll whose ctx had ended got %d items", len(res.Items))
		_, res, err = c.AckPoll(done, "q", storage.LeaseID{}, nil, 3, time.Hour, 0)
		require.ErrorIs(t, err, context.Canceled, "an AckPoll whose ctx had ended got %d items", len(res.Items))
	}
	ready, inflight := queueCounts(t, obs)
	require.Equal(t, [2]int64{3, 0}, [2]int64{ready, inflight})
	c.cpolls.mu.Lock()
	defer c.cpolls.mu.Unlock()
	require.Empty(t, c.cpolls.open)
}
