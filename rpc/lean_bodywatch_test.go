package rpc

import (
	"net"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
)

// bodyWatchConn is a leanConn for the body watch's own tests, on a pipe
// whose other end says whether the watch closed it. The mock clock is
// never moved: the tests call bodyCheckAt with the instants they mean.
func bodyWatchConn(t *testing.T) (c *leanConn, t0 time.Time, closed func() bool) {
	mock := clock.NewMock()
	a, peer := net.Pipe()
	t.Cleanup(func() { _ = a.Close(); _ = peer.Close() })
	s := &Server{cfg: ServerConfig{Clock: mock, FirstMessageTimeout: time.Second}, log: discardLogger()}
	c = &leanConn{s: s, conn: a, remote: "pipe"}
	t.Cleanup(c.bodyStop)
	closed = func() bool {
		_ = peer.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, err := peer.Read(make([]byte, 1))
		var ne net.Error
		return err != nil && !(errorsAs(err, &ne) && ne.Timeout())
	}
	return c, mock.Now(), closed
}

// TestLean_BodyWatch: a body that makes progress, or a new body waited
// for, renews the watch; one body waited for a whole FirstMessageTimeout
// with no byte come closes the connection; a check with no wait disarms
// it, and the next wait arms it again.
func TestLean_BodyWatch(t *testing.T) {
	t.Parallel()
	c, t0, closed := bodyWatchConn(t)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	const size = 1 << 20 // 16 s at bodyMinRate: no deadline here

	c.bodyBegin(size)
	c.bodyEnd()
	require.False(t, c.bodyCheckAt(at(time.Second)), "no wait: nothing to close")
	require.False(t, c.body.armed, "and the watch is disarmed")

	c.bodyBegin(size)
	require.True(t, c.body.armed)
	require.False(t, c.bodyCheckAt(at(time.Second/2)), "half a timeout without a byte is no stall")
	c.received.Add(100) // part of the body came
	require.False(t, c.bodyCheckAt(at(time.Second)), "progress renews the watch")
	c.bodyEnd()
	c.bodyBegin(size) // the next message's body
	require.False(t, c.bodyCheckAt(at(2*time.Second)), "another body waited for renews it too")
	require.False(t, closed())
	require.True(t, c.bodyCheckAt(at(3*time.Second)), "one body, no byte for a whole timeout: closed")
	require.True(t, closed())
}

// TestLean_BodyWatchDeadline: a body that keeps coming, but slower than
// bodyMinRate, is cut off once FirstMessageTimeout plus the time its size
// takes at that rate has passed. Found by review (session 70): a body
// was bounded only by its stalls, and one that came a byte a second held
// its connection's reader and the budgets of its size for as long as its
// sender liked.
func TestLean_BodyWatchDeadline(t *testing.T) {
	t.Parallel()
	c, t0, closed := bodyWatchConn(t)
	const size = 64 << 10 // a second at bodyMinRate
	deadline := t0.Add(bodyTime(time.Second, size))
	require.Equal(t, 2*time.Second, deadline.Sub(t0).Round(time.Millisecond))

	c.bodyBegin(size)
	for d := time.Second; t0.Add(d).Before(deadline); d += 100 * time.Millisecond {
		c.received.Add(1)
		require.False(t, c.bodyCheckAt(t0.Add(d)), "a body that keeps coming, before its deadline")
	}
	require.False(t, closed())
	c.received.Add(1)
	require.True(t, c.bodyCheckAt(deadline), "a body still coming at its deadline: closed")
	require.True(t, closed())
}
