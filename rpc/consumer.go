package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/storage"
)

// ConsumerConfig configures Client.Consume.
type ConsumerConfig struct {
	Queue   string
	Workers int           // concurrent pollers, each handling its batch in order (0: 1)
	Batch   int           // items per poll (0: 1)
	Lease   time.Duration // per poll, at least 1ms (0: storage.DefaultLeaseDuration); extended every Lease/3 while handlers run
	Wait    time.Duration // long-poll wait (0: DefaultConsumerWait)
	// Handler processes one item. nil error acks it; an error or a panic
	// nacks it with the error text or "panic: <value>" as the reason. Its
	// ctx is cancelled if the lease is lost (the item may be redelivered
	// elsewhere), not when Consume's ctx is: in-flight items finish.
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
// The nack reason is err's text.
func RetryAfter(d time.Duration, err error) error {
	return &retryAfterError{delay: d, err: err}
}

type retryAfterError struct {
	delay time.Duration
	err   error
}

func (r *retryAfterError) Error() string { return r.err.Error() }
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
	return n
}

// give returns n reserved items that were not delivered.
func (b *itemBudget) give(n int) {
	if b == nil || n <= 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
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
// the other workers drain the same way and Consume returns the first error.
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
		cfg.Lease = storage.DefaultLeaseDuration
	}
	if cfg.Wait <= 0 {
		cfg.Wait = DefaultConsumerWait
	}
	if cfg.Logger == nil {
		cfg.Logger = discardLogger()
	}
	log := cfg.Logger.With("svc", "consumer", "queue", cfg.Queue)

	var budget *itemBudget
	if cfg.MaxItems > 0 {
		budget = &itemBudget{left: cfg.MaxItems}
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
			if err := c.consumeLoop(pollCtx, ctx, cfg, budget, log); err != nil {
				errOnce.Do(func() { firstErr = err })
				stop()
			}
		}()
	}
	wg.Wait()
	return firstErr
}

// consumeLoop is one worker. pollCtx stops polling; parent carries values
// for the handlers and settles (its cancellation does not cut them short).
// A worker that finds budget spent ends: the items left are reserved by
// workers still polling, which handle them. The successes of a batch are
// acked with the poll for the next (Client.ackPoll: one round trip, and
// on a --sync=always node one fsync, for both); the last batch's when the
// worker ends.
func (c *Client) consumeLoop(pollCtx, parent context.Context, cfg ConsumerConfig, budget *itemBudget, log *slog.Logger) error {
	settleCtx := context.WithoutCancel(parent)
	var held settle // the last batch's successes, not yet acked
	defer func() { c.ackNow(settleCtx, cfg, log, held) }()
	for pollCtx.Err() == nil {
		n := budget.take(cfg.Batch)
		if n == 0 {
			return nil
		}
		var pr storage.PollResult
		var err error
		if len(held.ids) > 0 {
			var codes []storage.Code
			var errA error
			codes, errA, pr, err = c.ackPoll(pollCtx, cfg.Queue, held.lease, held.ids, n, cfg.Lease, cfg.Wait)
			if errA != nil {
				// The ack's outcome is unknown: ack again on its own (an
				// item acked already answers notFound).
				c.ackNow(settleCtx, cfg, log, held)
			} else {
				logAckCodes(log, held, codes)
			}
			held = settle{}
		} else {
			pr, err = c.Poll(pollCtx, cfg.Queue, n, cfg.Lease, cfg.Wait)
		}
		budget.give(n - len(pr.Items))
		if len(pr.Items) > 0 {
			// Leased even when the call also failed: handle them.
			held = c.handleBatch(settleCtx, cfg, log, pr)
		}
		if err != nil {
			if pollCtx.Err() != nil {
				return nil
			}
			return err
		}
	}
	return nil
}

// settle is the items of one lease to ack.
type settle struct {
	lease storage.LeaseID
	ids   []storage.ItemID
}

// ackNow acks s on its own, if it holds anything.
func (c *Client) ackNow(ctx context.Context, cfg ConsumerConfig, log *slog.Logger, s settle) {
	if len(s.ids) == 0 {
		return
	}
	codes, err := c.Ack(ctx, cfg.Queue, s.lease, s.ids)
	if err != nil {
		log.Warn("ack failed", "lease_id", s.lease.String(), "err", err)
		return
	}
	logAckCodes(log, s, codes)
}

// logAckCodes warns of every item the node did not ack.
func logAckCodes(log *slog.Logger, s settle, codes []storage.Code) {
	for i, code := range codes {
		if code != storage.CodeOK && i < len(s.ids) {
			log.Warn("ack rejected", "job_id", s.ids[i].String(), "code", code.String())
		}
	}
}

// handleBatch runs the handler on each item of one lease, extending the
// lease every Lease/3 meanwhile: failures are nacked as they happen (so
// they are not held back by the rest of the batch); the successes are
// returned, for the caller to ack together.
func (c *Client) handleBatch(ctx context.Context, cfg ConsumerConfig, log *slog.Logger, pr storage.PollResult) settle {
	hctx, cancel := context.WithCancel(context.WithValue(ctx, handlerLeaseKey{}, HandlerLease{Lease: pr.Lease, ExpiresAt: pr.ExpiresAt}))
	defer cancel()

	ticker := cfg.Clock.Ticker(cfg.Lease / 3)
	extDone := make(chan struct{})
	var extWG sync.WaitGroup
	extWG.Add(1)
	go func() {
		defer extWG.Done()
		defer ticker.Stop()
		for {
			select {
			case <-extDone:
				return
			case <-ticker.C:
				exp, err := c.Extend(ctx, cfg.Queue, pr.Lease, cfg.Lease)
				if cfg.OnExtend != nil {
					cfg.OnExtend(pr.Lease, exp, err)
				}
				if err != nil {
					if errors.Is(err, storage.ErrLeaseExpired) || errors.Is(err, storage.ErrLeaseMismatch) {
						log.Warn("lease lost while handling", "lease_id", pr.Lease.String(), "err", err)
						cancel()
						return
					}
					log.Warn("extend failed", "lease_id", pr.Lease.String(), "err", err)
				}
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
		codes, nerr := c.Nack(ctx, cfg.Queue, pr.Lease, []storage.ItemID{it.ID}, nackDelay(cfg, err), err.Error())
		if nerr != nil || codes[0] != storage.CodeOK {
			log.Warn("nack failed", "job_id", it.ID.String(), "err", nerr, "code", codeString(codes))
		}
	}
	close(extDone)
	extWG.Wait()
	return settle{lease: pr.Lease, ids: ok}
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
	return h(ctx, it)
}
