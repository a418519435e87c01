package rpc

import (
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
)

// A message's body must keep coming once its header is read: the reader
// takes the budgets of unanswered bytes for the size the header announces
// before it reads the body, so a peer that sent headers and stopped held
// them, and the node's budget with them, and every other connection
// waited for it without bound (found by review, session 69). A body that
// makes no progress for FirstMessageTimeout closes the connection.
//
// Nor may it come as slowly as its sender likes: a peer that sent a large
// message's body a byte now and then, never stalling for a whole
// FirstMessageTimeout, held the same budgets and the connection's reader
// for as long as it pleased (found by review, session 70). A body must
// be whole within FirstMessageTimeout plus the time its size takes at
// bodyMinRate, or the connection is closed.
//
// One timer per connection, armed by the first body wait and re-armed by
// its own check while waits go on, so a wait costs two uncontended locks
// and a clock reading, not a timer.

// bodyMinRate is the slowest a message's body may come, in bytes a
// second, after a FirstMessageTimeout of grace: a client on a link slower
// than this cannot send messages much larger than FirstMessageTimeout
// takes at its pace. 64 KiB/s lets a message of DefaultMaxMessageBytes
// (64 MiB) take 17 minutes.
const bodyMinRate = 64 << 10

// bodyTime is the longest a body of size bytes (its header included) may
// take to come whole, grace included.
func bodyTime(grace time.Duration, size int64) time.Duration {
	return grace + time.Duration(size)*(time.Second/bodyMinRate)
}

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
	armed    bool      // t will fire
	waiting  bool      // the reader waits for a body
	seq      uint64    // body waits begun
	lastSeq  uint64    // seq and received at the stall window's start
	lastRecv uint64    //
	window   time.Time // when the stall window (FirstMessageTimeout) ends
	deadline time.Time // when the body waited for must be whole
}

// bodyBegin: the reader has read the header of a message of size bytes
// and waits for the rest of it.
func (c *leanConn) bodyBegin(size int64) {
	w := &c.body
	w.mu.Lock()
	defer w.mu.Unlock()
	grace := c.s.cfg.FirstMessageTimeout
	now := c.s.cfg.Clock.Now()
	w.waiting = true
	w.seq++
	// Never before the window ends: a pending check needs no change.
	w.deadline = now.Add(bodyTime(grace, size))
	if w.armed {
		return
	}
	w.armed, w.lastSeq, w.lastRecv, w.window = true, w.seq, c.received.Load(), now.Add(grace)
	if w.t == nil {
		w.t = c.s.cfg.Clock.AfterFunc(grace, func() { c.bodyCheck() })
	} else {
		w.t.Reset(grace)
	}
}

// bodyEnd: the message is whole (or the read failed).
func (c *leanConn) bodyEnd() {
	c.body.mu.Lock()
	c.body.waiting = false
	c.body.mu.Unlock()
}

// bodyCheck runs when the watch's timer fires: at the end of a stall
// window (a FirstMessageTimeout after the watch was armed or last saw
// progress), or at the deadline of the body waited for. It is
// bodyCheckAt the clock's present; a test's stallCheck (kind "body") runs
// first.
func (c *leanConn) bodyCheck() bool {
	if check := c.s.cfg.stallCheck; check != nil {
		c.body.mu.Lock()
		last := c.body.lastRecv
		c.body.mu.Unlock()
		check("body", c.received.Load, last)
	}
	return c.bodyCheckAt(c.s.cfg.Clock.Now())
}

// bodyCheckAt closes the connection if, at now, the reader has waited
// for one body a whole stall window with no byte come, or past the
// body's deadline, and reports whether it did; it re-arms while waits go
// on, for the window's end or the deadline, whichever comes first.
func (c *leanConn) bodyCheckAt(now time.Time) bool {
	w := &c.body
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.waiting {
		w.armed = false
		return false
	}
	grace := c.s.cfg.FirstMessageTimeout
	if !now.Before(w.deadline) {
		w.armed = false
		c.s.log.Debug("connection closed: a message's body came too slowly", "remote", c.remote,
			"timeout", c.s.cfg.FirstMessageTimeout, "min_rate", bodyMinRate)
		_ = c.conn.Close()
		return true
	}
	if !now.Before(w.window) {
		n := c.received.Load()
		if w.seq == w.lastSeq && n == w.lastRecv {
			w.armed = false
			c.s.log.Debug("connection closed: a message's body stalled", "remote", c.remote, "timeout", grace)
			_ = c.conn.Close()
			return true
		}
		w.lastSeq, w.lastRecv, w.window = w.seq, n, now.Add(grace)
	}
	next := w.window
	if w.deadline.Before(next) {
		next = w.deadline
	}
	w.t.Reset(next.Sub(now))
	return false
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
