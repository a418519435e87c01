package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/storage"
)

// ConsumerConfig configures Client.Consume.
type ConsumerConfig struct {
	Queue   string
	Workers int           // concurrent pollers, each handling its batch in order (0: 1)
	Batch   int           // items per poll (0: 1)
	Lease   time.Duration // per poll, at least 1ms (0: storage.DefaultLeaseDuration, within the node's --min-lease and --max-lease); extended every Lease/3 while handlers run
	Wait    time.Duration // long-poll wait (0: DefaultConsumerWait)
	// Handler processes one item. nil error acks it; an error or a panic
	// nacks it with the error text or "panic: <value>" as the reason (its
	// first 4096 bytes, what a node with the default --max-reason keeps). Its
	// ctx is cancelled if the lease is lost (an extend finds it gone, or
	// none has gone through for a whole Lease, as when the connection
	// ended: the item may be redelivered elsewhere; an error returned
	// after that is not nacked), not when Consume's ctx is: in-flight
	// items finish.
	Handler func(ctx context.Context, it storage.Item) error
	Clock   clock.Clock  // required: extend timers run on it
	Logger  *slog.Logger // nil: discard
	// NackDelay is the redelivery delay after a failure (nil: the queue's
	// exponential backoff). A handler error made by RetryAfter overrides
	// it for its item.
	NackDelay *time.Duration
	// MaxItems, if positive, is how many items Consume takes in all: its
	// workers never poll for more, and once every item taken is settled
	// Consume returns nil, as after a cancel.
	MaxItems int
	// OnExtend, if set, is called after every automatic extend with its
	// outcome (for metrics and tests).
	OnExtend func(lease storage.LeaseID, expiresAt time.Time, err error)
	// OnSettleFailed, if set, is called for each item whose ack (ack
	// true) or nack did not succeed: err is the call's error, or, when
	// the node answered the item with a code other than ok, an error
	// saying so that wraps the code's storage error (ErrLeaseExpired and
	// the like). The item comes back once its lease runs out; Consume
	// logs it either way. A batch's ack rides the poll for the next
	// batch, and is reported once its own answer comes (given up, as any
	// settle, once its lease has surely ended), while the batch that poll
	// leased is handled; one that failed is made again on its own, and
	// only that one's outcome counts: not found from it means the first
	// one was applied, and is no failure. An item is reported once. When
	// an ack or a nack was sent but its answer never came (the lease
	// ended first, or the connection was lost), err wraps
	// ErrOutcomeUnknown (Client's calls say so for every call that
	// changes the queue): the node
	// may have applied it (the item then does not come back) or not (it
	// does, once its lease runs out), and Consume does nothing more for
	// it. An item whose handler failed after Consume found its lease lost
	// is not nacked (the node delivers it again; the nack could only be
	// refused) and not reported; a success is acked all the same, and
	// reported if that fails. Called from the workers, concurrently.
	OnSettleFailed func(id storage.ItemID, ack bool, err error)
	// OnBackoffNack, if set, is called for each item nacked with the
	// queue's backoff instead of its delay (NackDelay or a RetryAfter
	// error's) because the node refused that delay as an invalid
	// argument (over the node's --max-delay, which the client cannot
	// learn); err is the node's refusal. Consume logs the first refusal
	// and nacks items with a delay at least as long with the backoff
	// straight away thereafter. Called from the workers, concurrently.
	OnBackoffNack func(id storage.ItemID, delay time.Duration, err error)
}

// HandlerLease is what a Consume handler may learn about its item's lease
// from its ctx (HandlerLeaseFrom).
type HandlerLease struct {
	Lease storage.LeaseID
	// ExpiresAt is the lease's expiry as the poll returned it; Consume
	// extends the lease every Lease/3 while the handler runs.
	ExpiresAt time.Time
}

type handlerLeaseKey struct{}

// HandlerLeaseFrom returns the lease of the item whose handler ctx is
// given, and false for any other ctx.
func HandlerLeaseFrom(ctx context.Context) (HandlerLease, bool) {
	d, ok := ctx.Value(handlerLeaseKey{}).(HandlerLease)
	return d, ok
}

// RetryAfter wraps err so that Consume nacks the item whose handler
// returned it with redelivery delay d, instead of ConsumerConfig.NackDelay.
// The nack reason is err's text ("retry after d" when err is nil).
func RetryAfter(d time.Duration, err error) error {
	return &retryAfterError{delay: d, err: err}
}

type retryAfterError struct {
	delay time.Duration
	err   error
}

func (r *retryAfterError) Error() string {
	if r.err == nil {
		return fmt.Sprintf("retry after %v", r.delay)
	}
	return r.err.Error()
}
func (r *retryAfterError) Unwrap() error { return r.err }

// nackDelay is the delay to nack with after err.
func nackDelay(cfg ConsumerConfig, err error) *time.Duration {
	var ra *retryAfterError
	if errors.As(err, &ra) {
		return &ra.delay
	}
	return cfg.NackDelay
}

// itemBudget counts the items a MaxItems consumer may still take. A worker
// takes its poll size from it before polling and gives back what the poll
// did not return, so the workers together never hold more than MaxItems.
type itemBudget struct {
	mu   sync.Mutex
	left int
	// spent is closed while left is 0 (made anew when items are given
	// back): a worker pausing after a refused poll ends its pause then,
	// as the items left are the other workers'.
	spent chan struct{}
}

// spentC returns a channel closed while the budget is spent; nil (never
// ready) without a budget.
func (b *itemBudget) spentC() <-chan struct{} {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.spent == nil {
		b.spent = make(chan struct{})
		if b.left == 0 {
			close(b.spent)
		}
	}
	return b.spent
}

// take reserves up to n items and returns how many it reserved (0: the
// budget is spent, or held by polls in flight).
func (b *itemBudget) take(n int) int {
	if b == nil {
		return n
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n = min(n, b.left)
	b.left -= n
	if b.left == 0 && b.spent != nil {
		select {
		case <-b.spent:
		default:
			close(b.spent)
		}
	}
	return n
}

// give returns n reserved items that were not delivered.
func (b *itemBudget) give(n int) {
	if b == nil || n <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.left == 0 {
		b.spent = nil // made anew, open, by the next spentC
	}
	b.left += n
}

// DefaultConsumerWait is the long-poll wait of Consume: long enough that an
// idle consumer costs about one call per 20 s, short of the 60 s limit.
const DefaultConsumerWait = 20 * time.Second

// Consume runs cfg.Workers workers that poll cfg.Queue and run cfg.Handler
// on every item until ctx is cancelled. Then it drains: no new polls, every
// in-flight handler finishes and its item is acked or nacked, and Consume
// returns nil. With MaxItems it also returns nil once that many items have
// been taken and settled. If polling fails (connection lost, bad config),
// the other workers drain the same way and Consume returns the first error;
// a poll refused as Overloaded (too many polls parked on the queue, the
// node stopping or out of disk space) is made again after a pause of
// 100 ms, doubling up to 5 s while the refusals last.
// An ack or nack that fails does not stop Consume: it is logged, and
// reported to cfg.OnSettleFailed.
func (c *Client) Consume(ctx context.Context, cfg ConsumerConfig) error {
	if cfg.Handler == nil || cfg.Clock == nil {
		return fmt.Errorf("leaseq consume: %w: Handler and Clock are required", storage.ErrInvalidArgument)
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 1
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 1
	}
	if cfg.Lease > 0 && cfg.Lease < time.Millisecond {
		// The wire counts milliseconds: it would go as 0, the queue's
		// default, and be extended every Lease/3 against another lease.
		return fmt.Errorf("leaseq consume: %w: Lease %v is under 1ms", storage.ErrInvalidArgument, cfg.Lease)
	}
	if cfg.Lease <= 0 {
		// The default within the node's --max-lease (found by review,
		// session 70: a node with --max-lease under 30 s refused every
		// poll). A node that does not say (older, or unreachable now:
		// the polls will tell) leaves the default.
		cfg.Lease = storage.DefaultLeaseDuration
		if ni, err := c.NodeInfo(ctx); err == nil {
			cfg.Lease = ni.LeaseWithin(cfg.Lease)
		}
	}
	if cfg.Wait <= 0 {
		cfg.Wait = DefaultConsumerWait
	}
	if cfg.Logger == nil {
		cfg.Logger = discardLogger()
	}
	cs := newConsumer(c, cfg)
	if cfg.MaxItems > 0 {
		cs.budget = &itemBudget{left: cfg.MaxItems}
	}

	pollCtx, stop := context.WithCancel(ctx)
	defer stop()
	var (
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	for range cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cs.loop(pollCtx, ctx); err != nil {
				errOnce.Do(func() { firstErr = err })
				stop()
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// consumer is what the workers of one Consume call share.
type consumer struct {
	c      *Client
	cfg    ConsumerConfig // defaults filled in
	log    *slog.Logger
	budget *itemBudget // nil: no MaxItems

	// refusedDelay is the shortest nack delay the node refused while it
	// took the same nack with the queue's backoff, and refusedErr its
	// refusal: a delay at least as long is refused as well, so such
	// nacks go with the backoff straight away (one call, not two).
	// refusedDelay 0: none refused yet.
	mu           sync.Mutex
	refusedDelay time.Duration
	refusedErr   error
	warned       bool // the refusal was logged
}

func newConsumer(c *Client, cfg ConsumerConfig) *consumer {
	return &consumer{c: c, cfg: cfg, log: cfg.Logger.With("svc", "consumer", "queue", cfg.Queue)}
}

// loop is one worker. pollCtx stops polling; parent carries values for
// the handlers and settles (its cancellation does not cut them short). A
// worker that finds budget spent ends: the items left are reserved by
// workers still polling, which handle them. The successes of a batch are
// acked with the poll for the next (Client.ackPollSplit: one round trip,
// and on a --sync=always node one fsync, for both; the ack's answer is
// waited for while the next batch is handled); the last batch's when the
// worker ends.
func (cs *consumer) loop(pollCtx, parent context.Context) error {
	cfg := cs.cfg
	settleCtx := context.WithoutCancel(parent)
	var held settle // the last batch's successes, not yet acked
	defer func() { cs.ackNow(settleCtx, held, nil) }()
	var pause time.Duration // after polls refused as overloaded
	for pollCtx.Err() == nil {
		n := cs.budget.take(cfg.Batch)
		if n == 0 {
			return nil
		}
		var pr storage.PollResult
		var err error
		var answered time.Time // when the poll's answer came
		acked := settled       // held's ack riding this poll, once settled
		if len(held.ids) > 0 {
			acked, pr, err = cs.ackPoll(pollCtx, settleCtx, held, n)
			answered = cfg.Clock.Now()
			held = settle{}
		} else {
			pr, err = cs.c.Poll(pollCtx, cfg.Queue, n, cfg.Lease, cfg.Wait)
			answered = cfg.Clock.Now()
		}
		cs.budget.give(n - len(pr.Items))
		if len(pr.Items) > 0 {
			// Leased even when the call also failed: handle them.
			held = cs.handleBatch(settleCtx, pr, answered)
		}
		<-acked
		if err != nil {
			if pollCtx.Err() != nil {
				return nil
			}
			if !Overloaded(err) {
				return err
			}
			// Not now (too many polls parked on the queue, the node
			// stopping or out of disk space): poll again after a pause.
			pause = cs.overloaded(pollCtx, pause, err)
			continue
		}
		pause = 0
	}
	return nil
}

// Pauses of a worker after a poll refused as overloaded: the first, and
// the longest they double up to.
const (
	overloadPauseMin = 100 * time.Millisecond
	overloadPauseMax = 5 * time.Second
)

// overloaded waits after a poll refused with err, an Overloaded error,
// the one before having waited last (0: none) and returns how long it
// waited. It returns early when pollCtx ends; when the connection ends (a
// node stopping refuses parked polls as unavailable and then closes the
// connection, and the next poll reports that loss at once instead of
// after the pause); and when MaxItems' budget is spent (the worker then
// ends, instead of keeping Consume waiting for its pause).
func (cs *consumer) overloaded(pollCtx context.Context, last time.Duration, err error) time.Duration {
	pause := min(max(2*last, overloadPauseMin), overloadPauseMax)
	if last == 0 {
		cs.log.Warn("poll refused, polling again after a pause", "pause", pause, "err", err)
	}
	t := cs.cfg.Clock.Timer(pause)
	defer t.Stop()
	select {
	case <-t.C:
	case <-pollCtx.Done():
	case <-cs.c.Done():
	case <-cs.budget.spentC():
	}
	return pause
}

// noExtendThrough is the warning of a lease counted as lost for want of an
// extend that went through.
const noExtendThrough = "lease lost while handling: no extend went through for a whole lease"

// settle is the items of one lease to ack.
type settle struct {
	lease storage.LeaseID
	ids   []storage.ItemID
	ended time.Time // on the consumer's clock, when the lease has surely ended
}

// untilEnded bounds ctx by ended, when a lease has surely ended on the
// node: a settle of its items still waiting for its answer then (the node
// unreachable, or stalled) could only be refused, and is given up, so
// that no worker (and no drain) waits for it without bound.
func (cs *consumer) untilEnded(ctx context.Context, ended time.Time) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	left := ended.Sub(cs.cfg.Clock.Now())
	if left <= 0 {
		// Ended already: the settle is given up before it is sent (a
		// timer would end it a moment later at best, or, on a mock
		// clock, not before the clock next moves).
		cancel()
		return ctx, cancel
	}
	t := cs.cfg.Clock.AfterFunc(left, cancel)
	return ctx, func() {
		t.Stop()
		cancel()
	}
}

// settled is a closed channel: no ack waited for.
var settled = func() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// ackPoll sends held's ack with the poll for the next batch of at most n
// items (Client.ackPollSplit: one round trip) and returns the poll's
// outcome as soon as it comes, and a channel closed once the ack is
// settled: answered, or failed and made again on its own (ackNow), on a
// goroutine of its own, while the caller handles the batch the poll
// leased. Found by review (session 74): the worker waited for both
// answers, and a node that held the ack kept that batch unhandled and
// unextended, its lease running, until the old lease's end. The poll runs
// under pollCtx alone, as a poll on its own does; the ack is bounded by
// held's lease's end, as ackNow's is (found by review, session 73: a node
// that never answered the ack held the worker for good).
func (cs *consumer) ackPoll(pollCtx, settleCtx context.Context, held settle, n int) (acked <-chan struct{}, pr storage.PollResult, err error) {
	cfg := cs.cfg
	actx, stop := cs.untilEnded(settleCtx, held.ended)
	ack, pr, err := cs.c.ackPollSplit(pollCtx, actx, cfg.Queue, held.lease, held.ids, n, cfg.Lease, cfg.Wait)
	done := make(chan struct{})
	go func() {
		defer close(done)
		codes, errA := ack()
		stop()
		if errA != nil {
			// Made again on its own (at once given up, unsent, if the
			// lease has ended): notFound then means this one was applied.
			cs.ackNow(settleCtx, held, errA)
			return
		}
		cs.ackCodes(held, codes, false)
	}()
	return done, pr, err
}

// ackNow acks s on its own, if it holds anything. first is the error of
// an ack of s made before (nil: none), which failed: notFound then means
// that one was applied, and when its outcome is unknown, so is the item's
// whatever this one's error (reported wrapping ErrOutcomeUnknown).
func (cs *consumer) ackNow(ctx context.Context, s settle, first error) {
	if len(s.ids) == 0 {
		return
	}
	actx, stop := cs.untilEnded(ctx, s.ended)
	codes, err := cs.c.Ack(actx, cs.cfg.Queue, s.lease, s.ids)
	stop()
	if err != nil {
		if errors.Is(first, ErrOutcomeUnknown) && !errors.Is(err, ErrOutcomeUnknown) {
			err = fmt.Errorf("%w; made again: %w", first, err)
		}
		msg := "ack failed"
		if errors.Is(err, ErrOutcomeUnknown) {
			msg = "ack unanswered: its outcome is unknown"
		}
		cs.log.Warn(msg, "lease_id", s.lease.String(), "err", err)
		for _, id := range s.ids {
			cs.settleFailed(id, true, err)
		}
		return
	}
	cs.ackCodes(s, codes, first != nil)
}

// ackCodes warns of, and reports, every item of s the node did not ack
// (codes has one code per id: codesResult checked).
func (cs *consumer) ackCodes(s settle, codes []storage.Code, retry bool) {
	for i, code := range codes {
		if code == storage.CodeOK || i >= len(s.ids) {
			continue
		}
		if retry && code == storage.CodeNotFound {
			cs.log.Debug("ack made by the first try", "job_id", s.ids[i].String())
			continue
		}
		cs.log.Warn("ack rejected", "job_id", s.ids[i].String(), "code", code.String())
		cs.settleFailed(s.ids[i], true, codeError{code})
	}
}

func (cs *consumer) settleFailed(id storage.ItemID, ack bool, err error) {
	if cs.cfg.OnSettleFailed != nil {
		cs.cfg.OnSettleFailed(id, ack, err)
	}
}

// handleBatch runs the handler on each item of one lease, extending the
// lease every Lease/3 meanwhile: failures are nacked as they happen (so
// they are not held back by the rest of the batch); the successes are
// returned, for the caller to ack together.
func (cs *consumer) handleBatch(ctx context.Context, pr storage.PollResult, answered time.Time) settle {
	cfg, log := cs.cfg, cs.log
	hctx, cancel := context.WithCancel(context.WithValue(ctx, handlerLeaseKey{}, HandlerLease{Lease: pr.Lease, ExpiresAt: pr.ExpiresAt}))
	defer cancel()

	// lost is set before the handlers' ctx is cancelled for a lost lease,
	// so a handler that returns on that cancel finds it set.
	var lost atomic.Bool
	loseLease := func(msg string, err error) {
		log.Warn(msg, "lease_id", pr.Lease.String(), "err", err)
		lost.Store(true)
		cancel()
	}
	// The lease has surely ended, by the node's clock too, a whole Lease
	// after the answer of the last call that set it (the poll, answered
	// at answered, or an extend): past that, with no extend through (the
	// node unreachable, or its answers lost), the lease counts as lost,
	// and an extend or a nack still waiting for its answer is given up.
	var ended atomic.Int64 // UnixNano on cfg.Clock
	ended.Store(answered.Add(cfg.Lease).UnixNano())
	endedAt := func() time.Time { return time.Unix(0, ended.Load()) }
	surelyEnded := cfg.Clock.Timer(endedAt().Sub(cfg.Clock.Now()))
	ticker := cfg.Clock.Ticker(cfg.Lease / 3)
	extDone := make(chan struct{})
	// extCtx ends the extend in flight as the last handler returns: no
	// handler needs the lease any more, and the successes' ack must not
	// wait for that extend's answer (found by review, session 73: a node
	// slow to answer it held the ack up to a whole Lease, after which the
	// lease counted as lost and the ack was given up).
	extCtx, extCancel := context.WithCancel(ctx)
	defer extCancel()
	var extWG sync.WaitGroup
	extWG.Add(1)
	go func() {
		defer extWG.Done()
		defer ticker.Stop()
		defer surelyEnded.Stop()
		for {
			select {
			case <-extDone:
				return
			case <-surelyEnded.C:
				loseLease(noExtendThrough, nil)
				return
			case <-ticker.C:
				ectx, stop := cs.untilEnded(extCtx, endedAt())
				exp, err := cs.c.Extend(ectx, cfg.Queue, pr.Lease, cfg.Lease)
				stop()
				if err != nil && extCtx.Err() != nil {
					// Given up as the batch ended (extCancel): nothing
					// to report, and the lease is not lost.
					return
				}
				if cfg.OnExtend != nil {
					cfg.OnExtend(pr.Lease, exp, err)
				}
				if err == nil {
					ended.Store(cfg.Clock.Now().Add(cfg.Lease).UnixNano())
					if !surelyEnded.Stop() {
						select {
						case <-surelyEnded.C:
						default:
						}
					}
					surelyEnded.Reset(cfg.Lease)
					continue
				}
				if errors.Is(err, storage.ErrLeaseExpired) || errors.Is(err, storage.ErrLeaseMismatch) {
					loseLease("lease lost while handling", err)
					return
				}
				if !cfg.Clock.Now().Before(endedAt()) {
					loseLease(noExtendThrough, err)
					return
				}
				log.Warn("extend failed", "lease_id", pr.Lease.String(), "err", err)
			}
		}
	}()

	ok := make([]storage.ItemID, 0, len(pr.Items))
	for i := range pr.Items {
		it := pr.Items[i]
		err := callHandler(hctx, cfg.Handler, it)
		if err == nil {
			ok = append(ok, it.ID)
			continue
		}
		log.Debug("handler failed", "job_id", it.ID.String(), "err", err)
		if lost.Load() {
			// The node expired the lease and delivers the item again: a
			// nack would be refused, and there is nothing to settle.
			continue
		}
		nctx, stop := cs.untilEnded(ctx, endedAt())
		cs.nack(nctx, pr.Lease, it.ID, err)
		stop()
	}
	extCancel()
	close(extDone)
	extWG.Wait()
	return settle{lease: pr.Lease, ids: ok, ended: endedAt()}
}

// nack nacks one item whose handler failed with herr, after herr's delay
// (nackDelay). A delay the node refuses as an invalid argument (over its
// --max-delay) is dropped for the queue's backoff, so that the item is
// nacked all the same rather than left in flight without its reason.
func (cs *consumer) nack(ctx context.Context, lease storage.LeaseID, id storage.ItemID, herr error) {
	ids := []storage.ItemID{id}
	// Cut to what a node with the default --max-reason keeps (it cuts
	// longer ones itself): a handler's error text can be any size, and a
	// nack over the node's --max-message ends the connection, losing the
	// nack and every call in flight on it (found by review, session 73).
	reason := storage.Limits{}.TruncateReason(herr.Error())
	delay := nackDelay(cs.cfg, herr)
	if delay != nil {
		if refusal := cs.refusedFor(*delay); refusal != nil {
			cs.backoffNack(id, *delay, refusal)
			delay = nil
		}
	}
	codes, err := cs.c.Nack(ctx, cs.cfg.Queue, lease, ids, delay, reason)
	if delay != nil && errors.Is(err, storage.ErrInvalidArgument) {
		refused, refusal := *delay, err
		cs.backoffNack(id, refused, refusal)
		codes, err = cs.c.Nack(ctx, cs.cfg.Queue, lease, ids, nil, reason)
		if err == nil {
			// The same nack without the delay was taken: the delay was
			// what the node refused.
			cs.noteRefused(refused, refusal)
		}
	}
	if err := itemErr(codes, err); err != nil {
		cs.log.Warn("nack failed", "job_id", id.String(), "err", err, "code", codeString(codes))
		cs.settleFailed(id, false, err)
	}
}

// backoffNack logs the first refused delay and reports that id is nacked
// with the queue's backoff instead of delay.
func (cs *consumer) backoffNack(id storage.ItemID, delay time.Duration, refusal error) {
	cs.mu.Lock()
	first := !cs.warned
	cs.warned = true
	cs.mu.Unlock()
	if first {
		cs.log.Warn("the node refused a nack delay: nacking with the queue's backoff instead",
			"delay", delay, "err", refusal)
	}
	if cs.cfg.OnBackoffNack != nil {
		cs.cfg.OnBackoffNack(id, delay, refusal)
	}
}

// refusedFor returns the node's refusal of a delay no longer than d, or
// nil when none was refused.
func (cs *consumer) refusedFor(d time.Duration) error {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.refusedDelay > 0 && d >= cs.refusedDelay {
		return cs.refusedErr
	}
	return nil
}

// noteRefused records that the node refused delay d with refusal. Only a
// positive d counts: the node refuses delays over its maximum, and a
// negative one is refused by the client, which says nothing of longer
// ones.
func (cs *consumer) noteRefused(d time.Duration, refusal error) {
	if d <= 0 {
		return
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.refusedDelay == 0 || d < cs.refusedDelay {
		cs.refusedDelay, cs.refusedErr = d, refusal
	}
}

// itemErr is the outcome of settling one item: the call's error, or its
// code when not ok.
func itemErr(codes []storage.Code, err error) error {
	switch {
	case err != nil:
		return err
	case len(codes) != 1:
		return fmt.Errorf("%w: %d codes for one item", storage.ErrCorrupt, len(codes))
	case codes[0] != storage.CodeOK:
		return codeError{codes[0]}
	}
	return nil
}

// codeError is an item's code other than ok, as an error that wraps the
// matching storage error.
type codeError struct{ code storage.Code }

func (e codeError) Error() string { return "the node answered " + e.code.String() }

func (e codeError) Unwrap() error {
	switch e.code {
	case storage.CodeNotFound:
		return storage.ErrNotFound
	case storage.CodeLeaseMismatch:
		return storage.ErrLeaseMismatch
	case storage.CodeLeaseExpired:
		return storage.ErrLeaseExpired
	case storage.CodeInvalid:
		return storage.ErrInvalidArgument
	}
	return nil
}

func codeString(codes []storage.Code) string {
	if len(codes) == 0 {
		return ""
	}
	return codes[0].String()
}

// callHandler runs h, turning a panic into an error carrying its text.
func callHandler(ctx context.Context, h func(context.Context, storage.Item) error, it storage.Item) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	if err = h(ctx, it); err != nil {
		err = checkedErr(err)
	}
	return err
}

// checkedErr is err, or, when err's Error method panics (a typed nil
// pointer returned as an error, say), an error that says so: the nack's
// reason and the logs call Error on the worker's goroutine, where a panic
// would end the process.
func checkedErr(err error) (out error) {
	defer func() {
		if r := recover(); r != nil {
			out = fmt.Errorf("handler returned a %T whose Error method panicked: %v", err, r)
		}
	}()
	_ = err.Error()
	return err
}
