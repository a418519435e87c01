package leaseqt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/bench/target"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/memstore"
	"github.com/leaseq/leaseq/storage/rocksstore"
	"github.com/leaseq/leaseq/sweeper"
)

// Backends of InProcess.
const (
	BackendRocks = "rocks"
	BackendMem   = "mem"
)

// sweepCap is the sweeper's SweepInterval: its longest sleep when no
// deadline is known (deadlines normally wake it earlier).
const sweepCap = 100 * time.Millisecond

// sweepLimit is SweepParams.Limit: large enough that a lease storm of
// thousands of leases drains in a few passes, small enough that one pass
// is one modest transaction.
const sweepLimit = 1000

// InProcess is a leaseq Store in the harness's own process.
type InProcess struct {
	Backend string // BackendRocks or BackendMem
	Sync    rocksstore.SyncMode
}

// Name implements target.System.
func (p InProcess) Name() string {
	if p.Backend == BackendMem {
		return "leaseq-inproc-mem"
	}
	return "leaseq-inproc-" + p.Sync.String()
}

// Family implements target.System.
func (InProcess) Family() string { return "leaseq" }

// Durability implements target.System.
func (p InProcess) Durability() target.Durability {
	switch {
	case p.Backend == BackendMem:
		return target.Durability{Class: target.ClassMemory, Mode: "memory only (baseline)"}
	case p.Sync == rocksstore.SyncAlways && procsFromEnv():
		return target.Durability{Class: target.ClassDurable, Mode: "WAL fsync, group commit"}
	case p.Sync == rocksstore.SyncAlways:
		return target.Durability{Class: target.ClassDurable, Mode: "WAL fsync, group commit; GOMAXPROCS CPUs+1"}
	}
	return target.Durability{Class: target.ClassRelaxed, Mode: "WAL, no fsync"}
}

// keepFreedMemory calls rocksstore.KeepFreedMemory once per process: the
// settings outlive every row, so later rows need not make them again.
var keepFreedMemory = sync.OnceValue(rocksstore.KeepFreedMemory)

// Available implements target.System: the store is linked in.
func (InProcess) Available() error { return nil }

// Start implements target.System.
func (p InProcess) Start(ctx context.Context, o target.StartOptions) (target.Instance, error) {
	in := &inprocInstance{clk: o.Clock, lease: o.Lease}
	in.ready.ch = make(chan struct{})
	// The store reports new deadlines from its first commit on; the
	// sweeper exists only after the store is open (Notify is a no-op on
	// nil).
	var sw atomic.Pointer[sweeper.Sweeper]
	onDeadline := func(t time.Time) { sw.Load().Notify(t) }
	switch p.Backend {
	case BackendMem:
		in.store = memstore.New(memstore.Options{OnDeadline: onDeadline})
	case BackendRocks:
		// As `leaseq serve` does for itself, and rocksstore suggests to an
		// application embedding a store: malloc keeps the memory of flushed
		// memtables for the next ones. Process-wide and never undone; of
		// the harness's rows only the in-process ones allocate from C.
		keepFreedMemory()
		dir := filepath.Join(o.Dir, "data")
		// Now times the store's fsyncs, as `leaseq serve` has it do.
		s, err := rocksstore.Open(dir, rocksstore.Options{Sync: p.Sync, OnDeadline: onDeadline, Now: o.Clock.Now})
		if err != nil {
			return nil, fmt.Errorf("leaseqt: open rocksstore: %w", err)
		}
		in.store = s
		in.raised = raiseProcs(p.Sync)
	default:
		return nil, fmt.Errorf("leaseqt: unknown backend %q", p.Backend)
	}
	// The node's own sweeper, as `leaseq serve` runs it.
	s, err := sweeper.New(sweeper.Config{
		Store: in.store, Clock: o.Clock, Logger: slog.New(slog.DiscardHandler),
		BatchLimit: sweepLimit, SweepInterval: sweepCap,
		OnReady: func(queues []string) {
			in.broadcast()
			if f := in.onReady.Load(); f != nil {
				(*f)(queues)
			}
		},
	})
	if err != nil {
		_ = in.closeStore()
		return nil, fmt.Errorf("leaseqt: sweeper: %w", err)
	}
	// Its life is the instance's (Close stops it), not Start's ctx.
	if err := s.Start(context.Background()); err != nil {
		_ = in.closeStore()
		return nil, fmt.Errorf("leaseqt: start sweeper: %w", err)
	}
	sw.Store(s)
	in.sweeper = s
	return in, nil
}

type inprocInstance struct {
	store   storage.Store
	sweeper *sweeper.Sweeper
	clk     clock.Clock
	lease   time.Duration
	ready   struct {
		sync.Mutex
		ch chan struct{} // closed and replaced when items may have become ready
	}
	// onReady, when set, is also told which queues the sweeper made ready
	// (the loopback RPC server's dispatcher).
	onReady   atomic.Pointer[func([]string)]
	closeOnce sync.Once
	closeErr  error
	raised    bool // raiseProcs raised GOMAXPROCS for this instance
}

// procs counts the SyncAlways stores of InProcess open while GOMAXPROCS
// is raised for them: an instance runs its store the way
// rocksstore.SuggestedProcs suggests to an application embedding one (and
// `leaseq serve --sync=always` runs), with one P more than Go's default,
// unless the GOMAXPROCS variable sets it. The last such instance to close
// restores what it was.
var procs struct {
	sync.Mutex
	open int
	prev int // GOMAXPROCS before the first
}

// procsFromEnv reports whether the GOMAXPROCS variable sets the Ps, so
// that raiseProcs leaves them alone.
func procsFromEnv() bool { return os.Getenv("GOMAXPROCS") != "" }

// raiseProcs raises GOMAXPROCS as SuggestedProcs says for a store of
// mode and reports whether lowerProcs must undo it.
func raiseProcs(mode rocksstore.SyncMode) bool {
	if procsFromEnv() {
		return false
	}
	procs.Lock()
	defer procs.Unlock()
	base := runtime.GOMAXPROCS(0)
	if procs.open > 0 {
		base = procs.prev
	}
	n := rocksstore.SuggestedProcs(mode, base)
	if n == base {
		return false
	}
	if procs.open == 0 {
		procs.prev = base
		runtime.GOMAXPROCS(n)
	}
	procs.open++
	return true
}

// lowerProcs undoes one raiseProcs.
func lowerProcs() {
	procs.Lock()
	defer procs.Unlock()
	if procs.open--; procs.open == 0 {
		runtime.GOMAXPROCS(procs.prev)
	}
}

// closeStore closes the store and gives back what raiseProcs raised.
func (in *inprocInstance) closeStore() error {
	err := in.store.Close()
	if in.raised {
		in.raised = false
		lowerProcs()
	}
	return err
}

// readyCh returns the channel the next readiness broadcast closes.
func (in *inprocInstance) readyCh() <-chan struct{} {
	in.ready.Lock()
	defer in.ready.Unlock()
	return in.ready.ch
}

func (in *inprocInstance) broadcast() {
	in.ready.Lock()
	defer in.ready.Unlock()
	close(in.ready.ch)
	in.ready.ch = make(chan struct{})
}

func (in *inprocInstance) setOnReady(f func([]string)) { in.onReady.Store(&f) }

func (in *inprocInstance) PID() int { return os.Getpid() }

// Counters implements target.Counters for a RocksDB store: its WAL
// fsyncs (a row's items over them is its items per fsync) and the seconds
// they took (over the row's seconds: how busy the WAL's fsyncs kept it),
// the batches it committed, and its write stalls (seconds its commits
// waited for flushes and compactions to catch up).
func (in *inprocInstance) Counters() map[string]float64 {
	s, ok := in.store.(*rocksstore.Store)
	if !ok {
		return nil
	}
	m := s.Metrics()
	return map[string]float64{
		counterFsyncs:    float64(m.WALSyncs),
		counterFsyncTime: m.SyncTime.Seconds(),
		counterCommits:   float64(m.Commits),
		counterStall:     m.WriteStall.Seconds(),
		counterTaken:     float64(m.PrefetchHits),
	}
}

// The names of the store's counters in a row's notes, the same in process
// and over RPC.
const (
	counterFsyncs    = "wal_fsyncs"
	counterFsyncTime = "wal_fsync_s"
	counterCommits   = "commits"
	counterStall     = "write_stall_s"
	// counterTaken counts polls answered with a batch their consumer's
	// ack claimed ahead, without an fsync of their own (sync=always).
	counterTaken = "prefetch_taken"
)

func (in *inprocInstance) Close() error {
	in.closeOnce.Do(func() {
		// The sweeper stops first; the store's Close reports what
		// closing found.
		in.sweeper.Stop()
		in.closeErr = in.closeStore()
	})
	return in.closeErr
}

func (in *inprocInstance) Connect(context.Context) (target.Client, error) {
	return &inprocClient{in: in}, nil
}

type inprocClient struct {
	in    *inprocInstance
	items []storage.EnqueueItem
}

// handle is a leaseq delivery receipt: the poll's lease and the item id.
type handle struct {
	lease storage.LeaseID
	id    storage.ItemID
}

func (c *inprocClient) Close() error { return nil }

func (c *inprocClient) Enqueue(ctx context.Context, queue string, payloads [][]byte) error {
	c.items = c.items[:0]
	for _, p := range payloads {
		// The harness reuses its payload buffers; a store may keep the
		// slice (memstore does), so hand it a copy, as RPC would.
		c.items = append(c.items, storage.EnqueueItem{Payload: bytes.Clone(p)})
	}
	res, err := c.in.store.Enqueue(ctx, storage.EnqueueParams{Queue: queue, Items: c.items, Now: c.in.clk.Now()})
	if err != nil {
		return fmt.Errorf("leaseqt: enqueue: %w", err)
	}
	if err := enqueueCodes(res); err != nil {
		return err
	}
	c.in.broadcast()
	return nil
}

func enqueueCodes(res []storage.EnqueueResult) error {
	for i, r := range res {
		if r.Code != storage.CodeOK {
			return fmt.Errorf("leaseqt: enqueue item %d: %v: %s", i, r.Code, r.Err)
		}
	}
	return nil
}

func (c *inprocClient) Poll(ctx context.Context, queue string, max int, wait time.Duration) ([]target.Delivery, error) {
	var deadline time.Time
	if wait > 0 {
		deadline = c.in.clk.Now().Add(wait)
	}
	for {
		// Take the wake-up channel before polling, so an enqueue between
		// the poll and the wait is not missed.
		ch := c.in.readyCh()
		res, err := c.in.store.Poll(ctx, storage.PollParams{Queue: queue, Max: max, Lease: c.in.lease, Now: c.in.clk.Now()})
		if err != nil {
			return nil, fmt.Errorf("leaseqt: poll: %w", err)
		}
		if len(res.Items) > 0 || wait <= 0 {
			return deliveries(res), nil
		}
		left := c.in.clk.Until(deadline)
		if left <= 0 {
			return nil, nil
		}
		select {
		case <-ch:
		case <-c.in.clk.After(left):
		case <-ctx.Done():
			return nil, fmt.Errorf("leaseqt: poll: %w", ctx.Err())
		}
	}
}

func deliveries(res storage.PollResult) []target.Delivery {
	ds := make([]target.Delivery, len(res.Items))
	for i, it := range res.Items {
		ds[i] = target.Delivery{Payload: it.Payload, Handle: handle{lease: res.Lease, id: it.ID}}
	}
	return ds
}

// byLease groups ids by lease, keeping first-seen order, with each id's
// index in ds (at); a poll batch has one lease, so this is normally one
// group.
func byLease(ds []target.Delivery) (order []storage.LeaseID, ids map[storage.LeaseID][]storage.ItemID, at map[storage.LeaseID][]int) {
	ids, at = map[storage.LeaseID][]storage.ItemID{}, map[storage.LeaseID][]int{}
	for i, d := range ds {
		h := d.Handle.(handle)
		if _, ok := ids[h.lease]; !ok {
			order = append(order, h.lease)
		}
		ids[h.lease] = append(ids[h.lease], h.id)
		at[h.lease] = append(at[h.lease], i)
	}
	return order, ids, at
}

// ackCodes checks an ack's codes, at being each code's delivery index.
// The codes an at-least-once consumer meets when its lease ran out (the
// item went to someone else, or was acked by them) are not a failure,
// but neither are they an ack: they go into lost (target.LostAcks), so
// the harness does not count those items as done. Anything else is a
// harness or server bug.
func ackCodes(codes []storage.Code, at []int, lost *target.LostAcks) error {
	for i, code := range codes {
		switch code {
		case storage.CodeOK:
		case storage.CodeLeaseExpired, storage.CodeLeaseMismatch, storage.CodeNotFound:
			lost.N++
			lost.Index = append(lost.Index, at[i])
		default:
			return fmt.Errorf("leaseqt: ack id %d: %v", i, code)
		}
	}
	return nil
}

// lostOrNil is lost as Ack's error: nil when no ack was lost.
func lostOrNil(lost *target.LostAcks) error {
	if lost.N == 0 {
		return nil
	}
	return lost
}

// lostOrNone is lost as AckPoll's acked argument: nil when no ack was
// lost.
func lostOrNone(lost *target.LostAcks) *target.LostAcks {
	if lost.N == 0 {
		return nil
	}
	return lost
}

func (c *inprocClient) Ack(ctx context.Context, queue string, ds []target.Delivery) error {
	order, m, at := byLease(ds)
	var lost target.LostAcks
	for _, l := range order {
		codes, err := c.in.store.Ack(ctx, storage.AckParams{Queue: queue, Lease: l, IDs: m[l], Now: c.in.clk.Now()})
		if err != nil {
			return fmt.Errorf("leaseqt: ack: %w", err)
		}
		if err := ackCodes(codes, at[l], &lost); err != nil {
			return err
		}
	}
	return lostOrNil(&lost)
}

// AckPoll implements target.AckPoller: on a store that completes calls
// asynchronously (rocksstore) the ack and a poll that does not wait are
// handed to its commit pipeline together, inside a hold on its fsyncs
// where it has one (storage.SyncHolder), so both share a commit's fsync
// as a connection's reader makes a pipelined pair share one. When that
// poll finds nothing, a plain Poll waits.
func (c *inprocClient) AckPoll(ctx context.Context, queue string, ack []target.Delivery, acked func(*target.LostAcks), max int, wait time.Duration) ([]target.Delivery, error) {
	as, ok := c.in.store.(storage.Async)
	order, m, at := byLease(ack)
	if !ok || len(order) != 1 {
		return ackThenPoll(ctx, c, queue, ack, acked, max, wait)
	}
	type polled struct {
		res storage.PollResult
		err error
	}
	acks, polls := make(chan error, 1), make(chan polled, 1)
	holder, hold := as.(storage.SyncHolder)
	if hold {
		holder.HoldSync()
	}
	now := c.in.clk.Now()
	as.AckAsync(ctx, storage.AckParams{Queue: queue, Lease: order[0], IDs: m[order[0]], Now: now}, func(codes []storage.Code, err error) {
		var lost target.LostAcks
		if err != nil {
			err = fmt.Errorf("leaseqt: ack: %w", err)
		} else if err = ackCodes(codes, at[order[0]], &lost); err == nil {
			acked(lostOrNone(&lost))
		}
		acks <- err
	})
	as.PollAsync(ctx, storage.PollParams{Queue: queue, Max: max, Lease: c.in.lease, Now: now}, func(res storage.PollResult, err error) {
		polls <- polled{res, err}
	})
	if hold {
		holder.ReleaseSync()
	}
	p := <-polls
	if err := errors.Join(<-acks, p.err); err != nil {
		return deliveries(p.res), err
	}
	if len(p.res.Items) == 0 && wait > 0 {
		return c.Poll(ctx, queue, max, wait)
	}
	return deliveries(p.res), nil
}

// ackThenPoll is AckPoll the plain way, one call after the other: for a
// store that cannot take both at once, or deliveries of several leases.
func ackThenPoll(ctx context.Context, c target.Client, queue string, ack []target.Delivery, acked func(*target.LostAcks), max int, wait time.Duration) ([]target.Delivery, error) {
	var lost *target.LostAcks
	if err := c.Ack(ctx, queue, ack); err != nil && !errors.As(err, &lost) {
		return nil, err
	}
	acked(lost)
	return c.Poll(ctx, queue, max, wait)
}
