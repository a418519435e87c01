package rocksstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// cacheState returns how many records the ready-record cache holds and
// checks that its byte count is their sum, with no call in flight.
func (b *testBundle) cacheState() int {
	b.t.Helper()
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	n, bytes := 0, int64(0)
	for _, q := range s.mu.queues {
		for _, v := range q.recs {
			n++
			bytes += readyCost(v)
		}
	}
	require.Equal(b.t, bytes, s.rcache.bytes, "the budget counts what the cache holds")
	return n
}

// claimReads is Metrics.ClaimReads.
func (b *testBundle) claimReads() uint64 { return b.s.Metrics().ClaimReads }

// An item claimed after its enqueue is served from the cache (no read);
// after a reopen the cache is empty and the claim reads the record.
func TestReadyCache_ClaimsReadNothingUntilReopen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueueN("q", at(0), 5)
	require.Equal(t, 5, b.cacheState())
	res := b.poll("q", 5, time.Minute, at(time.Second))
	require.Len(t, res.Items, 5)
	require.Zero(t, b.claimReads(), "every record came from the cache")
	require.Zero(t, b.cacheState(), "claimed records leave the cache")

	ids := b.enqueueN("q", at(2*time.Second), 3)
	b.reopen()
	require.Zero(t, b.cacheState(), "open starts with an empty cache")
	res = b.poll("q", 3, time.Minute, at(3*time.Second))
	require.Len(t, res.Items, 3)
	require.Equal(t, ids, []storage.ItemID{res.Items[0].ID, res.Items[1].ID, res.Items[2].ID})
	require.Equal(t, uint64(3), b.claimReads())
}

// A nacked item goes back to the cache with its new record (attempts,
// last error), and its next claim hands out that record.
func TestReadyCache_NackedRecordIsCached(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueueN("q", at(0), 1)
	res := b.poll("q", 1, time.Minute, at(time.Second))
	zero := time.Duration(0)
	_, err := b.s.Nack(b.ctx, storage.NackParams{Queue: "q", Lease: res.Lease, IDs: []storage.ItemID{res.Items[0].ID}, Delay: &zero, Reason: "boom", Now: at(2 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, 1, b.cacheState())
	again := b.poll("q", 1, time.Minute, at(3*time.Second))
	require.Len(t, again.Items, 1)
	require.Equal(t, uint32(2), again.Items[0].Attempts)
	require.Equal(t, "boom", again.Items[0].LastError)
	require.Zero(t, b.claimReads())
}

// The budget bounds the cache: records beyond it are not copied and are
// read back when claimed, with the same payloads.
func TestReadyCache_Budget(t *testing.T) {
	t.Parallel()
	payload := func(i int) []byte { return fmt.Appendf(nil, "item-%03d", i) }
	rec := dbkeys.AppendItem(nil, dbkeys.ItemRecord{Payload: payload(0)})
	b := setup(t, func(o *Options) { o.ReadyCacheBytes = 3 * readyCost(rec) })
	items := make([]storage.EnqueueItem, 10)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: payload(i)}
	}
	b.enqueue("q", at(0), items...)
	require.Equal(t, 3, b.cacheState())
	res := b.poll("q", 10, time.Minute, at(time.Second))
	require.Len(t, res.Items, 10)
	for i, it := range res.Items {
		require.Equal(t, string(payload(i)), string(it.Payload))
	}
	require.Equal(t, uint64(7), b.claimReads())
	require.Zero(t, b.cacheState())

	off := setup(t, func(o *Options) { o.ReadyCacheBytes = -1 })
	off.enqueueN("q", at(0), 4)
	require.Zero(t, off.cacheState(), "a negative budget turns the cache off")
	require.Len(t, off.poll("q", 4, time.Minute, at(time.Second)).Items, 4)
	require.Equal(t, uint64(4), off.claimReads())
}

// A queue caches at most readyCacheQueueItems records: the rest of a
// backlog is read when its turn comes.
func TestReadyCache_QueueBound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := readyCacheQueueItems + 100
	for done := 0; done < n; done += 1000 {
		b.enqueueN("q", at(0), min(1000, n-done))
	}
	require.Equal(t, readyCacheQueueItems, b.cacheState())
	got := 0
	for got < n {
		got += len(b.poll("q", 1000, time.Minute, at(time.Second)).Items)
	}
	require.Equal(t, uint64(100), b.claimReads())
}

// A queue's cache map that held many records is dropped once it is empty
// (a Go map keeps the room of its largest size); a small one is kept.
func TestReadyCache_EmptyMapDropped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueueN("small", at(0), readyMapKeep)
	b.enqueueN("big", at(0), readyMapKeep+1)
	require.Len(t, b.poll("small", readyMapKeep, time.Minute, at(time.Second)).Items, readyMapKeep)
	require.Len(t, b.poll("big", readyMapKeep+1, time.Minute, at(time.Second)).Items, readyMapKeep+1)
	require.Zero(t, b.cacheState())
	require.NotNil(t, b.s.queue("small").recs, "kept")
	require.Nil(t, b.s.queue("big").recs, "dropped")
	b.enqueueN("big", at(2*time.Second), 2)
	require.Equal(t, 2, b.cacheState(), "and made again")
}
