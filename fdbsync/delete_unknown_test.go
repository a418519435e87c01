package fdbsync_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync/fdbmodel"
	"github.com/leaseq/leaseq/storage"
)

// TestDeleteQueue_LastStepUnknownResult: the last removeQueue step
// commits but reports commit_unknown_result: the retry finds the step's
// marker, knows the queue is gone, and DeleteQueue succeeds (found by
// review: the marker went unrecognised, another step found no queue and
// DeleteQueue failed with ErrNotFound although it had deleted it).
func TestDeleteQueue_LastStepUnknownResult(t *testing.T) {
	ctx := context.Background()
	s, db := modelStore(t)
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("x"), DedupKey: "k"}}, Now: now})
	require.NoError(t, err)
	_, err = s.Purge(ctx, storage.PurgeParams{Queue: "q", Now: now})
	require.NoError(t, err)
	// Every write commit lands but reports commit_unknown_result.
	db.SetFaults(fdbmodel.Faults{Seed: 1, UnknownResult: 1, UnknownApplied: 1})
	_, err = s.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: "q", Now: now})
	db.SetFaults(fdbmodel.Faults{})
	t.Logf("injected unknown=%d applied=%d", db.Stats().InjUnknown, db.Stats().InjUnknownApplied)
	require.NoError(t, err, "DeleteQueue whose last transaction committed with an unknown result reports failure")
}
