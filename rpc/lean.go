package rpc

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/exc"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/schema"
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
// rocksstore with SyncNone); a call that can wait (a long poll, an fsync)
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

// leanFlushBytes is how many reply bytes the reader may hold back while
// it still has buffered input: past it, it writes them out first.
const leanFlushBytes = 64 << 10

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

	br     *bufio.Reader
	dec    *capnp.Decoder
	maxMsg uint64
	flow   flowBudget
	first  func() // runs once, after the first message (nil: done)

	calls sync.WaitGroup // calls running on goroutines of their own

	mu struct {
		sync.Mutex
		closed     bool
		answers    map[uint32]*leanAnswer // by the client's question id
		exports    map[uint32]*leanExport
		nextExport uint32
		bootID     uint32
		hasBoot    bool
		questions  map[uint32]*capnp.Promise // our calls to the client's capabilities
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
	}
	bw       *bufio.Writer  // used by the writer of the moment only
	enc      *capnp.Encoder // on bw
	werr     error          // first write error (writer of the moment only)
	writeSeq atomic.Uint64  // odd while a write is in progress (the stall watchdog)
	watchdog struct {       // closes a connection whose write is stuck
		sync.Mutex
		t    *clock.Timer
		last uint64
		done bool
	}
}

// outFrame is one message waiting to be written; keep: the message is
// still read after it is written (an answer pipelined calls may target)
// and is left to the garbage collector instead of its pool.
type outFrame struct {
	m    *capnp.Message
	keep bool
}

// leanAnswer is the server's side of one question of the client (a call or
// a bootstrap).
type leanAnswer struct {
	returned bool
	finished bool
	// releaseResultCaps is the Finish's flag when it came before the Return.
	releaseResultCaps bool
	cancel            context.CancelFunc // ends the call (nil: it runs on the reader)
	err               error              // the exception returned
	content           capnp.Ptr          // the results, for pipelined calls
	caps              []uint32           // export ids of the results' capabilities
	pending           []*leanCall        // pipelined calls waiting for the return
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
		q:      &queueServer{s: s, remote: remote, gate: gate},
		maxMsg: uint64(s.cfg.MaxMessageBytes),
		first:  first,
	}
	var rw io.ReadWriter = conn
	if raw := newRawIO(conn); raw != nil {
		rw = raw
	}
	c.br = bufio.NewReaderSize(rw, leanReadBuffer)
	c.bw = bufio.NewWriterSize(rw, leanWriteBuffer)
	if nb, ok := s.cfg.Store.(storage.Nonblocking); ok {
		c.inline = nb.Nonblocking()
	}
	c.dec = capnp.NewDecoder(c.br)
	c.dec.MaxMessageSize = c.maxMsg
	c.enc = capnp.NewEncoder(c.bw)
	c.flow = newFlowBudget(s.cfg.ConnFlowLimitBytes, s.inflight, s.cfg.MaxInflightBytes)
	c.mu.answers = make(map[uint32]*leanAnswer)
	c.mu.exports = make(map[uint32]*leanExport)
	c.mu.questions = make(map[uint32]*capnp.Promise)
	if gate != nil {
		c.armWatchdog()
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-s.closeAll:
			_ = conn.Close()
		case <-done:
		}
	}()
	err := c.readLoop()
	close(done)
	c.shutdown(err)
}

// readLoop reads and handles messages until the connection fails or a
// message breaks the protocol; it returns why it stopped.
func (c *leanConn) readLoop() error {
	for {
		if c.br.Buffered() == 0 || c.gate.over() {
			c.idle() // about to wait: write what is ready first
		}
		if err := c.gate.wait(); err != nil {
			return err
		}
		msg, err := c.dec.Decode()
		if err != nil {
			return err
		}
		c.busy()
		if c.first != nil {
			c.first()
			c.first = nil
		}
		// As limitedCodec: the traversal limit bounds the work one
		// message may cost.
		msg.ResetReadLimit(4 * c.maxMsg)
		held, err := c.acquireFlow(msg)
		if err != nil {
			msg.Release()
			return err
		}
		if err := c.handle(msg, held); err != nil {
			return err
		}
	}
}

// acquireFlow takes msg's size from the connection's and the node's
// budgets of unanswered bytes, writing out replies first if it must wait.
func (c *leanConn) acquireFlow(msg *capnp.Message) (flowHeld, error) {
	size, err := msg.TotalSize()
	if err != nil {
		return flowHeld{}, err
	}
	if h, ok := c.flow.tryAcquire(int64(size)); ok {
		return h, nil
	}
	c.idle()
	h, err := c.flow.acquire(c.ctx, int64(size))
	c.busy()
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
	qid := f.QuestionId()
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
		if f.ReleaseResultCaps() {
			release, err = c.releaseCapsLocked(a.caps)
		}
	} else {
		a.releaseResultCaps = f.ReleaseResultCaps()
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

// handleCall starts one call; it owns in and held.
func (c *leanConn) handleCall(in *capnp.Message, m rpccp.Message, held flowHeld) error {
	call, err := m.Call()
	if err != nil {
		c.flow.release(held)
		in.Release()
		return protoErrf("read call: %v", err)
	}
	lc := &leanCall{qid: call.QuestionId(), iface: call.InterfaceId(), method: call.MethodId(), in: in, held: held, ans: &leanAnswer{}}
	c.mu.Lock()
	if c.mu.answers[lc.qid] != nil {
		c.mu.Unlock()
		c.releaseCall(lc)
		return protoErrf("call: question id %d is in use", lc.qid)
	}
	c.mu.answers[lc.qid] = lc.ans
	c.mu.Unlock()

	if call.SendResultsTo().Which() != rpccp.Call_sendResultsTo_Which_caller {
		c.fail(lc, exc.New(exc.Unimplemented, "", "results may only be sent to the caller"))
		return nil
	}
	params, err := call.Params()
	if err != nil {
		c.fail(lc, fmt.Errorf("read params: %w", err))
		return nil
	}
	content, err := params.Content()
	if err != nil {
		c.fail(lc, fmt.Errorf("read params: %w", err))
		return nil
	}
	lc.args = content.Struct()
	caps, err := c.importCaps(params)
	in.CapTable().Reset(caps...)
	if err != nil {
		c.fail(lc, err)
		return nil
	}
	target, err := call.Target()
	if err != nil {
		c.fail(lc, fmt.Errorf("read target: %w", err))
		return nil
	}
	switch target.Which() {
	case rpccp.MessageTarget_Which_importedCap:
		c.mu.Lock()
		e := c.mu.exports[target.ImportedCap()]
		var cl capnp.Client
		if e != nil {
			cl = e.client.AddRef()
		}
		c.mu.Unlock()
		if e == nil {
			c.fail(lc, exc.New(exc.Failed, "", fmt.Sprintf("call on unknown export id %d", target.ImportedCap())))
			return nil
		}
		c.dispatch(lc, e.queue, cl)
	case rpccp.MessageTarget_Which_promisedAnswer:
		pa, err := target.PromisedAnswer()
		if err != nil {
			c.fail(lc, fmt.Errorf("read target: %w", err))
			return nil
		}
		if pa.QuestionId() == lc.qid {
			// Its own answer can never resolve: a broken peer.
			c.mu.Lock()
			delete(c.mu.answers, lc.qid)
			c.mu.Unlock()
			c.releaseCall(lc)
			return protoErrf("call %d pipelined on its own answer", lc.qid)
		}
		if lc.transform, err = readTransform(pa); err != nil {
			c.fail(lc, err)
			return nil
		}
		c.mu.Lock()
		on := c.mu.answers[pa.QuestionId()]
		if on == nil || on.finished {
			c.mu.Unlock()
			c.fail(lc, exc.New(exc.Failed, "", fmt.Sprintf("call pipelined on unknown or finished question id %d", pa.QuestionId())))
			return nil
		}
		if !on.returned {
			lc.on = on
			on.pending = append(on.pending, lc)
			c.mu.Unlock()
			return nil
		}
		queue, cl, err := c.resolveLocked(on, lc.transform)
		c.mu.Unlock()
		if err != nil {
			c.fail(lc, err)
			return nil
		}
		c.dispatch(lc, queue, cl)
	default:
		c.fail(lc, exc.New(exc.Unimplemented, "", "unknown call target "+target.Which().String()))
	}
	return nil
}

// readTransform copies a promised answer's transform: the pointer fields
// to follow from the results to the target capability.
func readTransform(pa rpccp.PromisedAnswer) ([]uint16, error) {
	ops, err := pa.Transform()
	if err != nil {
		return nil, fmt.Errorf("read transform: %w", err)
	}
	out := make([]uint16, 0, ops.Len())
	for i := 0; i < ops.Len(); i++ {
		op := ops.At(i)
		switch op.Which() {
		case rpccp.PromisedAnswer_Op_Which_noop:
		case rpccp.PromisedAnswer_Op_Which_getPointerField:
			out = append(out, op.GetPointerField())
		default:
			return nil, exc.New(exc.Unimplemented, "", "unknown transform op "+op.Which().String())
		}
	}
	return out, nil
}

// resolveLocked finds the capability at transform in the returned answer
// a: the connection's Queue (queue) or another export's client (AddRef'd).
// REQUIRES: c.mu held, a returned.
func (c *leanConn) resolveLocked(a *leanAnswer, transform []uint16) (queue bool, cl capnp.Client, err error) {
	if a.err != nil {
		return false, capnp.Client{}, a.err
	}
	p := a.content
	for _, f := range transform {
		if p, err = p.Struct().Ptr(f); err != nil {
			return false, capnp.Client{}, fmt.Errorf("pipelined call: %w", err)
		}
	}
	iface := p.Interface()
	if !iface.IsValid() || int(iface.Capability()) >= len(a.caps) {
		return false, capnp.Client{}, exc.New(exc.Failed, "", "call on a null capability")
	}
	e := c.mu.exports[a.caps[iface.Capability()]]
	if e == nil {
		return false, capnp.Client{}, exc.New(exc.Failed, "", "call on a released capability")
	}
	return e.queue, e.client.AddRef(), nil
}

// dispatch runs lc on the connection's Queue (queue) or forwards it to cl
// (which it releases).
func (c *leanConn) dispatch(lc *leanCall, queue bool, cl capnp.Client) {
	if !queue {
		c.forward(lc, cl)
		return
	}
	if lc.iface != schema.Queue_TypeID {
		c.fail(lc, exc.New(exc.Unimplemented, "", fmt.Sprintf("interface %#x not implemented by Queue", lc.iface)))
		return
	}
	if int(lc.method) >= len(leanMethods) {
		c.fail(lc, exc.New(exc.Unimplemented, "", fmt.Sprintf("method %d of Queue not implemented", lc.method)))
		return
	}
	meth := &leanMethods[lc.method]
	if meth.op == OpPoll && schema.Queue_poll_Params(lc.args).WaitMs() > 0 {
		c.longPoll(lc)
		return
	}
	if meth.mayWait(c, lc.args) {
		ctx, cancel := context.WithCancel(c.ctx)
		c.mu.Lock()
		lc.ans.cancel = cancel
		finished := lc.ans.finished
		c.mu.Unlock()
		if finished {
			cancel()
		}
		c.calls.Add(1)
		go func() {
			defer c.calls.Done()
			defer cancel()
			c.runQueue(ctx, lc, meth)
		}()
		return
	}
	if meth.op == OpPeek || meth.op == OpDeadList {
		// The handler may wait for the reply budget: write what is
		// queued first, so that it is not waiting on the reader.
		c.idle()
		defer c.busy()
	}
	c.runQueue(c.ctx, lc, meth)
}

// runQueue runs one Queue method and sends its Return.
func (c *leanConn) runQueue(ctx context.Context, lc *leanCall, meth *leanMethod) {
	c.reply(lc, func(seg *capnp.Segment) (capnp.Struct, error) { return meth.run(c.q, ctx, lc.args, seg) })
}

// longPoll serves a poll that may wait (waitMs > 0) without a goroutine
// while it is parked: the dispatcher's PollAsync completes it. Its first
// attempt runs on the reader when the store never waits for I/O, else on a
// goroutine that ends when the poll parks or completes.
func (c *leanConn) longPoll(lc *leanCall) {
	ctx, cancel := context.WithCancel(c.ctx)
	c.mu.Lock()
	lc.ans.cancel = cancel
	finished := lc.ans.finished
	c.mu.Unlock()
	if finished {
		cancel()
	}
	t := c.q.begin(OpPoll)
	c.calls.Add(1)
	complete := func(pr storage.PollResult, err error) {
		defer c.calls.Done()
		defer cancel()
		c.reply(lc, func(seg *capnp.Segment) (capnp.Struct, error) {
			res, allocErr := schema.NewQueue_poll_Results(seg)
			err := t.finish(res, allocErr, func() error {
				if err != nil {
					return err
				}
				return writePoll(res, pr)
			})
			return res.ToPtr().Struct(), err
		})
	}
	if !t.ok {
		complete(storage.PollResult{}, nil) // finish answers "shutting down"
		return
	}
	p, wait, err := c.q.pollArgs(schema.Queue_poll_Params(lc.args))
	if err != nil {
		complete(storage.PollResult{}, err)
		return
	}
	if c.inline {
		c.s.disp.PollAsync(ctx, p, wait, complete)
		return
	}
	go c.s.disp.PollAsync(ctx, p, wait, complete)
}

// reply runs a Queue method's body into a new Return (run builds the
// results in seg) and sends it, or the failure.
func (c *leanConn) reply(lc *leanCall, run func(seg *capnp.Segment) (capnp.Struct, error)) {
	msg, ret, err := newReturnMsg(lc.qid)
	if err != nil {
		c.fail(lc, err)
		return
	}
	payload, err := ret.NewResults()
	if err != nil {
		msg.Release()
		c.fail(lc, err)
		return
	}
	res, err := run(ret.Segment())
	if err == nil {
		err = payload.SetContent(res.ToPtr())
	}
	if err != nil {
		if c.gate != nil {
			c.gate.done(msg)
		}
		msg.Release()
		c.fail(lc, err)
		return
	}
	c.complete(lc, msg, payload, res.ToPtr())
}

// forward runs lc on cl (a go-capnp client: a Subscription) on a
// goroutine, and sends its Return.
func (c *leanConn) forward(lc *leanCall, cl capnp.Client) {
	ctx, cancel := context.WithCancel(c.ctx)
	c.mu.Lock()
	lc.ans.cancel = cancel
	c.mu.Unlock()
	c.calls.Add(1)
	go func() {
		defer c.calls.Done()
		defer cancel()
		defer cl.Release()
		args := lc.args
		ans, release := cl.SendCall(ctx, capnp.Send{
			Method:   capnp.Method{InterfaceID: lc.iface, MethodID: lc.method},
			ArgsSize: args.Size(),
			PlaceArgs: func(dst capnp.Struct) error {
				if !args.IsValid() {
					return nil
				}
				return dst.CopyFrom(args)
			},
		})
		defer release()
		res, err := ans.Struct()
		if err != nil {
			c.fail(lc, err)
			return
		}
		msg, ret, err := newReturnMsg(lc.qid)
		if err != nil {
			c.fail(lc, err)
			return
		}
		payload, err := ret.NewResults()
		if err == nil {
			err = payload.SetContent(res.ToPtr()) // a deep copy, capabilities included
		}
		if err != nil {
			msg.Release()
			c.fail(lc, err)
			return
		}
		content, _ := payload.Content()
		c.complete(lc, msg, payload, content)
	}()
}

// complete sends lc's Return (msg, whose results are payload with content)
// and settles the answer: exports for the results' capabilities, the
// pipelined calls waiting for it.
func (c *leanConn) complete(lc *leanCall, msg *capnp.Message, payload rpccp.Payload, content capnp.Ptr) {
	c.releaseCall(lc)
	var ids []uint32
	ct := msg.CapTable()
	if n := ct.Len(); n > 0 {
		descs, err := payload.NewCapTable(int32(n))
		if err != nil {
			msg.Release()
			c.fail(lc, err)
			return
		}
		clients := make([]capnp.Client, n)
		for i := range clients {
			clients[i] = ct.At(i).AddRef()
		}
		ct.Reset() // the exports hold the references now
		c.mu.Lock()
		for i, cl := range clients {
			id := c.newExportLocked(&leanExport{client: cl})
			ids = append(ids, id)
			descs.At(i).SetSenderHosted(id)
		}
		c.mu.Unlock()
	}
	c.settle(lc.qid, lc.ans, nil, content, ids, msg)
}

// fail answers lc with an exception.
func (c *leanConn) fail(lc *leanCall, err error) {
	c.releaseCall(lc)
	msg, ret, e := newReturnMsg(lc.qid)
	if e == nil {
		var ex rpccp.Exception
		if ex, e = ret.NewException(); e == nil {
			e = ex.MarshalError(err)
		}
	}
	if e != nil {
		c.s.log.Warn("rpc: cannot build an exception return", "remote", c.remote, "err", e)
		msg = nil
	}
	c.settle(lc.qid, lc.ans, err, capnp.Ptr{}, nil, msg)
}

// releaseCall drops what the call held of the incoming message.
func (c *leanConn) releaseCall(lc *leanCall) {
	if lc.in == nil {
		return
	}
	lc.in.Release() // and the imported capabilities the handler did not keep
	lc.in = nil
	c.flow.release(lc.held)
	lc.held = flowHeld{}
}

// settle records a's outcome, sends msg (nil: nothing to send), and
// starts the calls pipelined on a.
func (c *leanConn) settle(qid uint32, a *leanAnswer, err error, content capnp.Ptr, caps []uint32, msg *capnp.Message) {
	var release []capnp.Client
	c.mu.Lock()
	a.returned, a.err, a.content, a.caps = true, err, content, caps
	pending := a.pending
	a.pending = nil
	if a.finished {
		if c.mu.answers[qid] == a {
			delete(c.mu.answers, qid)
		}
		if a.releaseResultCaps {
			release, _ = c.releaseCapsLocked(caps)
		}
	}
	c.mu.Unlock()
	if msg != nil {
		// Keep the message when pipelined calls may still read its
		// results (it has capabilities).
		c.send(msg, len(caps) > 0)
	}
	for _, cl := range release {
		cl.Release()
	}
	for _, p := range pending {
		c.mu.Lock()
		queue, cl, err := c.resolveLocked(a, p.transform)
		c.mu.Unlock()
		if err != nil {
			c.fail(p, err)
			continue
		}
		c.dispatch(p, queue, cl)
	}
}

// newReturnMsg starts a Return message for question qid.
func newReturnMsg(qid uint32) (*capnp.Message, rpccp.Return, error) {
	msg, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	if err != nil {
		return nil, rpccp.Return{}, err
	}
	m, err := rpccp.NewRootMessage(seg)
	if err != nil {
		msg.Release()
		return nil, rpccp.Return{}, err
	}
	ret, err := m.NewReturn()
	if err != nil {
		msg.Release()
		return nil, rpccp.Return{}, err
	}
	ret.SetAnswerId(qid)
	// The capabilities of the params are released by the server itself,
	// each when the handler drops it (leanImport.Shutdown).
	ret.SetReleaseParamCaps(false)
	return msg, ret, nil
}

// importCaps turns a payload's capability descriptors into clients: a
// capability hosted by the client becomes a leanImport. Capabilities
// hosted by this server, promised answers and third parties are refused.
func (c *leanConn) importCaps(p rpccp.Payload) ([]capnp.Client, error) {
	if !p.HasCapTable() {
		return nil, nil
	}
	l, err := p.CapTable()
	if err != nil {
		return nil, fmt.Errorf("read cap table: %w", err)
	}
	out := make([]capnp.Client, l.Len())
	for i := range out {
		d := l.At(i)
		switch d.Which() {
		case rpccp.CapDescriptor_Which_none:
		case rpccp.CapDescriptor_Which_senderHosted:
			out[i] = capnp.NewClient(&leanImport{c: c, id: d.SenderHosted()})
		case rpccp.CapDescriptor_Which_senderPromise:
			// Calls to a promise go to its import id; the peer
			// forwards them once it resolves (see handleResolve).
			out[i] = capnp.NewClient(&leanImport{c: c, id: d.SenderPromise()})
		default:
			for _, cl := range out {
				cl.Release()
			}
			return nil, exc.New(exc.Unimplemented, "", "capability descriptor "+d.Which().String()+" not supported by this server")
		}
	}
	return out, nil
}

// handleReturn completes one of our calls to the client's capabilities.
// keep: the message is referenced by the answer (not to be released).
func (c *leanConn) handleReturn(m rpccp.Message) (keep bool, err error) {
	r, err := m.Return()
	if err != nil {
		return false, protoErrf("read return: %v", err)
	}
	id := r.AnswerId()
	c.mu.Lock()
	p := c.mu.questions[id]
	delete(c.mu.questions, id)
	c.mu.Unlock()
	if p == nil {
		return false, protoErrf("return for unknown question id %d", id)
	}
	switch r.Which() {
	case rpccp.Return_Which_results:
		payload, err := r.Results()
		var content capnp.Ptr
		if err == nil {
			content, err = payload.Content()
		}
		if err != nil {
			p.Reject(fmt.Errorf("read return: %w", err))
		} else {
			p.Fulfill(content)
			keep = true
		}
	case rpccp.Return_Which_exception:
		e, err := r.Exception()
		if err != nil {
			p.Reject(fmt.Errorf("read return: %w", err))
		} else {
			p.Reject(e.ToError())
		}
	case rpccp.Return_Which_canceled:
		p.Reject(exc.New(exc.Failed, "", "call canceled"))
	default:
		p.Reject(exc.New(exc.Unimplemented, "", "return "+r.Which().String()+" not supported"))
	}
	// Capabilities in the results are released by the Finish's flag.
	c.sendSmall(func(m rpccp.Message) error {
		f, err := m.NewFinish()
		if err != nil {
			return err
		}
		f.SetQuestionId(id)
		f.SetReleaseResultCaps(true)
		return nil
	})
	return keep, nil
}

// handleResolve takes the resolution of a promise the client passed in.
// Calls keep going to the promise's import id (the client forwards them),
// so a resolution to a capability is released at once.
func (c *leanConn) handleResolve(m rpccp.Message) error {
	r, err := m.Resolve()
	if err != nil {
		return protoErrf("read resolve: %v", err)
	}
	if r.Which() != rpccp.Resolve_Which_cap {
		return nil
	}
	d, err := r.Cap()
	if err != nil {
		return protoErrf("read resolve: %v", err)
	}
	switch d.Which() {
	case rpccp.CapDescriptor_Which_senderHosted:
		c.sendRelease(d.SenderHosted(), 1)
	case rpccp.CapDescriptor_Which_senderPromise:
		c.sendRelease(d.SenderPromise(), 1)
	}
	return nil
}

// handleDisembargo reflects a sender-loopback embargo, as the protocol
// asks. This server never resolves a promise it exported (it exports
// none), so it never sends one of its own.
func (c *leanConn) handleDisembargo(m rpccp.Message) error {
	d, err := m.Disembargo()
	if err != nil {
		return protoErrf("read disembargo: %v", err)
	}
	if d.Context().Which() != rpccp.Disembargo_context_Which_senderLoopback {
		return protoErrf("disembargo %s not expected", d.Context().Which())
	}
	target, err := d.Target()
	if err != nil {
		return protoErrf("read disembargo: %v", err)
	}
	embargo := d.Context().SenderLoopback()
	c.sendSmall(func(m rpccp.Message) error {
		out, err := m.NewDisembargo()
		if err != nil {
			return err
		}
		if err := out.SetTarget(target); err != nil {
			return err
		}
		out.Context().SetReceiverLoopback(embargo)
		return nil
	})
	return nil
}

// handleUnimplemented: the client did not understand a message of ours.
// For a call, that is its answer.
func (c *leanConn) handleUnimplemented(m rpccp.Message) error {
	u, err := m.Unimplemented()
	if err != nil || u.Which() != rpccp.Message_Which_call {
		return nil
	}
	call, err := u.Call()
	if err != nil {
		return nil
	}
	c.mu.Lock()
	p := c.mu.questions[call.QuestionId()]
	delete(c.mu.questions, call.QuestionId())
	c.mu.Unlock()
	if p != nil {
		p.Reject(exc.New(exc.Unimplemented, "", "call not implemented by the client"))
	}
	return nil
}

func (c *leanConn) sendUnimplemented(m rpccp.Message) error {
	c.sendSmall(func(out rpccp.Message) error { return out.SetUnimplemented(m) })
	return nil
}

func (c *leanConn) sendRelease(id, n uint32) {
	c.sendSmall(func(m rpccp.Message) error {
		r, err := m.NewRelease()
		if err != nil {
			return err
		}
		r.SetId(id)
		r.SetReferenceCount(n)
		return nil
	})
}

// sendSmall builds a message with build and sends it; a build failure
// (out of memory) is logged.
func (c *leanConn) sendSmall(build func(rpccp.Message) error) {
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
	c.send(msg, false)
}

// send queues msg to be written. It writes the queue itself unless
// another writer is at work or the reader will write it before it blocks.
func (c *leanConn) send(m *capnp.Message, keep bool) {
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
	c.writeQueue()
}

// idle: the reader is about to block, so it writes what is queued, and
// later replies are written by whoever makes them.
func (c *leanConn) idle() {
	c.w.Lock()
	c.w.readerBusy = false
	if c.w.writing || len(c.w.out) == 0 {
		c.w.Unlock()
		return
	}
	c.w.writing = true
	c.w.Unlock()
	c.writeQueue()
}

// busy: the reader has work, and will write the queue before it blocks.
func (c *leanConn) busy() {
	c.w.Lock()
	c.w.readerBusy = true
	c.w.Unlock()
}

// writeQueue writes queued messages until the queue is empty; the caller
// has set c.w.writing, which this clears.
func (c *leanConn) writeQueue() {
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
		c.writeBatch(batch)
		clear(batch)
		done = batch
	}
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
		c.sendSmall(func(m rpccp.Message) error {
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
		c.sendSmall(func(m rpccp.Message) error {
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
	questions := c.mu.questions
	c.mu.questions = nil
	c.mu.Unlock()
	for _, p := range questions {
		p.Reject(exc.New(exc.Disconnected, "", "rpc: connection closed"))
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

// leanImport is a capability the client passed in (a Consumer): calls on
// it are Call messages on the connection.
type leanImport struct {
	c  *leanConn
	id uint32
}

func (h *leanImport) Send(ctx context.Context, s capnp.Send) (*capnp.Answer, capnp.ReleaseFunc) {
	c := h.c
	msg, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	if err != nil {
		return capnp.ErrorAnswer(s.Method, err), func() {}
	}
	fail := func(err error) (*capnp.Answer, capnp.ReleaseFunc) {
		msg.Release()
		return capnp.ErrorAnswer(s.Method, err), func() {}
	}
	m, err := rpccp.NewRootMessage(seg)
	if err != nil {
		return fail(err)
	}
	call, err := m.NewCall()
	if err != nil {
		return fail(err)
	}
	target, err := call.NewTarget()
	if err != nil {
		return fail(err)
	}
	target.SetImportedCap(h.id)
	call.SetInterfaceId(s.Method.InterfaceID)
	call.SetMethodId(s.Method.MethodID)
	params, err := call.NewParams()
	if err != nil {
		return fail(err)
	}
	args, err := capnp.NewStruct(seg, s.ArgsSize)
	if err != nil {
		return fail(err)
	}
	if err := params.SetContent(args.ToPtr()); err != nil {
		return fail(err)
	}
	if s.PlaceArgs != nil {
		if err := s.PlaceArgs(args); err != nil {
			return fail(err)
		}
	}
	if msg.CapTable().Len() > 0 {
		return fail(exc.New(exc.Unimplemented, "", "passing capabilities to the client is not supported"))
	}
	p := capnp.NewPromise(s.Method, leanNoPipeline{}, nil)
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		return fail(exc.New(exc.Disconnected, "", "rpc: connection closed"))
	}
	// Ids only grow (until they wrap), so an id whose Finish is still
	// queued is never reused.
	for c.mu.questions[c.mu.nextQ] != nil {
		c.mu.nextQ++
	}
	qid := c.mu.nextQ
	c.mu.nextQ++
	c.mu.questions[qid] = p
	c.mu.Unlock()
	call.SetQuestionId(qid)
	c.send(msg, false)
	// The results alias the Return message, which is not reused.
	return p.Answer(), func() {}
}

func (h *leanImport) Recv(ctx context.Context, r capnp.Recv) capnp.PipelineCaller {
	r.Reject(exc.New(exc.Unimplemented, "", "local calls on a remote capability"))
	return nil
}

func (h *leanImport) Brand() capnp.Brand { return capnp.Brand{Value: h} }

// Shutdown releases the client's capability when the last reference here
// is dropped.
func (h *leanImport) Shutdown() {
	h.c.mu.Lock()
	closed := h.c.mu.closed
	h.c.mu.Unlock()
	if !closed {
		h.c.sendRelease(h.id, 1)
	}
}

func (h *leanImport) String() string { return fmt.Sprintf("leanImport{id: %d}", h.id) }

// leanNoPipeline refuses pipelined calls on the results of our calls to
// the client (deliver and done return no capabilities).
type leanNoPipeline struct{}

func (leanNoPipeline) PipelineSend(ctx context.Context, transform []capnp.PipelineOp, s capnp.Send) (*capnp.Answer, capnp.ReleaseFunc) {
	return capnp.ErrorAnswer(s.Method, exc.New(exc.Unimplemented, "", "pipelining on a call to the client")), func() {}
}

func (leanNoPipeline) PipelineRecv(ctx context.Context, transform []capnp.PipelineOp, r capnp.Recv) capnp.PipelineCaller {
	r.Reject(exc.New(exc.Unimplemented, "", "pipelining on a call to the client"))
	return nil
}

// leanMethod is one Queue method as the lean engine runs it.
type leanMethod struct {
	op Op
	// waits: the call may wait on its own (a long poll), whatever the
	// store (nil: only if the store waits).
	waits func(args capnp.Struct) bool
	// store: the call goes to the store.
	store bool
	run   func(q *queueServer, ctx context.Context, args capnp.Struct, seg *capnp.Segment) (capnp.Struct, error)
}

// mayWait reports whether the call must run on a goroutine of its own.
func (m *leanMethod) mayWait(c *leanConn, args capnp.Struct) bool {
	if m.waits != nil && m.waits(args) {
		return true
	}
	return m.store && !c.inline
}

// resultsStruct is what every generated *_Results is.
type resultsStruct interface {
	statusResults
	ToPtr() capnp.Ptr
}

// leanRun builds a method's results struct in seg and runs body on it
// with the accounting of queueServer.call.
func leanRun[R resultsStruct](q *queueServer, op Op, seg *capnp.Segment, newRes func(*capnp.Segment) (R, error), body func(R) error) (capnp.Struct, error) {
	res, err := newRes(seg)
	if err != nil {
		return capnp.Struct{}, err
	}
	err = q.call(op, res, nil, func() error { return body(res) })
	return res.ToPtr().Struct(), err
}

// leanMethods is indexed by method id (schema/queue.capnp, the same order
// as Op).
var leanMethods = [...]leanMethod{
	{op: OpEnqueue, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpEnqueue, seg, schema.NewQueue_enqueue_Results, func(res schema.Queue_enqueue_Results) error {
			return q.enqueue(ctx, schema.Queue_enqueue_Params(a), res)
		})
	}},
	{op: OpPoll, store: true, waits: func(a capnp.Struct) bool { return schema.Queue_poll_Params(a).WaitMs() > 0 }, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpPoll, seg, schema.NewQueue_poll_Results, func(res schema.Queue_poll_Results) error { return q.poll(ctx, schema.Queue_poll_Params(a), res) })
	}},
	{op: OpAck, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpAck, seg, schema.NewQueue_ack_Results, func(res schema.Queue_ack_Results) error { return q.ack(ctx, schema.Queue_ack_Params(a), res) })
	}},
	{op: OpNack, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpNack, seg, schema.NewQueue_nack_Results, func(res schema.Queue_nack_Results) error { return q.nack(ctx, schema.Queue_nack_Params(a), res) })
	}},
	{op: OpExtend, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpExtend, seg, schema.NewQueue_extend_Results, func(res schema.Queue_extend_Results) error { return q.extend(ctx, schema.Queue_extend_Params(a), res) })
	}},
	{op: OpStats, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpStats, seg, schema.NewQueue_stats_Results, func(res schema.Queue_stats_Results) error { return q.stats(ctx, schema.Queue_stats_Params(a), res) })
	}},
	{op: OpQueues, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpQueues, seg, schema.NewQueue_queues_Results, func(res schema.Queue_queues_Results) error { return q.queues(ctx, schema.Queue_queues_Params(a), res) })
	}},
	{op: OpPeek, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpPeek, seg, schema.NewQueue_peek_Results, func(res schema.Queue_peek_Results) error { return q.peek(ctx, schema.Queue_peek_Params(a), res) })
	}},
	{op: OpPurge, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpPurge, seg, schema.NewQueue_purge_Results, func(res schema.Queue_purge_Results) error { return q.purge(ctx, schema.Queue_purge_Params(a), res) })
	}},
	{op: OpDeadList, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpDeadList, seg, schema.NewQueue_deadList_Results, func(res schema.Queue_deadList_Results) error {
			return q.deadList(ctx, schema.Queue_deadList_Params(a), res)
		})
	}},
	{op: OpRedrive, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpRedrive, seg, schema.NewQueue_redrive_Results, func(res schema.Queue_redrive_Results) error {
			return q.redrive(ctx, schema.Queue_redrive_Params(a), res)
		})
	}},
	{op: OpPurgeDead, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpPurgeDead, seg, schema.NewQueue_purgeDead_Results, func(res schema.Queue_purgeDead_Results) error {
			return q.purgeDead(ctx, schema.Queue_purgeDead_Params(a), res)
		})
	}},
	{op: OpGetConfig, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpGetConfig, seg, schema.NewQueue_getConfig_Results, func(res schema.Queue_getConfig_Results) error {
			return q.getConfig(ctx, schema.Queue_getConfig_Params(a), res)
		})
	}},
	{op: OpSetConfig, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpSetConfig, seg, schema.NewQueue_setConfig_Results, func(res schema.Queue_setConfig_Results) error {
			return q.setConfig(ctx, schema.Queue_setConfig_Params(a), res)
		})
	}},
	{op: OpSubscribe, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpSubscribe, seg, schema.NewQueue_subscribe_Results, func(res schema.Queue_subscribe_Results) error {
			return q.subscribe(ctx, schema.Queue_subscribe_Params(a), res)
		})
	}},
	{op: OpNodeInfo, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpNodeInfo, seg, schema.NewQueue_nodeInfo_Results, func(res schema.Queue_nodeInfo_Results) error {
			return q.nodeInfo(ctx, schema.Queue_nodeInfo_Params(a), res)
		})
	}},
	{op: OpDeleteQueue, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpDeleteQueue, seg, schema.NewQueue_deleteQueue_Results, func(res schema.Queue_deleteQueue_Results) error {
			return q.deleteQueue(ctx, schema.Queue_deleteQueue_Params(a), res)
		})
	}},
}
