package rpc

import (
	"net"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
)

// TestLean_BodyWatch: a body that makes progress renews the watch, one
// that stalls a whole FirstMessageTimeout closes the connection, and a
// stopped watch closes nothing.
func TestLean_BodyWatch(t *testing.T) {
	t.Parallel()
	mock := clock.NewMock()
	newConn := func() (*leanConn, net.Conn) {
		a, b := net.Pipe()
		t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
		s := &Server{cfg: ServerConfig{Clock: mock, FirstMessageTimeout: time.Second}, log: discardLogger()}
		return &leanConn{s: s, conn: a, remote: "pipe"}, b
	}
	closed := func(peer net.Conn) bool {
		_ = peer.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, err := peer.Read(make([]byte, 1))
		var ne net.Error
		return err != nil && !(errorsAs(err, &ne) && ne.Timeout())
	}

	c, peer := newConn()
	w := c.watchBody()
	c.received.Add(100) // part of the body came
	require.False(t, c.bodyCheck(w), "progress renews the watch")
	require.False(t, closed(peer))
	require.True(t, c.bodyCheck(w), "no progress since: closed")
	require.True(t, closed(peer))
	w.stop()

	c, peer = newConn()
	w = c.watchBody()
	w.stop()
	require.False(t, c.bodyCheck(w), "a stopped watch closes nothing")
	require.False(t, closed(peer))
}
