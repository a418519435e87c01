package rocksstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// opClock is a logical clock: every read advances it by step, so the
// instants callers pass are monotonic in the order they are read.
type opClock struct {
	n    atomic.Int64
	step time.Duration
}

func (c *opClock) now() time.Time { return at(time.Duration(c.n.Add(1)) * c.step) }

// ackTrack records, per item, who acked it with CodeOK, so that an item
// acked twice (two consumers held it at once) or delivered after its ack
// is caught.
type ackTrack struct {
	mu     sync.Mutex
	acked  map[storage.ItemID]storage.LeaseID
	errs   []string
	polled map[storage.ItemID]int
}

func (r *ackTrack) fail(format string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errs) < 20 {
		r.errs = append(r.errs, fmt.Sprintf(format, a...))
	}
}

// concurrentWorkload runs workers polling, acking, nacking and extending one
// queue while a sweeper runs, and checks that no item is acked OK twice
// nor polled after its OK ack.
func concurrentWorkload(t *testing.T, b *testBundle, clk *opClock, seed uint64, workers, rounds int, vary bool, extra func(ctx context.Context, r *rand.Rand)) *ackTrack {
	t.Helper()
	tr := &ackTrack{acked: map[storage.ItemID]storage.LeaseID{}, polled: map[storage.ItemID]int{}}
	ctx := b.ctx
	var wg sync.WaitGroup
	stop := make(chan struct{})
	// Sweeper.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := b.s.Sweep(ctx, storage.SweepParams{Now: clk.now(), Limit: 16}); err != nil {
				tr.fail("sweep: %v", err)
				return
			}
		}
	}()
	if extra != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, 99))
			for {
				select {
				case <-stop:
					return
				default:
				}
				extra(ctx, r)
			}
		}()
	}
	var pw sync.WaitGroup
	for w := 0; w < workers; w++ {
		pw.Add(1)
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			defer pw.Done()
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			for i := 0; i < rounds; i++ {
				if r.IntN(8) == 0 {
					items := make([]storage.EnqueueItem, 1+r.IntN(4))
					for j := range items {
						items[j] = storage.EnqueueItem{Payload: []byte(fmt.Sprintf("w%d-%d-%d", w, i, j)), Priority: uint8(r.IntN(2))}
					}
					if _, err := b.s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: items, Now: clk.now()}); err != nil {
						tr.fail("enqueue: %v", err)
						return
					}
				}
				max, lease := 2, 300*time.Millisecond
				if vary {
					max = 1 + r.IntN(3)
					lease = time.Duration(r.IntN(2)) * 300 * time.Millisecond
				}
				res, err := b.s.Poll(ctx, storage.PollParams{Queue: "q", Max: max, Lease: lease, Now: clk.now()})
				if err != nil {
					tr.fail("poll: %v", err)
					return
				}
				if len(res.Items) == 0 {
					continue
				}
				tr.mu.Lock()
				for _, it := range res.Items {
					if l, ok := tr.acked[it.ID]; ok {
						tr.errs = append(tr.errs, fmt.Sprintf("item %s polled under lease %s after its ack under lease %s", it.ID, res.Lease, l))
					}
					tr.polled[it.ID]++
				}
				tr.mu.Unlock()
				ids := itemIDs(res.Items)
				switch k := r.IntN(10); {
				case k < 6: // ack all
				case k < 7:
					if _, err := b.s.ExtendLease(ctx, storage.ExtendParams{Queue: "q", Lease: res.Lease, Duration: 200 * time.Millisecond, Now: clk.now()}); err != nil && !errors.Is(err, storage.ErrLeaseExpired) {
						tr.fail("extend: %v", err)
						return
					}
				case k < 8:
					d := time.Duration(r.IntN(3)) * 50 * time.Millisecond
					if _, err := b.s.Nack(ctx, storage.NackParams{Queue: "q", Lease: res.Lease, IDs: ids[:1], Delay: &d, Reason: "x", Now: clk.now()}); err != nil {
						tr.fail("nack: %v", err)
						return
					}
					ids = ids[1:]
				case k < 9:
					if _, err := b.s.Nack(ctx, storage.NackParams{Queue: "q", Lease: res.Lease, IDs: ids, Undelivered: true, Now: clk.now()}); err != nil {
						tr.fail("nack undelivered: %v", err)
						return
					}
					ids = nil
				default: // let the lease run out
					ids = nil
				}
				if len(ids) == 0 {
					continue
				}
				codes, err := b.s.Ack(ctx, storage.AckParams{Queue: "q", Lease: res.Lease, IDs: ids, Now: clk.now()})
				if err != nil {
					tr.fail("ack: %v", err)
					return
				}
				tr.mu.Lock()
				for j, c := range codes {
					if c != storage.CodeOK {
						continue
					}
					if l, ok := tr.acked[ids[j]]; ok {
						tr.errs = append(tr.errs, fmt.Sprintf("item %s acked OK under lease %s and again under %s", ids[j], l, res.Lease))
					}
					tr.acked[ids[j]] = res.Lease
				}
				tr.mu.Unlock()
			}
		}(w)
	}
	pw.Wait()
	close(stop)
	wg.Wait()
	return tr
}

// requireReopenAgrees checks, at now, that a clean reopen rebuilds the
// same Stats and the same available and inflight items, and that every
// item enqueued is accounted for once.
func requireReopenAgrees(t *testing.T, b *testBundle, now time.Time) {
	t.Helper()
	peek := func() (ready, inflight []storage.Item) {
		ready, err := b.s.Peek(b.ctx, storage.PeekParams{Queue: "q", Limit: 1000, Now: now})
		require.NoError(t, err)
		inflight, err = b.s.Peek(b.ctx, storage.PeekParams{Queue: "q", Limit: 1000, Now: now, Inflight: true})
		require.NoError(t, err)
		return ready, inflight
	}
	before := b.stats("q", now)
	ready, inflight := peek()
	b.reopen()
	require.Equal(t, statsKey(before), statsKey(b.stats("q", now)))
	ready2, inflight2 := peek()
	require.Equal(t, ready, ready2)
	require.Equal(t, inflight, inflight2)
	total := before.Ready + before.Delayed + before.Inflight + before.Dead + int64(before.Acked) + int64(before.Purged)
	require.Equal(t, int64(before.Enqueued), total, "items lost or counted twice: %+v", before)
}

// statsKey is st without the fields a reopen may change (an age read
// at another instant, the corruption counter of this process).
func statsKey(st storage.QueueStats) storage.QueueStats {
	st.OldestReadyAge = 0
	st.CorruptErrors = 0
	return st
}

// TestConcurrentReopen_WorkloadAgrees: kept from a review (session 73)
// that found the engine right. A concurrent workload (claims ahead on) keeps every acknowledged item
// acked once and never redelivered; Check passes, and a clean reopen
// rebuilds the same Stats and the same available and inflight items.
func TestConcurrentReopen_WorkloadAgrees(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			b := setup(t, func(o *Options) { o.Sync = SyncAlways })
			clk := &opClock{step: time.Millisecond}
			require.NoError(t, b.s.SetQueueConfig(b.ctx, "q", storage.QueueConfig{MaxAttempts: 3, LeaseDuration: 300 * time.Millisecond, DedupWindow: time.Minute, BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second}))
			b.enqueueN("q", clk.now(), 200)
			tr := concurrentWorkload(t, b, clk, seed, 4, 150, false, nil)
			require.Empty(t, tr.errs)
			m := b.s.Metrics()
			t.Logf("prefetched %d hits %d released %d", m.Prefetched, m.PrefetchHits, m.PrefetchReleased)
			requireReopenAgrees(t, b, clk.now())
		})
	}
}

// The same workload with admin calls racing it: config changes (max
// attempts, default lease), redrive, dead purge and purge.
func TestConcurrentReopen_AdminAgrees(t *testing.T) { concurrentAdmin(t, false) }

// concurrentAdmin is the admin workload; vary: each poll's max (1-3) and
// lease (300 ms, or 0 for the queue's default) at random, so that held
// batches often do not match the next poll and config changes meet
// lease-0 polls.
func concurrentAdmin(t *testing.T, vary bool) {
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			b := setup(t, func(o *Options) { o.Sync = SyncAlways })
			clk := &opClock{step: time.Millisecond}
			cfg := storage.QueueConfig{MaxAttempts: 2, LeaseDuration: 300 * time.Millisecond, DedupWindow: time.Minute, BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second}
			require.NoError(t, b.s.SetQueueConfig(b.ctx, "q", cfg))
			b.enqueueN("q", clk.now(), 200)
			var admErr []string
			extra := func(ctx context.Context, r *rand.Rand) {
				var err error
				switch r.IntN(5) {
				case 0:
					c := cfg
					c.MaxAttempts = uint32(1 + r.IntN(3))
					c.LeaseDuration = time.Duration(200+r.IntN(3)*100) * time.Millisecond
					err = b.s.SetQueueConfig(ctx, "q", c)
				case 1:
					_, err = b.s.Redrive(ctx, storage.RedriveParams{Queue: "q", Limit: 3, Now: clk.now()})
				case 2:
					_, err = b.s.PurgeDead(ctx, storage.RedriveParams{Queue: "q", Limit: 1, Now: clk.now()})
				case 3:
					if r.IntN(20) == 0 {
						_, err = b.s.Purge(ctx, storage.PurgeParams{Queue: "q", Now: clk.now()})
					}
				case 4:
					_, err = b.s.Stats(ctx, storage.StatsParams{Queue: "q", Now: clk.now()})
				}
				if err != nil && len(admErr) < 10 {
					admErr = append(admErr, err.Error())
				}
			}
			tr := concurrentWorkload(t, b, clk, seed, 4, 150, vary, extra)
			require.Empty(t, tr.errs)
			require.Empty(t, admErr)
			requireReopenAgrees(t, b, clk.now())
		})
	}
}

func TestConcurrentReopen_VariedAgrees(t *testing.T) { concurrentAdmin(t, true) }

// A forced delete of a queue holding a batch claimed ahead, then the
// queue made anew: zeroed counters, Check passes, a reopen agrees.
func TestConcurrentReopen_DeleteQueueWithHeldBatch(t *testing.T) {
	b, _, _ := prefetchSetup(t, 8)
	b.pollAck(2, at(time.Second)) // the ack claims the next 2 ahead
	require.Equal(t, uint64(1), b.s.Metrics().Prefetched)
	n, err := b.s.DeleteQueue(b.ctx, storage.DeleteQueueParams{Queue: "q", Force: true, Now: at(time.Second)})
	require.NoError(t, err)
	require.Equal(t, 6, n)
	b.enqueueN("q", at(2*time.Second), 3)
	st := b.stats("q", at(2*time.Second))
	require.Equal(t, int64(3), st.Ready)
	require.Zero(t, st.Inflight)
	require.Zero(t, st.Leases)
	require.Zero(t, st.Delivered)
	b.check()
	b.reopen()
	require.Equal(t, statsKey(st), statsKey(b.stats("q", at(2*time.Second))))
}
