package fdbsync_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// A nack writes its reason into every item of the lease; with a full
// batch and a 4 KiB reason that is several MB, which goes in groups so
// that no transaction passes 1 MB, and every item is nacked.
func TestNack_LongReasonStaysUnder1MB(t *testing.T) {
	ctx := context.Background()
	s, db := modelStore(t)
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	items := make([]storage.EnqueueItem, 1000)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: []byte{'x'}}
	}
	_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: items, Now: now})
	require.NoError(t, err)
	p, err := s.Poll(ctx, storage.PollParams{Queue: "q", Max: 1000, Lease: time.Minute, Now: now})
	require.NoError(t, err)
	require.Greater(t, len(p.Items), 200, "a batch large enough to need groups")
	ids := make([]storage.ItemID, len(p.Items))
	for i, it := range p.Items {
		ids[i] = it.ID
	}
	zero := time.Duration(0)
	codes, err := s.Nack(ctx, storage.NackParams{Queue: "q", Lease: p.Lease, IDs: ids, Delay: &zero,
		Reason: string(bytes.Repeat([]byte{'r'}, 4096)), Now: now})
	require.NoError(t, err)
	require.Len(t, codes, len(ids))
	for i, c := range codes {
		require.Equal(t, storage.CodeOK, c, "item %d", i)
	}
	st := db.Stats()
	require.Zero(t, st.TxnsOver1MB, "nack of %d items: largest transaction %d bytes", len(ids), st.MaxTxnSize)
	qs, err := s.Stats(ctx, storage.StatsParams{Queue: "q", Now: now})
	require.NoError(t, err)
	require.EqualValues(t, 1000, qs[0].Ready)
	require.EqualValues(t, 0, qs[0].Inflight)
	require.EqualValues(t, 0, qs[0].Leases)
}
