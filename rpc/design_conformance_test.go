package rpc

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// Tests of DESIGN.md's rules, one each, written by a review of the code
// against DESIGN.md (session 70) that found no divergence: they stay as
// regression tests.

// DESIGN.md "Operations" over the wire on RocksDB: serve order by
// priority, the poll's item fields, expiresAt at exactly now+leaseMs,
// extend keeping a lease valid past its first expiry, stale-lease codes,
// and a long poll that ends empty without an error.
func TestDesign_RPCPollFieldsOrderExtend(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{factory: rocksFactory()})
	c := b.dial()
	ctx := ctxT(t)
	res, err := c.Enqueue(ctx, "q", []storage.EnqueueItem{
		{Payload: []byte("low"), Priority: 5, DedupKey: "a"},
		{Payload: []byte("high"), Priority: 0},
		{Payload: []byte("later"), Delay: time.Second},
	})
	require.NoError(t, err)
	dup, err := c.Enqueue(ctx, "q", []storage.EnqueueItem{{Payload: []byte("again"), DedupKey: "a"}})
	require.NoError(t, err)
	require.True(t, dup[0].Duplicate)
	require.Equal(t, res[0].ID, dup[0].ID)

	pr, err := c.Poll(ctx, "q", 10, 30*time.Second, 0)
	require.NoError(t, err)
	require.Len(t, pr.Items, 2, "the delayed item is not served")
	require.Equal(t, res[1].ID, pr.Items[0].ID, "priority 0 first")
	require.Equal(t, res[0].ID, pr.Items[1].ID)
	require.Equal(t, "a", pr.Items[1].DedupKey)
	require.Equal(t, uint8(5), pr.Items[1].Priority)
	require.Equal(t, uint32(1), pr.Items[0].Attempts)
	require.Equal(t, testStart, pr.Items[0].EnqueuedAt)
	require.Equal(t, testStart.Add(30*time.Second), pr.ExpiresAt, "lease expires at exactly +30 s")

	b.clock.Add(20 * time.Second)
	exp, err := c.Extend(ctx, "q", pr.Lease, 30*time.Second)
	require.NoError(t, err)
	require.Equal(t, testStart.Add(50*time.Second), exp)
	b.clock.Add(20 * time.Second) // past the first expiry
	codes, err := c.Ack(ctx, "q", pr.Lease, []storage.ItemID{pr.Items[0].ID})
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK}, codes)
	b.clock.Add(10 * time.Second) // at the extended expiry: not live, before any sweep
	codes, err = c.Ack(ctx, "q", pr.Lease, []storage.ItemID{pr.Items[1].ID})
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeLeaseExpired}, codes)
	_, err = c.Extend(ctx, "q", pr.Lease, time.Second)
	require.ErrorIs(t, err, storage.ErrLeaseExpired)

	// The delayed item is ready (visible_at passed) even though nothing
	// swept: a poll with wait 0 serves it.
	pr2, err := c.Poll(ctx, "q", 1, time.Second, 0)
	require.NoError(t, err)
	require.Len(t, pr2.Items, 1)
	require.Equal(t, res[2].ID, pr2.Items[0].ID)

	// A long poll on an empty queue ends empty, without an error, when
	// its wait runs out on the server's clock.
	ch := goPoll(c, "empty", 1, 5*time.Second)
	rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
	b.clock.Add(5 * time.Second)
	o := recvPoll(t, ch)
	require.NoError(t, o.err)
	require.Empty(t, o.pr.Items)
	require.True(t, o.pr.Lease.IsZero())
}

// Stats over the wire: every field DESIGN.md lists.
func TestDesign_RPCStatsFields(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{factory: rocksFactory()})
	c := b.dial()
	ctx := ctxT(t)
	res, err := c.Enqueue(ctx, "q", []storage.EnqueueItem{{Payload: []byte("a"), MaxAttempts: 1}, {Payload: []byte("b")}, {Payload: []byte("c"), Delay: time.Hour}})
	require.NoError(t, err)
	pr, err := c.Poll(ctx, "q", 1, time.Minute, 0)
	require.NoError(t, err)
	require.Equal(t, res[0].ID, pr.Items[0].ID)
	codes, err := c.Nack(ctx, "q", pr.Lease, []storage.ItemID{res[0].ID}, nil, "bad")
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK}, codes)
	pr, err = c.Poll(ctx, "q", 1, time.Minute, 0)
	require.NoError(t, err)
	require.Equal(t, res[1].ID, pr.Items[0].ID)
	b.clock.Add(3 * time.Second)
	st, err := c.Stats(ctx, "q")
	require.NoError(t, err)
	require.Len(t, st, 1)
	s := st[0]
	require.Equal(t, int64(0), s.Ready)
	require.Equal(t, int64(1), s.Delayed)
	require.Equal(t, int64(1), s.Inflight)
	require.Equal(t, int64(1), s.Dead)
	require.Equal(t, int64(1), s.Leases)
	require.Equal(t, uint64(3), s.Enqueued)
	require.Equal(t, uint64(1), s.Nacked)
	require.Equal(t, uint64(1), s.DeadLettered)
	require.Equal(t, uint64(2), s.Delivered)
	dead, err := c.DeadList(ctx, storage.DeadListParams{Queue: "q", Limit: 10})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, "nack: bad", dead[0].Reason)
}
