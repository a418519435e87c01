package fdbsync_test

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync"
	"github.com/leaseq/leaseq/fdbsync/fdbmodel"
	"github.com/leaseq/leaseq/storage"
)

// A node opened with its clock a day behind what another node wrote
// reads that node's time as Latest, from each source alone: a heartbeat
// of a node still polling (it wrote nothing else), and, after every node
// closed (Close clears heartbeats), the dedup key that expires last or the
// delayed item due last. An empty cluster and a store from New report
// zero. serve.go raises the node's clock to Latest as it does for
// rocksstore's.
func TestReviewLatest74_OpenReadsOtherNodesTime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t0 := time.Unix(1_800_000_000, 0).UTC()
	behind := clock.NewMock()
	behind.Set(t0.Add(-24 * time.Hour))

	open := func(t *testing.T, db *fdbmodel.DB) *fdbsync.Store {
		s, err := fdbsync.Open(ctx, db, fdbsync.Options{Seed: 9, Clock: behind})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, s.Close()) })
		return s
	}
	for _, tc := range []struct {
		name  string
		write func(t *testing.T, a *fdbsync.Store) // a writes at t0
		close bool                                 // a closes before the other node opens
	}{
		{"heartbeat", func(t *testing.T, a *fdbsync.Store) {
			_, err := a.Poll(ctx, storage.PollParams{Queue: "q", Max: 1, Now: t0})
			require.NoError(t, err)
		}, false},
		{"dedup", func(t *testing.T, a *fdbsync.Store) {
			_, err := a.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Now: t0.Add(-time.Minute), Items: []storage.EnqueueItem{{Payload: []byte("old"), DedupKey: "k1"}}})
			require.NoError(t, err)
			_, err = a.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Now: t0, Items: []storage.EnqueueItem{{Payload: []byte("p"), DedupKey: "k2"}}})
			require.NoError(t, err)
		}, true},
		{"delayed", func(t *testing.T, a *fdbsync.Store) {
			_, err := a.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Now: t0.Add(-time.Hour), Items: []storage.EnqueueItem{{Payload: []byte("d1"), Delay: time.Minute}}})
			require.NoError(t, err)
			_, err = a.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Now: t0, Items: []storage.EnqueueItem{{Payload: []byte("d2"), Delay: time.Hour}}})
			require.NoError(t, err)
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := fdbmodel.New(fdbmodel.Options{Clock: clock.NewMock()})
			a, err := fdbsync.New(db, fdbsync.Options{Seed: 1})
			require.NoError(t, err)
			tc.write(t, a)
			if tc.close {
				require.NoError(t, a.Close())
			} else {
				defer func() { require.NoError(t, a.Close()) }()
			}
			require.True(t, a.Latest().IsZero(), "a store from New read nothing")
			b := open(t, db)
			require.True(t, b.Latest().Equal(t0), "Latest %v, the other node wrote at %v", b.Latest(), t0)
			require.True(t, b.Latest().After(behind.Now()))
		})
	}
	t.Run("empty", func(t *testing.T) {
		db := fdbmodel.New(fdbmodel.Options{Clock: clock.NewMock()})
		require.True(t, open(t, db).Latest().IsZero())
	})
}
