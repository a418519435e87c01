package fdbsync_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

func reviewDedupItems(n, from int) []storage.EnqueueItem {
	items := make([]storage.EnqueueItem, n)
	pad := strings.Repeat("k", 1000)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: []byte{'x'}, DedupKey: fmt.Sprintf("%s-%08d", pad, from+i)}
	}
	return items
}

// TestBudget_EnqueueDedupKeysStayUnder1MB: enqueue's size estimate counts
// a dedup key each time it is written (the record, the dedup entry, the
// expiry entry and their conflict ranges), so a batch of items with 1 KiB
// dedup keys (Limits.MaxDedupKey) keeps each transaction under 1 MB (found
// by review: the key was counted once).
func TestBudget_EnqueueDedupKeysStayUnder1MB(t *testing.T) {
	ctx := context.Background()
	s, db := modelStore(t)
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: reviewDedupItems(1000, 0), Now: now})
	require.NoError(t, err)
	st := db.Stats()
	require.Zero(t, st.TxnsOver1MB, "enqueue of 1000 items with 1 KiB dedup keys: largest transaction %d bytes", st.MaxTxnSize)
}

// TestBudget_DeleteQueueWithManyDedupKeys: DeleteQueue clears a queue's
// dedup keys and their expiry entries in transactions of bounded size
// (found by review: one transaction, so a queue with a few thousand live
// 1 KiB keys could not be deleted, transaction_too_large, until they
// expired).
func TestBudget_DeleteQueueWithManyDedupKeys(t *testing.T) {
	ctx := context.Background()
	s, db := modelStore(t)
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := 0; i < 4; i++ {
		_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: reviewDedupItems(1000, i*1000), Now: now})
		require.NoError(t, err)
	}
	n, err := s.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: "q", Force: true, Now: now})
	require.NoError(t, err, "force-deleting a queue of 4000 items with dedup keys (largest transaction %d bytes)", db.Stats().MaxTxnSize)
	require.Equal(t, 4000, n)
}
