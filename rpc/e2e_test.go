package rpc

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
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

				_, err = c.Enqueue(ctx, "jobs", payloads(2, 8))
				require.NoError(t, err)
				_, err = c.DeleteQueue(ctx, "jobs", false)
				require.ErrorIs(t, err, storage.ErrNotEmpty, "a queue with items is kept without force")
				require.ErrorContains(t, err, "2 items")
				n, err = c.DeleteQueue(ctx, "jobs", true)
				require.NoError(t, err)
				require.Equal(t, 2, n)
				names, err = c.Queues(ctx)
				require.NoError(t, err)
				require.Empty(t, names)
				_, err = c.DeleteQueue(ctx, "jobs", true)
				require.ErrorIs(t, err, storage.ErrNotFound)
				_, err = c.DeleteQueue(ctx, "", true)
				require.ErrorIs(t, err, storage.ErrInvalidArgument)

				_, err = c.QueueConfig(ctx, "nope")
				require.ErrorIs(t, err, storage.ErrNotFound)
				var se *StatusError
				require.True(t, errors.As(err, &se))

				m := b.srv.Metrics()
				require.Equal(t, uint64(3), m.Ops[OpEnqueue].Count)
				require.Equal(t, uint64(1), m.Ops[OpGetConfig].Errors+0*m.Ops[OpGetConfig].Count)
			})
		}
	}
}

// TestEndToEnd_Rocks runs the blocking paths (long-poll wake-up, push,
// consumer helper) over a real socket against RocksDB with fsync.
func TestEndToEnd_Rocks(t *testing.T) {
	t.Parallel()
	for _, tr := range []string{"tcp", "unix"} {
		t.Run("transport="+tr, func(t *testing.T) {
			t.Parallel()
			b := setup(t, bundleOpts{factory: rocksFactory(), transport: tr})
			c, producer := b.dial(), b.dial()
			ctx := ctxT(t)

			ch := goPoll(c, "q", 10, 30*time.Second)
			rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
			res, err := producer.Enqueue(ctx, "q", payloads(1, 256))
			require.NoError(t, err)
			o := recvPoll(t, ch)
			require.NoError(t, o.err)
			require.Equal(t, res[0].ID, o.pr.Items[0].ID)
			codes, err := c.Ack(ctx, "q", o.pr.Lease, []storage.ItemID{res[0].ID})
			require.NoError(t, err)
			require.Equal(t, []storage.Code{storage.CodeOK}, codes)

			sub, err := c.Subscribe(ctx, SubscribeOptions{Queue: "push", Prefetch: 4, Lease: time.Minute})
			require.NoError(t, err)
			_, err = producer.Enqueue(ctx, "push", payloads(10, 256))
			require.NoError(t, err)
			got := 0
			for got < 10 {
				d := recvDelivery(t, sub)
				ids := make([]storage.ItemID, len(d.Items))
				for i, it := range d.Items {
					ids[i] = it.ID
				}
				got += len(ids)
				codes, err := c.Ack(ctx, "push", d.Lease, ids)
				require.NoError(t, err)
				for _, code := range codes {
					require.Equal(t, storage.CodeOK, code)
				}
			}
			sub.Cancel()

			_, err = producer.Enqueue(ctx, "work", payloads(20, 256))
			require.NoError(t, err)
			var n atomicCounter
			all := make(chan struct{})
			r := startConsume(c, ConsumerConfig{Queue: "work", Workers: 4, Batch: 4, Lease: time.Minute, Clock: b.clock,
				Handler: func(context.Context, storage.Item) error {
					if n.inc() == 20 {
						close(all)
					}
					return nil
				}})
			<-all
			require.NoError(t, r.stop(t))
			st, err := c.Stats(ctx, "work")
			require.NoError(t, err)
			require.Equal(t, uint64(20), st[0].Acked)
			rep, err := b.store.Check(ctx)
			require.NoError(t, err)
			require.True(t, rep.OK(), "%v", rep.Violations)
		})
	}
}

type atomicCounter struct {
	mu sync.Mutex
	n  int
}

func (a *atomicCounter) inc() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n++
	return a.n
}
