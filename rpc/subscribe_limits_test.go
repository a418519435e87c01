package rpc

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// subState waits until the subscription has ended (returns true,
// draining C) or cond holds (returns false), whichever comes first.
func subState(t *testing.T, sub *Subscription, cond func() bool) (ended bool) {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		if cond() {
			return false
		}
		select {
		case _, ok := <-sub.C():
			if !ok {
				return true
			}
		case <-time.After(5 * time.Millisecond):
		case <-deadline:
			t.Fatal("neither ended nor reached the condition")
		}
	}
}

// TestSubscribe_PerQueueLimitKillsLiveSubscription (found by review, session 69; failed before its fix): a subscription
// the node accepted is ended by the node (done: tooManyWaiters) because,
// while it was out of the queue's line (waiting for credit), a long poll
// of another client took the queue's only waiter slot
// (MaxWaitersPerQueue). The docs say subscriptions count only against
// MaxWaiters; a live subscription must not die of a transient long poll.
func TestSubscribe_PerQueueLimitKillsLiveSubscription(t *testing.T) {
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) { c.MaxWaitersPerQueue = 1 }})
	c, other := b.dial(), b.dial()
	ctx := ctxT(t)
	_, err := c.Enqueue(ctx, "q", payloads(1, 8))
	require.NoError(t, err)
	sub, err := c.Subscribe(ctx, SubscribeOptions{Queue: "q", Prefetch: 1, Lease: time.Hour})
	require.NoError(t, err)
	defer sub.Cancel()
	d := recvDelivery(t, sub) // the subscription now waits for credit, out of line

	pollDone := make(chan error, 1)
	go func() {
		_, err := other.Poll(ctx, "q", 1, time.Hour, 20*time.Second)
		pollDone <- err
	}()
	refused := false
	require.Eventually(t, func() bool {
		select {
		case err := <-pollDone:
			require.ErrorIs(t, err, ErrTooManyWaiters) // the subscription holds the slot: fine
			refused = true
			return true
		default:
		}
		return b.srv.Dispatcher().QueueWaiters("q") == 1
	}, 10*time.Second, time.Millisecond)
	if refused {
		return
	}

	// Credit returns: the subscription polls, finds nothing, and parks.
	_, err = c.Ack(ctx, "q", d.Lease, []storage.ItemID{d.Items[0].ID})
	require.NoError(t, err)
	ended := subState(t, sub, func() bool { return b.srv.Metrics().Waiters == 2 })
	require.False(t, ended, "the node ended a live subscription: %v", sub.Err())
}

// TestSubscribe_NodeLimitCountsSubscriptionTwice (found by review, session 69; failed before its fix): with MaxWaiters=2
// (parked long polls plus subscriptions on the node) two subscriptions
// fit; but a subscription counts once as a subscription and once more
// while its poll parks, so the node accepts the second subscribe and then
// ends it (done: tooManyWaiters) when its first poll parks.
func TestSubscribe_NodeLimitCountsSubscriptionTwice(t *testing.T) {
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) { c.MaxWaiters = 2 }})
	c := b.dial()
	ctx := ctxT(t)
	s1, err := c.Subscribe(ctx, SubscribeOptions{Queue: "a", Prefetch: 1})
	require.NoError(t, err)
	defer s1.Cancel()
	require.False(t, subState(t, s1, func() bool { return b.srv.Metrics().Waiters == 1 }),
		"the node ended the first subscription: %v", s1.Err())
	s2, err := c.Subscribe(ctx, SubscribeOptions{Queue: "b", Prefetch: 1})
	require.NoError(t, err)
	defer s2.Cancel()
	ended := subState(t, s2, func() bool { return b.srv.Metrics().Waiters == 2 })
	require.False(t, ended, "the node accepted a second subscription within MaxWaiters=2, then ended it: %v", s2.Err())
}

// TestSubscribe_AcceptedOverNodeLimitThenKilled (found by review, session 69; failed before its fix): subscribe checks
// only the queue's limit, not the node's (MaxWaiters): over the node
// limit it is accepted and then ended by the node when it first parks,
// instead of being refused with tooManyWaiters.
func TestSubscribe_AcceptedOverNodeLimitThenKilled(t *testing.T) {
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) { c.MaxWaiters = 1 }})
	c, other := b.dial(), b.dial()
	ctx := ctxT(t)
	pollDone := make(chan error, 1)
	go func() {
		_, err := other.Poll(ctx, "a", 1, time.Hour, 20*time.Second)
		pollDone <- err
	}()
	require.Eventually(t, func() bool { return b.srv.Metrics().Waiters == 1 }, 10*time.Second, time.Millisecond)
	sub, err := c.Subscribe(ctx, SubscribeOptions{Queue: "b", Prefetch: 1})
	if err != nil {
		require.ErrorIs(t, err, ErrTooManyWaiters)
		return
	}
	defer sub.Cancel()
	ended := subState(t, sub, func() bool { return false })
	require.True(t, ended)
	t.Logf("subscription ended by the node: %v", sub.Err())
	require.False(t, errors.Is(sub.Err(), ErrTooManyWaiters),
		"subscribe over the node's waiter limit was accepted, then ended by the node")
}

var _ = context.Background

// rvHolder is the live delivery of an item a consumer saw.
type rvHolder struct {
	lease   storage.LeaseID
	expires time.Time
	sub     int
}

// TestSubscribe_RandomConsumersNoDupNoLoss (from a review, session 69): three subscriptions (on
// three connections) with consumers that ack, nack or hold (let the lease
// run out) at random, one of them cancelling and resubscribing now and
// then. An item is never pushed while an earlier delivery of it is live
// (unsettled, unexpired), each item is acked at most once, and at the end
// every item is acked or dead, nothing ready or inflight.
func TestSubscribe_RandomConsumersNoDupNoLoss(t *testing.T) {
	b := setup(t, bundleOpts{factory: rocksFactory()})
	ctx := ctxT(t)
	const total = 80
	admin := b.dial()
	_, err := admin.Enqueue(ctx, "q", payloads(total, 16))
	require.NoError(t, err)

	var mu sync.Mutex
	holders := map[storage.ItemID]rvHolder{}
	ackedOnce := map[storage.ItemID]bool{}
	var violations []string
	progress := make(chan struct{}, 1)
	bump := func() {
		select {
		case progress <- struct{}{}:
		default:
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		c := b.dial()
		rng := rand.New(rand.NewSource(int64(i + 1)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			prefetch := 1 + i*2
			subscribe := func() *Subscription {
				s, err := c.Subscribe(ctx, SubscribeOptions{Queue: "q", Prefetch: prefetch, Lease: time.Minute})
				if err != nil {
					t.Errorf("subscribe: %v", err)
					return nil
				}
				return s
			}
			sub := subscribe()
			if sub == nil {
				return
			}
			handle := func(d Delivery) {
				now := b.clock.Now()
				mu.Lock()
				for _, it := range d.Items {
					// Both leases are a minute long: their lives overlap
					// when their expiries are less than a minute apart
					// (deliveries may be read out of order).
					h, ok := holders[it.ID]
					if ok && h.lease != d.Lease && d.ExpiresAt.Sub(h.expires).Abs() < time.Minute {
						violations = append(violations, fmt.Sprintf("item %v pushed to sub %d (lease %v until %v) while sub %d's lease %v is live until %v (now %v)", it.ID, i, d.Lease, d.ExpiresAt, h.sub, h.lease, h.expires, now))
					}
					if ackedOnce[it.ID] {
						violations = append(violations, fmt.Sprintf("item %v pushed after it was acked", it.ID))
					}
					if !ok || d.ExpiresAt.After(h.expires) {
						holders[it.ID] = rvHolder{lease: d.Lease, expires: d.ExpiresAt, sub: i}
					}
				}
				mu.Unlock()
				for _, it := range d.Items {
					ids := []storage.ItemID{it.ID}
					switch r := rng.Intn(4); {
					case r <= 1:
						codes, err := c.Ack(ctx, "q", d.Lease, ids)
						if err != nil {
							t.Errorf("ack: %v", err)
							continue
						}
						if codes[0] == storage.CodeOK {
							mu.Lock()
							if ackedOnce[it.ID] {
								violations = append(violations, fmt.Sprintf("item %v acked twice", it.ID))
							}
							ackedOnce[it.ID] = true
							delete(holders, it.ID)
							mu.Unlock()
						}
					case r == 2:
						// Settled before the nack: another consumer may
						// receive it before Nack returns here.
						mu.Lock()
						if h := holders[it.ID]; h.lease == d.Lease {
							delete(holders, it.ID)
						}
						mu.Unlock()
						zero := time.Duration(0)
						if _, err := c.Nack(ctx, "q", d.Lease, ids, &zero, "random"); err != nil {
							t.Errorf("nack: %v", err)
						}
					default: // hold: the lease runs out
					}
				}
				bump()
			}
			n := 0
			for {
				select {
				case <-stop:
					sub.Cancel()
					for d := range sub.C() {
						handle(d)
					}
					return
				case d, ok := <-sub.C():
					if !ok {
						t.Errorf("sub %d ended: %v", i, sub.Err())
						return
					}
					handle(d)
					n++
					if i == 0 && n%5 == 0 {
						// Cancel mid-stream; what C still holds is ours.
						sub.Cancel()
						for d := range sub.C() {
							handle(d)
						}
						if sub = subscribe(); sub == nil {
							return
						}
					}
				}
			}
		}()
	}

	done := func() bool {
		st, err := admin.Stats(ctx, "q")
		require.NoError(t, err)
		return st[0].Ready == 0 && st[0].Inflight == 0 && st[0].Delayed == 0
	}
	for rounds := 0; !done(); rounds++ {
		require.Less(t, rounds, 400, "no end in sight")
		select {
		case <-progress:
			continue
		case <-time.After(100 * time.Millisecond):
		}
		// Quiet: let the held leases run out.
		b.clock.Add(time.Minute)
		for {
			res, err := b.store.Sweep(ctx, storage.SweepParams{Now: b.clock.Now(), Limit: 1000})
			require.NoError(t, err)
			b.srv.Dispatcher().Notify(res.ReadyQueues...)
			if !res.More {
				break
			}
		}
	}
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, violations)
	st, err := admin.Stats(ctx, "q")
	require.NoError(t, err)
	t.Logf("acked=%d dead=%d delivered=%d nacked=%d expired=%d", len(ackedOnce), st[0].Dead, st[0].Delivered, st[0].Nacked, st[0].Expired)
	require.EqualValues(t, total, int64(len(ackedOnce))+st[0].Dead, "items lost")
	require.EqualValues(t, len(ackedOnce), st[0].Acked)
	for _, inflight := range []bool{false, true} {
		left, err := admin.Peek(ctx, storage.PeekParams{Queue: "q", Inflight: inflight, Limit: total})
		require.NoError(t, err)
		require.Empty(t, left, "items left (inflight=%v)", inflight)
	}
}

// TestSubscribe_StalledConsumerKeepsGettingPushes (found by review, session 69; failed before its fix): a consumer that
// stops reading (its C full, its Deliver blocked: no deliver answered)
// is pushed a new batch every lease period, as each expired lease returns
// credit: the node holds a goroutine and an unanswered call for each,
// bounded only by the byte window sized for prefetch items of MaxPayload
// (about 1 MiB for prefetch 1: thousands of small batches), and every
// push burns an attempt of an item nobody reads.
func TestSubscribe_StalledConsumerKeepsGettingPushes(t *testing.T) {
	b := setup(t, bundleOpts{})
	c := b.dial()
	ctx := ctxT(t)
	_, err := c.Enqueue(ctx, "q", payloads(20, 8))
	require.NoError(t, err)
	sub, err := c.Subscribe(ctx, SubscribeOptions{Queue: "q", Prefetch: 1, Lease: time.Second})
	require.NoError(t, err)
	defer sub.Cancel()
	// Nothing reads C (room 1).
	require.Eventually(t, func() bool { return b.srv.Metrics().ItemsPushed == 1 }, 10*time.Second, time.Millisecond)
	const periods = 8
	for i := 0; i < periods; i++ {
		want := b.srv.Metrics().ItemsPushed + 1
		b.clock.Add(time.Second)
		res, err := b.store.Sweep(ctx, storage.SweepParams{Now: b.clock.Now(), Limit: 1000})
		require.NoError(t, err)
		b.srv.Dispatcher().Notify(res.ReadyQueues...)
		got := false
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if got = b.srv.Metrics().ItemsPushed >= want; got {
				break
			}
		}
		if !got {
			break // pushes stopped: bounded
		}
	}
	pushed := b.srv.Metrics().ItemsPushed
	t.Logf("batches pushed to a consumer that read none: %d", pushed)
	require.LessOrEqual(t, pushed, uint64(3), "a stalled consumer (prefetch 1) keeps being pushed a batch every lease period")
}

// gatedRefuser hands the test each delivery's lease and items, then
// refuses the delivery once the test lets it.
type gatedRefuser struct {
	got   chan Delivery
	gate  chan struct{}
	dones atomic.Int32
}

func (g *gatedRefuser) Deliver(ctx context.Context, call schema.Consumer_deliver) error {
	args := call.Args()
	pr, err := readPoll(args.Lease, args.ExpiresAt(), args.Items, 0)
	if err != nil {
		return err
	}
	g.got <- Delivery{Lease: pr.Lease, ExpiresAt: pr.ExpiresAt, Items: pr.Items}
	<-g.gate
	return errors.New("consumer refuses")
}

func (g *gatedRefuser) Done(ctx context.Context, call schema.Consumer_done) error {
	g.dones.Add(1)
	return nil
}

// TestSubscribe_RefusedDeliveryEndsSubscription (found by review, session 69; failed before its fix): a consumer that
// refuses a delivery (deliver throws) has failed; the node ends the
// subscription only at its next push, so when nothing more comes (here
// the refused batch was settled meanwhile, so the give-back makes nothing
// ready) the dead subscription stays parked for ever: it holds a waiter
// slot, counts against the limits, and its consumer never gets done.
func TestSubscribe_RefusedDeliveryEndsSubscription(t *testing.T) {
	b := setup(t, bundleOpts{})
	c, other := b.dial(), b.dial()
	ctx := ctxT(t)
	g := &gatedRefuser{got: make(chan Delivery, 4), gate: make(chan struct{})}
	_, release := subscribeHourLeases(t, ctx, c, schema.Consumer_ServerToClient(g))
	defer release()
	_, err := c.Enqueue(ctx, "q", payloads(1, 8))
	require.NoError(t, err)
	var d Delivery
	select {
	case d = <-g.got:
	case <-time.After(10 * time.Second):
		t.Fatal("no delivery")
	}
	_, err = other.Ack(ctx, "q", d.Lease, []storage.ItemID{d.Items[0].ID})
	require.NoError(t, err)
	close(g.gate) // deliver throws
	ok := false
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if ok = b.srv.Metrics().Subscriptions == 0; ok {
			break
		}
	}
	t.Logf("subscriptions=%d waiters=%d dones=%d", b.srv.Metrics().Subscriptions, b.srv.Metrics().Waiters, g.dones.Load())
	require.True(t, ok, "a subscription whose consumer refused a delivery lives on (parked, counted) until the next item")
	require.Eventually(t, func() bool { return g.dones.Load() == 1 }, 5*time.Second, time.Millisecond)
}
