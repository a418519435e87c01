package httpapi

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/rpc/dispatch"
	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// answer is one HTTP answer received by a goroutine.
type answer struct {
	status int
	body   []byte
	err    error
}

// pollAsync sends a poll from a goroutine; the answer arrives on the
// channel.
func (b *testBundle) pollAsync(ctx context.Context, queue string, req PollRequest) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		resp, err := b.send(ctx, http.MethodPost, "/v1/queues/"+queue+"/poll", "application/json", req)
		if err != nil {
			ch <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		ch <- answer{status: resp.StatusCode, body: raw, err: err}
	}()
	return ch
}

func recvAnswer(t *testing.T, ch <-chan answer) answer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(30 * time.Second):
		t.Fatal("no answer")
	}
	return answer{}
}

func recvPoll(t *testing.T, ch <-chan answer) PollResponse {
	t.Helper()
	a := recvAnswer(t, ch)
	require.NoError(t, a.err)
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	var p PollResponse
	require.NoError(t, json.Unmarshal(a.body, &p))
	return p
}

// parked waits until n polls are parked on queue.
func parked(t *testing.T, d *dispatch.Dispatcher, queue string, n int) {
	t.Helper()
	rpctest.Eventually(t, 30*time.Second, func() bool { return d.QueueWaiters(queue) == n })
}

func TestHTTP_LongPoll(t *testing.T) {
	t.Parallel()

	t.Run("EmptyAfterWait", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		ch := b.pollAsync(context.Background(), "q", PollRequest{WaitMs: 5000})
		parked(t, b.srv.disp, "q", 1)
		b.clock.Add(4999 * time.Millisecond)
		select {
		case a := <-ch:
			t.Fatalf("answered before the wait ended: %d %s", a.status, a.body)
		default:
		}
		b.clock.Add(time.Millisecond)
		p := recvPoll(t, ch)
		require.Empty(t, p.Items)
		require.Empty(t, p.Lease)
	})

	t.Run("WokenEarlyByEnqueue", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		ch := b.pollAsync(context.Background(), "q", PollRequest{WaitMs: 60000})
		parked(t, b.srv.disp, "q", 1)
		ids := b.enqueueTexts("q", "wake up")
		p := recvPoll(t, ch)
		require.Len(t, p.Items, 1)
		require.Equal(t, ids[0], p.Items[0].ID)
	})

	t.Run("WokenByRedriveAndNack", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.call(http.MethodPut, "/v1/queues/q/config", ConfigUpdate{MaxAttempts: ptr[int64](1)}, nil)
		ids := b.enqueueTexts("q", "x")
		p := b.poll("q", PollRequest{})
		b.call(http.MethodPost, "/v1/queues/q/nack", SettleRequest{Lease: p.Lease, IDs: ids}, nil) // dead: out of attempts
		ch := b.pollAsync(context.Background(), "q", PollRequest{WaitMs: 60000})
		parked(t, b.srv.disp, "q", 1)
		b.call(http.MethodPost, "/v1/queues/q/dlq/redrive", DeadRequest{All: true}, nil)
		p = recvPoll(t, ch)
		require.Len(t, p.Items, 1)

		b.call(http.MethodPut, "/v1/queues/q/config", ConfigUpdate{MaxAttempts: ptr[int64](5)}, nil)
		ch = b.pollAsync(context.Background(), "q", PollRequest{WaitMs: 60000})
		parked(t, b.srv.disp, "q", 1)
		b.call(http.MethodPost, "/v1/queues/q/nack", SettleRequest{Lease: p.Lease, IDs: ids, DelayMs: ptr[int64](0)}, nil)
		require.Len(t, recvPoll(t, ch).Items, 1)
	})

	t.Run("ClientDisconnectCancelsTheWait", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		ctx, cancel := context.WithCancel(context.Background())
		ch := b.pollAsync(ctx, "q", PollRequest{WaitMs: 60000})
		parked(t, b.srv.disp, "q", 1)
		cancel()
		require.Error(t, recvAnswer(t, ch).err)
		parked(t, b.srv.disp, "q", 0)
		// Nothing was leased for the gone client.
		ids := b.enqueueTexts("q", "x")
		require.Equal(t, ids[0], b.poll("q", PollRequest{}).Items[0].ID)
	})

	t.Run("ShutdownEndsParkedPollsUnavailable", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		ch := b.pollAsync(context.Background(), "q", PollRequest{WaitMs: 60000})
		parked(t, b.srv.disp, "q", 1)
		stopped := make(chan struct{})
		go func() {
			b.srv.Stop()
			close(stopped)
		}()
		a := recvAnswer(t, ch)
		require.NoError(t, a.err)
		requireError(t, a.status, a.body, http.StatusServiceUnavailable, "unavailable", "server shutting down")
		select {
		case <-stopped:
		case <-time.After(30 * time.Second):
			t.Fatal("Stop did not return")
		}
	})

	t.Run("TooManyWaiters", func(t *testing.T) {
		t.Parallel()
		var d *dispatch.Dispatcher
		b := setup(t, func(c *Config) {
			var err error
			d, err = dispatch.New(dispatch.Config{Store: c.Store, Clock: c.Clock, MaxWaitersPerQueue: 1})
			require.NoError(t, err)
			c.Dispatcher = d
		})
		t.Cleanup(d.Close)
		ch := b.pollAsync(context.Background(), "q", PollRequest{WaitMs: 60000})
		parked(t, d, "q", 1)
		b.fails(http.MethodPost, "/v1/queues/q/poll", "application/json", PollRequest{WaitMs: 1000}, 429, "tooManyWaiters", "limit 1")
		// A poll that need not wait is no waiter.
		b.call(http.MethodPost, "/v1/queues/q/poll", PollRequest{}, nil)
		b.enqueueTexts("q", "x")
		require.Len(t, recvPoll(t, ch).Items, 1)
	})

	t.Run("Limits", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.fails(http.MethodPost, "/v1/queues/q/poll", "application/json", PollRequest{Max: ptr[int64](0)}, 400, "invalidArgument", "max must be 1-1000, got 0")
		b.fails(http.MethodPost, "/v1/queues/q/poll", "application/json", PollRequest{Max: ptr[int64](1001)}, 400, "invalidArgument", "max must be 1-1000, got 1001")
		b.fails(http.MethodPost, "/v1/queues/q/poll", "application/json", PollRequest{WaitMs: 60001}, 400, "invalidArgument", "wait 1m0.001s outside [0, 1m0s]")
		b.fails(http.MethodPost, "/v1/queues/q/poll", "application/json", PollRequest{LeaseMs: 50}, 400, "invalidArgument", "lease 50ms outside")
		b.fails(http.MethodPost, "/v1/queues/q/poll", "application/json", PollRequest{LeaseMs: -1}, 400, "invalidArgument", "lease -1ms outside")
		b.fails(http.MethodPost, "/v1/queues/q/poll", "application/json", `{"wait_ms": 9223372036854775807}`, 400, "invalidArgument", "wait 2562047h47m16.854775807s outside")
	})
}

// TestHTTP_SharesTheRPCDispatcher: with the RPC server's Dispatcher, an
// enqueue over RPC wakes a long poll parked over HTTP, an enqueue over
// HTTP wakes one parked over RPC, and both count in one line of waiters.
func TestHTTP_SharesTheRPCDispatcher(t *testing.T) {
	t.Parallel()
	var rs *rpc.Server
	b := setup(t, func(c *Config) {
		var err error
		rs, err = rpc.NewServer(rpc.ServerConfig{Store: c.Store, Clock: c.Clock, Logger: c.Logger})
		require.NoError(t, err)
		c.Dispatcher = rs.Dispatcher()
		c.Leases = rs
		c.Inflight, c.InflightLimit = rs.InflightBudget()
	})
	t.Cleanup(rs.Stop) // after the HTTP server's Stop: cleanups run last first
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, rs.Start(context.Background(), ln))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc, err := rpc.Dial(ctx, ln.Addr().String(), rpc.ClientOptions{Logger: rpctest.Logger(t)})
	require.NoError(t, err)
	defer rc.Close()

	ch := b.pollAsync(context.Background(), "q", PollRequest{WaitMs: 60000})
	parked(t, rs.Dispatcher(), "q", 1)
	_, err = rc.Enqueue(ctx, "q", []storage.EnqueueItem{{Payload: []byte("over rpc")}})
	require.NoError(t, err)
	p := recvPoll(t, ch)
	require.Equal(t, "over rpc", *p.Items[0].Text)

	done := make(chan storage.PollResult, 1)
	go func() {
		res, err := rc.Poll(ctx, "q", 1, 0, time.Minute)
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	parked(t, rs.Dispatcher(), "q", 1)
	require.Equal(t, 1, rs.Metrics().Waiters)
	b.enqueueTexts("q", "over http")
	select {
	case res := <-done:
		require.Equal(t, []byte("over http"), res.Items[0].Payload)
	case <-time.After(30 * time.Second):
		t.Fatal("the RPC poll was not woken by an HTTP enqueue")
	}
}
