package rocksstore

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// Crash consistency of the store's own WAL handling (ZeroedWALs in
// zerowal.cc, OrderedLogs in rdb.cc). Crash images are copies of the data
// directory taken while the store is open, then changed as a power loss
// can leave them.

// walCount is the number of .log files in dir.
func walCount(t *testing.T, dir string) int {
	t.Helper()
	logs, err := walFiles(dir)
	require.NoError(t, err)
	return len(logs)
}

// enqueueUntilNewLog enqueues single items of size bytes into q, one
// call each, until the store in b starts a new WAL file (flushes must be
// paused: the memtable fills and switches, and the old log stays). It
// returns how many were enqueued; the last of them is the first record of
// the new log.
func enqueueUntilNewLog(b *testBundle, q string, size int) int {
	b.t.Helper()
	before := walCount(b.t, b.dir)
	for n := 1; n < 1000; n++ {
		b.enqueue(q, at(0), storage.EnqueueItem{Payload: bytes.Repeat([]byte{'m'}, size)})
		if walCount(b.t, b.dir) > before {
			return n
		}
	}
	b.t.Fatal("no new log")
	return 0
}

// staleSpareImage runs a store over zeroed logs until a log made over the
// spare holds records none of which was acknowledged, and returns a crash
// image in which that log is still named LEASEQ-SPARE-WAL, and how many
// items were acknowledged. A build without OrderedLogs left that image
// after a power loss between the new log's fdatasync and RocksDB's first
// directory fsync after the switch: fdatasync over the spare's blocks
// commits no metadata, so the rename that made the log was not durable.
func staleSpareImage(t *testing.T) (string, int) {
	t.Helper()
	b := setup(t, zeroedWALOptions)
	spareReady(t, b.dir)
	enqueueOneByOne(b, "q", 10, 100) // acknowledged, in the log Open made
	b.s.db.pauseBackground(true)
	t.Cleanup(func() { b.s.db.pauseBackground(false) })
	spareReady(t, b.dir)
	n := enqueueUntilNewLog(b, "q", 12<<10) // synced every 12 KiB: zeros pay
	// More batches behind the one that switched logs, as the pipeline
	// writes them before the fsync of the one before.
	enqueueOneByOne(b, "q", 3, 1000)
	spareReady(t, b.dir) // the next spare: no file is being written

	crashed := copyDir(t, b.dir)
	newLog, wal := newestLog(t, crashed)
	require.Len(t, wal, testSpare, "the new log is the spare")
	// The power fails before the next spare was made.
	spare := filepath.Join(crashed, "LEASEQ-SPARE-WAL")
	require.NoError(t, os.Remove(spare))
	require.NoError(t, os.Rename(newLog, spare))
	// None of the new log's records was acknowledged: the open goes back
	// to the items before them.
	return crashed, 10 + n - 1
}

// Found by review (session 72): ZeroedWALs::Prepare checked only the
// spare's size and handed a spare holding records to the log DB::Open
// creates, which overwrites it from byte 0. Once that log held a record
// shorter than the stale ones under it, the stale records after it read
// as whole records behind a "damaged" one, and the Open after the next
// crash refused the database (ErrWALDamaged), although every record it
// needs is whole.
func TestWALCrash_StaleSpareRefusesLaterOpen(t *testing.T) {
	t.Parallel()
	crashed, acked := staleSpareImage(t)

	c := setupDir(t, crashed, zeroedWALOptions)
	require.Equal(t, int64(acked), c.stats("q", at(time.Second)).Ready)
	c.enqueue("q", at(0), storage.EnqueueItem{Payload: []byte("b1")}) // acknowledged
	acked++

	// Another crash (of the process only, even).
	again := copyDir(t, crashed)
	s, err := Open(again, func() Options { o := testOptions(t); zeroedWALOptions(&o); return o }())
	require.NoError(t, err, "an Open after a crash refuses the database")
	defer s.Close()
	st, err := s.Stats(t.Context(), storage.StatsParams{Queue: "q", Now: at(time.Second)})
	require.NoError(t, err)
	require.Len(t, st, 1)
	require.Equal(t, int64(acked), st[0].Ready)
}

// Found by review (session 72): the same stale spare without a write
// after the open that took it. The next Open replayed the stale records,
// batches of an earlier opening that were never acknowledged and that
// the open in between had dropped: items a reader was told were not
// there came back.
func TestWALCrash_StaleSpareReplaysDroppedBatches(t *testing.T) {
	t.Parallel()
	crashed, acked := staleSpareImage(t)

	c := setupDir(t, crashed, zeroedWALOptions)
	require.Equal(t, int64(acked), c.stats("q", at(time.Second)).Ready, "the unacknowledged batches are gone")

	again := copyDir(t, crashed) // a crash of the process, nothing written
	d := setupDir(t, again, zeroedWALOptions)
	require.Equal(t, int64(acked), d.stats("q", at(time.Second)).Ready,
		"batches the previous open dropped came back from the reused spare")
}

// logNumberOf is the number in a WAL file's name.
func logNumberOf(t *testing.T, path string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(strings.TrimSuffix(filepath.Base(path), ".log"), 10, 64)
	require.NoError(t, err)
	return n
}

// Found by review (session 72): RocksDB starts a new log at a memtable
// switch without syncing the old one, and the pipeline writes the next
// batches into the new log before the fsync that covers both. A power
// loss could keep the new log's records (here a poll that leases every
// item) and lose the old log's last page, or its last record whole (the
// file's size is written back with its data): a plain log cut there reads
// as a clean end, and RocksDB's TolerateCorruptedTailRecords replayed the
// newer log past the hole, a poll applied without the enqueue of an item
// it leased (Check: payload_missing). OrderedLogs now fdatasyncs the old
// log before the new one exists, so every byte of the old log is on the
// disk before the new log holds a record: the log, as synced then, is the
// whole log. A power loss can then only cut the newest log, and the store
// opens in a state it was in. Both sync modes: the old log is plain
// (with SyncAlways, a log after large batches is).
func TestWALCrash_OlderLogDurableBeforeNewerLog(t *testing.T) {
	t.Parallel()
	for _, mode := range []SyncMode{SyncAlways, SyncNone} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			opts := func(o *Options) { o.Sync = mode; o.memtable = testSpare / 2 }
			b := setup(t, opts)
			if mode == SyncAlways {
				big := make([]storage.EnqueueItem, 100)
				for i := range big {
					big[i] = storage.EnqueueItem{Payload: bytes.Repeat([]byte{'b'}, 4000)}
				}
				for range 3 {
					b.enqueue("big", at(0), big...)
				}
				require.NoError(t, b.s.db.flush())
				zeroed, plain := b.s.db.walFiles()
				require.Equal(t, [2]int64{1, 1}, [2]int64{zeroed, plain}, "the log after large batches is plain")
			}
			b.s.db.pauseBackground(true)
			t.Cleanup(func() { b.s.db.pauseBackground(false) })
			n := enqueueUntilNewLog(b, "q", 60<<10)
			// The newer log: the enqueue of call n, then a poll that
			// leases every item, the older log's last one too.
			res := b.poll("q", 1000, time.Minute, at(0))
			require.Len(t, res.Items, n)

			crashed := copyDir(t, b.dir)
			logs, err := walFiles(crashed)
			require.NoError(t, err)
			require.GreaterOrEqual(t, len(logs), 2)
			older, newer := logs[len(logs)-2], logs[len(logs)-1]
			wal, err := os.ReadFile(older)
			require.NoError(t, err)
			require.Less(t, len(wal), testSpare, "a plain log")
			all := scanLog(wal)
			require.Equal(t, int64(-1), all.bad)

			synced, size := b.s.db.walSynced()
			require.Equal(t, logNumberOf(t, older), synced, "the older log was not synced before the newer one was made")
			require.Equal(t, int64(len(wal)), size, "the older log was synced short of its end")

			// The power loss takes the poll: the newer log ends after its
			// first record.
			nw, err := os.ReadFile(newer)
			require.NoError(t, err)
			lo, hi := 0, len(nw)
			for lo < hi {
				mid := (lo + hi) / 2
				if scanLog(nw[:mid]).records >= 1 {
					hi = mid
				} else {
					lo = mid + 1
				}
			}
			require.Equal(t, 1, scanLog(nw[:lo]).records)
			if len(nw) == testSpare {
				clear(nw[lo:]) // over zeros: the rest stays zeros
			} else {
				nw = nw[:lo]
			}
			require.NoError(t, os.WriteFile(newer, nw, 0o600))

			c := setupDir(t, crashed, opts) // its Cleanup runs Check
			st := c.stats("q", at(time.Second))
			require.Equal(t, int64(n), st.Ready)
			require.Zero(t, st.Inflight)
		})
	}
}
