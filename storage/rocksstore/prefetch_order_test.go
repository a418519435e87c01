package rocksstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// Held batches and the serve order. Items held in a batch claimed ahead
// count as available to every caller, so a poll answered with a held
// batch must not be served behind another held batch's items.

// orderPoll polls "q" at now for max items under a one-minute lease.
func (b *testBundle) orderPoll(max int, now time.Time) storage.PollResult {
	b.t.Helper()
	r, err := b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: max, Lease: time.Minute, Now: now})
	require.NoError(b.t, err)
	return r
}

// orderAck acks every item of r at now and requires each to be OK.
func (b *testBundle) orderAck(r storage.PollResult, now time.Time) {
	b.t.Helper()
	codes, err := b.s.Ack(b.ctx, storage.AckParams{Queue: "q", Lease: r.Lease, IDs: itemIDs(r.Items), Now: now})
	require.NoError(b.t, err)
	for _, c := range codes {
		require.Equal(b.t, storage.CodeOK, c)
	}
}

// Two consumers alike each ack a whole lease, so each ack claims a batch
// ahead: the first holds items 4-5, the second 6-7. Whichever consumer
// polls first gets the earlier batch, still from memory, and the other
// the later one.
func TestPrefetch_EarliestHeldBatchAnswersFirst(t *testing.T) {
	t.Parallel()
	b, _, res := prefetchSetup(t, 20)
	now := at(time.Second)
	c1 := b.orderPoll(2, now) // 0-1
	c2 := b.orderPoll(2, now) // 2-3
	b.orderAck(c1, now)       // holds 4-5
	b.orderAck(c2, now)       // holds 6-7
	require.EqualValues(t, 2, b.s.Metrics().Prefetched)

	later := now.Add(time.Millisecond)
	r2 := b.orderPoll(2, later) // the second consumer polls first
	require.Equal(t, []storage.ItemID{res[4].ID, res[5].ID}, itemIDs(r2.Items))
	r1 := b.orderPoll(2, later)
	require.Equal(t, []storage.ItemID{res[6].ID, res[7].ID}, itemIDs(r1.Items))
	m := b.s.Metrics()
	require.EqualValues(t, 2, m.PrefetchHits, "both polls answered with held batches")
	require.EqualValues(t, 0, m.PrefetchReleased)
}

// Consumers of different batch sizes: the first (max 4) holds items 6-9,
// the second (max 2) items 10-11. A poll of max 2 gets the queue's head,
// items 6 and 7, not the held batch of its own size behind them.
func TestPrefetch_HeldBatchOfAnotherMaxKeepsLaterOnesBack(t *testing.T) {
	t.Parallel()
	b, _, res := prefetchSetup(t, 20)
	now := at(time.Second)
	c1 := b.orderPoll(4, now) // 0-3
	c2 := b.orderPoll(2, now) // 4-5
	require.Equal(t, []storage.ItemID{res[4].ID, res[5].ID}, itemIDs(c2.Items))
	b.orderAck(c1, now) // holds 6-9
	b.orderAck(c2, now) // holds 10-11
	require.EqualValues(t, 2, b.s.Metrics().Prefetched)

	st, err := b.s.Stats(b.ctx, storage.StatsParams{Queue: "q", Now: now})
	require.NoError(t, err)
	require.EqualValues(t, 14, st[0].Ready, "held items count as ready")

	r := b.orderPoll(2, now.Add(time.Millisecond))
	require.Equal(t, []storage.ItemID{res[6].ID, res[7].ID}, itemIDs(r.Items))
}

// Two consumers alike, one a little slower: the first's held batch
// (items 4-5) is past the hold when the next poll comes, the second's
// (items 6-7) is not. The poll gets items 4 and 5: the stale batch is
// given back and the head claimed, not the fresher batch behind it.
func TestPrefetch_StaleHeldBatchKeepsFresherOnesBack(t *testing.T) {
	t.Parallel()
	b, _, res := prefetchSetup(t, 20)
	t1 := at(time.Second)
	c1 := b.orderPoll(2, t1) // 0-1
	c2 := b.orderPoll(2, t1) // 2-3
	b.orderAck(c1, t1)       // holds 4-5, claimed at t1
	t2 := t1.Add(10 * time.Millisecond)
	b.orderAck(c2, t2) // holds 6-7, claimed at t2
	require.EqualValues(t, 2, b.s.Metrics().Prefetched)

	// 25 ms after the first claim (past the 20 ms hold), 15 ms after the second.
	r := b.orderPoll(2, t1.Add(25*time.Millisecond))
	require.Equal(t, []storage.ItemID{res[4].ID, res[5].ID}, itemIDs(r.Items))
}

// A batch being given back stays hidden from Stats until the op that
// gives it back lands its counters: a Stats call in between (here from
// inside the op, as Stats takes only the store's and the queue's locks,
// which the committer does not hold there) sees the items available and
// no lease, as before and after.
func TestPrefetch_StatsHidesBatchBeingGivenBack(t *testing.T) {
	t.Parallel()
	b, _, _ := prefetchSetup(t, 8)
	b.pollAck(2, at(time.Second))
	require.EqualValues(t, 1, b.s.Metrics().Prefetched)
	q := b.s.queue("q")
	require.NoError(t, b.s.enter("test"))
	var mid storage.QueueStats
	_, err := b.s.submit("", 0, func(o *opTx) error {
		b.s.releaseAhead(o, q, func(*prefetched) bool { return true })
		st, err := b.s.Stats(b.ctx, storage.StatsParams{Queue: "q", Now: at(time.Second)})
		if err != nil {
			return err
		}
		mid = st[0]
		return nil
	})
	b.s.exit()
	require.NoError(t, err)
	require.EqualValues(t, 1, b.s.Metrics().PrefetchReleased)
	require.EqualValues(t, 0, mid.Inflight)
	require.EqualValues(t, 0, mid.Leases)
	require.EqualValues(t, 6, mid.Ready)

	after, err := b.s.Stats(b.ctx, storage.StatsParams{Queue: "q", Now: at(time.Second)})
	require.NoError(t, err)
	require.Equal(t, mid.Ready, after[0].Ready)
	require.Equal(t, mid.Inflight, after[0].Inflight)
	require.Equal(t, mid.Leases, after[0].Leases)
}

// An op that gives a held batch back and then fails puts the batch back
// on hold: it still answers its consumer's poll, and Stats counts it once.
func TestPrefetch_FailedGiveBackHoldsTheBatchAgain(t *testing.T) {
	t.Parallel()
	b, _, res := prefetchSetup(t, 8)
	b.pollAck(2, at(time.Second)) // holds 2-3
	q := b.s.queue("q")
	require.NoError(t, b.s.enter("test"))
	_, err := b.s.submit("", 0, func(o *opTx) error {
		b.s.releaseAhead(o, q, func(*prefetched) bool { return true })
		return storage.ErrInvalidArgument
	})
	b.s.exit()
	require.ErrorIs(t, err, storage.ErrInvalidArgument)
	q.mu.Lock()
	held, returning := len(q.prefetch), len(q.returning)
	q.mu.Unlock()
	require.Equal(t, 1, held)
	require.Zero(t, returning)

	st, err := b.s.Stats(b.ctx, storage.StatsParams{Queue: "q", Now: at(time.Second)})
	require.NoError(t, err)
	require.EqualValues(t, 6, st[0].Ready)
	require.EqualValues(t, 0, st[0].Leases)
	r := b.orderPoll(2, at(time.Second).Add(time.Millisecond))
	require.Equal(t, []storage.ItemID{res[2].ID, res[3].ID}, itemIDs(r.Items))
	require.EqualValues(t, 1, b.s.Metrics().PrefetchHits)
}
