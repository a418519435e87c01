package rpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"capnproto.org/go/capnp/v3"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// SubscribeOptions configures Client.Subscribe.
type SubscribeOptions struct {
	Queue    string
	Prefetch int           // 1..MaxBatch items outstanding at most
	Lease    time.Duration // per pushed batch; 0: the queue's default
}

// Delivery is one pushed batch: one lease covering Items. Ack, nack or
// extend it with the Client as for a poll; acking or nacking returns credit.
type Delivery struct {
	Lease     storage.LeaseID
	ExpiresAt time.Time
	Items     []storage.Item
}

// Subscription receives pushed batches on C until it ends.
type Subscription struct {
	c        *Client
	queue    string
	ch       chan Delivery
	cap      schema.Subscription
	stop     chan struct{}
	halt     sync.Once // closes stop
	connDone <-chan struct{}
	// capMu guards cap, which Subscribe sets once the node has answered,
	// and cancelled, set by Cancel (maybe before that answer: by Close).
	capMu     sync.Mutex
	cancelled bool
	ended     chan struct{} // closed once the node has dropped the Consumer

	mu  sync.Mutex
	err error

	// flowMu guards the Deliver calls that have not returned: pending
	// counts their items (maxPending bounds it), and turn is closed once
	// the last of them has put its batch in C or given up, so that they
	// reach C in the order the node sent them although each runs on a
	// goroutine of its own (call.Go). flooded is set once the node has
	// pushed past the bound: every later Deliver is refused.
	flowMu  sync.Mutex
	pending int
	turn    chan struct{}
	flooded bool
}

// ErrPrefetchExceeded is Subscription.Err when the node pushed more than
// the subscription's prefetch allows (see Client.Subscribe): the client
// ended the subscription rather than hold the excess in memory.
var ErrPrefetchExceeded = errors.New("leaseq subscribe: the node pushed past the prefetch")

// C returns the channel of deliveries. It is closed when the subscription
// has ended (Cancel, the node ended it, or the connection was lost).
func (s *Subscription) C() <-chan Delivery { return s.ch }

// Err reports why the subscription ended, once C is closed: the node's
// reason (a *StatusError), or an error wrapping ErrPrefetchExceeded when
// the client ended it because the node pushed past the prefetch; nil
// after Cancel or a plain disconnect.
func (s *Subscription) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// setErr records why the subscription ended; the first reason stands (a
// node told it was refused a push says so with done, after the client's
// own reason).
func (s *Subscription) setErr(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err == nil {
		s.err = err
	}
}

// maxPending is how many items the Deliver calls not yet returned may
// hold: a node keeps to Prefetch items pushed and not answered (its
// credit counts a push until its answer comes), and the client allows as
// much again as a margin. Past it the node is ignoring the flow limit,
// and what it pushes would otherwise wait in go-capnp's call queue,
// unbounded.
func (s *Subscription) maxPending() int { return 2 * cap(s.ch) }

// admit counts a Deliver of n items among those not yet returned and
// returns the channel closed once the Deliver before it is done, and the
// channel to close once this one is; ok is false, and nothing counted,
// if the node has pushed past maxPending (now or before), which ends the
// subscription.
func (s *Subscription) admit(n int) (prev, mine chan struct{}, ok bool) {
	s.flowMu.Lock()
	defer s.flowMu.Unlock()
	if !s.flooded && s.pending+n > s.maxPending() {
		s.flooded = true
		s.setErr(fmt.Errorf("%w: %d items in pushes not yet taken and %d more pushed, past %d (prefetch %d and as much again); the subscription is ended and the pushes past it refused",
			ErrPrefetchExceeded, s.pending, n, s.maxPending(), cap(s.ch)))
	}
	if s.flooded {
		return nil, nil, false
	}
	s.pending += n
	prev, mine = s.turn, make(chan struct{})
	s.turn = mine
	return prev, mine, true
}

// isFlooded reports whether the node has pushed past maxPending.
func (s *Subscription) isFlooded() bool {
	s.flowMu.Lock()
	defer s.flowMu.Unlock()
	return s.flooded
}

// release ends what admit began for a Deliver of n items.
func (s *Subscription) release(n int, mine chan struct{}) {
	s.flowMu.Lock()
	s.pending -= n
	s.flowMu.Unlock()
	close(mine)
}

// Cancel stops the pushes. Deliveries already received keep their leases:
// ack or nack them; a batch the node pushed that C had no room for is given
// back (an undelivered nack: ready again at once, no attempt counted).
// Cancel is idempotent.
func (s *Subscription) Cancel() {
	s.stopPushes()
	s.capMu.Lock()
	s.cancelled = true
	c := s.cap
	s.cap = schema.Subscription{}
	s.capMu.Unlock()
	cancelCap(c) // none yet (Subscribe waits for its answer): Subscribe cancels it
}

// cancelCap cancels a subscription on the node and drops c. Dropping the
// capability is what cancels; the explicit call just makes it prompt while
// other references may linger in flight. Its answer is not awaited, so
// Cancel never blocks on a hung peer. A null c does nothing.
func cancelCap(c schema.Subscription) {
	if !capnp.Client(c).IsValid() {
		return
	}
	_, release := c.Cancel(context.Background(), nil)
	release()
	c.Release()
}

// consumerServer is the client's Consumer capability for one Subscription.
type consumerServer struct{ sub *Subscription }

// stopPushes makes Deliver put no more batches in C: a running one gives
// its batch back.
func (s *Subscription) stopPushes() { s.halt.Do(func() { close(s.stop) }) }

// Deliver implements schema.Consumer_Server. Calls arrive one at a time, in
// order; blocking here (C is full) is the back pressure the node sees. A
// batch it cannot put in C (Cancel, Close, the connection lost) is given
// back: nobody received it. Client.Close waits for running Delivers (and
// their give-backs).
//
// A node that pushes without waiting for the answers (found by review,
// session 70) would queue its pushes in go-capnp's call queue behind the
// one blocked here, every one of them in memory. So each Deliver lets the
// next one start (call.Go) once it is counted, and one that would take
// the items waiting past maxPending is refused, and ends the
// subscription (Err: ErrPrefetchExceeded): a refused push is not
// received, so the node gives it back (a leaseq node does, and ends the
// subscription; failing that its lease expires), and the pushes already
// waiting are given back by the client as on Cancel.
func (cs consumerServer) Deliver(ctx context.Context, call schema.Consumer_deliver) error {
	if cs.sub.isFlooded() {
		return cs.sub.Err() // not worth reading
	}
	args := call.Args()
	pr, err := readPoll(args.Lease, args.ExpiresAt(), args.Items, cap(cs.sub.ch))
	if err != nil {
		return err
	}
	c := cs.sub.c
	if !c.enterDeliver() {
		// Closed: nobody reads C. Refused, the batch is the node's to
		// give back.
		return fmt.Errorf("leaseq subscribe: %w: the client is closed", storage.ErrClosed)
	}
	defer c.exitDeliver()
	// An empty push counts as one item: it waits like any other, and a
	// leaseq node sends none.
	n := max(len(pr.Items), 1)
	prev, mine, ok := cs.sub.admit(n)
	if !ok {
		cs.sub.Cancel()
		return cs.sub.Err()
	}
	defer cs.sub.release(n, mine)
	call.Go()
	// The Deliver before this one ends promptly once the subscription
	// stops (it selects on the same channels), so this wait does too.
	<-prev
	d := Delivery{Lease: pr.Lease, ExpiresAt: pr.ExpiresAt, Items: pr.Items}
	select {
	case cs.sub.ch <- d:
		return nil
	case <-cs.sub.stop:
	case <-cs.sub.connDone:
	case <-ctx.Done():
	}
	// Nobody will read it: give it back rather than leave it leased to
	// nobody until the lease ends.
	if len(d.Items) > 0 {
		c.giveBack(pollGiveBack{queue: cs.sub.queue, lease: d.Lease, ids: itemIDs(d.Items)})
	}
	return nil
}

// Done implements schema.Consumer_Server.
func (cs consumerServer) Done(ctx context.Context, call schema.Consumer_done) error {
	st, err := call.Args().Status()
	if err != nil {
		return err
	}
	detail, _ := st.Detail()
	cs.sub.setErr(errorOf("subscribe", st.Code(), detail))
	return nil
}

// Shutdown runs once the node has dropped this Consumer and every deliver
// call has returned, so closing C here cannot race a send.
func (cs consumerServer) Shutdown() {
	cs.sub.c.dropSub(cs.sub)
	close(cs.sub.ch)
	close(cs.sub.ended)
}

// maxPrefetch is the largest --max-batch a node takes: a larger Prefetch
// is refused before C is made with room for it.
const maxPrefetch = storage.MaxBatchCeiling

// Subscribe starts push delivery from o.Queue. Read C promptly: at most
// o.Prefetch items are outstanding (pushed but not acked, nacked or
// expired), and a full C holds back further pushes.
//
// The client does not trust the node to keep to the prefetch: besides
// what C holds (o.Prefetch batches), it holds at most 2*o.Prefetch items
// in pushes waiting for room in C (a leaseq node has at most o.Prefetch
// pushed and unanswered). A node that pushes more ends the subscription:
// the push past the bound is refused (the node gives it back, or its
// lease expires: items are not lost), the pushes waiting for room are
// given back as on Cancel, the batches already in C can still be read,
// and once the node lets go C is closed and Err wraps
// ErrPrefetchExceeded.
func (c *Client) Subscribe(ctx context.Context, o SubscribeOptions) (*Subscription, error) {
	if o.Prefetch <= 0 || o.Prefetch > maxPrefetch || o.Lease < 0 {
		return nil, fmt.Errorf("leaseq subscribe: %w: prefetch must be 1..%d (the node's --max-batch) and lease non-negative", storage.ErrInvalidArgument, maxPrefetch)
	}
	q, done, err := c.capnpConn(ctx)
	if err != nil {
		return nil, fmt.Errorf("leaseq subscribe: %w", err)
	}
	sub := &Subscription{c: c, queue: o.Queue, ch: make(chan Delivery, o.Prefetch), stop: make(chan struct{}), connDone: done,
		ended: make(chan struct{}), turn: make(chan struct{})}
	close(sub.turn) // no Deliver before the first
	if !c.addSub(sub) {
		return nil, fmt.Errorf("leaseq subscribe: %w", storage.ErrClosed)
	}
	// A Subscribe that fails forgets its Subscription (found by review,
	// session 73: left registered, it made every later Close wait the
	// whole giveBackTimeout for an end that never comes). A push that
	// came meanwhile is given back rather than put in C.
	started := false
	defer func() {
		if !started {
			sub.stopPushes()
			c.dropSub(sub)
		}
	}()
	consumer := schema.Consumer_ServerToClient(consumerServer{sub: sub})
	f, release := q.Subscribe(ctx, func(p schema.Queue_subscribe_Params) error {
		p.SetPrefetch(uint32(o.Prefetch))
		p.SetLeaseMs(msDur(o.Lease))
		if err := p.SetConsumer(consumer); err != nil {
			return err
		}
		return p.SetQueue(o.Queue)
	})
	defer release()
	res, err := answer("subscribe", f.Struct)
	if err != nil {
		return nil, err
	}
	sub.capMu.Lock()
	cancelled := sub.cancelled
	if !cancelled {
		sub.cap = res.Subscription().AddRef()
	}
	sub.capMu.Unlock()
	if cancelled {
		// Close cancelled it while the node answered, or the node pushed
		// past the prefetch before it answered.
		cancelCap(res.Subscription().AddRef())
		if err := sub.Err(); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("leaseq subscribe: %w", storage.ErrClosed)
	}
	started = true
	return sub, nil
}

// capnpConn returns the go-capnp connection's Queue capability and its
// Done channel. When the client runs the lean engine it opens the
// connection the first time, and again once the last one has ended.
func (c *Client) capnpConn(ctx context.Context) (schema.Queue, <-chan struct{}, error) {
	if c.lean == nil {
		return c.q, c.rc.Done(), nil
	}
	c.gcMu.Lock()
	defer c.gcMu.Unlock()
	select {
	case <-c.closed:
		return schema.Queue{}, nil, fmt.Errorf("rpc: %w", net.ErrClosed)
	default:
	}
	if c.rc != nil {
		select {
		case <-c.rc.Done():
			// This connection alone ended (found by review, session 73:
			// a NAT dropped the idle subscription socket, say) while the
			// lean one is fine: a new one is opened, as the Client is not
			// Done. Subscriptions on the old one end with it (connDone).
			c.q.Release()
			_ = c.rc.Close()
			c.conn, c.rc, c.q = nil, nil, schema.Queue{}
		default:
		}
	}
	if c.rc == nil {
		// Close ends the dial: it closes c.closed before it waits for
		// gcMu (a node that accepts and never answers would hold both).
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-c.closed:
				cancel()
			case <-ctx.Done():
			}
		}()
		conn, err := c.redial(ctx)
		if err != nil {
			return schema.Queue{}, nil, c.closedOr(err)
		}
		rc, q, _, err := startCapnp(ctx, conn, c.log, c.limit, c.readLimit)
		if err != nil {
			_ = conn.Close()
			return schema.Queue{}, nil, c.closedOr(err)
		}
		select {
		case <-c.closed:
			q.Release()
			_ = rc.Close()
			return schema.Queue{}, nil, fmt.Errorf("rpc: %w", net.ErrClosed)
		default:
		}
		c.conn, c.rc, c.q = conn, rc, q
	}
	return c.q, c.rc.Done(), nil
}

// closedOr is err, or net.ErrClosed once Close has begun.
func (c *Client) closedOr(err error) error {
	select {
	case <-c.closed:
		return fmt.Errorf("rpc: %w", net.ErrClosed)
	default:
		return err
	}
}
