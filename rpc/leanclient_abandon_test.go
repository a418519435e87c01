package rpc

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/schema"
)

// TestLeanClient_AbandonedPollGivesItsItemsBack: a poll whose caller gave
// up after the node claimed its items, before the answer was read (a long
// poll whose context ended as items came, a consumer stopping), has its
// items nacked at once instead of leaving them leased, invisible, until
// the lease expires (the test's clock never reaches the expiry).
func TestLeanClient_AbandonedPollGivesItsItemsBack(t *testing.T) {
	b := setup(t, bundleOpts{})
	c := b.dial()
	defer c.Close()
	require.NotNil(t, c.lean)
	ctx := ctxT(t)
	_, err := c.Enqueue(ctx, "q", payloads(3, 8))
	require.NoError(t, err)

	l := c.lean
	lc, err := l.prepare(ctx, mPoll.id, leanBuild(mPoll, func(p schema.Queue_poll_Params) error {
		p.SetMax(3)
		p.SetLeaseMs(uint64(time.Hour / time.Millisecond))
		return p.SetQueue("q")
	}))
	require.NoError(t, err)
	st, err := l.send(ctx, lc.msg)
	lc.msg.Release()
	require.NoError(t, err)
	require.Equal(t, sent, st)
	// The node claims the items before the caller gives up.
	require.Eventually(t, func() bool {
		s, err := c.Stats(ctx, "q")
		return err == nil && len(s) == 1 && s[0].Inflight == 3
	}, 10*time.Second, 5*time.Millisecond, "the poll did not claim the items")
	l.giveUp(lc.qid, lc.q)

	require.Eventually(t, func() bool {
		s, err := c.Stats(ctx, "q")
		return err == nil && len(s) == 1 && s[0].Ready == 3 && s[0].Inflight == 0
	}, 10*time.Second, 5*time.Millisecond, "the abandoned poll's items were not given back")
	res, err := c.Poll(ctx, "q", 3, time.Minute, 0)
	require.NoError(t, err)
	require.Len(t, res.Items, 3)
	for _, it := range res.Items {
		require.Equal(t, uint32(2), it.Attempts, "the abandoned claim counts, as for any nack")
		require.Equal(t, abandonedPollReason, it.LastError)
	}
}
