package main

import (
	"context"
	"crypto/tls"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc"
)

// TestServe_HTTPAPIKeepsRPCListenerTLS (found by review, session 70): --http with --tls-* shares
// one *tls.Config between the RPC server and the HTTP API, and
// http.Server.ServeTLS configures HTTP/2 on it in place (NextProtos gets
// "h2" and "http/1.1"). From then on the RPC listener negotiates ALPN as
// an HTTP server: a TLS client of the RPC port that offers an ALPN id of
// its own is refused (no_application_protocol), while the same client is
// served by a node without --http. The shared config is also written by
// the HTTP goroutine while the RPC listener already handshakes with it
// (a data race). Each listener now takes a copy.
func TestServe_HTTPAPIKeepsRPCListenerTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	srvCert, srvKey := ca.issue("server", true)

	dialALPN := func(addr string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := rpc.Dial(ctx, addr, rpc.ClientOptions{TLS: &tls.Config{RootCAs: ca.Pool, NextProtos: []string{"x-capnp"}}})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.NodeInfo(ctx)
		return err
	}

	// Control: without --http the RPC listener serves that client.
	addr := freePort(t)
	n := startNode(t, filepath.Join(dir, "data1"), "--listen", addr, "--tls-cert", srvCert, "--tls-key", srvKey)
	require.NoError(t, dialALPN(addr), "without --http")
	require.Zero(t, n.stop())

	addr, httpAddr := freePort(t), freePort(t)
	startNode(t, filepath.Join(dir, "data2"), "--listen", addr, "--http", httpAddr, "--tls-cert", srvCert, "--tls-key", srvKey)
	// One HTTPS request: the HTTP API's ServeTLS has run by then.
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool}}}
	resp, err := hc.Get("https://" + httpAddr + "/v1/openapi.json")
	require.NoError(t, err)
	_ = resp.Body.Close()
	hc.CloseIdleConnections()

	// The RPC listener must still be a capnp listener: no ALPN of HTTP's.
	conn, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: ca.Pool, NextProtos: []string{"h2", "http/1.1"}})
	if err == nil {
		proto := conn.ConnectionState().NegotiatedProtocol
		_ = conn.Close()
		assert.Empty(t, proto, "the RPC listener negotiated ALPN %q: it claims to speak HTTP", proto)
	}
	require.NoError(t, dialALPN(addr), "with --http the RPC listener refuses a TLS client it served without")
}

// TestCLI_TLSDialErrorHints: the CLI's explanation of a failed TLS dial
// fits the failure. Found by review (session 70): a node that does not
// speak TLS, and TLS over a unix socket without --tls-server-name (which
// fails before a byte is sent), were both reported as "the node closed
// the connection during setup" with a hint about client certificates; a
// certificate for another name asked for --tls-ca.
func TestCLI_TLSDialErrorHints(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := newTestCA(t, dir, "ca")
	srvCert, srvKey := ca.issue("server", true)

	// A TLS client (--tls-ca) against a node that does not speak TLS: the
	// node did not close a TLS setup, it answered in the clear; nothing
	// about client certificates is the matter.
	t.Run("TLSClientPlainNode", func(t *testing.T) {
		t.Parallel()
		addr := freePort(t)
		startNode(t, filepath.Join(t.TempDir(), "data"), "--listen", addr)
		r := runCLI(t, []string{"LEASEQ_ADDR=" + addr, "LEASEQ_TIMEOUT=5s"}, "", "stats", "q", "--tls-ca", ca.file)
		require.Equal(t, exitFailure, r.code, "%s%s", r.stdout, r.stderr)
		t.Logf("stderr: %s", r.stderr)
		require.NotContains(t, r.stderr, "client certificates", "the hint blames client certificates")
		require.NotContains(t, r.stderr, "closed the connection during setup")
	})

	// TLS over a unix socket: the client has no host to verify the node's
	// certificate against, so the dial fails before a byte is sent; the
	// message says the node closed the connection and asks for client
	// certificates, instead of asking for --tls-server-name.
	t.Run("UnixSocketNeedsServerName", func(t *testing.T) {
		t.Parallel()
		n := startNode(t, filepath.Join(t.TempDir(), "data"), "--tls-cert", srvCert, "--tls-key", srvKey)
		r := runCLI(t, []string{"LEASEQ_ADDR=" + n.addr, "LEASEQ_TIMEOUT=5s"}, "", "stats", "q", "--tls-ca", ca.file)
		t.Logf("stderr: %s", r.stderr)
		require.NotEqual(t, 0, r.code)
		require.NotContains(t, r.stderr, "closed the connection during setup", "the node closed nothing: the client never sent a byte")
		require.Contains(t, r.stderr, "--tls-server-name")
		// With the name it works: TLS over the socket is supported.
		r = runCLI(t, []string{"LEASEQ_ADDR=" + n.addr, "LEASEQ_TIMEOUT=5s"}, "", "stats", "--tls-ca", ca.file, "--tls-server-name", "localhost")
		require.Equal(t, 0, r.code, "%s%s", r.stdout, r.stderr)
	})

	// A certificate for another name: the CA is the right one; the hint
	// to give --tls-ca with the CA that signed it sends the user the
	// wrong way (--tls-server-name is the flag).
	t.Run("CertForAnotherHost", func(t *testing.T) {
		t.Parallel()
		addr := freePort(t)
		startNode(t, filepath.Join(t.TempDir(), "data"), "--listen", addr, "--tls-cert", srvCert, "--tls-key", srvKey)
		r := runCLI(t, []string{"LEASEQ_ADDR=" + addr, "LEASEQ_TIMEOUT=5s"}, "", "stats", "q", "--tls-ca", ca.file, "--tls-server-name", "queue.example.com")
		t.Logf("stderr: %s", r.stderr)
		require.Equal(t, exitFailure, r.code)
		require.Contains(t, r.stderr, "queue.example.com")
		require.False(t, strings.Contains(r.stderr, "give --tls-ca with the CA that signed it") && !strings.Contains(r.stderr, "--tls-server-name"),
			"hostname mismatch explained as an unknown CA: %s", r.stderr)
	})
}
