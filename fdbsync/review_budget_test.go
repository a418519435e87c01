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

// Enqueue's size estimate counts a dedup key once, but the key is
// written three more times (dedup record, dedup expiry entry) with its
// conflict ranges: a batch of items with 1 KiB dedup keys (within
// Limits.MaxDedupKey) makes transactions over 1 MB.
func TestReview_EnqueueDedupKeysStayUnder1MB(t *testing.T) {
	ctx := context.Background()
	s, db := modelStore(t)
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: reviewDedupItems(1000, 0), Now: now})
	require.NoError(t, err)
	st := db.Stats()
	require.Zero(t, st.TxnsOver1MB, "enqueue of 1000 items with 1 KiB dedup keys: largest transaction %d bytes", st.MaxTxnSize)
}

// DeleteQueue (removeQueue) clears every dedup key of the queue and each
// one's expiry entry in one transaction, unbounded: a queue with a few
// thousand live dedup keys can never be deleted (transaction_too_large,
// not retryable) until they expire (the dedup window may be 7 days).
func TestReview_DeleteQueueWithManyDedupKeys(t *testing.T) {
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
