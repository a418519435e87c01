// Package dispatch implements leaseq's long-poll dispatcher: a poll that finds
// no ready items parks in a per-queue FIFO of waiters until an enqueue, nack,
// redrive or the sweeper (via Notify) says the queue may have gained ready
// items, the wait ends, or the caller's context is cancelled.
//
// There is no polling loop. Each Notify wakes at most one waiter (the oldest):
// it polls the store and, if it got items, wakes the next one, because more
// may remain. A waiter whose poll comes back empty goes back to the head of
// the line. So a burst of notifications never makes every waiter hit the
// store at once (no thundering herd), and concurrent waiters on one queue
// coalesce into one claim at a time.
//
// A per-queue generation counter closes the race between "poll found
// nothing" and "register as a waiter": a notification in between bumps the
// generation and the poller retries at once instead of sleeping through it.
//
// Concurrency: all methods are safe for concurrent use. Lock order: d.mu only
// (the store is never called with d.mu held).
package dispatch

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/storage"
)

// ErrTooManyWaiters reports that a queue already has the configured maximum
// number of parked long polls.
var ErrTooManyWaiters = errors.New("dispatch: too many waiters on queue")

// Poller is the part of storage.Store the dispatcher needs.
type Poller interface {
	Poll(ctx context.Context, p storage.PollParams) (storage.PollResult, error)
}

// Config configures a Dispatcher.
type Config struct {
	Store Poller
	Clock clock.Clock
	// MaxWaitersPerQueue bounds parked polls per queue; 0 means
	// DefaultMaxWaitersPerQueue.
	MaxWaitersPerQueue int
	// MaxWaiters bounds parked polls on the whole node, plus whatever
	// Extra reports (the rpc server's subscriptions); 0 means
	// DefaultMaxWaiters.
	MaxWaiters int
	Extra      func() int
}

// DefaultMaxWaitersPerQueue is generous: a waiter costs one goroutine and a
// list element, and the limit exists to stop one client from parking
// unbounded work, not to shape normal traffic.
const DefaultMaxWaitersPerQueue = 10000

// DefaultMaxWaiters bounds parked polls (and subscriptions) on a node, so
// parking polls over many queues cannot exhaust its memory.
const DefaultMaxWaiters = 100000

// Dispatcher parks long polls and wakes them on Notify.
type Dispatcher struct {
	store      Poller
	watcher    storage.ReadyWatcher // nil unless the store is shared with other nodes
	clock      clock.Clock
	maxWaiters int        // per queue
	maxTotal   int        // per node, with extra()
	extra      func() int // waiters counted elsewhere (subscriptions)
	closed     chan struct{}
	closeOnce  sync.Once

	mu struct {
		sync.Mutex
		queues  map[string]*queueState
		waiters int // total parked, for metrics
	}
}

// queueState exists while some poll on the queue is in progress (refs > 0).
type queueState struct {
	name    string
	refs    int
	gen     uint64
	waiters list.List // of *waiter, oldest first
}

type waiter struct {
	ch   chan struct{} // buffered 1: a wake never blocks the notifier
	elem *list.Element // nil when not parked
}

// New returns a Dispatcher. Store and Clock are required.
func New(c Config) (*Dispatcher, error) {
	if c.Store == nil || c.Clock == nil {
		return nil, fmt.Errorf("dispatch: Store and Clock are required")
	}
	if c.MaxWaitersPerQueue <= 0 {
		c.MaxWaitersPerQueue = DefaultMaxWaitersPerQueue
	}
	if c.MaxWaiters <= 0 {
		c.MaxWaiters = DefaultMaxWaiters
	}
	if c.Extra == nil {
		c.Extra = func() int { return 0 }
	}
	d := &Dispatcher{store: c.Store, clock: c.Clock, maxWaiters: c.MaxWaitersPerQueue, maxTotal: c.MaxWaiters, extra: c.Extra, closed: make(chan struct{})}
	d.watcher, _ = c.Store.(storage.ReadyWatcher)
	d.mu.queues = make(map[string]*queueState)
	return d, nil
}

// Poll polls the store (p.Now is set from the clock on every attempt) and,
// when nothing is ready and wait > 0, parks until items may be ready, the
// wait ends (an empty result, not an error), ctx is done (ctx.Err()), or the
// dispatcher is closed (an empty result). Errors: the store's, ctx.Err(),
// ErrTooManyWaiters.
func (d *Dispatcher) Poll(ctx context.Context, p storage.PollParams, wait time.Duration) (storage.PollResult, error) {
	start := d.clock.Now()
	qs := d.acquire(p.Queue)
	defer d.release(qs)

	w := &waiter{ch: make(chan struct{}, 1)}
	var timer *clock.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	woken := false // we were woken by Notify and hold the "baton"
	parkedOnce := false
	for {
		d.mu.Lock()
		gen := qs.gen
		d.mu.Unlock()

		p.Now = d.clock.Now()
		res, err := d.store.Poll(ctx, p)
		if err != nil {
			if woken {
				d.wakeNext(qs)
			}
			return storage.PollResult{}, err
		}
		if len(res.Items) > 0 {
			if woken {
				// More items may remain: let the next waiter look.
				d.wakeNext(qs)
			}
			return res, nil
		}
		woken = false
		remaining := wait - d.clock.Since(start)
		if wait <= 0 || remaining <= 0 || d.isClosed() {
			return res, nil
		}

		d.mu.Lock()
		if qs.gen != gen {
			d.mu.Unlock()
			continue
		}
		if !parkedOnce && qs.waiters.Len() >= d.maxWaiters {
			d.mu.Unlock()
			return storage.PollResult{}, fmt.Errorf("%w %q (limit %d)", ErrTooManyWaiters, p.Queue, d.maxWaiters)
		}
		if !parkedOnce && d.mu.waiters+d.extra() >= d.maxTotal {
			d.mu.Unlock()
			return storage.PollResult{}, fmt.Errorf("%w: the node holds %d parked polls and subscriptions (node limit %d)", ErrTooManyWaiters, d.maxTotal, d.maxTotal)
		}
		if parkedOnce {
			// Woken but found nothing: keep our place at the head.
			w.elem = qs.waiters.PushFront(w)
		} else {
			w.elem = qs.waiters.PushBack(w)
		}
		d.mu.waiters++
		d.mu.Unlock()
		parkedOnce = true

		if timer == nil {
			timer = d.clock.Timer(remaining)
		} else {
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
			timer.Reset(remaining)
		}
		// A store shared with other nodes (fdbsync) also tells us about
		// their enqueues; a local store never needs to.
		var watch <-chan struct{}
		stopWatch := func() {}
		if d.watcher != nil {
			wctx, cancel := context.WithCancel(ctx)
			stopWatch = cancel
			if ch, err := d.watcher.WatchReady(wctx, p.Queue); err == nil {
				watch = ch
			}
		}
		select {
		case <-w.ch:
			stopWatch()
			woken = true
			continue
		case <-watch:
			stopWatch()
			d.unpark(qs, w)
			continue
		case <-timer.C:
			stopWatch()
			d.unpark(qs, w)
			return storage.PollResult{}, nil
		case <-ctx.Done():
			stopWatch()
			d.unpark(qs, w)
			return storage.PollResult{}, ctx.Err()
		case <-d.closed:
			stopWatch()
			d.unpark(qs, w)
			return storage.PollResult{}, nil
		}
	}
}

// unpark removes w from the line. If a Notify already took it off (and sent
// the wake we are not going to use), the wake is handed to the next waiter so
// it is not lost.
func (d *Dispatcher) unpark(qs *queueState, w *waiter) {
	d.mu.Lock()
	if w.elem != nil {
		qs.waiters.Remove(w.elem)
		w.elem = nil
		d.mu.waiters--
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	select {
	case <-w.ch:
		d.wakeNext(qs)
	default:
	}
}

// Notify tells the dispatcher that the named queues may have gained ready
// items. It wakes at most one waiter per queue and never blocks.
func (d *Dispatcher) Notify(queues ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, q := range queues {
		if qs, ok := d.mu.queues[q]; ok {
			qs.gen++
			d.wakeNextLocked(qs)
		}
	}
}

func (d *Dispatcher) wakeNext(qs *queueState) {
	d.mu.Lock()
	qs.gen++
	d.wakeNextLocked(qs)
	d.mu.Unlock()
}

// REQUIRES: d.mu held.
func (d *Dispatcher) wakeNextLocked(qs *queueState) {
	front := qs.waiters.Front()
	if front == nil {
		return
	}
	w := qs.waiters.Remove(front).(*waiter)
	w.elem = nil
	d.mu.waiters--
	select {
	case w.ch <- struct{}{}:
	default:
	}
}

// Waiters returns the number of parked polls.
func (d *Dispatcher) Waiters() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mu.waiters
}

// QueueWaiters returns the number of polls parked on one queue.
func (d *Dispatcher) QueueWaiters(queue string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if qs, ok := d.mu.queues[queue]; ok {
		return qs.waiters.Len()
	}
	return 0
}

// Close wakes every parked poll with an empty result; later polls never
// park. Close is idempotent.
func (d *Dispatcher) Close() {
	d.closeOnce.Do(func() { close(d.closed) })
}

func (d *Dispatcher) isClosed() bool {
	select {
	case <-d.closed:
		return true
	default:
		return false
	}
}

func (d *Dispatcher) acquire(queue string) *queueState {
	d.mu.Lock()
	defer d.mu.Unlock()
	qs, ok := d.mu.queues[queue]
	if !ok {
		qs = &queueState{name: queue}
		d.mu.queues[queue] = qs
	}
	qs.refs++
	return qs
}

func (d *Dispatcher) release(qs *queueState) {
	d.mu.Lock()
	defer d.mu.Unlock()
	qs.refs--
	if qs.refs == 0 {
		delete(d.mu.queues, qs.name)
	}
}
