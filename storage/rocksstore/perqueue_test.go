package rocksstore

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// reviewSizes is the per-queue / per-lease in-memory state of the store,
// read on the committer (between ops).
type reviewSizes struct {
	queues, leases, inflight, expiry, delayed, corruptQ, dedupPending int
}

func reviewMeasure(t *testing.T, s *Store) reviewSizes {
	t.Helper()
	var z reviewSizes
	_, err := s.submit("", 0, func(o *opTx) error {
		s.mu.Lock()
		z.queues = len(s.mu.queues)
		s.mu.Unlock()
		z.leases, z.inflight = len(s.leases), len(s.inflight)
		z.expiry, z.delayed = len(s.expiry), len(s.delayed)
		return nil
	})
	require.NoError(t, err)
	s.corruptQ.Lock()
	z.corruptQ = len(s.corruptQ.n)
	s.corruptQ.Unlock()
	s.dedupCur.mu.Lock()
	z.dedupPending = len(s.dedupCur.pending)
	s.dedupCur.mu.Unlock()
	return z
}

// Short-lived per-job queues: create (by enqueue), use (poll, ack, an item
// delayed, a dedup key, a lease left to expire), force-delete, 2000 times.
// Once deleted and swept past every deadline, the store's in-memory state
// is back to its baseline.
func TestPerQueue_RocksStoreQueueChurn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	base := reviewMeasure(t, b.s)
	const n = 2000
	now := at(time.Second)
	for i := 0; i < n; i++ {
		q := fmt.Sprintf("job-%05d", i)
		b.enqueue(q, now,
			storage.EnqueueItem{Payload: []byte("a"), DedupKey: "k"},
			storage.EnqueueItem{Payload: []byte("b")},
			storage.EnqueueItem{Payload: []byte("c")},
			storage.EnqueueItem{Payload: []byte("d"), Delay: time.Hour},
		)
		r := b.poll(q, 1, time.Minute, now)
		require.Len(t, r.Items, 1)
		require.Equal(t, []storage.Code{storage.CodeOK}, b.ack(q, r.Lease, now, itemIDs(r.Items)...))
		r2 := b.poll(q, 1, time.Minute, now) // left leased
		require.Len(t, r2.Items, 1)
		_, err := b.s.DeleteQueue(b.ctx, storage.DeleteQueueParams{Queue: q, Force: true, Now: now})
		require.NoError(t, err)
	}
	mid := reviewMeasure(t, b.s)
	t.Logf("after %d queues deleted, before a sweep: %+v (baseline %+v)", n, mid, base)
	require.Equal(t, base.queues, mid.queues, "queue states of deleted queues")
	require.Equal(t, base.leases, mid.leases, "leases of deleted queues")
	require.Equal(t, base.inflight, mid.inflight, "inflight of deleted queues")
	require.LessOrEqual(t, mid.expiry, 2*mid.leases+compactSlack+1, "expiry heap bounded")
	require.LessOrEqual(t, mid.delayed, compactSlack+n, "delayed heap")

	// Past every deadline (the lease, the delay, the dedup window).
	for r := b.sweep(at(48 * time.Hour)); r.More; r = b.sweep(at(48 * time.Hour)) {
	}
	after := reviewMeasure(t, b.s)
	t.Logf("after a sweep: %+v", after)
	require.Equal(t, base, after, "in-memory state back to baseline")
	require.Empty(t, reviewKeysNaming(t, b.s, "job-"), "keys of deleted queues left in the database")
	b.enqueue("live-q", now, storage.EnqueueItem{Payload: []byte("z"), DedupKey: "d"})
	require.NotEmpty(t, reviewKeysNaming(t, b.s, "live-q"), "the scan sees a live queue's keys")
}

// reviewKeysNaming lists the database keys (every namespace) containing s.
func reviewKeysNaming(t *testing.T, st *Store, s string) []string {
	t.Helper()
	var out []string
	for ns := 0; ns < 255; ns++ {
		if _, ok := familyNames[byte(ns)]; !ok {
			continue
		}
		err := st.scan([]byte{byte(ns)}, []byte{byte(ns + 1)}, nil, func(k, v []byte) (bool, error) {
			if strings.Contains(string(k), s) && len(out) < 20 {
				out = append(out, fmt.Sprintf("%q", k))
			}
			return true, nil
		})
		require.NoError(t, err)
	}
	return out
}

// Many leases on one long-lived queue, each acked, extended then acked,
// or left to expire: the per-lease state returns to baseline.
func TestPerQueue_RocksStoreLeaseChurn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueueN("q", at(0), 1)
	r0 := b.poll("q", 1, time.Minute, at(0))
	b.ack("q", r0.Lease, at(0), itemIDs(r0.Items)...)
	base := reviewMeasure(t, b.s)
	now := at(time.Second)
	for i := 0; i < 3000; i++ {
		b.enqueueN("q", now, 1)
		r := b.poll("q", 1, time.Minute, now)
		require.Len(t, r.Items, 1, "iteration %d", i)
		switch i % 3 {
		case 1:
			_, err := b.s.ExtendLease(b.ctx, storage.ExtendParams{Queue: "q", Lease: r.Lease, Duration: time.Hour, Now: now})
			require.NoError(t, err)
		case 2:
			now = now.Add(2 * time.Minute) // let it expire
			b.sweep(now)
			r = b.poll("q", 1, time.Minute, now)
			require.Len(t, r.Items, 1, "iteration %d", i)
		}
		require.Equal(t, []storage.Code{storage.CodeOK}, b.ack("q", r.Lease, now, itemIDs(r.Items)...))
	}
	mid := reviewMeasure(t, b.s)
	t.Logf("after 3000 leases: %+v (baseline %+v)", mid, base)
	require.Equal(t, base.leases, mid.leases)
	require.Equal(t, base.inflight, mid.inflight)
	require.LessOrEqual(t, mid.expiry, 2*mid.leases+compactSlack+1, "expiry heap bounded")
	b.sweep(now.Add(2 * time.Hour))
	end := reviewMeasure(t, b.s)
	require.LessOrEqual(t, end.expiry, base.expiry)
	end.expiry = base.expiry
	require.Equal(t, base, end)
}

// Per-dedup-key state of a long-lived queue: once the window has passed
// and a sweep ran, neither the database nor memory holds the keys.
func TestPerQueue_RocksStoreDedupKeysExpire(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := at(time.Second)
	b.enqueueN("live", now, 1)
	base := reviewMeasure(t, b.s)
	for i := 0; i < 2000; i += 100 {
		items := make([]storage.EnqueueItem, 100)
		for k := range items {
			items[k] = storage.EnqueueItem{Payload: []byte("p"), DedupKey: fmt.Sprintf("dk-%05d", i+k)}
		}
		b.enqueue("live", now, items...)
		for got := 0; got < 100; {
			r := b.poll("live", 100, time.Minute, now)
			require.NotEmpty(t, r.Items)
			b.ack("live", r.Lease, now, itemIDs(r.Items)...)
			got += len(r.Items)
		}
	}
	require.NotEmpty(t, reviewKeysNaming(t, b.s, "dk-"))
	later := now.Add(30 * 24 * time.Hour)
	for r := b.sweep(later); r.More; r = b.sweep(later) {
	}
	require.Empty(t, reviewKeysNaming(t, b.s, "dk-"), "dedup keys past their window")
	end := reviewMeasure(t, b.s)
	end.expiry = base.expiry
	require.Equal(t, base, end)
}
