package main

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/storage"
)

// enqueueBig enqueues count payloads of size bytes into queue through the
// Go client, ten per call (each call under the 64 MiB a client sends).
func enqueueBig(t *testing.T, addr, queue string, count, size int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := rpc.Dial(ctx, addr, rpc.ClientOptions{})
	require.NoError(t, err)
	defer c.Close()
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

// TestCLI_PeekOfLargeItemsListsThemAll: `peek QUEUE` with its default page
// (100) on a queue of 70 items of 1,000,000 bytes (each under the default
// 1 MiB --max-payload) gets a 70 MB answer, more than the 64 MiB a client
// sends or a node reads in one message: a client reads replies up to
// rpc.DefaultMaxReplyBytes (1 GiB, a poll of --max-batch items of
// --max-payload), so every item is listed. (It used to fail with "message
// too large", blaming the node's --max-message.)
func TestCLI_PeekOfLargeItemsListsThemAll(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--sync", "none")
	enqueueBig(t, n.addr, "bigpeek", 70, 1_000_000)
	r := n.cliCode("peek", "bigpeek")
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	require.Len(t, r.lines(), 70)
}

// TestCLI_PollOfLargeItemsGetsItsReply: `poll -n 70` on such a queue
// leases all 70 items (an attempt each, a 30 s lease) and prints every
// one: the client reads the 70 MB reply. (It used to refuse it after the
// node had leased the items, leaving them in flight under a lease nobody
// held, their attempt spent.)
func TestCLI_PollOfLargeItemsGetsItsReply(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--sync", "none")
	enqueueBig(t, n.addr, "bigpoll", 70, 1_000_000)
	r := n.cliCode("poll", "bigpoll", "-n", "70")
	s := n.stats("bigpoll")
	require.Equal(t, 0, r.code, "stderr: %s; stats after the failed poll: %+v", r.stderr, s)
	require.Equal(t, int64(70), s.Inflight)
	require.Len(t, r.lines(), int(s.Inflight), "every item leased was printed")
}
