package rpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
)

// The lean client's write side. Callers write their own Calls, one at a
// time (the write lock), and a caller whose context ends stops waiting:
//
//   - for the lock: it never wrote anything, and its question is
//     unregistered as if it had never been asked;
//   - in the middle of its write (the socket is full: a partition, or a
//     node that stopped reading): the write is cut through a write
//     deadline in the past, and a goroutine writes the rest, holding the
//     lock, since half a message cannot be taken back. The caller gives
//     its question up (a Finish that goes out after the rest). On a
//     plain socket the rest goes out when the socket takes it; on TLS and
//     other connections a cut write cannot be resumed, and the
//     connection ends.
//
// Finishes never wait for the lock: one that finds it taken is left in
// the client's pending list for the lock's next holder, which writes the
// waiting Finishes before its own messages (so a question id freed by a
// Finish is never reused in the stream ahead of that Finish).
//
// A write that waits on a full socket is the only thing that can cut it:
// a write the socket takes at once costs nothing extra on a plain socket
// (writeNow first; the context is watched only when the socket is full).

// writeBufSize is the write buffer: smaller pieces are gathered into
// it, larger ones written straight from the message.
const writeBufSize = 16 << 10

// clientWrites is the lean client's write side. Everything but lock
// REQUIRES: lock held.
type clientWrites struct {
	lock chan struct{} // holds a token while someone writes

	conn net.Conn
	raw  *rawIO // nil: not a plain socket
	buf  []byte // written, not yet sent
	enc  *capnp.Encoder
	// ctx is the writing caller's: its end cuts a write that waits on a
	// full socket. nil outside a caller's write.
	ctx  context.Context
	stop func() bool // the armed cut's AfterFunc, or nil
	intr deadlineInterrupt
	cut  bool // a write was cut: buf holds all that was not sent
	// later: the buffer is to be flushed by a goroutine that waits for
	// the socket (flushNow on a connection that is not a plain socket).
	later bool
	err   error // a write failed: the connection is lost

	finishes int // Finishes in buf, not flushed
	// finMsg is the Finish message, built once and rewritten for each
	// question: a fresh message per call cost the client about 3 % of
	// its CPU in produce-b1.
	finMsg *capnp.Message
	fin    rpccp.Finish
}

func (w *clientWrites) init(conn net.Conn, raw *rawIO) {
	w.lock = make(chan struct{}, 1)
	w.conn, w.raw = conn, raw
	w.buf = make([]byte, 0, writeBufSize)
	w.enc = capnp.NewEncoder(w)
	w.intr.set = conn.SetWriteDeadline
}

// Write is the encoder's. It takes all of p: a failure is kept in w.err
// and a cut in w.cut, for the caller to see once the message is encoded
// (a message is never left half in the buffer).
func (w *clientWrites) Write(p []byte) (int, error) {
	n := len(p)
	switch {
	case w.err != nil:
	case w.cut || w.later || len(w.buf)+len(p) <= writeBufSize:
		// After a cut or a flush left for later, the buffer may hold
		// more than writeBufSize (an echo of the node's message,
		// writePending) and is the goroutine's to send: append.
		w.buf = append(w.buf, p...)
	case len(w.buf) >= writeBufSize:
		// Already full or past it (replies appended whole, writePending),
		// with nothing to top up: append, and leave the sending to the
		// caller's writeBuf or flushNow. Writing the buffer out here would
		// wait on a full socket, where the holder may be the reader or a
		// Finish's writer, who must not.
		w.buf = append(w.buf, p...)
	default:
		if len(w.buf) > 0 {
			k := writeBufSize - len(w.buf)
			w.buf = append(w.buf, p[:k]...)
			p = p[k:]
			w.writeBuf()
			if w.err != nil {
				break
			}
			if w.cut || len(p) < writeBufSize {
				w.buf = append(w.buf, p...)
				break
			}
		}
		sent := w.write(p)
		if w.cut {
			w.buf = append(w.buf, p[sent:]...)
		}
	}
	return n, nil
}

// writeBuf sends the buffer, keeping what was not sent at its front.
// After a cut it sends nothing: the rest is writeRest's, once the cut's
// deadline is cleared.
func (w *clientWrites) writeBuf() {
	if len(w.buf) == 0 || w.cut {
		return
	}
	n := w.write(w.buf)
	w.buf = w.buf[:copy(w.buf, w.buf[n:])]
}

// write sends p and reports how much went out: all of it unless the
// write failed (w.err) or was cut (w.cut).
func (w *clientWrites) write(p []byte) int {
	if w.raw == nil {
		w.arm()
		n, err := w.conn.Write(p)
		if err != nil {
			w.err = err
		}
		return n
	}
	n, err := w.raw.writeNow(p)
	if err == nil && n < len(p) {
		w.arm() // the socket is full: from here the caller's ctx may cut the wait
		var m int
		m, err = w.raw.Write(p[n:])
		n += m
		if err != nil && w.ctx != nil && w.ctx.Err() != nil && errors.Is(err, os.ErrDeadlineExceeded) {
			w.cut = true
			return n
		}
	}
	if err != nil {
		w.err = err
	}
	return n
}

// flushNow sends what the socket takes of the buffer without waiting for
// it to drain. What it does not take (on other connections, which have
// no such write: all of it) is left with later set: the lock's holder,
// which has no caller's context to cut a wait with, hands the flush to a
// goroutine of its own (handOn) instead of waiting on a full socket
// itself. A caller's send clears later and writes the buffer itself.
func (w *clientWrites) flushNow() {
	w.finishes = 0
	if w.raw == nil {
		w.later = true
		return
	}
	n, err := w.raw.writeNow(w.buf)
	if err != nil {
		w.err = err
		return
	}
	w.buf = w.buf[:copy(w.buf, w.buf[n:])]
	// A full socket: the rest goes out as on other connections, from a
	// goroutine that waits for the socket, not with some later call (an
	// idle client would leave a Finish unsent, and the node would hold
	// the answer, or go on with a call given up).
	w.later = len(w.buf) > 0
}

// arm lets the writing caller's context cut the write in progress.
func (w *clientWrites) arm() {
	if w.stop != nil || w.ctx == nil || w.ctx.Done() == nil {
		return
	}
	gen := w.intr.arm()
	w.stop = context.AfterFunc(w.ctx, func() { w.intr.interrupt(gen) })
}

// disarm ends what arm set up, clearing a deadline the cut set.
func (w *clientWrites) disarm() {
	if w.stop == nil {
		return
	}
	w.stop()
	w.stop = nil
	w.intr.disarm()
}

// encodeFinish puts the Finish of question qid in the buffer.
func (w *clientWrites) encodeFinish(qid uint32, releaseCaps bool) error {
	if w.finMsg == nil {
		msg, m, err := newRPCMessage()
		if err != nil {
			return err
		}
		f, err := m.NewFinish()
		if err != nil {
			msg.Release()
			return err
		}
		w.finMsg, w.fin = msg, f
	}
	w.fin.SetQuestionId(qid)
	w.fin.SetReleaseResultCaps(releaseCaps)
	if err := w.enc.Encode(w.finMsg); err != nil {
		return err
	}
	w.finishes++
	return nil
}

// sendStatus is how a caller's send ended.
type sendStatus int

const (
	sent      sendStatus = iota // written (or failed: the error says)
	notSent                     // ctx ended, or the connection was lost, waiting for the lock: nothing written
	abandoned                   // ctx ended in the write: the rest goes out later
	cutLost                     // ctx ended in a write that cannot go on: connection lost
)

// pendingFinish is a Finish waiting for the write lock's next holder.
type pendingFinish struct {
	qid  uint32
	free bool // free the id once the Finish is written (its Return was read)
}

// lockWrite takes the write lock, or fails when ctx ends or the
// connection is lost first.
func (l *leanClient) lockWrite(ctx context.Context) error {
	select {
	case l.w.lock <- struct{}{}:
		return nil
	default:
	}
	select {
	case l.w.lock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-l.quit:
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.err
	}
}

func (l *leanClient) tryLockWrite() bool {
	select {
	case l.w.lock <- struct{}{}:
		return true
	default:
		return false
	}
}

// handOn gives the lock up, or hands it with the buffer to a goroutine
// that flushes it (later).
func (l *leanClient) handOn() {
	if l.w.later {
		go l.writeRest()
		return
	}
	l.unlockWrite()
}

// unlockWrite gives the lock up, then writes Finishes that came meanwhile.
func (l *leanClient) unlockWrite() {
	<-l.w.lock
	if l.pendN.Load() > 0 {
		l.flushPending()
	}
}

// send writes msgs, after any Finishes waiting, in one write. ctx's end
// stops the wait for the lock (notSent) or for a full socket (abandoned);
// an error means the connection failed (notSent: before any of msgs was
// written).
func (l *leanClient) send(ctx context.Context, msgs ...*capnp.Message) (sendStatus, error) {
	if err := l.lockWrite(ctx); err != nil {
		// Found by review (session 74): a call waiting for the lock when
		// the connection was lost was reported sent (and so of unknown
		// outcome, ErrOutcomeUnknown), though none of it was written.
		return notSent, err
	}
	w := &l.w
	w.ctx = ctx
	err := l.writePending()
	for _, msg := range msgs {
		if err != nil {
			break
		}
		err = w.enc.Encode(msg)
	}
	if err == nil {
		w.finishes = 0
		w.later = false
		w.writeBuf()
	}
	w.ctx = nil
	w.disarm()
	if err == nil {
		err = w.err
		if err != nil && ctx.Err() != nil && errors.Is(err, os.ErrDeadlineExceeded) {
			// Not a plain socket: the rest of a cut write cannot follow.
			l.unlockWrite()
			l.lost(fmt.Errorf("a write was cut when its call's context ended (%v): %w", ctx.Err(), err))
			return cutLost, ctx.Err()
		}
	}
	if err == nil && w.cut {
		go l.writeRest()
		return abandoned, ctx.Err()
	}
	l.unlockWrite()
	return sent, err
}

// writeRest sends what a cut write (or a flush left for later) left,
// holding the lock it was cut under; the connection is lost if that
// fails.
func (l *leanClient) writeRest() {
	w := &l.w
	w.cut, w.later = false, false
	w.writeBuf()
	if cap(w.buf) > writeBufSize && len(w.buf) == 0 {
		w.buf = make([]byte, 0, writeBufSize)
	}
	err := w.err
	l.unlockWrite()
	if err != nil {
		l.lost(fmt.Errorf("write: %w", err))
	}
}

// writePending puts the Finishes waiting for the lock in the buffer,
// frees the ids they end, and flushes at once when one of them asked to.
// REQUIRES: the write lock.
func (l *leanClient) writePending() error {
	if l.pendN.Load() == 0 {
		return nil
	}
	l.mu.Lock()
	pend, now, replies := l.pendFin, l.pendNow, l.replies
	l.pendFin, l.pendNow, l.replies = nil, false, nil
	l.pendN.Store(0)
	l.mu.Unlock()
	w := &l.w
	// The Finishes go first, through Write, while the buffer is within
	// writeBufSize: the replies after them may take it past that, and a
	// Finish encoded then would find a buffer Write cannot top up. The
	// protocol does not order a Finish against a reply to a message the
	// node started.
	for _, f := range pend {
		if err := w.encodeFinish(f.qid, true); err != nil {
			for _, r := range replies {
				r.Release()
			}
			return err
		}
	}
	for i, r := range replies {
		// Appended whole, not encoded through Write: an echo may be
		// larger than the buffer, and Write would then wait on a full
		// socket, where the holder may be the reader or a Finish's
		// writer, who must not (flushNow hands what the socket does not
		// take to a goroutine; queueReply set now).
		b, err := r.Marshal()
		r.Release()
		if err != nil {
			for _, r := range replies[i+1:] {
				r.Release()
			}
			return err
		}
		if w.err == nil {
			w.buf = append(w.buf, b...)
		}
	}
	l.mu.Lock()
	for _, f := range pend {
		if f.free && l.err == nil {
			delete(l.qs, f.qid)
			l.free = append(l.free, f.qid)
		}
	}
	l.mu.Unlock()
	if now || w.finishes >= maxLazyFinishes {
		w.flushNow()
	}
	return nil
}

// queueFinish leaves the Finish of qid for the lock's next holder (now:
// sent at once then, not with the next call), then tries to write it.
func (l *leanClient) queueFinish(qid uint32, free, now bool) {
	l.mu.Lock()
	l.addPendingFinish(qid, free, now)
	l.mu.Unlock()
	l.flushPending()
}

// addPendingFinish puts the Finish of qid in the list the write lock's
// next holder writes (nothing once the connection is lost). REQUIRES:
// l.mu.
func (l *leanClient) addPendingFinish(qid uint32, free, now bool) {
	if l.err != nil {
		return
	}
	l.pendFin = append(l.pendFin, pendingFinish{qid: qid, free: free})
	l.pendNow = l.pendNow || now
	l.storePendN()
}

// storePendN sets pendN. REQUIRES: l.mu.
func (l *leanClient) storePendN() {
	l.pendN.Store(int32(len(l.pendFin) + len(l.replies)))
}

// flushPending writes the waiting Finishes if the lock is free; its
// holder writes them otherwise.
func (l *leanClient) flushPending() {
	for l.pendN.Load() > 0 && l.tryLockWrite() {
		err := l.writePending()
		if err == nil {
			err = l.w.err
		}
		if err == nil && l.w.later {
			go l.writeRest() // it writes what comes meanwhile too
			return
		}
		<-l.w.lock // the loop looks again for Finishes that came meanwhile
		if err != nil {
			l.lost(fmt.Errorf("write: %w", err))
			return
		}
	}
}

// sendFailed settles calls whose send ended with st and err: calls not
// sent are forgotten, calls cut off are given up (or were failed with
// the connection, when the rest could not follow), and a failed write
// loses the connection (whose error then answers the calls). It returns
// the error the callers get now, or nil when they should await.
func (l *leanClient) sendFailed(st sendStatus, err error, calls ...outCall) error {
	switch {
	case st == notSent:
		for _, lc := range calls {
			l.unregister(lc)
		}
		return err
	case st == abandoned:
		for _, lc := range calls {
			l.giveUp(lc.qid, lc.q)
		}
		return err
	case st == cutLost:
		return err // lost() answered the calls
	case err != nil:
		l.lost(fmt.Errorf("write: %w", err))
	}
	return nil
}
