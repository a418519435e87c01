package rocksstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// merge adds a counters merge operand, as batches wrote until 2026-11-29
// (the store now puts counters whole; databases written before still hold
// operands, which rdb.cc's CountersMerge sums).
func (w *writeBuf) merge(key, value []byte) { w.add('m', key, value) }

// storedCounters reads queue q's counters key as the database holds it.
func storedCounters(t *testing.T, s *Store, q string) dbkeys.Counters {
	t.Helper()
	v, ok, err := s.getRaw(dbkeys.CountersKey(q))
	require.NoError(t, err)
	require.True(t, ok, "no counters key for %q", q)
	c, err := dbkeys.DecodeCounters(v)
	require.NoError(t, err)
	return c
}

// Batches write a queue's counters whole (commit.go). A database written
// before that holds merge operands under the key: it opens to their sum,
// and the first batch after it replaces them with the whole value.
func TestRocksStore_CountersFromMergeOperands(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueueN("q", at(0), 3)
	res := b.poll("q", 1, time.Minute, at(0))
	require.Len(t, res.Items, 1)
	want := b.stats("q", at(0))
	c := storedCounters(t, b.s, "q")
	require.Equal(t, dbkeys.Counters{Ready: 2, Inflight: 1, Leases: 1, Enqueued: 3, Delivered: 1}, c)

	// Rewrite the key as the engine did before: operands, one per batch.
	key := dbkeys.CountersKey("q")
	var w writeBuf
	w.del(key)
	w.merge(key, dbkeys.EncodeCounters(dbkeys.Counters{Ready: 3, Enqueued: 3}))
	w.merge(key, dbkeys.EncodeCounters(dbkeys.Counters{Ready: -1, Inflight: 1, Leases: 1, Delivered: 1}))
	require.NoError(t, b.s.db.write(&w, true))
	b.reopen()
	require.Equal(t, want, b.stats("q", at(0)))

	require.Equal(t, []storage.Code{storage.CodeOK}, b.ack("q", res.Lease, at(time.Second), res.Items[0].ID))
	want = b.stats("q", at(time.Second))
	require.Equal(t, int64(2), want.Ready)
	require.Equal(t, uint64(1), want.Acked)
	require.Equal(t, dbkeys.Counters{Ready: 2, Enqueued: 3, Delivered: 1, Acked: 1}, storedCounters(t, b.s, "q"))
	require.NoError(t, b.s.db.flush())
	require.Equal(t, dbkeys.Counters{Ready: 2, Enqueued: 3, Delivered: 1, Acked: 1}, storedCounters(t, b.s, "q"))
	b.reopen()
	require.Equal(t, want, b.stats("q", at(time.Second)))
}
