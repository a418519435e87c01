package rpc

import (
	"context"
	"fmt"
	"net"
	"time"

	"capnproto.org/go/capnp/v3"

	"github.com/leaseq/leaseq/rpc/errcode"
	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// Other protocols on the same node. A Server can serve another Cap'n Proto
// interface (rpc/queueber: Queueber's) on a listener of its own, with the
// same connection handling as the Queue interface and over the same store
// and long-poll dispatcher, so an enqueue on one protocol wakes a long poll
// on the other. The queue operations below are the ones the Queue
// interface's handlers run too, so both protocols check the same limits and
// keep the same bookkeeping (dispatcher wake-ups, subscription credit).
// These are the only places where capnp types cross the rpc package's
// boundary (to its sub-packages).

// BootstrapFunc returns the bootstrap capability of one connection accepted
// on a listener of StartBootstrap. The connection takes ownership of the
// returned client and releases it when it ends.
type BootstrapFunc func(c *Conn) capnp.Client

// Conn is one accepted connection of a StartBootstrap listener, as the
// handlers behind its bootstrap capability see it. It is safe for
// concurrent use.
type Conn struct {
	s      *Server
	remote string
	gate   *replyGate      // nil: answers unbounded
	ctx    context.Context // done when the connection ends
	// answers gives back the items of poll answers never written
	// (unwritten.go).
	answers *unwrittenAnswers
}

// Remote is the peer's address, for logs.
func (c *Conn) Remote() string { return c.remote }

// queueBootstrap is the bootstrap capability of Start's and Serve's
// listeners: the Queue interface of schema/queue.capnp.
func (s *Server) queueBootstrap(c *Conn) capnp.Client {
	return capnp.Client(schema.Queue_ServerToClient(&queueServer{s: s, remote: c.remote, gate: c.gate, connCtx: c.ctx, answers: c.answers}))
}

// StartBootstrap is Start for another protocol: it serves ln in the
// background until Stop (or ctx is done, which calls Stop), and each
// connection's bootstrap capability comes from boot. Everything else is as
// on Start's listeners: the connections count against MaxConns and
// MaxConnsPerAddr together with theirs, and get the same TLS, first-message
// timeout, message size, traversal and flow limits and reply budget; Stop
// ends them with the others. It returns an error only if the server is
// already stopping.
func (s *Server) StartBootstrap(ctx context.Context, ln net.Listener, boot BootstrapFunc) error {
	if boot == nil {
		return fmt.Errorf("rpc: start: nil BootstrapFunc")
	}
	return s.start(ctx, ln, boot)
}

// Call runs one call's body with the accounting every call of the Queue
// interface gets: op's metrics, the count of running calls that Stop waits
// for, refusal once the server is stopping (an error wrapping
// ErrUnavailable), and the connection's reply budget, which counts reply
// (the call's answer; nil: none) until it is written. The error returned is
// fit to send to the client as an exception: one that maps to no wire code
// of errors.go (a store failure, a bug) is logged with a reference number
// and replaced by a short reason naming it.
func (c *Conn) Call(op Op, reply *capnp.Message, body func() error) error {
	s := c.s
	start := s.cfg.Clock.Now()
	ok := s.begin()
	failed := true
	defer func() { s.end(op, start, failed) }()
	if !ok {
		return fmt.Errorf("%w: server shutting down", ErrUnavailable)
	}
	if err := body(); err != nil {
		return s.clientError(op, c.remote, err)
	}
	failed = false
	if reply != nil {
		c.gate.add(reply) // counted until written (replyGate)
	}
	return nil
}

// clientError is err as a client may see it: an internal failure is logged
// with a new reference and replaced by errcode.InternalReason; a refusal (bad
// argument, shutdown, ...) is logged at debug and returned as it is.
func (s *Server) clientError(op Op, remote string, err error) error {
	if codeOf(err) == schema.ErrorCode_internal {
		// The cause names server files and library internals: it goes to
		// the log; the client gets a short reason and a reference to it.
		ref := s.errRefs.Add(1)
		s.log.Error("request failed", "op", op.String(), "remote", remote, "ref", ref, "err", err)
		return errcode.InternalReason(err, ref)
	}
	s.log.Debug("request refused", "op", op.String(), "remote", remote, "err", err)
	return err
}

// Enqueue enqueues p.Items into p.Queue at the server clock's now (p.Now is
// ignored), then wakes a long poll on the queue if an item is ready at
// once. The queue name, the batch size and every item are checked against
// the limits first: one bad item fails the whole call (an error wrapping
// storage.ErrInvalidArgument that names its index) and nothing is written.
// One result per item, in order; the payloads are not retained.
func (s *Server) Enqueue(ctx context.Context, p storage.EnqueueParams) ([]storage.EnqueueResult, error) {
	p, err := s.enqueueParams(p)
	if err != nil || len(p.Items) == 0 {
		return nil, err
	}
	out, err := s.disp.Enqueue(ctx, s.cfg.Store, p)
	return enqueueOut(p, out, err)
}

// enqueueParams checks p against the limits and sets p.Now.
func (s *Server) enqueueParams(p storage.EnqueueParams) (storage.EnqueueParams, error) {
	if err := p.Validate(s.limits); err != nil {
		return p, err
	}
	for i := range p.Items {
		if err := s.limits.ValidateItem(p.Items[i]); err != nil {
			return p, fmt.Errorf("items[%d]: %w", i, err)
		}
	}
	p.Now = s.cfg.Clock.Now()
	return p, nil
}

// enqueueOut checks that the store answered every item of p.
func enqueueOut(p storage.EnqueueParams, out []storage.EnqueueResult, err error) ([]storage.EnqueueResult, error) {
	if err != nil {
		return nil, err
	}
	if len(out) != len(p.Items) {
		return nil, fmt.Errorf("%w: store returned %d results for %d items", ErrInternal, len(out), len(p.Items))
	}
	return out, nil
}

// Poll claims up to p.Max ready items of p.Queue under one new lease of
// p.Lease (0: the queue's default), waiting up to wait for the first one
// in the server's long-poll dispatcher: the same per-queue line of waiters
// as the Queue interface's polls, woken by enqueues on any listener, nacks,
// redrives and Wake. The queue name, p.Max (1..MaxBatch), the lease and the
// wait are checked against the limits first; p.Max is then cut to the
// items that fit in one reply (DefaultMaxReplyBytes; no cut with the
// default limits). Nothing ready by the end of
// the wait (or at Stop) is an empty result, not an error. Errors: the
// limits' and the store's, ErrTooManyWaiters, ctx.Err().
func (s *Server) Poll(ctx context.Context, p storage.PollParams, wait time.Duration) (storage.PollResult, error) {
	if err := s.checkPoll(p, wait); err != nil {
		return storage.PollResult{}, err
	}
	p.Max = min(p.Max, s.replyItems) // what fits in one reply (replyItems)
	return s.disp.Poll(ctx, p, wait)
}

// Poll is Server.Poll for a call of this connection, which answers it
// with the items in reply (the call's Return message: the results'
// Message()), shaped as the Queue interface's polls are (trimPoll: the
// reply budget, one reply's size). If reply is never written, not a byte
// of it (the connection ends, or the node stops, while it waits behind a
// client that does not read), the items are given back, ready again at
// once (unwritten.go). Found by review (session 70): Queueber's polls
// held their answers past the budget, and their items stayed leased when
// the answers were never written.
func (c *Conn) Poll(ctx context.Context, reply *capnp.Message, p storage.PollParams, wait time.Duration) (storage.PollResult, error) {
	if err := c.s.checkPoll(p, wait); err != nil {
		return storage.PollResult{}, err
	}
	if c.gate.over() {
		// The reply budget is spent: a claim would only be given back
		// (trimPoll), as on the Queue interface's polls.
		return storage.PollResult{}, nil
	}
	pr, err := c.s.Poll(ctx, p, wait)
	if err == nil {
		c.s.trimPoll(c.gate, p.Queue, &pr, c.s.giveBack)
		c.answers.pollHook(c.s, reply, p.Queue, pr)
	}
	return pr, err
}

// checkPoll checks a poll's arguments and wait against the limits.
func (s *Server) checkPoll(p storage.PollParams, wait time.Duration) error {
	if err := p.Validate(s.limits); err != nil {
		return err
	}
	return s.limits.ValidateWait(wait)
}

// Ack deletes the items p.IDs held under p.Lease in p.Queue, at the server
// clock's now: one code per id (ok, notFound, leaseMismatch,
// leaseExpired). A subscription that was pushed the lease gets its credit
// back.
func (s *Server) Ack(ctx context.Context, p storage.AckParams) ([]storage.Code, error) {
	if err := p.Validate(s.limits); err != nil {
		return nil, err
	}
	p.Now = s.cfg.Clock.Now()
	codes, err := s.cfg.Store.Ack(ctx, p)
	if err != nil {
		return nil, err
	}
	s.tracker.settled(p.Lease, codes)
	return codes, nil
}

// ExtendLease sets the expiry of the live lease p.Lease of p.Queue to now +
// p.Duration (within the lease limits; zero is refused) and returns it.
// Errors: storage.ErrLeaseExpired (the lease is not live),
// storage.ErrLeaseMismatch (it belongs to another queue), the limits' and
// the store's.
func (s *Server) ExtendLease(ctx context.Context, p storage.ExtendParams) (time.Time, error) {
	if p.Duration == 0 {
		return time.Time{}, fmt.Errorf("%w: lease duration must be given", storage.ErrInvalidArgument)
	}
	if err := p.Validate(s.limits); err != nil {
		return time.Time{}, err
	}
	p.Now = s.cfg.Clock.Now()
	exp, err := s.cfg.Store.ExtendLease(ctx, p)
	s.tracker.extended(p.Lease, exp, err)
	if err != nil {
		return time.Time{}, err
	}
	return exp, nil
}
