package rpc

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// rocksNoSyncFactory is RocksDB with --sync=none: a storage.Nonblocking
// store, whose calls the lean engine runs on its reader.
func rocksNoSyncFactory() storeFactory {
	return storeFactory{"rocks-none", func(t *testing.T) storage.Store {
		s, err := rocksstore.Open(t.TempDir(), rocksstore.Options{Sync: rocksstore.SyncNone})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}}
}

func TestClient_AckPoll(t *testing.T) {
	t.Parallel()
	for _, f := range append(storeFactories(), rocksNoSyncFactory()) {
		for _, tr := range []string{"pipe", "tcp"} {
			t.Run("store="+f.name+",transport="+tr, func(t *testing.T) {
				t.Parallel()
				b := setup(t, bundleOpts{factory: f, transport: tr})
				c, producer := b.dial(), b.dial()
				ctx := ctxT(t)

				res, err := producer.Enqueue(ctx, "jobs", payloads(6, 64))
				require.NoError(t, err)
				first, err := c.Poll(ctx, "jobs", 3, time.Minute, 0)
				require.NoError(t, err)
				require.Len(t, first.Items, 3)

				// Ack the first three and take the other three in one round trip.
				codes, next, err := c.AckPoll(ctx, "jobs", first.Lease, itemIDs(first.Items), 10, time.Minute, 0)
				require.NoError(t, err)
				require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK, storage.CodeOK}, codes)
				require.Len(t, next.Items, 3)
				require.NotEqual(t, first.Lease, next.Lease)
				for i, it := range next.Items {
					require.Equal(t, res[3+i].ID, it.ID)
					require.Equal(t, payloads(6, 64)[3+i].Payload, it.Payload)
				}

				// Acking the same ids again: not found; nothing left to poll.
				codes, empty, err := c.AckPoll(ctx, "jobs", first.Lease, itemIDs(first.Items), 10, time.Minute, 0)
				require.NoError(t, err)
				require.Equal(t, []storage.Code{storage.CodeNotFound, storage.CodeNotFound, storage.CodeNotFound}, codes)
				require.Empty(t, empty.Items)
				require.True(t, empty.Lease.IsZero())

				// A poll that waits: the ack is applied at once, the poll
				// answers when an item comes.
				type out struct {
					codes []storage.Code
					pr    storage.PollResult
					err   error
				}
				ch := rpctest.Go(func() out {
					codes, pr, err := c.AckPoll(context.Background(), "jobs", next.Lease, itemIDs(next.Items), 10, time.Minute, 30*time.Second)
					return out{codes, pr, err}
				})
				rpctest.Eventually(t, 10*time.Second, func() bool {
					st, err := producer.Stats(ctx, "jobs")
					return err == nil && len(st) == 1 && st[0].Acked == 6
				})
				late, err := producer.Enqueue(ctx, "jobs", payloads(1, 64))
				require.NoError(t, err)
				o := rpctest.Recv(t, ch, 10*time.Second)
				require.NoError(t, o.err)
				require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK, storage.CodeOK}, o.codes)
				require.Len(t, o.pr.Items, 1)
				require.Equal(t, late[0].ID, o.pr.Items[0].ID)

				st, err := producer.Stats(ctx, "jobs")
				require.NoError(t, err)
				require.Equal(t, uint64(6), st[0].Acked)
				require.Equal(t, int64(1), st[0].Inflight)
				require.Equal(t, int64(0), st[0].Ready)
			})
		}
	}
}

// TestClient_AckPollErrors: bad arguments fail before anything is sent;
// a failed ack does not hide the poll's items.
func TestClient_AckPollErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c := b.dial()
	ctx := ctxT(t)

	_, _, err := c.AckPoll(ctx, "jobs", storage.LeaseID{}, nil, -1, time.Minute, 0)
	require.ErrorIs(t, err, storage.ErrInvalidArgument)
	_, _, err = c.AckPoll(ctx, "jobs", storage.LeaseID{}, nil, 1, -time.Second, 0)
	require.ErrorIs(t, err, storage.ErrInvalidArgument)

	_, err = c.Enqueue(ctx, "jobs", payloads(2, 16))
	require.NoError(t, err)
	// The ack names a queue that cannot exist; the poll is fine.
	_, pr, err := c.AckPoll(ctx, "", storage.LeaseID{1}, []storage.ItemID{{1}}, 1, time.Minute, 0)
	require.Error(t, err)
	require.Empty(t, pr.Items) // the poll named the same bad queue
	// Both name a bad queue: both fail, each error reported.
	_, _, err = c.AckPoll(ctx, "bad queue\x00", storage.LeaseID{1}, []storage.ItemID{{1}}, 1, time.Minute, 0)
	require.ErrorContains(t, err, "ack")
	require.ErrorContains(t, err, "poll")

	// The connection still works after failed calls.
	pr2, err := c.Poll(ctx, "jobs", 10, time.Minute, 0)
	require.NoError(t, err)
	require.Len(t, pr2.Items, 2)
	codes, _, err := c.AckPoll(ctx, "jobs", pr2.Lease, itemIDs(pr2.Items), 1, time.Minute, 0)
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK}, codes)
}

// TestClient_AckPollConcurrent: consumers sharing one connection, each
// acking its batch with the poll for the next, take every item once.
func TestClient_AckPollConcurrent(t *testing.T) {
	t.Parallel()
	for _, f := range []storeFactory{memFactory(), rocksFactory()} {
		t.Run("store="+f.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, bundleOpts{factory: f})
			c, producer := b.dial(), b.dial()
			ctx := ctxT(t)
			const n, workers = 400, 4
			for i := 0; i < n; i += 50 {
				_, err := producer.Enqueue(ctx, "q", payloads(50, 32))
				require.NoError(t, err)
			}
			var mu sync.Mutex
			seen := map[storage.ItemID]int{}
			var wg sync.WaitGroup
			errs := make(chan error, workers)
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					pr, err := c.Poll(ctx, "q", 7, time.Minute, 0)
					for err == nil && len(pr.Items) > 0 {
						mu.Lock()
						for _, it := range pr.Items {
							seen[it.ID]++
						}
						mu.Unlock()
						var codes []storage.Code
						codes, pr, err = c.AckPoll(ctx, "q", pr.Lease, itemIDs(pr.Items), 7, time.Minute, 0)
						for _, code := range codes {
							if code != storage.CodeOK {
								err = errors.Join(err, errors.New("ack: "+code.String()))
							}
						}
					}
					errs <- err
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			require.Len(t, seen, n)
			for id, k := range seen {
				require.Equal(t, 1, k, "item %v delivered %d times", id, k)
			}
			st, err := producer.Stats(ctx, "q")
			require.NoError(t, err)
			require.Equal(t, uint64(n), st[0].Acked)
			require.Equal(t, int64(0), st[0].Inflight+st[0].Ready)
		})
	}
}

// setupLeanRocksAlways serves RocksDB with --sync=always on the lean
// engine, whichever engine this pass tests (the fsync hold is the lean
// engine's: go-capnp runs each call on a goroutine of its own), and
// returns the store, for its metrics.
func setupLeanRocksAlways(t *testing.T) (*testBundle, *rocksstore.Store) {
	var rs *rocksstore.Store
	f := rocksWith(rocksstore.Options{Sync: rocksstore.SyncAlways}, &rs)
	b := setup(t, bundleOpts{factory: f, mutate: func(cfg *ServerConfig) { cfg.Engine = EngineLean }})
	return b, rs
}

// TestLean_PipelinedAckPollSharesOneFsync: on a --sync=always node the
// lean engine's reader holds the store's fsyncs while it hands over an
// ack and a poll that came in one piece, so each AckPoll costs one WAL
// fsync (the ack's would otherwise start before the poll is written).
func TestLean_PipelinedAckPollSharesOneFsync(t *testing.T) {
	t.Parallel()
	b, rs := setupLeanRocksAlways(t)
	c := b.dial()
	ctx := ctxT(t)
	const n = 20
	_, err := c.Enqueue(ctx, "q", payloads(n+1, 64))
	require.NoError(t, err)
	pr, err := c.Poll(ctx, "q", 1, time.Minute, 0)
	require.NoError(t, err)
	before := rs.Metrics().WALSyncs
	for i := 0; i < n; i++ {
		codes, next, err := c.AckPoll(ctx, "q", pr.Lease, itemIDs(pr.Items), 1, time.Minute, 0)
		require.NoError(t, err)
		require.Equal(t, []storage.Code{storage.CodeOK}, codes)
		require.Len(t, next.Items, 1)
		pr = next
	}
	require.EqualValues(t, n, rs.Metrics().WALSyncs-before, "one fsync per ack+poll pair")
}

// TestConsume_AcksWithTheNextPoll: the consumer helper acks a batch's
// successes with its poll for the next batch, so on a --sync=always node
// (lean engine) a batch costs one fsync, not one for the poll and one for
// the ack.
func TestConsume_AcksWithTheNextPoll(t *testing.T) {
	t.Parallel()
	b, rs := setupLeanRocksAlways(t)
	c := b.dial()
	ctx := ctxT(t)
	const n = 10
	_, err := c.Enqueue(ctx, "q", payloads(n, 16))
	require.NoError(t, err)
	before := rs.Metrics().WALSyncs
	r := startConsume(c, ConsumerConfig{Queue: "q", Workers: 1, Batch: 1, Lease: time.Minute, Clock: b.clock, Logger: rpctest.Logger(t),
		Handler: func(context.Context, storage.Item) error { return nil }})
	rpctest.Eventually(t, 10*time.Second, func() bool {
		st, err := c.Stats(ctx, "q")
		return err == nil && st[0].Acked == n
	})
	syncs := rs.Metrics().WALSyncs - before
	require.NoError(t, r.stop(t))
	// The first poll, then one fsync per ack riding the next poll (the
	// last one's poll finds nothing and waits, writing nothing).
	require.LessOrEqual(t, syncs, uint64(n+1), "fsyncs for %d batches", n)
	st, err := c.Stats(ctx, "q")
	require.NoError(t, err)
	require.Equal(t, int64(0), st[0].Inflight+st[0].Ready)
}
