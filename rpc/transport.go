package rpc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/exc"
	"capnproto.org/go/capnp/v3/flowcontrol"
	capnprpc "capnproto.org/go/capnp/v3/rpc"
	"capnproto.org/go/capnp/v3/rpc/transport"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"golang.org/x/sync/semaphore"

	"github.com/leaseq/leaseq/schema"
)

// limitedCodec frames capnp messages on a stream and bounds what one
// incoming message may cost: MaxMessageSize stops the decoder from
// allocating for a forged giant header, and the traversal limit stops a
// small message with pointer loops or amplification from burning CPU.
type limitedCodec struct {
	dec      *capnp.Decoder
	enc      *capnp.Encoder
	c        io.Closer
	maxBytes uint64
	first    func() // called once, after the first message decodes (nil: none)
	// fr is under dec: a message is read whole before it decodes, and
	// one over maxBytes is refused: on the client's codec
	// (newClientCodec) with a *replyTooLargeError, kept in refused.
	fr      *frameReader
	refused atomic.Pointer[replyTooLargeError]
	node    bool // the node's codec: a message over maxBytes ends the connection with a plain error
}

// newLimitedCodec is the codec of the node's go-capnp connections. As
// the client's, it reads through a frameReader: a peer that sends only
// the header of a large message makes the node allocate nothing for it
// (capnp.Decoder allocates the whole message from its header).
func newLimitedCodec(rwc io.ReadWriteCloser, maxBytes uint64) *limitedCodec {
	fr := newFrameReader(rwc, 64<<10, maxBytes)
	dec := capnp.NewDecoder(fr)
	dec.MaxMessageSize = maxBytes
	return &limitedCodec{dec: dec, enc: capnp.NewEncoder(rwc), c: rwc, maxBytes: maxBytes, fr: fr, node: true}
}

// newClientCodec is the codec of the client's go-capnp connections: it
// reads what the node sends (Returns, and the pushes of a subscription to
// the client's Consumer) up to readLimit (DefaultMaxReplyBytes) a
// message. The decoder reads a frameReader, whose buffer grows as a
// message's bytes arrive: a header that claims a GiB does not make the
// client allocate one.
func newClientCodec(rwc io.ReadWriteCloser, readLimit uint64) *limitedCodec {
	fr := newFrameReader(rwc, 64<<10, readLimit)
	dec := capnp.NewDecoder(fr)
	dec.MaxMessageSize = readLimit
	return &limitedCodec{dec: dec, enc: capnp.NewEncoder(rwc), c: rwc, maxBytes: readLimit, fr: fr}
}

// errNotAStruct ends a connection whose peer sent a message whose root is
// not a struct.
var errNotAStruct = errors.New("rpc: message root is not a struct")

func (c *limitedCodec) Encode(m *capnp.Message) error { return c.enc.Encode(m) }

func (c *limitedCodec) Decode() (*capnp.Message, error) {
	if c.fr != nil {
		if err := c.fr.fill(); err != nil {
			return nil, err
		}
		if size, over := c.fr.tooLarge(); over {
			if c.node {
				return nil, fmt.Errorf("rpc: a message of %d bytes is over the limit of %d (--max-message)", size, c.maxBytes)
			}
			e := &replyTooLargeError{size: size, limit: c.maxBytes}
			c.refused.Store(e)
			return nil, e
		}
	}
	m, err := c.dec.Decode()
	if err != nil {
		return nil, err
	}
	// Traversal may read each byte a few times (lists of structs read
	// through several accessors); a few times the message's own size
	// bounds the work per message while leaving honest messages far from
	// the limit (traversalLimit).
	m.ResetReadLimit(traversalLimit(m, c.maxBytes))
	// An RPC message is a struct. go-capnp reads any other root (null, a
	// list) as a zero rpccp.Message whose Message() is nil, which the
	// layers above would dereference: refuse it here, once, and the
	// connection ends like for any undecodable message.
	root, err := m.Root()
	if err != nil {
		m.Release()
		return nil, err
	}
	if root.Struct().Segment() == nil {
		m.Release()
		return nil, errNotAStruct
	}
	if c.first != nil {
		c.first()
		c.first = nil
	}
	return m, nil
}

func (c *limitedCodec) Close() error { return c.c.Close() }

// flowTransport bounds the bytes of incoming messages a connection may have
// unreleased at once (calls being handled, including parked long polls).
// When the budget is spent it stops reading, so TCP pushes back on the
// client instead of the server queueing unbounded work. A single message
// larger than the whole budget is admitted alone.
type flowTransport struct {
	transport.Transport
	budget flowBudget
	ctx    context.Context // cancelled when the connection closes
}

func (t *flowTransport) RecvMessage() (transport.IncomingMessage, error) {
	in, err := t.Transport.RecvMessage()
	if err != nil {
		return nil, err
	}
	size, err := in.Message().Message().TotalSize()
	if err != nil {
		in.Release()
		return nil, err
	}
	h, err := t.budget.acquire(t.ctx, int64(size))
	if err != nil {
		in.Release()
		return nil, err
	}
	return &flowMsg{IncomingMessage: in, release: func() { t.budget.release(h) }}, nil
}

// flowBudget is a connection's budget of incoming bytes in unanswered
// calls, drawn together with the node's (nil: unbounded). A message larger
// than a whole budget takes all of it.
type flowBudget struct {
	sem       *semaphore.Weighted // nil: the connection is unbounded
	limit     int64
	node      *semaphore.Weighted // nil: the node is unbounded
	nodeLimit int64
}

// flowHeld is what one message holds of a flowBudget.
type flowHeld struct{ n, nn int64 }

// newFlowBudget: connLimit <= 0 is unbounded.
func newFlowBudget(connLimit int64, node *semaphore.Weighted, nodeLimit int64) flowBudget {
	f := flowBudget{node: node, nodeLimit: nodeLimit}
	if connLimit > 0 {
		f.sem, f.limit = semaphore.NewWeighted(connLimit), connLimit
	}
	return f
}

func (f *flowBudget) shares(size int64) flowHeld {
	var h flowHeld
	if f.sem != nil {
		h.n = min(size, f.limit)
	}
	if f.node != nil {
		h.nn = min(size, f.nodeLimit)
	}
	return h
}

// acquire waits until size bytes are free in both budgets, or ctx ends.
func (f *flowBudget) acquire(ctx context.Context, size int64) (flowHeld, error) {
	h := f.shares(size)
	if f.sem != nil {
		if err := f.sem.Acquire(ctx, h.n); err != nil {
			return flowHeld{}, err
		}
	}
	if f.node != nil {
		if err := f.node.Acquire(ctx, h.nn); err != nil {
			if f.sem != nil {
				f.sem.Release(h.n)
			}
			return flowHeld{}, err
		}
	}
	return h, nil
}

// tryAcquire is acquire without waiting.
func (f *flowBudget) tryAcquire(size int64) (flowHeld, bool) {
	h := f.shares(size)
	if f.sem != nil && !f.sem.TryAcquire(h.n) {
		return flowHeld{}, false
	}
	if f.node != nil && !f.node.TryAcquire(h.nn) {
		if f.sem != nil {
			f.sem.Release(h.n)
		}
		return flowHeld{}, false
	}
	return h, true
}

func (f *flowBudget) release(h flowHeld) {
	if f.sem != nil && h.n > 0 {
		f.sem.Release(h.n)
	}
	if f.node != nil && h.nn > 0 {
		f.node.Release(h.nn)
	}
}

type flowMsg struct {
	transport.IncomingMessage
	once    sync.Once
	release func()
}

func (m *flowMsg) Release() {
	m.IncomingMessage.Release()
	m.once.Do(m.release)
}

// guardTransport ends a connection whose peer sends a message that
// go-capnp v3.1.0-alpha.2 cannot survive (a panic in one of its goroutines
// takes the whole process down): RecvMessage returns an error instead of
// the message, and the connection ends as for an undecodable one. See
// "go-capnp workarounds" in doc.go; each case has a regression test in
// TestBadInput_Wire and a reproducer in testdata/fuzz. RecvMessage is
// called by one goroutine at a time (go-capnp's reader).
type guardTransport struct {
	transport.Transport
	// pipelinable are the peer's questions not finished yet whose answers
	// a call may be pipelined on: its Bootstraps (the capability itself)
	// and its subscribe calls (the subscription in the results).
	pipelinable map[uint32]pipelineKind
	// open are the peer's questions (its Bootstraps and Calls) without a
	// Finish yet, and maxOpen bounds them. go-capnp keeps an answer (about
	// a KiB) for each until its Finish, returned or not, so a peer that
	// never finishes would grow the node's memory without end; past
	// maxOpen the connection ends, as on the lean engine
	// (leanMaxOpenQuestions). A conforming client stays far below: the Go
	// client on go-capnp sends each Finish some 250 ms after the Return
	// (go-capnp's own delay), so reaching the default takes over 250,000
	// calls a second on one connection, while the go-capnp engine spends
	// 80 cpu-µs or more a call (docs/BENCHMARKS.md): some 20 cores busy
	// with that one connection. Parked polls are bounded lower still
	// (MaxWaitersPerQueue).
	open    map[uint32]struct{}
	maxOpen int

	// imports mirrors go-capnp's import table: the peer's capabilities
	// this side holds, by the peer's export id, with the references
	// received and not released yet and whether the first was a promise
	// (go-capnp keeps an import's kind until it releases all of them).
	// RecvMessage adds; a Release this side sends takes away, on the
	// sending goroutine, hence the lock.
	mu      sync.Mutex
	imports map[uint32]importRefs
	// asked are this side's questions (its calls to a consumer) go-capnp
	// has started to send and that have not been returned yet.
	asked map[uint32]*askedQuestion
	// broken is why the connection must end after go-capnp panicked
	// releasing a received message (guardMsg); nil while it need not.
	broken atomic.Pointer[error]
}

// askedQuestion is the send of one of this side's questions: done is
// closed when it ends, and ok tells whether it went out.
type askedQuestion struct {
	done chan struct{}
	ok   bool
}

type importRefs struct {
	refs    uint32
	promise bool
}

type pipelineKind uint8

const (
	onBootstrap pipelineKind = iota + 1
	onSubscribe
)

func newGuardTransport(t transport.Transport) *guardTransport {
	return &guardTransport{Transport: t, pipelinable: make(map[uint32]pipelineKind), imports: make(map[uint32]importRefs), asked: make(map[uint32]*askedQuestion),
		open: make(map[uint32]struct{}), maxOpen: leanMaxOpenQuestions}
}

// opened notes the peer's question id, and fails if it is one more than
// the open questions the connection may have (guardTransport.open). A
// question id already open is go-capnp's to refuse.
func (t *guardTransport) opened(id uint32) error {
	if _, dup := t.open[id]; !dup && len(t.open) >= t.maxOpen {
		return fmt.Errorf("rpc: more than %d questions without a Finish (the node keeps an answer for each until its Finish)", t.maxOpen)
	}
	t.open[id] = struct{}{}
	return nil
}

// errCallOnOwnAnswer is why a connection whose peer pipelined a call on
// its own question ends.
var errCallOnOwnAnswer = errors.New("rpc: call targets its own promised answer")

// errDisembargoOnAnswer is why a connection whose peer sent a
// sender-loopback Disembargo on a promised answer ends.
var errDisembargoOnAnswer = errors.New("rpc: sender-loopback disembargo on a promised answer (no Queue result holds a capability of the client's)")

// errResolveToPromise is why a connection whose peer resolved a promise
// to another promise ends.
var errResolveToPromise = errors.New("rpc: promise resolved to a promise, another or itself (resolve it to the capability it stands for)")

// errReturnUnasked is why a connection whose peer returned a question
// this side has not sent, or has had returned already, ends.
var errReturnUnasked = errors.New("rpc: return of a question not asked or already returned")

// errPipelineTarget is why a connection whose peer pipelined a call on
// anything but a bootstrap capability or a subscribe's subscription ends.
var errPipelineTarget = errors.New("rpc: call pipelined on something other than a bootstrap capability or a subscribe's subscription")

// errAnswerCapTarget is why a connection ends whose peer passed, as a
// capability, a field of one of this side's answers (a receiverAnswer
// descriptor) other than a bootstrap capability or a subscribe's
// subscription.
var errAnswerCapTarget = errors.New("rpc: capability names a promised answer other than a bootstrap capability or a subscribe's subscription")

func (t *guardTransport) RecvMessage() (transport.IncomingMessage, error) {
	// A broken connection reads nothing more, not even what the closed
	// transport still has buffered.
	if err := t.broken.Load(); err != nil {
		return nil, *err
	}
	in, err := t.Transport.RecvMessage()
	if err != nil {
		if broken := t.broken.Load(); broken != nil {
			return nil, *broken
		}
		return nil, err
	}
	if err := t.check(in.Message()); err != nil {
		in.Release()
		return nil, err
	}
	return guardMsg{IncomingMessage: in, t: t}, nil
}

// guardMsg is a received message whose Release survives a panic in
// go-capnp's release of the capabilities the message carries (a nil
// import table entry in importClient.Shutdown; doc.go, "go-capnp
// workarounds"). Release recovers, and the connection ends with
// errReleasePanic instead of the process (breakConn).
type guardMsg struct {
	transport.IncomingMessage
	t *guardTransport
}

// errReleasePanic is why a connection ends whose message go-capnp
// panicked releasing (guardMsg).
var errReleasePanic = errors.New("rpc: internal error releasing a received message's capabilities (go-capnp); connection closed")

func (m guardMsg) Release() {
	defer func() {
		if r := recover(); r != nil {
			m.t.breakConn(fmt.Errorf("%w: %v", errReleasePanic, r))
		}
	}()
	m.IncomingMessage.Release()
}

// breakConn makes the connection end with err: the next RecvMessage
// returns it, and the underlying transport is closed so a receive in
// progress returns too. Only the first call does anything.
func (t *guardTransport) breakConn(err error) {
	if t.broken.CompareAndSwap(nil, &err) {
		_ = t.Transport.Close()
	}
}

// check refuses the messages guardTransport guards against:
//   - a Call whose target is the promised answer of the call's own
//     question (go-capnp looks up that answer while creating it and
//     dereferences its nil pipeline caller);
//   - a Call pipelined on anything but a Bootstrap's capability or the
//     subscription a subscribe returns, the only capability in any result
//     of the Queue interface (Queueber's results hold none). go-capnp
//     queues a call pipelined on an answer not returned yet, and when the
//     answer comes and the call's target is no capability (a null one, a
//     struct, a field past the end), AnswerQueue.Fulfill dereferences a
//     nil pipeline caller;
//   - a sender-loopback Disembargo whose target is a promised answer.
//     A client sends one when a call's result resolves to a capability
//     the client itself hosts, and no result of the Queue interface (or
//     of Queueber's) holds one; go-capnp dereferences the nil message of
//     an answer whose results are empty (Subscription.cancel's);
//   - a Return of a question this side has not sent, or whose Call did
//     not go out, or that has been returned already. go-capnp resolves
//     the question's promise with the Return, and rejects it again if the
//     Call then fails to go out (still queued when the connection ends,
//     or its write fails): a panic. The Return of a question whose Call
//     is being written waits for the write to end;
//   - a capability the peer passes (in a Call's parameters, a Return's
//     results or a Resolve) that names a field of one of this side's
//     answers (receiverAnswer) other than those a call may be pipelined
//     on: go-capnp reads that answer's results, which are released once
//     written when they hold no capability (unwritten.go);
//   - a Resolve of a promise the peer passed in to another promise of
//     the peer's or to itself: a senderPromise, or a senderHosted (or a
//     third-party vine) naming an import that is a promise (go-capnp
//     takes the import it already has under that id, whatever the
//     descriptor says). go-capnp can follow such a chain for ever in its
//     receive goroutine (a promise resolved to itself), and the
//     connection then spins and never closes. A client resolves its
//     promise to the capability it stands for;
//   - a Bootstrap or Call past the bound of the peer's open questions
//     (guardTransport.open): not a crash, but memory without end.
//
// Anything it cannot read is left to go-capnp, which reports it in its
// own words.
func (t *guardTransport) check(m rpccp.Message) error {
	switch m.Which() {
	case rpccp.Message_Which_bootstrap:
		if b, err := m.Bootstrap(); err == nil {
			if err := t.opened(b.QuestionId()); err != nil {
				return err
			}
			t.pipelinable[b.QuestionId()] = onBootstrap
		}
		return nil
	case rpccp.Message_Which_finish:
		if f, err := m.Finish(); err == nil {
			delete(t.pipelinable, f.QuestionId())
			delete(t.open, f.QuestionId())
		}
		return nil
	case rpccp.Message_Which_disembargo:
		d, err := m.Disembargo()
		if err != nil || d.Context().Which() != rpccp.Disembargo_context_Which_senderLoopback {
			return nil
		}
		if tgt, err := d.Target(); err == nil && tgt.Which() == rpccp.MessageTarget_Which_promisedAnswer {
			return errDisembargoOnAnswer
		}
		return nil
	case rpccp.Message_Which_resolve:
		r, err := m.Resolve()
		if err != nil || r.Which() != rpccp.Resolve_Which_cap {
			return nil
		}
		d, err := r.Cap()
		if err != nil {
			return nil
		}
		if id, ok, promise := importOf(d); ok && (promise || t.isPromise(id)) {
			return errResolveToPromise
		}
		if !t.answerCapOK(d) {
			return errAnswerCapTarget
		}
		t.received(d)
		return nil
	case rpccp.Message_Which_return:
		ret, err := m.Return()
		if err != nil {
			return nil
		}
		if !t.returned(ret.AnswerId()) {
			return errReturnUnasked
		}
		if ret.Which() == rpccp.Return_Which_results {
			if p, err := ret.Results(); err == nil {
				if !t.answerCapsOK(p) {
					return errAnswerCapTarget
				}
				t.receivedCaps(p)
			}
		}
		return nil
	case rpccp.Message_Which_call:
	default:
		return nil
	}
	call, err := m.Call()
	if err != nil {
		return nil
	}
	if p, err := call.Params(); err == nil {
		if !t.answerCapsOK(p) {
			return errAnswerCapTarget
		}
		t.receivedCaps(p)
	}
	qid := call.QuestionId()
	if tgt, err := call.Target(); err == nil && tgt.Which() == rpccp.MessageTarget_Which_promisedAnswer {
		pa, err := tgt.PromisedAnswer()
		if err != nil {
			return nil
		}
		if pa.QuestionId() == qid {
			return errCallOnOwnAnswer
		}
		if !pipelineTargetOK(t.pipelinable[pa.QuestionId()], pa) {
			return errPipelineTarget
		}
	}
	if err := t.opened(qid); err != nil {
		return err
	}
	if call.InterfaceId() == schema.Queue_TypeID && call.MethodId() == subscribeMethod {
		t.pipelinable[qid] = onSubscribe
	} else {
		delete(t.pipelinable, qid)
	}
	return nil
}

// importOf reports the import a descriptor the peer sent names, and
// whether the descriptor says it is a promise; ok is false for one naming
// a capability of this side's or an answer.
func importOf(d rpccp.CapDescriptor) (id uint32, ok, promise bool) {
	switch d.Which() {
	case rpccp.CapDescriptor_Which_senderHosted:
		return d.SenderHosted(), true, false
	case rpccp.CapDescriptor_Which_senderPromise:
		return d.SenderPromise(), true, true
	case rpccp.CapDescriptor_Which_thirdPartyHosted:
		// Without third-party handoff go-capnp imports the vine.
		if tp, err := d.ThirdPartyHosted(); err == nil {
			return tp.VineId(), true, false
		}
	}
	return 0, false, false
}

// answerCapOK reports whether d, if it names a field of one of this
// side's answers (receiverAnswer), names one go-capnp may read: a
// bootstrap capability or a subscribe's subscription, as for a pipelined
// call. go-capnp reads the answer's results to find the capability, and
// an answer without capabilities is released once written (unwritten.go):
// reading it crashed the node (found by review, session 70).
func (t *guardTransport) answerCapOK(d rpccp.CapDescriptor) bool {
	if d.Which() != rpccp.CapDescriptor_Which_receiverAnswer {
		return true
	}
	pa, err := d.ReceiverAnswer()
	return err == nil && pipelineTargetOK(t.pipelinable[pa.QuestionId()], pa)
}

// answerCapsOK is answerCapOK for each capability of a payload.
func (t *guardTransport) answerCapsOK(p rpccp.Payload) bool {
	ct, err := p.CapTable()
	if err != nil {
		return true // go-capnp reports it in its own words
	}
	for i := 0; i < ct.Len(); i++ {
		if !t.answerCapOK(ct.At(i)) {
			return false
		}
	}
	return true
}

// receivedCaps notes the imports of a payload's capability table.
func (t *guardTransport) receivedCaps(p rpccp.Payload) {
	ct, err := p.CapTable()
	if err != nil {
		return
	}
	for i := 0; i < ct.Len(); i++ {
		t.received(ct.At(i))
	}
}

// received notes one reference to the import d names, if it names one.
func (t *guardTransport) received(d rpccp.CapDescriptor) {
	id, ok, promise := importOf(d)
	if !ok {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	imp, held := t.imports[id]
	if !held {
		imp.promise = promise
	}
	imp.refs++
	t.imports[id] = imp
}

// isPromise reports whether the import id is held and is a promise.
func (t *guardTransport) isPromise(id uint32) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.imports[id].promise
}

// released notes a Release this side sends: go-capnp releases all of an
// import's references at once, and references that arrived after it
// dropped the import belong to a new one under the same id.
func (t *guardTransport) released(id, n uint32) {
	t.mu.Lock()
	defer t.mu.Unlock()
	imp, held := t.imports[id]
	if !held {
		return
	}
	if imp.refs <= n {
		delete(t.imports, id)
		return
	}
	imp.refs -= n
	t.imports[id] = imp
}

// NewMessage returns go-capnp's outgoing messages through guardOutgoing,
// which notes the Releases among them.
func (t *guardTransport) NewMessage() (transport.OutgoingMessage, error) {
	out, err := t.Transport.NewMessage()
	if err != nil {
		return nil, err
	}
	return guardOutgoing{OutgoingMessage: out, t: t}, nil
}

type guardOutgoing struct {
	transport.OutgoingMessage
	t *guardTransport
}

// Send notes the Calls (questions asked) and Releases among go-capnp's
// messages as they go out: the peer cannot answer a question, or reuse a
// released id, before it has them.
func (o guardOutgoing) Send() error {
	switch m := o.Message(); m.Which() {
	case rpccp.Message_Which_call:
		if c, err := m.Call(); err == nil {
			q := o.t.asking(c.QuestionId())
			err := o.OutgoingMessage.Send()
			q.ok = err == nil
			close(q.done)
			return err
		}
	case rpccp.Message_Which_release:
		if r, err := m.Release(); err == nil {
			o.t.released(r.Id(), r.ReferenceCount())
		}
	}
	return o.OutgoingMessage.Send()
}

// asking notes a question this side starts to send.
func (t *guardTransport) asking(id uint32) *askedQuestion {
	q := &askedQuestion{done: make(chan struct{})}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.asked[id] = q
	return q
}

// returned takes the question id off the questions asked, and reports
// whether its Call went out; if the Call is being written, it waits for
// the write to end (a peer returns a question only once it has it, so
// only one that returns early waits).
func (t *guardTransport) returned(id uint32) bool {
	t.mu.Lock()
	q, ok := t.asked[id]
	delete(t.asked, id)
	t.mu.Unlock()
	if !ok {
		return false
	}
	<-q.done
	return q.ok
}

// subscribeMethod is Queue.subscribe's method id (schema/queue.capnp).
const subscribeMethod = 14

// subscriptionField is the pointer field of Queue.subscribe's results
// that holds the subscription.
const subscriptionField = 1

// pipelineTargetOK reports whether pa's transform leads to the capability
// an answer of kind holds: a Bootstrap's answer is the capability (no
// field), a subscribe's is in its subscription field. Noops aside.
func pipelineTargetOK(kind pipelineKind, pa rpccp.PromisedAnswer) bool {
	ops, err := pa.Transform()
	if err != nil {
		return false
	}
	fields, field := 0, uint16(0)
	for i := 0; i < ops.Len(); i++ {
		switch op := ops.At(i); op.Which() {
		case rpccp.PromisedAnswer_Op_Which_noop:
		case rpccp.PromisedAnswer_Op_Which_getPointerField:
			fields, field = fields+1, op.GetPointerField()
		default:
			return false
		}
	}
	switch kind {
	case onBootstrap:
		return fields == 0
	case onSubscribe:
		return fields == 1 && field == subscriptionField
	}
	return false
}

// newServerTransport builds the transport of one accepted connection.
// first runs once the first message has arrived.
func newServerTransport(ctx context.Context, conn net.Conn, maxMsg uint64, flowLimit int64, first func()) transport.Transport {
	return newNodeTransport(ctx, conn, maxMsg, flowLimit, nil, 0, 0, first)
}

// newNodeTransport is newServerTransport whose flow budget also draws on
// node, the budget shared by every connection (nil: none), and whose peer
// may have maxQuestions questions without a Finish (0:
// leanMaxOpenQuestions; guardTransport.open).
func newNodeTransport(ctx context.Context, conn net.Conn, maxMsg uint64, flowLimit int64, node *semaphore.Weighted, nodeLimit int64, maxQuestions int, first func()) transport.Transport {
	codec := newLimitedCodec(conn, maxMsg)
	codec.first = first
	// The guard sits below the flow budget: a refused message takes none.
	g := newGuardTransport(transport.New(codec))
	g.maxOpen = cmp.Or(maxQuestions, leanMaxOpenQuestions)
	var t transport.Transport = g
	if flowLimit <= 0 {
		flowLimit = 1 << 62 // per connection unbounded; the node budget may still apply
	}
	if flowLimit >= 1<<62 && node == nil {
		return t
	}
	if flowLimit >= 1<<62 {
		flowLimit = 0
	}
	return &flowTransport{Transport: t, budget: newFlowBudget(flowLimit, node, nodeLimit), ctx: ctx}
}

// newRPCMessage starts an rpc.capnp message in a single-segment arena;
// the caller releases msg.
func newRPCMessage() (*capnp.Message, rpccp.Message, error) {
	msg, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	if err != nil {
		return nil, rpccp.Message{}, err
	}
	m, err := rpccp.NewRootMessage(seg)
	if err != nil {
		msg.Release()
		return nil, rpccp.Message{}, err
	}
	return msg, m, nil
}

// writeAbort sends one RPC Abort message, so a refused client learns why
// instead of seeing a bare reset.
func writeAbort(w io.Writer, reason string) error {
	msg, m, err := newRPCMessage()
	if err != nil {
		return err
	}
	defer msg.Release()
	ab, err := m.NewAbort()
	if err != nil {
		return err
	}
	ab.SetType(rpccp.Exception_Type_overloaded)
	if err := ab.SetReason(reason); err != nil {
		return err
	}
	return capnp.NewEncoder(w).Encode(msg)
}

// isDisconnect reports whether err only says that the peer went away.
func isDisconnect(err error) bool {
	return capnp.IsDisconnected(err) || exc.IsType(err, exc.Disconnected) || errors.Is(err, capnprpc.ErrConnClosed) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrClosedPipe)
}

// abortWatch remembers the reason of an Abort the peer sends, which go-capnp
// otherwise only logs: a refused client should say why it was refused.
type abortWatch struct {
	transport.Transport
	mu         sync.Mutex
	reason     string
	overloaded bool
}

func (t *abortWatch) RecvMessage() (transport.IncomingMessage, error) {
	in, err := t.Transport.RecvMessage()
	if err != nil {
		return nil, err
	}
	if m := in.Message(); m.Which() == rpccp.Message_Which_abort {
		if ab, err := m.Abort(); err == nil {
			r, _ := ab.Reason()
			t.mu.Lock()
			t.reason, t.overloaded = r, ab.Type() == rpccp.Exception_Type_overloaded
			t.mu.Unlock()
		}
	}
	return in, nil
}

// aborted returns the peer's abort reason, if it sent one.
func (t *abortWatch) aborted() (reason string, overloaded, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reason, t.overloaded, t.reason != ""
}

// newWindowLimiter returns a fixed-window flow limiter that never panics:
// flowcontrol.NewFixedLimiter panics on a message larger than its window,
// so a larger message is accounted as exactly the window (it waits until
// nothing else is in flight, then goes alone).
func newWindowLimiter(window int64) flowcontrol.FlowLimiter {
	return clampLimiter{inner: flowcontrol.NewFixedLimiter(window), window: uint64(window)}
}

type clampLimiter struct {
	inner  flowcontrol.FlowLimiter
	window uint64
}

func (l clampLimiter) StartMessage(ctx context.Context, size uint64) (func(), error) {
	return l.inner.StartMessage(ctx, min(size, l.window))
}

func (l clampLimiter) Release() { l.inner.Release() }

// traversalLimit is the traversal limit of a received message m: 8 times
// its size plus 64 KiB, at most 4 times maxBytes. A list of zero-size
// elements costs 8 bytes on the wire however many elements it declares,
// and go-capnp charges each element a word: tied to the limit alone
// (4 times a GiB on the client), a 100-byte answer declared hundreds of
// millions of elements and made the reader allocate a slice for them
// all (found by review, session 70: the client died out of memory).
func traversalLimit(m *capnp.Message, maxBytes uint64) uint64 {
	size, err := m.TotalSize()
	if err != nil {
		return 64 << 10
	}
	return min(4*maxBytes, 8*size+64<<10)
}
