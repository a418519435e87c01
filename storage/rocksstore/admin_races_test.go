package rocksstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// Purge gives back the batches claimed ahead before it deletes. A batch
// an ack claims ahead after that give-back and before Purge's first
// delete (Purge checks its ctx there) is purged with its lease, and its
// items count as never delivered: no consumer got them.
func TestPurge_BatchClaimedAheadMeanwhileCountsNoDelivery(t *testing.T) {
	b, _, _ := prefetchSetup(t, 8)
	ctx := &hookCtx{Context: context.Background(), fn: func() {
		b.pollAck(2, at(time.Second)) // delivers 2, and claims 2 ahead
	}}
	n, err := b.s.Purge(ctx, storage.PurgeParams{Queue: "q", Now: at(time.Second)})
	require.NoError(t, err)
	require.EqualValues(t, 1, b.s.Metrics().Prefetched, "the ack claimed a batch ahead")
	require.Equal(t, 6, n)
	st := b.stats("q", at(time.Second))
	require.EqualValues(t, 0, st.Ready+st.Delayed+st.Inflight+st.Leases)
	require.EqualValues(t, 2, st.Acked)
	require.EqualValues(t, 2, st.Delivered, "only the polled items count as delivered")
}

// pageWhileDeleting runs rounds of 64 items with external payloads (over
// 4 KiB), enqueued and polled; in each, prepare runs, then page runs 20
// times while del deletes the items. It returns page's first error.
func pageWhileDeleting(b *testBundle, maxAttempts uint32, page func(n int) error, prepare, del func(now time.Time, r storage.PollResult)) error {
	big := make([]byte, 5000)
	const n = 64
	items := make([]storage.EnqueueItem, n)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: big, MaxAttempts: maxAttempts}
	}
	var pageErr error
	for round := 0; round < 100 && pageErr == nil; round++ {
		now := at(time.Duration(round) * time.Second)
		b.enqueue("q", now, items...)
		r := b.poll("q", n, time.Minute, now)
		require.Len(b.t, r.Items, n)
		prepare(now, r)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := 0; i < 20 && pageErr == nil; i++ {
				pageErr = page(n)
			}
		}()
		time.Sleep(time.Duration(round%5) * 50 * time.Microsecond)
		del(now, r)
		<-done
	}
	return pageErr
}

// Peek reads each listed record from its iterator's snapshot and the
// record's external payload from the latest state: an item acked between
// the two is left out of the page, not reported as damaged data.
func TestPeek_ItemsAckedMeanwhileAreLeftOut(t *testing.T) {
	b := setup(t)
	err := pageWhileDeleting(b, 0, func(n int) error {
		_, err := b.s.Peek(context.Background(), storage.PeekParams{Queue: "q", Inflight: true, Limit: n, Now: at(0)})
		return err
	}, func(time.Time, storage.PollResult) {}, func(now time.Time, r storage.PollResult) {
		b.ack("q", r.Lease, now, itemIDs(r.Items)...)
	})
	require.NoError(t, err, "Peek of inflight items failed while they were acked")
}

// DeadList leaves out dead items that PurgeDead deletes while it pages,
// as Peek does acked ones.
func TestDeadList_ItemsPurgedMeanwhileAreLeftOut(t *testing.T) {
	b := setup(t)
	err := pageWhileDeleting(b, 1, func(n int) error {
		_, err := b.s.DeadList(context.Background(), storage.DeadListParams{Queue: "q", Limit: n})
		return err
	}, func(now time.Time, r storage.PollResult) {
		b.nack("q", r.Lease, nil, now, itemIDs(r.Items)...) // out of attempts: dead
	}, func(now time.Time, r storage.PollResult) {
		res, err := b.s.PurgeDead(context.Background(), storage.RedriveParams{Queue: "q", Limit: len(r.Items), Now: now})
		require.NoError(b.t, err)
		require.Equal(b.t, len(r.Items), res.Moved)
	})
	require.NoError(t, err, "DeadList failed while the dead items were purged")
}

// waitUnsynced waits until n batches wait for an fsync.
func waitUnsynced(t *testing.T, s *Store, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		s.pipe.mu.Lock()
		got := len(s.pipe.unsynced)
		s.pipe.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d batches wait for an fsync, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// Close gives back the batches claimed ahead and then lets go of the
// store before it takes it exclusively, waiting for calls in flight. An
// ack in flight then (here: its batch behind Close's own, whose fsync is
// held) claims nothing ahead, so a clean Close leaves no lease that no
// consumer holds: after the reopen every unacked item is ready.
func TestClose_AckInFlightClaimsNothingAhead(t *testing.T) {
	b, h, _ := prefetchSetup(t, 8)
	r := b.poll("q", 2, time.Minute, at(time.Second))
	require.Len(t, r.Items, 2)
	h.free.Store(false)

	// A write whose fsync the hook holds: the batches after it wait.
	enq := make(chan error, 1)
	go func() {
		_, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "other", Items: []storage.EnqueueItem{{Payload: []byte("x")}}, Now: at(time.Second)})
		enq <- err
	}()
	<-h.entered
	closed := make(chan error, 1)
	go func() { closed <- b.s.Close() }()
	waitUnsynced(t, b.s, 1) // Close's first batch (its give-back)
	acked := make(chan error, 1)
	go func() {
		codes, err := b.s.Ack(b.ctx, storage.AckParams{Queue: "q", Lease: r.Lease, IDs: itemIDs(r.Items), Now: at(time.Second)})
		if err == nil && (codes[0] != storage.CodeOK || codes[1] != storage.CodeOK) {
			err = fmt.Errorf("codes %v", codes)
		}
		acked <- err
	}()
	waitUnsynced(t, b.s, 2) // the ack's batch
	h.free.Store(true)
	h.release <- nil
	require.NoError(t, <-enq)
	require.NoError(t, <-acked)
	require.NoError(t, <-closed)
	require.EqualValues(t, 0, b.s.Metrics().Prefetched, "no batch claimed ahead once Close began")

	s, err := Open(b.dir, b.opts)
	require.NoError(t, err)
	b.s = s
	st := b.stats("q", at(2*time.Second))
	require.EqualValues(t, 0, st.Leases)
	require.EqualValues(t, 6, st.Ready)
	got := b.poll("q", 6, time.Minute, at(2*time.Second))
	require.Len(t, got.Items, 6)
}
