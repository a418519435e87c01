package rpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/server"

	"github.com/leaseq/leaseq/rpc/dispatch"
	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// Subscriptions: a pusher goroutine per subscription polls through the
// dispatcher (so it parks like a long poll and is woken the same way) and
// pushes each non-empty poll to the client's Consumer as one deliver call.
//
// Credit: a subscription may have at most prefetch pushed items outstanding.
// The leaseTracker, shared by the whole server, maps every pushed lease to
// its subscription, so an ack or nack of that lease on ANY connection returns
// credit; so does the lease's expiry (judged by the clock, without waiting
// for the sweeper), and an extend moves that expiry. Lock order:
// leaseTracker.mu only; the store and capnp are never called with it held.

// leaseTracker accounts the credit of every subscription.
type leaseTracker struct {
	mu     sync.Mutex
	leases map[storage.LeaseID]*trackedLease
}

type trackedLease struct {
	sub       *subscription
	remaining int
	expires   time.Time
}

func newLeaseTracker() *leaseTracker {
	return &leaseTracker{leases: make(map[storage.LeaseID]*trackedLease)}
}

func (t *leaseTracker) add(sub *subscription, lease storage.LeaseID, n int, expires time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tl := &trackedLease{sub: sub, remaining: n, expires: expires}
	t.leases[lease] = tl
	sub.leases[lease] = tl
	sub.outstanding += n
	sub.unanswered += n // the push about to be sent
}

// answered counts the answer of a push of n items (answered, failed or
// cut short): their place in the window comes back.
func (t *leaseTracker) answered(sub *subscription, n int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sub.unanswered -= n
	select {
	case sub.credit <- struct{}{}:
	default:
	}
}

// freeLocked returns n of tl's items to its subscription's credit.
// REQUIRES: t.mu held.
func (t *leaseTracker) freeLocked(lease storage.LeaseID, tl *trackedLease, n int) {
	if n > tl.remaining {
		n = tl.remaining
	}
	tl.remaining -= n
	tl.sub.outstanding -= n
	if tl.remaining <= 0 {
		delete(t.leases, lease)
		delete(tl.sub.leases, lease)
	}
	if n > 0 {
		select {
		case tl.sub.credit <- struct{}{}:
		default:
		}
	}
}

// settled applies the per-id codes of an ack or nack of lease.
func (t *leaseTracker) settled(lease storage.LeaseID, codes []storage.Code) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tl, ok := t.leases[lease]
	if !ok {
		return
	}
	n := 0
	for _, c := range codes {
		switch c {
		case storage.CodeOK:
			n++
		case storage.CodeLeaseExpired:
			// The lease is dead: none of its items is ours any more.
			n = tl.remaining
		}
	}
	t.freeLocked(lease, tl, n)
}

// extended applies the outcome of an extend of lease.
func (t *leaseTracker) extended(lease storage.LeaseID, expires time.Time, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tl, ok := t.leases[lease]
	if !ok {
		return
	}
	switch {
	case err == nil:
		tl.expires = expires
	case errors.Is(err, storage.ErrLeaseExpired):
		t.freeLocked(lease, tl, tl.remaining)
	}
}

// credit prunes sub's expired leases at now and returns how many items it
// may still be pushed, and the earliest expiry among its leases (zero if
// none).
func (t *leaseTracker) credit(sub *subscription, now time.Time) (int, time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var next time.Time
	for lease, tl := range sub.leases {
		if !now.Before(tl.expires) {
			t.freeLocked(lease, tl, tl.remaining)
			continue
		}
		if next.IsZero() || tl.expires.Before(next) {
			next = tl.expires
		}
	}
	// A push not yet answered holds its place even once its lease ended:
	// a consumer that stopped taking pushes was pushed a new batch every
	// lease, each an attempt of items nobody read (found by review,
	// session 69).
	return sub.prefetch - max(sub.outstanding, sub.unanswered), next
}

// drop forgets sub's leases once it has ended.
func (t *leaseTracker) drop(sub *subscription) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for lease := range sub.leases {
		delete(t.leases, lease)
	}
	sub.leases = nil
}

// subscription is one subscribe call's state and its capnp Subscription.
type subscription struct {
	s        *Server
	queue    string
	prefetch int
	lease    time.Duration
	consumer schema.Consumer
	ctx      context.Context
	cancel   context.CancelFunc
	unwatch  func() bool   // stops cancelling on the connection's end (nil: not watched)
	credit   chan struct{} // buffered 1: credit came back

	// Guarded by s.tracker.mu. outstanding: items under live leases;
	// unanswered: items of pushes whose answer has not come.
	outstanding int
	unanswered  int
	leases      map[storage.LeaseID]*trackedLease

	// delivering counts the deliveries whose answer has not come
	// (deliver); deliverErr is the first that failed.
	delivering sync.WaitGroup
	deliverMu  sync.Mutex
	deliverErr error
	refused    error // a delivery the consumer refused while the subscription was live; REQUIRES: deliverMu
}

// Cancel implements schema.Subscription_Server.
func (sub *subscription) Cancel(ctx context.Context, call schema.Subscription_cancel) error {
	sub.cancel()
	return nil
}

// Shutdown runs when the client drops its Subscription or the connection
// dies.
func (sub *subscription) Shutdown() { sub.cancel() }

// deliverWindow is the flow-limiter window (bytes in flight) for pushes to
// one consumer: the most prefetch items can take, capped by the
// per-connection budget. A delivery bigger than the window still goes,
// alone (see newWindowLimiter).
func (s *Server) deliverWindow(prefetch int) int64 {
	l := s.limits
	perItem := int64(l.MaxPayload + l.MaxDedupKey + l.MaxReason + l.MaxQueueName + 512)
	w := int64(prefetch)*perItem + 64<<10
	if limit := s.cfg.ConnFlowLimitBytes; limit > 0 && w > limit {
		w = limit
	}
	return w
}

// Subscribe implements schema.Queue_Server.
func (q *queueServer) Subscribe(ctx context.Context, call schema.Queue_subscribe) error {
	res, err := call.AllocResults()
	if err := q.call(OpSubscribe, res, err, func() error { return q.subscribe(ctx, call.Args(), res) }); err != nil {
		return err
	}
	// A refused subscribe (its status says why) still returns a
	// capability: go-capnp v3.1.0-alpha.2 panics when a call pipelined on
	// the answer's subscription, queued before it returned, finds a null
	// one there (see "go-capnp workarounds" in doc.go).
	if !res.HasSubscription() {
		return res.SetSubscription(subscriptionClient(refusedSubscription{}))
	}
	return nil
}

// refusedSubscription is the subscription a refused subscribe returns on
// the go-capnp engine: there is nothing to cancel.
type refusedSubscription struct{}

func (refusedSubscription) Cancel(context.Context, schema.Subscription_cancel) error { return nil }

// subscribe is Subscribe's body, shared by both engines (lean.go).
func (q *queueServer) subscribe(ctx context.Context, args schema.Queue_subscribe_Params, res schema.Queue_subscribe_Results) error {
	queue, err := q.queueName(args.Queue)
	if err != nil {
		return err
	}
	prefetch := args.Prefetch()
	if prefetch == 0 || int64(prefetch) > int64(q.s.limits.MaxBatch) {
		return fmt.Errorf("%w: prefetch must be 1-%d, got %d", storage.ErrInvalidArgument, q.s.limits.MaxBatch, prefetch)
	}
	lease, err := q.leaseDur(args.LeaseMs(), "lease", true)
	if err != nil {
		return err
	}
	// A null capability (missing, a descriptor of none, an index past the
	// cap table) cannot be pushed to; go-capnp panics on some methods of a
	// null client, SetFlowLimiter among them.
	if !args.HasConsumer() || !capnp.Client(args.Consumer()).IsValid() {
		return fmt.Errorf("%w: consumer capability missing or null", storage.ErrInvalidArgument)
	}
	if n := q.s.disp.QueueWaiters(queue); n >= q.s.maxWaiters() {
		return fmt.Errorf("%w %q (limit %d)", ErrTooManyWaiters, queue, q.s.maxWaiters())
	}
	sub := &subscription{
		s:        q.s,
		queue:    queue,
		prefetch: int(prefetch),
		lease:    lease,
		consumer: args.Consumer().AddRef(),
		credit:   make(chan struct{}, 1),
		leases:   make(map[storage.LeaseID]*trackedLease),
	}
	sub.consumer.SetFlowLimiter(newWindowLimiter(q.s.deliverWindow(sub.prefetch)))
	sub.ctx, sub.cancel = context.WithCancel(q.s.subCtx)
	if q.connCtx != nil {
		// A subscription ends with its connection even when the consumer
		// is no capability of the client's: a promise the client resolved
		// to one of the node's own holds no reference to the connection.
		sub.unwatch = context.AfterFunc(q.connCtx, sub.cancel)
	}
	if err := q.s.startSub(sub); err != nil {
		if sub.unwatch != nil {
			sub.unwatch()
		}
		sub.cancel()
		sub.consumer.Release()
		return err
	}
	return res.SetSubscription(subscriptionClient(sub))
}

// subscriptionClient is the capability of a subscription on the go-capnp
// engine. A method it does not have is answered with an Unimplemented
// exception by a method of its own: go-capnp v3.1.0-alpha.2 rejects an
// unknown method without a pipeline caller, and a call pipelined on the
// subscription of a subscribe not returned yet is queued and then
// dereferences that nil caller when the subscribe returns (see "go-capnp
// workarounds" in doc.go).
func subscriptionClient(impl schema.Subscription_Server) schema.Subscription {
	srv := schema.Subscription_NewServer(impl)
	srv.HandleUnknownMethod = func(m capnp.Method) *server.Method {
		return &server.Method{Method: m, Impl: func(context.Context, *server.Call) error {
			return capnp.Unimplemented(fmt.Sprintf("Subscription has no method %d of interface %#x", m.MethodID, m.InterfaceID))
		}}
	}
	return schema.Subscription(capnp.NewClient(srv))
}

func (s *Server) maxWaiters() int {
	if s.cfg.MaxWaitersPerQueue > 0 {
		return s.cfg.MaxWaitersPerQueue
	}
	return dispatch.DefaultMaxWaitersPerQueue
}

// startSub starts sub's pusher unless the server is stopping or the node
// holds as many parked polls and subscriptions as MaxWaiters (found by
// review, session 69: a subscribe over it was accepted, then ended as
// tooManyWaiters when it first parked).
func (s *Server) startSub(sub *subscription) error {
	polls, limit := s.disp.ParkedPolls() // d.mu before s.mu, never under it
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.stopping {
		return fmt.Errorf("%w: server shutting down", ErrUnavailable)
	}
	if polls+s.mu.subs >= limit {
		return fmt.Errorf("%w: the node holds %d parked polls and subscriptions (node limit %d)", ErrTooManyWaiters, polls+s.mu.subs, limit)
	}
	s.mu.subs++
	s.wg.Add(1)
	s.subWG.Add(1)
	go sub.run()
	return nil
}

// run pushes until the subscription is cancelled, the consumer fails, or
// the server stops.
func (sub *subscription) run() {
	s := sub.s
	log := s.log.With("queue", sub.queue)
	log.Debug("subscription started", "prefetch", sub.prefetch)
	endErr := sub.loop()
	// The answers of the last deliveries: a batch the consumer did not
	// take is given back before the subscription counts as ended.
	sub.delivering.Wait()
	s.tracker.drop(sub)
	if endErr != nil && !isDisconnect(endErr) {
		// The node ended it: tell the consumer why, if it still listens.
		// A shutdown ends every subscription; that is no warning.
		if errors.Is(endErr, ErrUnavailable) {
			log.Info("subscription ended", "err", endErr)
		} else {
			log.Warn("subscription ended", "err", endErr)
		}
		ctx, cancel := s.cfg.Clock.WithTimeout(context.Background(), time.Second)
		f, release := sub.consumer.Done(ctx, func(p schema.Consumer_done_Params) error {
			st, err := p.NewStatus()
			if err != nil {
				return err
			}
			return setStatus(st, endErr)
		})
		_, _ = f.Struct()
		release()
		cancel()
	}
	if sub.unwatch != nil {
		sub.unwatch()
	}
	sub.cancel()
	sub.consumer.Release()
	s.mu.Lock()
	s.mu.subs--
	s.mu.Unlock()
	s.subWG.Done()
	s.wg.Done()
	log.Debug("subscription ended")
}

// loop returns nil when the client ended the subscription, else why it
// ended.
func (sub *subscription) loop() error {
	s := sub.s
	for {
		if err := sub.ctx.Err(); err != nil {
			return sub.endReason()
		}
		now := s.cfg.Clock.Now()
		avail, next := s.tracker.credit(sub, now)
		if avail <= 0 {
			if err := sub.waitCredit(next); err != nil {
				return sub.endReason()
			}
			continue
		}
		avail = min(avail, s.replyItems) // what fits in one push (replyItems)
		pr, err := s.disp.PollExempt(sub.ctx, storage.PollParams{Queue: sub.queue, Max: avail, Lease: sub.lease}, s.limits.MaxWait)
		if err != nil {
			if sub.ctx.Err() != nil {
				return sub.endReason()
			}
			return err
		}
		if len(pr.Items) == 0 {
			continue
		}
		if sub.ctx.Err() != nil {
			// Cancelled while the batch was claimed: nobody will see it.
			sub.giveBack(pr)
			return sub.endReason()
		}
		s.tracker.add(sub, pr.Lease, len(pr.Items), pr.ExpiresAt)
		s.pushed.Add(uint64(len(pr.Items)))
		if err := sub.deliver(pr); err != nil {
			// An earlier delivery failed: this batch was not sent.
			sub.giveBack(pr)
			if sub.ctx.Err() != nil {
				return sub.endReason()
			}
			return err
		}
	}
}

// consumerDeliverSize is the size of Consumer.deliver's parameters, as the
// generated Consumer.Deliver sends them (TestSubscribe_DeliverParamsSize).
var consumerDeliverSize = capnp.ObjectSize{DataSize: 8, PointerCount: 2}

// deliver pushes pr to the consumer and returns without its answer, as a
// stream call does (deliver is "-> stream"; the flow limiter of the
// consumer's client holds back a send past its window), or returns the
// failure of an earlier delivery instead of sending. Unlike a stream call,
// each delivery's answer is awaited, on a goroutine of its own: a consumer
// that answers with an exception did not take the batch (it refused it, or
// its capability was gone when the call came: a Cancel crossing the push),
// which is then given back; a connection lost, or Stop (s.subCtx, which
// ends the call), leaves it leased, as the consumer may hold it. The
// client's Cancel does not end the call, so that its answer tells.
func (sub *subscription) deliver(pr storage.PollResult) error {
	sub.deliverMu.Lock()
	err := sub.deliverErr
	sub.deliverMu.Unlock()
	if err != nil {
		sub.s.tracker.answered(sub, len(pr.Items)) // not sent
		return err
	}
	ans, release := capnp.Client(sub.consumer).SendCall(sub.s.subCtx, capnp.Send{
		Method: capnp.Method{InterfaceID: schema.Consumer_TypeID, MethodID: 0,
			InterfaceName: "queue.capnp:Consumer", MethodName: "deliver"},
		ArgsSize: consumerDeliverSize,
		PlaceArgs: func(st capnp.Struct) error {
			p := schema.Consumer_deliver_Params(st)
			if err := p.SetLease(pr.Lease[:]); err != nil {
				return err
			}
			p.SetExpiresAt(toMs(pr.ExpiresAt))
			l, err := p.NewItems(int32(len(pr.Items)))
			if err != nil {
				return err
			}
			return writeItems(l, pr.Items)
		},
	})
	sub.delivering.Add(1)
	go func() {
		defer sub.delivering.Done()
		_, err := ans.Struct()
		release()
		defer sub.s.tracker.answered(sub, len(pr.Items))
		if err == nil {
			return
		}
		sub.deliverMu.Lock()
		if sub.deliverErr == nil {
			sub.deliverErr = err
			if !isDisconnect(err) && sub.ctx.Err() == nil {
				// The consumer refused it, with the subscription live:
				// the node ends the subscription (and says so with done)
				// rather than leave it parked, holding its place in the
				// limits, until the next batch (found by review).
				sub.refused = err
				sub.cancel()
			}
		}
		sub.deliverMu.Unlock()
		// A connection lost, or the call cut short by Stop, leaves the
		// outcome unknown: the consumer may hold the batch.
		if !isDisconnect(err) && sub.s.subCtx.Err() == nil {
			sub.giveBack(pr)
		}
	}()
	return nil
}

// giveBack returns a batch claimed for the subscription that no consumer
// received (Server.giveBack).
func (sub *subscription) giveBack(pr storage.PollResult) {
	sub.s.giveBack(sub.queue, pr.Lease, itemIDs(pr.Items), "subscription ended before delivery")
}

// giveBack returns items claimed under lease that no client received (a
// subscription's batch not delivered, a poll answer not written): an
// undelivered nack (storage.NackParams.Undelivered) takes the claim back,
// so they are ready again at once in their old place, with the attempts
// they had before it, and one poll parked on the queue looks. reason is
// logged when the give-back fails.
func (s *Server) giveBack(queue string, lease storage.LeaseID, ids []storage.ItemID, reason string) {
	codes, err := s.disp.GiveBack(s.cfg.Store, queue, lease, ids)
	if err != nil {
		s.log.Warn("items not received stay leased until the lease ends", "queue", queue, "items", len(ids), "why", reason, "err", err)
		return
	}
	s.tracker.settled(lease, codes)
}

// endReason distinguishes a client cancel (nil) from a server stop and
// a delivery the consumer refused.
func (sub *subscription) endReason() error {
	if sub.s.subCtx.Err() != nil {
		return fmt.Errorf("%w: server shutting down", ErrUnavailable)
	}
	sub.deliverMu.Lock()
	defer sub.deliverMu.Unlock()
	if sub.refused != nil {
		return fmt.Errorf("the consumer refused a delivery: %w", sub.refused)
	}
	return nil
}

// waitCredit waits for credit to come back, for the earliest lease to
// expire (at next; zero: no lease), or for the end. The timer's duration
// is taken from the clock when the timer is made, and the clock is read
// once more after: a clock that passed next meanwhile (a mock clock
// moved by another goroutine) would otherwise leave a timer that fires
// late, or, on a mock clock, never.
func (sub *subscription) waitCredit(next time.Time) error {
	clk := sub.s.cfg.Clock
	var timerC <-chan time.Time
	if !next.IsZero() {
		t := clk.Timer(next.Sub(clk.Now()))
		defer t.Stop()
		timerC = t.C
		if !clk.Now().Before(next) {
			return nil
		}
	}
	select {
	case <-sub.credit:
	case <-timerC:
	case <-sub.ctx.Done():
		return sub.ctx.Err()
	}
	return nil
}
