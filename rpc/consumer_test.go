package rpc

import (
	"context"
	"errors"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

type consumeRun struct {
	cancel context.CancelFunc
	done   chan error
}

func startConsume(c *Client, cfg ConsumerConfig) *consumeRun {
	ctx, cancel := context.WithCancel(context.Background())
	r := &consumeRun{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Consume(ctx, cfg) }()
	return r
}

func (r *consumeRun) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("Consume did not return")
	}
	return nil
}

func TestConsume(t *testing.T) {
	t.Parallel()

	t.Run("AckOnSuccess", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ctx := ctxT(t)
		res, err := c.Enqueue(ctx, "q", payloads(7, 16))
		require.NoError(t, err)
		var mu sync.Mutex
		seen := map[storage.ItemID]int{}
		all := make(chan struct{})
		r := startConsume(c, ConsumerConfig{
			Queue: "q", Workers: 3, Batch: 2, Lease: time.Minute, Clock: b.clock, Logger: testLogger(t),
			Handler: func(_ context.Context, it storage.Item) error {
				mu.Lock()
				defer mu.Unlock()
				seen[it.ID]++
				if len(seen) == len(res) {
					close(all)
				}
				return nil
			},
		})
		select {
		case <-all:
		case <-time.After(10 * time.Second):
			t.Fatal("not every item was handled")
		}
		require.NoError(t, r.stop(t))
		for _, rr := range res {
			require.Equal(t, 1, seen[rr.ID])
		}
		st, err := c.Stats(ctx, "q")
		require.NoError(t, err)
		require.Equal(t, uint64(7), st[0].Acked)
		require.Equal(t, int64(0), st[0].Inflight+st[0].Ready)
	})

	t.Run("NackOnErrorAndPanic", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ctx := ctxT(t)
		_, err := c.Enqueue(ctx, "q", []storage.EnqueueItem{{Payload: []byte("fail")}, {Payload: []byte("panic")}, {Payload: []byte("ok")}})
		require.NoError(t, err)
		hour := time.Hour // not redelivered during the test
		var wg sync.WaitGroup
		wg.Add(3)
		r := startConsume(c, ConsumerConfig{
			Queue: "q", Batch: 3, Lease: time.Minute, Clock: b.clock, NackDelay: &hour,
			Handler: func(_ context.Context, it storage.Item) error {
				defer wg.Done()
				switch string(it.Payload) {
				case "fail":
					return errors.New("boom")
				case "panic":
					panic("kaboom")
				}
				return nil
			},
		})
		wg.Wait()
		require.NoError(t, r.stop(t))
		st, err := c.Stats(ctx, "q")
		require.NoError(t, err)
		require.Equal(t, uint64(1), st[0].Acked)
		require.Equal(t, uint64(2), st[0].Nacked)
		peek, err := c.Peek(ctx, storage.PeekParams{Queue: "q"})
		require.NoError(t, err)
		reasons := []string{peek[0].LastError, peek[1].LastError}
		sort.Strings(reasons)
		require.Equal(t, []string{"boom", "panic: kaboom"}, reasons)
		for _, it := range peek {
			require.Equal(t, testStart.Add(time.Hour), it.VisibleAt)
		}
	})

	t.Run("ExtendsAtLeaseThird", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ctx := ctxT(t)
		_, err := c.Enqueue(ctx, "q", payloads(1, 8))
		require.NoError(t, err)
		started, release := make(chan struct{}), make(chan struct{})
		type ext struct {
			at  time.Time
			err error
		}
		exts := make(chan ext, 8)
		r := startConsume(c, ConsumerConfig{
			Queue: "q", Lease: 3 * time.Second, Clock: b.clock,
			OnExtend: func(_ storage.LeaseID, at time.Time, err error) { exts <- ext{at, err} },
			Handler: func(hctx context.Context, it storage.Item) error {
				close(started)
				<-release
				return hctx.Err()
			},
		})
		<-started // the extend ticker is armed before the handler runs
		for i := 1; i <= 3; i++ {
			b.clock.Add(time.Second)
			select {
			case e := <-exts:
				require.NoError(t, e.err)
				// Extended to now + lease, by the mock clock.
				require.Equal(t, testStart.Add(time.Duration(i)*time.Second+3*time.Second), e.at)
			case <-time.After(10 * time.Second):
				t.Fatalf("no extend after %d lease thirds", i)
			}
		}
		// Four seconds in: without the extends the 3 s lease would be gone.
		close(release)
		require.NoError(t, r.stop(t))
		st, err := c.Stats(ctx, "q")
		require.NoError(t, err)
		require.Equal(t, uint64(1), st[0].Acked)
		require.Equal(t, uint64(0), st[0].Expired)
	})

	t.Run("DrainOnCancel", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ctx := ctxT(t)
		_, err := c.Enqueue(ctx, "q", payloads(2, 8))
		require.NoError(t, err)
		started, release := make(chan struct{}, 2), make(chan struct{})
		r := startConsume(c, ConsumerConfig{
			Queue: "q", Workers: 2, Lease: time.Minute, Clock: b.clock,
			Handler: func(hctx context.Context, it storage.Item) error {
				started <- struct{}{}
				<-release
				return hctx.Err() // not cancelled by the drain
			},
		})
		<-started
		<-started
		r.cancel()
		select {
		case err := <-r.done:
			t.Fatalf("Consume returned before its handlers finished: %v", err)
		default:
		}
		close(release)
		require.NoError(t, r.stop(t))
		st, err := c.Stats(ctx, "q")
		require.NoError(t, err)
		require.Equal(t, uint64(2), st[0].Acked)
		require.Equal(t, 0, b.srv.Metrics().Waiters)
	})

	t.Run("ConnectionLossIsReported", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		r := startConsume(c, ConsumerConfig{Queue: "q", Clock: b.clock, Handler: func(context.Context, storage.Item) error { return nil }})
		eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		b.srv.Stop()
		select {
		case err := <-r.done:
			require.Error(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("Consume did not notice the lost connection")
		}
		r.cancel()
	})

	t.Run("BadConfig", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{transport: "pipe"})
		c := b.dial()
		require.ErrorIs(t, c.Consume(context.Background(), ConsumerConfig{Queue: "q"}), storage.ErrInvalidArgument)
		err := c.Consume(context.Background(), ConsumerConfig{Queue: "bad/name", Clock: b.clock, Handler: func(context.Context, storage.Item) error { return nil }})
		require.ErrorIs(t, err, storage.ErrInvalidArgument)
	})
}
