package rocksstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// shortestPages runs rounds of 64 "victim" items followed by 64 "stay"
// items, all with external payloads; in each round page(64) runs 20 times
// while del deletes the victims. Whatever the interleaving, at least 64
// items are listed at every instant (the stays are never touched), so a
// page of limit 64 from the start must hold 64 items. It returns the
// shortest page seen.
func shortestPages(t *testing.T, b *testBundle, maxAttempts uint32, prepare func(now time.Time, r storage.PollResult),
	page func() (int, error), del func(now time.Time, victims storage.PollResult), cleanup func(now time.Time, stays storage.PollResult)) int {
	big := make([]byte, 5000)
	const n = 64
	items := make([]storage.EnqueueItem, n)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: big, MaxAttempts: maxAttempts}
	}
	shortest := n
	for round := 0; round < 150 && shortest == n; round++ {
		now := at(time.Duration(round) * time.Second)
		b.enqueue("q", now, items...)
		victims := b.poll("q", n, time.Minute, now)
		require.Len(t, victims.Items, n)
		b.enqueue("q", now, items...)
		stays := b.poll("q", n, time.Minute, now)
		require.Len(t, stays.Items, n)
		prepare(now, victims)
		prepare(now, stays)
		done := make(chan struct{})
		var pageErr error
		go func() {
			defer close(done)
			for i := 0; i < 20 && pageErr == nil; i++ {
				var got int
				got, pageErr = page()
				shortest = min(shortest, got)
			}
		}()
		time.Sleep(time.Duration(round%5) * 50 * time.Microsecond)
		del(now, victims)
		<-done
		require.NoError(t, pageErr)
		cleanup(now, stays)
	}
	return shortest
}

// Peek of inflight items with limit 64 while the first 64 of 128 are acked:
// an item acked between the page's snapshot and its payload read is left
// out, and was still counted against the limit, so the page came back
// short (even empty with a small limit) although the queue held 64 more
// items after it, and a client paging until a short page (the web UI's
// "next" link) stopped early (found by review).
func TestRocksStore_PeekPageFullWhileAcked(t *testing.T) {
	b := setup(t)
	shortest := shortestPages(t, b, 0, func(time.Time, storage.PollResult) {}, func() (int, error) {
		items, err := b.s.Peek(b.ctx, storage.PeekParams{Queue: "q", Inflight: true, Limit: 64, Now: at(0)})
		return len(items), err
	}, func(now time.Time, r storage.PollResult) {
		b.ack("q", r.Lease, now, itemIDs(r.Items)...)
	}, func(now time.Time, r storage.PollResult) {
		b.ack("q", r.Lease, now, itemIDs(r.Items)...)
	})
	require.Equal(t, 64, shortest, "a Peek page of limit 64 came back short while 64 more inflight items followed")
}

// DeadList with limit 64 while the first 64 of 128 dead items are purged:
// the same short page (found by review).
func TestRocksStore_DeadListPageFullWhilePurged(t *testing.T) {
	b := setup(t)
	var victims []storage.ItemID
	shortest := shortestPages(t, b, 1, func(now time.Time, r storage.PollResult) {
		b.nack("q", r.Lease, nil, now, itemIDs(r.Items)...) // out of attempts: dead
	}, func() (int, error) {
		items, err := b.s.DeadList(b.ctx, storage.DeadListParams{Queue: "q", Limit: 64})
		return len(items), err
	}, func(now time.Time, r storage.PollResult) {
		victims = itemIDs(r.Items)
		res, err := b.s.PurgeDead(b.ctx, storage.RedriveParams{Queue: "q", IDs: victims, Now: now})
		require.NoError(t, err)
		require.Equal(t, 64, res.Moved)
	}, func(now time.Time, r storage.PollResult) {
		res, err := b.s.PurgeDead(b.ctx, storage.RedriveParams{Queue: "q", IDs: itemIDs(r.Items), Now: now})
		require.NoError(t, err)
		require.Equal(t, 64, res.Moved)
	})
	require.Equal(t, 64, shortest, "a DeadList page of limit 64 came back short while 64 more dead items followed")
}

// Redrive with a limit and no ids, while PurgeDead deletes the first 64 of
// 128 dead items: at every instant at least 64 items are dead, so a
// redrive of up to 64 must move 64. It picks its ids by a scan before its
// op and moves only those still dead when the op runs: it could move none
// (found by review; applyDead now scans on after them).
func TestRocksStore_RedriveLimitWhilePurged(t *testing.T) {
	b := setup(t)
	const n = 64
	items := make([]storage.EnqueueItem, n)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: []byte("x"), MaxAttempts: 1}
	}
	least := n
	for round := 0; round < 300 && least == n; round++ {
		now := at(time.Duration(round) * time.Second)
		var groups [2][]storage.ItemID
		for g := range groups {
			b.enqueue("q", now, items...)
			r := b.poll("q", n, time.Minute, now)
			require.Len(t, r.Items, n)
			b.nack("q", r.Lease, nil, now, itemIDs(r.Items)...)
			groups[g] = itemIDs(r.Items)
		}
		done := make(chan error, 1)
		go func() {
			_, err := b.s.PurgeDead(b.ctx, storage.RedriveParams{Queue: "q", IDs: groups[0], Now: now})
			done <- err
		}()
		time.Sleep(time.Duration(round%7) * 20 * time.Microsecond)
		res, err := b.s.Redrive(b.ctx, storage.RedriveParams{Queue: "q", Limit: n, Now: now})
		require.NoError(t, err)
		require.NoError(t, <-done)
		least = min(least, res.Moved)
		_, err = b.s.Purge(b.ctx, storage.PurgeParams{Queue: "q", Now: now})
		require.NoError(t, err)
		for {
			res, err := b.s.PurgeDead(b.ctx, storage.RedriveParams{Queue: "q", Limit: 1000, Now: now})
			require.NoError(t, err)
			if res.Moved == 0 {
				break
			}
		}
	}
	require.Equal(t, n, least, "a redrive of up to 64 moved fewer while at least 64 items were dead")
}
