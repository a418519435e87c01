package rpc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// enqueueSized enqueues count items of size bytes into queue, ten a call
// (each call under the 64 MiB a client sends).
func enqueueSized(t *testing.T, c *Client, queue string, count, size int) {
	t.Helper()
	ctx := ctxT(t)
	payload := bytes.Repeat([]byte{'p'}, size)
	for left := count; left > 0; {
		k := min(left, 10)
		items := make([]storage.EnqueueItem, k)
		for i := range items {
			items[i].Payload = payload
		}
		res, err := c.Enqueue(ctx, queue, items)
		require.NoError(t, err)
		for _, r := range res {
			require.Equal(t, storage.CodeOK, r.Code, r.Err)
		}
		left -= k
	}
}

// TestReply_LargerThanAMessageTheNodeReads: a reply may be far larger than
// the 64 MiB a node (and the client) accept from the other side's calls:
// 70 items of 1,000,000 bytes, each under the default 1 MiB payload limit,
// make 70 MB. On either client engine a poll of all 70 gets them (before,
// the client refused the Return after the node had leased every item), and
// so do a peek page, a dead-letter page and a subscription's push of all
// 70 (the push reaching the client's Consumer over its go-capnp
// connection). With the race detector, which makes moving 70 MB through
// capnp take minutes, the items are 20 of 200 KB: the same paths, replies
// under 64 MiB.
func TestReply_LargerThanAMessageTheNodeReads(t *testing.T) {
	t.Parallel()
	n, size := 70, 1_000_000
	if raceEnabled {
		n, size = 20, 200_000
	}
	for _, engine := range []string{ClientEngineLean, ClientEngineGoCapnp} {
		t.Run(engine, func(t *testing.T) {
			b := setup(t, bundleOpts{})
			c, err := b.dialErr(ClientOptions{Engine: engine})
			require.NoError(t, err)
			ctx := ctxT(t)
			cfg := storage.DefaultQueueConfig()
			cfg.MaxAttempts = 1 // a nack makes the items dead
			require.NoError(t, c.SetQueueConfig(ctx, "big", cfg))
			enqueueSized(t, c, "big", n, size)

			items, err := c.Peek(ctx, storage.PeekParams{Queue: "big"})
			require.NoError(t, err)
			require.Len(t, items, n)

			pr, err := c.Poll(ctx, "big", n, time.Minute, 0)
			require.NoError(t, err)
			require.Len(t, pr.Items, n)
			ids := make([]storage.ItemID, n)
			for i, it := range pr.Items {
				require.Len(t, it.Payload, size)
				ids[i] = it.ID
			}
			_, err = c.Nack(ctx, "big", pr.Lease, ids, nil, "no")
			require.NoError(t, err)

			dead, err := c.DeadList(ctx, storage.DeadListParams{Queue: "big"})
			require.NoError(t, err)
			require.Len(t, dead, n)

			_, err = c.Redrive(ctx, storage.RedriveParams{Queue: "big", Limit: n})
			require.NoError(t, err)
			sub, err := c.Subscribe(ctx, SubscribeOptions{Queue: "big", Prefetch: n, Lease: time.Minute})
			require.NoError(t, err)
			defer sub.Cancel()
			got := 0
			for got < n {
				d := recvDelivery(t, sub)
				for _, it := range d.Items {
					require.Len(t, it.Payload, size)
				}
				got += len(d.Items)
			}
			require.Equal(t, n, got)
		})
	}
}

// TestReply_NodeCutsRepliesToWhatClientsRead: with limits that allow items
// too large for MaxBatch of them to fit in one reply, a poll returns, and
// a peek or dead-letter page holds, only as many as fit (the client would
// refuse more); the caller polls again or pages on for the rest. Pushes
// to a subscription are cut the same way. The reply bound is lowered here
// (to about 10 items of the node's largest) in place of gigabytes of
// payload.
func TestReply_NodeCutsRepliesToWhatClientsRead(t *testing.T) {
	t.Parallel()
	limits := storage.Limits{MaxPayload: 64 << 10}.WithDefaults()
	maxReply := replyReserveBytes + 10*itemReplyBytes(limits) + 100
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) {
		c.Limits = limits
		c.maxReplyBytes = maxReply
	}})
	require.Equal(t, 10, b.srv.replyItems)
	c := b.dial()
	ctx := ctxT(t)
	enqueueSized(t, c, "cut", 25, 60<<10)

	first, err := c.Peek(ctx, storage.PeekParams{Queue: "cut", Limit: 25})
	require.NoError(t, err)
	require.Len(t, first, 10)
	rest, err := c.Peek(ctx, storage.PeekParams{Queue: "cut", Limit: 25, After: first[9].ID})
	require.NoError(t, err)
	require.Len(t, rest, 10, "the next page goes on from the last item")
	require.NotEqual(t, first[9].ID, rest[0].ID)

	// A limit over MaxBatch is still refused, not cut.
	_, err = c.Peek(ctx, storage.PeekParams{Queue: "cut", Limit: limits.MaxBatch + 1})
	require.ErrorIs(t, err, storage.ErrInvalidArgument)

	pr, err := c.Poll(ctx, "cut", 25, time.Minute, 0)
	require.NoError(t, err)
	require.Len(t, pr.Items, 10)
	s, err := c.Stats(ctx, "cut")
	require.NoError(t, err)
	require.Equal(t, int64(10), s[0].Inflight, "only what the reply holds is leased")

	sub, err := c.Subscribe(ctx, SubscribeOptions{Queue: "cut", Prefetch: 15, Lease: time.Minute})
	require.NoError(t, err)
	defer sub.Cancel()
	got := 0
	for got < 15 {
		d := recvDelivery(t, sub)
		require.LessOrEqual(t, len(d.Items), 10)
		got += len(d.Items)
	}
}

// TestReply_RefusedReplyIsNotBlamedOnTheRequest: a reply over what the
// client reads (a node of another version or configuration; here the
// client's bound is lowered to 1 MiB) fails the call with
// ErrReplyTooLarge, saying how large it was, and is not reported as a
// disconnection (IsDisconnected), whose usual cause is a request over the
// node's --max-message. Later calls on the closed connection fail as
// disconnected.
func TestReply_RefusedReplyIsNotBlamedOnTheRequest(t *testing.T) {
	t.Parallel()
	for _, engine := range []string{ClientEngineLean, ClientEngineGoCapnp} {
		t.Run(engine, func(t *testing.T) {
			b := setup(t, bundleOpts{})
			enqueueSized(t, b.dial(), "big", 2, 600_000)
			c, err := b.dialErr(ClientOptions{Engine: engine, maxReplyBytes: 1 << 20})
			require.NoError(t, err)
			ctx := ctxT(t)
			_, err = c.Poll(ctx, "big", 2, time.Minute, 0)
			require.ErrorIs(t, err, ErrReplyTooLarge)
			require.False(t, IsDisconnected(err), "%v", err)
			require.Contains(t, err.Error(), "over the 1048576 bytes this client reads")
			require.NotContains(t, err.Error(), "max-message")
			_, err = c.NodeInfo(ctx)
			require.True(t, IsDisconnected(err), "%v", err)
		})
	}
}

// TestReplyItems_DefaultLimitsFitWhole: with the default limits a whole
// batch of the largest items fits in DefaultMaxReplyBytes, so no reply is
// cut; with 16 MiB payloads about 60 fit.
func TestReplyItems_DefaultLimitsFitWhole(t *testing.T) {
	d := storage.DefaultLimits
	require.Equal(t, d.MaxBatch, replyItems(d, DefaultMaxReplyBytes))
	require.LessOrEqual(t, int64(d.MaxBatch)*itemReplyBytes(d)+replyReserveBytes, int64(DefaultMaxReplyBytes))
	big := storage.Limits{MaxPayload: 16 << 20}.WithDefaults()
	n := replyItems(big, DefaultMaxReplyBytes)
	require.Less(t, n, d.MaxBatch)
	require.Greater(t, n, 50)
	require.LessOrEqual(t, int64(n)*itemReplyBytes(big)+replyReserveBytes, int64(DefaultMaxReplyBytes))
	huge := storage.Limits{MaxPayload: 2 << 30}.WithDefaults()
	require.Equal(t, 1, replyItems(huge, DefaultMaxReplyBytes), "a lone item is still served")
}

// stingy hands out its data a few bytes at a time and then reports
// nothing more, as a peer that announced a large message and stopped.
type stingy struct{ data []byte }

func (s *stingy) Read(p []byte) (int, error) {
	if len(s.data) == 0 {
		return 0, errors.New("no more")
	}
	n := copy(p, s.data[:min(len(s.data), 1000)])
	s.data = s.data[n:]
	return n, nil
}

// TestFrameReader_GrowsAsBytesArrive: a header announcing a message of
// 512 MiB (under the reader's 1 GiB limit) followed by 100 KB makes the
// frame reader hold about what arrived, not the announced size; one
// announcing more than the limit is reported by tooLarge once its header
// is read.
func TestFrameReader_GrowsAsBytesArrive(t *testing.T) {
	hdr := binary.LittleEndian.AppendUint32(nil, 0)
	hdr = binary.LittleEndian.AppendUint32(hdr, 64<<20) // words: 512 MiB
	src := &stingy{data: append(hdr, make([]byte, 100_000)...)}
	fr := newFrameReader(src, 64<<10, DefaultMaxReplyBytes)
	require.Error(t, fr.fill())
	require.LessOrEqual(t, len(fr.buf), 256<<10)
	_, over := fr.tooLarge()
	require.False(t, over)

	hdr = binary.LittleEndian.AppendUint32(nil, 0)
	hdr = binary.LittleEndian.AppendUint32(hdr, 256<<20) // words: 2 GiB
	fr = newFrameReader(&stingy{data: hdr}, 64<<10, DefaultMaxReplyBytes)
	require.NoError(t, fr.fill())
	size, over := fr.tooLarge()
	require.True(t, over)
	require.Equal(t, uint64(8+2<<30), size)
}
