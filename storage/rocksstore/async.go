package rocksstore

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"

	"github.com/leaseq/leaseq/storage"
)

// The asynchronous calls (storage.Async): the same ops as Enqueue,
// EnqueueClaim, Poll and Ack, handed to the commit pipeline without
// waiting there. Each reports through a done callback, which runs on the
// goroutine that completes the op: the syncer goroutine after the fsync
// that made it durable (SyncAlways), a leader once its batch is written
// (SyncNone), or the caller's own goroutine when the call fails or has
// nothing to write. A server's connection reader hands a call over this
// way and goes back to reading, and the goroutine that fsynced answers
// every call its fsync covered: no goroutine is woken per call
// (rpc/lean_calls.go, docs/BENCHMARKS.md).

var _ storage.Async = (*Store)(nil)

// submitAsync hands ops to the pipeline as submitGroup does and returns
// without waiting; done runs once they are all complete (durable under
// the sync policy), on the goroutine that completes the last of them.
// The caller that finds nobody leading leads, but never fsyncs: it leaves
// the fsync to the syncer goroutines, so that it can go back to its own
// work. REQUIRES: s.life held shared (enter); done releases it.
func (s *Store) submitAsync(queue string, ops []*op, done func()) {
	left := opsLeft(len(ops))
	for _, o := range ops {
		o.wake = nil
		o.done = func() {
			if o.err != nil && errors.Is(o.err, storage.ErrCorrupt) {
				s.noteCorrupt(queue, o.err)
			}
			if left == nil || left.Add(-1) == 0 {
				done()
			}
		}
	}
	if s.pipe.skipLoneYield {
		s.pipe.crowded() // an asynchronous call ends a run of lone ones
	}
	lead, err := s.pend(ops)
	if err != nil {
		for _, o := range ops {
			o.err = err
		}
		done()
		return
	}
	if lead {
		s.leadAsync()
	}
}

// opsLeft returns the count of a group's ops still to complete, nil for
// one op (most calls), which has nothing to count. (One assignment, so
// that submitAsync's closures capture the pointer by value.)
func opsLeft(n int) *atomic.Int32 {
	if n == 1 {
		return nil
	}
	left := new(atomic.Int32)
	left.Store(int32(n))
	return left
}

// EnqueueAsync implements storage.Async.
func (s *Store) EnqueueAsync(ctx context.Context, p storage.EnqueueParams, done func([]storage.EnqueueResult, error)) {
	if err := s.enter("enqueue"); err != nil {
		done(nil, err)
		return
	}
	queue := p.Queue // captured instead of p, which would move to the heap
	fail := func(err error) { done(nil, fmt.Errorf("rocksstore: enqueue %q: %w", queue, err)) }
	res, valid, fn, err := s.enqueueOp(ctx, p)
	if err != nil || fn == nil {
		s.exit()
		if err != nil {
			fail(err)
			return
		}
		done(res, nil)
		return
	}
	o := &op{apply: fn, items: valid}
	s.submitAsync(p.Queue, []*op{o}, s.doneOne(o, fail, func() { done(res, nil) }))
}

// EnqueueClaimAsync implements storage.Async.
func (s *Store) EnqueueClaimAsync(ctx context.Context, p storage.EnqueueParams, polls []storage.PollParams, done func([]storage.EnqueueResult, []storage.PollResult, error)) {
	if err := s.enter("enqueue"); err != nil {
		done(nil, nil, err)
		return
	}
	c, err := s.enqueueClaimOps(ctx, p, polls)
	if err != nil || c.enq == nil {
		s.exit()
		done(c.res, c.prs, err)
		return
	}
	s.submitAsync(p.Queue, c.ops, func() {
		res, prs, err := s.enqueueClaimDone(p, polls, c)
		s.exit()
		done(res, prs, err)
	})
}

// PollAsync implements storage.Async.
func (s *Store) PollAsync(ctx context.Context, p storage.PollParams, done func(storage.PollResult, error)) {
	if err := s.enter("poll"); err != nil {
		done(storage.PollResult{}, err)
		return
	}
	queue := p.Queue // captured instead of p, which would move to the heap
	fail := func(err error) { done(storage.PollResult{}, fmt.Errorf("rocksstore: poll %q: %w", queue, err)) }
	res, fn, err := s.pollOp(ctx, p)
	if err != nil || fn == nil {
		s.exit()
		if err != nil {
			fail(err)
			return
		}
		if res != nil { // answered with a batch claimed ahead (prefetch.go)
			s.polled(*res)
			done(*res, nil)
			return
		}
		done(storage.PollResult{}, nil)
		return
	}
	o := &op{apply: fn, items: p.Max}
	s.submitAsync(p.Queue, []*op{o}, func() {
		if o.err == nil {
			s.polled(*res)
		}
		s.exit()
		if o.err != nil {
			fail(o.err)
			return
		}
		done(*res, nil)
	})
}

// AckAsync implements storage.Async.
func (s *Store) AckAsync(ctx context.Context, p storage.AckParams, done func([]storage.Code, error)) {
	if err := s.enter("ack"); err != nil {
		done(nil, err)
		return
	}
	q, codes, fn, err := s.ackOp(ctx, p)
	if err != nil || fn == nil {
		s.exit()
		done(codes, err)
		return
	}
	queue := p.Queue // captured instead of p, which would move to the heap
	fail := func(err error) { done(nil, fmt.Errorf("rocksstore: ack %q: %w", queue, err)) }
	if s.prefetchHold() > 0 {
		fn, aheadFn, plan := s.withPrefetch(q, p.Lease, nanos(p.Now), fn)
		o, ahead := &op{apply: fn, items: len(p.IDs)}, &op{apply: aheadFn}
		s.submitAsync(p.Queue, []*op{o, ahead}, func() {
			s.prefetchDone(plan, o.err == nil && ahead.err == nil)
			if ahead.err == nil && !ahead.next.IsZero() && s.onDeadline != nil {
				s.onDeadline(ahead.next)
			}
			s.doneOne(o, fail, func() { done(codes, nil) })()
		})
		return
	}
	o := &op{apply: fn, items: len(p.IDs)}
	s.submitAsync(p.Queue, []*op{o}, s.doneOne(o, fail, func() { done(codes, nil) }))
}

// doneOne returns the done of a call made of the one op o: it announces
// o's earliest new deadline, releases the store (exit), and reports o's
// error to fail, or its success to ok.
func (s *Store) doneOne(o *op, fail func(error), ok func()) func() {
	return func() {
		if o.err == nil && !o.next.IsZero() && s.onDeadline != nil {
			s.onDeadline(o.next)
		}
		s.exit()
		if o.err != nil {
			fail(o.err)
			return
		}
		ok()
	}
}

var _ storage.SyncHolder = (*Store)(nil)

// HoldSync implements storage.SyncHolder: until the matching ReleaseSync,
// batches are written as ever but no syncer starts an fsync, so the ops a
// connection's reader hands over from one read (a pipelined ack and poll)
// wait for the same fsync instead of the ack's starting alone and the
// poll's waiting for the next. A synchronous caller that finds nobody
// fsyncing still fsyncs inline, which covers the held batches too.
func (s *Store) HoldSync() {
	p := &s.pipe
	p.mu.Lock()
	p.holds++
	p.mu.Unlock()
}

// ReleaseSync implements storage.SyncHolder: the last release starts the
// fsync of what was written meanwhile, unless a leader is still writing
// (it starts it when it is done). A lead handed on and not yet taken
// counts as nobody writing.
func (s *Store) ReleaseSync() {
	p := &s.pipe
	p.mu.Lock()
	if p.holds <= 0 {
		p.mu.Unlock()
		panic("rocksstore: ReleaseSync without HoldSync")
	}
	p.holds--
	kicked := !p.heldLocked() && (!p.leading || p.handedOff) && p.kickLocked()
	p.mu.Unlock()
	if kicked {
		// As a leader that wakes the syncer: give way to it (leadBatches).
		runtime.Gosched()
	}
}
