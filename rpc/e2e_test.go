package rpc

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

func storeFactories() []storeFactory {
	return append([]storeFactory{memFactory()}, extraFactories()...)
}

func TestEndToEnd_EnqueuePollAck(t *testing.T) {
	t.Parallel()
	for _, f := range storeFactories() {
		for _, tr := range []string{"pipe", "tcp", "unix"} {
			t.Run("store="+f.name+",transport="+tr, func(t *testing.T) {
				t.Parallel()
				b := setup(t, bundleOpts{factory: f, transport: tr})
				c := b.dial()
				ctx := ctxT(t)

				items := payloads(3, 256)
				items[1].Priority = 0
				items[2].DedupKey = "k"
				res, err := c.Enqueue(ctx, "jobs", items)
				require.NoError(t, err)
				require.Len(t, res, 3)
				for _, r := range res {
					require.Equal(t, storage.CodeOK, r.Code)
					require.False(t, r.ID.IsZero())
				}
				dup, err := c.Enqueue(ctx, "jobs", []storage.EnqueueItem{{Payload: []byte("x"), DedupKey: "k"}})
				require.NoError(t, err)
				require.True(t, dup[0].Duplicate)
				require.Equal(t, res[2].ID, dup[0].ID)

				pr, err := c.Poll(ctx, "jobs", 10, time.Second, 0)
				require.NoError(t, err)
				require.Len(t, pr.Items, 3)
				require.False(t, pr.Lease.IsZero())
				require.Equal(t, testStart.Add(time.Second), pr.ExpiresAt)
				for i, it := range pr.Items {
					require.Equal(t, res[i].ID, it.ID)
					require.True(t, bytes.Equal(items[i].Payload, it.Payload))
					require.Equal(t, uint32(1), it.Attempts)
					require.Equal(t, testStart, it.EnqueuedAt)
					require.Equal(t, "jobs", it.Queue)
				}
				require.Equal(t, "k", pr.Items[2].DedupKey)

				ext, err := c.Extend(ctx, "jobs", pr.Lease, 5*time.Second)
				require.NoError(t, err)
				require.Equal(t, testStart.Add(5*time.Second), ext)

				codes, err := c.Ack(ctx, "jobs", pr.Lease, []storage.ItemID{pr.Items[0].ID, pr.Items[1].ID})
				require.NoError(t, err)
				require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK}, codes)
				codes, err = c.Ack(ctx, "jobs", pr.Lease, []storage.ItemID{pr.Items[0].ID})
				require.NoError(t, err)
				require.Equal(t, []storage.Code{storage.CodeNotFound}, codes)

				zero := time.Duration(0)
				codes, err = c.Nack(ctx, "jobs", pr.Lease, []storage.ItemID{pr.Items[2].ID}, &zero, "boom")
				require.NoError(t, err)
				require.Equal(t, []storage.Code{storage.CodeOK}, codes)

				st, err := c.Stats(ctx, "jobs")
				require.NoError(t, err)
				require.Len(t, st, 1)
				require.Equal(t, "jobs", st[0].Queue)
				require.Equal(t, uint64(3), st[0].Enqueued)
				require.Equal(t, uint64(2), st[0].Acked)
				require.Equal(t, uint64(1), st[0].Nacked)
				require.Equal(t, uint32(storage.DefaultMaxAttempts), st[0].Config.MaxAttempts)

				peek, err := c.Peek(ctx, storage.PeekParams{Queue: "jobs"})
				require.NoError(t, err)
				require.Len(t, peek, 1)
				require.Equal(t, "boom", peek[0].LastError)

				names, err := c.Queues(ctx)
				require.NoError(t, err)
				require.Equal(t, []string{"jobs"}, names)

				cfg := storage.DefaultQueueConfig()
				cfg.MaxAttempts = 1
				require.NoError(t, c.SetQueueConfig(ctx, "jobs", cfg))
				got, err := c.QueueConfig(ctx, "jobs")
				require.NoError(t, err)
				require.Equal(t, cfg, got)

				// One more delivery ends in the DLQ (max attempts 1 < attempts 2).
				pr, err = c.Poll(ctx, "jobs", 10, 0, 0)
				require.NoError(t, err)
				require.Len(t, pr.Items, 1)
				codes, err = c.Nack(ctx, "jobs", pr.Lease, []storage.ItemID{pr.Items[0].ID}, nil, "again")
				require.NoError(t, err)
				require.Equal(t, []storage.Code{storage.CodeOK}, codes)
				dead, err := c.DeadList(ctx, storage.DeadListParams{Queue: "jobs"})
				require.NoError(t, err)
				require.Len(t, dead, 1)
				require.Equal(t, "nack: again", dead[0].Reason)
				require.Equal(t, testStart, dead[0].DeadAt)
				rr, err := c.Redrive(ctx, storage.RedriveParams{Queue: "jobs", IDs: []storage.ItemID{dead[0].ID, res[0].ID}})
				require.NoError(t, err)
				require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeNotFound}, rr.Codes)
				require.Equal(t, 1, rr.Moved)
				n, err := c.Purge(ctx, "jobs")
				require.NoError(t, err)
				require.Equal(t, 1, n)
				rr, err = c.PurgeDead(ctx, storage.RedriveParams{Queue: "jobs"})
				require.NoError(t, err)
				require.Equal(t, 0, rr.Moved)

				_, err = c.QueueConfig(ctx, "nope")
				require.ErrorIs(t, err, storage.ErrNotFound)
				var se *StatusError
				require.True(t, errors.As(err, &se))

				m := b.srv.Metrics()
				require.Equal(t, uint64(2), m.Ops[OpEnqueue].Count)
				require.Equal(t, uint64(1), m.Ops[OpGetConfig].Errors+0*m.Ops[OpGetConfig].Count)
			})
		}
	}
}
