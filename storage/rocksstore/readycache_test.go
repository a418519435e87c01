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
		q.recs.each(func(_ storage.ItemID, v []byte) {
			n++
			bytes += readyCost(v)
		})
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

// A queue's cache that held many records gives its room back once it is
// empty (a Go map, and a slice, keep the room of their largest size); a
// small one is kept. New items' records go to the run, nacked ones to the
// map.
func TestReadyCache_EmptyRoomDropped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	small, big := readyMapKeep/4, readyMapKeep+1
	b.enqueueN("small", at(0), small)
	b.enqueueN("big", at(0), big)
	require.Len(t, b.s.queue("big").recs.m, 0, "new items' records are in the run")
	resSmall := b.poll("small", small, time.Minute, at(time.Second))
	resBig := b.poll("big", big, time.Minute, at(time.Second))
	require.Len(t, resSmall.Items, small)
	require.Len(t, resBig.Items, big)
	require.Zero(t, b.cacheState())
	require.NotNil(t, b.s.queue("small").recs.run, "run kept")
	require.Nil(t, b.s.queue("big").recs.run, "run dropped")

	zero := time.Duration(0)
	nackAll := func(q string, res storage.PollResult, now time.Time) {
		ids := make([]storage.ItemID, len(res.Items))
		for i, it := range res.Items {
			ids[i] = it.ID
		}
		b.nack(q, res.Lease, &zero, now, ids...)
	}
	nackAll("small", resSmall, at(2*time.Second))
	nackAll("big", resBig, at(2*time.Second))
	require.Len(t, b.s.queue("big").recs.m, big, "nacked items' records are in the map")
	require.Len(t, b.poll("small", small, time.Minute, at(3*time.Second)).Items, small)
	require.Len(t, b.poll("big", big, time.Minute, at(3*time.Second)).Items, big)
	require.Zero(t, b.cacheState())
	require.Zero(t, b.claimReads(), "every claim was served from the cache")
	require.NotNil(t, b.s.queue("small").recs.m, "map kept")
	require.Nil(t, b.s.queue("big").recs.m, "map dropped")
	b.enqueueN("big", at(4*time.Second), 2)
	require.Equal(t, 2, b.cacheState(), "and made again")
}

// The run serves claims out of id order too (a higher priority first,
// then the rest), and keeps within twice what it holds as its head is
// taken.
func TestReadyCache_RunOutOfOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var lowIDs []storage.ItemID
	for i := range 3 * readyMapKeep {
		prio := uint8(9)
		if i%3 == 0 {
			prio = 0 // served first
		}
		res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte{byte(i)}, Priority: prio}}, Now: at(0)})
		require.NoError(t, err)
		if prio == 9 {
			lowIDs = append(lowIDs, res[0].ID)
		}
	}
	q := b.s.queue("q")
	require.Equal(t, 3*readyMapKeep, q.recs.runLive)
	require.Nil(t, q.recs.m)
	// The first-served third is claimed first, from all over the run.
	high := b.poll("q", readyMapKeep, time.Minute, at(time.Second))
	require.Len(t, high.Items, readyMapKeep)
	for _, it := range high.Items {
		require.Equal(t, uint8(0), it.Priority)
		require.Equal(t, []byte{byte(it.Payload[0])}, it.Payload)
	}
	require.Equal(t, 2*readyMapKeep, b.cacheState())
	// New items (served first) keep coming and going behind the older
	// ones, which stay at the run's head: the run does not grow with what
	// was taken.
	for range 4 * readyMapKeep {
		id := b.enqueueN("q", at(2*time.Second), 1)[0]
		res := b.poll("q", 1, time.Minute, at(3*time.Second))
		require.Len(t, res.Items, 1)
		require.Equal(t, id, res.Items[0].ID)
		require.LessOrEqual(t, len(q.recs.run), 2*(q.recs.runLive+readyMapKeep)+1)
	}
	require.Equal(t, 2*readyMapKeep, b.cacheState())
	var got []storage.ItemID
	for len(got) < len(lowIDs) {
		res := b.poll("q", 500, time.Minute, at(4*time.Second))
		require.NotEmpty(t, res.Items)
		for _, it := range res.Items {
			got = append(got, it.ID)
		}
	}
	require.Equal(t, lowIDs, got, "serve order")
	require.Zero(t, b.claimReads(), "every claim was served from the cache")
	require.Zero(t, b.cacheState())
}

// each calls fn for every cached record.
func (r *readyRecs) each(fn func(id storage.ItemID, v []byte)) {
	for _, e := range r.run[r.head:] {
		if e.rec != nil {
			fn(e.id, e.rec)
		}
	}
	for id, v := range r.m {
		fn(id, v)
	}
}

// Enqueuers encode their items' records themselves while their queue's
// cache has room (queueState.cacheFull), and the cache keeps those
// records as they are; once it is full they leave the encoding to the
// committer, until claims make room again. Either way a claim hands out
// the payloads enqueued.
func TestReadyCache_EnqueuersEncodeWhileThereIsRoom(t *testing.T) {
	t.Parallel()
	b := setup(t)
	full := func() bool { return b.s.queue("q").cacheFull() }
	for n := readyCacheQueueItems - 1; n > 0; n -= 1000 {
		b.enqueueN("q", at(0), min(n, 1000))
	}
	require.False(t, full())
	b.enqueueN("q", at(0), 2)
	require.True(t, full(), "the queue's cache holds readyCacheQueueItems records")
	require.Equal(t, readyCacheQueueItems, b.cacheState())
	got := b.poll("q", 10, time.Minute, at(time.Second))
	require.Len(t, got.Items, 10)
	require.False(t, full(), "claims made room")
	b.enqueue("q", at(2*time.Second), storage.EnqueueItem{Payload: []byte("late")})
	require.Equal(t, readyCacheQueueItems-9, b.cacheState())

	n := 0
	for {
		pr := b.poll("q", 1000, time.Minute, at(3*time.Second))
		if len(pr.Items) == 0 {
			break
		}
		for _, it := range pr.Items {
			n++
			if n == readyCacheQueueItems-10+2 {
				require.Equal(t, "late", string(it.Payload))
			}
		}
	}
	require.Equal(t, readyCacheQueueItems-10+2, n)
	require.Equal(t, uint64(1), b.claimReads(), "the one record the full cache did not take")

	tiny := setup(t, func(o *Options) { o.ReadyCacheBytes = readyCost(make([]byte, defaultInlineMax)) })
	tiny.enqueueN("q", at(0), 1)
	require.True(t, tiny.s.queue("q").cacheFull(), "the store's budget has no room for another large record")
}
