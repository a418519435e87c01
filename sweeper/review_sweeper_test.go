package sweeper

// Review (session 74) of the sweeper over real RocksDB: an expired lease
// comes back exactly once, a storm of leases expiring together drains in
// bounded batches that each commit (progress shows mid-pass), and Stop in
// the middle of a storm is clean.

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// hookStore runs hook (when set) before each Sweep call of the store it
// wraps, with the call's 1-based number and its ctx.
type hookStore struct {
	storage.Store
	mu   sync.Mutex
	n    int
	hook func(ctx context.Context, n int)
}

func (h *hookStore) Sweep(ctx context.Context, p storage.SweepParams) (storage.SweepResult, error) {
	h.mu.Lock()
	h.n++
	n, hook := h.n, h.hook
	h.mu.Unlock()
	if hook != nil {
		hook(ctx, n)
	}
	return h.Store.Sweep(ctx, p)
}

func (h *hookStore) setHook(f func(ctx context.Context, n int)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.n = 0
	h.hook = f
}

func (h *hookStore) calls() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// setupHooked is setupStore over RocksDB (without fsyncs: the storms
// below take thousands of leases) behind a hookStore.
func setupHooked(t *testing.T, cfg Config) (*storeBundle, *hookStore) {
	t.Helper()
	hs := &hookStore{}
	b := setupStore(t, func(t *testing.T, f storage.DeadlineFunc) storage.Store {
		s, err := rocksstore.Open(t.TempDir(), rocksstore.Options{OnDeadline: f, Sync: rocksstore.SyncNone})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, s.Close()) })
		hs.Store = s
		return hs
	}, cfg)
	return b, hs
}

// leaseMany enqueues n items on queue and polls them one lease each (the
// sweep limit counts leases), all of d, so they expire together.
func (b *storeBundle) leaseMany(t *testing.T, queue string, n int, d time.Duration) {
	t.Helper()
	for done := 0; done < n; {
		k := min(1000, n-done)
		items := make([]storage.EnqueueItem, k)
		for i := range items {
			items[i] = storage.EnqueueItem{Payload: []byte("x")}
		}
		b.enqueue(t, queue, items...)
		done += k
	}
	for range n {
		require.Len(t, b.poll(t, queue, 1, d).Items, 1)
	}
}

// TestReview_ExpiredLeaseReturnsExactlyOnce: a lease that runs out puts
// its item back once; later passes (timer-driven, with nothing due) do not
// expire it again, the new holder keeps it, and the old lease's ack is
// refused.
func TestReview_ExpiredLeaseReturnsExactlyOnce(t *testing.T) {
	t.Parallel()
	b, _ := setupHooked(t, Config{SweepInterval: time.Second})
	b.enqueue(t, "q", storage.EnqueueItem{Payload: []byte("x")})
	first := b.poll(t, "q", 1, time.Second)
	require.Len(t, first.Items, 1)
	b.start(t)
	require.Zero(t, b.nextPass(t).res.LeasesExpired)

	b.advanceTo(t, b.at(time.Second))
	second := b.poll(t, "q", 10, time.Hour)
	require.Len(t, second.Items, 1, "the expired item is delivered again")
	require.Equal(t, first.Items[0].ID, second.Items[0].ID)
	require.Equal(t, uint32(2), second.Items[0].Attempts)

	// Ten more passes, one per SweepInterval: nothing more expires. (The
	// timer for 2 s was armed: advanceTo saw it.)
	for i := 2; i <= 11; i++ {
		if i > 2 {
			b.waitArmed(t, b.at(time.Duration(i)*time.Second))
		}
		b.clock.Add(time.Second)
		ev := b.nextPass(t)
		require.NoError(t, ev.err)
		require.Zero(t, ev.res.LeasesExpired)
	}
	require.Empty(t, b.poll(t, "q", 10, time.Hour).Items, "a second copy came back")
	st := b.stats(t, "q")
	require.Equal(t, uint64(1), st.Expired)
	require.Equal(t, int64(1), st.Inflight)
	require.Equal(t, int64(0), st.Ready)
	m := b.sweeper.Metrics()
	require.Equal(t, uint64(1), m.LeasesExpired)
	require.GreaterOrEqual(t, m.Passes, uint64(12))
	require.Zero(t, m.FailedPasses)

	codes, err := b.store.Ack(context.Background(), storage.AckParams{Queue: "q", Lease: first.Lease, IDs: []storage.ItemID{first.Items[0].ID}, Now: b.clock.Now()})
	require.NoError(t, err)
	require.NotEqual(t, storage.CodeOK, codes[0], "the expired lease's ack is refused")
	codes, err = b.store.Ack(context.Background(), storage.AckParams{Queue: "q", Lease: second.Lease, IDs: []storage.ItemID{second.Items[0].ID}, Now: b.clock.Now()})
	require.NoError(t, err)
	require.Equal(t, storage.CodeOK, codes[0])
}

// TestReview_StormDrainsInCommittedBatches: 3000 leases expire at once
// with a batch limit of 64. One pass expires every one exactly once, in
// bounded Sweep calls; each call commits on its own, so mid-pass a
// foreground poll already gets requeued items and the store answers
// foreground calls between batches; OnReady wakes the queue once.
func TestReview_StormDrainsInCommittedBatches(t *testing.T) {
	t.Parallel()
	const n, batch = 3000, 64
	b, hs := setupHooked(t, Config{BatchLimit: batch, SweepInterval: time.Minute})
	b.leaseMany(t, "storm", n, time.Second)
	b.start(t)
	require.Zero(t, b.nextPass(t).res.LeasesExpired)
	b.waitArmed(t, b.at(time.Second))

	var midPass storage.PollResult
	var midStats storage.QueueStats
	hs.setHook(func(_ context.Context, call int) {
		if call != 10 {
			return
		}
		// Between batches 9 and 10, on the sweeper goroutine: the store
		// takes foreground calls and shows the batches done so far.
		midStats = b.stats(t, "storm")
		midPass = b.poll(t, "storm", 5, time.Hour)
	})
	b.clock.Add(time.Second)
	ev := b.nextPass(t)
	require.NoError(t, ev.err)
	require.Equal(t, n, ev.res.LeasesExpired)
	require.Equal(t, n, ev.res.Requeued)
	require.GreaterOrEqual(t, hs.calls(), n/batch, "bounded batches")
	require.Equal(t, int64(9*batch), midStats.Ready, "nine batches committed before the tenth")
	require.Len(t, midPass.Items, 5, "a foreground poll mid-pass gets requeued items")
	require.Equal(t, []string{"storm"}, <-b.ready)

	st := b.stats(t, "storm")
	require.Equal(t, uint64(n), st.Expired, "every lease expired exactly once")
	require.Equal(t, int64(n-5), st.Ready)
	require.Equal(t, int64(5), st.Inflight)
	require.Equal(t, uint64(n), b.sweeper.Metrics().LeasesExpired)
}

// TestReview_StopMidStorm: Stop while a storm pass is between batches
// returns once the loop ends, counts no failure, makes no Sweep call
// after it returns, and leaves every item either requeued or still
// leased; a later Start is refused.
func TestReview_StopMidStorm(t *testing.T) {
	t.Parallel()
	const n, batch = 2000, 64
	b, hs := setupHooked(t, Config{BatchLimit: batch, SweepInterval: time.Minute})
	b.leaseMany(t, "storm", n, time.Second)
	b.start(t)
	b.nextPass(t)
	b.waitArmed(t, b.at(time.Second))

	reached := make(chan struct{})
	hs.setHook(func(ctx context.Context, call int) {
		if call == 5 {
			close(reached)
			<-ctx.Done() // held until Stop cancels the loop
		}
	})
	b.clock.Add(time.Second)
	select {
	case <-reached:
	case <-time.After(signalTimeout):
		t.Fatal("the storm pass never reached its fifth batch")
	}
	b.sweeper.Stop()
	ev := b.nextPass(t)
	require.Error(t, ev.err, "the pass was cut short")
	require.Equal(t, 4*batch, ev.res.LeasesExpired, "the batches before Stop")
	calls := hs.calls()
	m := b.sweeper.Metrics()
	require.Zero(t, m.FailedPasses, "a pass cut short by Stop is no failure")
	require.Equal(t, uint64(4*batch), m.LeasesExpired)

	b.clock.Add(time.Hour)
	require.Equal(t, calls, hs.calls(), "no Sweep after Stop")
	require.Error(t, b.sweeper.Start(context.Background()))
	st := b.stats(t, "storm")
	require.Equal(t, int64(4*batch), st.Ready)
	require.Equal(t, int64(n-4*batch), st.Inflight)
	require.Equal(t, uint64(4*batch), st.Expired)
}
