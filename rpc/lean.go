package rpc

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/storage"
)

// The lean engine (ServerConfig.Engine = EngineLean) serves the Queue
// interface of one connection with the standard Cap'n Proto RPC protocol
// (level 1: bootstrap, calls, returns, finish, release, promise pipelining
// on returned capabilities, calls to capabilities the client passes in),
// decoded with go-capnp's generated std/capnp/rpc types, but without
// go-capnp's rpc.Conn: one reader goroutine per connection decodes each
// message and runs the call on the spot when it cannot wait (nodeInfo,
// subscribe, every call on a store that never waits for I/O: memstore,
// rocksstore with SyncNone); on a store that completes calls
// asynchronously (storage.Async), enqueues, polls and acks are handed to
// the store, which answers them on the goroutine that made them durable
// (lean_async.go); any other call that can wait (a long poll, an fsync)
// runs on a goroutine of its own. Replies are coalesced: the reader writes
// the replies it made once it has no buffered input left (one write for a
// burst of pipelined calls), and a call that finished on its own goroutine
// writes its reply itself, together with any others queued, unless the
// reader is about to. So an uncontended call costs one read and one write
// and crosses no goroutine.
//
// The handlers are the go-capnp engine's: every Queue method's body is a
// function over the generated Params and Results structs (handlers.go), and
// the lean engine builds those structs in the Return message itself.
// Capabilities other than the Queue (a Subscription) are go-capnp clients,
// and calls to them are forwarded through capnp.Client.SendCall; the
// client's Consumer is imported as a capnp.Client whose hook sends Call
// messages on this connection (leanImport), so the subscription code is the
// same on both engines.
//
// Lock order: leanConn.mu -> leanConn.w (the writer queue) -> replyGate.mu.
// Neither is held while calling a handler, a capnp client or the socket.

// Engine names for ServerConfig.Engine.
const (
	// EngineGoCapnp serves each connection with go-capnp's rpc.Conn.
	EngineGoCapnp = "go-capnp"
	// EngineLean serves each connection of the Queue interface with the
	// lean engine (lean.go); listeners of StartBootstrap keep go-capnp.
	EngineLean = "lean"
)

// leanReadBuffer is the connection's read buffer: big enough that a burst
// of pipelined small calls arrives in one read.
const leanReadBuffer = 64 << 10

// leanWriteBuffer is the write buffer; replies queued together leave in
// one write when they fit.
const leanWriteBuffer = 64 << 10

// leanMaxOpenQuestions bounds the questions (calls and bootstraps) of one
// connection that have no Finish yet, returned or not: the server keeps
// an answer for each until its Finish, so a client that never sends one
// would grow the node's memory without end. A conforming client finishes
// every question; a parked long poll is one open question, and the node
// parks at most DefaultMaxWaitersPerQueue polls per queue.
const leanMaxOpenQuestions = 1 << 16

// leanConn is one connection of the lean engine.
type leanConn struct {
	s      *Server
	conn   net.Conn
	remote string
	q      *queueServer
	gate   *replyGate // nil: answers unbounded
	ctx    context.Context
	cancel context.CancelFunc
	// inline: store calls run on the reader (the store never waits).
	inline bool
	// async: enqueues, polls and acks go to the store without a
	// goroutine of their own, and are answered by whoever makes them
	// durable (lean_async.go); nil when the store cannot, or inline.
	async storage.Async
	// holder, with async: the store can hold its fsyncs while the reader
	// hands over calls it read in one piece (a pipelined ack and poll),
	// so that they share one (storage.SyncHolder); holding says the
	// reader holds. Reader only.
	holder  storage.SyncHolder
	holding bool

	raw      *rawIO        // nil: not a plain socket (TLS, a pipe)
	received atomic.Uint64 // bytes read from the connection (lean_bodywatch.go)
	body     bodyWatch
	br       *bufio.Reader
	dec      *capnp.Decoder
	maxMsg   uint64
	// maxQuestions bounds the open questions (leanMaxOpenQuestions).
	maxQuestions int
	flow         flowBudget
	first        func() // runs once, after the first message (nil: done)

	calls sync.WaitGroup // calls running on goroutines of their own

	// stopState: whether Server.Stop ended the reading (stopReading), or
	// the reader ended first; stopBound, once Stop ended it, closes the
	// connection if its last answers are not written in time.
	stopState atomic.Int32
	stopBound *clock.Timer

	mu struct {
		sync.Mutex
		closed bool
		// flushing: Stop's shutdown writes the queued answers
		// (flushAtStop); answers still tells which questions the client
		// finished (finishedUnwritten).
		flushing   bool
		answers    map[uint32]*leanAnswer // by the client's question id
		exports    map[uint32]*leanExport
		nextExport uint32
		bootID     uint32
		hasBoot    bool
		questions  map[uint32]*capnp.Promise // our calls to the client's capabilities (canceledQuestion: given up, Finish sent)
		qstops     map[uint32]func() bool    // stops the watch on a question's ctx (leanImport.Send)
		nextQ      uint32
	}

	// w is the queue of messages to write. Whoever sets writing writes
	// (the reader, or a call finishing on its own goroutine) until the
	// queue is empty.
	w struct {
		sync.Mutex
		out        []outFrame
		spare      []outFrame
		outBytes   int
		writing    bool
		readerBusy bool // the reader will write the queue before it blocks
		dead       bool
		// idle, when set (shutdown waits for the writer of the moment),
		// is closed once nobody writes.
		idle chan struct{}
	}
	bw   *bufio.Writer  // used by the writer of the moment only
	enc  *capnp.Encoder // on bw
	werr error          // first write error (writer of the moment only)
	// nonblock and spill, for the writer of the moment: with nonblock
	// set, what the socket does not take at once is kept in spill
	// instead of waiting for it (leanWriter).
	nonblock bool
	spill    []byte
	// spilled: the poll answers spill holds from their first byte on,
	// given back if spill is never written (writer of the moment).
	spilled []unsentPoll
	// passed counts the bytes leanWriter took (spill included), so that
	// passed plus what bw buffers is where the next message starts in
	// the connection's stream (writer of the moment).
	passed uint64
	// sent counts the bytes the socket took, as each write returns
	// (rawIO.sent on a plain socket): the stall checks judge by it that
	// a client reads, however slowly, and a poll answer none of whose
	// bytes it counts was never written.
	sent     atomic.Uint64
	writeSeq atomic.Uint64 // odd while a write is in progress (the stall watchdog)
	watchdog struct {      // closes a connection whose write is stuck
		sync.Mutex
		t *clock.Timer
		// seq and sent at the last tick.
		seq, sent uint64
		done      bool
	}
	// unwritten holds the poll answers never written, not a byte of
	// them, whose items shutdown gives back (giveBackUnwritten).
	unwritten struct {
		sync.Mutex
		polls []pollGiveBack
		done  bool // given back: nothing more may come
	}
}

// outFrame is one message waiting to be written; keep: the message is
// still read after it is written (an answer pipelined calls may target)
// and is left to the garbage collector instead of its pool. poll: the
// Return of a poll, whose items are given back if none of it is written;
// start is where it begins in the stream (writeBatch).
type outFrame struct {
	m     *capnp.Message
	keep  bool
	poll  bool
	start uint64
}

// leanAnswer is the server's side of one question of the client (a call or
// a bootstrap).
type leanAnswer struct {
	returned bool
	finished bool
	// releaseResultCaps is the Finish's flag when it came before the Return.
	releaseResultCaps bool
	cancel            context.CancelFunc // ends the call (nil: it runs on the reader)
	// shared: the Return is sent by a goroutine that serves other
	// connections too (the store's syncer, say), which must never wait
	// for this connection's socket (see sendFrom).
	shared bool
	// poll: the answer of a poll, which may carry items under a lease.
	poll    bool
	err     error       // the exception returned
	content capnp.Ptr   // the results, for pipelined calls (null when they hold no capability)
	caps    []uint32    // export ids of the results' capabilities
	pending []*leanCall // pipelined calls waiting for the return
}

// leanExport is a capability the client holds.
type leanExport struct {
	refs   uint32
	queue  bool         // the connection's Queue, served natively
	client capnp.Client // any other capability (a Subscription)
}

// leanCall is one incoming call.
type leanCall struct {
	qid    uint32
	iface  uint64
	method uint16
	in     *capnp.Message // the Call message; args alias it
	args   capnp.Struct
	held   flowHeld
	ans    *leanAnswer
	// Target, for a call pipelined on an answer not yet returned.
	on        *leanAnswer
	transform []uint16
}

// errPeerAborted ends a connection whose peer sent Abort.
var errPeerAborted = errors.New("peer aborted")

// protocolError is a broken rule of the RPC protocol: the connection is
// aborted with it as the reason.
type protocolError struct{ reason string }

func (e *protocolError) Error() string { return "rpc protocol: " + e.reason }

func protoErrf(format string, args ...any) error {
	return &protocolError{reason: fmt.Sprintf(format, args...)}
}

// serveLean serves conn with the lean engine until it ends or the server
// closes every connection. first runs once, after the first message.
func (s *Server) serveLean(ctx context.Context, cancel context.CancelFunc, conn net.Conn, remote string, gate *replyGate, first func()) {
	c := &leanConn{
		s: s, conn: conn, remote: remote, gate: gate, ctx: ctx, cancel: cancel,
		q:            &queueServer{s: s, remote: remote, gate: gate, connCtx: ctx, framesCounted: true},
		maxMsg:       uint64(s.cfg.MaxMessageBytes),
		first:        first,
		maxQuestions: cmp.Or(s.cfg.maxOpenQuestions, leanMaxOpenQuestions),
	}
	var rw io.ReadWriter = conn
	if raw := newRawIO(conn); raw != nil {
		raw.sent = &c.sent
		rw, c.raw = raw, raw
	}
	c.br = bufio.NewReaderSize(countingReader{rw, &c.received}, leanReadBuffer)
	c.bw = bufio.NewWriterSize(leanWriter{c}, leanWriteBuffer)
	if nb, ok := s.cfg.Store.(storage.Nonblocking); ok {
		c.inline = nb.Nonblocking()
	}
	if as, ok := s.cfg.Store.(storage.Async); ok && !c.inline {
		c.async = as
		c.holder, _ = as.(storage.SyncHolder)
	}
	c.dec = capnp.NewDecoder(c.br)
	c.dec.MaxMessageSize = c.maxMsg
	c.enc = capnp.NewEncoder(c.bw)
	c.flow = newFlowBudget(s.cfg.ConnFlowLimitBytes, s.inflight, s.cfg.MaxInflightBytes)
	c.mu.answers = make(map[uint32]*leanAnswer)
	c.mu.exports = make(map[uint32]*leanExport)
	c.mu.questions = make(map[uint32]*capnp.Promise)
	c.mu.qstops = make(map[uint32]func() bool)
	if gate != nil {
		gate.progress = c.sent.Load
		gate.check = s.cfg.stallCheck
		c.armWatchdog()
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-s.closeAll:
			c.stopReading()
		case <-done:
		}
	}()
	err := c.readLoop()
	c.bodyStop()
	c.unhold()
	// Server.Stop may still close the connection while shutdown writes
	// the last answers and the Abort to a peer that reads nothing.
	c.shutdown(err)
	close(done)
}

// The states of leanConn.stopState.
const (
	leanReading  int32 = iota // the reader reads
	leanEnded                 // the reader ended on its own (the peer left, broke the protocol, ...)
	leanStopping              // Server.Stop ended the reading: the last answers go out first
)

// stopReading is Server.Stop's end of the connection, once no call of
// the node runs any more: the reader stops taking calls, and its shutdown
// writes the answers queued for the calls that ran before it closes the
// connection, within ReplyStallTimeout from here (stopBound), so that a
// client that reads none of them cannot hold Stop. A connection whose
// reader ended already is closed at once, as before.
//
// Found by review (session 74): the connection was closed here at once,
// while the answers of calls that had just returned were still to be
// queued or written, so a client lost the answer to an enqueue or an ack
// the node had applied ("connection lost: EOF"), though Stop promises
// that running calls finish.
func (c *leanConn) stopReading() {
	c.stopBound = c.s.cfg.Clock.AfterFunc(c.s.cfg.ReplyStallTimeout, func() { _ = c.conn.Close() })
	if !c.stopState.CompareAndSwap(leanReading, leanStopping) {
		c.stopBound.Stop()
		_ = c.conn.Close()
		return
	}
	c.cancel() // a reader waiting for a budget (flow, replies) stops waiting
	// The reader's next read fails at once (os.ErrDeadlineExceeded).
	_ = c.conn.SetReadDeadline(aLongTimeAgo)
}

// readLoop reads and handles messages until the connection fails or a
// message breaks the protocol; it returns why it stopped.
func (c *leanConn) readLoop() error {
	for {
		buffered := c.frameBuffered()
		if !buffered {
			// The next decode may wait for the socket (nothing buffered,
			// or part of a message): end the hold on the store's fsyncs
			// and write what is ready first.
			c.idle()
		}
		// A full gate waits for answers to be written, this reader's
		// queued ones among them: it writes them before it waits.
		if err := c.gate.wait(c.idle); err != nil {
			return err
		}
		if c.first == nil {
			if handled, err := c.finishFast(); handled {
				if err != nil {
					return err
				}
				continue
			}
		}
		// A message not yet buffered whole takes the budgets of
		// unanswered bytes for the size its header announces before its
		// body is read: Decode allocates the whole message from the
		// header, and a peer sending only headers must not make the node
		// hold more than the budgets. (One buffered whole is within the
		// read buffer already: it takes them once decoded, as before.)
		var held flowHeld
		var size int64
		sized := false
		if !buffered {
			size, sized = c.nextFrameSize()
		}
		if sized {
			var err error
			if held, err = c.acquireFlow(size, false); err != nil {
				return err
			}
		}
		watch := sized && !c.frameBuffered() // its body has not all come yet
		if watch {
			c.bodyBegin(size)
		}
		msg, err := c.dec.Decode()
		if watch {
			c.bodyEnd()
		}
		if err != nil {
			c.flow.release(held)
			return err
		}
		c.busy()
		if c.first != nil {
			c.first()
			c.first = nil
		}
		// As limitedCodec: the traversal limit bounds the work one
		// message may cost, by its own size (traversalLimit).
		msg.ResetReadLimit(traversalLimit(msg, c.maxMsg))
		if !sized {
			size, err := msg.TotalSize()
			if err == nil {
				held, err = c.acquireFlow(int64(size), true)
			}
			if err != nil {
				msg.Release()
				return err
			}
		}
		if c.holder != nil && !c.holding && c.frameBuffered() {
			// More came in the same piece: what this message and the
			// next hand to the store wait for one fsync.
			c.holder.HoldSync()
			c.holding = true
		}
		if err := c.handle(msg, held); err != nil {
			return err
		}
	}
}

// frameBuffered reports whether a whole message is buffered, so that
// decoding it will not read the socket.
func (c *leanConn) frameBuffered() bool {
	b, _ := c.br.Peek(c.br.Buffered()) // never reads
	n, known := frameLen(b, c.maxMsg)
	return known && uint64(len(b)) >= n
}

// unhold ends the reader's hold on the store's fsyncs, if it holds.
func (c *leanConn) unhold() {
	if c.holding {
		c.holding = false
		c.holder.ReleaseSync()
	}
}

// nextFrameSize reads the header of the next message (waiting for the
// socket if it is not buffered yet) and returns the message's size, its
// header included, as capnp.Message.TotalSize counts it. ok is false
// when the header cannot be read or is one Decode refuses (too many
// segments, over the size limit): Decode then fails on it.
func (c *leanConn) nextFrameSize() (size int64, ok bool) {
	b, err := c.br.Peek(8)
	if err != nil {
		return 0, false
	}
	hdr, _, refused := frameHeader(b)
	if refused {
		return 0, false
	}
	if b, err = c.br.Peek(int(hdr)); err != nil {
		return 0, false
	}
	_, total, _ := frameHeader(b)
	if total == 0 || total > c.maxMsg {
		return 0, false
	}
	return int64(total), true
}

// acquireFlow takes size bytes from the connection's and the node's
// budgets of unanswered bytes, writing out replies first if it must wait.
// decoded: the reader has a message in hand and is busy again once it
// has the budget; otherwise it stays idle, for it may still wait for the
// message's body (and replies completed meanwhile must not wait for it).
func (c *leanConn) acquireFlow(size int64, decoded bool) (flowHeld, error) {
	if h, ok := c.flow.tryAcquire(size); ok {
		return h, nil
	}
	c.idle()
	h, err := c.flow.acquire(c.ctx, size)
	if decoded {
		c.busy()
	}
	return h, err
}

// handle handles one message; it owns msg and held. An error ends the
// connection.
func (c *leanConn) handle(msg *capnp.Message, held flowHeld) error {
	m, err := rpccp.ReadRootMessage(msg)
	if err == nil && m.Segment() == nil {
		err = errNotAStruct // a null or list root, as limitedCodec refuses
	}
	if err != nil {
		c.flow.release(held)
		msg.Release()
		return protoErrf("read message: %v", err)
	}
	if m.Which() == rpccp.Message_Which_call {
		return c.handleCall(msg, m, held)
	}
	keep := false
	switch m.Which() {
	case rpccp.Message_Which_bootstrap:
		err = c.handleBootstrap(m)
	case rpccp.Message_Which_finish:
		err = c.handleFinish(m)
	case rpccp.Message_Which_release:
		err = c.handleRelease(m)
	case rpccp.Message_Which_return:
		keep, err = c.handleReturn(m)
	case rpccp.Message_Which_abort:
		if ab, e := m.Abort(); e == nil {
			reason, _ := ab.Reason()
			c.s.log.Debug("connection aborted by peer", "remote", c.remote, "reason", reason)
		}
		err = errPeerAborted
	case rpccp.Message_Which_resolve:
		err = c.handleResolve(m)
	case rpccp.Message_Which_disembargo:
		err = c.handleDisembargo(m)
	case rpccp.Message_Which_unimplemented:
		err = c.handleUnimplemented(m)
	default:
		// Level 2+ (provide, accept, join) and the obsolete save and
		// delete: say so, as the protocol asks.
		err = c.sendUnimplemented(m)
	}
	c.flow.release(held)
	if !keep {
		msg.Release()
	}
	return err
}

// handleBootstrap answers with the connection's Queue.
func (c *leanConn) handleBootstrap(m rpccp.Message) error {
	b, err := m.Bootstrap()
	if err != nil {
		return protoErrf("read bootstrap: %v", err)
	}
	qid := b.QuestionId()
	msg, ret, err := newReturnMsg(qid)
	if err != nil {
		return err
	}
	payload, err := ret.NewResults()
	if err != nil {
		return err
	}
	iface := capnp.NewInterface(ret.Segment(), 0)
	if err := payload.SetContent(iface.ToPtr()); err != nil {
		return err
	}
	ct, err := payload.NewCapTable(1)
	if err != nil {
		return err
	}
	c.mu.Lock()
	if c.mu.answers[qid] != nil {
		c.mu.Unlock()
		return protoErrf("bootstrap: question id %d is in use", qid)
	}
	if err := c.questionRoomLocked(); err != nil {
		c.mu.Unlock()
		return err
	}
	if !c.mu.hasBoot {
		c.mu.bootID = c.newExportLocked(&leanExport{queue: true})
		c.mu.hasBoot = true
	} else {
		c.mu.exports[c.mu.bootID].refs++
	}
	id := c.mu.bootID
	c.mu.answers[qid] = &leanAnswer{returned: true, content: iface.ToPtr(), caps: []uint32{id}}
	c.mu.Unlock()
	ct.At(0).SetSenderHosted(id)
	c.send(msg, true)
	return nil
}

// questionRoomLocked fails when the connection has as many open
// questions as it may: the client must finish some first.
// REQUIRES: c.mu held.
func (c *leanConn) questionRoomLocked() error {
	if len(c.mu.answers) >= c.maxQuestions {
		return protoErrf("more than %d questions without a Finish", c.maxQuestions)
	}
	return nil
}

// newExportLocked adds e with one reference and returns its id.
// REQUIRES: c.mu held.
func (c *leanConn) newExportLocked(e *leanExport) uint32 {
	for {
		id := c.mu.nextExport
		c.mu.nextExport++
		if _, used := c.mu.exports[id]; !used {
			e.refs = 1
			c.mu.exports[id] = e
			return id
		}
	}
}

// releaseExportLocked drops n references of export id and returns the
// client to release once it has none left (outside the lock).
// REQUIRES: c.mu held.
func (c *leanConn) releaseExportLocked(id, n uint32) (capnp.Client, error) {
	e := c.mu.exports[id]
	if e == nil {
		return capnp.Client{}, protoErrf("release of unknown export id %d", id)
	}
	if n > e.refs {
		return capnp.Client{}, protoErrf("release of %d references to export id %d, which has %d", n, id, e.refs)
	}
	e.refs -= n
	if e.refs > 0 {
		return capnp.Client{}, nil
	}
	delete(c.mu.exports, id)
	if e.queue {
		c.mu.hasBoot = false
	}
	return e.client, nil
}

func (c *leanConn) handleRelease(m rpccp.Message) error {
	r, err := m.Release()
	if err != nil {
		return protoErrf("read release: %v", err)
	}
	c.mu.Lock()
	cl, err := c.releaseExportLocked(r.Id(), r.ReferenceCount())
	c.mu.Unlock()
	cl.Release()
	return err
}

func (c *leanConn) handleFinish(m rpccp.Message) error {
	f, err := m.Finish()
	if err != nil {
		return protoErrf("read finish: %v", err)
	}
	return c.finish(f.QuestionId(), f.ReleaseResultCaps())
}

// finish ends question qid at the caller's Finish (releaseResultCaps:
// the caller drops its references to the results' capabilities).
func (c *leanConn) finish(qid uint32, releaseResultCaps bool) error {
	var err error
	var release []capnp.Client
	var cancel context.CancelFunc
	c.mu.Lock()
	a := c.mu.answers[qid]
	switch {
	case a == nil:
		c.mu.Unlock()
		return protoErrf("finish of unknown question id %d", qid)
	case a.finished:
		c.mu.Unlock()
		return protoErrf("second finish of question id %d", qid)
	}
	a.finished = true
	if a.returned {
		delete(c.mu.answers, qid)
		if releaseResultCaps {
			release, err = c.releaseCapsLocked(a.caps)
		}
	} else {
		a.releaseResultCaps = releaseResultCaps
		cancel = a.cancel
	}
	c.mu.Unlock()
	if cancel != nil {
		cancel() // the caller no longer wants it: end a parked poll now
	}
	for _, cl := range release {
		cl.Release()
	}
	return err
}

// releaseCapsLocked drops one reference of each export in ids.
// REQUIRES: c.mu held.
func (c *leanConn) releaseCapsLocked(ids []uint32) ([]capnp.Client, error) {
	var out []capnp.Client
	for _, id := range ids {
		cl, err := c.releaseExportLocked(id, 1)
		if err != nil {
			return out, err
		}
		if cl.IsValid() {
			out = append(out, cl)
		}
	}
	return out, nil
}
