package rpc

import (
	"net"
	"testing"
	"time"

	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/schema"
)

// sendPolls sends n poll calls of max items on queue, leased for an hour
// (sendCalls); the node may close the connection meanwhile.
func sendPolls(t *testing.T, conn net.Conn, queue string, n int, max uint32) {
	sendCalls(t, conn, n, 1 /* poll */, true, func(params rpccp.Payload) error {
		p, err := schema.NewQueue_poll_Params(params.Segment())
		if err != nil {
			return err
		}
		if err := p.SetQueue(queue); err != nil {
			return err
		}
		p.SetMax(max)
		p.SetLeaseMs(uint64(time.Hour / time.Millisecond))
		return params.SetContent(p.ToPtr())
	})
}

// TestReplyGate_UnreadPollAnswersBounded: a client that pipelines polls
// and never reads the answers: a poll that completes while the
// connection's unread answers are over its reply budget gives its items
// back and answers empty. Found by review (session 70): the reader
// checks the budget only before it takes the next call, and a durable
// poll (RocksDB, sync=always) is answered later by the store's goroutine,
// so every poll read before the first answer landed was admitted and
// answered, each up to 1 GiB (DefaultMaxReplyBytes): 18 times the budget
// here.
func TestReplyGate_UnreadPollAnswersBounded(t *testing.T) {
	t.Parallel()
	const limit = 256 << 10
	b := setup(t, bundleOpts{factory: rocksFactory(), mutate: func(c *ServerConfig) {
		c.ConnReplyLimitBytes = limit
		c.ReplyStallTimeout = time.Hour
	}})
	c := b.dial()
	ctx := ctxT(t)
	const itemSize = 32 << 10
	for range 4 {
		_, err := c.Enqueue(ctx, "big", payloads(64, itemSize)) // 256 items, 8 MiB
		require.NoError(t, err)
	}
	const calls, per = 64, 4 // answers of 128 KiB: 8 MiB if all were built
	conn := rawConn(t, b)
	go sendPolls(t, conn, "big", calls, per)

	polls := func() uint64 { return b.srv.Metrics().Ops[OpPoll].Count }
	var last uint64
	rpctest.Eventually(t, 30*time.Second, func() bool {
		n := polls()
		stable := n > 0 && n == last
		last = n
		time.Sleep(100 * time.Millisecond) // observation interval, not synchronisation
		return stable
	})
	queued := b.srv.Metrics().ReplyBytesQueued
	t.Logf("polls answered %d of %d, reply bytes queued %d (budget %d)", polls(), calls, queued, limit)
	bound := int64(limit + maxBuilding*(per*itemSize+64<<10))
	require.LessOrEqual(t, queued, bound,
		"a client that reads nothing made the node hold %d bytes of poll answers (%d polls answered), over its reply budget of %d (+%d answers in the making)",
		queued, polls(), limit, maxBuilding)
}
