package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/semaphore"

	"github.com/leaseq/leaseq/rpc/dispatch"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// limAdmit counts admitted connections like rpc.Server.Admit, and
// refuses all of them while refuse is set.
type limAdmit struct {
	mu       sync.Mutex
	open     int
	admitted int
	refused  int
	refuse   bool
}

func (a *limAdmit) admit(net.Conn) (func(), string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.refuse {
		a.refused++
		return nil, "leaseq: too many connections (limit 0)"
	}
	a.open++
	a.admitted++
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			a.open--
			a.mu.Unlock()
		})
	}, ""
}

func (a *limAdmit) get() (open, admitted, refused int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.open, a.admitted, a.refused
}

func (a *limAdmit) waitOpen(t *testing.T, n int, msg string) {
	t.Helper()
	rpctest.Eventually(t, 10*time.Second, func() bool {
		o, _, _ := a.get()
		return o == n
	}, msg)
}

func (a *limAdmit) waitAdmitted(t *testing.T, n int) {
	t.Helper()
	rpctest.Eventually(t, 10*time.Second, func() bool {
		_, ad, _ := a.get()
		return ad >= n
	}, "connection not admitted")
}

// settleGoroutines waits until the goroutine count is at most max, and
// returns the count it settled at.
func settleGoroutines(max int, within time.Duration) int {
	deadline := time.Now().Add(within)
	n := runtime.NumGoroutine()
	for n > max && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		n = runtime.NumGoroutine()
	}
	return n
}

// stableGoroutines waits for the count to stop moving and returns it.
func stableGoroutines() int {
	prev := runtime.NumGoroutine()
	for i := 0; i < 50; i++ {
		time.Sleep(20 * time.Millisecond)
		n := runtime.NumGoroutine()
		if n == prev {
			return n
		}
		prev = n
	}
	return prev
}

func (b *testBundle) addr() string { return strings.TrimPrefix(b.url, "http://") }

// TestHTTPLimits_SlotsReturnedOnEveryEnd: every way an admitted HTTP
// connection ends gives its slot back and leaves no goroutine behind.
func TestHTTPLimits_SlotsReturnedOnEveryEnd(t *testing.T) {
	a := &limAdmit{}
	b := setup(t, func(c *Config) { c.Admit = a.admit })
	b.enqueueTexts("warm", "x") // warm up the client and server
	b.client.Transport.(*http.Transport).CloseIdleConnections()
	a.waitOpen(t, 0, "warm-up connection")
	base := stableGoroutines()

	// Client closes mid-headers.
	c1, err := net.Dial("tcp", b.addr())
	require.NoError(t, err)
	_, err = io.WriteString(c1, "POST /v1/queues/q/items HTTP/1.1\r\nHost: localhost\r\nConte")
	require.NoError(t, err)
	a.waitAdmitted(t, 2)
	require.NoError(t, c1.Close())
	a.waitOpen(t, 0, "mid-headers close: slot not returned")

	// Client closes mid-body.
	c2, err := net.Dial("tcp", b.addr())
	require.NoError(t, err)
	_, err = io.WriteString(c2, "POST /v1/queues/q/items HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n[{\"text\"")
	require.NoError(t, err)
	a.waitAdmitted(t, 3)
	require.NoError(t, c2.Close())
	a.waitOpen(t, 0, "mid-body close: slot not returned")

	// Long poll the client abandons: waiter and slot returned.
	ctx, cancel := context.WithCancel(context.Background())
	ch := b.pollAsync(ctx, "lp", PollRequest{WaitMs: 20000})
	parked(t, b.srv.disp, "lp", 1)
	cancel()
	require.Error(t, recvAnswer(t, ch).err)
	parked(t, b.srv.disp, "lp", 0)
	a.waitOpen(t, 0, "abandoned long poll: slot not returned")

	// Keep-alive idle connection closed by the client.
	b.call(http.MethodGet, "/v1/queues", nil, nil)
	o, _, _ := a.get()
	require.Equal(t, 1, o, "keep-alive connection held")
	b.client.Transport.(*http.Transport).CloseIdleConnections()
	a.waitOpen(t, 0, "idle keep-alive close: slot not returned")

	n := settleGoroutines(base, 10*time.Second)
	require.LessOrEqual(t, n, base, "goroutines leaked")

	// Stop with a parked long poll: 503, slot returned.
	ch = b.pollAsync(context.Background(), "lp", PollRequest{WaitMs: 20000})
	parked(t, b.srv.disp, "lp", 1)
	b.srv.Stop()
	ans := recvAnswer(t, ch)
	require.NoError(t, ans.err)
	require.Equal(t, http.StatusServiceUnavailable, ans.status, "%s", ans.body)
	b.client.Transport.(*http.Transport).CloseIdleConnections()
	a.waitOpen(t, 0, "Stop with a parked poll: slot not returned")
}

// TestHTTPLimits_RefusalsInProgressAreBounded (found by review, session
// 69; failed before its fix): the RPC listener holds at most maxRefusing
// (64) refusals under way; the HTTP listener starts a goroutine per
// refused connection that waits up to refuseTimeout for a request, without
// bound. A peer over its limit that keeps connecting (sending nothing)
// makes the node hold a goroutine and a socket for each.
func TestHTTPLimits_RefusalsInProgressAreBounded(t *testing.T) {
	a := &limAdmit{refuse: true}
	b := setup(t, func(c *Config) { c.Admit = a.admit })
	t.Cleanup(func() { b.clock.Add(refuseTimeout) }) // end the refusals (mock clock)
	base := stableGoroutines()
	const n = 200
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", b.addr())
		require.NoError(t, err)
		conns = append(conns, c)
	}
	rpctest.Eventually(t, 10*time.Second, func() bool {
		_, _, r := a.get()
		return r == n
	}, "not all refused")
	held := stableGoroutines() - base
	require.LessOrEqual(t, held, 64+8,
		"%d refused connections that sent nothing hold %d goroutines (and sockets) for refuseTimeout; the RPC listener caps refusals under way at 64", n, held)
}

// TestHTTPLimits_StopEndsRefusals (found by review, session 69; failed
// before its fix): Stop does not end refusals under way (the RPC server's
// refuse closes on its stop context, and Stop waits for it): after Stop
// returns, a refused connection that sent nothing stays open and its
// goroutine keeps running until refuseTimeout passes.
func TestHTTPLimits_StopEndsRefusals(t *testing.T) {
	a := &limAdmit{refuse: true}
	b := setup(t, func(c *Config) { c.Admit = a.admit })
	t.Cleanup(func() { b.clock.Add(refuseTimeout) })
	base := stableGoroutines()
	c, err := net.Dial("tcp", b.addr())
	require.NoError(t, err)
	defer c.Close()
	rpctest.Eventually(t, 10*time.Second, func() bool {
		_, _, r := a.get()
		return r == 1
	}, "not refused")
	b.srv.Stop()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(3*time.Second)))
	_, err = io.ReadAll(c)
	require.NoError(t, err, "after Stop returned the refused connection is still open (read: %v)", err)
	n := settleGoroutines(base-1, 3*time.Second) // the client's conn has none
	require.LessOrEqual(t, n, base, "the refusal's goroutine outlives Stop")
}

// TestHTTPLimits_RefusedRequestWithBodyGets503: a refused connection whose
// request has a body gets the 503 naming the reason, not a reset (the
// RPC refusal half-closes and drains; the HTTP one closes with the body
// unread, which makes the kernel send RST and discard the answer).
func TestHTTPLimits_RefusedRequestWithBodyGets503(t *testing.T) {
	a := &limAdmit{refuse: true}
	b := setup(t, func(c *Config) { c.Admit = a.admit })
	t.Cleanup(func() { b.clock.Add(refuseTimeout) })
	fails := 0
	const tries = 5
	var lastErr error
	for i := 0; i < tries; i++ {
		c, err := net.Dial("tcp", b.addr())
		require.NoError(t, err)
		body := bytes.Repeat([]byte("a"), 256<<10)
		go func() {
			_, _ = fmt.Fprintf(c, "POST /v1/queues/q/items HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", len(body))
			_, _ = c.Write(body)
		}()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err == nil {
			raw, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr != nil || resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(raw), "too many connections") {
				fails++
				lastErr = fmt.Errorf("status %d body %q err %v", resp.StatusCode, raw, rerr)
			}
		} else {
			fails++
			lastErr = err
		}
		_ = c.Close()
	}
	require.Zero(t, fails, "%d of %d refused POSTs with a body lost their 503 (last: %v)", fails, tries, lastErr)
}

// TestHTTPLimits_StalledBodyReleasesBudget (found by review, session 69;
// failed before its fix): a request that announces a body (Content-Length)
// and sends none takes the node's in-flight budget for the whole length
// and holds it until net/http's ReadTimeout (5 min plus the longest wait,
// in real time): every other body, and every RPC message drawing on the
// same budget, waits for it. The RPC server closes a body that makes no
// progress for FirstMessageTimeout (10 s, on the injected clock;
// lean_bodywatch.go).
func TestHTTPLimits_StalledBodyReleasesBudget(t *testing.T) {
	const size = 64 << 10
	sem := semaphore.NewWeighted(size)
	a := &limAdmit{}
	b := setup(t, func(c *Config) {
		c.Inflight, c.InflightLimit = sem, size
		c.Admit = a.admit
	})
	hostile, err := net.Dial("tcp", b.addr())
	require.NoError(t, err)
	defer hostile.Close()
	_, err = fmt.Fprintf(hostile, "POST /v1/queues/q/items HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", size)
	require.NoError(t, err)
	rpctest.Eventually(t, 10*time.Second, func() bool {
		if sem.TryAcquire(1) {
			sem.Release(1)
			return false
		}
		return true
	}, "the stalled request did not take the budget")

	done := make(chan error, 1)
	go func() {
		resp, err := b.send(context.Background(), http.MethodPost, "/v1/queues/q/items", "application/json", `[{"text":"bystander"}]`)
		if err == nil {
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
			resp.Body.Close()
		}
		done <- err
	}()
	// Far more than any progress timeout passes, on the injected clock.
	for i := 0; i < 12; i++ {
		b.clock.Add(10 * time.Second)
	}
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		_ = hostile.Close() // unblock, so the test can end
		require.NoError(t, <-done)
		t.Fatal("a body announced and never sent held the whole in-flight budget for 2 minutes (injected clock); the bystander's enqueue waited for it")
	}
}

// TestHTTPLimits_SlowlorisHeadersBounded: headers trickled byte by byte are
// cut off by ReadHeaderTimeout (real time), the slot is returned, and
// another client is served meanwhile.
func TestHTTPLimits_SlowlorisHeadersBounded(t *testing.T) {
	t.Parallel()
	a := &limAdmit{}
	b := setup(t, func(c *Config) { c.Admit = a.admit })
	c, err := net.Dial("tcp", b.addr())
	require.NoError(t, err)
	defer c.Close()
	stop := make(chan struct{})
	closed := make(chan time.Time, 1)
	start := time.Now()
	go func() {
		req := "GET /v1/queues HTTP/1.1\r\nHost: localhost\r\nX-Pad: " + strings.Repeat("a", 10000)
		for i := 0; i < len(req); i++ {
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := c.Write([]byte{req[i]}); err != nil {
				closed <- time.Now()
				return
			}
		}
	}()
	defer close(stop)
	a.waitAdmitted(t, 1)
	b.call(http.MethodGet, "/v1/queues", nil, nil) // served meanwhile
	b.client.Transport.(*http.Transport).CloseIdleConnections()
	rpctest.Eventually(t, 20*time.Second, func() bool {
		o, _, _ := a.get()
		return o == 0
	}, "slowloris connection still holds its slot")
	require.Less(t, time.Since(start), readHeaderTimeout+5*time.Second)
	_ = storage.Limits{}
}

// TestHTTPLimits_LongPollsCountAgainstWaiterLimits: a parked HTTP poll takes a
// waiter slot of the shared dispatcher (a second one over the per-queue
// limit gets 429), and gives it back when its client goes away.
func TestHTTPLimits_LongPollsCountAgainstWaiterLimits(t *testing.T) {
	var d *dispatch.Dispatcher
	b := setup(t, func(c *Config) {
		var err error
		d, err = dispatch.New(dispatch.Config{Store: c.Store, Clock: c.Clock, MaxWaitersPerQueue: 1})
		require.NoError(t, err)
		c.Dispatcher = d
	})
	t.Cleanup(d.Close)
	ctx, cancel := context.WithCancel(context.Background())
	ch := b.pollAsync(ctx, "w", PollRequest{WaitMs: 20000})
	parked(t, d, "w", 1)
	b.fails(http.MethodPost, "/v1/queues/w/poll", "application/json", PollRequest{WaitMs: 20000}, http.StatusTooManyRequests, "tooManyWaiters", "")
	cancel()
	require.Error(t, recvAnswer(t, ch).err)
	parked(t, d, "w", 0)
	ch = b.pollAsync(context.Background(), "w", PollRequest{WaitMs: 20000})
	parked(t, d, "w", 1)
	b.enqueueTexts("w", "x")
	require.Len(t, recvPoll(t, ch).Items, 1)
}
