package rpc

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
)

// TestTLS_SilentConnectionTimerRace (found by review, session 70; fails
// under -race without the fix): serveConn's first-message timer (an
// AfterFunc closure) closed the variable conn, which serveConn
// reassigns to the *tls.Conn once the handshake is done, with nothing
// ordering the two: a TLS client that completes its handshake and then
// says nothing makes the timer read conn while nothing orders it after
// that write (a data race on an interface value: a torn read can call
// Close through the wrong type). Run with -race.
func TestTLS_SilentConnectionTimerRace(t *testing.T) {
	t.Parallel()
	ca := rpctest.NewCA(t, "test CA")
	serverCert := ca.Issue(t, "leaseq server", x509.ExtKeyUsageServerAuth)
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) {
		c.Clock = clock.New() // the timer runs on its own goroutine, as in production
		// Long enough for a handshake under -race on a busy machine (at
		// 50 ms a clean-clone run's handshake was cut by the timer).
		c.FirstMessageTimeout = 500 * time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil)) // info, as a node runs
		c.TLS = &tls.Config{Certificates: []tls.Certificate{serverCert}, MinVersion: tls.VersionTLS12}
	}})
	conn, err := tls.Dial("tcp", b.addr, &tls.Config{RootCAs: ca.Pool, ServerName: "127.0.0.1"})
	require.NoError(t, err)
	defer conn.Close()
	// Say nothing; the node closes the connection at FirstMessageTimeout.
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(20*time.Second)))
	_, err = io.ReadAll(conn)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the node did not close a silent TLS connection")
}

// TestTLS_RefusalTimerRace (found by review, session 70; -race): refuse has the same pattern as
// serveConn: its HandshakeTimeout timer closes the variable conn, which
// refuse reassigns to the *tls.Conn after the handshake. A TLS client
// refused at MaxConns that reads the Abort and then keeps the connection
// open makes the timer read conn unordered with that write. Run with -race.
func TestTLS_RefusalTimerRace(t *testing.T) {
	t.Parallel()
	ca := rpctest.NewCA(t, "test CA")
	serverCert := ca.Issue(t, "leaseq server", x509.ExtKeyUsageServerAuth)
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) {
		c.Clock = clock.New()
		c.MaxConns = 1
		c.HandshakeTimeout = 500 * time.Millisecond
		c.FirstMessageTimeout = time.Minute
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		c.TLS = &tls.Config{Certificates: []tls.Certificate{serverCert}, MinVersion: tls.VersionTLS12}
	}})
	cfg := &tls.Config{RootCAs: ca.Pool, ServerName: "127.0.0.1"}
	first, err := tls.Dial("tcp", b.addr, cfg) // holds the only slot
	require.NoError(t, err)
	defer first.Close()
	refused, err := tls.Dial("tcp", b.addr, cfg)
	require.NoError(t, err)
	defer refused.Close()
	require.NoError(t, refused.SetReadDeadline(time.Now().Add(20*time.Second)))
	_, err = io.ReadAll(refused) // the Abort, then the node's close_notify
	require.NoError(t, err)
	// Keep it open: the node's timer ends the refusal.
	rpctest.Eventually(t, 20*time.Second, func() bool { return b.srv.refusing.Load() == 0 })
}
