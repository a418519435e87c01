package fdbsync_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync"
	"github.com/leaseq/leaseq/fdbsync/fdbmodel"
	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/storagetest"
)

// faulty is the fault mix the suites run under: every commit has a 5%
// chance of a conflict, 2% of transaction_too_old and 5% of
// commit_unknown_result (applied half the time).
var faulty = fdbmodel.Faults{NotCommitted: 0.05, TooOld: 0.02, UnknownResult: 0.05, UnknownApplied: 0.5}

// modelHarness runs Stores on a fresh model database each; Reopen opens a
// new Store (a new node) over the same database.
func modelHarness(f fdbmodel.Faults) storagetest.Harness {
	open := func(t testing.TB, db kv.DB) storage.Store {
		s, err := fdbsync.New(db, fdbsync.Options{})
		require.NoError(t, err)
		return s
	}
	var seed atomic.Uint64
	return storagetest.Harness{
		New: func(t testing.TB) storage.Store {
			f := f
			f.Seed = seed.Add(1)
			// The mock clock never moves: the suites pass instants in
			// Params, and the model's 5 s rule has its own tests.
			db := fdbmodel.New(fdbmodel.Options{Clock: clock.NewMock(), Faults: f})
			t.Cleanup(func() {
				st := db.Stats()
				require.Zero(t, st.TxnsOver1MB, "a transaction exceeded 1 MB (max %d bytes)", st.MaxTxnSize)
			})
			return open(t, db)
		},
		Reopen: func(t testing.TB, s storage.Store) storage.Store {
			fs := s.(*fdbsync.Store)
			require.NoError(t, fs.Close())
			return open(t, fs.DB())
		},
	}
}

func TestConformanceFDBModel(t *testing.T) {
	t.Parallel()
	storagetest.Run(t, modelHarness(fdbmodel.Faults{}))
}

func TestConformanceFDBModelWithFaults(t *testing.T) {
	t.Parallel()
	storagetest.Run(t, modelHarness(faulty))
}

func TestConformanceFDBModelAgainstMemstore(t *testing.T) {
	t.Parallel()
	storagetest.RunModel(t, modelHarness(faulty))
}

func TestConformanceFDBModelHistory(t *testing.T) {
	t.Parallel()
	storagetest.RunHistory(t, modelHarness(faulty), storagetest.HistoryConfig{})
}

func TestConformanceFDBModelAgainstMemstoreNoFaults(t *testing.T) {
	t.Parallel()
	storagetest.RunModel(t, modelHarness(fdbmodel.Faults{}))
}

// BenchmarkFDBModelStore runs the shared Store benchmarks on the model
// (no latency: it measures the layer's CPU cost, not a cluster's speed).
func BenchmarkFDBModelStore(b *testing.B) {
	storagetest.Bench(b, modelHarness(fdbmodel.Faults{}))
}

func TestFDBModel_Limits(t *testing.T) {
	t.Parallel()
	open := func(t *testing.T, lim storage.Limits) storage.Store {
		s, err := fdbsync.New(fdbmodel.New(fdbmodel.Options{Clock: clock.NewMock()}), fdbsync.Options{Limits: lim})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	t.Run("MaxQueues", func(t *testing.T) { storagetest.RunMaxQueues(t, open) })
	t.Run("PartialLimits", func(t *testing.T) { storagetest.RunPartialLimits(t, open) })
	t.Run("NewQueueWithinLimits", func(t *testing.T) { storagetest.RunNewQueueWithinLimits(t, open) })
}

// TestFDBModel_ConfigWithinEachNodesLimits: nodes of one cluster may run
// with different limits; a queue created by a node with the default
// limits (a 30 s lease) is leased by a node with MaxLease 10s for 10 s,
// and its config reads back within that node's limits.
func TestFDBModel_ConfigWithinEachNodesLimits(t *testing.T) {
	t.Parallel()
	db := fdbmodel.New(fdbmodel.Options{Clock: clock.NewMock()})
	wide, err := fdbsync.New(db, fdbsync.Options{})
	require.NoError(t, err)
	defer wide.Close()
	narrow, err := fdbsync.New(db, fdbsync.Options{Limits: storage.Limits{MaxLease: 10 * time.Second, MaxDelay: time.Minute}})
	require.NoError(t, err)
	defer narrow.Close()
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	_, err = wide.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("p")}}, Now: now})
	require.NoError(t, err)
	cfg, err := narrow.QueueConfig(ctx, "q")
	require.NoError(t, err)
	require.Equal(t, 10*time.Second, cfg.LeaseDuration)
	require.Equal(t, time.Minute, cfg.DedupWindow)
	p, err := narrow.Poll(ctx, storage.PollParams{Queue: "q", Max: 1, Now: now})
	require.NoError(t, err)
	require.Len(t, p.Items, 1)
	require.Equal(t, now.Add(10*time.Second).UnixNano(), p.ExpiresAt.UnixNano(), "the queue's lease within this node's MaxLease")
}
