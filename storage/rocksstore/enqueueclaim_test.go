package rocksstore

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// EnqueueClaim writes the items and the claims of the waiting polls in one
// commit, under one fsync, the polls in order.
func TestRocksStore_EnqueueClaimSharesTheCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *Options) { o.Sync = SyncAlways })
	b.enqueueN("q", at(0), 1) // an older item: the first claim takes it first
	before := b.s.Metrics()
	items := []storage.EnqueueItem{{Payload: []byte("a")}, {Payload: []byte("b")}, {Payload: []byte("c")}}
	polls := []storage.PollParams{
		{Queue: "q", Max: 2, Lease: time.Minute, Now: at(time.Second)},
		{Queue: "other", Max: 5, Now: at(time.Second)}, // another queue's: ignored
		{Queue: "q", Max: 0, Now: at(time.Second)},     // invalid: ignored
		{Queue: "q", Max: 1, Now: at(time.Second)},     // the queue's lease
	}
	res, prs, err := b.s.EnqueueClaim(b.ctx, storage.EnqueueParams{Queue: "q", Items: items, Now: at(time.Second)}, polls)
	require.NoError(t, err)
	require.Len(t, res, 3)
	for _, r := range res {
		require.Equal(t, storage.CodeOK, r.Code)
	}
	require.Len(t, prs, 4)
	require.Len(t, prs[0].Items, 2)
	require.Equal(t, "p0", string(prs[0].Items[0].Payload), "the older item is served first")
	require.Equal(t, "a", string(prs[0].Items[1].Payload))
	require.True(t, prs[0].ExpiresAt.Equal(at(time.Second+time.Minute)))
	require.Empty(t, prs[1].Items)
	require.True(t, prs[1].Lease.IsZero())
	require.Empty(t, prs[2].Items)
	require.Len(t, prs[3].Items, 1)
	require.Equal(t, "b", string(prs[3].Items[0].Payload))
	require.True(t, prs[3].ExpiresAt.Equal(at(time.Second).Add(storage.DefaultQueueConfig().LeaseDuration)))
	m := b.s.Metrics().Sub(before)
	require.Equal(t, uint64(1), m.Commits, "one commit for the enqueue and its claims")
	require.Equal(t, uint64(1), m.WALSyncs, "one fsync")
	require.Equal(t, uint64(3), m.Claimed)

	st := b.stats("q", at(2*time.Second))
	require.EqualValues(t, 1, st.Ready)
	require.EqualValues(t, 3, st.Inflight)
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK}, b.ack("q", prs[0].Lease, at(2*time.Second), itemIDs(prs[0].Items)...))
	b.reopen() // what the claims wrote is what the database says
	st = b.stats("q", at(3*time.Second))
	require.EqualValues(t, 1, st.Ready)
	require.EqualValues(t, 1, st.Inflight)
}

// Nothing to write (every item invalid, on an existing queue): nothing new
// to claim either.
func TestRocksStore_EnqueueClaimNothingWritten(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueueN("q", at(0), 1)
	res, prs, err := b.s.EnqueueClaim(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("x"), Delay: -time.Second}}, Now: at(time.Second)},
		[]storage.PollParams{{Queue: "q", Max: 1, Now: at(time.Second)}})
	require.NoError(t, err)
	require.Len(t, res, 1)
	require.Equal(t, storage.CodeInvalid, res[0].Code)
	require.Len(t, prs, 1)
	require.Empty(t, prs[0].Items)
}

// An item claimed in the batch that enqueued it costs RocksDB no
// available record and no visibility entry: the put and the single
// delete of each cancel out in the batch before it reaches RocksDB.
func TestRocksStore_ClaimInEnqueueBatchWritesNoIndexEntries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keysWritten := func() int {
		m := regexp.MustCompile(`rocksdb\.number\.keys\.written COUNT : (\d+)`).FindStringSubmatch(b.s.db.statistics())
		require.NotNil(t, m)
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		return n
	}
	b.enqueueN("q", at(0), 1) // p0: written by an earlier batch
	before := keysWritten()
	_, prs, err := b.s.EnqueueClaim(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("x")}, {Payload: []byte("y")}}, Now: at(time.Second)},
		[]storage.PollParams{{Queue: "q", Max: 3, Lease: time.Minute, Now: at(time.Second)}})
	require.NoError(t, err)
	require.Len(t, prs[0].Items, 3)
	// p0's claim single-deletes its available record and visibility entry;
	// x and y cost nothing before their claims. Then 3 in_progress
	// records, the lease and its expiry entry, and the counters' merge.
	require.Equal(t, 2+3+2+1, keysWritten()-before, "keys written by the batch")
	b.check()
	b.reopen() // the database says what the claims said
	st := b.stats("q", at(2*time.Second))
	require.EqualValues(t, 0, st.Ready)
	require.EqualValues(t, 3, st.Inflight)
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK, storage.CodeOK}, b.ack("q", prs[0].Lease, at(2*time.Second), itemIDs(prs[0].Items)...))
	b.check()
}
