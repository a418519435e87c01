package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/bench/target"
)

// consumerPollWait is how long a consumer's poll waits for the first item.
// It is a whole second because beanstalkd's reserve timeout is whole
// seconds (a shorter wait would become a busy loop of zero timeouts).
const consumerPollWait = time.Second

// sampleEvery is the resolution of the throughput samples behind the
// per-interval numbers; progress is printed every tenth sample (1 s).
const sampleEvery = 100 * time.Millisecond

// backlogPause is how long a producer waits before re-checking the backlog
// cap: short against a poll round trip, long enough not to spin.
const backlogPause = time.Millisecond

// drainGrace is how long consumers keep going after a drain request, to
// ack what was already enqueued.
const drainGrace = 5 * time.Second

// flowSpec is a steady-state workload: producers and consumers running
// for a fixed time against one instance.
type flowSpec struct {
	row        string
	producers  int
	consumers  int
	enqBatch   int
	pollMax    int
	ackPerItem bool
	// ackPoll: consumers whose client is a target.AckPoller ack each batch
	// with the poll for the next, in one round trip (-ack-poll).
	ackPoll bool
	// rate is the total offered items/s across producers; 0 is flat out
	// (closed loop). With a rate, send times follow a fixed schedule and
	// latency is measured from the scheduled time, so a stalled system is
	// charged for the requests it delayed (no coordinated omission).
	rate       float64
	duration   time.Duration
	pickQueue  func(r *rand.Rand) string
	pollQueue  func(r *rand.Rand) string
	pollWait   time.Duration
	idleBackof time.Duration // sleep after a run of empty wait-0 polls (manyqueues)
	// maxBacklog pauses producers while enqueued-but-not-acked items
	// exceed it (0: no cap), so a flat-out run measures a steady state
	// rather than an ever-growing queue whose latency is all queueing.
	maxBacklog int64
}

// env is what one workload needs from the harness.
type env struct {
	clk      clock.Clock
	base     time.Time // payload stamps are ns since base (monotonic)
	progress io.Writer
	label    string
	drain    <-chan struct{}
	seed     int64
	payload  int
	// window, when set, is called as a timed flow's measured window
	// begins (end false) and ends (end true), so that the row's CPU is
	// read at the edges of the window its items are counted in
	// (runRow).
	window func(end bool)
}

// markWindow calls e.window if it is set.
func (e *env) markWindow(end bool) {
	if e.window != nil {
		e.window(end)
	}
}

func (e *env) since() int64 { return int64(e.clk.Since(e.base)) }

// flowOut is what a steady-state workload measured.
type flowOut struct {
	enqueued    int64
	acked       int64 // acks confirmed within the measured window
	window      time.Duration
	e2e         *hdrhistogram.Histogram
	enq         *hdrhistogram.Histogram
	samples     []int64 // acked (or enqueued, for produce-only) per sampleEvery
	polls       int64   // consumers' poll calls (AckPoll included), over the whole run
	polled      int64   // items those polls returned
	acksLost    int64   // deliveries whose ack the system answered was lost (target.LostAcks), over the whole run; not in acked
	interrupted bool
}

type errOnce struct {
	once sync.Once
	err  error
}

func (e *errOnce) set(err error, cancel context.CancelFunc) {
	e.once.Do(func() { e.err = err; cancel() })
}

// isStop reports whether err only says the run was stopped.
// Once ctx is done, any error from a call is the call being cut short
// (a context error, or a closed connection for clients that close on
// cancellation), not a failure of the system under test.
func isStop(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() != nil
}

// connectAll opens n clients; on error it closes the ones it opened.
func connectAll(ctx context.Context, in target.Instance, n int) ([]target.Client, error) {
	cs := make([]target.Client, 0, n)
	for i := 0; i < n; i++ {
		c, err := in.Connect(ctx)
		if err != nil {
			return nil, errors.Join(err, closeAll(cs))
		}
		cs = append(cs, c)
	}
	return cs, nil
}

func closeAll(cs []target.Client) error {
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// ticker samples counters every sampleEvery and prints a progress line
// every second until stop is closed.
type ticker struct {
	e        *env
	count    func() (enq, acked int64)
	produce  bool // sample enqueued instead of acked
	samples  []int64
	done     chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
}

func startTicker(e *env, produce bool, count func() (int64, int64)) *ticker {
	t := &ticker{e: e, count: count, produce: produce, done: make(chan struct{}), stop: make(chan struct{})}
	go t.loop()
	return t
}

func (t *ticker) loop() {
	defer close(t.done)
	tk := t.e.clk.Ticker(sampleEvery)
	defer tk.Stop()
	start := t.e.clk.Now()
	var last, lastPrinted int64
	n := 0
	for {
		select {
		case <-t.stop:
			return
		case <-tk.C:
		}
		enq, acked := t.count()
		cur := acked
		if t.produce {
			cur = enq
		}
		t.samples = append(t.samples, cur-last)
		last = cur
		n++
		if n%10 == 0 && t.e.progress != nil {
			fmt.Fprintf(t.e.progress, "  %-34s %5.0fs  enqueued %9d  acked %9d  %9.0f items/s\n",
				t.e.label, t.e.clk.Since(start).Seconds(), enq, acked, float64(cur-lastPrinted))
			lastPrinted = cur
		}
	}
}

func (t *ticker) finish() []int64 {
	t.stopOnce.Do(func() { close(t.stop) })
	<-t.done
	return t.samples
}

// runFlow runs a steady-state workload and measures it.
func runFlow(ctx context.Context, e *env, in target.Instance, s flowSpec) (out flowOut, err error) {
	prods, err := connectAll(ctx, in, s.producers)
	if err != nil {
		return out, err
	}
	defer func() { err = errors.Join(err, closeAll(prods)) }()
	cons, err := connectAll(ctx, in, s.consumers)
	if err != nil {
		return out, err
	}
	defer func() { err = errors.Join(err, closeAll(cons)) }()

	var enqueued, acked, ackedInWindow, polls, polled, acksLost atomic.Int64
	var seqNext atomic.Uint64
	// Producers stop at the deadline or on drain; consumers stop at the
	// deadline, or on drain once they caught up (or drainGrace passed).
	prodCtx, stopProd := context.WithCancel(ctx)
	defer stopProd()
	consCtx, stopCons := context.WithCancel(ctx)
	defer stopCons()
	var fail errOnce
	failAll := func() { stopProd(); stopCons() }

	e.markWindow(false)
	start := e.clk.Now()
	deadline := start.Add(s.duration)
	var deadlineNs atomic.Int64
	deadlineNs.Store(int64(deadline.Sub(e.base)))
	tk := startTicker(e, s.consumers == 0, func() (int64, int64) { return enqueued.Load(), acked.Load() })

	enqHists := make([]*hdrhistogram.Histogram, s.producers)
	e2eHists := make([]*hdrhistogram.Histogram, s.consumers)
	var wg sync.WaitGroup
	for i, c := range prods {
		enqHists[i] = newHist()
		wg.Add(1)
		go func(i int, c target.Client) {
			defer wg.Done()
			r := rand.New(rand.NewSource(e.seed + int64(i)*7919))
			pm := newPayloadMaker(e.payload, e.seed, i)
			var interval time.Duration
			next := start
			if s.rate > 0 {
				// Each producer owns an equal share of the offered rate and
				// starts offset by its index, so sends are spread evenly.
				interval = time.Duration(float64(time.Second) * float64(s.producers*s.enqBatch) / s.rate)
				next = start.Add(interval * time.Duration(i) / time.Duration(s.producers))
			}
			for prodCtx.Err() == nil {
				var sent time.Time
				if s.rate > 0 {
					if d := next.Sub(e.clk.Now()); d > 0 {
						select {
						case <-e.clk.After(d):
						case <-prodCtx.Done():
							return
						}
					}
					sent = next
					next = next.Add(interval)
				} else {
					sent = e.clk.Now()
				}
				if !sent.Before(deadline) {
					return
				}
				for s.maxBacklog > 0 && s.consumers > 0 && enqueued.Load()-acked.Load() > s.maxBacklog && prodCtx.Err() == nil {
					select {
					case <-e.clk.After(backlogPause):
					case <-prodCtx.Done():
					}
				}
				if s.rate == 0 {
					// Closed loop: the send time is after any back-pressure
					// pause, which is the harness's, not the system's.
					sent = e.clk.Now()
				}
				n := s.enqBatch
				seq := seqNext.Add(uint64(n)) - uint64(n)
				ps := pm.batch(n, int64(sent.Sub(e.base)), seq)
				if err := c.Enqueue(prodCtx, s.pickQueue(r), ps); err != nil {
					if isStop(prodCtx, err) {
						if s.rate > 0 {
							chargeStall(enqHists[i], sent, next, interval, deadline)
						}
						return
					}
					fail.set(fmt.Errorf("producer %d: %w", i, err), failAll)
					return
				}
				recordDur(enqHists[i], e.clk.Since(sent))
				enqueued.Add(int64(n))
			}
		}(i, c)
	}
	var cwg sync.WaitGroup
	for i, c := range cons {
		e2eHists[i] = newHist()
		cwg.Add(1)
		go func(i int, c target.Client) {
			defer cwg.Done()
			r := rand.New(rand.NewSource(e.seed + 104729 + int64(i)*7919))
			ap, _ := c.(target.AckPoller)
			if !s.ackPoll || s.ackPerItem {
				ap = nil
			}
			// settled counts a confirmed ack of g at now (ns since base).
			// The deliveries the system answered it did not ack (lost)
			// are not items done: they are counted apart, and their
			// latency is not recorded (a group's whole, when the system
			// does not say which).
			settled := func(g []target.Delivery, now int64, lost *target.LostAcks) {
				for j, d := range g {
					if lost.Lost(j) {
						continue
					}
					if sent, _, ok := stamp(d.Payload); ok {
						recordDur(e2eHists[i], time.Duration(now-sent))
					}
				}
				n := int64(len(g))
				if lost != nil {
					n -= int64(lost.N)
					acksLost.Add(int64(lost.N))
				}
				acked.Add(n)
				if now <= deadlineNs.Load() {
					ackedInWindow.Add(n)
				}
			}
			// held is the last batch polled, not yet acked: with an
			// AckPoller it is acked by the next poll of its queue.
			var held []target.Delivery
			var heldQ string
			ack := func(q string, g []target.Delivery) bool {
				var lost *target.LostAcks
				if err := c.Ack(consCtx, q, g); err != nil && !errors.As(err, &lost) {
					if !isStop(consCtx, err) {
						fail.set(fmt.Errorf("consumer %d: ack: %w", i, err), failAll)
					}
					return false
				}
				settled(g, e.since(), lost)
				return true
			}
			empty := 0
			for consCtx.Err() == nil {
				q := s.pollQueue(r)
				var ds []target.Delivery
				var err error
				if len(held) > 0 && q == heldQ {
					var at atomic.Int64
					var lost atomic.Pointer[target.LostAcks]
					ds, err = ap.AckPoll(consCtx, q, held, func(l *target.LostAcks) { lost.Store(l); at.Store(e.since()) }, s.pollMax, s.pollWait)
					if t := at.Load(); t != 0 {
						settled(held, t, lost.Load())
						held = nil
					} else if err == nil {
						err = fmt.Errorf("AckPoll returned without confirming the ack")
					}
				} else {
					if len(held) > 0 {
						if !ack(heldQ, held) {
							return
						}
						held = nil
					}
					ds, err = c.Poll(consCtx, q, s.pollMax, s.pollWait)
				}
				if err != nil {
					if isStop(consCtx, err) {
						return
					}
					fail.set(fmt.Errorf("consumer %d: poll: %w", i, err), failAll)
					return
				}
				polls.Add(1)
				polled.Add(int64(len(ds)))
				if len(ds) == 0 {
					empty++
					if s.idleBackof > 0 && empty >= 64 {
						empty = 0
						select {
						case <-e.clk.After(s.idleBackof):
						case <-consCtx.Done():
						}
					}
					continue
				}
				empty = 0
				if ap != nil {
					held, heldQ = ds, q
					continue
				}
				groups := [][]target.Delivery{ds}
				if s.ackPerItem {
					groups = groups[:0]
					for j := range ds {
						groups = append(groups, ds[j:j+1])
					}
				}
				for _, g := range groups {
					if !ack(q, g) {
						return
					}
				}
			}
		}(i, c)
	}

	// Wait for the deadline, a drain request, or a failure.
	end := deadline
	select {
	case <-e.clk.After(s.duration):
	case <-e.drain:
		out.interrupted = true
		end = e.clk.Now()
		deadlineNs.Store(int64(end.Sub(e.base)))
	case <-consCtx.Done():
	}
	e.markWindow(true)
	stopProd()
	wg.Wait()
	if out.interrupted && s.consumers > 0 {
		// Let consumers ack what producers already enqueued.
		grace := e.clk.After(drainGrace)
	catchUp:
		for acked.Load() < enqueued.Load() && consCtx.Err() == nil {
			select {
			case <-grace:
				break catchUp
			case <-e.clk.After(10 * time.Millisecond):
			}
		}
	}
	stopCons()
	cwg.Wait()
	out.samples = tk.finish()
	if fail.err != nil && ctx.Err() == nil {
		return out, fail.err
	}
	if ctx.Err() != nil {
		return out, fmt.Errorf("workload aborted: %w", ctx.Err())
	}
	out.window = end.Sub(start)
	out.enqueued = enqueued.Load()
	out.acked = ackedInWindow.Load()
	out.polls, out.polled = polls.Load(), polled.Load()
	out.acksLost = acksLost.Load()
	out.enq = mergeHists(enqHists)
	out.e2e = mergeHists(e2eHists)
	return out, nil
}

func mergeHists(hs []*hdrhistogram.Histogram) *hdrhistogram.Histogram {
	if len(hs) == 0 {
		return nil
	}
	m := newHist()
	for _, h := range hs {
		m.Merge(h)
	}
	return m
}
