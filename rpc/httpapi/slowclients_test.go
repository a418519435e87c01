package httpapi

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/semaphore"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// TestServer_SlowBodyGetsItsAnswer: an enqueue whose body takes longer
// to arrive than the longest wait plus writeSlack (well within
// readTimeout) is committed, and its answer reaches the client: net/http
// counts WriteTimeout from the headers.
func TestServer_SlowBodyGetsItsAnswer(t *testing.T) {
	t.Parallel() // half a minute of waiting
	b := setup(t, func(c *Config) { c.Limits = storage.Limits{MaxWait: time.Millisecond} })
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write([]byte(`[{"text":"a"}`))
		time.Sleep(writeSlack + 2*time.Second) // well under readTimeout
		_, _ = pw.Write([]byte(`]`))
		_ = pw.Close()
	}()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, b.url+"/v1/queues/slow/items", pr)
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.client.Do(req)
	var st QueueStats
	b.call(http.MethodGet, "/v1/queues/slow", nil, &st)
	require.EqualValues(t, 1, st.Enqueued, "the enqueue was committed")
	require.NoError(t, err, "the committed enqueue's answer was lost")
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}

// TestServer_ShortReadsKeepTheirBudget: a body of known length is drawn
// from the in-flight budget once; after a short read the request keeps
// what it holds instead of giving it back and asking again, which would
// queue it behind a larger request waiting for bytes it holds (the budget
// serves in order), and both would wait for ever, every later user of the
// node's budget (RPC messages too) behind them.
func TestServer_ShortReadsKeepTheirBudget(t *testing.T) {
	const size = 4096
	sem := semaphore.NewWeighted(size)
	b := setup(t, func(c *Config) { c.Inflight, c.InflightLimit = sem, size })
	// Something else (an RPC call) holds 1000 bytes for a while.
	require.True(t, sem.TryAcquire(1000))
	released := false
	release := func() {
		if !released {
			released = true
			sem.Release(1000)
		}
	}
	t.Cleanup(release)

	post := func(body io.Reader, n int64) chan error {
		done := make(chan error, 1)
		go func() {
			req, _ := http.NewRequest(http.MethodPost, b.url+"/v1/queues/q/items", body)
			req.ContentLength = n
			req.Header.Set("Content-Type", "application/octet-stream")
			resp, err := b.client.Do(req)
			if err == nil {
				if resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("status %d", resp.StatusCode)
				}
				resp.Body.Close()
			}
			done <- err
		}()
		return done
	}
	pr, pw := io.Pipe()
	aDone := post(pr, 2000)
	_, _ = pw.Write(bytes.Repeat([]byte("a"), 1500)) // A: 2001 taken, 1500 read
	time.Sleep(300 * time.Millisecond)
	bDone := post(bytes.NewReader(bytes.Repeat([]byte("b"), 2000)), 2000) // B waits for 2001 (1095 free)
	time.Sleep(300 * time.Millisecond)
	_, _ = pw.Write(bytes.Repeat([]byte("a"), 250)) // A: short read, gives back 251, asks again behind B
	time.Sleep(300 * time.Millisecond)
	_, _ = pw.Write(bytes.Repeat([]byte("a"), 250))
	_ = pw.Close()
	select {
	case err := <-aDone:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		release() // unblock, so the test can end
		<-aDone
		<-bDone
		t.Fatal("A's body was fully sent 5 s ago, with 1346 of 3096 free bytes, and it is still unanswered: A and B wait on each other")
	}
	require.NoError(t, <-bDone)
}

// Found by review (session 73): a body of unknown length
// (Transfer-Encoding: chunked) is drawn from the node's in-flight budget a
// step at a time (readStep), and the request waited in the budget's line
// for each next step while it held what it already took. The budget serves
// in order, so when another user of the budget (an RPC message, or a
// known-length body) asked for more than was free, and the bytes it needed
// were the ones the chunked request held, the two waited on each other for
// ever: the request was blocked in Acquire, not in a read, so neither the
// stall watch nor a client that hung up ended it, and every later user of
// the budget, RPC messages too, queued behind them. A request now gives
// back what it holds before it waits (call.take).
func TestServer_ChunkedBodyWaitsForBudgetHoldingNone(t *testing.T) {
	const size = 256 << 10
	sem := semaphore.NewWeighted(size)
	asking := make(chan struct{}, 64)
	b := setupWith(t, func(c *Config) { c.Inflight, c.InflightLimit = sem, size },
		func(s *Server) { s.onBudgetWait = func() { asking <- struct{}{} } })

	// A: an enqueue with a chunked body; it takes its first step (64 KiB).
	pr, pw := io.Pipe()
	t.Cleanup(func() { _ = pw.Close() })
	aDone := make(chan error, 1)
	go func() {
		req, err := http.NewRequest(http.MethodPost, b.url+"/v1/queues/q/items", pr)
		if err != nil {
			aDone <- err
			return
		}
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := b.client.Do(req)
		if err == nil {
			if resp.StatusCode != http.StatusOK {
				raw, _ := io.ReadAll(resp.Body)
				err = fmt.Errorf("status %d: %s", resp.StatusCode, raw)
			}
			resp.Body.Close()
		}
		aDone <- err
	}()
	<-asking
	free := int64(size - readStep)
	rpctest.Eventually(t, 10*time.Second, func() bool {
		if sem.TryAcquire(free + 1) {
			sem.Release(free + 1)
			return false
		}
		return true
	}, "A did not take its first step of the budget")

	// M: an RPC message larger than what is free arrives: it waits for
	// bytes A holds (the RPC transport's flowBudget.acquire).
	mctx, mcancel := context.WithCancel(context.Background())
	defer mcancel()
	mDone := make(chan error, 1)
	go func() {
		err := sem.Acquire(mctx, free+1)
		if err == nil {
			sem.Release(free + 1) // its call is answered at once
		}
		mDone <- err
	}()
	rpctest.Eventually(t, 10*time.Second, func() bool {
		if sem.TryAcquire(1) { // fails only while M waits in line
			sem.Release(1)
			return false
		}
		return true
	}, "M did not queue for the budget")

	// A's client sends its body (a hundred bytes) and ends it.
	_, err := pw.Write([]byte(strings.Repeat("a", 100)))
	require.NoError(t, err)
	<-asking // A asks the budget for its next step, behind M
	require.NoError(t, pw.Close())

	select {
	case err := <-aDone:
		require.NoError(t, err)
		require.NoError(t, <-mDone)
		// The request gave back all it took, across its give-back and
		// wait (its deferred release may run just after the answer).
		rpctest.Eventually(t, 10*time.Second, func() bool {
			if sem.TryAcquire(size) {
				sem.Release(size)
				return true
			}
			return false
		}, "the budget is not whole after the chunked enqueue was answered")
	case <-time.After(10 * time.Second):
		mcancel() // unblock, so the test can end
		<-aDone
		<-mDone
		t.Fatal("a 100-byte chunked enqueue, sent in full, was unanswered after 10 s: it waits in the budget's line " +
			"behind an RPC message that waits for the 64 KiB the enqueue holds (hold and wait); neither ever proceeds")
	}
}

// TestServer_PollAfterLongBudgetWaitGetsItsAnswer: a poll that waited
// for the in-flight budget longer than the longest wait plus writeSlack
// leases its item and its answer reaches the client.
func TestServer_PollAfterLongBudgetWaitGetsItsAnswer(t *testing.T) {
	t.Parallel() // half a minute of waiting
	const size = 4096
	sem := semaphore.NewWeighted(size)
	b := setup(t, func(c *Config) {
		c.Inflight, c.InflightLimit = sem, size
		c.Limits = storage.Limits{MaxWait: time.Millisecond}
	})
	b.enqueueTexts("q", "job")
	require.True(t, sem.TryAcquire(size)) // the node's budget is spent elsewhere for a while
	go func() {
		time.Sleep(writeSlack + 2*time.Second)
		sem.Release(size)
	}()
	resp, err := b.send(context.Background(), http.MethodPost, "/v1/queues/q/poll", "application/json", `{"max":1}`)
	var st QueueStats
	b.call(http.MethodGet, "/v1/queues/q", nil, &st)
	require.EqualValues(t, 1, st.Inflight, "the item was leased")
	require.NoError(t, err, "but the poll's answer, with the lease, never reached the client")
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}
