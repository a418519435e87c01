package httpapi

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// A node run with --max-batch under DefaultPageLimit (100): a listing or
// redrive that names no limit takes MaxBatch (found by review, session 70:
// the store refused them, "limit must be 1-50, got 100").
func TestLimits_DefaultPageLimitOverMaxBatch(t *testing.T) {
	lim := storage.Limits{MaxBatch: 50}
	s, err := rocksstore.Open(t.TempDir(), rocksstore.Options{Sync: rocksstore.SyncNone, Limits: lim})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	b := setup(t, func(c *Config) { c.Store, c.Limits = s, lim })
	b.store = s
	b.enqueueTexts("q", "a", "b")
	var page PageResponse
	b.call(http.MethodGet, "/v1/queues/q/items", nil, &page)
	require.Len(t, page.Items, 2)
	b.call(http.MethodGet, "/v1/queues/q/dlq", nil, &page)
	require.Empty(t, page.Items)
	var dr DeadResponse
	b.call(http.MethodPost, "/v1/queues/q/dlq/redrive", DeadRequest{All: true}, &dr)
}

// A request must name the node by an IP address, localhost or a name of
// Config.AllowedHosts (421 otherwise: DNS rebinding), with or without a
// browser's headers: a browser sends none with a same-origin GET to a
// plain-http origin (found by review, session 70).
func TestHostGuard_Hosts(t *testing.T) {
	b := setup(t, func(c *Config) { c.AllowedHosts = []string{"queue.example"} })
	get := func(host string, browser bool) int {
		req, err := http.NewRequest(http.MethodGet, b.url+"/v1/queues", nil)
		require.NoError(t, err)
		req.Host = host
		if browser {
			req.Header.Set("Sec-Fetch-Site", "same-origin")
		}
		resp, err := b.client.Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode
	}
	for _, h := range []string{"127.0.0.1:7701", "[::1]:7701", "localhost:7701", "app.localhost", "queue.example:7701", "QUEUE.EXAMPLE"} {
		require.Equal(t, http.StatusOK, get(h, true), h)
	}
	for _, h := range []string{"evil.test:7701", "example", "queue.example.evil.test"} {
		require.Equal(t, http.StatusMisdirectedRequest, get(h, true), h)
		require.Equal(t, http.StatusMisdirectedRequest, get(h, false), "%s without browser headers", h)
	}
}

// Over a unix socket, which no browser reaches, any Host is taken.
func TestHostGuard_UnixSocketTakesAnyHost(t *testing.T) {
	dir, err := os.MkdirTemp("", "lq")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "h.sock")
	s, err := rocksstore.Open(t.TempDir(), rocksstore.Options{Sync: rocksstore.SyncNone})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	srv, err := New(Config{Store: s, Clock: clock.NewMock()})
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	require.NoError(t, srv.Start(context.Background(), ln))
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	resp, err := (&http.Client{Transport: tr}).Get("http://queue.internal/v1/queues")
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}
