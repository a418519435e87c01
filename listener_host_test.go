package main

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// getWithHost sends GET url with the Host header host and returns the
// status and the body.
func getWithHost(t *testing.T, c *http.Client, url, host string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Host = host
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// TestServe_MetricsAndPprofHostRule: the --metrics and --pprof listeners
// answer only requests that name the node by an IP address, localhost, a
// name under .localhost or an --http-host name, like --http. Found by
// review (session 70): they had no Host rule, so a page of another site
// whose name the attacker points at 127.0.0.1 (DNS rebinding) could read
// /metrics (queue names and counts) and, with --pprof, the process's
// profiles and heap, as a same-origin page.
func TestServe_MetricsAndPprofHostRule(t *testing.T) {
	t.Parallel()
	metrics, pprof := freePort(t), freePort(t)
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--metrics", metrics, "--pprof", pprof, "--http-host", "node.example")
	n.cli("enqueue", "secret-queue", "x")
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: time.Minute}

	_, mport, _ := strings.Cut(metrics, ":")
	_, pport, _ := strings.Cut(pprof, ":")
	for _, tc := range []struct{ addr, port, path string }{
		{metrics, mport, "/metrics"},
		{metrics, mport, "/healthz"},
		{metrics, mport, "/readyz"},
		{pprof, pport, "/debug/pprof/"},
		{pprof, pport, "/debug/pprof/heap"},
	} {
		url := "http://" + tc.addr + tc.path
		code, body := getWithHost(t, c, url, "evil.example:"+tc.port)
		require.Equal(t, http.StatusMisdirectedRequest, code, "%s with Host evil.example: %s", tc.path, body)
		require.NotContains(t, body, "secret-queue")
		code, _ = getWithHost(t, c, url, "evil.example")
		require.Equal(t, http.StatusMisdirectedRequest, code, "%s with Host evil.example (no port)", tc.path)
		for _, host := range []string{tc.addr, "localhost:" + tc.port, "prom.localhost:" + tc.port, "node.example:" + tc.port, "NODE.example."} {
			code, body := getWithHost(t, c, url, host)
			require.Equal(t, http.StatusOK, code, "%s with Host %s: %s", tc.path, host, body)
		}
	}
	_, page := getWithHost(t, c, "http://"+metrics+"/metrics", metrics)
	require.Contains(t, page, `queue="secret-queue"`, "the metrics page is served to the node's own names")
	require.Contains(t, n.logs.String(), "request for another host name refused")
}
