package storagetest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/memstore"
)

var (
	seedFlag = flag.Uint64("storagetest.seed", 0, "replay this one seed in RunModel and RunHistory (0: the default seeds)")
	opsFlag  = flag.Int("storagetest.ops", 0, "operations per RunModel seed (0: the default)")
)

// modelSeeds are always run, so CI is reproducible; one more random seed
// adds coverage over time (it is logged for replay).
var modelSeeds = []uint64{1, 2}

const defaultModelOps = 2500

// RunModel applies seeded random operation sequences to a store from h.New
// and to a memstore reference model, and compares every result step by
// step. Ids and lease tokens differ between stores, so results are
// compared with ids and tokens replaced by their position in issue order.
// Nacks always carry an explicit delay, so the stores' jitter does not
// matter. With h.Reopen set the store is reopened now and then. The seed is
// logged; -storagetest.seed=N replays one seed and -storagetest.ops=N sets
// the sequence length.
func RunModel(t *testing.T, h Harness) {
	seeds := append([]uint64(nil), modelSeeds...)
	seeds = append(seeds, rand.Uint64()>>1) // >>1: readable in the log
	if *seedFlag != 0 {
		seeds = []uint64{*seedFlag}
	}
	ops := defaultModelOps
	if *opsFlag > 0 {
		ops = *opsFlag
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			t.Logf("RunModel seed %d, %d ops (replay: -run '%s' -storagetest.seed=%d)", seed, ops, t.Name(), seed)
			m := newModelRun(t, h, seed)
			for m.step = 0; m.step < ops; m.step++ {
				m.randomOp()
			}
			m.finalCompare()
		})
	}
}

// side is one of the two stores with its id and token translation.
type side struct {
	store  func() storage.Store
	ids    []storage.ItemID
	idx    map[storage.ItemID]int
	leases []storage.LeaseID
	lidx   map[storage.LeaseID]int
	// pending ids and tokens first seen in the current op's results; they
	// get the next positions and are committed when both sides agree.
	pendIDs    []storage.ItemID
	pendLeases []storage.LeaseID
}

func newSide(store func() storage.Store) *side {
	return &side{store: store, idx: map[storage.ItemID]int{}, lidx: map[storage.LeaseID]int{}}
}

// id translates an id to its position; -1 for the zero id.
func (sd *side) id(id storage.ItemID) int {
	if id.IsZero() {
		return -1
	}
	if i, ok := sd.idx[id]; ok {
		return i
	}
	for j, p := range sd.pendIDs {
		if p == id {
			return len(sd.ids) + j
		}
	}
	sd.pendIDs = append(sd.pendIDs, id)
	return len(sd.ids) + len(sd.pendIDs) - 1
}

// lease translates a token to its position; -1 for the zero token.
func (sd *side) lease(l storage.LeaseID) int {
	if l.IsZero() {
		return -1
	}
	if i, ok := sd.lidx[l]; ok {
		return i
	}
	for j, p := range sd.pendLeases {
		if p == l {
			return len(sd.leases) + j
		}
	}
	sd.pendLeases = append(sd.pendLeases, l)
	return len(sd.leases) + len(sd.pendLeases) - 1
}

func (sd *side) commit() {
	for _, id := range sd.pendIDs {
		sd.idx[id] = len(sd.ids)
		sd.ids = append(sd.ids, id)
	}
	for _, l := range sd.pendLeases {
		sd.lidx[l] = len(sd.leases)
		sd.leases = append(sd.leases, l)
	}
	sd.pendIDs, sd.pendLeases = nil, nil
}

// idAt returns the id at position i, or a bogus id for i < 0 or unknown.
func (sd *side) idAt(i int) storage.ItemID {
	if i >= 0 && i < len(sd.ids) {
		return sd.ids[i]
	}
	return bogusID
}

// leaseAt returns the token at position i; i == -1 is the zero token and
// i == -2 a forged one.
func (sd *side) leaseAt(i int) storage.LeaseID {
	switch {
	case i >= 0 && i < len(sd.leases):
		return sd.leases[i]
	case i == -2:
		return forgedLease
	}
	return storage.LeaseID{}
}

var (
	// bogusID is never issued: ids are increasing from a small start in
	// every backend we know of. It stands for "an id that never existed".
	bogusID = storage.ItemID{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe}
	// forgedLease was never issued by any store.
	forgedLease = storage.LeaseID{0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}
)

// Normalised outcomes: what both stores must agree on.
type (
	nItem struct {
		ID                    int
		Queue                 string
		Payload               string
		Priority              uint8
		Attempts, MaxAttempts uint32
		EnqueuedAt, VisibleAt time.Duration
		DedupKey, LastError   string
		State                 storage.State
	}
	nDead struct {
		nItem
		Reason string
		DeadAt time.Duration
	}
	nEnqueue struct {
		Code      storage.Code
		ID        int
		Duplicate bool
		HasErr    bool
	}
	nPoll struct {
		Lease     int
		ExpiresAt time.Duration
		Items     []nItem
	}
	nSweep struct {
		LeasesExpired, Requeued, DeadLettered, Promoted, DedupDropped int
		ReadyQueues                                                   []string
		Next                                                          time.Duration
	}
)

// rel expresses an instant relative to base; zero stays recognisable.
func rel(t time.Time) time.Duration {
	if t.IsZero() {
		return math.MinInt64
	}
	return t.Sub(base)
}

func errClass(err error) string {
	for _, c := range []struct {
		err  error
		name string
	}{
		{storage.ErrNotFound, "not_found"},
		{storage.ErrLeaseMismatch, "lease_mismatch"},
		{storage.ErrLeaseExpired, "lease_expired"},
		{storage.ErrInvalidArgument, "invalid_argument"},
		{storage.ErrClosed, "closed"},
		{storage.ErrCorrupt, "corrupt"},
		{storage.ErrNotEmpty, "not_empty"},
	} {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	if err != nil {
		return "other: " + err.Error()
	}
	return ""
}

func (sd *side) item(it storage.Item) nItem {
	return nItem{
		ID: sd.id(it.ID), Queue: it.Queue, Payload: string(it.Payload), Priority: it.Priority,
		Attempts: it.Attempts, MaxAttempts: it.MaxAttempts,
		EnqueuedAt: rel(it.EnqueuedAt), VisibleAt: rel(it.VisibleAt),
		DedupKey: it.DedupKey, LastError: it.LastError, State: it.State,
	}
}

func (sd *side) items(its []storage.Item) []nItem {
	out := make([]nItem, len(its))
	for i, it := range its {
		out[i] = sd.item(it)
	}
	return out
}

// leaseInfo is what the generator knows about an issued lease.
type leaseInfo struct {
	queue   string
	items   []int
	expires time.Time // after the last successful extend
}

type modelRun struct {
	t    *testing.T
	seed uint64
	rng  *rand.Rand
	ctx  context.Context
	lim  storage.Limits
	sut  *fixture
	ref  *memstore.Store
	a, b *side // reference, store under test
	now  time.Time
	step int
	// recent keeps the last operations for the failure message.
	recent []string
	// generator knowledge, from the reference's results
	idQueue  []string
	leaseInf []leaseInfo
	instants []time.Time
	queues   []string
	reopens  int
	// tally counts outcomes by kind, logged at the end to show that the
	// sequence reached the interesting cases.
	tally map[string]int
}

func newModelRun(t *testing.T, h Harness, seed uint64) *modelRun {
	m := &modelRun{
		t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		ctx: context.Background(), lim: h.limits(), now: base,
		queues: []string{"q0", "q1", "q2"},
		tally:  map[string]int{},
	}
	m.sut = newFixture(t, h)
	m.ref = memstore.New(memstore.Options{Limits: m.lim})
	t.Cleanup(func() { _ = m.ref.Close() })
	m.a = newSide(func() storage.Store { return m.ref })
	m.b = newSide(func() storage.Store { return m.sut.s })
	return m
}

// compare runs op on both stores, requires equal outcomes, and commits
// the new ids and tokens.
func (m *modelRun) compare(desc string, op func(sd *side) any) any {
	m.t.Helper()
	m.recent = append(m.recent, fmt.Sprintf("step %d (time %v): %s", m.step, m.now.Sub(base), desc))
	if len(m.recent) > 25 {
		m.recent = m.recent[1:]
	}
	ra := op(m.a)
	rb := op(m.b)
	require.Equal(m.t, ra, rb, "seed %d step %d: %s: the store (second) differs from the reference (first)\nrecent ops:\n%s",
		m.seed, m.step, desc, strings.Join(m.recent, "\n"))
	m.a.commit()
	m.b.commit()
	return ra
}

func (m *modelRun) queue() string {
	// q2 is rare, so it is often empty or unknown.
	if m.rng.IntN(10) == 0 {
		return m.queues[2]
	}
	return m.queues[m.rng.IntN(2)]
}

func (m *modelRun) randomOp() {
	m.t.Helper()
	type weighted struct {
		w  int
		fn func()
	}
	ops := []weighted{
		{14, m.opEnqueue},
		{16, m.opPoll},
		{16, m.opAck},
		{8, m.opNack},
		{5, m.opExtend},
		{14, m.opAdvance},
		{8, m.opSweep},
		{4, m.opStats},
		{4, m.opPeek},
		{3, m.opDeadList},
		{2, m.opRedrive},
		{1, m.opPurgeDead},
		{1, m.opSetConfig},
		{1, m.opCheck},
	}
	if m.rng.IntN(300) == 0 {
		m.opPurge()
		return
	}
	if m.rng.IntN(400) == 0 {
		m.opDeleteQueue()
		return
	}
	if m.sut.h.Reopen != nil && m.rng.IntN(150) == 0 {
		m.opReopen()
		return
	}
	total := 0
	for _, o := range ops {
		total += o.w
	}
	n := m.rng.IntN(total)
	for _, o := range ops {
		if n < o.w {
			o.fn()
			return
		}
		n -= o.w
	}
}

// callNow is the Now of a call: usually the current time, sometimes a bit
// earlier, as from a caller that read the clock before another call ran.
func (m *modelRun) callNow() time.Time {
	if m.rng.IntN(20) == 0 {
		return m.now.Add(-time.Duration(m.rng.Int64N(int64(500 * time.Millisecond))))
	}
	return m.now
}

// nowNote describes a call's Now when it is not the current time.
func (m *modelRun) nowNote(now time.Time) string {
	if now.Equal(m.now) {
		return ""
	}
	return fmt.Sprintf(" (called with now %v)", now.Sub(base))
}

func (m *modelRun) remember(t time.Time) {
	if t.After(m.now) {
		m.instants = append(m.instants, t)
	}
}

func (m *modelRun) opEnqueue() {
	q := m.queue()
	n := 1 + m.rng.IntN(4)
	items := make([]storage.EnqueueItem, n)
	for i := range items {
		it := storage.EnqueueItem{Payload: []byte(fmt.Sprintf("s%d.%d", m.step, i))}
		if m.rng.IntN(2) == 0 {
			switch m.rng.IntN(4) {
			case 0:
				it.Delay = time.Nanosecond
			case 1:
				it.Delay = time.Second
			default:
				it.Delay = time.Duration(m.rng.Int64N(int64(3 * time.Second)))
			}
		}
		it.Priority = uint8(m.rng.IntN(3))
		if m.rng.IntN(4) == 0 {
			it.DedupKey = fmt.Sprintf("k%d", m.rng.IntN(6))
		}
		if m.rng.IntN(7) == 0 {
			it.MaxAttempts = uint32(1 + m.rng.IntN(3))
		}
		if m.rng.IntN(30) == 0 {
			switch m.rng.IntN(3) {
			case 0:
				it.Delay = m.lim.MaxDelay + time.Nanosecond
			case 1:
				it.Delay = -time.Nanosecond
			default:
				it.DedupKey = strings.Repeat("x", m.lim.MaxDedupKey+1)
			}
		}
		items[i] = it
	}
	now := m.callNow()
	out := m.compare(fmt.Sprintf("enqueue %s %+v", q, items)+m.nowNote(now), func(sd *side) any {
		res, err := sd.store().Enqueue(m.ctx, storage.EnqueueParams{Queue: q, Items: items, Now: now})
		var out []nEnqueue
		for _, r := range res {
			out = append(out, nEnqueue{r.Code, sd.id(r.ID), r.Duplicate, r.Err != ""})
		}
		return struct {
			Res []nEnqueue
			Err string
		}{out, errClass(err)}
	}).(struct {
		Res []nEnqueue
		Err string
	})
	m.tally["enqueue error "+out.Err]++
	for i, r := range out.Res {
		m.tally[fmt.Sprintf("enqueue %v duplicate=%v", r.Code, r.Duplicate)]++
		if r.Code == storage.CodeOK && !r.Duplicate {
			for len(m.idQueue) <= r.ID {
				m.idQueue = append(m.idQueue, "")
			}
			m.idQueue[r.ID] = q
			m.remember(now.Add(items[i].Delay))
			if items[i].DedupKey != "" {
				if cfg, err := m.ref.QueueConfig(m.ctx, q); err == nil {
					m.remember(now.Add(cfg.DedupWindow))
				}
			}
		}
	}
}

func (m *modelRun) leaseDuration() time.Duration {
	switch m.rng.IntN(10) {
	case 0, 1, 2:
		return 0
	case 3:
		return m.lim.MinLease
	default:
		return m.lim.MinLease + time.Duration(m.rng.Int64N(int64(5*time.Second)))
	}
}

func (m *modelRun) opPoll() {
	q := m.queue()
	max := 1 + m.rng.IntN(5)
	lease := m.leaseDuration()
	if m.rng.IntN(50) == 0 { // a rejected call
		if m.rng.IntN(2) == 0 {
			max = 0
		} else {
			lease = m.lim.MinLease - 1
		}
	}
	now := m.callNow()
	out := m.compare(fmt.Sprintf("poll %s max=%d lease=%v", q, max, lease)+m.nowNote(now), func(sd *side) any {
		res, err := sd.store().Poll(m.ctx, storage.PollParams{Queue: q, Max: max, Lease: lease, Now: now})
		np := nPoll{Lease: sd.lease(res.Lease), Items: sd.items(res.Items)}
		if !res.Lease.IsZero() {
			np.ExpiresAt = rel(res.ExpiresAt)
		}
		return struct {
			P   nPoll
			Err string
		}{np, errClass(err)}
	}).(struct {
		P   nPoll
		Err string
	})
	m.tally[fmt.Sprintf("poll items=%v error=%s", len(out.P.Items) > 0, out.Err)]++
	if out.P.Lease >= 0 {
		info := leaseInfo{queue: q, expires: base.Add(out.P.ExpiresAt)}
		for _, it := range out.P.Items {
			info.items = append(info.items, it.ID)
		}
		for len(m.leaseInf) <= out.P.Lease {
			m.leaseInf = append(m.leaseInf, leaseInfo{})
		}
		m.leaseInf[out.P.Lease] = info
		m.remember(base.Add(out.P.ExpiresAt))
	}
}

// pickLease returns a lease position (-1 zero token, -2 forged), biased to
// recent leases, and the queue to present it in.
func (m *modelRun) pickLease() (int, string) {
	n := len(m.leaseInf)
	r := m.rng.IntN(100)
	switch {
	case n == 0 || r < 5:
		return -1, m.queue()
	case r < 15:
		return -2, m.queue()
	case r < 35:
		// The lease whose expiry is nearest to now: where a store that
		// judges liveness off by one is caught.
		best := 0
		for i := range m.leaseInf {
			if absDur(m.leaseInf[i].expires.Sub(m.now)) < absDur(m.leaseInf[best].expires.Sub(m.now)) {
				best = i
			}
		}
		return best, m.maybeOtherQueue(m.leaseInf[best].queue)
	case r < 75:
		i := n - 1 - m.rng.IntN(min(n, 6))
		return i, m.maybeOtherQueue(m.leaseInf[i].queue)
	default:
		i := m.rng.IntN(n)
		return i, m.maybeOtherQueue(m.leaseInf[i].queue)
	}
}

func absDur(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}

func (m *modelRun) maybeOtherQueue(q string) string {
	if m.rng.IntN(12) == 0 {
		return m.queue()
	}
	return q
}

// pickIDs returns item positions for lease l: mostly its own items, some
// others, some that never existed (-1).
func (m *modelRun) pickIDs(l int) []int {
	var own []int
	if l >= 0 {
		own = m.leaseInf[l].items
	}
	n := 1 + m.rng.IntN(4)
	var out []int
	for len(out) < n {
		r := m.rng.IntN(100)
		switch {
		case r < 70 && len(own) > 0:
			out = append(out, own[m.rng.IntN(len(own))])
		case r < 92 && len(m.idQueue) > 0:
			out = append(out, m.rng.IntN(len(m.idQueue)))
		default:
			out = append(out, -1)
		}
	}
	return out
}

func (m *modelRun) opAck() {
	l, q := m.pickLease()
	pos := m.pickIDs(l)
	now := m.callNow()
	out := m.compare(fmt.Sprintf("ack %s lease#%d ids%v", q, l, pos)+m.nowNote(now), func(sd *side) any {
		codes, err := sd.store().Ack(m.ctx, storage.AckParams{Queue: q, Lease: sd.leaseAt(l), IDs: sd.idsAt(pos), Now: now})
		return newCodes(codes, err)
	}).(nCodes)
	m.tallyCodes("ack", out)
	if l >= 0 {
		switch d := now.Sub(m.leaseInf[l].expires); {
		case d == 0:
			m.tally["ack at its lease's expiry"]++
		case d == -time.Nanosecond:
			m.tally["ack 1ns before its lease's expiry"]++
		}
	}
}

// nCodes holds per-id codes as names, so a mismatch reads well.
type nCodes struct {
	Codes []string
	Err   string
}

func newCodes(cs []storage.Code, err error) nCodes {
	out := nCodes{Err: errClass(err)}
	for _, c := range cs {
		out.Codes = append(out.Codes, c.String())
	}
	return out
}

func (m *modelRun) tallyCodes(op string, c nCodes) {
	if c.Err != "" {
		m.tally[op+" error "+c.Err]++
	}
	for _, code := range c.Codes {
		m.tally[op+" "+code]++
	}
}

func (sd *side) idsAt(pos []int) []storage.ItemID {
	out := make([]storage.ItemID, len(pos))
	for i, p := range pos {
		out[i] = sd.idAt(p)
	}
	return out
}

func (m *modelRun) opNack() {
	l, q := m.pickLease()
	pos := m.pickIDs(l)
	var delay time.Duration
	if m.rng.IntN(5) >= 2 {
		delay = time.Millisecond + time.Duration(m.rng.Int64N(int64(3*time.Second)))
	}
	if m.rng.IntN(40) == 0 {
		delay = m.lim.MaxDelay + 1 // invalid: the whole call fails
	}
	reason := fmt.Sprintf("r%d", m.rng.IntN(100))
	if m.rng.IntN(40) == 0 {
		reason = strings.Repeat("long", m.lim.MaxReason/4+3)
	}
	// One nack in three gives items back undelivered (a give-back), most
	// without a delay, some with one (invalid).
	undelivered := m.rng.IntN(3) == 0
	d := &delay
	if undelivered && m.rng.IntN(4) != 0 {
		d = nil
	}
	now := m.callNow()
	out := m.compare(fmt.Sprintf("nack %s lease#%d ids%v delay=%v reason=%.10q undelivered=%v", q, l, pos, delay, reason, undelivered)+m.nowNote(now), func(sd *side) any {
		codes, err := sd.store().Nack(m.ctx, storage.NackParams{Queue: q, Lease: sd.leaseAt(l), IDs: sd.idsAt(pos), Delay: d, Reason: reason, Now: now,
			Undelivered: undelivered})
		return newCodes(codes, err)
	}).(nCodes)
	if undelivered {
		m.tallyCodes("give-back", out)
		return
	}
	m.tallyCodes("nack", out)
	if delay <= m.lim.MaxDelay {
		m.remember(now.Add(delay))
	}
}

func (m *modelRun) opExtend() {
	l, q := m.pickLease()
	d := m.leaseDuration()
	if m.rng.IntN(20) == 0 {
		d = m.lim.MinLease - 1
	}
	now := m.callNow()
	type nExtend struct {
		Exp time.Duration
		Err string
	}
	out := m.compare(fmt.Sprintf("extend %s lease#%d %v", q, l, d)+m.nowNote(now), func(sd *side) any {
		exp, err := sd.store().ExtendLease(m.ctx, storage.ExtendParams{Queue: q, Lease: sd.leaseAt(l), Duration: d, Now: now})
		if err != nil {
			return nExtend{0, errClass(err)}
		}
		return nExtend{rel(exp), ""}
	}).(nExtend)
	m.tally["extend "+out.Err]++
	if out.Err == "" {
		m.remember(base.Add(out.Exp))
		m.leaseInf[l].expires = base.Add(out.Exp)
	}
}

func (m *modelRun) opAdvance() {
	if m.rng.IntN(3) == 0 {
		// Jump to (or just before) one of the next known deadlines, where
		// off-by-one bugs live.
		var future []time.Time
		for _, t := range m.instants {
			if !t.Before(m.now) {
				future = append(future, t)
			}
		}
		sort.Slice(future, func(i, j int) bool { return future[i].Before(future[j]) })
		m.instants = future
		if len(future) > 0 {
			t := future[m.rng.IntN(min(len(future), 3))]
			if m.rng.IntN(2) == 0 && t.Add(-time.Nanosecond).After(m.now) {
				t = t.Add(-time.Nanosecond)
			}
			m.recent = append(m.recent, fmt.Sprintf("step %d: time -> %v", m.step, t.Sub(base)))
			m.now = t
			return
		}
	}
	d := time.Millisecond + time.Duration(m.rng.Int64N(int64(300*time.Millisecond)))
	m.recent = append(m.recent, fmt.Sprintf("step %d: time += %v", m.step, d))
	m.now = m.now.Add(d)
}

// opSweep sweeps until no due work remains, with a small or large limit,
// and compares the totals: with a small limit the order among leases with
// the same expiry is the store's business.
func (m *modelRun) opSweep() {
	limit := 1000
	if m.rng.IntN(4) == 0 {
		limit = 1 + m.rng.IntN(3)
	}
	now := m.now
	// ReadyQueues are compared apart: the store's must hold the
	// reference's, and may hold more (storage.SweepResult.ReadyQueues).
	ready := map[*side][]string{}
	out := m.compare(fmt.Sprintf("sweep limit=%d", limit), func(sd *side) any {
		var total nSweep
		seen := map[string]bool{}
		for i := 0; ; i++ {
			if i > 100000 {
				return "sweep never finished"
			}
			res, err := sd.store().Sweep(m.ctx, storage.SweepParams{Now: now, Limit: limit})
			if err != nil {
				return errClass(err)
			}
			if res.LeasesExpired > limit {
				return fmt.Sprintf("sweep expired %d leases with limit %d", res.LeasesExpired, limit)
			}
			total.LeasesExpired += res.LeasesExpired
			total.Requeued += res.Requeued
			total.DeadLettered += res.DeadLettered
			total.Promoted += res.Promoted
			total.DedupDropped += res.DedupDropped
			for _, q := range res.ReadyQueues {
				seen[q] = true
			}
			if !sort.StringsAreSorted(res.ReadyQueues) {
				return fmt.Sprintf("ReadyQueues not sorted: %v", res.ReadyQueues)
			}
			if !res.More {
				total.Next = rel(res.Next)
				break
			}
		}
		for q := range seen {
			ready[sd] = append(ready[sd], q)
		}
		sort.Strings(ready[sd])
		return total
	})
	for _, q := range ready[m.a] {
		require.Contains(m.t, ready[m.b], q, "seed %d step %d: sweep: the store did not report queue %s as gaining ready items (reference %v, store %v)\nrecent ops:\n%s",
			m.seed, m.step, q, ready[m.a], ready[m.b], strings.Join(m.recent, "\n"))
	}
	if tot, ok := out.(nSweep); ok {
		m.tally["sweep requeued"] += tot.Requeued
		m.tally["sweep dead-lettered"] += tot.DeadLettered
		m.tally["sweep promoted"] += tot.Promoted
		m.tally["sweep dedup dropped"] += tot.DedupDropped
	}
}

func (m *modelRun) opStats() {
	now := m.now
	q := ""
	if m.rng.IntN(3) == 0 {
		q = m.queue() // one queue, perhaps one that does not exist yet
	}
	m.compare("stats "+q, func(sd *side) any {
		st, err := sd.store().Stats(m.ctx, storage.StatsParams{Queue: q, Now: now})
		return fmt.Sprintf("%+v %s", st, errClass(err))
	})
	if m.rng.IntN(4) == 0 {
		m.compare("queues", func(sd *side) any {
			qs, err := sd.store().Queues(m.ctx)
			return fmt.Sprint(qs, errClass(err))
		})
	}
}

func (m *modelRun) afterPos() int {
	if m.rng.IntN(2) == 0 || len(m.idQueue) == 0 {
		return -2 // from the start
	}
	return m.rng.IntN(len(m.idQueue))
}

func (sd *side) after(pos int) storage.ItemID {
	if pos == -2 {
		return storage.ItemID{}
	}
	return sd.idAt(pos)
}

func (m *modelRun) opPeek() {
	q := m.queue()
	inflight := m.rng.IntN(2) == 0
	after := m.afterPos()
	limit := 1 + m.rng.IntN(6)
	now := m.now
	m.compare(fmt.Sprintf("peek %s inflight=%v after#%d limit=%d", q, inflight, after, limit), func(sd *side) any {
		items, err := sd.store().Peek(m.ctx, storage.PeekParams{Queue: q, Inflight: inflight, After: sd.after(after), Limit: limit, Now: now})
		return fmt.Sprintf("%+v %s", sd.items(items), errClass(err))
	})
}

func (sd *side) deads(ds []storage.DeadItem) []nDead {
	out := make([]nDead, len(ds))
	for i, d := range ds {
		out[i] = nDead{nItem: sd.item(d.Item), Reason: d.Reason, DeadAt: rel(d.DeadAt)}
		// Where a dead item would have become visible is not defined.
		out[i].VisibleAt = 0
	}
	return out
}

func (m *modelRun) opDeadList() {
	q := m.queue()
	after := m.afterPos()
	limit := 1 + m.rng.IntN(6)
	m.compare(fmt.Sprintf("dead list %s after#%d limit=%d", q, after, limit), func(sd *side) any {
		ds, err := sd.store().DeadList(m.ctx, storage.DeadListParams{Queue: q, After: sd.after(after), Limit: limit})
		return fmt.Sprintf("%+v %s", sd.deads(ds), errClass(err))
	})
}

// deadPositions picks item positions for redrive / dead purge, biased to
// items the reference holds as dead.
func (m *modelRun) deadPositions(q string) []int {
	var dead []int
	if ds, err := m.ref.DeadList(m.ctx, storage.DeadListParams{Queue: q, Limit: m.lim.MaxBatch}); err == nil {
		for _, d := range ds {
			dead = append(dead, m.a.idx[d.ID])
		}
	}
	n := 1 + m.rng.IntN(3)
	var out []int
	for len(out) < n {
		switch r := m.rng.IntN(10); {
		case r < 7 && len(dead) > 0:
			out = append(out, dead[m.rng.IntN(len(dead))])
		case r < 9 && len(m.idQueue) > 0:
			out = append(out, m.rng.IntN(len(m.idQueue)))
		default:
			out = append(out, -1)
		}
	}
	return out
}

func (m *modelRun) deadOp(name string, fn func(s storage.Store, p storage.RedriveParams) (storage.RedriveResult, error)) {
	q := m.queue()
	var pos []int
	limit := 0
	if m.rng.IntN(2) == 0 {
		pos = m.deadPositions(q)
	} else {
		limit = 1 + m.rng.IntN(3)
	}
	now := m.now
	m.compare(fmt.Sprintf("%s %s ids%v limit=%d", name, q, pos, limit), func(sd *side) any {
		p := storage.RedriveParams{Queue: q, Limit: limit, Now: now}
		if pos != nil {
			p.IDs = sd.idsAt(pos)
		}
		res, err := fn(sd.store(), p)
		return fmt.Sprintf("%+v %s", res, errClass(err))
	})
	m.tally[name]++
}

func (m *modelRun) opRedrive() {
	m.deadOp("redrive", func(s storage.Store, p storage.RedriveParams) (storage.RedriveResult, error) {
		return s.Redrive(m.ctx, p)
	})
}

func (m *modelRun) opPurgeDead() {
	m.deadOp("purge dead", func(s storage.Store, p storage.RedriveParams) (storage.RedriveResult, error) {
		return s.PurgeDead(m.ctx, p)
	})
}

func (m *modelRun) opPurge() {
	q := m.queue()
	now := m.now
	m.compare("purge "+q, func(sd *side) any {
		n, err := sd.store().Purge(m.ctx, storage.PurgeParams{Queue: q, Now: now})
		return fmt.Sprint(n, " ", errClass(err))
	})
}

func (m *modelRun) opDeleteQueue() {
	q := m.queue()
	force := m.rng.IntN(2) == 0
	now := m.now
	m.compare(fmt.Sprintf("delete queue %s force=%v", q, force), func(sd *side) any {
		n, err := sd.store().DeleteQueue(m.ctx, storage.DeleteQueueParams{Queue: q, Force: force, Now: now})
		return fmt.Sprint(n, " ", errClass(err))
	})
}

func (m *modelRun) opSetConfig() {
	q := m.queue()
	c := storage.QueueConfig{
		MaxAttempts:   uint32(1 + m.rng.IntN(4)),
		LeaseDuration: []time.Duration{m.lim.MinLease, time.Second, 30 * time.Second}[m.rng.IntN(3)],
		DedupWindow:   []time.Duration{0, 500 * time.Millisecond, 5 * time.Second, 5 * time.Minute}[m.rng.IntN(4)],
		BackoffBase:   100 * time.Millisecond,
		BackoffMax:    time.Second,
	}
	if m.rng.IntN(8) == 0 {
		c.MaxAttempts = 0 // invalid
	}
	m.compare(fmt.Sprintf("set config %s %+v", q, c), func(sd *side) any {
		err := sd.store().SetQueueConfig(m.ctx, q, c)
		got, gerr := sd.store().QueueConfig(m.ctx, q)
		return fmt.Sprintf("%s %+v %s", errClass(err), got, errClass(gerr))
	})
}

func (m *modelRun) opCheck() {
	m.recent = append(m.recent, fmt.Sprintf("step %d: check", m.step))
	rep, err := m.ref.Check(m.ctx)
	require.NoError(m.t, err)
	require.True(m.t, rep.OK(), "reference model violations (a memstore bug): %v", rep.Violations)
	m.compare("check", func(sd *side) any {
		rep, err := sd.store().Check(m.ctx)
		return fmt.Sprintf("items=%d leases=%d violations=%q %s", rep.Items, rep.Leases, rep.Violations, errClass(err))
	})
}

func (m *modelRun) opReopen() {
	m.recent = append(m.recent, fmt.Sprintf("step %d: reopen", m.step))
	m.reopens++
	m.sut.reopen()
}

// finalCompare compares everything that is observable at the end.
func (m *modelRun) finalCompare() {
	m.opCheck()
	m.opStats()
	now := m.now
	m.compare("queues", func(sd *side) any {
		qs, err := sd.store().Queues(m.ctx)
		return fmt.Sprint(qs, errClass(err))
	})
	for _, q := range m.queues {
		for _, inflight := range []bool{false, true} {
			m.compare(fmt.Sprintf("final peek %s inflight=%v", q, inflight), func(sd *side) any {
				items, err := sd.store().Peek(m.ctx, storage.PeekParams{Queue: q, Inflight: inflight, Limit: m.lim.MaxBatch, Now: now})
				return fmt.Sprintf("%+v %s", sd.items(items), errClass(err))
			})
		}
		m.compare("final dead list "+q, func(sd *side) any {
			ds, err := sd.store().DeadList(m.ctx, storage.DeadListParams{Queue: q, Limit: m.lim.MaxBatch})
			return fmt.Sprintf("%+v %s", sd.deads(ds), errClass(err))
		})
	}
	keys := make([]string, 0, len(m.tally))
	for k := range m.tally {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "\n  %s: %d", k, m.tally[k])
	}
	m.t.Logf("seed %d: %d ids, %d leases, %d reopens, final time %v; outcomes:%s", m.seed, len(m.a.ids), len(m.a.leases), m.reopens, m.now.Sub(base), sb.String())
}
