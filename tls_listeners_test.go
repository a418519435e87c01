package main

import (
	"context"
	"crypto/tls"
	"net/http"
	"path/filepath"
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
