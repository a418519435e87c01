package storagetest

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// HistoryConfig shapes a RunHistory run. Zero fields take defaults.
type HistoryConfig struct {
	// Workers is the number of goroutines polling, acking, nacking and
	// extending (default 4).
	Workers int
	// Items is how many items are enqueued up front (default 400).
	Items int
	// Seed seeds the workers' choices (0: -storagetest.seed if given, else
	// random; logged either way). Goroutine scheduling is not
	// seeded, so a seed does not replay a history exactly.
	Seed uint64
	// MaxAttempts is the queue's max_attempts (default 3): low, so some
	// items die by nack and by expiry.
	MaxAttempts uint32
	// Polls is how many polls each worker makes before the final drain
	// (default 2*Items/Workers).
	Polls int
}

func (c HistoryConfig) withDefaults() HistoryConfig {
	if c.Workers <= 0 {
		c.Workers = 4
	}
	if c.Items <= 0 {
		c.Items = 400
	}
	if c.Seed == 0 {
		c.Seed = *seedFlag
	}
	if c.Seed == 0 {
		c.Seed = rand.Uint64() >> 1
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = 3
	}
	if c.Polls <= 0 {
		c.Polls = 2 * c.Items / c.Workers
	}
	return c
}

// event is one entry of the recorded history. Now is relative to base.
type event struct {
	Seq      int64         `json:"seq"` // order of completion
	Worker   int           `json:"worker"`
	Op       string        `json:"op"`
	Item     string        `json:"item,omitempty"`
	Lease    string        `json:"lease,omitempty"`
	Now      time.Duration `json:"now"`
	Attempts uint32        `json:"attempts,omitempty"`
	Expires  time.Duration `json:"expires,omitempty"`
	Result   string        `json:"result,omitempty"`
}

// logicalClock is the shared fake time of a history run: every read
// advances it, so it is monotonic and independent of wall time.
type logicalClock struct{ n atomic.Int64 }

func (c *logicalClock) tick(d time.Duration) time.Time {
	return base.Add(time.Duration(c.n.Add(int64(d))))
}

// advanceTo moves the clock to t unless it is already later, and returns
// the clock's time.
func (c *logicalClock) advanceTo(t time.Time) time.Time {
	want := int64(t.Sub(base))
	for {
		cur := c.n.Load()
		if cur >= want {
			return base.Add(time.Duration(cur))
		}
		if c.n.CompareAndSwap(cur, want) {
			return t
		}
	}
}

type historyRun struct {
	t     *testing.T
	cfg   HistoryConfig
	f     *fixture
	ctx   context.Context
	lim   storage.Limits
	queue string
	clk   logicalClock
	seq   atomic.Int64

	mu     sync.Mutex
	events []event
	errs   []string
}

// RunHistory runs a concurrency history check: c.Workers goroutines poll,
// ack, nack and extend at random on one shared store while another
// goroutine sweeps, all on a shared logical clock; then the leftovers are
// drained. The recorded history must show: at most one holder per item at
// any instant (deliveries of an item never overlap: the next starts no
// earlier than the previous one ended by ack, nack or lease expiry), no
// delivery after a successful ack, no success under a lease that was not
// the item's current one, every item finally acked or dead, counters
// consistent with the history, and Check OK. On failure the history is
// written as JSON to a temp file (and, with h.DataDir, the data directory
// is copied) and the paths are logged. It must pass under -race.
func RunHistory(t *testing.T, h Harness, c HistoryConfig) {
	c = c.withDefaults()
	t.Logf("RunHistory seed %d: %d workers, %d items, %d polls each (replay choices: -storagetest.seed=%d)", c.Seed, c.Workers, c.Items, c.Polls, c.Seed)
	r := &historyRun{t: t, cfg: c, ctx: context.Background(), lim: h.limits(), queue: "history"}
	r.f = newFixture(t, h)
	r.setup()
	r.runWorkers()
	r.drain()
	r.verify()
}

func (r *historyRun) record(e event) {
	e.Seq = r.seq.Add(1)
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *historyRun) fail(format string, args ...any) {
	r.mu.Lock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

func (r *historyRun) setup() {
	cfg := storage.DefaultQueueConfig()
	cfg.MaxAttempts = r.cfg.MaxAttempts
	cfg.LeaseDuration = r.lim.MinLease
	// Short backoff, so nacked items come back within the run.
	cfg.BackoffBase = time.Millisecond
	cfg.BackoffMax = 20 * time.Millisecond
	r.f.setConfig(r.queue, cfg)
	now := r.clk.tick(0)
	for n := 0; n < r.cfg.Items; {
		k := min(r.cfg.Items-n, r.lim.MaxBatch, 100)
		items := make([]storage.EnqueueItem, k)
		for i := range items {
			items[i] = storage.EnqueueItem{Payload: []byte(fmt.Sprintf("h%d", n+i))}
		}
		for _, id := range r.f.enqueueIDs(r.queue, now, items...) {
			r.record(event{Op: "enqueue", Item: id.String(), Now: now.Sub(base)})
		}
		n += k
	}
}

func (r *historyRun) runWorkers() {
	var wg sync.WaitGroup
	kick := make(chan struct{}, 1)
	stop := make(chan struct{})
	var sweeper sync.WaitGroup
	sweeper.Add(1)
	go func() {
		defer sweeper.Done()
		r.sweeper(kick, stop)
	}()
	for w := 0; w < r.cfg.Workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			r.worker(w, kick)
		}(w)
	}
	wg.Wait()
	close(stop)
	sweeper.Wait()
}

// sweeper sweeps once per kick from a worker: paced by the workers, never
// spinning on its own.
func (r *historyRun) sweeper(kick <-chan struct{}, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-kick:
		}
		now := r.clk.tick(0)
		res, err := r.f.s.Sweep(r.ctx, storage.SweepParams{Now: now, Limit: 8})
		if err != nil {
			r.fail("sweep at %v: %v", now.Sub(base), err)
			return
		}
		if res.LeasesExpired+res.Promoted > 0 {
			r.record(event{Worker: -1, Op: "sweep", Now: now.Sub(base),
				Result: fmt.Sprintf("leases=%d requeued=%d dead=%d promoted=%d", res.LeasesExpired, res.Requeued, res.DeadLettered, res.Promoted)})
		}
	}
}

func (r *historyRun) worker(w int, kick chan<- struct{}) {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, uint64(w)))
	step := func() time.Duration { return time.Duration(rng.Int64N(int64(3 * time.Millisecond))) }
	var stale storage.LeaseID
	for i := 0; i < r.cfg.Polls; i++ {
		select {
		case kick <- struct{}{}:
		default:
		}
		lease := r.lim.MinLease + time.Duration(rng.Int64N(int64(2*r.lim.MinLease)))
		now := r.clk.tick(step())
		p, err := r.f.s.Poll(r.ctx, storage.PollParams{Queue: r.queue, Max: 1 + rng.IntN(8), Lease: lease, Now: now})
		if err != nil {
			r.fail("worker %d poll: %v", w, err)
			return
		}
		if len(p.Items) == 0 {
			r.clk.tick(10 * time.Millisecond) // let delayed items and leases come due
			continue
		}
		for _, it := range p.Items {
			r.record(event{Worker: w, Op: "poll", Item: it.ID.String(), Lease: p.Lease.String(), Now: now.Sub(base),
				Attempts: it.Attempts, Expires: p.ExpiresAt.Sub(base)})
		}
		var ack, nack []storage.ItemID
		for _, it := range p.Items {
			switch x := rng.IntN(100); {
			case x < 55:
				ack = append(ack, it.ID)
			case x < 75:
				nack = append(nack, it.ID)
			case x < 85:
				// forget: the lease expires and the sweeper requeues it
			default:
				// a stale token from an earlier poll must not succeed
				if !stale.IsZero() {
					r.ackWith(w, stale, now, "stale-ack", []storage.ItemID{it.ID})
				}
				ack = append(ack, it.ID)
			}
		}
		if rng.IntN(5) == 0 {
			now := r.clk.tick(step())
			exp, err := r.f.s.ExtendLease(r.ctx, storage.ExtendParams{Queue: r.queue, Lease: p.Lease, Duration: lease, Now: now})
			e := event{Worker: w, Op: "extend", Lease: p.Lease.String(), Now: now.Sub(base)}
			if err == nil {
				e.Expires = exp.Sub(base)
				e.Result = "ok"
			} else {
				e.Result = errClass(err)
			}
			r.record(e)
		}
		if len(ack) > 0 {
			now := r.clk.tick(step())
			if rng.IntN(8) == 0 {
				// A slow handler: ack right around the lease's expiry,
				// where a store that judges liveness wrongly is caught.
				now = r.clk.advanceTo(p.ExpiresAt.Add(time.Duration(rng.Int64N(int64(4*time.Millisecond))) - 2*time.Millisecond))
			}
			r.ackWith(w, p.Lease, now, "ack", ack)
		}
		if len(nack) > 0 {
			now := r.clk.tick(step())
			var delay *time.Duration
			if rng.IntN(2) == 0 {
				d := time.Duration(rng.Int64N(int64(30 * time.Millisecond)))
				delay = &d
			}
			codes, err := r.f.s.Nack(r.ctx, storage.NackParams{Queue: r.queue, Lease: p.Lease, IDs: nack, Delay: delay, Reason: "history", Now: now})
			if err != nil {
				r.fail("worker %d nack: %v", w, err)
				return
			}
			for i, id := range nack {
				r.record(event{Worker: w, Op: "nack", Item: id.String(), Lease: p.Lease.String(), Now: now.Sub(base), Result: codes[i].String()})
			}
		}
		stale = p.Lease
	}
}

func (r *historyRun) ackWith(w int, lease storage.LeaseID, now time.Time, op string, ids []storage.ItemID) {
	codes, err := r.f.s.Ack(r.ctx, storage.AckParams{Queue: r.queue, Lease: lease, IDs: ids, Now: now})
	if err != nil {
		r.fail("worker %d %s: %v", w, op, err)
		return
	}
	for i, id := range ids {
		r.record(event{Worker: w, Op: op, Item: id.String(), Lease: lease.String(), Now: now.Sub(base), Result: codes[i].String()})
	}
}

// drain jumps far ahead, sweeps everything due, and acks whatever is left.
func (r *historyRun) drain() {
	t := r.t
	now := r.clk.tick(time.Hour)
	for round := 0; ; round++ {
		require.Less(t, round, 10*r.cfg.Items+100, "drain does not terminate")
		res := r.f.sweep(now, 1000)
		if res.LeasesExpired+res.Promoted > 0 {
			r.record(event{Worker: -1, Op: "sweep", Now: now.Sub(base),
				Result: fmt.Sprintf("leases=%d requeued=%d dead=%d promoted=%d", res.LeasesExpired, res.Requeued, res.DeadLettered, res.Promoted)})
		}
		if res.More {
			continue
		}
		p := r.f.poll(r.queue, r.lim.MaxBatch, time.Minute, now)
		if len(p.Items) == 0 {
			return
		}
		for _, it := range p.Items {
			r.record(event{Worker: -2, Op: "poll", Item: it.ID.String(), Lease: p.Lease.String(), Now: now.Sub(base),
				Attempts: it.Attempts, Expires: p.ExpiresAt.Sub(base)})
		}
		r.ackWith(-2, p.Lease, now, "ack", ids(p.Items))
	}
}

// delivery is one poll of one item, with what ended it.
type delivery struct {
	poll    event
	lease   string
	expires time.Duration // after the last successful extend
	endedBy string        // "ack", "nack" or "" (expiry)
	endedAt time.Duration
}

func (r *historyRun) verify() {
	t := r.t
	sort.Slice(r.events, func(i, j int) bool { return r.events[i].Seq < r.events[j].Seq })
	bad := append([]string(nil), r.errs...)
	violate := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }

	// Records are appended after each call returns, so their order is
	// only roughly the order of the calls; nothing below depends on it
	// except extends of one lease, which one worker makes in sequence.
	enqueued := map[string]bool{}
	byLease := map[string][]*delivery{}
	perItem := map[string][]*delivery{}
	var nDeliveries, nAcks, nNacks uint64
	for _, e := range r.events {
		switch e.Op {
		case "enqueue":
			enqueued[e.Item] = true
		case "poll":
			nDeliveries++
			if e.Attempts > r.cfg.MaxAttempts {
				violate("seq %d: item %s delivered with attempts %d > max %d", e.Seq, e.Item, e.Attempts, r.cfg.MaxAttempts)
			}
			d := &delivery{poll: e, lease: e.Lease, expires: e.Expires}
			byLease[e.Lease] = append(byLease[e.Lease], d)
			perItem[e.Item] = append(perItem[e.Item], d)
		}
	}
	for _, e := range r.events {
		if e.Op == "extend" && e.Result == "ok" {
			for _, d := range byLease[e.Lease] {
				d.expires = e.Expires
			}
		}
	}
	for _, e := range r.events {
		if (e.Op != "ack" && e.Op != "nack" && e.Op != "stale-ack") || e.Result != storage.CodeOK.String() {
			continue
		}
		op := e.Op
		if op == "stale-ack" {
			op = "ack"
		}
		var cur *delivery
		for _, d := range perItem[e.Item] {
			if d.lease == e.Lease {
				cur = d
			}
		}
		if cur == nil {
			violate("seq %d: %s of %s succeeded under lease %s, which never delivered it", e.Seq, e.Op, e.Item, e.Lease)
			continue
		}
		if cur.endedBy != "" {
			violate("seq %d: %s of %s succeeded after its delivery (lease %s) was already ended by %s", e.Seq, e.Op, e.Item, e.Lease, cur.endedBy)
			continue
		}
		if e.Now >= cur.expires {
			violate("seq %d: %s of %s succeeded at %v, at or after its lease expiry %v", e.Seq, e.Op, e.Item, e.Now, cur.expires)
		}
		cur.endedBy, cur.endedAt = op, e.Now
		if op == "ack" {
			nAcks++
		} else {
			nNacks++
		}
	}

	acked := map[string]bool{}
	for item, ds := range perItem {
		sort.Slice(ds, func(i, j int) bool { return ds[i].poll.Attempts < ds[j].poll.Attempts })
		for i, d := range ds {
			if d.poll.Attempts != uint32(i+1) {
				violate("item %s: delivery %d (seq %d) has attempts %d: two holders or a lost delivery", item, i+1, d.poll.Seq, d.poll.Attempts)
			}
			if d.endedBy == "ack" {
				if acked[item] {
					violate("item %s acked twice", item)
				}
				acked[item] = true
			}
			if i == 0 {
				continue
			}
			prev := ds[i-1]
			end := prev.expires
			if prev.endedBy == "nack" {
				end = prev.endedAt
			}
			if prev.endedBy == "ack" {
				violate("item %s: delivered again (seq %d, lease %s) after a successful ack", item, d.poll.Seq, d.lease)
			}
			if d.poll.Now < end {
				violate("item %s: delivered at %v under lease %s while the previous holder (lease %s) held it until %v",
					item, d.poll.Now, d.lease, prev.lease, end)
			}
		}
	}

	dead := map[string]bool{}
	var after storage.ItemID
	for {
		page := r.f.deadList(r.queue, after, r.lim.MaxBatch)
		if len(page) == 0 {
			break
		}
		for _, d := range page {
			dead[d.ID.String()] = true
			if d.Attempts != r.cfg.MaxAttempts {
				violate("dead item %s has attempts %d, want max %d", d.ID, d.Attempts, r.cfg.MaxAttempts)
			}
		}
		after = page[len(page)-1].ID
	}
	for item := range enqueued {
		switch {
		case acked[item] && dead[item]:
			violate("item %s is both acked and dead", item)
		case !acked[item] && !dead[item]:
			violate("item %s ended neither acked nor dead", item)
		}
	}

	st := r.f.stats(r.queue, r.clk.tick(0))
	if got := gauges(st); got != (counts{Dead: int64(len(dead))}) {
		now := r.clk.tick(0)
		res, err := r.f.s.Sweep(r.ctx, storage.SweepParams{Now: now, Limit: 1000})
		violate("final gauges %+v, want only Dead=%d; one more Sweep at %v (after the drain) gives %+v, %v",
			got, len(dead), now.Sub(base), res, err)
	}
	want := lifetime{Enqueued: uint64(len(enqueued)), Delivered: nDeliveries, Acked: nAcks, Nacked: nNacks,
		Expired: nDeliveries - nAcks - nNacks, DeadLettered: uint64(len(dead))}
	if got := counters(st); got != want {
		violate("final counters %+v, want %+v (from the history)", got, want)
	}
	rep, err := r.f.s.Check(r.ctx)
	if err != nil {
		violate("check: %v", err)
	} else {
		for _, v := range rep.Violations {
			violate("check: %s", v)
		}
	}
	t.Logf("history: %d events, %d deliveries, %d acked, %d nacks, %d dead", len(r.events), nDeliveries, len(acked), nNacks, len(dead))
	if len(bad) > 0 {
		r.dump(bad)
		shown := bad[:min(len(bad), 20)]
		t.Fatalf("%d history violations (seed %d), the first %d:\n%s", len(bad), r.cfg.Seed, len(shown), strings.Join(shown, "\n"))
	}
}

// dump writes the history and violations to a temp file that outlives the
// test, and copies the store's data directory when the harness exposes it.
func (r *historyRun) dump(bad []string) {
	t := r.t
	f, err := os.CreateTemp("", "leaseq-history-*.json")
	if err != nil {
		t.Logf("cannot write the history: %v", err)
		return
	}
	enc := json.NewEncoder(f)
	enc.SetIndent("", " ")
	err = enc.Encode(struct {
		Seed       uint64        `json:"seed"`
		Config     HistoryConfig `json:"config"`
		Violations []string      `json:"violations"`
		Events     []event       `json:"events"`
	}{r.cfg.Seed, r.cfg, bad, r.events})
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	t.Logf("history written to %s (write error: %v)", f.Name(), err)
	if r.f.h.DataDir == nil {
		return
	}
	src := r.f.h.DataDir(r.f.s)
	dst, err := os.MkdirTemp("", "leaseq-history-data-*")
	if err == nil {
		err = copyDir(src, dst)
	}
	t.Logf("data directory %s copied to %s (error: %v)", src, dst, err)
}

func copyDir(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(target, b, 0o644)
	})
}
