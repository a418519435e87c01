package main

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
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
