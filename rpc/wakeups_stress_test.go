package rpc

import (
	"context"
	"errors"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// reviewRocks returns a RocksDB factory with the given sync mode.
func reviewRocks(mode rocksstore.SyncMode) storeFactory {
	return rocksWith(rocksstore.Options{Sync: mode}, nil)
}

// TestWakeups_StressNoReadyItemLeftBehindParkedPolls: consumers
// long-poll (the mock clock never reaches their wait, nor any lease's
// end, nor a claim ahead's hold) with assorted max, ack, nack with delay
// 0, ack with the next poll, and give up polls (the client gives their
// items back); producers enqueue. Every item must be acked: an item left
// ready while polls are parked is a lost wake-up.
func TestWakeups_StressNoReadyItemLeftBehindParkedPolls(t *testing.T) {
	for _, mode := range []struct {
		name string
		m    rocksstore.SyncMode
		subs bool
	}{{"always", rocksstore.SyncAlways, false}, {"none", rocksstore.SyncNone, false},
		{"always-subs", rocksstore.SyncAlways, true}, {"none-subs", rocksstore.SyncNone, true}} {
		t.Run(mode.name, func(t *testing.T) {
			for round := 0; round < 2; round++ {
				reviewStressRound(t, mode.m, int64(round), mode.subs)
			}
		})
	}
}

func reviewStressRound(t *testing.T, mode rocksstore.SyncMode, seed int64, subs bool) {
	b := setup(t, bundleOpts{factory: reviewRocks(mode)})
	const (
		consumers = 6
		producers = 3
		perProd   = 60
	)
	total := producers * perProd
	var mu sync.Mutex
	acked := map[storage.ItemID]bool{}
	nacked := map[storage.ItemID]int{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for i := 0; i < consumers; i++ {
		c := b.dial()
		rnd := rand.New(rand.NewSource(seed*100 + int64(i)))
		max := 1 + i%3
		wg.Add(1)
		go func() {
			defer wg.Done()
			var held storage.PollResult
			for ctx.Err() == nil {
				var pr storage.PollResult
				var err error
				switch {
				case len(held.Items) > 0:
					ids := itemIDs(held.Items)
					mu.Lock()
					for _, id := range ids {
						acked[id] = true
					}
					mu.Unlock()
					_, pr, err = c.AckPoll(ctx, "q", held.Lease, ids, max, time.Minute, time.Minute)
					held = storage.PollResult{}
				case rnd.Intn(8) == 0:
					// A poll given up at once: parked, or answered and
					// given back by the client.
					pctx, pcancel := context.WithTimeout(ctx, time.Duration(rnd.Intn(3000))*time.Microsecond)
					pr, err = c.Poll(pctx, "q", max, time.Minute, time.Minute)
					pcancel()
					if err != nil && ctx.Err() == nil {
						continue
					}
				default:
					pr, err = c.Poll(ctx, "q", max, time.Minute, time.Minute)
				}
				if err != nil {
					if ctx.Err() != nil || errors.Is(err, context.Canceled) {
						return
					}
					t.Errorf("poll: %v", err)
					return
				}
				if len(pr.Items) == 0 {
					continue
				}
				// Nack some items (delay 0) once, keep the rest to ack
				// with the next poll or alone.
				var keep, back []storage.ItemID
				mu.Lock()
				for _, it := range pr.Items {
					if nacked[it.ID] == 0 && rnd.Intn(4) == 0 {
						nacked[it.ID]++
						back = append(back, it.ID)
					} else {
						keep = append(keep, it.ID)
					}
				}
				mu.Unlock()
				if len(back) > 0 {
					zero := time.Duration(0)
					if _, err := c.Nack(ctx, "q", pr.Lease, back, &zero, "again"); err != nil && ctx.Err() == nil {
						t.Errorf("nack: %v", err)
						return
					}
				}
				if len(keep) == 0 {
					continue
				}
				if len(back) == 0 && rnd.Intn(2) == 0 {
					held = pr
					continue
				}
				mu.Lock()
				for _, id := range keep {
					acked[id] = true
				}
				mu.Unlock()
				if _, err := c.Ack(ctx, "q", pr.Lease, keep); err != nil && ctx.Err() == nil {
					t.Errorf("ack: %v", err)
					return
				}
			}
		}()
	}
	if subs {
		// Subscriptions that ack what they get; some are cancelled on a
		// delivery (the node gives back what it claimed for them and did
		// not deliver) and a new one takes their place.
		for i := 0; i < 3; i++ {
			c := b.dial()
			rnd := rand.New(rand.NewSource(seed*10000 + int64(i)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					sub, err := c.Subscribe(ctx, SubscribeOptions{Queue: "q", Prefetch: 1 + rnd.Intn(3), Lease: time.Minute})
					if err != nil {
						if ctx.Err() == nil {
							t.Errorf("subscribe: %v", err)
						}
						return
					}
				deliveries:
					for {
						select {
						case <-ctx.Done():
							sub.Cancel()
							return
						case dl, ok := <-sub.C():
							if !ok {
								break deliveries
							}
							if rnd.Intn(6) == 0 {
								// Cancel holding this batch: nack it as the
								// consumer would, then start again.
								zero := time.Duration(0)
								sub.Cancel()
								if _, err := c.Nack(ctx, "q", dl.Lease, itemIDs(dl.Items), &zero, "stop"); err != nil && ctx.Err() == nil {
									t.Errorf("nack: %v", err)
									return
								}
								for dl := range sub.C() {
									// Delivered before the cancel took: give it back.
									if _, err := c.Nack(ctx, "q", dl.Lease, itemIDs(dl.Items), &zero, "stop"); err != nil && ctx.Err() == nil {
										t.Errorf("nack: %v", err)
										return
									}
								}
								break deliveries
							}
							ids := itemIDs(dl.Items)
							mu.Lock()
							for _, id := range ids {
								acked[id] = true
							}
							mu.Unlock()
							if _, err := c.Ack(ctx, "q", dl.Lease, ids); err != nil && ctx.Err() == nil {
								t.Errorf("ack: %v", err)
								return
							}
						}
					}
				}
			}()
		}
	}
	var pwg sync.WaitGroup
	for p := 0; p < producers; p++ {
		c := b.dial()
		rnd := rand.New(rand.NewSource(seed*1000 + int64(p)))
		pwg.Add(1)
		go func() {
			defer pwg.Done()
			for n := 0; n < perProd; {
				k := min(1+rnd.Intn(4), perProd-n)
				items := payloads(k, 8)
				for i := range items {
					// Subscriptions cancelled holding a batch nack it each
					// time (the poll path nacks an item once): with the
					// default 5 attempts an item was now and then
					// dead-lettered, and counted missing (stats Dead 1),
					// read as a lost wake-up (sessions 72-73).
					items[i].MaxAttempts = 1000
				}
				_, err := c.Enqueue(ctx, "q", items)
				if err != nil {
					t.Errorf("enqueue: %v", err)
					return
				}
				n += k
			}
		}()
	}
	pwg.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n == total {
			break
		}
		if time.Now().After(deadline) {
			st, err := b.store.Stats(context.Background(), storage.StatsParams{Queue: "q", Now: b.clock.Now()})
			require.NoError(t, err)
			cancel()
			wg.Wait()
			t.Fatalf("seed %d: %d of %d items acked after 10s; waiters %d; stats %+v", seed, n, total, b.srv.Metrics().Waiters, st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	_ = rpctest.Eventually
}
