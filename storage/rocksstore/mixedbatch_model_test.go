package rocksstore

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// A model of the semantics: every item's state, as the
// ops' results say it must be.
type rvItem struct {
	q        string
	id       storage.ItemID
	prio     uint8
	vis      time.Duration
	state    int // rvAvail, rvInflight, rvDead, rvGone
	lease    storage.LeaseID
	attempts uint32
	max      uint32
}

func (it *rvItem) maxAttempts() uint32 {
	if it.max > 0 {
		return it.max
	}
	return storage.DefaultMaxAttempts
}

const (
	rvAvail = iota
	rvInflight
	rvDead
	rvGone
)

type rvLease struct {
	q   string
	exp time.Duration
	ids []storage.ItemID
}

type rvModel struct {
	t      *testing.T
	items  map[storage.ItemID]*rvItem
	leases map[storage.LeaseID]*rvLease
}

// pickLease picks one of q's leases that holds items, by rng, or ok
// false when there is none.
func (m *rvModel) pickLease(rng *rand.Rand, q string) (l storage.LeaseID, ok bool) {
	var ls []storage.LeaseID
	for l, ml := range m.leases {
		if ml.q == q && len(m.held(l)) > 0 {
			ls = append(ls, l)
		}
	}
	if len(ls) == 0 {
		return l, false
	}
	slices.SortFunc(ls, func(x, y storage.LeaseID) int { return bytes.Compare(x[:], y[:]) })
	return ls[rng.IntN(len(ls))], true
}

func (m *rvModel) held(l storage.LeaseID) []storage.ItemID {
	var out []storage.ItemID
	ml := m.leases[l]
	if ml == nil {
		return nil
	}
	for _, id := range ml.ids {
		if it := m.items[id]; it.state == rvInflight && it.lease == l {
			out = append(out, id)
		}
	}
	return out
}

// ready returns q's items ready at now in serve order.
func (m *rvModel) ready(q string, now time.Duration) []*rvItem {
	var out []*rvItem
	for _, it := range m.items {
		if it.q == q && it.state == rvAvail && it.vis <= now {
			out = append(out, it)
		}
	}
	slices.SortFunc(out, func(a, b *rvItem) int {
		if a.prio != b.prio {
			return int(a.prio) - int(b.prio)
		}
		if a.vis != b.vis {
			if a.vis < b.vis {
				return -1
			}
			return 1
		}
		return bytes.Compare(a.id[:], b.id[:])
	})
	return out
}

func (m *rvModel) counts(q string) [4]int64 {
	var c [4]int64 // avail, inflight, dead, leases
	for _, it := range m.items {
		if it.q != q {
			continue
		}
		switch it.state {
		case rvAvail:
			c[0]++
		case rvInflight:
			c[1]++
		case rvDead:
			c[2]++
		}
	}
	for l, ml := range m.leases {
		if ml.q == q && len(m.held(l)) > 0 {
			c[3]++
		}
	}
	return c
}

func (m *rvModel) live(l storage.LeaseID, now time.Duration) bool {
	ml := m.leases[l]
	return ml != nil && now < ml.exp && len(m.held(l)) > 0
}

// expire ends every lease due at now, as the sweeper does.
func (m *rvModel) expire(now time.Duration) (requeued, dead int) {
	for l, ml := range m.leases {
		if ml.exp > now {
			continue
		}
		for _, id := range m.held(l) {
			it := m.items[id]
			if it.attempts >= it.maxAttempts() {
				it.state = rvDead
				dead++
			} else {
				it.state = rvAvail
				it.vis = ml.exp
				requeued++
			}
			it.lease = storage.LeaseID{}
		}
		delete(m.leases, l)
	}
	return requeued, dead
}

func (b *testBundle) rvCompare(m *rvModel, queues []string, now time.Duration, what string) {
	b.t.Helper()
	for _, q := range queues {
		if b.s.queue(q) == nil {
			continue
		}
		st := b.stats(q, at(now))
		want := m.counts(q)
		got := [4]int64{st.Ready + st.Delayed, st.Inflight, st.Dead, st.Leases}
		require.Equal(b.t, want, got, "%s: queue %s: [available inflight dead leases]", what, q)
	}
}

// rvRandomBatches runs random mixed batches (enqueues of several
// priorities and delays into several queues, claims, acks, nacks with
// and without delay, undelivered nacks, lease expiries and delayed
// promotions in the same batch), checking every claim against the
// model's serve order and every batch's counts; reopen, flush and
// compaction in between.
func rvRandomBatches(t *testing.T, seed uint64, rounds int) {
	b := setup(t, func(o *Options) { o.ReadyCacheBytes = int64(seed%3) * 3000 })
	rng := rand.New(rand.NewPCG(seed, seed*7+1))
	m := &rvModel{t: t, items: map[storage.ItemID]*rvItem{}, leases: map[storage.LeaseID]*rvLease{}}
	queues := []string{"a", "b"}
	now := time.Duration(0)
	for round := 0; round < rounds; round++ {
		now += time.Duration(1+rng.IntN(3)) * time.Second
		var fns []func(o *opTx) error
		var after []func()
		cur := now
		for range 1 + rng.IntN(7) {
			q := queues[rng.IntN(len(queues))]
			switch k := rng.IntN(10); {
			case k < 3: // enqueue
				n := 1 + rng.IntN(8)
				items := make([]storage.EnqueueItem, n)
				for i := range items {
					items[i].Payload = []byte(fmt.Sprintf("%s-%d-%d", q, round, i))
					if rng.IntN(3) == 0 {
						items[i].Priority = uint8(rng.IntN(3))
					}
					if rng.IntN(4) == 0 {
						items[i].Delay = time.Duration(1+rng.IntN(5)) * time.Second
					}
					if rng.IntN(5) == 0 {
						items[i].MaxAttempts = uint32(1 + rng.IntN(2))
					}
					if rng.IntN(10) == 0 {
						items[i].Payload = bytes.Repeat([]byte{byte(i)}, 5000)
					}
				}
				enqAt := cur
				if rng.IntN(4) == 0 {
					enqAt -= time.Duration(1+rng.IntN(1500)) * time.Millisecond // a caller whose clock read came earlier
				}
				res, _, fn, err := b.s.enqueueOp(b.ctx, storage.EnqueueParams{Queue: q, Items: items, Now: at(enqAt)})
				require.NoError(t, err)
				fns = append(fns, fn)
				after = append(after, func() {
					for i, r := range res {
						require.Equal(t, storage.CodeOK, r.Code)
						m.items[r.ID] = &rvItem{q: q, id: r.ID, prio: items[i].Priority, vis: enqAt + items[i].Delay, state: rvAvail, max: items[i].MaxAttempts}
					}
				})
			case k < 5: // claim
				max := 1 + rng.IntN(10)
				lease := time.Duration(1+rng.IntN(4)) * time.Second
				r := new(storage.PollResult)
				fns = append(fns, func(o *opTx) error {
					qs := b.s.queue(q)
					if qs == nil {
						return nil
					}
					var err error
					*r, err = b.s.claimHead(o, qs, nanos(at(cur)), max, int64(lease))
					return err
				})
				after = append(after, func() {
					want := m.ready(q, cur)
					if len(want) > max {
						want = want[:max]
					}
					var wantIDs []storage.ItemID
					for _, it := range want {
						wantIDs = append(wantIDs, it.id)
					}
					require.Equal(t, fmt.Sprint(wantIDs), fmt.Sprint(itemIDs(r.Items)), "round %d: claim of %d from %s at %v", round, max, q, cur)
					if len(r.Items) == 0 {
						return
					}
					ml := &rvLease{q: q, exp: cur + lease}
					for _, got := range r.Items {
						it := m.items[got.ID]
						it.attempts++
						require.Equal(t, it.attempts, got.Attempts, "attempts of %s", got.ID)
						it.state, it.lease = rvInflight, r.Lease
						ml.ids = append(ml.ids, got.ID)
					}
					m.leases[r.Lease] = ml
				})
			case k < 8: // ack or nack some of a lease's items
				l, ok := m.pickLease(rng, q)
				if !ok {
					continue
				}
				var ids []storage.ItemID
				for _, id := range m.held(l) {
					if rng.IntN(3) > 0 {
						ids = append(ids, id)
					}
				}
				if len(ids) == 0 {
					continue
				}
				kind := rng.IntN(4) // 0,1 ack; 2 nack; 3 undelivered nack
				var codes []storage.Code
				var fn func(o *opTx) error
				var delay time.Duration
				if kind < 2 {
					var err error
					_, codes, fn, err = b.s.ackOp(b.ctx, storage.AckParams{Queue: q, Lease: l, IDs: ids, Now: at(cur)})
					require.NoError(t, err)
				} else {
					p := storage.NackParams{Queue: q, Lease: l, IDs: ids, Now: at(cur), Reason: "r"}
					if kind == 3 {
						p.Undelivered = true
					} else {
						delay = time.Duration(rng.IntN(3)) * time.Second
						p.Delay = &delay
					}
					var err error
					_, codes, fn, err = b.s.nackOp(b.ctx, p)
					require.NoError(t, err)
				}
				fns = append(fns, fn)
				after = append(after, func() {
					live := m.live(l, cur)
					for i, id := range ids {
						it := m.items[id]
						wantOK := live && it.state == rvInflight && it.lease == l
						require.Equal(t, wantOK, codes[i] == storage.CodeOK, "round %d: settle kind %d of %s: code %v", round, kind, id, codes[i])
						if !wantOK {
							continue
						}
						it.lease = storage.LeaseID{}
						switch {
						case kind < 2:
							it.state = rvGone
						case kind == 3:
							it.state = rvAvail
							it.attempts = max(it.attempts, 1) - 1
						case it.attempts >= it.maxAttempts():
							it.state = rvDead
						default:
							it.state = rvAvail
							it.vis = cur + delay
						}
					}
				})
			case k == 8 && rng.IntN(2) == 0: // extend a lease (ExtendLease's op)
				l, ok := m.pickLease(rng, q)
				if !ok {
					continue
				}
				d := time.Duration(rng.IntN(4)) * time.Second
				if d == 0 {
					d = m.leases[l].exp - cur // to the same expiry
					if d < 100*time.Millisecond {
						d = time.Second
					}
				}
				var extErr error
				fns = append(fns, func(o *opTx) error {
					// ExtendLease's op (lease.go), errors kept aside so
					// that the batch goes on.
					extErr = func() error {
						ls := b.s.leases[l]
						if ls == nil || nanos(at(cur)) >= ls.deadline() {
							return storage.ErrLeaseExpired
						}
						exp := nanos(at(cur)) + int64(d)
						b.s.moveExpiry(o, ls, exp, false)
						o.put(dbkeys.LeaseKey(ls.token), dbkeys.EncodeLease(leaseRecord(ls)))
						return nil
					}()
					return nil
				})
				after = append(after, func() {
					live := m.live(l, cur)
					require.Equal(t, live, extErr == nil, "round %d: extend: %v", round, extErr)
					if live {
						m.leases[l].exp = cur + d
					}
				})
			case k == 8: // redrive some dead items (Redrive's op)
				var ids []storage.ItemID
				for _, it := range m.items {
					if it.q == q && it.state == rvDead && rng.IntN(2) == 0 {
						ids = append(ids, it.id)
					}
				}
				if len(ids) == 0 {
					continue
				}
				slices.SortFunc(ids, func(x, y storage.ItemID) int { return bytes.Compare(x[:], y[:]) })
				codes := make([]storage.Code, len(ids))
				fns = append(fns, func(o *opTx) error {
					qs := b.s.queue(q)
					for i, id := range ids {
						k := dbkeys.DLQKey(q, id)
						v, ok, err := o.getForUpdate(k)
						if err != nil {
							return err
						}
						if !ok {
							codes[i] = storage.CodeNotFound
							continue
						}
						rec, err := dbkeys.DecodeItem(v)
						if err != nil {
							return err
						}
						o.del(k)
						rec.Attempts = 0
						rec.VisibleAt = nanos(at(cur))
						rec.Delayed = false
						b.s.putAvailable(o, qs, id, rec, nil, false, nil)
						dl := o.delta(qs)
						dl.Dead--
						dl.Redriven++
						codes[i] = storage.CodeOK
					}
					return nil
				})
				after = append(after, func() {
					for i, id := range ids {
						it := m.items[id]
						want := it.state == rvDead
						require.Equal(t, want, codes[i] == storage.CodeOK, "round %d: redrive %s", round, id)
						if want {
							it.state, it.attempts, it.vis = rvAvail, 0, cur
						}
					}
				})
			case k == 9 && rng.IntN(4) == 0: // purge (Purge's op)
				n := 0
				fns = append(fns, func(o *opTx) error {
					qs := b.s.queue(q)
					if qs == nil {
						return nil
					}
					var err error
					a := b.s.purgeInflight(o, qs, 1<<20)
					c, err := b.s.purgeAvailable(o, qs, 1<<20)
					n = a + c
					o.delta(qs).Purged += int64(n)
					return err
				})
				after = append(after, func() {
					want := 0
					for _, it := range m.items {
						if it.q == q && (it.state == rvAvail || it.state == rvInflight) {
							it.state = rvGone
							want++
						}
					}
					for l, ml := range m.leases {
						if ml.q == q {
							delete(m.leases, l)
						}
					}
					require.Equal(t, want, n, "round %d: purged", round)
				})
			default: // the sweeper's expiry and promotion, in the same batch
				var res storage.SweepResult
				fns = append(fns, func(o *opTx) error {
					b.s.expireDue(o, nanos(at(cur)), 1000, &res, map[string]bool{})
					b.s.promoteDue(o, nanos(at(cur)), 1000, &res, map[string]bool{})
					return nil
				})
				after = append(after, func() {
					rq, dd := m.expire(cur)
					require.Equal(t, rq, res.Requeued, "requeued")
					require.Equal(t, dd, res.DeadLettered, "dead-lettered")
				})
			}
		}
		if len(fns) == 0 {
			continue
		}
		b.oneBatch(fns...)
		for _, f := range after {
			f()
		}
		for l := range m.leases {
			if len(m.held(l)) == 0 {
				delete(m.leases, l)
			}
		}
		b.rvCompare(m, queues, now, fmt.Sprintf("round %d", round))
		switch rng.IntN(6) {
		case 0:
			b.reopen()
			b.rvCompare(m, queues, now, fmt.Sprintf("round %d after reopen", round))
		case 1:
			require.NoError(t, b.s.db.flush())
			b.check()
		case 2:
			require.NoError(t, b.s.db.flush())
			for i := range familyList() {
				require.NoError(t, b.s.db.compact(i))
			}
		}
	}
	b.reopen()
	b.rvCompare(m, queues, now, "end after reopen")
	// Drain: everything the model holds available or inflight comes
	// back, once, and nothing else.
	now += time.Hour
	b.sweep(at(now))
	m.expire(now)
	for _, q := range queues {
		if b.s.queue(q) == nil {
			continue
		}
		var got []storage.ItemID
		for {
			r := b.poll(q, 100, time.Minute, at(now))
			if len(r.Items) == 0 {
				break
			}
			got = append(got, itemIDs(r.Items)...)
			for _, c := range b.ack(q, r.Lease, at(now), itemIDs(r.Items)...) {
				require.Equal(t, storage.CodeOK, c)
			}
		}
		var want []storage.ItemID
		for _, it := range m.ready(q, now) {
			want = append(want, it.id)
		}
		require.Equal(t, fmt.Sprint(want), fmt.Sprint(got), "drain of %s", q)
	}
}

// TestRocksStore_MixedBatchesModel: random batches that mix every op,
// against a model of the semantics, with reopens, flushes and compactions
// between them (a review's test of the write path's range tombstones,
// single deletes, overlay and ready-record cache, which found no bug; kept
// as a regression test, two of its seeds).
func TestRocksStore_MixedBatchesModel(t *testing.T) {
	for seed := uint64(21); seed <= 22; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { rvRandomBatches(t, seed, 400) })
	}
}

// TestRocksStore_ConcurrentMixedBatches: concurrent public calls (so
// that they combine into mixed batches): every enqueued item is acked
// exactly once or dead, after a reopen.
func TestRocksStore_ConcurrentMixedBatches(t *testing.T) {
	b := setup(t)
	var mu sync.Mutex
	acked := map[storage.ItemID]int{}
	enq := map[storage.ItemID]bool{}
	var clk atomic.Int64
	now := func() time.Time { return at(time.Duration(clk.Add(int64(time.Millisecond)))) }
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			q := []string{"a", "b"}[w%2]
			for range 300 {
				items := make([]storage.EnqueueItem, 1+rng.IntN(6))
				for i := range items {
					items[i].Payload = []byte("x")
					items[i].Priority = uint8(rng.IntN(2))
				}
				res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: q, Items: items, Now: now()})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				for _, r := range res {
					enq[r.ID] = true
				}
				mu.Unlock()
				r, err := b.s.Poll(b.ctx, storage.PollParams{Queue: q, Max: 1 + rng.IntN(8), Lease: time.Duration(100+rng.IntN(200)) * time.Millisecond, Now: now()})
				if err != nil || len(r.Items) == 0 {
					continue
				}
				ids := itemIDs(r.Items)
				switch rng.IntN(4) {
				case 0:
					zero := time.Duration(0)
					_, err = b.s.Nack(b.ctx, storage.NackParams{Queue: q, Lease: r.Lease, IDs: ids, Delay: &zero, Now: now()})
				case 1:
					_, err = b.s.Nack(b.ctx, storage.NackParams{Queue: q, Lease: r.Lease, IDs: ids, Undelivered: true, Now: now()})
				case 2:
					// left to expire
				default:
					var codes []storage.Code
					codes, err = b.s.Ack(b.ctx, storage.AckParams{Queue: q, Lease: r.Lease, IDs: ids, Now: now()})
					mu.Lock()
					for i, c := range codes {
						if c == storage.CodeOK {
							acked[ids[i]]++
						}
					}
					mu.Unlock()
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	stop := make(chan struct{})
	var sw sync.WaitGroup
	sw.Add(1)
	go func() {
		defer sw.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := b.s.Sweep(b.ctx, storage.SweepParams{Now: now()}); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	wg.Wait()
	close(stop)
	sw.Wait()
	b.reopen()
	end := now().Add(time.Hour)
	b.sweep(end)
	dead := 0
	for _, q := range []string{"a", "b"} {
		for {
			r := b.poll(q, 100, time.Minute, end)
			if len(r.Items) == 0 {
				break
			}
			for i, c := range b.ack(q, r.Lease, end, itemIDs(r.Items)...) {
				require.Equal(t, storage.CodeOK, c)
				acked[r.Items[i].ID]++
			}
		}
		st := b.stats(q, end)
		require.Zero(t, st.Ready+st.Delayed+st.Inflight)
		dead += int(st.Dead)
	}
	for id, n := range acked {
		require.Equal(t, 1, n, "acked twice: %s", id)
		require.True(t, enq[id])
	}
	require.Equal(t, len(enq), len(acked)+dead)
}
