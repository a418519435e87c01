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

// With SyncNone a leader whose store has served one caller at a time for
// more than aloneCalls calls does not yield (enterCall): nobody's op could
// join its batch, and the yield only cost a thread's wake-up and sleep.
// The first call that meets another in the store restarts the yield, and
// so does an asynchronous call. Without SyncNone the count never stops
// the yield.
func TestPipeline_LoneCallerStopsYielding(t *testing.T) {
	p := &pipeline{skipLoneYield: true}
	lone := func() bool {
		alone := p.enterCall()
		p.exitCall()
		return alone
	}
	for i := range aloneCalls {
		require.False(t, lone(), "call %d", i+1)
	}
	for range 3 {
		require.True(t, lone(), "after %d lone calls", aloneCalls)
	}
	require.Equal(t, uint32(aloneCalls+1), p.alone.Load(), "the count stops once past aloneCalls")

	// A second call while the first is still in the store.
	require.True(t, p.enterCall())
	require.False(t, p.enterCall(), "a call that meets another")
	p.exitCall()
	p.exitCall()
	require.Zero(t, p.callers.Load())
	require.False(t, lone(), "the first lone call after a crowd")

	for range aloneCalls + 1 {
		lone()
	}
	require.True(t, lone())
	p.crowded() // what submitAsync does
	require.False(t, lone(), "the first lone call after an asynchronous one")

	q := &pipeline{} // SyncAlways
	for i := range 2 * aloneCalls {
		alone := q.enterCall()
		q.exitCall()
		require.False(t, alone, "SyncAlways, call %d", i+1)
	}
	require.Zero(t, q.callers.Load())
}

// The same through the store, on one P: after a run of lone calls with
// SyncNone, the leader of a round of single-item callers takes its first
// batch at once, alone (with the yield, TestRocksStore_LeaderYieldsTo
// RunnableCallers shows them sharing it); with SyncAlways the leader
// still yields and they share it.
func TestRocksStore_LoneCallerStopsYielding(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const callers = 8
	round := func(b *testBundle) Metrics {
		before := b.s.Metrics()
		errs := make([]error, callers)
		var wg sync.WaitGroup
		for i := range callers {
			wg.Go(func() {
				_, errs[i] = b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte{byte(i)}}}, Now: at(0)})
			})
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
		return b.s.Metrics().Sub(before)
	}
	for _, tc := range []struct {
		name string
		sync SyncMode
	}{{"none", SyncNone}, {"always", SyncAlways}} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t, func(o *Options) { o.Sync = tc.sync })
			for range aloneCalls + 1 {
				b.enqueueN("q", at(0), 1) // one call at a time
			}
			d := round(b)
			require.Equal(t, uint64(callers), d.Ops)
			if tc.sync == SyncNone {
				require.Greater(t, d.Commits, uint64(1), "the lone leader's first batch holds its call alone")
				return
			}
			shared := d.Commits == 1
			for i := 0; i < 4 && !shared; i++ {
				shared = round(b).Commits == 1
			}
			require.True(t, shared, "with SyncAlways a leader still yields to runnable callers")
		})
	}
}
