package rpc

import (
	"errors"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/exc"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
)

// sendSmall builds a message with build and sends it (shared: as
// sendFrom); a build failure (out of memory) is logged.
func (c *leanConn) sendSmall(shared bool, build func(rpccp.Message) error) {
	msg, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	if err != nil {
		c.s.log.Warn("rpc: cannot build a message", "remote", c.remote, "err", err)
		return
	}
	m, err := rpccp.NewRootMessage(seg)
	if err == nil {
		err = build(m)
	}
	if err != nil {
		msg.Release()
		c.s.log.Warn("rpc: cannot build a message", "remote", c.remote, "err", err)
		return
	}
	c.sendFrom(msg, false, shared)
}

// send queues msg to be written. It writes the queue itself unless
// another writer is at work or the reader will write it before it blocks.
func (c *leanConn) send(m *capnp.Message, keep bool) { c.sendFrom(m, keep, false) }

// sendFrom is send; shared: the caller serves other connections too (a
// store's syncer completing calls of many connections), so it must not
// wait for this socket. It writes what the socket takes at once and
// leaves the rest, if any, to a goroutine of this connection
// (writeQueue); on a connection that is not a plain socket it leaves the
// whole write to one.
func (c *leanConn) sendFrom(m *capnp.Message, keep, shared bool) {
	c.w.Lock()
	if c.w.dead {
		c.w.Unlock()
		c.dropFrame(outFrame{m, keep})
		return
	}
	c.w.out = append(c.w.out, outFrame{m, keep})
	if c.w.writing || c.w.readerBusy {
		c.w.Unlock()
		return
	}
	c.w.writing = true
	c.w.Unlock()
	if shared && c.raw == nil {
		c.writeElsewhere()
		return
	}
	c.writeQueue(shared)
}

// writeElsewhere leaves the writing (what spill holds, then the queue) to
// a goroutine of the connection, which may wait for the socket.
// REQUIRES: the writer of the moment (c.w.writing set for the caller).
func (c *leanConn) writeElsewhere() {
	c.calls.Add(1)
	c.s.workers.run(func() {
		defer c.calls.Done()
		if len(c.spill) > 0 {
			c.writeSpill()
		}
		c.writeQueue(false)
	})
}

// idle: the reader is about to block, so it writes what is queued, and
// later replies are written by whoever makes them.
func (c *leanConn) idle() {
	c.unhold() // the reader is about to wait: the store must not
	c.w.Lock()
	c.w.readerBusy = false
	if c.w.writing || len(c.w.out) == 0 {
		c.w.Unlock()
		return
	}
	c.w.writing = true
	c.w.Unlock()
	c.writeQueue(false)
}

// busy: the reader has work, and will write the queue before it blocks.
func (c *leanConn) busy() {
	c.w.Lock()
	c.w.readerBusy = true
	c.w.Unlock()
}

// writeQueue writes queued messages until the queue is empty; the caller
// has set c.w.writing, which this clears. shared (on a plain socket): it
// never waits for the socket; when the socket is full, a goroutine of the
// connection writes the rest, waiting, and goes on with the queue.
func (c *leanConn) writeQueue(shared bool) {
	var done []outFrame
	for {
		c.w.Lock()
		if done != nil {
			c.w.spare = done[:0]
		}
		batch := c.w.out
		if len(batch) == 0 {
			c.w.writing = false
			c.w.Unlock()
			return
		}
		c.w.out = c.w.spare
		c.w.spare = nil
		c.w.Unlock()
		c.nonblock = shared
		c.writeBatch(batch)
		c.nonblock = false
		clear(batch)
		done = batch
		if len(c.spill) > 0 {
			c.w.Lock()
			c.w.spare = done[:0]
			c.w.Unlock()
			c.writeElsewhere()
			return
		}
	}
}

// writeSpill writes what a non-waiting write left in c.spill, waiting
// for the socket. REQUIRES: the writer of the moment.
func (c *leanConn) writeSpill() {
	c.writeSeq.Add(1) // odd: a write in progress (the stall watchdog)
	if c.werr == nil {
		if _, err := c.raw.Write(c.spill); err != nil {
			c.werr = err
			_ = c.conn.Close()
		}
	}
	c.writeSeq.Add(1)
	clear(c.spill)
	if cap(c.spill) > leanWriteBuffer {
		c.spill = nil
	} else {
		c.spill = c.spill[:0]
	}
}

// leanWriter is what the connection's bufio.Writer writes to: the socket,
// waiting for it; or, with nonblock set (a shared writer, on a plain
// socket), only what it takes at once, the rest kept in spill, and
// everything after it too, in order.
type leanWriter struct{ c *leanConn }

func (w leanWriter) Write(p []byte) (int, error) {
	c := w.c
	if c.raw == nil {
		return c.conn.Write(p)
	}
	if !c.nonblock {
		return c.raw.Write(p)
	}
	if len(c.spill) > 0 {
		c.spill = append(c.spill, p...)
		return len(p), nil
	}
	n, err := c.raw.writeNow(p)
	if err != nil {
		return n, err
	}
	if n < len(p) {
		c.spill = append(c.spill, p[n:]...)
	}
	return len(p), nil
}

// writeBatch writes batch with one flush (one write when it fits the
// buffer), then lets go of its messages.
func (c *leanConn) writeBatch(batch []outFrame) {
	c.writeSeq.Add(1) // odd: a write in progress
	err := c.werr
	for _, f := range batch {
		if err == nil {
			err = c.enc.Encode(f.m)
		}
	}
	if err == nil {
		err = c.bw.Flush()
	}
	c.writeSeq.Add(1)
	for _, f := range batch {
		c.dropFrame(f)
	}
	if err != nil && c.werr == nil {
		c.werr = err
		_ = c.conn.Close() // the reader sees it and ends the connection
	}
}

// dropFrame lets go of a message that was written or will never be.
func (c *leanConn) dropFrame(f outFrame) {
	if c.gate != nil {
		c.gate.done(f.m)
	}
	if !f.keep {
		f.m.Release()
	}
}

// armWatchdog closes the connection when one write stays stuck for a
// whole ReplyStallTimeout (the client reads none of its answers): it
// looks every ReplyStallTimeout, and closes when the write in progress is
// the one it saw the time before.
func (c *leanConn) armWatchdog() {
	c.watchdog.Lock()
	defer c.watchdog.Unlock()
	if c.watchdog.done {
		return
	}
	c.watchdog.t = c.s.cfg.Clock.AfterFunc(c.s.cfg.ReplyStallTimeout, func() {
		seq := c.writeSeq.Load()
		c.watchdog.Lock()
		stuck := seq%2 == 1 && seq == c.watchdog.last
		c.watchdog.last = seq
		c.watchdog.Unlock()
		if stuck {
			c.s.log.Warn("connection closed: the client does not read its answers", "remote", c.remote, "timeout", c.s.cfg.ReplyStallTimeout)
			_ = c.conn.Close()
			return
		}
		c.armWatchdog()
	})
}

func (c *leanConn) stopWatchdog() {
	c.watchdog.Lock()
	defer c.watchdog.Unlock()
	c.watchdog.done = true
	if c.watchdog.t != nil {
		c.watchdog.t.Stop()
	}
}

// shutdown ends the connection: it tells the peer why when the peer broke
// the protocol, ends running calls and waits for them, fails our calls to
// the client, and releases every capability.
func (c *leanConn) shutdown(why error) {
	var pe *protocolError
	if errors.As(why, &pe) {
		c.s.log.Warn("connection aborted", "remote", c.remote, "reason", pe.reason)
		c.sendSmall(false, func(m rpccp.Message) error {
			ab, err := m.NewAbort()
			if err != nil {
				return err
			}
			ab.SetType(rpccp.Exception_Type_failed)
			return ab.SetReason(pe.Error())
		})
		c.idle()
		if cw, ok := c.conn.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	} else if why != nil && !errors.Is(why, errPeerAborted) && !isDisconnect(why) {
		// Not a protocol message at all (garbage, a giant header): the
		// reason goes to the log and, as an abort, to the peer.
		c.s.log.Debug("connection ended", "remote", c.remote, "err", why)
		c.sendSmall(false, func(m rpccp.Message) error {
			ab, err := m.NewAbort()
			if err != nil {
				return err
			}
			ab.SetType(rpccp.Exception_Type_failed)
			return ab.SetReason("leaseq: " + why.Error())
		})
		c.idle()
	}
	c.cancel()
	c.stopWatchdog()
	_ = c.conn.Close()
	c.mu.Lock()
	c.mu.closed = true
	questions, qstops := c.mu.questions, c.mu.qstops
	c.mu.questions, c.mu.qstops = nil, nil
	c.mu.Unlock()
	for _, stop := range qstops {
		stop()
	}
	for _, p := range questions {
		if p != canceledQuestion {
			p.Reject(exc.New(exc.Disconnected, "", "rpc: connection closed"))
		}
	}
	c.calls.Wait()
	c.mu.Lock()
	exports := c.mu.exports
	c.mu.exports = nil
	answers := c.mu.answers
	c.mu.answers = nil
	c.mu.Unlock()
	c.w.Lock()
	c.w.dead = true
	out := c.w.out
	c.w.out = nil
	c.w.Unlock()
	for _, f := range out {
		c.dropFrame(f)
	}
	for _, a := range answers {
		for _, p := range a.pending {
			c.releaseCall(p)
		}
	}
	for _, e := range exports {
		e.client.Release()
	}
}
