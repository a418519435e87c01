package rpc

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// rocksWithLimits opens a RocksDB store with limits lim, as leaseq serve
// gives the store and the server the same limits.
func rocksWithLimits(lim storage.Limits) storeFactory {
	return rocksWithLimitsSync(lim, rocksstore.SyncNone)
}

// rocksWithLimitsSync is rocksWithLimits with fsyncs as sync says.
func rocksWithLimitsSync(lim storage.Limits, sync rocksstore.SyncMode) storeFactory {
	return rocksWith(rocksstore.Options{Sync: sync, Limits: lim}, nil)
}

// A node started with --max-batch under DefaultPageLimit (100): a page
// call that names no limit takes MaxBatch. Found by review (session 70):
// the server passed 100 on, and the store refused every Peek, DeadList,
// Redrive and PurgeDead without a limit ("limit must be 1-50, got 100").
func TestLimits_DefaultPageLimitOverMaxBatch(t *testing.T) {
	lim := storage.Limits{MaxBatch: 50}
	b := setup(t, bundleOpts{factory: rocksWithLimits(lim), mutate: func(c *ServerConfig) { c.Limits = lim }})
	c := b.dial()
	ctx := ctxT(t)
	_, err := c.Enqueue(ctx, "q", payloads(3, 8))
	require.NoError(t, err)
	_, err = c.Enqueue(ctx, "q", []storage.EnqueueItem{{Payload: []byte("d"), MaxAttempts: 1}})
	require.NoError(t, err)

	items, err := c.Peek(ctx, storage.PeekParams{Queue: "q"})
	assert.NoError(t, err, "peek without a limit")
	assert.Len(t, items, 4)
	_, err = c.DeadList(ctx, storage.DeadListParams{Queue: "q"})
	assert.NoError(t, err, "dead list without a limit")
	_, err = c.Redrive(ctx, storage.RedriveParams{Queue: "q"})
	assert.NoError(t, err, "redrive without a limit")
	_, err = c.PurgeDead(ctx, storage.RedriveParams{Queue: "q"})
	assert.NoError(t, err, "purge dead without a limit")
}

// A payload a few dozen bytes under the message limit: the client refuses
// the call before sending it (its size check counts the call around the
// items), and the connection serves on. Found by review (session 70): it
// passed the check (64 bytes per item, nothing for the call), and the
// node's decoder ended the whole session ("node aborted the session").
// leaseq serve now also keeps --max-payload 4 KiB under --max-message.
func TestLimits_PayloadJustUnderTheMessageLimit(t *testing.T) {
	const msg = 1 << 20
	lim := storage.Limits{MaxPayload: msg - 1} // what serve's flag check allows
	b := setup(t, bundleOpts{factory: rocksWithLimits(lim), mutate: func(c *ServerConfig) {
		c.MaxMessageBytes = msg
		c.Limits = lim
	}})
	c, err := b.dialErr(ClientOptions{FlowLimitBytes: msg})
	require.NoError(t, err)
	ctx := ctxT(t)
	res, err := c.Enqueue(ctx, "q", []storage.EnqueueItem{{Payload: make([]byte, msg-64)}})
	if err != nil {
		require.ErrorIs(t, err, storage.ErrInvalidArgument, "refused, then clearly and without the session: %v", err)
		_, err = c.Stats(ctx, "")
		require.NoError(t, err, "the connection survives a refused call")
		return
	}
	require.Equal(t, storage.CodeOK, res[0].Code)
}

// Consume with Lease 0 on a node whose --max-lease is under the default
// 30 s leases for the node's maximum. Found by review (session 70): it
// sent 30 s on every poll, and every poll was refused.
func TestLimits_ConsumerDefaultLeaseOverNodeMaxLease(t *testing.T) {
	consumeOneWithDefaultLease(t, storage.Limits{MaxLease: 10 * time.Second})
}

// TestLimits_ConsumerDefaultLeaseUnderNodeMinLease: Consume with Lease
// 0 (and leaseq work without --lease: NodeInfo.LeaseWithin) leases within
// the node's --min-lease too. Found by review (session 70): the default
// 30 s was lowered to --max-lease but not raised to --min-lease, and on a
// node with --min-lease 1m every poll was refused.
func TestLimits_ConsumerDefaultLeaseUnderNodeMinLease(t *testing.T) {
	consumeOneWithDefaultLease(t, storage.Limits{MinLease: time.Minute, MaxLease: 10 * time.Minute})
}

// consumeOneWithDefaultLease runs Consume with Lease 0 against a node and
// store with limits lim, and requires it to handle the one item enqueued.
func consumeOneWithDefaultLease(t *testing.T, lim storage.Limits) {
	t.Helper()
	b := setup(t, bundleOpts{factory: rocksWithLimits(lim), mutate: func(c *ServerConfig) { c.Limits = lim }})
	c := b.dial()
	ctx := ctxT(t)
	_, err := c.Enqueue(ctx, "q", payloads(1, 8))
	require.NoError(t, err)
	handled := make(chan struct{})
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(cctx, ConsumerConfig{Queue: "q", Clock: b.clock, Handler: func(context.Context, storage.Item) error {
			close(handled)
			return nil
		}})
	}()
	select {
	case <-handled:
		cancel()
		require.NoError(t, <-done)
	case err := <-done:
		t.Fatalf("Consume with the default lease on a node with leases of %v to %v: %v", lim.MinLease, lim.MaxLease, err)
	case <-ctx.Done():
		t.Fatal("Consume neither handled the item nor returned")
	}
}

// An item refused by the limits gets the same EnqueueResult.Err from a
// Store and through the rpc server and client (storage.ItemReason). Found
// by review (session 70): the stores gave err.Error() of the *ItemError
// ("storage: invalid argument: payload of ..."), rpc its Detail.
func TestLimits_ItemReasonSameOnBothPaths(t *testing.T) {
	lim := storage.DefaultLimits
	b := setup(t, bundleOpts{factory: rocksWithLimits(storage.Limits{})})
	c := b.dial()
	ctx := ctxT(t)
	// Per-item refusals: the same reason text on both paths.
	bad := []storage.EnqueueItem{
		{Payload: make([]byte, lim.MaxPayload+1)},
		{Payload: []byte("x"), DedupKey: strings.Repeat("k", lim.MaxDedupKey+1)},
		{Payload: []byte("x"), Delay: lim.MaxDelay + time.Millisecond},
	}
	dres, err := b.store.Enqueue(ctx, storage.EnqueueParams{Queue: "z", Items: bad, Now: b.clock.Now()})
	require.NoError(t, err)
	rres, err := c.Enqueue(ctx, "z", bad)
	require.NoError(t, err)
	for i := range bad {
		require.Equal(t, storage.CodeInvalid, dres[i].Code)
		require.Equal(t, storage.CodeInvalid, rres[i].Code)
		require.Equal(t, dres[i].Err, rres[i].Err, "item %d: store and rpc give the same reason", i)
	}
}

// The wire counts milliseconds: the client rounds a delay up (msDurUp),
// so a delay over MaxDelay by 0.5 ms is refused through the client as by
// the store, and refuses a negative page limit as the store does. Found
// by review (session 70): the delay went as MaxDelay (truncated) and was
// accepted, and the limit -1 went as 0, the default page.
func TestLimits_SubMillisecondDelayAndNegativeLimitThroughClient(t *testing.T) {
	lim := storage.DefaultLimits
	b := setup(t, bundleOpts{factory: rocksWithLimits(storage.Limits{})})
	c := b.dial()
	ctx := ctxT(t)
	items := []storage.EnqueueItem{{Payload: []byte("over"), Delay: lim.MaxDelay + time.Millisecond/2}}
	direct, err := b.store.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: items, Now: b.clock.Now()})
	require.NoError(t, err)
	viaRPC, err := c.Enqueue(ctx, "q", items)
	assert.Equal(t, direct[0].Code, storage.CodeInvalid)
	require.NoError(t, err)
	assert.Equal(t, direct[0].Code, viaRPC[0].Code, "delay over MaxDelay by 0.5ms: store refuses, client accepts")
	// Half a millisecond: delayed (by a millisecond), not ready at once.
	half, err := c.Enqueue(ctx, "half", []storage.EnqueueItem{{Payload: []byte("x"), Delay: time.Millisecond / 2}})
	require.NoError(t, err)
	require.Equal(t, storage.CodeOK, half[0].Code)
	st, err := c.Stats(ctx, "half")
	require.NoError(t, err)
	require.EqualValues(t, 1, st[0].Delayed)
	_, errDirect := b.store.Peek(ctx, storage.PeekParams{Queue: "q", Limit: -1, Now: b.clock.Now()})
	require.ErrorIs(t, errDirect, storage.ErrInvalidArgument)
	_, errRPC := c.Peek(ctx, storage.PeekParams{Queue: "q", Limit: -1})
	assert.ErrorIs(t, errRPC, storage.ErrInvalidArgument, "peek limit -1: store refuses, client pages 100")
}

// TestLimits_PollOfItemsStoredUnderLargerLimits: a node restarted with a
// lower --max-payload still holds items of the old size: a poll is cut by
// the items' stored sizes, as peek and dead-list pages are (trimPoll), and
// the items cut off go back. Found by review (session 70): a poll was cut
// only by replyItems, from the present limits; it leased more of the old,
// larger items than fit in one reply, the client refused the reply
// (ErrReplyTooLarge) and closed the connection, and every later poll did
// the same, so the queue never drained. (Reply bound lowered in place of the
// 1 GiB default: 1000 items of 1 MiB after a restart with --max-payload
// 64KiB is the same.)
func TestLimits_PollOfItemsStoredUnderLargerLimits(t *testing.T) {
	for _, sync := range []rocksstore.SyncMode{rocksstore.SyncNone, rocksstore.SyncAlways} {
		t.Run(sync.String(), func(t *testing.T) { testPollOfItemsStoredUnderLargerLimits(t, sync) })
	}
}

func testPollOfItemsStoredUnderLargerLimits(t *testing.T, sync rocksstore.SyncMode) {
	limits := storage.Limits{MaxPayload: 1 << 10}.WithDefaults()
	maxReply := replyReserveBytes + 10*itemReplyBytes(limits) + 100
	b := setup(t, bundleOpts{factory: rocksWithLimitsSync(storage.Limits{}, sync), mutate: func(c *ServerConfig) {
		c.Limits = limits
		c.maxReplyBytes = maxReply
	}})
	require.Equal(t, 10, b.srv.replyItems)
	ctx := ctxT(t)
	// Written before the restart, under the old limits.
	old := make([]storage.EnqueueItem, 10)
	for i := range old {
		old[i] = storage.EnqueueItem{Payload: make([]byte, 64<<10)}
	}
	_, err := b.store.Enqueue(ctx, storage.EnqueueParams{Queue: "old", Items: old, Now: b.clock.Now()})
	require.NoError(t, err)

	c, err := b.dialErr(ClientOptions{maxReplyBytes: maxReply})
	require.NoError(t, err)
	peek, err := c.Peek(ctx, storage.PeekParams{Queue: "old", Limit: 10})
	require.NoError(t, err, "peek is cut to what fits")
	require.NotEmpty(t, peek)
	pr, err := c.Poll(ctx, "old", 10, time.Minute, 0)
	require.NoError(t, err, "poll must be cut to what fits, as peek is")
	require.NotEmpty(t, pr.Items)
	require.Less(t, len(pr.Items), 10)
	// The items cut off went back: ready for the next poll.
	rpctest.Eventually(t, 10*time.Second, func() bool {
		st, err := c.Stats(ctx, "old")
		return err == nil && len(st) == 1 && st[0].Ready == int64(10-len(pr.Items))
	}, "the items cut off stay leased")
}

// TestEdges_NamesAndSizesThroughClient: the longest queue name,
// prefix names, dedup keys with NUL and 0xff bytes and at the max length,
// a payload at the max and around the store's inline threshold, priority
// bounds, poll at MaxBatch and lease/delay at their bounds, end to end
// through the client and a RocksDB store; a name one byte too long is
// refused with the store's own message.
func TestEdges_NamesAndSizesThroughClient(t *testing.T) {
	lim := storage.DefaultLimits
	b := setup(t, bundleOpts{factory: rocksWithLimits(storage.Limits{})})
	c := b.dial()
	ctx := ctxT(t)
	long := strings.Repeat("z", lim.MaxQueueName)
	names := []string{"z", "zz", "z-", "z.", long}
	keys := []string{"k", "k\x00", "k\x00\x01", "\xff\xfe", strings.Repeat("\x00", lim.MaxDedupKey)}
	for _, q := range names {
		var items []storage.EnqueueItem
		for i, k := range keys {
			p := make([]byte, []int{0, 4096, 4097, lim.MaxPayload, 1}[i])
			copy(p, q)
			items = append(items, storage.EnqueueItem{Payload: p, DedupKey: k, Priority: uint8([]int{255, 0, 7, 255, 0}[i])})
		}
		res, err := c.Enqueue(ctx, q, items)
		require.NoError(t, err, q)
		for i, r := range res {
			require.Equal(t, storage.CodeOK, r.Code, "%q item %d: %s", q, i, r.Err)
			require.False(t, r.Duplicate, "%q item %d: dedup key %q", q, i, keys[i])
		}
		again, err := c.Enqueue(ctx, q, items)
		require.NoError(t, err)
		for i, r := range again {
			require.True(t, r.Duplicate, "%q item %d", q, i)
			require.Equal(t, res[i].ID, r.ID)
		}
	}
	for _, q := range names {
		pr, err := c.Poll(ctx, q, lim.MaxBatch, lim.MaxLease, 0)
		require.NoError(t, err)
		require.Len(t, pr.Items, len(keys), q)
		require.Equal(t, b.clock.Now().Add(lim.MaxLease), pr.ExpiresAt)
		got := map[string]int{}
		for _, it := range pr.Items {
			require.Equal(t, q, it.Queue)
			got[it.DedupKey] = len(it.Payload)
		}
		require.Equal(t, map[string]int{"k": 0, "k\x00": 4096, "k\x00\x01": 4097, "\xff\xfe": lim.MaxPayload, strings.Repeat("\x00", lim.MaxDedupKey): 1}, got)
		exp, err := c.Extend(ctx, q, pr.Lease, lim.MinLease)
		require.NoError(t, err)
		require.Equal(t, b.clock.Now().Add(lim.MinLease), exp)
		d := lim.MaxDelay
		codes, err := c.Nack(ctx, q, pr.Lease, []storage.ItemID{pr.Items[0].ID}, &d, "r\x00eason")
		require.NoError(t, err)
		require.Equal(t, []storage.Code{storage.CodeOK}, codes)
		ids := make([]storage.ItemID, 0, len(pr.Items)-1)
		for _, it := range pr.Items[1:] {
			ids = append(ids, it.ID)
		}
		codes, err = c.Ack(ctx, q, pr.Lease, ids)
		require.NoError(t, err)
		for _, cd := range codes {
			require.Equal(t, storage.CodeOK, cd)
		}
		peek, err := c.Peek(ctx, storage.PeekParams{Queue: q, Limit: lim.MaxBatch})
		require.NoError(t, err)
		require.Len(t, peek, 1)
		require.Equal(t, "r\x00eason", peek[0].LastError)
		require.Equal(t, storage.StateDelayed, peek[0].State)
	}
	st, err := c.Stats(ctx, "")
	require.NoError(t, err)
	require.Len(t, st, len(names))
	for _, s := range st {
		require.Equal(t, int64(1), s.Delayed, s.Queue)
		require.Equal(t, int64(0), s.Ready+s.Inflight+s.Dead, s.Queue)
	}

	// One byte over the name limit: the same refusal on both paths.
	over := long + "z"
	_, direct := b.store.Enqueue(ctx, storage.EnqueueParams{Queue: over, Items: payloads(1, 1), Now: b.clock.Now()})
	_, viaRPC := c.Enqueue(ctx, over, payloads(1, 1))
	require.ErrorIs(t, direct, storage.ErrInvalidArgument)
	require.ErrorIs(t, viaRPC, storage.ErrInvalidArgument)
	require.Contains(t, viaRPC.Error(), "queue name must be 1-200 bytes, got 201")
	require.Contains(t, direct.Error(), "queue name must be 1-200 bytes, got 201")

}

// TestEdges_ItemReasonSameOnBothPaths: an item refused by the
// limits gets EnqueueResult.Err "storage: invalid argument: payload of
// ..." from a Store (rocksstore, memstore: err.Error() of the
// *ItemError) but "payload of ..." through the rpc server and client
// (ItemError.Detail): the same call, the same store, two texts.
func TestEdges_ItemReasonSameOnBothPaths(t *testing.T) {
	lim := storage.DefaultLimits
	b := setup(t, bundleOpts{factory: rocksWithLimits(storage.Limits{})})
	c := b.dial()
	ctx := ctxT(t)
	// Per-item refusals: the same reason text on both paths.
	bad := []storage.EnqueueItem{
		{Payload: make([]byte, lim.MaxPayload+1)},
		{Payload: []byte("x"), DedupKey: strings.Repeat("k", lim.MaxDedupKey+1)},
		{Payload: []byte("x"), Delay: lim.MaxDelay + time.Millisecond},
	}
	dres, err := b.store.Enqueue(ctx, storage.EnqueueParams{Queue: "z", Items: bad, Now: b.clock.Now()})
	require.NoError(t, err)
	rres, err := c.Enqueue(ctx, "z", bad)
	require.NoError(t, err)
	for i := range bad {
		require.Equal(t, storage.CodeInvalid, dres[i].Code)
		require.Equal(t, storage.CodeInvalid, rres[i].Code)
		require.Equal(t, dres[i].Err, rres[i].Err, "item %d: store and rpc give the same reason", i)
	}
}

// TestEdges_ItemWithinMaxPayloadKillsSession: leaseq serve
// accepts any --max-payload below --max-message (serve_flags.go:171), but
// a message carries ~100-300 bytes besides the payload (frame, rpc Call,
// queue name, item struct). An item within the node's MaxPayload, a few
// dozen bytes under MaxMessageBytes, passes the client's checkSize (64
// bytes per item) and the node's decoder refuses the message by aborting
// the whole session: the caller gets "node aborted the session" instead
// of a per-item CodeInvalid or ErrInvalidArgument, and every other call in
// flight on that connection fails with it.
func TestEdges_ItemWithinMaxPayloadKillsSession(t *testing.T) {
	const msg = 1 << 20
	lim := storage.Limits{MaxPayload: msg - 1} // what serve's flag check allows
	b := setup(t, bundleOpts{factory: rocksWithLimits(lim), mutate: func(c *ServerConfig) {
		c.MaxMessageBytes = msg
		c.Limits = lim
	}})
	c, err := b.dialErr(ClientOptions{FlowLimitBytes: msg})
	require.NoError(t, err)
	ctx := ctxT(t)
	res, err := c.Enqueue(ctx, "q", []storage.EnqueueItem{{Payload: make([]byte, msg-64)}})
	if err != nil {
		require.ErrorIs(t, err, storage.ErrInvalidArgument, "refused, then clearly and without the session: %v", err)
		_, err = c.Stats(ctx, "")
		require.NoError(t, err, "the connection survives a refused call")
		return
	}
	require.Equal(t, storage.CodeOK, res[0].Code)
}

// TestEdges_SubMillisecondDurationsThroughClient: the wire counts
// milliseconds and the client truncates (msDur). Poll and Extend refuse a
// lease under 1ms rather than let it silently change (checkLeaseMs), but
// Enqueue does not: a delay of MaxDelay+0.5ms, which the store refuses,
// is accepted through the client as MaxDelay; a delay of 0.5ms becomes 0
// (ready at once, not delayed). A negative page limit, which the store
// refuses ("limit must be 1-1000, got -1"), becomes DefaultPageLimit.
func TestEdges_SubMillisecondDurationsThroughClient(t *testing.T) {
	lim := storage.DefaultLimits
	b := setup(t, bundleOpts{factory: rocksWithLimits(storage.Limits{})})
	c := b.dial()
	ctx := ctxT(t)
	items := []storage.EnqueueItem{{Payload: []byte("over"), Delay: lim.MaxDelay + time.Millisecond/2}}
	direct, err := b.store.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: items, Now: b.clock.Now()})
	require.NoError(t, err)
	viaRPC, err := c.Enqueue(ctx, "q", items)
	assert.Equal(t, direct[0].Code, storage.CodeInvalid)
	if err == nil {
		assert.Equal(t, direct[0].Code, viaRPC[0].Code, "delay over MaxDelay by 0.5ms: store refuses, client accepts")
	}
	_, errDirect := b.store.Peek(ctx, storage.PeekParams{Queue: "q", Limit: -1, Now: b.clock.Now()})
	require.ErrorIs(t, errDirect, storage.ErrInvalidArgument)
	_, errRPC := c.Peek(ctx, storage.PeekParams{Queue: "q", Limit: -1})
	assert.ErrorIs(t, errRPC, storage.ErrInvalidArgument, "peek limit -1: store refuses, client pages 100")
}
