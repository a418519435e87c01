package rocksstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// crashCopyOpen opens a copy of b's data directory taken while the store
// is open, as a crash (SIGKILL) would leave it.
func crashCopyOpen(t *testing.T, b *testBundle) *testBundle {
	t.Helper()
	return setupDir(t, copyDir(t, b.dir), func(o *Options) { o.Sync = SyncAlways })
}

// oneAttemptQueue makes q's items dead after one delivery and enqueues 8.
func oneAttemptQueue(t *testing.T, b *testBundle) []storage.ItemID {
	t.Helper()
	cfg := storage.DefaultQueueConfig()
	cfg.MaxAttempts = 1
	require.NoError(t, b.s.SetQueueConfig(b.ctx, "q", cfg))
	return b.enqueueN("q", at(0), 8)
}

// takeAhead has an ack claim ids[2:4] ahead and a poll take them, at one
// instant, and returns the poll's answer.
func takeAhead(t *testing.T, b *testBundle, ids []storage.ItemID) storage.PollResult {
	t.Helper()
	b.pollAck(2, at(time.Second))
	r := b.poll("q", 2, time.Minute, at(time.Second))
	require.Equal(t, ids[2:4], itemIDs(r.Items))
	require.EqualValues(t, 1, b.s.Metrics().PrefetchHits, "answered with the batch claimed ahead")
	return r
}

// TestPrefetch_CrashWhileHeldCountsNoDelivery: a batch claimed ahead and
// held, never handed to a consumer, at a crash is a lease in the
// database; its expiry after the restart gives its items back with no
// attempt counted, where it dead-lettered them as out of attempts with
// max_attempts 1 although nobody had received them (found by review).
func TestPrefetch_CrashWhileHeldCountsNoDelivery(t *testing.T) {
	t.Parallel()
	b, _ := prefetchStore(t)
	ids := oneAttemptQueue(t, b)
	b.pollAck(2, at(time.Second)) // delivers ids[0:2]; the ack claims ids[2:4] ahead
	require.EqualValues(t, 1, b.s.Metrics().Prefetched)

	c := crashCopyOpen(t, b)
	late := at(time.Second + 2*time.Minute)
	sw := c.sweep(late)
	require.EqualValues(t, 1, sw.LeasesExpired)
	require.EqualValues(t, 2, sw.Requeued)
	require.Zero(t, sw.DeadLettered)
	st := c.stats("q", late)
	require.Zero(t, st.Dead, "items never delivered were dead-lettered")
	require.EqualValues(t, 6, st.Ready)
	// Delivered, a lifetime counter, keeps the held batch's claim: it was
	// counted when the batch was written, and a counter never goes down.
	require.EqualValues(t, 4, st.Delivered)
	require.Zero(t, st.Expired)
	r := c.poll("q", 6, time.Minute, late)
	require.Equal(t, ids[2:], itemIDs(r.Items), "the batch's items back at their place")
	for _, it := range r.Items {
		require.EqualValues(t, 1, it.Attempts)
	}
	c.check()
}

// TestPrefetch_CrashAfterTakenKeepsTheLease: a batch a poll took from the
// ones claimed ahead is still marked claimed ahead in the database (the
// poll writes nothing); after a crash its consumer's ack still works,
// and a partial ack confirms the lease, whose expiry then counts the
// delivery as any lease's does.
func TestPrefetch_CrashAfterTakenKeepsTheLease(t *testing.T) {
	t.Parallel()
	b, _ := prefetchStore(t)
	ids := oneAttemptQueue(t, b)
	r := takeAhead(t, b, ids)

	c := crashCopyOpen(t, b)
	now := at(2 * time.Second)
	require.Equal(t, []storage.Code{storage.CodeOK}, c.ack("q", r.Lease, now, ids[2]))
	sw := c.sweep(at(time.Second + 2*time.Minute))
	require.EqualValues(t, 1, sw.DeadLettered, "the confirmed lease's item was delivered once: out of attempts")
	st := c.stats("q", at(time.Second+2*time.Minute))
	require.EqualValues(t, 1, st.Dead)
	c.check()
}

// TestPrefetch_TakenBatchSurvivesCleanReopenCounted: a batch a poll took
// at the instant it was claimed (so no later expiry was promised) is
// written without its claimed-ahead mark by a clean Close; reopened, its
// expiry counts the delivery.
func TestPrefetch_TakenBatchSurvivesCleanReopenCounted(t *testing.T) {
	t.Parallel()
	b, _ := prefetchStore(t)
	takeAhead(t, b, oneAttemptQueue(t, b))

	b.reopen()
	sw := b.sweep(at(time.Second + 2*time.Minute))
	require.EqualValues(t, 2, sw.DeadLettered, "delivered once, out of attempts")
	b.check()
}

// TestRecover_TakenBatchCounted: the same across a Recover, which cannot
// write before it reopens: it notes the taken lease and writes it once
// reopened.
func TestRecover_TakenBatchCounted(t *testing.T) {
	t.Parallel()
	b, failing := setupFailingSync(t)
	takeAhead(t, b, oneAttemptQueue(t, b))

	failing.Store(true)
	b.failWrite(at(time.Second))
	failing.Store(false)
	b.recoverStore()
	b.reopen() // and what Recover wrote is what the database holds
	sw := b.sweep(at(time.Second + 2*time.Minute))
	require.EqualValues(t, 2, sw.DeadLettered, "delivered once, out of attempts")
	b.check()
}
