package fdbsync_test

// Queue removal under several nodes and faults, from a review (session 69).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync"
	"github.com/leaseq/leaseq/fdbsync/fdbmodel"
	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

// rvDedup is the model's view of one dedup record of a live queue.
type rvDedup struct {
	id   storage.ItemID
	seen time.Time
	exp  time.Time
}

// holds: the record suppresses an enqueue at now under the queue's
// current window (which may have been shortened since it was written).
func (d rvDedup) holds(now time.Time, window time.Duration) bool {
	return window > 0 && d.exp.After(now) && now.Sub(d.seen) < window
}

type rvQueue struct {
	exists bool
	window time.Duration
	dedup  map[string]rvDedup
}

type rvState int

const (
	rvLive rvState = iota // ready, inflight or dead
	rvAcked
	rvDeleted
)

type rvItem struct {
	q     string
	state rvState
}

type rvHarness struct {
	t      *testing.T
	rng    *rand.Rand
	db     *fdbmodel.DB
	stores []*fdbsync.Store
	now    time.Time
	qs     map[string]*rvQueue
	items  map[storage.ItemID]*rvItem
	leases map[storage.LeaseID]rvLease
	names  []string
}

type rvLease struct {
	q   string
	ids []storage.ItemID
	exp time.Time
}

func (h *rvHarness) tick() time.Time {
	h.now = h.now.Add(time.Millisecond)
	return h.now
}

func (h *rvHarness) store() *fdbsync.Store { return h.stores[h.rng.IntN(len(h.stores))] }

func (h *rvHarness) q(name string) *rvQueue {
	m := h.qs[name]
	if m == nil {
		m = &rvQueue{dedup: map[string]rvDedup{}}
		h.qs[name] = m
	}
	return m
}

func (h *rvHarness) live(name string) int {
	n := 0
	for _, it := range h.items {
		if it.q == name && it.state == rvLive {
			n++
		}
	}
	return n
}

// dump reads every key of the database (one snapshot).
func (h *rvHarness) dump() []kv.KeyValue {
	for i := 0; ; i++ {
		tx, err := h.db.CreateTransaction()
		require.NoError(h.t, err)
		rows, err := tx.GetRange([]byte{}, []byte{0xff}, kv.RangeOptions{Snapshot: true})
		if err == nil {
			return rows
		}
		require.Less(h.t, i, 50, "dump: %v", err)
	}
}

// enqueue enqueues items with the given dedup keys ("" none) and checks
// each result against the model; it returns the results.
func (h *rvHarness) enqueue(s *fdbsync.Store, name string, keys []string) []storage.EnqueueResult {
	t := h.t
	now := h.tick()
	in := make([]storage.EnqueueItem, len(keys))
	for i, k := range keys {
		in[i] = storage.EnqueueItem{Payload: []byte(fmt.Sprintf("p-%d", i)), DedupKey: k, MaxAttempts: 3}
	}
	res, err := s.Enqueue(context.Background(), storage.EnqueueParams{Queue: name, Items: in, Now: now})
	require.NoError(t, err)
	m := h.q(name)
	if !m.exists {
		// Created anew: the default config, no dedup record counts.
		m.exists, m.window, m.dedup = true, storage.DefaultDedupWindow, map[string]rvDedup{}
	}
	h.applyEnqueue(m, name, keys, res, now)
	return res
}

func (h *rvHarness) applyEnqueue(m *rvQueue, name string, keys []string, res []storage.EnqueueResult, now time.Time) {
	t := h.t
	here := map[string]storage.ItemID{}
	for i, r := range res {
		require.Equal(t, storage.CodeOK, r.Code, "%+v", r)
		k := keys[i]
		if k != "" {
			if id, ok := here[k]; ok {
				require.True(t, r.Duplicate, "queue %q key %q: second in one batch not a duplicate", name, k)
				require.Equal(t, id, r.ID)
				continue
			}
			if d, ok := m.dedup[k]; ok && d.holds(now, m.window) {
				require.True(t, r.Duplicate, "queue %q key %q (first id %s, expires %v, now %v): not suppressed", name, k, d.id, d.exp, now)
				require.Equal(t, d.id, r.ID, "queue %q key %q: duplicate of the wrong item", name, k)
				continue
			}
		}
		require.False(t, r.Duplicate, "queue %q key %q: suppressed by id %s but the model has no live record", name, k, r.ID)
		_, seen := h.items[r.ID]
		require.False(t, seen, "id %s assigned twice", r.ID)
		h.items[r.ID] = &rvItem{q: name}
		if k != "" && m.window > 0 {
			m.dedup[k] = rvDedup{id: r.ID, seen: now, exp: now.Add(m.window)}
			here[k] = r.ID
		}
	}
}

func (h *rvHarness) poll(s *fdbsync.Store, name string) {
	t := h.t
	now := h.tick()
	res, err := s.Poll(context.Background(), storage.PollParams{Queue: name, Max: 1 + h.rng.IntN(50), Lease: 100 * time.Millisecond, Now: now})
	if errors.Is(err, storage.ErrNotFound) {
		require.False(t, h.q(name).exists, "poll of an existing queue %q: %v", name, err)
		return
	}
	require.NoError(t, err)
	if len(res.Items) == 0 {
		return
	}
	var ids []storage.ItemID
	for _, it := range res.Items {
		m, ok := h.items[it.ID]
		require.True(t, ok, "polled unknown id %s", it.ID)
		require.Equal(t, name, m.q)
		require.Equal(t, rvLive, m.state, "polled id %s in state %d", it.ID, m.state)
		ids = append(ids, it.ID)
	}
	h.leases[res.Lease] = rvLease{q: name, ids: ids, exp: res.ExpiresAt}
}

func (h *rvHarness) settle(s *fdbsync.Store) {
	t := h.t
	for lease, l := range h.leases {
		delete(h.leases, lease)
		var acks, nacks []storage.ItemID
		for _, id := range l.ids {
			switch h.rng.IntN(10) {
			case 0, 1, 2, 3, 4, 5:
				acks = append(acks, id)
			case 6, 7:
				nacks = append(nacks, id)
			}
		}
		if len(acks) > 0 {
			codes, err := s.Ack(context.Background(), storage.AckParams{Queue: l.q, Lease: lease, IDs: acks, Now: h.tick()})
			if err == nil {
				for i, c := range codes {
					if c == storage.CodeOK {
						require.Equal(t, rvLive, h.items[acks[i]].state, "acked %s in state %d", acks[i], h.items[acks[i]].state)
						h.items[acks[i]].state = rvAcked
					}
				}
			} else {
				require.ErrorIs(t, err, storage.ErrNotFound, "ack")
			}
		}
		if len(nacks) > 0 {
			d := time.Duration(0)
			_, err := s.Nack(context.Background(), storage.NackParams{Queue: l.q, Lease: lease, IDs: nacks, Delay: &d, Reason: "r", Now: h.tick()})
			if err != nil {
				require.ErrorIs(t, err, storage.ErrNotFound, "nack")
			}
		}
		return // one lease per call
	}
}

func (h *rvHarness) deleteQueue(s *fdbsync.Store, name string, force bool) {
	t := h.t
	m := h.q(name)
	live := h.live(name)
	var before []kv.KeyValue
	if !force && live > 0 {
		before = h.dump()
	}
	_, err := s.DeleteQueue(context.Background(), storage.DeleteQueueParams{Queue: name, Force: force, Now: h.tick()})
	switch {
	case !m.exists:
		require.ErrorIs(t, err, storage.ErrNotFound, "delete of missing queue %q", name)
	case !force && live > 0:
		require.ErrorIs(t, err, storage.ErrNotEmpty, "delete of queue %q with %d live items", name, live)
		after := h.dump()
		require.Equal(t, len(before), len(after), "a refused DeleteQueue changed the database")
		for i := range before {
			require.True(t, bytes.Equal(before[i].Key, after[i].Key) && bytes.Equal(before[i].Value, after[i].Value),
				"a refused DeleteQueue changed key %x", after[i].Key)
		}
	default:
		require.NoError(t, err, "delete queue %q (force %v, %d live)", name, force, live)
		for _, it := range h.items {
			if it.q == name && it.state == rvLive {
				it.state = rvDeleted
			}
		}
		for l, x := range h.leases {
			if x.q == name {
				delete(h.leases, l)
			}
		}
		m.exists, m.dedup = false, map[string]rvDedup{}
	}
}

func (h *rvHarness) setConfig(s *fdbsync.Store, name string) {
	cfg := storage.DefaultQueueConfig()
	cfg.MaxAttempts = 3
	cfg.DedupWindow = []time.Duration{0, 30 * time.Millisecond, storage.DefaultDedupWindow}[h.rng.IntN(3)]
	require.NoError(h.t, s.SetQueueConfig(context.Background(), name, cfg))
	m := h.q(name)
	if !m.exists {
		m.exists, m.dedup = true, map[string]rvDedup{}
	}
	m.window = cfg.DedupWindow
}

// verify checks Check and that every live item is present exactly once.
func (h *rvHarness) verify() {
	t := h.t
	ctx := context.Background()
	s := h.store()
	rep, err := s.Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Violations)
	seen := map[storage.ItemID]int{}
	now := h.now
	for _, name := range h.names {
		for _, inflight := range []bool{false, true} {
			var after storage.ItemID
			for {
				page, err := s.Peek(ctx, storage.PeekParams{Queue: name, Inflight: inflight, After: after, Limit: 1000, Now: now})
				if errors.Is(err, storage.ErrNotFound) {
					require.False(t, h.q(name).exists, "peek %q: %v", name, err)
					break
				}
				require.NoError(t, err)
				for _, it := range page {
					seen[it.ID]++
					m, ok := h.items[it.ID]
					require.True(t, ok, "queue %q holds unknown id %s", name, it.ID)
					require.Equal(t, name, m.q)
					require.Equal(t, rvLive, m.state, "queue %q holds id %s in state %d", name, it.ID, m.state)
				}
				if len(page) < 1000 {
					break
				}
				after = page[len(page)-1].ID
			}
		}
		var after storage.ItemID
		for {
			page, err := s.DeadList(ctx, storage.DeadListParams{Queue: name, After: after, Limit: 1000})
			if errors.Is(err, storage.ErrNotFound) {
				break
			}
			require.NoError(t, err)
			for _, it := range page {
				seen[it.ID]++
				m, ok := h.items[it.ID]
				require.True(t, ok, "dead unknown id %s", it.ID)
				require.Equal(t, rvLive, m.state, "dead id %s in state %d", it.ID, m.state)
			}
			if len(page) < 1000 {
				break
			}
			after = page[len(page)-1].ID
		}
	}
	for id, it := range h.items {
		if it.state == rvLive {
			require.Equal(t, 1, seen[id], "live item %s of %q seen %d times", id, it.q, seen[id])
		} else {
			require.Zero(t, seen[id], "item %s (state %d) still present", id, it.state)
		}
	}
}

func newRVHarness(t *testing.T, seed uint64) *rvHarness {
	db := fdbmodel.New(fdbmodel.Options{Clock: clock.NewMock(), Faults: fdbmodel.Faults{
		Seed: seed, NotCommitted: 0.03, TooOld: 0.01, UnknownResult: 0.05, UnknownApplied: 0.5,
	}})
	h := &rvHarness{t: t, rng: rand.New(rand.NewPCG(seed, 7)), db: db, now: base,
		qs: map[string]*rvQueue{}, items: map[storage.ItemID]*rvItem{}, leases: map[storage.LeaseID]rvLease{},
		names: []string{"qa", "qb", "qc"}}
	for i := 0; i < 4; i++ {
		s, err := fdbsync.New(db, fdbsync.Options{Seed: seed*10 + uint64(i+1)})
		require.NoError(t, err)
		h.stores = append(h.stores, s)
	}
	t.Cleanup(func() {
		for _, s := range h.stores {
			_ = s.Close()
		}
	})
	return h
}

func (h *rvHarness) keys(n, pool int) []string {
	ks := make([]string, n)
	for i := range ks {
		if h.rng.IntN(8) == 0 {
			continue // no dedup key
		}
		ks[i] = fmt.Sprintf("k%d", h.rng.IntN(pool))
	}
	return ks
}

// TestFDBDeleteQueue_History is a randomized sequential history of many
// operations on a few queue names, spread over 4 nodes with faults.
func TestFDBDeleteQueue_History(t *testing.T) {
	for seed := uint64(1); seed <= 2; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			h := newRVHarness(t, seed)
			for op := 0; op < 300; op++ {
				s := h.store()
				name := h.names[h.rng.IntN(len(h.names))]
				switch x := h.rng.IntN(100); {
				case x < 6:
					h.enqueue(s, name, h.keys(1000, 2500)) // many keys: removal takes several transactions
				case x < 30:
					h.enqueue(s, name, h.keys(1+h.rng.IntN(30), 2500))
				case x < 50:
					h.poll(s, name)
				case x < 68:
					h.settle(s)
				case x < 74:
					h.tick()
					_, err := s.Sweep(context.Background(), storage.SweepParams{Now: h.tick(), Limit: 100})
					require.NoError(t, err)
				case x < 78:
					h.setConfig(s, name)
				case x < 90:
					h.deleteQueue(s, name, false)
				default:
					h.deleteQueue(s, name, true)
				}
				if op%50 == 49 {
					h.verify()
				}
			}
			h.verify()
			st := h.db.Stats()
			t.Logf("seed %d: %d items, %d txns, %d unknown (%d applied), max txn %d", seed, len(h.items), st.Transactions, st.InjUnknown, st.InjUnknownApplied, st.MaxTxnSize)
		})
	}
}

// TestFDBDeleteQueue_RecreateRace deletes an empty queue holding over 2000
// dedup keys (several transactions) on one node while another node keeps
// enqueueing old keys of it: the enqueues before the removal are all
// duplicates; after the first one that creates an item (the queue anew),
// no old key may suppress anything, and the new queue's keys must survive
// the rest of the removal.
func TestFDBDeleteQueue_RecreateRace(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			h := newRVHarness(t, seed)
			const name, pool = "qr", 2600
			h.names = []string{name}
			ctx := context.Background()
			for round := 0; round < 3; round++ {
				all := make([]string, pool)
				for i := range all {
					all[i] = fmt.Sprintf("k%d", i)
				}
				for i := 0; i < pool; i += 1000 {
					h.enqueue(h.stores[0], name, all[i:min(i+1000, pool)])
				}
				// Empty it: ack everything.
				for h.live(name) > 0 {
					h.poll(h.stores[1], name)
					for l, x := range h.leases {
						codes, err := h.stores[1].Ack(ctx, storage.AckParams{Queue: x.q, Lease: l, IDs: x.ids, Now: h.tick()})
						require.NoError(t, err)
						for i, c := range codes {
							require.Equal(t, storage.CodeOK, c)
							h.items[x.ids[i]].state = rvAcked
						}
						delete(h.leases, l)
					}
				}
				old := h.q(name)
				oldDedup := map[string]rvDedup{}
				for k, v := range old.dedup {
					oldDedup[k] = v
				}
				type enq struct {
					keys []string
					res  []storage.EnqueueResult
					now  time.Time
				}
				var (
					wg   sync.WaitGroup
					derr error
					done = make(chan struct{})
					encs []enq
					mu   sync.Mutex
				)
				wg.Add(2)
				go func() {
					defer wg.Done()
					defer close(done)
					_, derr = h.stores[2].DeleteQueue(ctx, storage.DeleteQueueParams{Queue: name, Now: base})
				}()
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(seed, uint64(round)))
					for i := 0; ; i++ {
						finished := false
						select {
						case <-done:
							finished = true
						default:
						}
						ks := make([]string, 20)
						for j := range ks {
							ks[j] = fmt.Sprintf("k%d", rng.IntN(pool))
						}
						mu.Lock()
						now := h.now.Add(time.Duration(i+1) * time.Microsecond)
						mu.Unlock()
						in := make([]storage.EnqueueItem, len(ks))
						for j, k := range ks {
							in[j] = storage.EnqueueItem{Payload: []byte("x"), DedupKey: k, MaxAttempts: 3}
						}
						res, err := h.stores[3].Enqueue(ctx, storage.EnqueueParams{Queue: name, Items: in, Now: now})
						if err != nil {
							panic(err)
						}
						encs = append(encs, enq{keys: ks, res: res, now: now})
						if finished {
							return
						}
					}
				}()
				wg.Wait()
				require.NoError(t, derr, "non-forced delete of an empty queue")
				// Replay the enqueues against the model.
				recreated := false
				for i, e := range encs {
					fresh := false
					for _, r := range e.res {
						if !r.Duplicate {
							fresh = true
						}
					}
					if !recreated && fresh {
						recreated = true
						m := h.q(name)
						m.exists, m.window, m.dedup = true, storage.DefaultDedupWindow, map[string]rvDedup{}
					}
					if !recreated {
						// Before the removal: every key is an old live one.
						for j, r := range e.res {
							d := oldDedup[e.keys[j]]
							require.Equal(t, d.id, r.ID, "enqueue %d before removal: key %q", i, e.keys[j])
						}
						continue
					}
					h.applyEnqueue(h.q(name), name, e.keys, e.res, e.now)
				}
				if !recreated {
					m := h.q(name)
					m.exists, m.dedup = false, map[string]rvDedup{}
				}
				h.now = h.now.Add(time.Millisecond * time.Duration(len(encs)+1))
				// The new queue's keys (and no old one) must still suppress.
				var ks []string
				for k := range h.q(name).dedup {
					ks = append(ks, k)
					if len(ks) == 200 {
						break
					}
				}
				ks = append(ks, "k0", "k1", "k2", "k3")
				h.enqueue(h.stores[0], name, ks)
				h.verify()
				// Force-delete so the next round starts from nothing.
				h.deleteQueue(h.stores[0], name, true)
				h.verify()
				t.Logf("round %d: %d enqueues during the removal, recreated %v", round, len(encs), recreated)
			}
		})
	}
}

// TestFDBDeleteQueue_DuplicateEnqueuesDoNotStarveIt (found by review,
// session 69; failed before its fix): DeleteQueue's first transaction
// read the whole counter range of the queue without snapshot, lifetime
// counters included, so a duplicate-only enqueue (it
// only bumps the Duplicates counter; the queue stays empty) committing
// during the attempt aborts it. Here one lands during every attempt, as a
// producer retrying with dedup keys would, and the delete of an empty
// queue fails with the retry limit. An enqueue that changes nothing the
// removal depends on must not abort it.
func TestFDBDeleteQueue_DuplicateEnqueuesDoNotStarveIt(t *testing.T) {
	t.Parallel()
	_, rdb, a, others := hookNodes(t, 1)
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)
	const q = "dupq"
	in := []storage.EnqueueItem{{Payload: []byte("x"), DedupKey: "k"}}
	_, err := others[0].Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: in, Now: now})
	require.NoError(t, err)
	res, err := others[0].Poll(ctx, storage.PollParams{Queue: q, Max: 1, Now: now})
	require.NoError(t, err)
	codes, err := others[0].Ack(ctx, storage.AckParams{Queue: q, Lease: res.Lease, IDs: []storage.ItemID{res.Items[0].ID}, Now: now})
	require.NoError(t, err)
	require.Equal(t, storage.CodeOK, codes[0])
	cfgKey := rawStr(rawNS('q'), q)
	dups := 0
	rdb.before = func(info *hookTxInfo) {
		for _, c := range info.clears {
			if bytes.Equal(c, cfgKey) {
				// A retried enqueue of key "k" on another node: a
				// duplicate, the queue stays empty.
				r, err := others[0].Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: in, Now: now})
				require.NoError(t, err)
				require.True(t, r[0].Duplicate)
				dups++
				return
			}
		}
	}
	_, err = a.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: q, Now: now})
	rdb.before = nil
	require.NoError(t, err, "delete of an empty queue after %d duplicate enqueues", dups)
}

// TestFDBDeleteQueue_RecreatedQueueDoesNotStarveCleanup (found by review,
// session 69; failed before its fix): after its first transaction removed
// the queue, DeleteQueue cleared the leftover dedup keys reading the rest
// of the queue's dedup range without snapshot, so
// every enqueue with a fresh dedup key into the queue created again under
// that name (a key the cleanup would never clear, here sorting among the
// old ones, as random keys do) aborts the attempt.
// With such an enqueue during every attempt DeleteQueue fails with the
// retry limit, reporting an error for a queue it did remove (a retry then
// gets ErrNotFound), and the old keys stay until they expire.
func TestFDBDeleteQueue_RecreatedQueueDoesNotStarveCleanup(t *testing.T) {
	t.Parallel()
	db, rdb, a, others := hookNodes(t, 1)
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)
	const q = "reborn"
	in := make([]storage.EnqueueItem, 1000)
	for round := 0; round < 2; round++ {
		for i := range in {
			in[i] = storage.EnqueueItem{Payload: []byte("x"), DedupKey: fmt.Sprintf("k%05d", round*1000+i)}
		}
		_, err := others[0].Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: in, Now: now})
		require.NoError(t, err)
	}
	_, err := others[0].Purge(ctx, storage.PurgeParams{Queue: q, Now: now})
	require.NoError(t, err)
	cfgKey := rawStr(rawNS('q'), q)
	dpre := rawStr(rawNS('u'), q)
	fresh := 0
	rdb.before = func(info *hookTxInfo) {
		if !anyPrefix(info.clears, dpre) {
			return
		}
		for _, c := range info.clears {
			if bytes.Equal(c, cfgKey) {
				return // the first transaction: let it commit
			}
		}
		// A producer enqueues into the queue created anew.
		fresh++
		r, err := others[0].Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{{Payload: []byte("y"), DedupKey: fmt.Sprintf("k01000x%05d", fresh)}}, Now: now})
		require.NoError(t, err)
		require.False(t, r[0].Duplicate)
	}
	_, err = a.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: q, Now: now})
	rdb.before = nil
	left := 0
	for _, r := range rawRange(t, db, dpre, kv.PrefixEnd(dpre)) {
		if !bytes.Contains(r.Key, []byte("x")) {
			left++ // an old key (the new queue's have an x)
		}
	}
	require.NoError(t, err, "delete queue (%d enqueues into the new queue meanwhile, %d old dedup keys left)", fresh, left)
	require.Zero(t, left, "old dedup keys left")
}
