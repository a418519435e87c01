package sweeper

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/memstore"
)

// storeFactory opens an empty store whose DeadlineFunc is onDeadline and
// registers its Close as cleanup.
type storeFactory func(t *testing.T, onDeadline storage.DeadlineFunc) storage.Store

func openMemstore(t *testing.T, onDeadline storage.DeadlineFunc) storage.Store {
	s := memstore.New(memstore.Options{OnDeadline: onDeadline})
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// storeBundle is a testBundle over a real Store wired like main wires it:
// the store's DeadlineFunc calls the sweeper's Notify.
type storeBundle struct {
	*testBundle
	store storage.Store
}

// setupStore opens a store with open and builds a Sweeper over it (not
// started). Cleanup stops the sweeper before the store closes.
func setupStore(t *testing.T, open storeFactory, cfg Config) *storeBundle {
	t.Helper()
	// As in main: the store exists before the sweeper, and Notify on a nil
	// *Sweeper is a no-op.
	var sw atomic.Pointer[Sweeper]
	store := open(t, func(d time.Time) { sw.Load().Notify(d) })
	b := setup(t, store, cfg)
	sw.Store(b.sweeper)
	return &storeBundle{testBundle: b, store: store}
}

func (b *storeBundle) enqueue(t *testing.T, queue string, items ...storage.EnqueueItem) {
	t.Helper()
	res, err := b.store.Enqueue(context.Background(), storage.EnqueueParams{Queue: queue, Items: items, Now: b.clock.Now()})
	require.NoError(t, err)
	for _, r := range res {
		require.Equal(t, storage.CodeOK, r.Code, r.Err)
	}
}

func (b *storeBundle) poll(t *testing.T, queue string, max int, lease time.Duration) storage.PollResult {
	t.Helper()
	res, err := b.store.Poll(context.Background(), storage.PollParams{Queue: queue, Max: max, Lease: lease, Now: b.clock.Now()})
	require.NoError(t, err)
	return res
}

func (b *storeBundle) stats(t *testing.T, queue string) storage.QueueStats {
	t.Helper()
	st, err := b.store.Stats(context.Background(), storage.StatsParams{Queue: queue, Now: b.clock.Now()})
	require.NoError(t, err)
	require.Len(t, st, 1)
	return st[0]
}

func TestSweeper_Memstore(t *testing.T) {
	t.Parallel()
	runStoreTests(t, openMemstore)
}

// runStoreTests is the behaviour of the sweeper over a real Store. Each
// backend's test calls it.
func runStoreTests(t *testing.T, open storeFactory) {
	t.Run("LeaseReclaimedAtExactDeadline", func(t *testing.T) {
		t.Parallel()
		testLeaseReclaimedAtExactDeadline(t, open)
	})

	t.Run("StoreDeadlineRearmsTimer", func(t *testing.T) {
		t.Parallel()
		b := setupStore(t, open, Config{SweepInterval: 10 * time.Second})
		b.start(t)
		b.nextPass(t)
		b.waitArmed(t, b.at(10*time.Second))

		// The poll creates a lease expiring at +3 s; the store's
		// DeadlineFunc tells the sweeper, which re-arms from 10 s to 3 s.
		b.enqueue(t, "q", storage.EnqueueItem{Payload: []byte("x")})
		lease := b.poll(t, "q", 1, 3*time.Second)
		require.Len(t, lease.Items, 1)
		b.waitArmed(t, b.at(3*time.Second))

		b.clock.Add(3*time.Second - time.Millisecond)
		b.noPassYet(t)
		b.clock.Add(time.Millisecond)
		ev := b.nextPass(t)
		require.NoError(t, ev.err)
		require.Equal(t, 1, ev.res.LeasesExpired)
		require.Equal(t, []string{"q"}, <-b.ready)
		require.Equal(t, int64(1), b.stats(t, "q").Ready)
	})

	t.Run("DelayedItemPromotedAtVisibleAt", func(t *testing.T) {
		t.Parallel()
		b := setupStore(t, open, Config{SweepInterval: 10 * time.Second})
		b.start(t)
		b.nextPass(t)
		b.waitArmed(t, b.at(10*time.Second))

		b.enqueue(t, "later", storage.EnqueueItem{Payload: []byte("x"), Delay: 2 * time.Second})
		b.waitArmed(t, b.at(2*time.Second))
		b.clock.Add(2 * time.Second)
		ev := b.nextPass(t)
		require.NoError(t, ev.err)
		require.Equal(t, 1, ev.res.Promoted)
		require.Equal(t, []string{"later"}, <-b.ready, "OnReady wakes pollers of a queue whose delayed item became ready")
		st := b.stats(t, "later")
		require.Equal(t, int64(1), st.Ready)
		require.Equal(t, int64(0), st.Delayed)
	})

	t.Run("BoundedBatchesLoopWhileMore", func(t *testing.T) {
		t.Parallel()
		counting := &countingStore{}
		b := setupStore(t, func(t *testing.T, f storage.DeadlineFunc) storage.Store {
			counting.Store = open(t, f)
			return counting
		}, Config{BatchLimit: 2, SweepInterval: time.Minute})
		for range 5 {
			b.enqueue(t, "q", storage.EnqueueItem{Payload: []byte("x")})
			require.Len(t, b.poll(t, "q", 1, time.Second).Items, 1)
		}
		b.start(t)
		b.nextPass(t)
		b.waitArmed(t, b.at(time.Second))
		before := counting.count()

		b.clock.Add(time.Second)
		ev := b.nextPass(t)
		require.NoError(t, ev.err)
		require.Equal(t, 5, ev.res.LeasesExpired, "one pass expires all due leases")
		require.Equal(t, 5, ev.res.Requeued)
		require.Equal(t, 3, counting.count()-before, "in batches of 2, 2 and 1")
		for _, p := range counting.params() {
			require.Equal(t, 2, p.Limit)
		}
		require.Equal(t, []string{"q"}, <-b.ready)
		require.Equal(t, int64(5), b.stats(t, "q").Ready)
	})

	t.Run("ExpiryDeadLettersExhaustedItems", func(t *testing.T) {
		t.Parallel()
		b := setupStore(t, open, Config{})
		b.enqueue(t, "q", storage.EnqueueItem{Payload: []byte("x"), MaxAttempts: 1})
		require.Len(t, b.poll(t, "q", 1, 500*time.Millisecond).Items, 1)
		b.start(t)
		b.nextPass(t)
		b.waitArmed(t, b.at(500*time.Millisecond))
		b.clock.Add(500 * time.Millisecond)
		ev := b.nextPass(t)
		require.NoError(t, ev.err)
		require.Equal(t, 1, ev.res.LeasesExpired)
		require.Equal(t, 1, ev.res.DeadLettered)
		require.Empty(t, ev.res.ReadyQueues)
		st := b.stats(t, "q")
		require.Equal(t, int64(1), st.Dead)
		require.Equal(t, int64(0), st.Inflight)
		m := b.sweeper.Metrics()
		require.Equal(t, uint64(1), m.DeadLettered)
		require.Equal(t, uint64(1), m.LeasesExpired)
	})
}

// testLeaseReclaimedAtExactDeadline is DESIGN.md's promise: a lease set for
// 30 s is reclaimed at exactly +30 s of mock time, and not at +30 s - 1 ms,
// with the default 1 s cap on the timer.
func testLeaseReclaimedAtExactDeadline(t *testing.T, open storeFactory) {
	b := setupStore(t, open, Config{})
	deadline := b.at(30 * time.Second)
	b.enqueue(t, "q1", storage.EnqueueItem{Payload: []byte("work")})
	lease := b.poll(t, "q1", 10, 30*time.Second)
	require.Len(t, lease.Items, 1)
	require.True(t, lease.ExpiresAt.Equal(deadline))

	b.start(t)
	first := b.nextPass(t)
	require.NoError(t, first.err)
	require.Zero(t, first.res.LeasesExpired)
	require.True(t, first.res.Next.Equal(deadline), "store reports the lease deadline, got %v", first.res.Next)

	// Walk the 1 s capped timers (1 s, 2 s, ..., 29 s, then the deadline
	// itself) up to one millisecond before the deadline.
	b.advanceTo(t, deadline.Add(-time.Millisecond))
	b.noPassYet(t)
	st := b.stats(t, "q1")
	require.Equal(t, int64(1), st.Inflight, "reclaimed before the deadline")
	require.Equal(t, int64(0), st.Ready)
	require.Zero(t, b.sweeper.Metrics().LeasesExpired)

	b.clock.Add(time.Millisecond)
	ev := b.nextPass(t)
	require.NoError(t, ev.err)
	require.Equal(t, 1, ev.res.LeasesExpired)
	require.Equal(t, 1, ev.res.Requeued)
	require.Equal(t, []string{"q1"}, <-b.ready)
	require.True(t, b.clock.Now().Equal(deadline))
	st = b.stats(t, "q1")
	require.Equal(t, int64(0), st.Inflight)
	require.Equal(t, int64(1), st.Ready)
	require.Equal(t, uint64(1), st.Expired)

	// The old token is dead and the item is served again, as a second
	// delivery.
	again := b.poll(t, "q1", 10, 30*time.Second)
	require.Len(t, again.Items, 1)
	require.Equal(t, lease.Items[0].ID, again.Items[0].ID)
	require.Equal(t, uint32(2), again.Items[0].Attempts)

	m := b.sweeper.Metrics()
	require.Equal(t, uint64(1), m.LeasesExpired)
	require.Equal(t, uint64(1), m.Requeued)
	require.Equal(t, time.Duration(0), m.LastLag, "timer fired exactly at its deadline")
	require.Equal(t, 1, b.logs.count(slog.LevelInfo, "sweep expired leases"))
}

// countingStore records the params of every Sweep call of the store it
// wraps.
type countingStore struct {
	storage.Store
	mu    sync.Mutex
	calls []storage.SweepParams
}

func (c *countingStore) Sweep(ctx context.Context, p storage.SweepParams) (storage.SweepResult, error) {
	c.mu.Lock()
	c.calls = append(c.calls, p)
	c.mu.Unlock()
	return c.Store.Sweep(ctx, p)
}

func (c *countingStore) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.calls)
}

// params returns the params of the calls after the first (the start pass).
func (c *countingStore) params() []storage.SweepParams {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]storage.SweepParams(nil), c.calls[1:]...)
}
