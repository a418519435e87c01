package fdbsync_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync"
	"github.com/leaseq/leaseq/fdbsync/fdbmodel"
	"github.com/leaseq/leaseq/storage"
)

// base is where logical time starts in these tests.
var base = time.Date(2031, 1, 2, 3, 4, 5, 6, time.UTC)

// logicalClock hands out increasing instants shared by every node: each
// operation advances time a little, so leases expire after a few thousand
// operations without any real waiting.
type logicalClock struct{ n atomic.Int64 }

func (c *logicalClock) now() time.Time {
	return base.Add(time.Duration(c.n.Add(1)) * 20 * time.Microsecond)
}

type delivery struct {
	id       storage.ItemID
	lease    storage.LeaseID
	attempts uint32
	at       time.Time
	expires  time.Time
}

type settle struct {
	id    storage.ItemID
	lease storage.LeaseID
	at    time.Time
	code  storage.Code
	ack   bool
}

// history is what one worker saw; merged after the run.
type history struct {
	enqueued   []storage.ItemID
	deliveries []delivery
	settles    []settle
}

type cluster struct {
	db     *fdbmodel.DB
	stores []*fdbsync.Store
	clk    logicalClock
}

func newCluster(t *testing.T, nodes int, f fdbmodel.Faults) *cluster {
	t.Helper()
	c := &cluster{db: fdbmodel.New(fdbmodel.Options{Clock: clock.NewMock(), Faults: f})}
	for i := 0; i < nodes; i++ {
		s, err := fdbsync.New(c.db, fdbsync.Options{Seed: uint64(i + 1)})
		require.NoError(t, err)
		c.stores = append(c.stores, s)
	}
	t.Cleanup(func() {
		for _, s := range c.stores {
			require.NoError(t, s.Close())
		}
	})
	return c
}

// TestFDBMultiNodeHistory runs producers, consumers and sweepers on 6 Store
// instances (6 nodes) sharing one model database with commit_unknown_result,
// conflicts and transaction_too_old injected, then checks the history: no
// two live leases on one item at once, every delivery accounted for
// (attempts 1..k with no gap or repeat: a lost or doubled claim would show),
// nothing delivered again after its ack, every item acked or dead, Check
// clean, and no transaction over 1 MB.
func TestFDBMultiNodeHistory(t *testing.T) {
	t.Parallel()
	items := 100_000
	if testing.Short() || raceEnabled {
		items = 10_000 // still well over the 10k floor; -race is ~10x slower
	}
	const (
		nodes     = 6
		producers = 3
		consumers = 9
		batch     = 250
		maxPoll   = 100
		queue     = "hot"
	)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d, %d items", seed, items)
	// The run must meet applied unknown results (asserted at the end). The
	// small run commits only about 500 write transactions: at 2 % unknown
	// it met none applied about once in 200 runs (seed 1795521636206102357,
	// 2 injected, neither applied), so it injects them more often.
	unknown := 0.02
	if items < 100_000 {
		unknown = 0.06
	}
	c := newCluster(t, nodes, fdbmodel.Faults{Seed: seed, NotCommitted: 0.01, TooOld: 0.005, UnknownResult: unknown, UnknownApplied: 0.5})
	ctx := context.Background()
	cfg := storage.DefaultQueueConfig()
	cfg.MaxAttempts = 3
	require.NoError(t, c.stores[0].SetQueueConfig(ctx, queue, cfg))

	var (
		wg           sync.WaitGroup
		hists        = make([]*history, producers+consumers)
		produced     atomic.Int64
		producing    atomic.Int32
		stop         = make(chan struct{})
		errs         = make(chan error, producers+consumers+nodes)
		settledItems atomic.Int64
	)
	producing.Store(producers)
	for p := 0; p < producers; p++ {
		h := &history{}
		hists[p] = h
		wg.Add(1)
		go func(p int) {
			defer wg.Done()
			defer producing.Add(-1)
			s := c.stores[p%nodes]
			for {
				n := int(produced.Add(batch))
				if n > items {
					return
				}
				in := make([]storage.EnqueueItem, batch)
				for i := range in {
					in[i] = storage.EnqueueItem{Payload: []byte(fmt.Sprintf("item-%d-%d", p, n+i))}
				}
				res, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: queue, Items: in, Now: c.clk.now()})
				if err != nil {
					errs <- fmt.Errorf("enqueue: %w", err)
					return
				}
				for _, r := range res {
					if r.Code != storage.CodeOK || r.Duplicate {
						errs <- fmt.Errorf("enqueue result %+v", r)
						return
					}
					h.enqueued = append(h.enqueued, r.ID)
				}
			}
		}(p)
	}
	for w := 0; w < consumers; w++ {
		h := &history{}
		hists[producers+w] = h
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			s := c.stores[w%nodes]
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for {
				select {
				case <-stop:
					return
				default:
				}
				now := c.clk.now()
				res, err := s.Poll(ctx, storage.PollParams{Queue: queue, Max: maxPoll, Lease: 100 * time.Millisecond, Now: now})
				if err != nil {
					errs <- fmt.Errorf("poll: %w", err)
					return
				}
				var acks, nacks []storage.ItemID
				for _, it := range res.Items {
					h.deliveries = append(h.deliveries, delivery{id: it.ID, lease: res.Lease, attempts: it.Attempts, at: now, expires: res.ExpiresAt})
					switch x := rng.IntN(100); {
					case x < 90:
						acks = append(acks, it.ID)
					case x < 96:
						nacks = append(nacks, it.ID)
					default:
						// Abandoned: the lease expires and a sweeper returns it.
					}
				}
				if len(acks) > 0 {
					at := c.clk.now()
					codes, err := s.Ack(ctx, storage.AckParams{Queue: queue, Lease: res.Lease, IDs: acks, Now: at})
					if err != nil {
						errs <- fmt.Errorf("ack: %w", err)
						return
					}
					for i, code := range codes {
						h.settles = append(h.settles, settle{id: acks[i], lease: res.Lease, at: at, code: code, ack: true})
						if code == storage.CodeOK {
							settledItems.Add(1)
						}
					}
				}
				if len(nacks) > 0 {
					at := c.clk.now()
					d := time.Duration(rng.IntN(3)) * time.Millisecond
					codes, err := s.Nack(ctx, storage.NackParams{Queue: queue, Lease: res.Lease, IDs: nacks, Delay: &d, Reason: "test", Now: at})
					if err != nil {
						errs <- fmt.Errorf("nack: %w", err)
						return
					}
					for i, code := range codes {
						h.settles = append(h.settles, settle{id: nacks[i], lease: res.Lease, at: at, code: code})
					}
				}
			}
		}(w)
	}
	// One sweeper per node, all at once; a ticker paces them (it is not
	// used to synchronize anything).
	var swg sync.WaitGroup
	for n := 0; n < nodes; n++ {
		swg.Add(1)
		go func(s *fdbsync.Store) {
			defer swg.Done()
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				if _, err := s.Sweep(ctx, storage.SweepParams{Now: c.clk.now(), Limit: 200}); err != nil {
					errs <- fmt.Errorf("sweep: %w", err)
					return
				}
			}
		}(c.stores[n])
	}
	// Monitor: stop when production is over and the queue is empty.
	deadline := time.Now().Add(100 * time.Second)
	for {
		select {
		case err := <-errs:
			close(stop)
			wg.Wait()
			swg.Wait()
			t.Fatal(err)
		case <-time.After(20 * time.Millisecond):
		}
		if producing.Load() > 0 {
			continue
		}
		st, err := c.stores[0].Stats(ctx, storage.StatsParams{Queue: queue, Now: c.clk.now()})
		require.NoError(t, err)
		if st[0].Ready+st[0].Delayed+st[0].Inflight == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "queue did not drain: %+v", st[0])
	}
	close(stop)
	wg.Wait()
	swg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	// Merge and verify.
	var all history
	for _, h := range hists {
		all.enqueued = append(all.enqueued, h.enqueued...)
		all.deliveries = append(all.deliveries, h.deliveries...)
		all.settles = append(all.settles, h.settles...)
	}
	require.Len(t, all.enqueued, items)
	known := map[storage.ItemID]bool{}
	for _, id := range all.enqueued {
		require.False(t, known[id], "id %s assigned twice", id)
		known[id] = true
	}
	byItem := map[storage.ItemID][]delivery{}
	for _, d := range all.deliveries {
		require.True(t, known[d.id], "delivered unknown id %s", d.id)
		byItem[d.id] = append(byItem[d.id], d)
	}
	type key struct {
		id    storage.ItemID
		lease storage.LeaseID
	}
	settled := map[key]settle{}
	acked := map[storage.ItemID]int{}
	for _, s := range all.settles {
		if s.code != storage.CodeOK {
			continue
		}
		k := key{s.id, s.lease}
		_, dup := settled[k]
		require.False(t, dup, "item %s settled twice under one lease", s.id)
		settled[k] = s
		if s.ack {
			acked[s.id]++
		}
	}
	dead := map[storage.ItemID]bool{}
	var after storage.ItemID
	for {
		page, err := c.stores[1].DeadList(ctx, storage.DeadListParams{Queue: queue, After: after, Limit: 1000})
		require.NoError(t, err)
		for _, d := range page {
			dead[d.ID] = true
		}
		if len(page) < 1000 {
			break
		}
		after = page[len(page)-1].ID
	}
	deliveries := 0
	for id := range known {
		ds := byItem[id]
		sort.Slice(ds, func(i, j int) bool { return ds[i].attempts < ds[j].attempts })
		for i, d := range ds {
			require.Equal(t, uint32(i+1), d.attempts, "item %s: deliveries must be attempts 1..k exactly (a lost or doubled claim breaks this)", id)
			deliveries++
			if i == 0 {
				continue
			}
			prev := ds[i-1]
			free := prev.expires
			if s, ok := settled[key{id, prev.lease}]; ok {
				require.False(t, s.ack, "item %s delivered again after its ack", id)
				require.True(t, s.at.Before(prev.expires), "item %s settled at %v after its lease expired at %v", id, s.at, prev.expires)
				free = s.at
			}
			require.False(t, d.at.Before(free), "item %s: delivery %d at %v while delivery %d held it until %v", id, i+1, d.at, i, free)
		}
		switch {
		case acked[id] == 1:
			require.False(t, dead[id], "item %s acked and dead", id)
			last := ds[len(ds)-1]
			_, ok := settled[key{id, last.lease}]
			require.True(t, ok, "item %s: the ack must settle its last delivery", id)
		case acked[id] == 0:
			require.True(t, dead[id], "item %s neither acked nor dead", id)
		default:
			t.Fatalf("item %s acked %d times", id, acked[id])
		}
	}
	rep, err := c.stores[2].Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Violations)
	st := c.db.Stats()
	require.Zero(t, st.TxnsOver1MB)
	require.Less(t, st.MaxTxnSize, 1<<20)
	var retries, claimed int64
	for _, s := range c.stores {
		m := s.Metrics()
		retries += m.PollRetries
		claimed += m.Claimed
	}
	t.Logf("items %d, deliveries %d, dead %d; model: %d txns, %d conflicts, %d injected unknown (%d applied), max txn %d bytes; poll retries per claimed item %.4f",
		items, deliveries, len(dead), st.Transactions, st.Conflicts, st.InjUnknown, st.InjUnknownApplied, st.MaxTxnSize, float64(retries)/float64(claimed))
	require.Positive(t, st.InjUnknownApplied, "the run must have exercised applied unknown results")
}
