package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
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

// brokenWriter is a ResponseWriter whose client is gone: writes fill a
// buffer, and the flush that would send them fails, as net/http's does
// on a reset connection.
type brokenWriter struct {
	h      http.Header
	status int
	body   bytes.Buffer
}

func (w *brokenWriter) Header() http.Header         { return w.h }
func (w *brokenWriter) WriteHeader(status int)      { w.status = status }
func (w *brokenWriter) Write(p []byte) (int, error) { return w.body.Write(p) }
func (w *brokenWriter) FlushError() error           { return errors.New("write: connection reset by peer") }

// TestPoll_AnswerThatCannotBeWrittenIsGivenBack: items claimed for a poll
// whose answer cannot be written (the client's connection failed after
// the claim, though the request's context had not ended yet) are given
// back with no attempt counted, not left leased until the lease runs out
// (left over by session 67's review of the HTTP API).
func TestPoll_AnswerThatCannotBeWrittenIsGivenBack(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.enqueueTexts("q", "x", "y")

	req := httptest.NewRequest(http.MethodPost, "http://localhost/v1/queues/q/poll", strings.NewReader(`{"max": 2}`))
	req.Header.Set("Content-Type", "application/json")
	w := &brokenWriter{h: http.Header{}}
	b.srv.Handler().ServeHTTP(w, req)
	require.Equal(t, http.StatusOK, w.status)
	var answer PollResponse
	require.NoError(t, json.Unmarshal(w.body.Bytes(), &answer))
	require.Len(t, answer.Items, 2, "the handler claimed the items")

	s, err := b.store.Stats(context.Background(), storage.StatsParams{Queue: "q", Now: b.clock.Now()})
	require.NoError(t, err)
	require.EqualValues(t, 0, s[0].Inflight, "the unwritten answer's items stay leased")
	require.EqualValues(t, 2, s[0].Ready)
	p := b.poll("q", PollRequest{Max: ptr(int64(2))})
	require.Len(t, p.Items, 2)
	for _, it := range p.Items {
		require.EqualValues(t, 1, it.Attempts, "the give-back must not count a delivery")
	}

	// An answer that is written keeps its lease.
	w2 := httptest.NewRecorder()
	b.enqueueTexts("q", "z")
	req = httptest.NewRequest(http.MethodPost, "http://localhost/v1/queues/q/poll", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	b.srv.Handler().ServeHTTP(w2, req)
	require.Equal(t, http.StatusOK, w2.Code)
	s, err = b.store.Stats(context.Background(), storage.StatsParams{Queue: "q", Now: b.clock.Now()})
	require.NoError(t, err)
	require.EqualValues(t, 3, s[0].Inflight)
}
