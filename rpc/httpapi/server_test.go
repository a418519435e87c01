package httpapi

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/semaphore"

	"github.com/leaseq/leaseq/rpc/rpctest"
)

func testClock() *clock.Mock {
	m := clock.NewMock()
	m.Set(testStart)
	return m
}

func TestServer_Config(t *testing.T) {
	t.Parallel()
	store := openRocks(t)
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"NoStore", Config{Clock: testClock()}, "Store is required"},
		{"NoClock", Config{Store: store}, "Clock is required"},
		{"NegativeBody", Config{Store: store, Clock: testClock(), MaxBodyBytes: -1}, "negative limit"},
		{"BudgetWithoutSize", Config{Store: store, Clock: testClock(), Inflight: semaphore.NewWeighted(10)}, "InflightLimit"},
	} {
		_, err := New(tc.cfg)
		require.ErrorContains(t, err, tc.want, tc.name)
	}
}

// TestServer_StartStop: Stop is idempotent and safe before Start; a
// stopped server refuses requests with 503 and cannot start; cancelling
// Start's ctx stops the server.
func TestServer_StartStop(t *testing.T) {
	t.Parallel()
	store := openRocks(t)
	for range 20 {
		srv, err := New(Config{Store: store, Clock: testClock()})
		require.NoError(t, err)
		srv.Stop()
		srv.Stop()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		require.ErrorContains(t, srv.Start(context.Background(), ln), "already started or stopped")
		_, err = net.Dial("tcp", ln.Addr().String())
		require.Error(t, err, "Start closed the listener it refused")
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "http://localhost/v1/queues", nil))
		require.Equal(t, http.StatusServiceUnavailable, rec.Code)
		require.Contains(t, rec.Body.String(), `"code":"unavailable"`)
	}

	// Start, serve, Stop, over and over: every goroutine ends (goleak).
	for range 20 {
		srv, err := New(Config{Store: store, Clock: testClock()})
		require.NoError(t, err)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		require.NoError(t, srv.Start(context.Background(), ln))
		tr := &http.Transport{}
		resp, err := (&http.Client{Transport: tr}).Get("http://" + ln.Addr().String() + "/v1/queues")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		srv.Stop()
		tr.CloseIdleConnections()
	}

	srv, err := New(Config{Store: store, Clock: testClock()})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, srv.Start(ctx, ln))
	require.Error(t, srv.Start(ctx, ln), "started twice")
	cancel()
	rpctest.Eventually(t, 30*time.Second, func() bool {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err == nil {
			_ = c.Close()
		}
		return err != nil
	})
	srv.Stop()
}

// TestServer_Mount: handlers mounted beside the API (the web dashboard)
// are served on its listener; /v1/ stays the API's.
func TestServer_Mount(t *testing.T) {
	t.Parallel()
	mock := testClock()
	srv, err := New(Config{Store: openRocks(t), Clock: mock})
	require.NoError(t, err)
	defer srv.Stop()
	ui := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "ui %s", r.URL.Path) })
	require.NoError(t, srv.Mount("/ui/", ui))
	require.ErrorContains(t, srv.Mount("/ui/", ui), "conflicts")
	require.ErrorContains(t, srv.Mount("/v1/ui/", ui), "/v1/ belongs to the API")
	require.ErrorContains(t, srv.Mount("GET /v1/x", ui), "/v1/ belongs to the API")
	require.ErrorContains(t, srv.Mount("/v1", ui), "/v1/ belongs to the API")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, srv.Start(context.Background(), ln))
	require.ErrorContains(t, srv.Mount("/other/", ui), "after Start")
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr}
	get := func(path string) (int, string) {
		resp, err := c.Get("http://" + ln.Addr().String() + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(raw)
	}
	code, body := get("/ui/queues")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ui /ui/queues", body)
	code, body = get("/v1/queues")
	require.Equal(t, http.StatusOK, code)
	require.JSONEq(t, `{"queues":[]}`, body)
	code, _ = get("/elsewhere")
	require.Equal(t, http.StatusNotFound, code, "outside /v1/ and the mounts: net/http's 404")
}

// TestServer_InflightBudget: request bodies draw on the shared in-flight
// budget: while another holder has spent it, a request waits unread; the
// budget is whole again once requests are answered, and a body larger than
// the whole budget is admitted alone.
func TestServer_InflightBudget(t *testing.T) {
	t.Parallel()
	const size = 4096
	sem := semaphore.NewWeighted(size)
	asking := make(chan struct{}, 64)
	b := setupWith(t, func(c *Config) { c.Inflight, c.InflightLimit = sem, size },
		func(s *Server) { s.onBudgetWait = func() { asking <- struct{}{} } })
	b.enqueueTexts("q", "small")
	require.True(t, sem.TryAcquire(size), "the budget is whole after a request")
	sem.Release(size)

	big := strings.Repeat("x", 3*size)
	status, raw := b.request(http.MethodPost, "/v1/queues/q/items", "application/octet-stream", big)
	require.Equal(t, http.StatusOK, status, "a body larger than the budget goes alone: %s", raw)
	require.True(t, sem.TryAcquire(size))

	// The budget is spent elsewhere (RPC calls): the request waits.
	for len(asking) > 0 {
		<-asking
	}
	var wg sync.WaitGroup
	done := make(chan int, 1)
	wg.Go(func() {
		st, _ := b.request(http.MethodPost, "/v1/queues/q/items", "application/json", `[{"text":"waits"}]`)
		done <- st
	})
	<-asking // it asks for its bytes, and cannot have them yet
	select {
	case st := <-done:
		t.Fatalf("answered %d while the budget was spent", st)
	default:
	}
	sem.Release(size)
	require.Equal(t, http.StatusOK, <-done)
	wg.Wait()
	var st QueueStats
	b.call(http.MethodGet, "/v1/queues/q", nil, &st)
	require.EqualValues(t, 3, st.Ready)
	require.True(t, sem.TryAcquire(size), "every request gave its share back")
}

func TestServer_Metrics(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	before := b.srv.Metrics()
	b.enqueueTexts("q", "a")
	b.fails(http.MethodGet, "/v1/queues/nope", "", nil, 404, "notFound", "")
	m := b.srv.Metrics().Sub(before)
	byOp := map[string]OpMetrics{}
	for _, o := range m.Ops {
		byOp[o.Op] = o
	}
	require.Len(t, byOp, len(b.srv.Routes()))
	require.EqualValues(t, 1, byOp["enqueue"].Count)
	require.EqualValues(t, 0, byOp["enqueue"].Errors)
	require.EqualValues(t, 1, byOp["stats"].Count)
	require.EqualValues(t, 1, byOp["stats"].Errors)
	require.EqualValues(t, 0, byOp["poll"].Count)
}

// TestHTTP_AdmitRefusesOverLimit: with Config.Admit (the RPC server's, in
// a node), a connection over the limit gets a 503 naming the reason and is
// closed; an admitted one is released when it closes.
func TestHTTP_AdmitRefusesOverLimit(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	open := 0
	admit := func(net.Conn) (func(), string) {
		mu.Lock()
		defer mu.Unlock()
		if open >= 1 {
			return nil, "leaseq: too many connections (limit 1)"
		}
		open++
		return func() {
			mu.Lock()
			open--
			mu.Unlock()
		}, ""
	}
	b := setup(t, func(c *Config) { c.Admit = admit })
	first, err := net.Dial("tcp", strings.TrimPrefix(b.url, "http://"))
	require.NoError(t, err)
	rpctest.Eventually(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return open == 1
	}, "the first connection was not admitted")

	// A second one is over the limit.
	resp, err := http.Get(b.url + "/v1/queues")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Contains(t, string(body), "too many connections (limit 1)")

	// Closing the first frees its slot.
	require.NoError(t, first.Close())
	rpctest.Eventually(t, 10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return open == 0
	}, "the closed connection was not released")
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err = (&http.Client{Transport: tr}).Get(b.url + "/v1/queues")
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)
}
