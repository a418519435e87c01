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
//
// One timer per connection, armed by the first body wait and re-armed by
// its own check while waits go on, so a wait costs two uncontended locks,
// not a timer.

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

// bodyWatch is a connection's watch over the bodies it waits for.
type bodyWatch struct {
	mu       sync.Mutex
	t        *clock.Timer
	armed    bool   // t will fire
	waiting  bool   // the reader waits for a body
	seq      uint64 // body waits begun
	lastSeq  uint64 // seq and received when t was armed or last fired
	lastRecv uint64
}

// bodyBegin: the reader has read a message's header and waits for the
// rest of it.
func (c *leanConn) bodyBegin() {
	w := &c.body
	w.mu.Lock()
	defer w.mu.Unlock()
	w.waiting = true
	w.seq++
	if w.armed {
		return
	}
	w.armed, w.lastSeq, w.lastRecv = true, w.seq, c.received.Load()
	if w.t == nil {
		w.t = c.s.cfg.Clock.AfterFunc(c.s.cfg.FirstMessageTimeout, func() { c.bodyCheck() })
	} else {
		w.t.Reset(c.s.cfg.FirstMessageTimeout)
	}
}

// bodyEnd: the message is whole (or the read failed).
func (c *leanConn) bodyEnd() {
	c.body.mu.Lock()
	c.body.waiting = false
	c.body.mu.Unlock()
}

// bodyCheck runs a FirstMessageTimeout after the watch was armed or last
// checked: it closes the connection if the reader has waited for one body
// all along with no byte come, and reports whether it did; it re-arms
// while waits go on.
func (c *leanConn) bodyCheck() bool {
	w := &c.body
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.waiting {
		w.armed = false
		return false
	}
	if n := c.received.Load(); w.seq != w.lastSeq || n != w.lastRecv {
		w.lastSeq, w.lastRecv = w.seq, n
		w.t.Reset(c.s.cfg.FirstMessageTimeout)
		return false
	}
	w.armed = false
	c.s.log.Debug("connection closed: a message's body stalled", "remote", c.remote, "timeout", c.s.cfg.FirstMessageTimeout)
	_ = c.conn.Close()
	return true
}

// bodyStop ends the watch (the connection ends).
func (c *leanConn) bodyStop() {
	c.body.mu.Lock()
	if c.body.t != nil {
		c.body.t.Stop()
	}
	c.body.armed = false
	c.body.mu.Unlock()
}
