package rocksstore

import (
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// A caller that takes the lead for a small call yields its P once before
// it takes the first batch (submitGroup, yieldBelowItems), so callers
// already runnable pend their ops and share that batch. With one P the
// order is fixed: the spawned callers wait on the P's run queue while the
// first of them leads. Without the yield the leader's first batch holds
// its own call alone, always.
//
// The scheduler takes a goroutine from the global run queue (where
// runtime.Gosched puts the leader) ahead of the local one on one
// schedule in 61, so a round may split once in a while; a few rounds
// make a miss of every one of them vanishingly rare.
func TestRocksStore_LeaderYieldsToRunnableCallers(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	b := setup(t)
	b.enqueueN("q", at(0), 1) // the queue and its first id block exist
	const callers, rounds = 8, 5
	round := func(items int) Metrics {
		before := b.s.Metrics()
		errs := make([]error, callers)
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				batch := make([]storage.EnqueueItem, items)
				for j := range batch {
					batch[j] = storage.EnqueueItem{Payload: []byte{byte(i), byte(j)}}
				}
				_, errs[i] = b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: batch, Now: at(0)})
			})
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		d := b.s.Metrics().Sub(before)
		require.Equal(t, uint64(callers), d.Ops, "items=%d", items)
		return d
	}
	shared := 0
	for range rounds {
		if round(1).Commits == 1 {
			shared++
		}
	}
	t.Logf("single-item calls: %d of %d rounds in one batch", shared, rounds)
	require.Positive(t, shared, "no round of %d single-item calls shared the leader's first batch", callers)
	for range rounds {
		// Calls this large do not yield: the leader's own goes alone.
		require.Greater(t, round(yieldBelowItems).Commits, uint64(1), "calls of %d items", yieldBelowItems)
	}
	require.Equal(t, int64(1+rounds*callers*(1+yieldBelowItems)), b.stats("q", at(0)).Ready)
}
