package rpc

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
)

// lockedBuf is a goroutine-safe log sink.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

// silentConn opens a TCP connection that never sends anything.
func silentConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// closedByPeer reports whether the server closed c (a read fails other
// than by timing out).
func closedByPeer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := c.Read(make([]byte, 64))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

func TestServer_SilentConnectionLosesItsSlot(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) { c.MaxConns = 1 }})
	silent := silentConn(t, b.addr)
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 1 })
	// The slot is taken: a real client is refused.
	_, err := b.dialErr(ClientOptions{})
	require.ErrorIs(t, err, ErrTooManyConns)

	b.clock.Add(DefaultFirstMessageTimeout - time.Second)
	require.False(t, closedByPeer(silent), "closed before its deadline")
	// Advance in steps: the server may have armed its timer after the
	// first advance.
	rpctest.Eventually(t, 10*time.Second, func() bool {
		b.clock.Add(time.Second)
		return closedByPeer(silent)
	})
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 0 })
	c := b.dial()
	_, err = c.Queues(ctxT(t))
	require.NoError(t, err)
	// A connection that spoke keeps its slot past the deadline.
	b.clock.Add(2 * DefaultFirstMessageTimeout)
	_, err = c.Queues(ctxT(t))
	require.NoError(t, err)
}

func TestServer_MaxConnsPerAddr(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) { c.MaxConnsPerAddr = 2 }})
	c1, c2 := b.dial(), b.dial()
	_, err := b.dialErr(ClientOptions{})
	require.ErrorIs(t, err, ErrTooManyConns)
	require.Contains(t, err.Error(), "from 127.0.0.1")
	require.NoError(t, c1.Close())
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 1 })
	c3 := b.dial()
	for _, c := range []*Client{c2, c3} {
		_, err := c.Queues(ctxT(t))
		require.NoError(t, err)
	}
}

func TestServer_RefusedConnectionsLogRateLimited(t *testing.T) {
	t.Parallel()
	var logs lockedBuf
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) {
		c.MaxConns = 1
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	}})
	b.dial()
	// refused dials and waits for the Abort, which the server sends after
	// it logged (or counted) the refusal.
	refused := func() {
		c := silentConn(t, b.addr)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		_, err := c.Read(make([]byte, 1))
		require.NoError(t, err)
	}
	const n = 30
	for range n {
		refused()
	}
	require.Equal(t, 1, logs.count("connection refused"), "one line for a burst (the clock did not move)")
	b.clock.Add(refuseLogEvery)
	refused()
	require.Equal(t, 2, logs.count("connection refused"))
	require.Equal(t, 1, logs.count("suppressed="+strconv.Itoa(n-1)))
}
