package rocksstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// DESIGN.md and README.md promises no other test covered (a review of
// the promises against the code, session 72).

// README "Claims ahead": a poll is answered with a held batch only when
// nothing ready comes first in serve order (priority first). An item of a
// better priority enqueued after the ack claimed ahead must be served first.
func TestDesign_PrefetchHigherPriorityEnqueueBeatsHeldBatch(t *testing.T) {
	t.Parallel()
	b, _ := prefetchStore(t)
	items := make([]storage.EnqueueItem, 8)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: []byte{byte('a' + i)}, Priority: 5}
	}
	res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: items, Now: at(0)})
	require.NoError(t, err)
	b.pollAck(2, at(time.Second)) // a, b; claims c, d ahead
	require.EqualValues(t, 1, b.s.Metrics().Prefetched)

	urgent := b.enqueue("q", at(time.Second+time.Millisecond), storage.EnqueueItem{Payload: []byte("urgent"), Priority: 0})
	r := b.poll("q", 2, time.Minute, at(time.Second+2*time.Millisecond))
	require.Equal(t, []storage.ItemID{urgent[0], res[2].ID}, itemIDs(r.Items), "priority ascending comes first")
	b.check()
}

// DESIGN "poll": ready means visible_at <= now, with no sweep needed
// ("promote nothing that key order already handles"). A delayed item of a
// better priority that became ready after the claim ahead beats the held
// batch even before any sweep ran.
func TestDesign_PrefetchDelayedItemDueBeatsHeldBatch(t *testing.T) {
	t.Parallel()
	b, _ := prefetchStore(t)
	items := make([]storage.EnqueueItem, 8)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: []byte{byte('a' + i)}, Priority: 5}
	}
	res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: items, Now: at(0)})
	require.NoError(t, err)
	late := b.enqueue("q", at(0), storage.EnqueueItem{Payload: []byte("late"), Priority: 0, Delay: time.Second + 5*time.Millisecond})
	b.pollAck(2, at(time.Second)) // a, b; claims c, d ahead
	require.EqualValues(t, 1, b.s.Metrics().Prefetched)
	r := b.poll("q", 2, time.Minute, at(time.Second+10*time.Millisecond))
	require.Equal(t, []storage.ItemID{late[0], res[2].ID}, itemIDs(r.Items))
	b.check()
}

// README: "peek QUEUE lists items ... in id order" (help text), whatever
// their priority or visible_at.
func TestDesign_PeekIsInIDOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueue("q", at(0),
		storage.EnqueueItem{Payload: []byte("a"), Priority: 9},
		storage.EnqueueItem{Payload: []byte("b"), Priority: 0, Delay: time.Hour},
		storage.EnqueueItem{Payload: []byte("c"), Priority: 3},
	)
	got, err := b.s.Peek(b.ctx, storage.PeekParams{Queue: "q", Limit: 10, Now: at(0)})
	require.NoError(t, err)
	require.Equal(t, ids, itemIDs(got))
}

// DESIGN: "A delivery that ends without ack when attempts >= max_attempts
// sends the item to dead" — also when the queue's max_attempts was lowered
// under an item's attempts; the invariants (check) hold throughout.
func TestDesign_LoweredMaxAttemptsDeadLettersAtNextEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.enqueueN("q", at(0), 1)[0]
	now := at(0)
	for i := 0; i < 3; i++ {
		p := b.poll("q", 1, time.Minute, now)
		require.Len(t, p.Items, 1)
		require.Equal(t, []storage.Code{storage.CodeOK}, b.nack("q", p.Lease, dur(0), now, id))
		now = now.Add(time.Second)
	}
	cfg, err := b.s.QueueConfig(b.ctx, "q")
	require.NoError(t, err)
	cfg.MaxAttempts = 2
	require.NoError(t, b.s.SetQueueConfig(b.ctx, "q", cfg))
	b.check()
	p := b.poll("q", 1, time.Minute, now)
	require.Len(t, p.Items, 1)
	require.EqualValues(t, 4, p.Items[0].Attempts)
	require.Equal(t, []storage.Code{storage.CodeOK}, b.nack("q", p.Lease, dur(0), now, id))
	st := b.stats("q", now)
	require.EqualValues(t, 1, st.Dead)
	require.EqualValues(t, 0, st.Ready)
	b.check()
}

// DESIGN "stats": live leases. After purge drops a lease's every item,
// the lease is not live any more.
func TestDesign_PurgeEndsLeases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueueN("q", at(0), 3)
	b.poll("q", 2, time.Minute, at(0))
	n, err := b.s.Purge(b.ctx, storage.PurgeParams{Queue: "q", Now: at(time.Second)})
	require.NoError(t, err)
	require.Equal(t, 3, n)
	st := b.stats("q", at(time.Second))
	require.EqualValues(t, 0, st.Leases)
	require.EqualValues(t, 0, st.Inflight)
	b.check()
}
