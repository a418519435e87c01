package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/exc"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/benbjohnson/clock"
	"golang.org/x/sync/semaphore"

	"github.com/leaseq/leaseq/schema"
)

// leanClient is the Go client's own connection loop for the Queue
// methods that return plain results (every method but subscribe): the
// caller writes its Call itself, reads the Returns until its own comes
// (handing any other to its caller), and writes the Finish once it has
// read the results. go-capnp's rpc.Conn crosses a sender and a reader
// goroutine for each call and each Finish, which cost the client two to
// three times the server's CPU per call (docs/BENCHMARKS.md). It hosts no
// capabilities and pipelines nothing: Subscribe, which needs both, uses a
// go-capnp connection of its own (Client.capnpConn).
//
// Who reads. One goroutine at a time holds the socket's read side
// (reading). A caller that finds it free after writing its Call takes it
// and reads until its own Return comes: one goroutine wakes per call, as
// with a client that has a connection per caller. A caller that finds it
// taken waits for its Return to be handed over. When the holder has its
// Return and other questions are still open, it hands the read side to the
// connection's reader goroutine, which reads until none is. With no
// question open, nobody reads until the connection has been idle for
// idleWatch: then the reader goroutine reads, to see the connection end
// (Done) and to hand the read side back at the next Return. This needs a
// read that can be interrupted without losing half a message (a caller's
// context may end while it reads): plain sockets have it (frameReader, and
// a read deadline as the interrupt); on TLS and other connections the
// reader goroutine reads everything, as it always did.
type leanClient struct {
	conn net.Conn
	dec  *capnp.Decoder // the read side's holder's
	fr   *frameReader   // under dec: a whole message is read before it decodes
	// callersRead: callers read their own Returns (plain sockets, whose
	// reads an interrupt can stop without losing half a message); else
	// the reader goroutine reads everything.
	callersRead bool
	// readLimit bounds one incoming message (DefaultMaxReplyBytes), and
	// 4 times it the traversal of one.
	readLimit uint64

	w clientWrites // the write side (leanclient_write.go)
	// pendN is len(pendFin)+len(replies), read without mu on the write
	// path.
	pendN atomic.Int32

	flow  *semaphore.Weighted // bytes of calls in flight (FlowLimitBytes)
	limit int64

	mu      sync.Mutex
	qs      map[uint32]*leanQuestion
	free    []uint32
	next    uint32
	reading bool            // a goroutine holds the read side
	pending int             // questions whose Return has not been read
	err     error           // why the connection ended; set once
	quit    chan struct{}   // closed when err is set
	wake    chan struct{}   // hands the read side to the reader goroutine
	pendFin []pendingFinish // Finishes waiting for the write lock
	pendNow bool            // one of them is to be flushed at once
	done    chan struct{}   // closed when the reader goroutine ends
	target  uint32          // the bootstrap capability's import id

	// replies answer messages the node started (leanclient_answer.go),
	// waiting for the write lock's holder as pendFin; nodeReplies counts
	// those the connection made, up to maxNodeReplies.
	replies     []*capnp.Message
	nodeReplies int

	// giveBack nacks the items of a poll whose caller gave up before
	// reading its answer (abandoned); nil: they stay leased until the
	// lease expires.
	giveBack func(pollGiveBack)

	// draining: Close has begun stopping the polls (leanclient_drain.go);
	// drainLeft of them are still to be answered, and drainDone is closed
	// when none is.
	draining  bool
	drainLeft int
	drainDone chan struct{}

	intr deadlineInterrupt // how a reading caller's context ends its read
	idle *clock.Timer      // starts watchIdle; plain sockets only
}

// idleWatch is how long a connection with no question open goes unread:
// the longest it takes the client to see an idle connection end. A call
// that comes while the reader goroutine watches costs one hand-off more.
const idleWatch = 100 * time.Millisecond

// leanQuestion is a call waiting for its Return.
type leanQuestion struct {
	reply chan leanReply // buffered: the reader never waits for the caller
	// gone: the caller gave up (its context ended) and its Finish is sent or queued (pendFin);
	// the reader frees the question when the Return comes.
	gone     bool
	answered bool   // a reply was handed over
	held     int64  // flow bytes, given back when the Return comes
	method   uint16 // the Queue method called (a poll's items are given back when it is gone)
	// Polls only (leanclient_drain.go): sent, its Call is written (a
	// Finish may follow); closeWait, Close waits for its Return.
	sent, closeWait bool
}

type leanReply struct {
	msg *capnp.Message
	ret rpccp.Return
	err error
}

// newLeanClient runs the bootstrap over conn and starts the reader. limit
// bounds the bytes of calls in flight (FlowLimitBytes), readLimit one
// incoming message (DefaultMaxReplyBytes).
func newLeanClient(ctx context.Context, conn net.Conn, limit int64, readLimit uint64, clk clock.Clock) (*leanClient, error) {
	// Plain sockets are read and written with raw system calls, as the
	// server's (rawio.go): Go's system-call bookkeeping woke the sysmon
	// thread at every read and write (12 % of a producer's CPU).
	var rw io.ReadWriter = conn
	raw := newRawIO(conn)
	if raw != nil {
		rw = raw
	}
	l := &leanClient{
		conn:  conn,
		flow:  semaphore.NewWeighted(limit),
		limit: limit,
		qs:    make(map[uint32]*leanQuestion),
		quit:  make(chan struct{}),
		wake:  make(chan struct{}, 1),
		done:  make(chan struct{}),

		readLimit: readLimit,
	}
	// The frameReader grows its buffer as a message's bytes arrive, so a
	// header that claims a large message (up to readLimit, a GiB) costs
	// memory only once the node has sent that much.
	l.fr = newFrameReader(rw, 64<<10, readLimit)
	l.dec = capnp.NewDecoder(l.fr)
	l.dec.MaxMessageSize = readLimit
	if raw != nil {
		l.callersRead = true
	} else {
		l.reading = true // the reader goroutine's, always
	}
	l.intr.set = conn.SetReadDeadline
	l.w.init(conn, raw)
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	// A ctx cancelled during the bootstrap ends it too: a deadline in
	// the past wakes the read.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(aLongTimeAgo) })
	target, err := l.bootstrap()
	if !stop() {
		return nil, fmt.Errorf("rpc: bootstrap: %w", context.Cause(ctx))
	}
	_ = conn.SetDeadline(time.Time{})
	if err != nil {
		return nil, err
	}
	l.target = target
	if l.callersRead {
		l.idle = clk.AfterFunc(idleWatch, l.watchIdle)
	}
	go l.readLoop()
	return l, nil
}

// bootstrap asks for the node's Queue capability (question 0) and returns
// its import id. It runs before the reader goroutine starts.
func (l *leanClient) bootstrap() (uint32, error) {
	err := l.write(func(m rpccp.Message) error {
		b, err := m.NewBootstrap()
		if err != nil {
			return err
		}
		b.SetQuestionId(0)
		return nil
	})
	if err != nil {
		return 0, err
	}
	for {
		msg, err := l.decode()
		if err != nil {
			return 0, fmt.Errorf("rpc: bootstrap: %w", err)
		}
		m, err := rpccp.ReadRootMessage(msg)
		if err != nil {
			msg.Release()
			return 0, fmt.Errorf("rpc: bootstrap: %w", err)
		}
		switch m.Which() {
		case rpccp.Message_Which_abort:
			ab, _ := m.Abort()
			reason, _ := ab.Reason()
			overloaded := ab.Type() == rpccp.Exception_Type_overloaded
			msg.Release()
			if overloaded {
				return 0, fmt.Errorf("%w: %s", ErrTooManyConns, reason)
			}
			return 0, fmt.Errorf("rpc: bootstrap: node aborted the session: %s", reason)
		case rpccp.Message_Which_return:
		default:
			// Nothing else is expected, but a message the node starts
			// may need an answer (an echo copies it: before Release).
			err := l.answerNode(m)
			msg.Release()
			if err != nil {
				return 0, fmt.Errorf("rpc: bootstrap: %w", err)
			}
			continue
		}
		ret, err := m.Return()
		if err != nil || ret.AnswerId() != 0 {
			msg.Release()
			return 0, fmt.Errorf("rpc: bootstrap: unexpected return (%v)", err)
		}
		id, err := bootstrapImport(ret)
		msg.Release()
		if err != nil {
			return 0, fmt.Errorf("rpc: bootstrap: %w", err)
		}
		// We keep the capability: the Finish releases nothing.
		if err := l.lockWrite(context.Background()); err != nil {
			return 0, err
		}
		err = l.w.encodeFinish(0, false)
		if err == nil {
			l.w.writeBuf()
			err = l.w.err
		}
		l.unlockWrite()
		return id, err
	}
}

// bootstrapImport reads the capability a bootstrap Return carries.
func bootstrapImport(ret rpccp.Return) (uint32, error) {
	switch ret.Which() {
	case rpccp.Return_Which_exception:
		e, _ := ret.Exception()
		reason, _ := e.Reason()
		return 0, exc.New(exc.Type(e.Type()), "", reason)
	case rpccp.Return_Which_results:
	default:
		return 0, fmt.Errorf("return of kind %v", ret.Which())
	}
	p, err := ret.Results()
	if err != nil {
		return 0, err
	}
	caps, err := p.CapTable()
	if err != nil || caps.Len() != 1 {
		return 0, fmt.Errorf("bootstrap results hold %d capabilities (%v)", caps.Len(), err)
	}
	d := caps.At(0)
	if d.Which() != rpccp.CapDescriptor_Which_senderHosted {
		return 0, fmt.Errorf("bootstrap capability is %v, not sender-hosted", d.Which())
	}
	return d.SenderHosted(), nil
}

// write builds one message with fill and writes it at once.
func (l *leanClient) write(fill func(rpccp.Message) error) error {
	msg, m, err := newRPCMessage()
	if err != nil {
		return err
	}
	defer msg.Release()
	if err := fill(m); err != nil {
		return err
	}
	_, err = l.send(context.Background(), msg)
	return err
}

// call sends one Queue call whose params build fills and waits for its
// Return. On success the results struct is valid until release, which
// also sends the Finish; release must be called exactly once.
func (l *leanClient) call(ctx context.Context, method uint16, build func(*capnp.Segment) (capnp.Ptr, error)) (capnp.Struct, func(), error) {
	res, release, _, err := l.callSent(ctx, method, build)
	return res, release, err
}

// callSent is call, and on error says whether the call may have reached
// the node (sent: some of it was written, or its write failed), or
// surely did not (it failed before its send began, or waiting for the
// write lock).
func (l *leanClient) callSent(ctx context.Context, method uint16, build func(*capnp.Segment) (capnp.Ptr, error)) (_ capnp.Struct, _ func(), sent bool, _ error) {
	lc, err := l.prepare(ctx, method, build)
	if err != nil {
		return capnp.Struct{}, nil, false, err
	}
	st, err := l.send(ctx, lc.msg)
	lc.msg.Release()
	if sent, err := l.afterSend(st, err, lc); err != nil {
		return capnp.Struct{}, nil, sent, err
	}
	res, release, err := l.await(ctx, lc)
	return res, release, true, err
}

// callPair sends two Queue calls in one write (the second does not wait
// for the first's Return: the node may answer them in either order, and
// with --sync=always they share a commit and its fsync) and waits for
// both. Each result is as call's: on success valid until its release.
func (l *leanClient) callPair(ctx context.Context, m1 uint16, b1 func(*capnp.Segment) (capnp.Ptr, error), m2 uint16, b2 func(*capnp.Segment) (capnp.Ptr, error)) (r1, r2 leanResult) {
	c1, c2, err := l.preparePair(ctx, m1, b1, m2, b2)
	if err != nil {
		r1.err, r2.err = err, err
		return r1, r2
	}
	st, err := l.send(ctx, c1.msg, c2.msg)
	c1.msg.Release()
	c2.msg.Release()
	if st != notSent {
		l.pollSent(c1)
		l.pollSent(c2)
	}
	if err := l.sendFailed(st, err, c1, c2); err != nil {
		r1.err, r2.err = err, err
		return r1, r2
	}
	// The second's Return usually comes last: waiting for it first reads
	// both on this goroutine, where waiting for the first would hand the
	// read side to the reader goroutine between them.
	r2.res, r2.release, r2.err = l.await(ctx, c2)
	r1.res, r1.release, r1.err = l.await(ctx, c1)
	return r1, r2
}

// leanResult is one call's answer from callPair.
type leanResult struct {
	res     capnp.Struct
	release func() // nil when err is set
	err     error
}

// outCall is a Call built and registered, not yet answered.
type outCall struct {
	msg *capnp.Message
	q   *leanQuestion
	qid uint32
}

// prepare builds a Call of method whose params build fills, takes its
// flow bytes and registers its question. The caller sends lc.msg and
// releases it, then awaits the Return.
func (l *leanClient) prepare(ctx context.Context, method uint16, build func(*capnp.Segment) (capnp.Ptr, error)) (outCall, error) {
	msg, c, held, err := l.newCall(method, build)
	if err != nil {
		return outCall{}, err
	}
	if err := l.flow.Acquire(ctx, held); err != nil {
		msg.Release()
		return outCall{}, err
	}
	return l.register(msg, c, held)
}

// preparePair is prepare for two calls sent in one write. Their flow
// bytes are taken in one step: taken one after the other, a larger call
// queued between the two would wait for bytes held by the first, which
// is not sent until the second has its own.
func (l *leanClient) preparePair(ctx context.Context, m1 uint16, b1 func(*capnp.Segment) (capnp.Ptr, error), m2 uint16, b2 func(*capnp.Segment) (capnp.Ptr, error)) (c1, c2 outCall, err error) {
	msg1, call1, h1, err := l.newCall(m1, b1)
	if err != nil {
		return c1, c2, err
	}
	msg2, call2, h2, err := l.newCall(m2, b2)
	if err != nil {
		msg1.Release()
		return c1, c2, err
	}
	h2 = min(h2, l.limit-h1) // together at most the limit, as one call's
	if err := l.flow.Acquire(ctx, h1+h2); err != nil {
		msg1.Release()
		msg2.Release()
		return c1, c2, err
	}
	if c1, err = l.register(msg1, call1, h1); err != nil {
		msg2.Release()
		l.flow.Release(h2)
		return c1, c2, err
	}
	if c2, err = l.register(msg2, call2, h2); err != nil {
		l.forget(c1)
		return c1, c2, err
	}
	return c1, c2, nil
}

// newCall builds a Call of method whose params build fills and returns
// it with the flow bytes it holds while unanswered: its size, at most
// the limit.
func (l *leanClient) newCall(method uint16, build func(*capnp.Segment) (capnp.Ptr, error)) (msg *capnp.Message, c rpccp.Call, held int64, err error) {
	msg, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	if err != nil {
		return nil, c, 0, err
	}
	defer func() {
		if err != nil {
			msg.Release()
		}
	}()
	m, err := rpccp.NewRootMessage(seg)
	if err != nil {
		return nil, c, 0, err
	}
	c, err = m.NewCall()
	if err != nil {
		return nil, c, 0, err
	}
	tgt, err := c.NewTarget()
	if err != nil {
		return nil, c, 0, err
	}
	tgt.SetImportedCap(l.target)
	c.SetInterfaceId(schema.Queue_TypeID)
	c.SetMethodId(method)
	c.SendResultsTo().SetCaller()
	payload, err := c.NewParams()
	if err != nil {
		return nil, c, 0, err
	}
	content, err := build(seg)
	if err != nil {
		return nil, c, 0, err
	}
	if err := payload.SetContent(content); err != nil {
		return nil, c, 0, err
	}
	size, err := msg.TotalSize()
	if err != nil {
		return nil, c, 0, err
	}
	return msg, c, min(int64(size), l.limit), nil
}

// register gives msg, whose held flow bytes are taken, a question id
// and writes it into c, msg's Call. On error msg is released and held
// given back.
func (l *leanClient) register(msg *capnp.Message, c rpccp.Call, held int64) (outCall, error) {
	q := &leanQuestion{reply: make(chan leanReply, 1), held: held, method: c.MethodId()}
	qid, err := l.ask(q)
	if err != nil {
		l.flow.Release(held)
		msg.Release()
		return outCall{}, err
	}
	c.SetQuestionId(qid)
	return outCall{msg: msg, q: q, qid: qid}, nil
}

// forget unregisters a prepared call that was never sent, and releases
// its message.
func (l *leanClient) forget(lc outCall) {
	lc.msg.Release()
	l.unregister(lc)
}

// unregister frees the question of a call that was never sent.
func (l *leanClient) unregister(lc outCall) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.qs[lc.qid] != lc.q {
		return // the connection was lost: lost() cleared it
	}
	l.pollDrained(lc.q)
	delete(l.qs, lc.qid)
	l.free = append(l.free, lc.qid)
	l.pending--
	l.flow.Release(lc.q.held)
	lc.q.held = 0
}

// await waits for lc's Return, reading the connection itself when nobody
// else does, and decodes it as call does.
func (l *leanClient) await(ctx context.Context, lc outCall) (capnp.Struct, func(), error) {
	qid, q := lc.qid, lc.q
	var r leanReply
	if l.takeRead() {
		if err := l.readOwn(ctx, q); err != nil {
			l.giveUp(qid, q)
			return capnp.Struct{}, nil, err
		}
		r = <-q.reply
	} else {
		select {
		case r = <-q.reply: // a reply already here wins over an ended ctx
		default:
			select {
			case r = <-q.reply:
			case <-ctx.Done():
				l.giveUp(qid, q)
				return capnp.Struct{}, nil, ctx.Err()
			}
		}
	}
	if r.err != nil {
		return capnp.Struct{}, nil, r.err
	}
	big := false
	if n, err := r.msg.TotalSize(); err != nil || n > lazyFinishMax {
		big = true
	}
	release := func() {
		r.msg.Release()
		l.finish(qid, big)
	}
	switch r.ret.Which() {
	case rpccp.Return_Which_results:
		p, err := r.ret.Results()
		if err != nil {
			release()
			return capnp.Struct{}, nil, err
		}
		res, err := p.Content()
		if err != nil {
			release()
			return capnp.Struct{}, nil, err
		}
		return res.Struct(), release, nil
	case rpccp.Return_Which_exception:
		e, _ := r.ret.Exception()
		reason, _ := e.Reason()
		err := exc.New(exc.Type(e.Type()), "", reason)
		release()
		return capnp.Struct{}, nil, err
	default:
		err := exc.New(exc.Failed, "", fmt.Sprintf("rpc: return of kind %v", r.ret.Which()))
		release()
		return capnp.Struct{}, nil, err
	}
}

// ask registers q under a free question id (never 0: the bootstrap's).
func (l *leanClient) ask(q *leanQuestion) (uint32, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return 0, l.err
	}
	if l.draining && q.method == mPoll.id {
		return 0, errClientClosing // its answer could not be given back
	}
	var id uint32
	if n := len(l.free); n > 0 {
		id, l.free = l.free[n-1], l.free[:n-1]
	} else {
		l.next++
		id = l.next
	}
	l.qs[id] = q
	l.pending++
	return id, nil
}

// takeRead takes the read side if it is free.
func (l *leanClient) takeRead() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.reading || l.err != nil {
		return false
	}
	l.reading = true
	return true
}

// passRead gives up a caller's read side: to the reader goroutine while a
// question is still open, else to whoever asks next.
func (l *leanClient) passRead() {
	if !l.dropRead() {
		l.wake <- struct{}{} // never blocks: one hand-off at a time
	}
}

// dropRead gives up the read side if no question is open (or the
// connection has ended), and starts the idle watch; it reports whether it
// did.
func (l *leanClient) dropRead() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pending > 0 && l.err == nil {
		return false
	}
	l.reading = false
	if l.err == nil {
		l.idle.Reset(idleWatch)
	}
	return true
}

// watchIdle hands the read side of a connection idle for idleWatch to
// the reader goroutine.
func (l *leanClient) watchIdle() {
	l.mu.Lock()
	start := !l.reading && l.pending == 0 && l.err == nil
	if start {
		l.reading = true
	}
	l.mu.Unlock()
	if start {
		l.wake <- struct{}{}
	}
}

// readOwn reads messages, handing each to its question, until q has its
// reply (then in q.reply), and passes the read side on. It returns ctx's
// error, leaving q unanswered, if ctx ends first.
func (l *leanClient) readOwn(ctx context.Context, q *leanQuestion) error {
	var stop func() bool
	var gen uint64
	if ctx.Done() != nil {
		gen = l.intr.arm()
		stop = context.AfterFunc(ctx, func() { l.intr.interrupt(gen) })
	}
	var err error
	for !l.answered(q) {
		if err = l.readOne(); err != nil {
			break
		}
	}
	if stop != nil {
		stop()
		l.intr.disarm()
	}
	// A failed read answers nothing, so q is unanswered when err is set.
	interrupted := err != nil && ctx.Err() != nil && errors.Is(err, os.ErrDeadlineExceeded)
	if err != nil && !interrupted {
		l.lost(err) // answers q
	}
	l.passRead()
	if interrupted {
		return ctx.Err()
	}
	return nil
}

// answered reports whether q's reply was handed over, or Close stopped
// it (gone: its reply is the error, its Return yet to come).
func (l *leanClient) answered(q *leanQuestion) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return q.answered || q.gone
}

// deadlineInterrupt ends the read (or write) of a caller whose context
// ended, with a deadline in the past (set: the connection's
// SetReadDeadline or SetWriteDeadline). Each read or write by a caller
// arms it anew (gen), so a context that ends late cannot interrupt the
// next holder's.
type deadlineInterrupt struct {
	set   func(time.Time) error
	mu    sync.Mutex
	gen   uint64
	armed bool
	fired bool // a deadline is set and must be cleared
}

// aLongTimeAgo is a read deadline that has passed. It is a fixed instant,
// not a reading of any clock: a deadline must be in the kernel's past,
// which the injected clock (a mock one in tests) cannot promise.
var aLongTimeAgo = time.Unix(1, 0)

func (i *deadlineInterrupt) arm() uint64 {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.gen++
	i.armed = true
	return i.gen
}

func (i *deadlineInterrupt) interrupt(gen uint64) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.armed && i.gen == gen {
		i.fired = true
		_ = i.set(aLongTimeAgo)
	}
}

func (i *deadlineInterrupt) disarm() {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.armed = false
	if i.fired {
		i.fired = false
		_ = i.set(time.Time{})
	}
}

// lazyFinishMax and maxLazyFinishes bound what lazy Finishes leave on the
// node: it keeps an answer until its Finish comes, so the Finish of a
// large answer goes out at once, and at most maxLazyFinishes wait.
const (
	lazyFinishMax   = 64 << 10
	maxLazyFinishes = 32
)

// finish writes the Finish of a question whose Return was read, and frees
// its id. The Finish is flushed with the next call rather than in a write
// of its own (one system call per call instead of two), unless the answer
// was large (now) or too many Finishes wait. It never waits for the
// write lock: a Finish that finds it taken is left to its holder.
func (l *leanClient) finish(qid uint32, now bool) {
	if !l.tryLockWrite() {
		l.queueFinish(qid, true, now)
		return
	}
	w := &l.w
	err := l.writePending()
	if err == nil {
		err = w.encodeFinish(qid, true)
	}
	if err == nil && (now || w.finishes >= maxLazyFinishes) {
		w.flushNow()
	}
	if err == nil {
		err = w.err
	}
	if err != nil {
		l.unlockWrite()
		l.lost(fmt.Errorf("write: %w", err))
	} else {
		l.handOn()
	}
	l.mu.Lock()
	delete(l.qs, qid)
	l.free = append(l.free, qid)
	l.mu.Unlock()
}

// giveUp cancels a question whose caller stopped waiting: the Finish tells
// the node to cancel the call; the id stays taken until the Return comes.
// The Finish is queued in the same step that marks the question gone:
// the reader frees a gone question's id when its Return comes, and a call
// that reused the id is written after the queued Finish (the lock's
// holder writes waiting Finishes first), never ahead of it, which would
// be a protocol error (the node still holds the answer) and have the late
// Finish cancel the new call.
func (l *leanClient) giveUp(qid uint32, q *leanQuestion) {
	l.mu.Lock()
	select {
	case r := <-q.reply: // answered meanwhile; the Finish ends it
		l.mu.Unlock()
		if r.msg != nil {
			l.abandoned(q, r.ret)
			r.msg.Release()
		}
		if r.err == nil {
			l.queueFinish(qid, true, true)
		}
		return
	default:
	}
	q.gone = true
	l.addPendingFinish(qid, false, true)
	l.mu.Unlock()
	l.flushPending()
}

// readLoop is the connection's reader goroutine. On a plain socket it
// reads while it holds the read side (passRead), until no question is
// open; on others it reads everything. It ends with the connection.
func (l *leanClient) readLoop() {
	defer close(l.done)
	for {
		if l.callersRead {
			select {
			case <-l.wake:
			case <-l.quit:
				return
			}
		}
		for {
			if err := l.readOne(); err != nil {
				l.lost(err)
				return
			}
			if l.callersRead && l.dropRead() {
				break
			}
		}
	}
}

// decode reads the next message; only the read side's holder calls it.
// A message over readLimit is refused with a *replyTooLargeError before
// its body is read.
func (l *leanClient) decode() (*capnp.Message, error) {
	if err := l.fr.fill(); err != nil {
		return nil, err
	}
	if size, over := l.fr.tooLarge(); over {
		return nil, &replyTooLargeError{size: size, limit: l.readLimit}
	}
	return l.dec.Decode()
}

// readOne reads one message and hands it on.
func (l *leanClient) readOne() error {
	msg, err := l.decode()
	if err != nil {
		return err
	}
	msg.ResetReadLimit(traversalLimit(msg, l.readLimit))
	return l.handle(msg)
}

// handle dispatches one incoming message; it owns msg.
func (l *leanClient) handle(msg *capnp.Message) error {
	m, err := rpccp.ReadRootMessage(msg)
	if err != nil {
		msg.Release()
		return err
	}
	switch m.Which() {
	case rpccp.Message_Which_return:
		ret, err := m.Return()
		if err != nil {
			msg.Release()
			return err
		}
		l.mu.Lock()
		qid := ret.AnswerId()
		q := l.qs[qid]
		if q == nil || q.answered {
			// A second Return for one question: the node broke the
			// protocol, and the connection ends.
			l.mu.Unlock()
			msg.Release()
			return fmt.Errorf("return for unknown question %d", qid)
		}
		l.flow.Release(q.held)
		q.held = 0
		l.pending--
		if q.gone {
			// The give-back starts (Client.Close counts it) before the
			// question is freed, and before a Close waiting for this
			// answer (pollDrained) goes on: a Close that follows waits
			// for it.
			l.abandoned(q, ret)
			l.pollDrained(q)
			delete(l.qs, qid)
			l.free = append(l.free, qid)
			l.mu.Unlock()
			msg.Release()
			return nil
		}
		l.pollDrained(q) // its caller has the items
		q.answered = true
		q.reply <- leanReply{msg: msg, ret: ret}
		l.mu.Unlock()
		return nil
	case rpccp.Message_Which_abort:
		ab, _ := m.Abort()
		reason, _ := ab.Reason()
		msg.Release()
		return exc.New(exc.Disconnected, "", "node aborted the session: "+reason)
	default:
		// A message the node started: Release, Resolve, Disembargo and
		// the like concern capabilities and promises this client never
		// holds; others are answered (an echo copies msg: before
		// Release).
		err := l.answerNode(m)
		msg.Release()
		return err
	}
}

// lost ends the connection: every waiting call fails with a disconnected
// error (capnp.IsDisconnected), or, when the connection ends because the
// node sent a message over readLimit, with that error (ErrReplyTooLarge:
// the node did not go away, and nothing broke its --max-message); later
// calls fail as disconnected.
func (l *leanClient) lost(cause error) {
	l.mu.Lock()
	err := cause
	if l.err == nil {
		if !capnp.IsDisconnected(cause) {
			cause = exc.New(exc.Disconnected, "", "connection lost: "+cause.Error())
		}
		l.err = cause
		close(l.quit)
		if l.idle != nil {
			l.idle.Stop()
		}
	}
	if !errors.Is(err, ErrReplyTooLarge) {
		err = l.err
	}
	l.pendFin, l.pendNow = nil, false
	for _, r := range l.replies {
		r.Release()
	}
	l.replies = nil
	l.pendN.Store(0)
	for qid, q := range l.qs {
		if q.held > 0 {
			l.flow.Release(q.held)
			q.held = 0
		}
		if !q.gone && !q.answered {
			q.answered = true
			q.reply <- leanReply{err: err}
		}
		delete(l.qs, qid)
	}
	l.pending = 0
	l.mu.Unlock()
	_ = l.conn.Close()
}

// close ends the connection and waits for the reader.
func (l *leanClient) close() error {
	l.lost(errors.New("client closed"))
	<-l.done
	return nil
}
