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

// reviewClock is a logical clock: every read advances it by step, so the
// instants callers pass are monotonic in the order they are read.
type reviewClock struct {
	n    atomic.Int64
	step time.Duration
}

func (c *reviewClock) now() time.Time { return at(time.Duration(c.n.Add(1)) * c.step) }

// reviewTrack records, per item, who acked it with CodeOK, so that an item
// acked twice (two consumers held it at once) or delivered after its ack
// is caught.
type reviewTrack struct {
	mu     sync.Mutex
	acked  map[storage.ItemID]storage.LeaseID
	errs   []string
	polled map[storage.ItemID]int
}

func (r *reviewTrack) fail(format string, a ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errs) < 20 {
		r.errs = append(r.errs, fmt.Sprintf(format, a...))
	}
}

// reviewWorkload runs workers polling, acking, nacking and extending one
// queue while a sweeper runs, and checks that no item is acked OK twice
// nor polled after its OK ack.
func reviewWorkload(t *testing.T, b *testBundle, clk *reviewClock, seed uint64, workers, rounds int, extra func(ctx context.Context, r *rand.Rand)) *reviewTrack {
	t.Helper()
	tr := &reviewTrack{acked: map[storage.ItemID]storage.LeaseID{}, polled: map[storage.ItemID]int{}}
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
				if reviewVary {
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

var reviewVary bool

func reviewStatsKey(st storage.QueueStats) storage.QueueStats {
	st.OldestReadyAge = 0
	st.CorruptErrors = 0
	return st
}

// A concurrent workload (claims ahead on) keeps every acknowledged item
// acked once and never redelivered; Check passes, and a clean reopen
// rebuilds the same Stats and the same available and inflight items.
func TestReviewEngine_ConcurrentWorkloadReopenAgrees(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			b := setup(t, func(o *Options) { o.Sync = SyncAlways })
			clk := &reviewClock{step: time.Millisecond}
			require.NoError(t, b.s.SetQueueConfig(b.ctx, "q", storage.QueueConfig{MaxAttempts: 3, LeaseDuration: 300 * time.Millisecond, DedupWindow: time.Minute, BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second}))
			b.enqueueN("q", clk.now(), 200)
			tr := reviewWorkload(t, b, clk, seed, 4, 150, nil)
			require.Empty(t, tr.errs)
			m := b.s.Metrics()
			t.Logf("prefetched %d hits %d released %d", m.Prefetched, m.PrefetchHits, m.PrefetchReleased)
			now := clk.now()
			before := b.stats("q", now)
			peekA, err := b.s.Peek(b.ctx, storage.PeekParams{Queue: "q", Limit: 1000, Now: now})
			require.NoError(t, err)
			peekI, err := b.s.Peek(b.ctx, storage.PeekParams{Queue: "q", Limit: 1000, Now: now, Inflight: true})
			require.NoError(t, err)
			b.reopen()
			after := b.stats("q", now)
			require.Equal(t, reviewStatsKey(before), reviewStatsKey(after))
			peekA2, err := b.s.Peek(b.ctx, storage.PeekParams{Queue: "q", Limit: 1000, Now: now})
			require.NoError(t, err)
			peekI2, err := b.s.Peek(b.ctx, storage.PeekParams{Queue: "q", Limit: 1000, Now: now, Inflight: true})
			require.NoError(t, err)
			require.Equal(t, peekA, peekA2)
			require.Equal(t, peekI, peekI2)
			total := before.Ready + before.Delayed + before.Inflight + before.Dead + int64(before.Acked) + int64(before.Purged)
			require.Equal(t, int64(before.Enqueued), total, "items lost or counted twice: %+v", before)
		})
	}
}

// The same workload with admin calls racing it: config changes (max
// attempts, default lease), redrive, dead purge and purge.
func TestReviewEngine_ConcurrentAdminReopenAgrees(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			b := setup(t, func(o *Options) { o.Sync = SyncAlways })
			clk := &reviewClock{step: time.Millisecond}
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
			tr := reviewWorkload(t, b, clk, seed, 4, 150, extra)
			require.Empty(t, tr.errs)
			require.Empty(t, admErr)
			now := clk.now()
			before := b.stats("q", now)
			peekA, err := b.s.Peek(b.ctx, storage.PeekParams{Queue: "q", Limit: 1000, Now: now})
			require.NoError(t, err)
			peekI, err := b.s.Peek(b.ctx, storage.PeekParams{Queue: "q", Limit: 1000, Now: now, Inflight: true})
			require.NoError(t, err)
			b.reopen()
			after := b.stats("q", now)
			require.Equal(t, reviewStatsKey(before), reviewStatsKey(after))
			peekA2, err := b.s.Peek(b.ctx, storage.PeekParams{Queue: "q", Limit: 1000, Now: now})
			require.NoError(t, err)
			peekI2, err := b.s.Peek(b.ctx, storage.PeekParams{Queue: "q", Limit: 1000, Now: now, Inflight: true})
			require.NoError(t, err)
			require.Equal(t, peekA, peekA2)
			require.Equal(t, peekI, peekI2)
			total := before.Ready + before.Delayed + before.Inflight + before.Dead + int64(before.Acked) + int64(before.Purged)
			require.Equal(t, int64(before.Enqueued), total, "items lost or counted twice: %+v", before)
		})
	}
}

func TestReviewEngine_ConcurrentVariedReopenAgrees(t *testing.T) {
	reviewVary = true
	defer func() { reviewVary = false }()
	TestReviewEngine_ConcurrentAdminReopenAgrees(t)
}
