package rocksstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// TestBounds_DeleteQueueFailedAfterMarkTakesItemsAgain: a DeleteQueue
// whose dedup-key chunks fail after the first one (here a damaged dedup
// record in the second chunk: a corruption error) returns the error and
// leaves the queue taking items again (undelete). Found by review
// (session 70): the mark stayed, and every later enqueue and
// SetQueueConfig was refused with ErrUnavailable until the node
// restarted.
func TestBounds_DeleteQueueFailedAfterMarkTakesItemsAgain(t *testing.T) {
	b := setup(t)
	const n = purgeChunk + 10
	dedupQueue(b, "q", n)
	// k99 sorts last among k0..k265: it is in the second chunk.
	r := raw{t: t, s: b.s}
	k := dbkeys.DedupKey("q", "k99")
	orig, ok, err := b.s.getRaw(k)
	require.NoError(t, err)
	require.True(t, ok)
	r.put(k, []byte{0xff})
	t.Cleanup(func() { r.put(k, orig) }) // undamaged again for the bundle's Check
	_, err = b.s.DeleteQueue(b.ctx, storage.DeleteQueueParams{Queue: "q", Now: at(time.Second)})
	require.Error(t, err)
	t.Logf("delete: %v", err)
	_, err = b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Now: at(2 * time.Second),
		Items: []storage.EnqueueItem{{Payload: []byte("after")}}})
	require.NoError(t, err, "an enqueue after the delete failed and returned")
	require.NoError(t, b.s.SetQueueConfig(b.ctx, "q", storage.DefaultQueueConfig()))
}
