package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"context"
	"github.com/leaseq/leaseq/rpc/rpctest"
)

// httpDo sends a JSON body (nil: none) to a node's HTTP API and returns
// the status and the body.
func httpDo(t *testing.T, c *http.Client, method, url, body string) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	require.NoError(t, err)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(raw)
}

// TestServe_HTTPAPI runs `leaseq serve --http` and drives the API: an
// enqueue, poll and ack over HTTP that the RPC CLI sees, an RPC enqueue
// that wakes a long poll parked over HTTP, the API's series on /metrics,
// and a shutdown that ends a parked HTTP poll with 503 unavailable.
func TestServe_HTTPAPI(t *testing.T) {
	t.Parallel()
	api, metrics := freePort(t), freePort(t)
	data := filepath.Join(t.TempDir(), "data")
	n := startNode(t, data, "--http", api, "--metrics", metrics, "--log-format", "json")
	require.Contains(t, n.logs.String(), `"http":"`+api+`"`)
	base := "http://" + api + "/v1/queues/jobs"
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: time.Minute}

	code, body := httpDo(t, c, "POST", base+"/items", `[{"text":"hello"},{"payload":"AAE=","priority":1}]`)
	require.Equal(t, http.StatusOK, code, body)
	var enq struct{ IDs []string }
	require.NoError(t, json.Unmarshal([]byte(body), &enq))
	require.Len(t, enq.IDs, 2)
	code, body = httpDo(t, c, "POST", base+"/poll", `{"max":10,"lease_ms":60000}`)
	require.Equal(t, http.StatusOK, code, body)
	var polled struct {
		Lease string
		Items []struct {
			ID      string
			Text    *string
			Payload []byte
		}
	}
	require.NoError(t, json.Unmarshal([]byte(body), &polled))
	require.Len(t, polled.Items, 2)
	require.Equal(t, "hello", *polled.Items[0].Text)
	require.Equal(t, []byte{0, 1}, polled.Items[1].Payload)
	code, body = httpDo(t, c, "POST", base+"/ack", `{"lease":"`+polled.Lease+`","ids":["`+enq.IDs[0]+`"]}`)
	require.Equal(t, http.StatusOK, code, body)
	require.JSONEq(t, `{"results":[{"id":"`+enq.IDs[0]+`","code":"ok"}]}`, body)
	// The RPC side sees the same store.
	st := n.cli("stats", "jobs", "--json")
	require.Contains(t, st.stdout, `"inflight":1`)
	require.Contains(t, st.stdout, `"acked":1`)

	// The dashboard is on the same listener, over the same store.
	code, body = httpDo(t, c, "GET", "http://"+api+"/ui/", "")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "jobs")
	code, body = httpDo(t, c, "GET", "http://"+api+"/ui/queues/jobs", "")
	require.Equal(t, http.StatusOK, code, body)
	code, _ = httpDo(t, c, "GET", "http://"+api+"/ui/queues/nope", "")
	require.Equal(t, http.StatusNotFound, code)

	// A long poll parked over HTTP wakes on an enqueue over RPC.
	woken := make(chan string, 1)
	go func() {
		_, body := httpDo(t, c, "POST", base+"/poll", `{"wait_ms":60000}`)
		woken <- body
	}()
	rpctest.Eventually(t, time.Minute, func() bool {
		_, page := httpGet(t, "http://"+metrics+"/metrics")
		return metricValue(page, "leaseq_rpc_waiters") == "1"
	}, "the HTTP poll did not park on the node's dispatcher")
	n.cli("enqueue", "jobs", "from rpc")
	select {
	case body := <-woken:
		require.Contains(t, body, `"text":"from rpc"`)
	case <-time.After(time.Minute):
		t.Fatal("the parked HTTP poll was not woken by an RPC enqueue")
	}

	// The API counts a request once its handler returns, which may be
	// a moment after the client has read the answer (seen in a
	// clean-clone run, session 71).
	var page string
	rpctest.Eventually(t, time.Minute, func() bool {
		_, page = httpGet(t, "http://"+metrics+"/metrics")
		return metricValue(page, `leaseq_http_requests_total{op="poll"}`) == "2"
	}, "the parked poll was answered but not counted")
	require.Equal(t, "1", metricValue(page, `leaseq_http_requests_total{op="enqueue"}`))
	require.Equal(t, "0", metricValue(page, `leaseq_http_request_errors_total{op="ack"}`))
	require.Equal(t, "1", metricValue(page, `leaseq_http_request_duration_seconds_count{op="ack"}`))
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	for _, name := range []string{"leaseq_http_requests_total", "leaseq_http_request_errors_total", "leaseq_http_request_duration_seconds"} {
		require.True(t, strings.Contains(string(readme), "| `"+name+"` |"), "metric %s is not in the README's metrics table", name)
	}

	// Shutdown ends a parked poll with 503 unavailable.
	type answer struct {
		code int
		body string
	}
	parked := make(chan answer, 1)
	go func() {
		code, body := httpDo(t, c, "POST", "http://"+api+"/v1/queues/empty/poll", `{"wait_ms":60000}`)
		parked <- answer{code, body}
	}()
	rpctest.Eventually(t, time.Minute, func() bool {
		_, page := httpGet(t, "http://"+metrics+"/metrics")
		return metricValue(page, "leaseq_rpc_waiters") == "1"
	}, "the HTTP poll did not park")
	require.Equal(t, 0, n.stop())
	a := <-parked
	require.Equal(t, http.StatusServiceUnavailable, a.code, a.body)
	require.Contains(t, a.body, `"code":"unavailable"`)
	logs := n.logs.String()
	require.Less(t, strings.Index(logs, `"msg":"http server stopped"`), strings.Index(logs, `"msg":"rpc server stopped"`),
		"the HTTP API stops before the RPC server whose dispatcher it shares")
	r := runCLI(t, nil, "", "check", "--data", data)
	require.Equal(t, 0, r.code, r.stdout+r.stderr)
}

// TestServe_HTTPAPIMutualTLS: --http speaks the TLS of the --tls-* flags,
// requiring client certificates with --tls-client-ca, as --listen does.
func TestServe_HTTPAPIMutualTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	srvCert, srvKey := ca.issue("server", true)
	cliCert, cliKey := ca.issue("client", false)
	api := freePort(t)
	startNode(t, filepath.Join(dir, "data"), "--http", api,
		"--tls-cert", srvCert, "--tls-key", srvKey, "--tls-client-ca", ca.file)

	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	client := func(certs ...tls.Certificate) *http.Client {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: certs, MinVersion: tls.VersionTLS12}}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: time.Minute}
	}
	cert, err := tls.LoadX509KeyPair(cliCert, cliKey)
	require.NoError(t, err)
	code, body := httpDo(t, client(cert), "POST", "https://"+api+"/v1/queues/secure/items", `[{"text":"x"}]`)
	require.Equal(t, http.StatusOK, code, body)

	_, err = client().Get("https://" + api + "/v1/queues")
	require.Error(t, err, "no client certificate: refused in the handshake")
	// Plain HTTP gets net/http's 400 "client sent an HTTP request to an
	// HTTPS server", never an answer of the API.
	plain := &http.Transport{}
	defer plain.CloseIdleConnections()
	resp, err := (&http.Client{Transport: plain, Timeout: time.Minute}).Get("http://" + api + "/v1/queues")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
}

func TestServe_HTTPFlagChecks(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "", "serve", "--data", filepath.Join(t.TempDir(), "d"), "--listen", "127.0.0.1:7799", "--http", "127.0.0.1:7799")
	require.Equal(t, exitUsage, r.code, "%s%s", r.stdout, r.stderr)
	require.Contains(t, r.stderr, "--http 127.0.0.1:7799 is also the address of --listen, --metrics or --queueber-listen")
	// A malformed address is a usage error, found before anything opens
	// (session 70).
	r = runCLI(t, nil, "", "serve", "--data", filepath.Join(t.TempDir(), "d"), "--http", "nonsense")
	require.Equal(t, exitUsage, r.code, "%s%s", r.stdout, r.stderr)
	require.Contains(t, r.stderr, `--http: address "nonsense": want host:port or unix:/path`)
}

// TestServe_HTTPSharesMaxConns: --max-conns counts the node's connections
// over RPC and HTTP together; one over it gets a 503 from the HTTP API.
func TestServe_HTTPSharesMaxConns(t *testing.T) {
	t.Parallel()
	api := freePort(t)
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--http", api, "--max-conns", "1")
	c := dialNode(t, n.addr)
	_, err := c.Queues(context.Background()) // the RPC connection is open
	require.NoError(t, err)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr, Timeout: time.Minute}
	code, body := httpDo(t, hc, "GET", "http://"+api+"/v1/queues", "")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	require.Contains(t, body, "too many connections (limit 1)")
	require.NoError(t, c.Close())
	rpctest.Eventually(t, 30*time.Second, func() bool {
		code, _ := httpDo(t, hc, "GET", "http://"+api+"/v1/queues", "")
		return code == http.StatusOK
	}, "the HTTP API still refused after the RPC connection closed")
}
