package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/semaphore"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// stopStore is a store whose calls the review tests of Stop hold or slow
// down: an armed Enqueue or Poll reports it started and waits for release
// before it commits (Poll under a context that cannot end: the claim
// commits whatever the request's context does); a give-back (an
// undelivered Nack) is slowed by slowGiveBack.
type stopStore struct {
	storage.Store
	armEnqueue, armPoll atomic.Bool
	started             chan struct{}
	release             chan struct{}
	releaseOnce         sync.Once
	slowGiveBack        time.Duration
	gaveBack            atomic.Int32
}

// newStopStore wraps s. A test registers releaseAll with t.Cleanup after
// setup, so a test that fails before it releases the held calls has them
// released before its server's Stop.
func newStopStore(s storage.Store) *stopStore {
	return &stopStore{Store: s, started: make(chan struct{}, 4), release: make(chan struct{})}
}

func (s *stopStore) releaseAll() { s.releaseOnce.Do(func() { close(s.release) }) }

func (s *stopStore) Enqueue(ctx context.Context, p storage.EnqueueParams) ([]storage.EnqueueResult, error) {
	if s.armEnqueue.Load() {
		s.started <- struct{}{}
		<-s.release
	}
	return s.Store.Enqueue(ctx, p)
}

func (s *stopStore) Poll(ctx context.Context, p storage.PollParams) (storage.PollResult, error) {
	if s.armPoll.Load() {
		s.started <- struct{}{}
		<-s.release
		return s.Store.Poll(context.Background(), p)
	}
	return s.Store.Poll(ctx, p)
}

func (s *stopStore) Nack(ctx context.Context, p storage.NackParams) ([]storage.Code, error) {
	if p.Undelivered && s.slowGiveBack > 0 {
		time.Sleep(s.slowGiveBack)
	}
	codes, err := s.Store.Nack(ctx, p)
	if p.Undelivered {
		s.gaveBack.Add(1)
	}
	return codes, err
}

func waitStarted(t *testing.T, s *stopStore) {
	t.Helper()
	select {
	case <-s.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the store call did not start")
	}
}

// stopAsync calls Stop on its own goroutine; the channel closes when it
// returns.
func stopAsync(srv *Server) <-chan struct{} {
	stopped := make(chan struct{})
	go func() {
		srv.Stop()
		close(stopped)
	}()
	return stopped
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatal(what)
	}
}

func queueStats(t *testing.T, b *testBundle, queue string) storage.QueueStats {
	t.Helper()
	st, err := b.store.Stats(context.Background(), storage.StatsParams{Queue: queue, Now: b.clock.Now()})
	require.NoError(t, err)
	require.Len(t, st, 1)
	return st[0]
}

// TestReviewStop74_AppliedEnqueueIsAnsweredAtStop: an enqueue whose store
// call is running when Stop begins is answered (200, its ids, the whole
// body) before its connection closes, and Stop waits for it; the RPC
// server's clean stop once lost such answers. An edge that is right:
// http.Server.Shutdown waits for running handlers and their writes.
func TestReviewStop74_AppliedEnqueueIsAnsweredAtStop(t *testing.T) {
	t.Parallel()
	var st *stopStore
	b := setup(t, func(c *Config) { st = newStopStore(c.Store); c.Store = st })
	t.Cleanup(st.releaseAll)
	st.armEnqueue.Store(true)
	ch := make(chan answer, 1)
	go func() {
		resp, err := b.send(context.Background(), http.MethodPost, "/v1/queues/q/items", "application/json",
			[]EnqueueItem{{Text: ptr("a")}, {Text: ptr("b")}})
		if err != nil {
			ch <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		ch <- answer{status: resp.StatusCode, body: raw, err: err}
	}()
	waitStarted(t, st)
	st.armEnqueue.Store(false)
	stopped := stopAsync(b.srv)
	waitClosed(t, b.srv.stopCtx.Done(), "Stop did not begin")
	select {
	case <-stopped:
		t.Fatal("Stop returned while an enqueue was running")
	default:
	}
	st.releaseAll()
	a := recvAnswer(t, ch)
	require.NoError(t, a.err)
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	var res EnqueueResponse
	require.NoError(t, json.Unmarshal(a.body, &res))
	require.Len(t, res.IDs, 2)
	require.NotNil(t, res.IDs[0])
	waitClosed(t, stopped, "Stop did not return")
	require.EqualValues(t, 2, queueStats(t, b, "q").Ready)
}

// TestReviewStop74_PollClaimingAsStopBeginsIsAnswered: a poll whose claim
// commits just as Stop begins (its context already ended by Stop) is
// answered with its items and lease, which the store holds as leased to
// it; it is not a 503 over items left leased. An edge that is right.
func TestReviewStop74_PollClaimingAsStopBeginsIsAnswered(t *testing.T) {
	t.Parallel()
	var st *stopStore
	b := setup(t, func(c *Config) { st = newStopStore(c.Store); c.Store = st })
	t.Cleanup(st.releaseAll)
	b.enqueueTexts("q", "x", "y")
	st.armPoll.Store(true)
	ch := b.pollAsync(context.Background(), "q", PollRequest{Max: ptr(int64(2)), WaitMs: 60000})
	waitStarted(t, st)
	st.armPoll.Store(false)
	stopped := stopAsync(b.srv)
	waitClosed(t, b.srv.stopCtx.Done(), "Stop did not begin")
	st.releaseAll()
	p := recvPoll(t, ch)
	require.Len(t, p.Items, 2)
	require.NotEmpty(t, p.Lease)
	waitClosed(t, stopped, "Stop did not return")
	s := queueStats(t, b, "q")
	require.EqualValues(t, 2, s.Inflight, "the items are the answered lease's")
	// The client holds the lease: it can ack the items (through the store,
	// the API being stopped).
	lease, err := storage.ParseLeaseID(p.Lease)
	require.NoError(t, err)
	ids := make([]storage.ItemID, len(p.Items))
	for i := range p.Items {
		ids[i], err = storage.ParseItemID(p.Items[i].ID)
		require.NoError(t, err)
	}
	codes, err := b.store.Ack(context.Background(), storage.AckParams{Queue: "q", Lease: lease, IDs: ids, Now: b.clock.Now()})
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK}, codes)
}

// dialSmallWindow connects to addr with a small receive buffer, so an
// answer of a few MiB that nobody reads blocks the server's write.
func dialSmallWindow(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}); err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// TestReviewStop74_UnreadPollAnswerIsGivenBackBeforeStopReturns: a poll
// answer its client does not read holds Stop for shutdownTimeout only;
// then its connection is closed, and its items are given back before Stop
// returns. Found by review (session 74): Stop returned once it had closed
// the connections, while the handler whose write failed was still giving
// the items back (and serve.go closes the store right after Stop): the
// give-back raced the store's close, and items stayed leased.
func TestReviewStop74_UnreadPollAnswerIsGivenBackBeforeStopReturns(t *testing.T) {
	t.Parallel()
	var st *stopStore
	b := setup(t, func(c *Config) { st = newStopStore(c.Store); c.Store = st })
	t.Cleanup(st.releaseAll)
	st.slowGiveBack = 300 * time.Millisecond
	big := strings.Repeat("a", 1<<20)
	const n = 12 // 12 MiB of answer: more than the socket buffers hold
	items := make([]EnqueueItem, n)
	for i := range items {
		items[i].Text = &big
	}
	b.call(http.MethodPost, "/v1/queues/q/items", items, nil)

	conn := dialSmallWindow(t, strings.TrimPrefix(b.url, "http://"))
	body := fmt.Sprintf(`{"max": %d, "lease_ms": 3600000}`, n)
	_, err := fmt.Fprintf(conn, "POST /v1/queues/q/poll HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	require.NoError(t, err)
	rpctest.Eventually(t, 30*time.Second, func() bool { return queueStats(t, b, "q").Inflight == n }, "the poll did not claim")

	stopped := stopAsync(b.srv)
	waitClosed(t, b.srv.stopCtx.Done(), "Stop did not begin")
	// Stop is bounded by shutdownTimeout on the node's clock (advanced
	// again in case Stop had not yet set its timer).
	for i := 0; ; i++ {
		require.Less(t, i, 30, "Stop did not return after shutdownTimeout")
		b.clock.Add(shutdownTimeout)
		select {
		case <-stopped:
		case <-time.After(time.Second):
			continue
		}
		break
	}
	require.EqualValues(t, 1, st.gaveBack.Load(), "Stop returned before the unwritten answer's items were given back")
	s := queueStats(t, b, "q")
	require.EqualValues(t, 0, s.Inflight)
	require.EqualValues(t, n, s.Ready)
}

// TestReviewStop74_BudgetWaitEndsAtStop: a request waiting for the
// in-flight budget when Stop begins gets a 503 at once (nothing of it was
// carried out), and Stop does not wait shutdownTimeout for it. Found by
// review (session 74): the wait ended only with the request's context,
// which closing its connection does not end while its body is unread, so
// Stop waited the whole shutdownTimeout and the handler outlived it.
func TestReviewStop74_BudgetWaitEndsAtStop(t *testing.T) {
	t.Parallel()
	const size = 1 << 20
	sem := semaphore.NewWeighted(size)
	waiting := make(chan struct{}, 1)
	b := setupWith(t, func(c *Config) {
		c.Inflight, c.InflightLimit = sem, size
	}, func(s *Server) {
		s.onBudgetWait = func() {
			select {
			case waiting <- struct{}{}:
			default:
			}
		}
	})
	require.True(t, sem.TryAcquire(size)) // another user holds the whole budget
	released := false
	defer func() {
		if !released {
			sem.Release(size)
		}
	}()
	ch := make(chan answer, 1)
	go func() {
		resp, err := b.send(context.Background(), http.MethodPost, "/v1/queues/q/items", "application/json", []EnqueueItem{{Text: ptr("a")}})
		if err != nil {
			ch <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		ch <- answer{status: resp.StatusCode, body: raw, err: err}
	}()
	waitClosed(t, waiting, "the request did not wait for the budget")
	stopped := stopAsync(b.srv)
	a := recvAnswer(t, ch)
	require.NoError(t, a.err)
	requireError(t, a.status, a.body, http.StatusServiceUnavailable, "unavailable", "budget")
	waitClosed(t, stopped, "Stop did not return")
	sem.Release(size)
	released = true
	_, err := b.store.Stats(context.Background(), storage.StatsParams{Queue: "q", Now: b.clock.Now()})
	require.ErrorIs(t, err, storage.ErrNotFound, "a refused request was carried out")
}

// TestReviewStop74_RequestAfterStopBeganIsNotCarriedOut: a request sent
// on a connection accepted before Stop, arriving after Stop began (while
// Stop waits for a running enqueue), is not carried out: it is answered
// 503 unavailable, or its connection is closed with no answer at all.
// The latter is what happens: net/http's Shutdown drops a request it
// reads once shutdown began (conn.serve checks shuttingDown after
// readRequest), so wrap's isStopping 503 is seen only by a request read
// just before Shutdown. Not fixed (session 74 review): answering 503
// needs a drain before Shutdown; see the report.
func TestReviewStop74_RequestAfterStopBeganIsNotCarriedOut(t *testing.T) {
	t.Parallel()
	var st *stopStore
	accepted := make(chan struct{}, 4)
	b := setupWith(t, func(c *Config) { st = newStopStore(c.Store); c.Store = st }, func(s *Server) {
		s.srv.ConnState = func(_ net.Conn, cs http.ConnState) {
			if cs == http.StateNew {
				accepted <- struct{}{}
			}
		}
	})
	t.Cleanup(st.releaseAll)
	// A running enqueue keeps Stop waiting.
	st.armEnqueue.Store(true)
	ch := make(chan answer, 1)
	go func() {
		resp, err := b.send(context.Background(), http.MethodPost, "/v1/queues/q/items", "application/json", []EnqueueItem{{Text: ptr("a")}})
		if err != nil {
			ch <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		ch <- answer{status: resp.StatusCode, body: raw, err: err}
	}()
	waitStarted(t, st)
	st.armEnqueue.Store(false)
	waitClosed(t, accepted, "no connection")

	conn, err := net.Dial("tcp", strings.TrimPrefix(b.url, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	waitClosed(t, accepted, "the second connection was not accepted")

	stopped := stopAsync(b.srv)
	waitClosed(t, b.srv.stopCtx.Done(), "Stop did not begin")
	body := `[{"text":"b"}]`
	_, err = fmt.Fprintf(conn, "POST /v1/queues/q/items HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err == nil {
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		requireError(t, resp.StatusCode, raw, http.StatusServiceUnavailable, "unavailable", "server shutting down")
		require.Equal(t, "1", resp.Header.Get("Retry-After"))
		require.True(t, resp.Close, "the refusal closes the connection")
	} else {
		require.ErrorIs(t, err, io.ErrUnexpectedEOF, "closed with no answer")
	}

	st.releaseAll()
	a := recvAnswer(t, ch)
	require.NoError(t, a.err)
	require.Equal(t, http.StatusOK, a.status, "%s", a.body)
	waitClosed(t, stopped, "Stop did not return")
	require.EqualValues(t, 1, queueStats(t, b, "q").Ready, "only the running enqueue was carried out")
}
