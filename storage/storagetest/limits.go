package storagetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// RunMaxQueues checks Limits.MaxQueues on a store opened with limits
// {MaxQueues: 2}: a third queue is refused (ErrInvalidArgument) by both
// Enqueue and SetQueueConfig, and the existing queues keep working.
func RunMaxQueues(t *testing.T, open func(t *testing.T, lim storage.Limits) storage.Store) {
	t.Helper()
	s := open(t, storage.Limits{MaxQueues: 2})
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	item := []storage.EnqueueItem{{Payload: []byte("x")}}
	for i := range 2 {
		_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: fmt.Sprintf("q%d", i), Items: item, Now: now})
		require.NoError(t, err)
	}
	_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q2", Items: item, Now: now})
	require.ErrorIs(t, err, storage.ErrInvalidArgument)
	require.ErrorContains(t, err, "--max-queues")
	err = s.SetQueueConfig(ctx, "q3", storage.DefaultQueueConfig())
	require.ErrorIs(t, err, storage.ErrInvalidArgument)
	names, err := s.Queues(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"q0", "q1"}, names)
	// Existing queues are not affected.
	_, err = s.Enqueue(ctx, storage.EnqueueParams{Queue: "q1", Items: item, Now: now})
	require.NoError(t, err)
	require.NoError(t, s.SetQueueConfig(ctx, "q0", storage.DefaultQueueConfig()))
}
