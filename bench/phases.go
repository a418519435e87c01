package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/leaseq/leaseq/bench/target"
)

// stormWait is how long after the last lease could expire the rescuers
// may take before the storm row is reported incomplete: every system here
// redelivers thousands of items a second, so 30 s only runs out for a
// system that does not redeliver (beanstalkd 1.12 returns the expired
// jobs of a connected, idle consumer only a few at a time).
const stormWait = 30 * time.Second

// phaseBatch is the enqueue and poll batch of the backlog phases (drain,
// storm): the "batch 100" produce row, large enough that the
// backlog builds quickly on every system.
const phaseBatch = 100

// enqueueN writes n items to queue from `producers` clients in batches of
// phaseBatch, and returns how long it took and the enqueue-call latencies.
func enqueueN(ctx context.Context, e *env, in target.Instance, producers, n int, queue string) (time.Duration, *hdrhistogram.Histogram, error) {
	cs, err := connectAll(ctx, in, producers)
	if err != nil {
		return 0, nil, err
	}
	var next atomic.Int64
	var fail errOnce
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	hists := make([]*hdrhistogram.Histogram, len(cs))
	start := e.clk.Now()
	var wg sync.WaitGroup
	for i, c := range cs {
		hists[i] = newHist()
		wg.Add(1)
		go func(i int, c target.Client) {
			defer wg.Done()
			pm := newPayloadMaker(e.payload, e.seed, i)
			for ctx.Err() == nil {
				hi := next.Add(phaseBatch)
				lo := hi - phaseBatch
				if lo >= int64(n) {
					return
				}
				k := int64(phaseBatch)
				if hi > int64(n) {
					k = int64(n) - lo
				}
				sent := e.clk.Now()
				if err := c.Enqueue(ctx, queue, pm.batch(int(k), int64(sent.Sub(e.base)), uint64(lo))); err != nil {
					fail.set(fmt.Errorf("producer %d: %w", i, err), cancel)
					return
				}
				recordDur(hists[i], e.clk.Since(sent))
			}
		}(i, c)
	}
	wg.Wait()
	d := e.clk.Since(start)
	err = errors.Join(fail.err, closeAll(cs))
	if err == nil && ctx.Err() != nil {
		err = ctx.Err()
	}
	return d, mergeHists(hists), err
}

// incompleteError reports consumers that stopped (at their deadline)
// before every item was acked: a measurement of the system, not a harness
// failure, when the system does not redeliver in time.
type incompleteError struct {
	got, want int
	err       error
}

func (e *incompleteError) Error() string {
	return fmt.Sprintf("consumed %d of %d items before stopping: %v", e.got, e.want, e.err)
}

func (e *incompleteError) Unwrap() error { return e.err }

// seenSet records which sequence numbers were acked, so redeliveries of
// one item are counted once.
type seenSet struct {
	mu   sync.Mutex
	bits []uint64
	n    int
}

func newSeenSet(n int) *seenSet { return &seenSet{bits: make([]uint64, (n+63)/64)} }

// count returns the number of distinct items seen.
func (s *seenSet) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// add marks seqs and returns the number of distinct items seen so far.
func (s *seenSet) add(seqs []uint64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, q := range seqs {
		w, b := q/64, q%64
		if int(w) >= len(s.bits) {
			continue
		}
		if s.bits[w]&(1<<b) == 0 {
			s.bits[w] |= 1 << b
			s.n++
		}
	}
	return s.n
}

// consumeAll polls and acks queue from cs until `want` distinct items were
// acked, and returns when that happened. Consumers give up with the
// context. An ack the system answered was lost (target.LostAcks) does not
// count its items as seen; they are added to *lost.
func consumeAll(ctx context.Context, e *env, cs []target.Client, queue string, want int, e2e *hdrhistogram.Histogram, lost *atomic.Int64) (time.Time, error) {
	seen := newSeenSet(want)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var fail errOnce
	var doneAt atomic.Int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func(i int, c target.Client) {
			defer wg.Done()
			h := newHist()
			defer func() { mu.Lock(); e2e.Merge(h); mu.Unlock() }()
			for ctx.Err() == nil {
				ds, err := c.Poll(ctx, queue, phaseBatch, consumerPollWait)
				if err != nil {
					if !isStop(ctx, err) {
						fail.set(fmt.Errorf("consumer %d: poll: %w", i, err), cancel)
					}
					return
				}
				if len(ds) == 0 {
					continue
				}
				var la *target.LostAcks
				if err := c.Ack(ctx, queue, ds); err != nil && !errors.As(err, &la) {
					if !isStop(ctx, err) {
						fail.set(fmt.Errorf("consumer %d: ack: %w", i, err), cancel)
					}
					return
				}
				now := e.since()
				if la != nil {
					lost.Add(int64(la.N))
				}
				seqs := make([]uint64, 0, len(ds))
				for j, d := range ds {
					// A system that says only how many acks were lost
					// (Redis) lost them to another consumer that acked
					// those items first and counts them itself, so its
					// group is kept whole; one that says which leaves
					// those out, to be seen when they are acked again.
					if la != nil && la.Index != nil && la.Lost(j) {
						continue
					}
					if sent, seq, ok := stamp(d.Payload); ok {
						recordDur(h, time.Duration(now-sent))
						seqs = append(seqs, seq)
					}
				}
				if seen.add(seqs) >= want {
					doneAt.CompareAndSwap(0, now)
					cancel()
					return
				}
			}
		}(i, c)
	}
	wg.Wait()
	if fail.err != nil {
		return time.Time{}, fail.err
	}
	if doneAt.Load() == 0 {
		return time.Time{}, &incompleteError{got: seen.count(), want: want, err: context.Cause(ctx)}
	}
	return e.base.Add(time.Duration(doneAt.Load())), nil
}

// drainOut is what the backlog-drain workload measured.
type drainOut struct {
	enqueueTook time.Duration
	drainTook   time.Duration
	enq, e2e    *hdrhistogram.Histogram
	acksLost    int64 // acks the system answered were lost (target.LostAcks)
}

// runDrain enqueues n items, then drains them with `consumers` clients.
func runDrain(ctx context.Context, e *env, in target.Instance, producers, consumers, n int, queue string) (drainOut, error) {
	var out drainOut
	took, enq, err := enqueueN(ctx, e, in, producers, n, queue)
	if err != nil {
		return out, fmt.Errorf("fill: %w", err)
	}
	out.enqueueTook, out.enq = took, enq
	cs, err := connectAll(ctx, in, consumers)
	if err != nil {
		return out, err
	}
	out.e2e = newHist()
	start := e.clk.Now()
	var lost atomic.Int64
	done, err := consumeAll(ctx, e, cs, queue, n, out.e2e, &lost)
	out.acksLost = lost.Load()
	err = errors.Join(err, closeAll(cs))
	if err != nil {
		return out, fmt.Errorf("drain: %w", err)
	}
	out.drainTook = done.Sub(start)
	return out, nil
}

// stormOut is what the lease-expiry storm measured.
type stormOut struct {
	firstExpiry time.Time // when the first vanished lease could expire
	lastExpiry  time.Time // when the last one could
	done        time.Time // when every item had been redelivered and acked
	e2e         *hdrhistogram.Histogram
	acksLost    int64 // acks the system answered were lost (target.LostAcks)
}

// runStorm enqueues n items, lets `consumers` clients lease all of them
// and vanish (keep their connections, never ack), then measures how long
// fresh consumers take to receive and ack every item after the leases run
// out.
func runStorm(ctx context.Context, e *env, in target.Instance, producers, consumers, n int, queue string, lease time.Duration) (out stormOut, err error) {
	if _, _, err := enqueueN(ctx, e, in, producers, n, queue); err != nil {
		return out, fmt.Errorf("fill: %w", err)
	}
	ghosts, err := connectAll(ctx, in, consumers)
	if err != nil {
		return out, err
	}
	// The ghosts stay connected until the end: a consumer that hangs, not
	// one that disconnects (beanstalkd would release a closed
	// connection's jobs at once, which is not lease expiry).
	defer func() { err = errors.Join(err, closeAll(ghosts)) }()
	// Ghosts count distinct items: on a slow machine leasing everything can
	// outlast the lease, and a ghost may then take an expired item again.
	taken := newSeenSet(n)
	var first atomic.Int64 // earliest start of a Poll that leased items
	first.Store(math.MaxInt64)
	var fail errOnce
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for i, c := range ghosts {
		wg.Add(1)
		go func(i int, c target.Client) {
			defer wg.Done()
			for gctx.Err() == nil {
				// A lease starts inside Poll, so the time before the
				// call is a lower bound on it; the time after the call
				// is not, and on a slow machine an expiry computed from
				// it can fall after the rescuers have finished.
				asked := e.since()
				ds, err := c.Poll(gctx, queue, phaseBatch, 0)
				if err != nil {
					if !isStop(gctx, err) {
						fail.set(fmt.Errorf("vanishing consumer %d: poll: %w", i, err), cancel)
					}
					return
				}
				if len(ds) == 0 {
					continue
				}
				storeMin(&first, asked)
				seqs := make([]uint64, 0, len(ds))
				for _, d := range ds {
					if _, seq, ok := stamp(d.Payload); ok {
						seqs = append(seqs, seq)
					}
				}
				if taken.add(seqs) >= n {
					cancel()
					return
				}
			}
		}(i, c)
	}
	wg.Wait()
	if fail.err != nil {
		return out, fail.err
	}
	if got := taken.count(); got < n {
		return out, fmt.Errorf("vanishing consumers leased %d of %d items: %w", got, n, ctx.Err())
	}
	out.firstExpiry = e.base.Add(time.Duration(first.Load())).Add(lease)
	out.lastExpiry = e.clk.Now().Add(lease)
	rescuers, err := connectAll(ctx, in, consumers)
	if err != nil {
		return out, err
	}
	out.e2e = newHist()
	rctx, rcancel := e.clk.WithDeadline(ctx, out.lastExpiry.Add(stormWait))
	defer rcancel()
	var lost atomic.Int64
	done, err := consumeAll(rctx, e, rescuers, queue, n, out.e2e, &lost)
	out.acksLost = lost.Load()
	err = errors.Join(err, closeAll(rescuers))
	if err != nil {
		return out, fmt.Errorf("redeliver: %w", err)
	}
	out.done = done
	return out, nil
}

// storeMin lowers v to x if x is smaller.
func storeMin(v *atomic.Int64, x int64) {
	for {
		old := v.Load()
		if x >= old || v.CompareAndSwap(old, x) {
			return
		}
	}
}
