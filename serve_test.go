package main

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMetricsServer_Readiness: /readyz follows the ready flag (503 while
// the store opens and during shutdown), /healthz is always up, and
// /metrics serves without a running node (no leaseq_ series then).
func TestMetricsServer_Readiness(t *testing.T) {
	t.Parallel()
	var ready atomic.Bool
	h := metricsServer(newNodeCollector(), &ready, slog.New(slog.NewTextHandler(io.Discard, nil))).Handler
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	code, _ := get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	code, _ = get("/healthz")
	require.Equal(t, http.StatusOK, code)
	code, page := get("/metrics")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, page, "leaseq_")
	require.Contains(t, page, "go_goroutines")

	ready.Store(true)
	code, body := get("/readyz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ready", strings.TrimSpace(body))
	ready.Store(false) // shutting down
	code, _ = get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
}

// TestServe_FileModes: under umask 000 the node still keeps its database
// to its owner (directory 0700, files 0600) and gives the unix socket
// --socket-mode (default 0660).
func TestServe_FileModes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		extra []string
		sock  os.FileMode
	}{{nil, 0o660}, {[]string{"--socket-mode", "0600"}, 0o600}} {
		data := filepath.Join(t.TempDir(), "data")
		n := startNodeUmask(t, data, "000", c.extra...)
		// Write something so the WAL has data.
		r := runCLI(t, nil, "", "enqueue", "--addr", n.addr, "q", "secret payload")
		require.Equal(t, 0, r.code, "%s%s", r.stdout, r.stderr)

		fi, err := os.Stat(data)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), "data directory")
		entries, err := os.ReadDir(data)
		require.NoError(t, err)
		require.NotEmpty(t, entries)
		for _, e := range entries {
			fi, err := e.Info()
			require.NoError(t, err)
			require.Zero(t, fi.Mode().Perm()&0o077, "%s is %#o: readable by others", e.Name(), fi.Mode().Perm())
		}
		sock := strings.TrimPrefix(n.addr, "unix:")
		fi, err = os.Stat(sock)
		require.NoError(t, err)
		require.Equal(t, c.sock, fi.Mode().Perm(), "socket mode with %v", c.extra)
		require.Zero(t, n.stop())
	}
}

func TestServe_SocketModeNeedsUnix(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "", "serve", "--data", filepath.Join(t.TempDir(), "d"), "--listen", "127.0.0.1:0", "--socket-mode", "0600")
	require.Equal(t, 2, r.code, "%s%s", r.stdout, r.stderr)
	require.Contains(t, r.stderr, "--socket-mode applies to a unix socket")
	r = runCLI(t, nil, "", "serve", "--socket-mode", "999")
	require.Equal(t, 2, r.code, "%s%s", r.stdout, r.stderr)
	require.Contains(t, r.stderr, "octal")
}
