package rocksstore

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// tableDeletions opens dir read-only and returns the delete markers its
// tables hold, in every column family (RocksDB's aggregated table
// properties): point deletes (deletes and single deletes), and range
// tombstones.
func tableDeletions(t *testing.T, dir string) (point, ranges int) {
	t.Helper()
	names := familyList()
	db, err := openRDB(dir, rdbOptions{mode: readOnly}, names)
	require.NoError(t, err)
	defer db.close()
	count := func(props, name string) int {
		m := regexp.MustCompile(`# ` + name + `=(\d+)`).FindStringSubmatch(props)
		require.NotNil(t, m, "no %s count in %q", name, props)
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		return n
	}
	for i := range names {
		props, ok := db.property(i, "rocksdb.aggregated-table-properties")
		require.True(t, ok)
		all, r := count(props, "deletions"), count(props, "range deletions") // the first counts both
		point += all - r
		ranges += r
	}
	return point, ranges
}

// Consumed items leave no delete marker per item behind: their index
// entries, and records not deleted in a run, are single-deleted, so a
// flush drops each delete together with the write it covers. The lease
// records (rewritten in place, so deleted normally) leave one marker
// each, each run of records with consecutive ids claimed or acked in one
// batch one range tombstone (in available and in_progress), and each
// claim of a queue's head one over its visibility entries.
func TestRocksStore_ConsumedItemsLeaveNoTombstones(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n, batch = 256, 64
	b.enqueueN("q", at(0), n)
	leases := 0
	for got := 0; got < n; {
		res := b.poll("q", batch, time.Minute, at(time.Second))
		require.NotEmpty(t, res.Items)
		codes := b.ack("q", res.Lease, at(2*time.Second), itemIDs(res.Items)...)
		for _, c := range codes {
			require.Equal(t, storage.CodeOK, c)
		}
		got += len(res.Items)
		leases++
	}
	b.check()
	require.NoError(t, b.s.Close()) // flushes the memtable into a table
	point, ranges := tableDeletions(t, b.dir)
	require.Equal(t, leases, point, "point delete markers in the flushed table")
	require.Equal(t, 3*leases, ranges, "range tombstones in the flushed table: a claim's two and an ack's per poll")
	s, err := Open(b.dir, b.opts)
	require.NoError(t, err)
	b.s = s
	st := b.stats("q", at(3*time.Second))
	require.Zero(t, st.Ready+st.Inflight+st.Delayed+st.Dead)
}

// An extend that lands on the lease's current expiry deletes and writes
// the same lease_expiry key in one batch. The write must be preceded by a
// single delete: otherwise the ack's single delete would meet the newer
// write only, the flush would drop the two, and the poll's older write,
// already in a table, would come back (an orphan expiry entry, which
// Check reports).
func TestRocksStore_ExtendToSameExpiryThenAck(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.enqueueN("q", at(0), 2)
	res := b.poll("q", 2, 30*time.Second, at(time.Second))
	require.Len(t, res.Items, 2)
	b.reopen() // the poll's expiry entry goes to a table of its own
	exp, err := b.s.ExtendLease(b.ctx, storage.ExtendParams{Queue: "q", Lease: res.Lease, Duration: 30 * time.Second, Now: at(time.Second)})
	require.NoError(t, err)
	require.True(t, exp.Equal(res.ExpiresAt), "extend to the same expiry: %v against %v", exp, res.ExpiresAt)
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK}, b.ack("q", res.Lease, at(2*time.Second), ids...))
	b.reopen() // Close flushes the memtable; Open reads the table
	_, found, err := b.s.getRaw(dbkeys.LeaseExpiryKey(nanos(res.ExpiresAt), res.Lease))
	require.NoError(t, err)
	require.False(t, found, "the lease's expiry entry came back after the flush")
	st := b.stats("q", at(3*time.Second))
	require.Zero(t, st.Inflight)
	require.Zero(t, st.Leases)
}
