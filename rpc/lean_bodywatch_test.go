package rpc

import (
	"net"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
)

// TestLean_BodyWatch: a body that makes progress, or a new body waited
// for, renews the watch; one body waited for a whole FirstMessageTimeout
// with no byte come closes the connection; a check with no wait disarms
// it, and the next wait arms it again.
func TestLean_BodyWatch(t *testing.T) {
	t.Parallel()
	mock := clock.NewMock()
	a, peer := net.Pipe()
	t.Cleanup(func() { _ = a.Close(); _ = peer.Close() })
	s := &Server{cfg: ServerConfig{Clock: mock, FirstMessageTimeout: time.Second}, log: discardLogger()}
	c := &leanConn{s: s, conn: a, remote: "pipe"}
	defer c.bodyStop()
	closed := func() bool {
		_ = peer.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, err := peer.Read(make([]byte, 1))
		var ne net.Error
		return err != nil && !(errorsAs(err, &ne) && ne.Timeout())
	}

	c.bodyBegin()
	c.bodyEnd()
	require.False(t, c.bodyCheck(), "no wait: nothing to close")
	require.False(t, c.body.armed, "and the watch is disarmed")

	c.bodyBegin()
	require.True(t, c.body.armed)
	c.received.Add(100) // part of the body came
	require.False(t, c.bodyCheck(), "progress renews the watch")
	c.bodyEnd()
	c.bodyBegin() // the next message's body
	require.False(t, c.bodyCheck(), "another body waited for renews it too")
	require.False(t, closed())
	require.True(t, c.bodyCheck(), "one body, no byte for a whole timeout: closed")
	require.True(t, closed())
}
