package rpc

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// Consume against a node that stalls on one kind of call (an extend, an
// ack): the rest of the work must go on.

// extendHangingStore holds every extend until hang is closed, and says
// when the first one reached it.
type extendHangingStore struct {
	storage.Store
	entered chan struct{}
	once    *sync.Once
	hang    chan struct{}
}

func (s extendHangingStore) ExtendLease(ctx context.Context, p storage.ExtendParams) (time.Time, error) {
	s.once.Do(func() { close(s.entered) })
	<-s.hang
	return s.Store.ExtendLease(ctx, p)
}

// ackStallStore holds every ack until hang is closed, and says when the
// first one reached it.
type ackStallStore struct {
	storage.Store
	entered chan struct{}
	once    *sync.Once
	hang    chan struct{}
}

func (s ackStallStore) Ack(ctx context.Context, p storage.AckParams) ([]storage.Code, error) {
	s.once.Do(func() { close(s.entered) })
	<-s.hang
	return s.Store.Ack(ctx, p)
}

// ackFlakyStore refuses the first ack as unavailable (its outcome unknown
// to the client) and holds every later one until hang is closed.
type ackFlakyStore struct {
	storage.Store
	mu    *sync.Mutex
	calls *int
	hang  chan struct{}
}

func (s ackFlakyStore) Ack(ctx context.Context, p storage.AckParams) ([]storage.Code, error) {
	s.mu.Lock()
	*s.calls++
	n := *s.calls
	s.mu.Unlock()
	if n == 1 {
		return nil, storage.ErrUnavailable
	}
	<-s.hang
	return s.Store.Ack(ctx, p)
}

// queueAcked is queue q's lifetime acked counter.
func queueAcked(t *testing.T, c *Client) uint64 {
	t.Helper()
	st, err := c.Stats(ctxT(t), "q")
	require.NoError(t, err)
	if len(st) == 0 {
		return 0
	}
	return st[0].Acked
}

// consumeStalled starts Consume with cfg, and has the test's cleanup
// (run before the cleanups registered earlier, such as the one that ends
// a store's stall) cancel it and move clk on, a second at a time, until
// it returns: every settle it still waits for is given up once its lease
// has surely ended.
func consumeStalled(t *testing.T, c *Client, cfg ConsumerConfig, clk *clock.Mock) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Consume(ctx, cfg) }()
	t.Cleanup(func() {
		cancel()
		var err error
		rpctest.Eventually(t, 10*time.Second, func() bool {
			select {
			case err = <-done:
				return true
			default:
				clk.Add(time.Second)
				return false
			}
		}, "Consume did not return after cancel")
		require.NoError(t, err)
	})
}

// TestConsume_FinishedBatchAckNotHeldByExtendInFlight: found by review
// (session 73): a handler that finished successfully must have its item
// acked promptly. When an automatic extend was in flight as the batch's
// last handler returned, and the node was slow to answer it, handleBatch
// waited for that extend before it handed the successes back for their
// ack: the ack of finished work was held until the extend answered or a
// whole Lease passed, after which the lease counted as lost and the ack
// was given up (the item delivered, and handled, again). The extend is
// needless once no handler runs: it is now given up.
func TestConsume_FinishedBatchAckNotHeldByExtendInFlight(t *testing.T) {
	t.Parallel()
	st := extendHangingStore{entered: make(chan struct{}), once: new(sync.Once), hang: make(chan struct{})}
	b := setup(t, bundleOpts{factory: storeFactory{"extend-hanging", func(t *testing.T) storage.Store {
		st.Store = memFactory().open(t)
		return st
	}}})
	t.Cleanup(func() { close(st.hang) }) // before the server stops
	c := b.dial()
	obs := b.dial()
	_, err := c.Enqueue(ctxT(t), "q", payloads(1, 8))
	require.NoError(t, err)

	cClock := clock.NewMock()
	started := make(chan struct{})
	var extendErrs []error
	var mu sync.Mutex
	cfg := ConsumerConfig{
		Queue: "q", Lease: 3 * time.Second, Wait: time.Second, Clock: cClock, Logger: rpctest.Logger(t),
		OnExtend: func(_ storage.LeaseID, _ time.Time, err error) {
			mu.Lock()
			extendErrs = append(extendErrs, err)
			mu.Unlock()
		},
		Handler: func(context.Context, storage.Item) error {
			close(started)
			<-st.entered // an automatic extend is in flight
			return nil
		},
	}
	consumeStalled(t, c, cfg, cClock)
	<-started
	cClock.Add(time.Second) // Lease/3: the extend goes out, and hangs at the node
	<-st.entered

	// The handler has returned nil; the lease is live on the node (whose
	// clock does not move) and on the consumer's (which stands still
	// too): the ack goes out now, the extend given up.
	rpctest.Eventually(t, 10*time.Second, func() bool { return queueAcked(t, obs) == 1 },
		"a successfully handled item was not acked while an extend, needless once the handler returned, waited for its answer")
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, extendErrs, "the extend given up as the batch ended was reported")
}

// TestConsume_AckRidingPollDoesNotStrandNextBatch: found by review
// (session 73): the ack of a batch rode the poll for the next (ackPoll)
// under the workers' ctx alone, with no bound. When the node never
// answered that ack, the worker waited for it for good, and the batch the
// poll had leased to it was neither handled nor extended until Consume was
// cancelled. The ack riding the poll is now bounded by its lease's end,
// as an ack on its own is.
func TestConsume_AckRidingPollDoesNotStrandNextBatch(t *testing.T) {
	t.Parallel()
	st := ackStallStore{entered: make(chan struct{}), once: new(sync.Once), hang: make(chan struct{})}
	b := setup(t, bundleOpts{factory: storeFactory{"ack-stalling", func(t *testing.T) storage.Store {
		st.Store = memFactory().open(t)
		return st
	}}})
	t.Cleanup(func() { close(st.hang) }) // before the server stops
	c := b.dial()
	_, err := c.Enqueue(ctxT(t), "q", payloads(2, 8))
	require.NoError(t, err)

	cClock := clock.NewMock()
	handled := make(chan storage.ItemID, 4)
	cfg := ConsumerConfig{
		Queue: "q", Batch: 1, Lease: 3 * time.Second, Wait: time.Second, Clock: cClock, Logger: rpctest.Logger(t),
		Handler: func(_ context.Context, it storage.Item) error { handled <- it.ID; return nil },
	}
	consumeStalled(t, c, cfg, cClock)
	first := <-handled // its ack rides the poll that leases the second

	<-st.entered // the ack is at the node, which holds it ...
	// ... and a whole lease passes on the consumer's clock: the first
	// item's ack could only be refused now, and the second item, leased
	// by the poll the ack rode with (or, if that poll was cut, given
	// back and polled again), is handled.
	cClock.Add(3 * time.Second)
	select {
	case second := <-handled:
		require.NotEqual(t, first, second)
	case <-time.After(10 * time.Second):
		t.Fatal("the worker waits without bound for an unanswered ack riding the poll; the item that poll leased stays leased and unhandled")
	}
}

// TestConsume_RetriedAckDoesNotHoldTheNewBatch: found by review (session
// 73): when the ack that rode a poll failed (outcome unknown), the worker
// made it again on its own (ackNow, bounded only by the old lease's end,
// up to a whole Lease away) before it handed the batch that same poll
// leased to the handlers. The new batch's lease ran from the poll's
// answer, unextended, while that ack waited: a node slow to answer it
// kept the new items unhandled, and a wait of a whole Lease lost them.
// The ack is now made again while the new batch is handled.
func TestConsume_RetriedAckDoesNotHoldTheNewBatch(t *testing.T) {
	t.Parallel()
	st := ackFlakyStore{mu: new(sync.Mutex), calls: new(int), hang: make(chan struct{})}
	b := setup(t, bundleOpts{factory: storeFactory{"ack-flaky", func(t *testing.T) storage.Store {
		st.Store = memFactory().open(t)
		return st
	}}})
	t.Cleanup(func() { close(st.hang) }) // before the server stops
	c := b.dial()
	_, err := c.Enqueue(ctxT(t), "q", payloads(2, 8))
	require.NoError(t, err)

	cClock := clock.NewMock()
	handled := make(chan storage.ItemID, 4)
	cfg := ConsumerConfig{
		Queue: "q", Batch: 1, Lease: 3 * time.Second, Wait: time.Second, Clock: cClock, Logger: rpctest.Logger(t),
		Handler: func(_ context.Context, it storage.Item) error { handled <- it.ID; return nil },
	}
	consumeStalled(t, c, cfg, cClock)
	first := <-handled // its ack rides the poll that leases the second, and is refused

	// The consumer's clock stands still: the second item's lease is live,
	// and nothing stops its handler from running now.
	select {
	case second := <-handled:
		require.NotEqual(t, first, second)
	case <-time.After(10 * time.Second):
		t.Fatal("the item leased by the poll waits, unextended, for the retry of the previous batch's ack")
	}
}

// TestConsume_LongErrorTextStillNacks: a handler whose error text is
// larger than the node's --max-message still has its item nacked, with
// the text's start as the reason. Found by review (session 73): the whole
// text went in the nack, a message over the node's limit, and the node
// ended the connection: the nack was lost and the item stayed leased.
func TestConsume_LongErrorTextStillNacks(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) { c.MaxMessageBytes = 64 << 10 }})
	c := b.dial()
	ctx := ctxT(t)
	_, err := c.Enqueue(ctx, "q", payloads(1, 8))
	require.NoError(t, err)
	hour := time.Hour // not redelivered during the test
	long := strings.Repeat("é", 100<<10)
	handled := make(chan struct{})
	var failed atomic.Int32
	r := startConsume(c, ConsumerConfig{
		Queue: "q", Lease: time.Minute, Clock: b.clock, NackDelay: &hour, Logger: rpctest.Logger(t),
		OnSettleFailed: func(storage.ItemID, bool, error) { failed.Add(1) },
		Handler: func(context.Context, storage.Item) error {
			defer close(handled)
			return errors.New(long)
		},
	})
	<-handled
	require.NoError(t, r.stop(t))
	require.Zero(t, failed.Load(), "the nack failed")
	st, err := c.Stats(ctx, "q")
	require.NoError(t, err)
	require.Equal(t, uint64(1), st[0].Nacked)
	peek, err := c.Peek(ctx, storage.PeekParams{Queue: "q"})
	require.NoError(t, err)
	require.Len(t, peek, 1)
	require.True(t, strings.HasPrefix(long, peek[0].LastError) && len(peek[0].LastError) > 1000, "reason %d bytes", len(peek[0].LastError))
}
