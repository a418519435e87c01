package rpc

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// Legit messages made of many small pointers (a batch of MaxBatch items
// with empty payloads and dedup keys, its answer, an ack of MaxBatch ids,
// a page, stats of many queues) are read within their traversal limit
// (traversalLimit) on both engines (written by the review of session
// 70's changes).
func TestTraversal_LargeLegitMessagesWithin(t *testing.T) {
	for _, eng := range testEngines {
		t.Run(eng, func(t *testing.T) {
			lim := storage.DefaultLimits
			b := setup(t, bundleOpts{mutate: func(c *ServerConfig) { c.Engine = eng }})
			c := b.dial()
			ctx := ctxT(t)
			for _, keyLen := range []int{0, 1, lim.MaxDedupKey} {
				q := fmt.Sprintf("q%d", keyLen)
				items := make([]storage.EnqueueItem, lim.MaxBatch)
				for i := range items {
					if keyLen > 0 {
						items[i].DedupKey = fmt.Sprintf("%0*d", keyLen, i)
					}
				}
				res, err := c.Enqueue(ctx, q, items)
				require.NoError(t, err, "enqueue, dedup keys of %d bytes", keyLen)
				require.Len(t, res, lim.MaxBatch)
				peek, err := c.Peek(ctx, storage.PeekParams{Queue: q, Limit: lim.MaxBatch})
				require.NoError(t, err, "peek")
				require.Len(t, peek, lim.MaxBatch)
				pr, err := c.Poll(ctx, q, lim.MaxBatch, time.Minute, 0)
				require.NoError(t, err, "poll")
				require.Len(t, pr.Items, lim.MaxBatch)
				ids := make([]storage.ItemID, len(pr.Items))
				for i, it := range pr.Items {
					ids[i] = it.ID
				}
				codes, err := c.Ack(ctx, q, pr.Lease, ids)
				require.NoError(t, err, "ack")
				require.Len(t, codes, lim.MaxBatch)
			}
			const nq = 3000
			for i := 0; i < nq; i++ {
				_, err := b.store.Enqueue(ctx, storage.EnqueueParams{Queue: fmt.Sprintf("s%s%d", strings.Repeat("x", 100), i), Items: payloads(1, 0), Now: b.clock.Now()})
				require.NoError(t, err)
			}
			st, err := c.Stats(ctx, "")
			require.NoError(t, err, "stats")
			require.Len(t, st, nq+3)
		})
	}
}
