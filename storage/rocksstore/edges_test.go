package rocksstore

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// edgeNames are queue names that are prefixes of one another or
// differ only in their last byte, plus the longest allowed name and one
// byte short of it.
func edgeNames() []string {
	lim := storage.DefaultLimits
	long := strings.Repeat("a", lim.MaxQueueName)
	return []string{"a", "ab", "a-", "a.", "a_", "A", "a0", "aa", long, long[:lim.MaxQueueName-1], "-", "_", "..."}
}

// edgeItems is one queue's batch: payloads at the inline threshold
// and one past it, the max payload, an empty one; dedup keys with 0x00,
// 0xff and at the max length; priorities at both bounds.
func edgeItems(q string) []storage.EnqueueItem {
	lim := storage.DefaultLimits
	tag := func(n int) []byte {
		p := bytes.Repeat([]byte{0xA5}, n)
		copy(p, q+"|")
		return p
	}
	return []storage.EnqueueItem{
		{Payload: tag(defaultInlineMax), Priority: 255, DedupKey: "k"},
		{Payload: tag(defaultInlineMax + 1), Priority: 0, DedupKey: "\x00"},
		{Payload: tag(lim.MaxPayload), Priority: 1, DedupKey: "\x00\x01"},
		{Payload: tag(defaultInlineMax - 1), Priority: 255, DedupKey: string(bytes.Repeat([]byte{0xff}, lim.MaxDedupKey))},
		{Payload: tag(3 * defaultInlineMax), Priority: 128, MaxAttempts: 1},
		{Payload: tag(0)[:0], Priority: 0},
		{Payload: tag(10), Delay: lim.MaxDelay, Priority: 255},
	}
}

// TestEdges_PrefixQueuesIsolated: queues whose names are prefixes
// of one another, at the name length limit, with payloads around the
// inline threshold and at the max, never see or touch each other's items
// through poll, ack, nack to the DLQ, peek, dead list, redrive, purge,
// delete and reopen; Check stays clean throughout.
func TestEdges_PrefixQueuesIsolated(t *testing.T) {
	b := setup(t)
	names := edgeNames()
	now := at(0)
	ids := map[string][]storage.ItemID{}
	for _, q := range names {
		ids[q] = b.enqueue(q, now, edgeItems(q)...)
		// The same dedup keys in another queue are not duplicates.
		res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: q, Items: edgeItems(q)[:4], Now: now})
		require.NoError(t, err)
		for i, r := range res {
			require.True(t, r.Duplicate, "queue %q item %d is its own duplicate", q, i)
			require.Equal(t, ids[q][i], r.ID)
		}
	}
	b.check()
	owned := func(q string, it storage.Item) {
		t.Helper()
		require.Equal(t, q, it.Queue)
		if len(it.Payload) > len(q) {
			require.True(t, bytes.HasPrefix(it.Payload, []byte(q+"|")), "queue %q got payload of %q", q, it.Payload[:min(len(it.Payload), 40)])
		}
	}
	wantLive := len(edgeItems("x"))
	for _, q := range names {
		st := b.stats(q, now)
		require.Equal(t, int64(wantLive-1), st.Ready, q)
		require.Equal(t, int64(1), st.Delayed, q)
		peek, err := b.s.Peek(b.ctx, storage.PeekParams{Queue: q, Limit: 1000, Now: now})
		require.NoError(t, err)
		require.Len(t, peek, wantLive, q)
		for _, it := range peek {
			owned(q, it)
		}
	}
	// Claim everything ready in every queue; nack the MaxAttempts 1 item
	// to the DLQ, ack the others but one, leave that one inflight.
	leases := map[string]storage.LeaseID{}
	for _, q := range names {
		p := b.poll(q, 1000, time.Minute, now)
		require.Len(t, p.Items, wantLive-1, q)
		leases[q] = p.Lease
		var ackIDs []storage.ItemID
		var dead storage.ItemID
		for i, it := range p.Items {
			owned(q, it)
			if i > 0 {
				require.LessOrEqual(t, p.Items[i-1].Priority, it.Priority, "serve order by priority")
			}
			switch {
			case it.MaxAttempts == 1:
				dead = it.ID
			case len(it.Payload) == storage.DefaultLimits.MaxPayload:
				// stays inflight (external payload)
			default:
				ackIDs = append(ackIDs, it.ID)
			}
		}
		for _, c := range b.nack(q, p.Lease, nil, now, dead) {
			require.Equal(t, storage.CodeOK, c)
		}
		for _, c := range b.ack(q, p.Lease, now, ackIDs...) {
			require.Equal(t, storage.CodeOK, c)
		}
		// Acks under the lease of another queue whose name is a prefix
		// are refused.
		for _, other := range names {
			if other == q {
				continue
			}
			c, err := b.s.Ack(b.ctx, storage.AckParams{Queue: other, Lease: p.Lease, IDs: []storage.ItemID{ids[q][2]}, Now: now})
			require.NoError(t, err)
			require.NotEqual(t, storage.CodeOK, c[0], "ack of %q's item through %q", q, other)
		}
	}
	b.check()
	for _, q := range names {
		st := b.stats(q, now)
		require.Equal(t, int64(0), st.Ready, q)
		require.Equal(t, int64(1), st.Delayed, q)
		require.Equal(t, int64(1), st.Inflight, q)
		require.Equal(t, int64(1), st.Dead, q)
		inf, err := b.s.Peek(b.ctx, storage.PeekParams{Queue: q, Inflight: true, Limit: 1000, Now: now})
		require.NoError(t, err)
		require.Len(t, inf, 1, q)
		owned(q, inf[0])
		require.Len(t, inf[0].Payload, storage.DefaultLimits.MaxPayload)
		dl, err := b.s.DeadList(b.ctx, storage.DeadListParams{Queue: q, Limit: 1000})
		require.NoError(t, err)
		require.Len(t, dl, 1, q)
		owned(q, dl[0].Item)
		require.Len(t, dl[0].Payload, 3*defaultInlineMax)
	}
	b.reopen()
	b.check()
	// Purge "a" and force-delete "ab"; every other queue keeps its items.
	n, err := b.s.Purge(b.ctx, storage.PurgeParams{Queue: "a", Now: now})
	require.NoError(t, err)
	require.Equal(t, 2, n, "purge of a: its delayed and inflight items")
	n, err = b.s.DeleteQueue(b.ctx, storage.DeleteQueueParams{Queue: "ab", Force: true, Now: now})
	require.NoError(t, err)
	require.Equal(t, 3, n, "delete of ab: delayed, inflight, dead")
	rr, err := b.s.Redrive(b.ctx, storage.RedriveParams{Queue: "a", Limit: 1000, Now: now})
	require.NoError(t, err)
	require.Equal(t, 1, rr.Moved)
	b.check()
	b.reopen()
	for _, q := range names {
		if q == "ab" {
			_, err := b.s.Stats(b.ctx, storage.StatsParams{Queue: q, Now: now})
			require.ErrorIs(t, err, storage.ErrNotFound)
			continue
		}
		st := b.stats(q, now)
		want := [4]int64{0, 1, 1, 1}
		if q == "a" {
			want = [4]int64{1, 0, 0, 0}
		}
		require.Equal(t, want, [4]int64{st.Ready, st.Delayed, st.Inflight, st.Dead}, q)
		if q != "a" {
			// Lease still live after reopen: the inflight item acks.
			c := b.ack(q, leases[q], now, ids[q][2])
			require.Equal(t, storage.CodeOK, c[0], q)
		}
	}
	// The deleted queue starts afresh: no old dedup keys.
	res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "ab", Items: edgeItems("ab")[:4], Now: now})
	require.NoError(t, err)
	for i, r := range res {
		require.False(t, r.Duplicate, "item %d of the new ab", i)
	}
	// And "a"'s dedup keys survived the purge of "a" (purge drops items,
	// not dedup keys) while "ab"'s delete did not touch them.
	res, err = b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "a", Items: edgeItems("a")[:1], Now: now})
	require.NoError(t, err)
	require.True(t, res[0].Duplicate, fmt.Sprintf("%+v", res[0]))
	b.check()
}

// TestEdges_MaxBatchAroundInlineThreshold: whole batches of
// MaxBatch items alternating payloads at and just past the inline
// threshold, in two queues whose names are prefixes, through poll at
// MinLease, expiry, poll at MaxLease, nack at MaxDelay, promotion, ack,
// and a purge of one MaxBatch lease (larger than purgeChunk); payloads
// stay intact and the other queue untouched.
func TestEdges_MaxBatchAroundInlineThreshold(t *testing.T) {
	b := setup(t)
	lim := storage.DefaultLimits
	mk := func(q string) []storage.EnqueueItem {
		items := make([]storage.EnqueueItem, lim.MaxBatch)
		for i := range items {
			n := defaultInlineMax + i%2
			p := bytes.Repeat([]byte{byte(i)}, n)
			copy(p, fmt.Sprintf("%s|%d|", q, i))
			items[i] = storage.EnqueueItem{Payload: p, Priority: uint8(i % 3 * 127)}
		}
		return items
	}
	verify := func(q string, items []storage.Item) {
		t.Helper()
		for _, it := range items {
			require.Equal(t, q, it.Queue)
			var i int
			_, err := fmt.Sscanf(string(it.Payload[len(q)+1:]), "%d|", &i)
			require.NoError(t, err)
			require.True(t, bytes.HasPrefix(it.Payload, []byte(q+"|")))
			require.Len(t, it.Payload, defaultInlineMax+i%2)
			require.Equal(t, bytes.Repeat([]byte{byte(i)}, 10), it.Payload[len(it.Payload)-10:])
		}
	}
	now := at(0)
	for _, q := range []string{"a", "ab", "a"} {
		b.enqueue(q, now, mk(q)...)
	}
	p := b.poll("a", lim.MaxBatch, lim.MinLease, now)
	require.Len(t, p.Items, lim.MaxBatch)
	verify("a", p.Items)
	now = now.Add(lim.MinLease)
	sw := b.sweep(now)
	require.Equal(t, lim.MaxBatch, sw.Requeued)
	b.check()
	p = b.poll("a", lim.MaxBatch, lim.MaxLease, now)
	require.Len(t, p.Items, lim.MaxBatch)
	verify("a", p.Items)
	codes := b.nack("a", p.Lease, dur(lim.MaxDelay), now, itemIDs(p.Items)...)
	for _, c := range codes {
		require.Equal(t, storage.CodeOK, c)
	}
	b.reopen()
	st := b.stats("a", now)
	require.Equal(t, [3]int64{int64(lim.MaxBatch), int64(lim.MaxBatch), 0}, [3]int64{st.Ready, st.Delayed, st.Inflight})
	// The second MaxBatch of "a" is claimed and acked; the first comes
	// back after MaxDelay.
	p = b.poll("a", lim.MaxBatch, 0, now)
	require.Len(t, p.Items, lim.MaxBatch)
	verify("a", p.Items)
	for _, c := range b.ack("a", p.Lease, now, itemIDs(p.Items)...) {
		require.Equal(t, storage.CodeOK, c)
	}
	now = now.Add(lim.MaxDelay)
	b.sweep(now)
	p = b.poll("a", lim.MaxBatch, lim.MaxLease, now)
	require.Len(t, p.Items, lim.MaxBatch)
	verify("a", p.Items)
	// Purge "a" with its one lease of MaxBatch items; "ab" keeps all.
	n, err := b.s.Purge(b.ctx, storage.PurgeParams{Queue: "a", Now: now})
	require.NoError(t, err)
	require.Equal(t, lim.MaxBatch, n)
	b.check()
	st = b.stats("ab", now)
	require.Equal(t, int64(lim.MaxBatch), st.Ready)
	pab := b.poll("ab", lim.MaxBatch, 0, now)
	require.Len(t, pab.Items, lim.MaxBatch)
	verify("ab", pab.Items)
	st = b.stats("a", now)
	require.Equal(t, [4]int64{0, 0, 0, 0}, [4]int64{st.Ready, st.Delayed, st.Inflight, st.Leases})
	b.reopen()
}
