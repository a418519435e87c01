package httpapi

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/semaphore"

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
