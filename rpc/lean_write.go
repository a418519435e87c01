package rpc

import (
	"errors"
	"math"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/exc"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
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

// sendFrom is sendFrame of m.
func (c *leanConn) sendFrom(m *capnp.Message, keep, shared bool) {
	c.sendFrame(outFrame{m: m, keep: keep}, shared)
}

// sendFrame is send; shared: the caller serves other connections too (a
// store's syncer completing calls of many connections), so it must not
// wait for this socket. It writes what the socket takes at once and
// leaves the rest, if any, to a goroutine of this connection
// (writeQueue); on a connection that is not a plain socket it leaves the
// whole write to one.
func (c *leanConn) sendFrame(f outFrame, shared bool) {
	// Every frame counts in the reply budget until written or dropped,
	// not only the Queue results their handlers count: an Unimplemented
	// echo repeats the client's whole message, and a client that sent such
	// messages without reading made the node keep every echo (found by
	// review, session 69). Queue results count here only
	// (queueServer.framesCounted).
	c.gate.add(f.m)
	c.w.Lock()
	if c.w.dead {
		c.w.Unlock()
		c.unwrittenFrame(f)
		c.dropFrame(f)
		return
	}
	c.w.out = append(c.w.out, f)
	if c.w.writing || c.w.readerBusy {
		c.w.Unlock()
		return
	}
	c.w.writing = true
	c.w.Unlock()
	if shared && c.raw == nil {
		c.writeElsewhere(nil)
		return
	}
	c.writeQueue(shared)
}

// writeElsewhere leaves the writing (the give-back of finished, the
// items of poll answers the client gave up before they were written
// (finishedUnwritten); then what spill holds, then the queue) to a
// goroutine of the connection, which may wait for the socket and the
// store. REQUIRES: the writer of the moment (c.w.writing set for the
// caller).
//
// It is not counted in c.calls: shutdown waits for the writer of the
// moment through c.w.idle, and so for its give-backs too. A sender that
// is no call (a Finish sent as a ctx ends, a subscription's push) may get
// here while shutdown waits for the calls, and a WaitGroup must not go up
// from zero during its Wait (the race detector caught it in
// FuzzServerConnAbortReason, session 73).
func (c *leanConn) writeElsewhere(finished []pollGiveBack) {
	c.s.workers.run(func() {
		for _, p := range finished {
			c.s.giveBack(p.queue, p.lease, p.ids, reasonFinished)
		}
		if len(c.spill) > 0 {
			c.writeSpill()
		}
		c.writeQueue(false)
	})
}

// idle: the reader is about to block, so it writes what is queued, and
// later replies are written by whoever makes them. On a plain socket it
// writes only what the socket takes at once and leaves the rest to a
// goroutine of the connection, as a shared writer does: a reader that
// waited for the socket would read nothing more (not a Finish, not the
// next call) until the client read, and a client that writes its calls
// before it reads their answers would wait for the node as the node
// waited for it. What bounds the answers such a client makes the node
// hold is the reply budget (replygate.go), not the socket's buffer.
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
	c.writeQueue(c.raw != nil)
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
			if c.w.idle != nil {
				close(c.w.idle) // shutdown waits for it
				c.w.idle = nil
			}
			c.w.Unlock()
			return
		}
		c.w.out = c.w.spare
		c.w.spare = nil
		c.w.Unlock()
		c.nonblock = shared
		finished := c.writeBatch(batch)
		c.nonblock = false
		clear(batch)
		done = batch
		// A give-back waits for the store, which the reader and a
		// shared writer (the store's syncer) must not: a goroutine of
		// the connection does it, as the writer of the moment.
		if len(c.spill) > 0 || len(finished) > 0 {
			c.w.Lock()
			c.w.spare = done[:0]
			c.w.Unlock()
			c.writeElsewhere(finished)
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
	if len(c.spilled) > 0 {
		if c.werr != nil {
			// The poll answers of which the socket took nothing go back.
			sent := c.sent.Load()
			for _, u := range c.spilled {
				if u.start >= sent {
					c.addUnwritten(u.items)
				}
			}
		}
		clear(c.spilled)
		c.spilled = c.spilled[:0]
	}
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
	n, err := w.write(p)
	c.passed += uint64(n)
	return n, err
}

func (w leanWriter) write(p []byte) (int, error) {
	c := w.c
	if c.raw == nil {
		return c.writeConn(p)
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

// leanConnWriteChunk is the most one write to a connection that is not a
// plain socket (TLS, a pipe) hands over at once: the stall checks see its
// progress chunk by chunk, and a reader slower than a chunk per
// ReplyStallTimeout (2 KiB/s at the default 30 s) is a stalled one.
const leanConnWriteChunk = 64 << 10

// writeConn writes p to a connection that is not a plain socket, in
// chunks, counting each in sent.
func (c *leanConn) writeConn(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := c.conn.Write(p[n:min(len(p), n+leanConnWriteChunk)])
		n += m
		c.sent.Add(uint64(m))
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// writeBatch writes batch with one flush (one write when it fits the
// buffer), then lets go of its messages. It returns the items of the
// poll answers in batch whose question the client finished before their
// write started (finishedUnwritten), for the caller to give back.
func (c *leanConn) writeBatch(batch []outFrame) (finished []pollGiveBack) {
	c.writeSeq.Add(1) // odd: a write in progress
	err := c.werr
	tried, polls := 0, false
	for i := range batch {
		if err != nil {
			break
		}
		f := &batch[i]
		if f.poll {
			if items, ok := c.finishedUnwritten(f.m); ok {
				// Still written, as a plain answer: its items are
				// given back, and no more (notWritten).
				finished = append(finished, items)
				f.poll = false
			}
		}
		if f.poll {
			f.start = c.passed + uint64(c.bw.Buffered())
			polls = true
		}
		tried++
		err = c.enc.Encode(f.m)
	}
	if err == nil {
		err = c.bw.Flush()
	}
	c.writeSeq.Add(1)
	if polls || err != nil {
		c.notWritten(batch, tried, err)
	}
	for _, f := range batch {
		c.dropFrame(f)
	}
	if err != nil && c.werr == nil {
		c.werr = err
		_ = c.conn.Close() // the reader sees it and ends the connection
	}
	return finished
}

// finishedUnwritten reports the items of m, a poll answer whose write is
// about to start, if the client has finished its question: per Cap'n
// Proto a caller does not use the results of a question it finished, and
// a client other than the Go one drops such an answer with its items (the
// Go client gives them back itself). Not a byte of m is written yet, so
// they go back (Server.giveBack: ready again at once, the claim taken
// back), as on the go-capnp engine (unwritten.go); m is still written,
// for the client needs its Return to reuse the question id. A question
// whose answer was queued is finished once it has left c.mu.answers: the
// Finish of a returned answer removes it, and so does settle when the
// Finish came first. A client reuses the id only after the Return, so an
// answer under it is this one (a client that reuses it sooner keeps the
// items, leased until the lease ends, as before). Once the answer's
// write has started, the write alone decides (notWritten: nothing of it
// written, given back when the connection ends; anything, the
// client's), as on go-capnp. Each answer is looked at once, by its
// writer, which owns m. With the connection ending (c.mu.closed), the
// answers are the connection's end's to give back (giveBackUnwritten),
// but for those Stop's shutdown writes (c.mu.flushing).
// Found by review (session 74): the lean engine wrote such answers as
// any other, and their items stayed leased, to a client that had dropped
// them, until the lease ended.
func (c *leanConn) finishedUnwritten(m *capnp.Message) (pollGiveBack, bool) {
	m.ResetReadLimit(math.MaxUint64) // the node's own message
	root, err := rpccp.ReadRootMessage(m)
	if err != nil || root.Which() != rpccp.Message_Which_return {
		return pollGiveBack{}, false
	}
	ret, err := root.Return()
	if err != nil {
		return pollGiveBack{}, false
	}
	c.mu.Lock()
	_, open := c.mu.answers[ret.AnswerId()]
	// Found by review (session 74): at Stop the queued answers are
	// written (flushAtStop) and answers is still right, so an answer the
	// client finished gives its items back there too.
	closed := c.mu.closed && !c.mu.flushing
	c.mu.Unlock()
	if open || closed {
		return pollGiveBack{}, false
	}
	return returnPollGiveBack(ret)
}

// notWritten looks, after a write of batch whose first tried frames were
// encoded (err: its failure), for poll answers of which the socket took
// not a byte: after a failure their items are given back at shutdown; the
// ones spill holds are noted, to be given back if spill is never written.
// An answer the socket took part of is the client's.
func (c *leanConn) notWritten(batch []outFrame, tried int, err error) {
	sent := c.sent.Load()
	for i, f := range batch {
		if !f.poll || (i < tried && f.start < sent) {
			continue
		}
		switch {
		case err != nil || i >= tried:
			c.unwrittenFrame(f)
		case len(c.spill) > 0:
			if items, ok := readPollGiveBack(f.m); ok {
				c.spilled = append(c.spilled, unsentPoll{start: f.start, items: items})
			}
		}
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

// armWatchdog closes the connection when a write waits a whole
// ReplyStallTimeout with the socket taking none of its bytes (the client
// reads none of its answers): it looks every ReplyStallTimeout, and
// closes when the write in progress is the one it saw the time before
// and sent has not moved since. A client that reads a large answer
// slowly, however long it takes, is not cut off.
func (c *leanConn) armWatchdog() {
	c.watchdog.Lock()
	defer c.watchdog.Unlock()
	if c.watchdog.done {
		return
	}
	c.watchdog.t = c.s.cfg.Clock.AfterFunc(c.s.cfg.ReplyStallTimeout, c.watchdogTick)
}

// watchdogTick is one look of the watchdog (armWatchdog).
func (c *leanConn) watchdogTick() {
	c.watchdog.Lock()
	lastSeq, lastSent := c.watchdog.seq, c.watchdog.sent
	c.watchdog.Unlock()
	if check := c.s.cfg.stallCheck; check != nil && c.writeSeq.Load()%2 == 1 {
		check("watchdog", c.sent.Load, lastSent)
	}
	seq := c.writeSeq.Load()
	sent := c.sent.Load()
	c.watchdog.Lock()
	c.watchdog.seq, c.watchdog.sent = seq, sent
	c.watchdog.Unlock()
	if seq%2 == 1 && seq == lastSeq && sent == lastSent {
		c.s.log.Warn("connection closed: the client does not read its answers", "remote", c.remote, "timeout", c.s.cfg.ReplyStallTimeout)
		_ = c.conn.Close()
		return
	}
	c.armWatchdog()
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
// the client, and releases every capability. When Server.Stop ended the
// reading (stopReading), the answers queued for the calls are written
// before the connection closes (flushAtStop).
func (c *leanConn) shutdown(why error) {
	var pe *protocolError
	isProto := errors.As(why, &pe)
	stopping := !c.stopState.CompareAndSwap(leanReading, leanEnded)
	// A peer that broke the protocol is told so and cut off, stopping or
	// not; otherwise, at Stop, why is only the reading that Stop ended.
	graceful := stopping && !isProto
	if stopping && !graceful {
		c.stopBound.Stop()
	}
	if isProto {
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
	} else if !graceful && why != nil && !errors.Is(why, errPeerAborted) && !isDisconnect(why) {
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
	if !graceful {
		_ = c.conn.Close()
	}
	c.mu.Lock()
	c.mu.closed = true
	c.mu.flushing = graceful
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
	if graceful {
		// Every call has queued its answer: out they go, then the
		// connection closes (within stopBound).
		c.flushAtStop()
		c.stopBound.Stop()
		_ = c.conn.Close()
	}
	c.mu.Lock()
	exports := c.mu.exports
	c.mu.exports = nil
	answers := c.mu.answers
	c.mu.answers = nil
	c.mu.flushing = false
	c.mu.Unlock()
	c.w.Lock()
	c.w.dead = true
	out := c.w.out
	c.w.out = nil
	var idle chan struct{}
	if c.w.writing {
		// A writer not among the calls (a subscription's push) may still
		// hold poll answers; its write fails on the closed socket.
		idle = make(chan struct{})
		c.w.idle = idle
	}
	c.w.Unlock()
	for _, f := range out {
		c.unwrittenFrame(f)
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
	if idle != nil {
		<-idle
	}
	c.giveBackUnwritten()
}

// flushAtStop writes what the connection has queued, after the writer of
// the moment if there is one, until nothing is queued: at Server.Stop,
// the answers of the calls that ran, which the node applied. A write
// waits for the socket; stopBound closes the connection if the client
// does not take them in time, and the writes fail then (their poll
// answers of which nothing was written are given back, as ever).
func (c *leanConn) flushAtStop() {
	for {
		c.w.Lock()
		c.w.readerBusy = false // the reader is here, and writes below
		if c.w.writing {
			idle := make(chan struct{})
			c.w.idle = idle
			c.w.Unlock()
			<-idle
			continue
		}
		if len(c.w.out) == 0 {
			c.w.Unlock()
			return
		}
		c.w.writing = true
		c.w.Unlock()
		c.writeQueue(false)
	}
}

// pollGiveBack is what a poll answer handed out: items under one lease.
type pollGiveBack struct {
	queue string
	lease storage.LeaseID
	ids   []storage.ItemID
}

// unsentPoll is a poll answer that spill holds from its first byte on.
type unsentPoll struct {
	start uint64 // where it begins in the stream
	items pollGiveBack
}

// readPollGiveBack reads the lease and the item ids a poll's Return
// carries; ok is false when it carries none.
func readPollGiveBack(m *capnp.Message) (g pollGiveBack, ok bool) {
	m.ResetReadLimit(math.MaxUint64) // the node's own message
	root, err := rpccp.ReadRootMessage(m)
	if err != nil || root.Which() != rpccp.Message_Which_return {
		return g, false
	}
	ret, err := root.Return()
	if err != nil {
		return g, false
	}
	return returnPollGiveBack(ret)
}

// returnPollGiveBack reads the lease and the item ids of ret, a poll's
// Return; ok is false when it carries none.
func returnPollGiveBack(ret rpccp.Return) (g pollGiveBack, ok bool) {
	if ret.Which() != rpccp.Return_Which_results {
		return g, false
	}
	payload, err := ret.Results()
	if err != nil {
		return g, false
	}
	content, err := payload.Content()
	if err != nil {
		return g, false
	}
	return pollResultsGiveBack(schema.Queue_poll_Results(content.Struct()))
}

// unwrittenFrame notes the items of f, a message never written, if it is
// a poll answer that carries any.
func (c *leanConn) unwrittenFrame(f outFrame) {
	if !f.poll {
		return
	}
	if items, ok := readPollGiveBack(f.m); ok {
		c.addUnwritten(items)
	}
}

// addUnwritten notes items of a poll answer never written, for shutdown
// to give back. The writer may be a goroutine that serves every
// connection (a store's syncer), which must not call the store; and
// shutdown, which gives them back, comes after every write failure (a
// failed write closes the connection).
func (c *leanConn) addUnwritten(items pollGiveBack) {
	c.unwritten.Lock()
	defer c.unwritten.Unlock()
	if c.unwritten.done {
		// Not reached: shutdown gives back after the calls ended and the
		// last writer let go, and no poll answer is queued after. The
		// items would stay leased until the lease ends.
		return
	}
	c.unwritten.polls = append(c.unwritten.polls, items)
}

// giveBackUnwritten gives back the items of the connection's poll answers
// that were never written, not a byte of them (Server.giveBack): nobody
// saw their lease, so another consumer gets them at once instead of at
// its end.
func (c *leanConn) giveBackUnwritten() {
	c.unwritten.Lock()
	polls := c.unwritten.polls
	c.unwritten.polls, c.unwritten.done = nil, true
	c.unwritten.Unlock()
	for _, p := range polls {
		c.s.giveBack(p.queue, p.lease, p.ids, reasonConnEnded)
	}
}
