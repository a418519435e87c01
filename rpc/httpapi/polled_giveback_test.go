package httpapi

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// claimAfterGone is a store whose Poll, once armed, waits for the
// request's context to end and then claims anyway: the claim committed in
// the same instant the HTTP client went away (the store's commit does
// not abort for a context that ends while it runs).
type claimAfterGone struct {
	storage.Store
	armed   atomic.Bool
	inPoll  chan struct{}
	claimed chan int
}

func (s *claimAfterGone) Poll(ctx context.Context, p storage.PollParams) (storage.PollResult, error) {
	if s.armed.Load() {
		s.inPoll <- struct{}{}
		<-ctx.Done()
		res, err := s.Store.Poll(context.Background(), p)
		s.claimed <- len(res.Items)
		return res, err
	}
	return s.Store.Poll(ctx, p)
}

// TestPoll_ItemsOfAGoneClientAreGivenBack: items claimed by a poll whose
// HTTP client went away before the answer was written are given back (an
// undelivered nack, as the RPC server does), not left leased until the
// lease runs out (found by review).
func TestPoll_ItemsOfAGoneClientAreGivenBack(t *testing.T) {
	t.Parallel()
	var st *claimAfterGone
	b := setup(t, func(c *Config) {
		st = &claimAfterGone{Store: c.Store, inPoll: make(chan struct{}, 1), claimed: make(chan int, 1)}
		c.Store = st
	})
	b.enqueueTexts("q", "x")
	st.armed.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	ch := b.pollAsync(ctx, "q", PollRequest{})
	select {
	case <-st.inPoll:
	case <-time.After(30 * time.Second):
		t.Fatal("poll did not reach the store")
	}
	st.armed.Store(false)
	cancel()
	require.Error(t, recvAnswer(t, ch).err)
	select {
	case n := <-st.claimed:
		require.Equal(t, 1, n)
	case <-time.After(30 * time.Second):
		t.Fatal("the store's claim did not complete")
	}

	// The client never saw the lease; nobody can ack it. The item should
	// be ready again at once (mock clock: the lease never expires here).
	rpctest.Eventually(t, 5*time.Second, func() bool {
		s, err := b.store.Stats(context.Background(), storage.StatsParams{Queue: "q", Now: b.clock.Now()})
		require.NoError(t, err)
		return s[0].Inflight == 0 && s[0].Ready == 1
	}, "item claimed for a gone HTTP client stays inflight")
	p := b.poll("q", PollRequest{})
	require.Len(t, p.Items, 1)
	require.EqualValues(t, 1, p.Items[0].Attempts, "the give-back must not count a delivery")
}
