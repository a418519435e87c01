package rocksstore

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// TestRocksStore_NoAnswerOKAfterAFailedFsync: an enqueue's fsync is
// held; a second enqueue's batch is written behind it. The held fsync
// fails: the store is failed. The syncer then fsynced the second batch
// again and, that fsync succeeding, answered its caller OK, although the
// store had already failed and the batch was written before the failure
// was known (after a failed fsync, Linux may have marked the unwritten
// pages clean, so a later fsync that succeeds proves nothing). The second
// caller gets ErrUnavailable, as every caller of a batch written since
// the last good fsync (found by review).
func TestRocksStore_NoAnswerOKAfterAFailedFsync(t *testing.T) {
	t.Parallel()
	b, h := setupHeldSync(t)
	var wg sync.WaitGroup
	var errA, errB error
	wg.Go(func() {
		_, errA = b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("a")}}, Now: at(0)})
	})
	<-h.entered // A's batch written, its fsync held
	wg.Go(func() {
		_, errB = b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("b")}}, Now: at(0)})
	})
	require.Eventually(t, func() bool { return b.s.unsyncedBatches() == 1 }, 30*time.Second, time.Millisecond,
		"B's batch is written behind the held fsync")
	h.release <- errors.New("injected: EIO")
	bDone := make(chan struct{})
	go func() { wg.Wait(); close(bDone) }()
	select {
	case <-h.entered: // the next fsync, for B's batch, after the store failed
		h.release <- nil
	case <-bDone:
	}
	<-bDone
	require.ErrorIs(t, errA, storage.ErrUnavailable)
	require.Error(t, b.s.Failed(), "the store failed")
	require.ErrorIs(t, errB, storage.ErrUnavailable,
		"B's batch was written before the fsync failure was known; it is answered OK by an fsync run after the store failed")
}

// TestRocksStore_NoAsyncAnswerOKAfterAFailedEarlyFsync: the same through
// the asynchronous calls and an early fsync (syncEarly): a 32-item
// asynchronous enqueue's early fsync is held, a second asynchronous
// enqueue is written behind it, the early fsync fails. syncEarly answered
// the first with the error, then the syncer's loop fsynced the second
// batch and answered it OK, although the store had failed (found by
// review).
func TestRocksStore_NoAsyncAnswerOKAfterAFailedEarlyFsync(t *testing.T) {
	t.Parallel()
	b, h := setupHeldSync(t)
	require.True(t, b.s.pipe.logged)
	items := make([]storage.EnqueueItem, earlyFsyncItems)
	errA, errB := make(chan error, 1), make(chan error, 1)
	b.s.EnqueueAsync(b.ctx, storage.EnqueueParams{Queue: "q", Items: items, Now: at(0)},
		func(_ []storage.EnqueueResult, err error) { errA <- err })
	<-h.entered // A's early fsync, held
	b.s.EnqueueAsync(b.ctx, storage.EnqueueParams{Queue: "q", Items: items[:1], Now: at(0)},
		func(_ []storage.EnqueueResult, err error) { errB <- err })
	require.Eventually(t, func() bool { return b.s.unsyncedBatches() == 2 }, 30*time.Second, time.Millisecond,
		"A's and B's batches are written, A's early fsync held")
	h.release <- errors.New("injected: EIO")
	require.ErrorIs(t, <-errA, storage.ErrUnavailable)
	require.Error(t, b.s.Failed())
	select {
	case <-h.entered: // the syncer fsyncs B's batch after the failure
		h.release <- nil
	case err := <-errB:
		errB <- err
	}
	require.ErrorIs(t, <-errB, storage.ErrUnavailable, "B answered OK after the store failed")
	require.EqualValues(t, 1, b.s.Metrics().EarlySyncs)
}
