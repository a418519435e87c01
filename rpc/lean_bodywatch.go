package rpc

import (
	"io"
	"sync"
	"sync/atomic"

	"github.com/benbjohnson/clock"
)

// A message's body must keep coming once its header is read: the reader
// takes the budgets of unanswered bytes for the size the header announces
// before it reads the body, so a peer that sent headers and stopped held
// them, and the node's budget with them, and every other connection
// waited for it without bound (found by review, session 69). A body that
// makes no progress for FirstMessageTimeout closes the connection; one
// that arrives slowly, however long it takes, is not cut off.

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n *atomic.Uint64
}

func (c countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(uint64(n))
	return n, err
}

// bodyWatch closes a connection whose message body stalls.
type bodyWatch struct {
	mu   sync.Mutex
	t    *clock.Timer
	last uint64 // c.received when last looked at
	done bool
}

// watchBody starts watching the body of the message whose header the
// reader has read; stop ends it.
func (c *leanConn) watchBody() *bodyWatch {
	w := &bodyWatch{last: c.received.Load()}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t = c.s.cfg.Clock.AfterFunc(c.s.cfg.FirstMessageTimeout, func() { c.bodyCheck(w) })
	return w
}

// bodyCheck runs a FirstMessageTimeout after the watch began or was last
// renewed: it renews the watch if bytes came meanwhile, and closes the
// connection if none did. It reports whether it closed.
func (c *leanConn) bodyCheck(w *bodyWatch) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return false
	}
	if n := c.received.Load(); n != w.last {
		w.last = n
		w.t.Reset(c.s.cfg.FirstMessageTimeout)
		return false
	}
	w.done = true
	c.s.log.Debug("connection closed: a message's body stalled", "remote", c.remote, "timeout", c.s.cfg.FirstMessageTimeout)
	_ = c.conn.Close()
	return true
}

func (w *bodyWatch) stop() {
	w.mu.Lock()
	w.done = true
	w.t.Stop()
	w.mu.Unlock()
}
