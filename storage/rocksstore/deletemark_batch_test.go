package rocksstore

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// pendingOps is how many ops wait for the next batch.
func pendingOps(s *Store) int {
	s.pipe.mu.Lock()
	defer s.pipe.mu.Unlock()
	return len(s.pipe.pending)
}

func waitPendingOps(t *testing.T, s *Store, n int) {
	t.Helper()
	deadline := clock.New().Now().Add(30 * time.Second)
	for pendingOps(s) < n {
		if clock.New().Now().After(deadline) {
			t.Fatalf("pending ops: %d, want %d", pendingOps(s), n)
		}
		runtime.Gosched()
	}
}

// TestDeleteMark_DedupKeyWrittenInTheMarksBatch (found by review,
// session 71): an enqueue with a
// dedup key, a purge that takes its item, and a DeleteQueue's first
// dedup chunk (the op that marks the queue deleting) land in one batch,
// in that order. The chunk scans the committed dedup keys only, so it
// does not see the key the enqueue wrote in the same batch; removeQueue,
// the queue being marked, scans nothing. The key and its dedup_expiry
// entry outlive the queue: leaseq check reports them, and the queue made
// anew under the name takes an item with that key as a duplicate (the
// item is answered as accepted and never stored).
func TestDeleteMark_DedupKeyWrittenInTheMarksBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue("q", at(0), storage.EnqueueItem{Payload: []byte("old")}) // the purge's budget

	// Order the ops so that the enqueue, the purge's op on available
	// items and the delete's first chunk run as one batch: ops of the test
	// hold the committer (the second one, of maxBatchItems items, runs in
	// a batch of its own) while they pend.
	var wg sync.WaitGroup
	hold := func(items int) (entered, release chan struct{}) {
		entered, release = make(chan struct{}), make(chan struct{})
		require.NoError(t, b.s.enter("test"))
		wg.Go(func() {
			defer b.s.exit()
			_, err := b.s.submit("", items, func(o *opTx) error {
				close(entered)
				<-release
				return nil
			})
			require.NoError(t, err)
		})
		return entered, release
	}
	entered1, release1 := hold(0)
	<-entered1
	var enqErr, purgeErr, delErr error
	var purged int
	wg.Go(func() { // its op on inflight items, then its op on available ones
		purged, purgeErr = b.s.Purge(b.ctx, storage.PurgeParams{Queue: "q", Now: at(time.Second)})
	})
	waitPendingOps(t, b.s, 1)
	entered2, release2 := hold(maxBatchItems)
	waitPendingOps(t, b.s, 2)
	wg.Go(func() {
		_, enqErr = b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Now: at(time.Second),
			Items: []storage.EnqueueItem{{Payload: []byte("x"), DedupKey: "k"}}})
	})
	waitPendingOps(t, b.s, 3)
	close(release1)
	<-entered2                // the purge's inflight op is done
	waitPendingOps(t, b.s, 2) // the enqueue, the purge's available op
	wg.Go(func() {
		_, delErr = b.s.DeleteQueue(b.ctx, storage.DeleteQueueParams{Queue: "q", Now: at(time.Second)})
	})
	waitPendingOps(t, b.s, 3)
	close(release2)
	wg.Wait()
	require.NoError(t, enqErr)
	require.NoError(t, purgeErr)
	require.Equal(t, 2, purged)
	require.NoError(t, delErr, "the queue was empty when its delete marked it")

	_, err := b.s.Stats(b.ctx, storage.StatsParams{Queue: "q", Now: at(2 * time.Second)})
	require.ErrorIs(t, err, storage.ErrNotFound)
	_, found, err := b.s.getRaw(dbkeys.DedupKey("q", "k"))
	require.NoError(t, err)
	assert.False(t, found, "the deleted queue's dedup key is left behind")

	res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Now: at(3 * time.Second),
		Items: []storage.EnqueueItem{{Payload: []byte("new"), DedupKey: "k"}}})
	require.NoError(t, err)
	require.False(t, res[0].Duplicate, "the queue made anew has no dedup keys")
}
