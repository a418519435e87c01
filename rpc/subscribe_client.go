package rpc

import (
	"context"
	"fmt"
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
}

// C returns the channel of deliveries. It is closed when the subscription
// has ended (Cancel, the node ended it, or the connection was lost).
func (s *Subscription) C() <-chan Delivery { return s.ch }

// Err reports why the node ended the subscription (a *StatusError), once C
// is closed; nil after Cancel or a plain disconnect.
func (s *Subscription) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
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
func (cs consumerServer) Deliver(ctx context.Context, call schema.Consumer_deliver) error {
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
	cs.sub.mu.Lock()
	cs.sub.err = errorOf("subscribe", st.Code(), detail)
	cs.sub.mu.Unlock()
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
func (c *Client) Subscribe(ctx context.Context, o SubscribeOptions) (*Subscription, error) {
	if o.Prefetch <= 0 || o.Prefetch > maxPrefetch || o.Lease < 0 {
		return nil, fmt.Errorf("leaseq subscribe: %w: prefetch must be 1..%d (the node's --max-batch) and lease non-negative", storage.ErrInvalidArgument, maxPrefetch)
	}
	q, done, err := c.capnpConn(ctx)
	if err != nil {
		return nil, fmt.Errorf("leaseq subscribe: %w", err)
	}
	sub := &Subscription{c: c, queue: o.Queue, ch: make(chan Delivery, o.Prefetch), stop: make(chan struct{}), connDone: done,
		ended: make(chan struct{})}
	if !c.addSub(sub) {
		return nil, fmt.Errorf("leaseq subscribe: %w", storage.ErrClosed)
	}
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
		// Close cancelled it while the node answered.
		cancelCap(res.Subscription().AddRef())
		return nil, fmt.Errorf("leaseq subscribe: %w", storage.ErrClosed)
	}
	return sub, nil
}
