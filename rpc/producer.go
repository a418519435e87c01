package rpc

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/storage"
)

// ProducerOptions configures Client.Producer. Zero values take the
// defaults named below.
type ProducerOptions struct {
	// MaxBatch is the most items one enqueue call carries (0:
	// DefaultProducerBatch). It must not exceed the node's --max-batch.
	MaxBatch int
	// MaxBytes bounds the payload and dedup-key bytes of one call (0:
	// DefaultProducerBytes); an item larger than it goes alone.
	MaxBytes int
	// Linger is how long an item may wait for others to fill its call when
	// fewer than MaxBatch are pending and no call is free (0: none; items
	// pending while calls are in flight still share the next call). Go's
	// timers wait in whole milliseconds while the process has nothing else
	// to do (on Linux a 100 µs timer measured 1.08 ms), so a Linger below
	// a millisecond may act as about one.
	Linger time.Duration
	// MaxInflight is how many enqueue calls may be in flight at once (0:
	// DefaultProducerInflight).
	MaxInflight int
	// Clock runs the linger timer; required when Linger > 0.
	Clock clock.Clock
}

// Producer defaults.
const (
	DefaultProducerBatch    = 128
	DefaultProducerBytes    = 1 << 20
	DefaultProducerInflight = 2
)

// Producer coalesces concurrent single-item enqueues to one queue into
// batched enqueue calls: most applications enqueue one item at a time from
// many goroutines, and one call per item costs a round trip and a server
// call each. Items wait while MaxInflight calls are in flight (and, with
// Linger, up to Linger for company) and then leave together, in arrival
// order, up to MaxBatch items or MaxBytes per call. Each caller gets its
// own result. Safe for concurrent use; Close flushes.
type Producer struct {
	c     *Client
	queue string
	opts  ProducerOptions

	mu       sync.Mutex
	pending  []*produced
	bytes    int  // payload+dedup bytes in pending
	inflight int  // calls in flight
	due      bool // the linger of pending[0] has run out
	timer    *clock.Timer
	closed   bool
	idle     chan struct{} // closed when closed and nothing is pending or in flight

	// onCall, if set, sees the size of every call before it is sent
	// (tests).
	onCall func(n int)
}

// produced is one caller's item on its way.
type produced struct {
	item storage.EnqueueItem
	size int
	at   time.Time     // arrival (with Linger)
	done chan struct{} // closed when res/err are set
	res  storage.EnqueueResult
	err  error
}

// Producer returns a batching producer for queue. Close it to flush.
func (c *Client) Producer(queue string, opts ProducerOptions) (*Producer, error) {
	if queue == "" {
		return nil, fmt.Errorf("leaseq producer: %w: queue name is empty", storage.ErrInvalidArgument)
	}
	if opts.MaxBatch < 0 || opts.MaxBytes < 0 || opts.Linger < 0 || opts.MaxInflight < 0 {
		return nil, fmt.Errorf("leaseq producer: %w: negative option", storage.ErrInvalidArgument)
	}
	if opts.Linger > 0 && opts.Clock == nil {
		return nil, fmt.Errorf("leaseq producer: %w: Linger needs a Clock", storage.ErrInvalidArgument)
	}
	if opts.MaxBatch == 0 {
		opts.MaxBatch = DefaultProducerBatch
	}
	if opts.MaxBytes == 0 {
		opts.MaxBytes = DefaultProducerBytes
	}
	if opts.MaxInflight == 0 {
		opts.MaxInflight = DefaultProducerInflight
	}
	return &Producer{c: c, queue: queue, opts: opts, idle: make(chan struct{})}, nil
}

// Enqueue adds one item through the next batched call and waits for its
// result. The error is non-nil when the call failed (transport or
// request-level: every item of that call gets it) or when the node refused
// this item (res.Code is not CodeOK; res.Err says why). If ctx ends before
// the item was sent it is not sent; if it ends after, the item may have
// been enqueued (as with any call whose answer was not seen). The payload
// is copied: the caller may reuse its buffer once Enqueue returns.
func (p *Producer) Enqueue(ctx context.Context, it storage.EnqueueItem) (storage.EnqueueResult, error) {
	if err := ctx.Err(); err != nil {
		return storage.EnqueueResult{}, err
	}
	// What Client.Enqueue refuses for a whole call is refused here, for
	// this caller alone: not for every caller sharing its call.
	if it.Delay < 0 {
		return storage.EnqueueResult{}, fmt.Errorf("leaseq producer: %w: negative delay %v", storage.ErrInvalidArgument, it.Delay)
	}
	if err := p.c.checkSize("producer", callOverhead+len(p.queue)+len(it.Payload)+len(it.DedupKey)+64); err != nil {
		return storage.EnqueueResult{}, err
	}
	// The call is built later, on another goroutine, possibly after a
	// caller whose ctx ended has returned and reused its buffer: the
	// payload is copied now.
	it.Payload = bytes.Clone(it.Payload)
	e := &produced{item: it, size: len(it.Payload) + len(it.DedupKey), done: make(chan struct{})}
	if p.opts.Linger > 0 {
		e.at = p.opts.Clock.Now()
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return storage.EnqueueResult{}, fmt.Errorf("leaseq producer: %w", storage.ErrClosed)
	}
	p.pending = append(p.pending, e)
	p.bytes += e.size
	if len(p.pending) == 1 {
		p.rearmLocked()
	}
	p.kickLocked()
	p.mu.Unlock()

	select {
	case <-e.done:
	case <-ctx.Done():
		p.mu.Lock()
		for i, q := range p.pending {
			if q == e {
				p.pending = append(p.pending[:i], p.pending[i+1:]...)
				p.bytes -= e.size
				if i == 0 {
					// The new head may be due already, with no
					// timer left to send it.
					p.rearmLocked()
					p.kickLocked()
				}
				p.idleLocked()
				p.mu.Unlock()
				return storage.EnqueueResult{}, ctx.Err()
			}
		}
		p.mu.Unlock()
		// Already sent: the outcome is the call's.
		select {
		case <-e.done:
		default:
			return storage.EnqueueResult{}, ctx.Err()
		}
	}
	if e.err != nil {
		return e.res, e.err
	}
	if e.res.Code != storage.CodeOK {
		return e.res, fmt.Errorf("leaseq producer: item refused (%s): %s", e.res.Code, e.res.Err)
	}
	return e.res, nil
}

// Close sends every pending item, waits for the calls in flight and
// returns; later Enqueues fail with storage.ErrClosed. It does not close
// the Client.
func (p *Producer) Close() error {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		p.due = true // nothing waits for company any more
		if p.timer != nil {
			p.timer.Stop()
			p.timer = nil
		}
		p.kickLocked()
		p.idleLocked()
	}
	p.mu.Unlock()
	<-p.idle
	return nil
}

// rearmLocked sets due and the linger timer for the item now at the head
// of pending: due once it has waited Linger. REQUIRES: p.mu held.
func (p *Producer) rearmLocked() {
	if p.opts.Linger <= 0 || p.closed {
		return
	}
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	p.due = false
	if len(p.pending) == 0 {
		return
	}
	d := p.pending[0].at.Add(p.opts.Linger).Sub(p.opts.Clock.Now())
	if d <= 0 {
		p.due = true
		return
	}
	var t *clock.Timer
	t = p.opts.Clock.AfterFunc(d, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.timer != t {
			return // replaced or stopped
		}
		p.timer = nil
		p.due = true
		p.kickLocked()
	})
	p.timer = t
}

// kickLocked starts as many calls as the pending items and MaxInflight
// allow. REQUIRES: p.mu held.
func (p *Producer) kickLocked() {
	for len(p.pending) > 0 && p.inflight < p.opts.MaxInflight {
		full := len(p.pending) >= p.opts.MaxBatch || p.bytes >= p.opts.MaxBytes
		if !full && p.opts.Linger > 0 && !p.due {
			return
		}
		n, size := 0, 0
		// Within MaxBytes, and within the client's flow limit as its
		// Enqueue counts a call (the call around the items, and 64 bytes
		// an item besides the payload and key), which refuses a call over
		// it.
		for n < len(p.pending) && n < p.opts.MaxBatch && (n == 0 ||
			size+p.pending[n].size <= p.opts.MaxBytes && int64(callOverhead+len(p.queue)+size+p.pending[n].size+64*(n+1)) <= p.c.limit) {
			size += p.pending[n].size
			n++
		}
		batch := append([]*produced(nil), p.pending[:n]...)
		rest := copy(p.pending, p.pending[n:])
		clear(p.pending[rest:])
		p.pending = p.pending[:rest]
		p.bytes -= size
		p.inflight++
		p.rearmLocked() // a new head, or none
		go p.send(batch)
	}
}

// idleLocked closes idle once a closed producer has nothing left.
// REQUIRES: p.mu held.
func (p *Producer) idleLocked() {
	if p.closed && len(p.pending) == 0 && p.inflight == 0 {
		select {
		case <-p.idle:
		default:
			close(p.idle)
		}
	}
}

// send makes one enqueue call for batch and hands each caller its result.
func (p *Producer) send(batch []*produced) {
	if p.onCall != nil {
		p.onCall(len(batch))
	}
	items := make([]storage.EnqueueItem, len(batch))
	for i, e := range batch {
		items[i] = e.item
	}
	// The call belongs to every caller in it, so no caller's ctx bounds
	// it; it ends with its answer or with the connection.
	res, err := p.c.Enqueue(context.Background(), p.queue, items)
	if err == nil && len(res) != len(batch) {
		err = fmt.Errorf("leaseq producer: %w: %d results for %d items", storage.ErrCorrupt, len(res), len(batch))
	}
	for i, e := range batch {
		if err != nil {
			e.err = err
		} else {
			e.res = res[i]
		}
		close(e.done)
	}
	p.mu.Lock()
	p.inflight--
	p.kickLocked()
	p.idleLocked()
	p.mu.Unlock()
}
