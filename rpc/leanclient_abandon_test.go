package rpc

import (
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// sendUnreadPoll sends a poll of up to 3 items of queue q on c's lean
// connection and returns once the node has claimed 3 (seen through
// watch's stats), its answer unread.
func sendUnreadPoll(t *testing.T, c, watch *Client) outCall {
	t.Helper()
	ctx := ctxT(t)
	lc, err := c.lean.prepare(ctx, mPoll.id, leanBuild(mPoll, func(p schema.Queue_poll_Params) error {
		p.SetMax(3)
		p.SetLeaseMs(uint64(time.Hour / time.Millisecond))
		return p.SetQueue("q")
	}))
	require.NoError(t, err)
	st, err := c.lean.send(ctx, lc.msg)
	lc.msg.Release()
	require.NoError(t, err)
	require.Equal(t, sent, st)
	require.Eventually(t, func() bool {
		s, err := watch.Stats(ctx, "q")
		return err == nil && len(s) == 1 && s[0].Inflight == 3
	}, 10*time.Second, 5*time.Millisecond, "the poll did not claim the items")
	return lc
}

// TestLeanClient_AbandonedPollGivesItsItemsBack: a poll whose caller gave
// up after the node claimed its items, before the answer was read (a long
// poll whose context ended as items came, a consumer stopping), has its
// items given back at once instead of leaving them leased, invisible,
// until the lease expires (the test's clock never reaches the expiry).
// The claim is taken back: no consumer saw the items, so their attempt
// is not counted and an item at its last attempt is not dead-lettered.
func TestLeanClient_AbandonedPollGivesItsItemsBack(t *testing.T) {
	b := setup(t, bundleOpts{})
	c := b.dial()
	defer c.Close()
	require.NotNil(t, c.lean)
	ctx := ctxT(t)
	cfg := storage.DefaultQueueConfig()
	cfg.MaxAttempts = 1
	require.NoError(t, c.SetQueueConfig(ctx, "q", cfg))
	_, err := c.Enqueue(ctx, "q", payloads(3, 8))
	require.NoError(t, err)

	l := c.lean
	lc := sendUnreadPoll(t, c, c)
	l.giveUp(lc.qid, lc.q)

	require.Eventually(t, func() bool {
		s, err := c.Stats(ctx, "q")
		return err == nil && len(s) == 1 && s[0].Ready == 3 && s[0].Inflight == 0
	}, 10*time.Second, 5*time.Millisecond, "the abandoned poll's items were not given back")
	res, err := c.Poll(ctx, "q", 3, time.Minute, 0)
	require.NoError(t, err)
	require.Len(t, res.Items, 3)
	for _, it := range res.Items {
		require.Equal(t, uint32(1), it.Attempts, "the abandoned claim is not counted")
		require.Empty(t, it.LastError)
	}
	s, err := c.Stats(ctx, "q")
	require.NoError(t, err)
	require.Zero(t, s[0].Nacked)
	require.Zero(t, s[0].DeadLettered)
}

// TestClient_CloseWaitsForGiveBacks: a consumer that stops (its poll given
// up) and closes its client at once still gives back what the poll
// claimed: Close waits for a give-back in flight (here one the test holds
// open), and none starts once Close has begun.
func TestClient_CloseWaitsForGiveBacks(t *testing.T) {
	b := setup(t, bundleOpts{})
	c := b.dial()
	require.NotNil(t, c.lean)
	c.gbMu.Lock()
	c.giveBacks.Add(1) // a give-back in flight
	c.gbMu.Unlock()
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case <-closed:
		t.Fatal("Close returned while a give-back was in flight")
	case <-time.After(100 * time.Millisecond):
	}
	c.giveBacks.Done()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return once the give-back ended")
	}
	// Too late for another: it is not started (Wait would see it).
	c.giveBackPoll(clock.New())(pollGiveBack{queue: "q", ids: make([]storage.ItemID, 1)})
	c.gbMu.Lock()
	c.gbMu.Unlock()
	c.giveBacks.Wait()
}

// TestClient_GiveBackThenCloseAtOnce: the whole path: a poll given up
// after its claim, its Return read by the reader goroutine, then Close at
// once: the items are ready for another consumer when Close returns.
func TestClient_GiveBackThenCloseAtOnce(t *testing.T) {
	b := setup(t, bundleOpts{})
	c := b.dial()
	other := b.dial()
	defer other.Close()
	ctx := ctxT(t)
	_, err := c.Enqueue(ctx, "q", payloads(3, 8))
	require.NoError(t, err)

	l := c.lean
	lc := sendUnreadPoll(t, c, other)
	// The caller gives up and hands the read side on, as one whose read
	// its context interrupted does (readOwn): the reader goroutine reads
	// the answer and starts the give-back.
	l.giveUp(lc.qid, lc.q)
	require.True(t, l.takeRead())
	l.passRead()
	require.Eventually(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.qs) == 0
	}, 10*time.Second, time.Millisecond, "the Return of the poll given up was not read")
	require.NoError(t, c.Close())

	s, err := other.Stats(ctx, "q")
	require.NoError(t, err)
	require.Len(t, s, 1)
	require.EqualValues(t, 3, s[0].Ready, "given back before Close returned: %+v", s[0])
	require.EqualValues(t, 0, s[0].Inflight)
}
