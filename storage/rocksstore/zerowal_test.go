package rocksstore

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

const testSpare = 2 << 20 // the spare of a store with 1 MiB memtables

func zeroedWALOptions(o *Options) {
	o.Sync = SyncAlways
	o.memtable = testSpare / 2
}

// crashCopy copies the files of the open store in dir, as a crash would
// leave them, and returns the copy, its one WAL file and that file's bytes.
func crashCopy(t *testing.T, dir string) (crashed, log string, wal []byte) {
	t.Helper()
	crashed = copyDir(t, dir)
	logs, err := filepath.Glob(filepath.Join(crashed, "*.log"))
	require.NoError(t, err)
	require.Len(t, logs, 1)
	wal, err = os.ReadFile(logs[0])
	require.NoError(t, err)
	return crashed, logs[0], wal
}

// spareReady waits for the store in dir to have a whole spare.
func spareReady(t *testing.T, dir string) {
	t.Helper()
	require.Eventually(t, func() bool {
		fi, err := os.Stat(filepath.Join(dir, "LEASEQ-SPARE-WAL"))
		return err == nil && fi.Size() == testSpare
	}, 30*time.Second, time.Millisecond, "no spare WAL")
}

// copyDir copies the regular files of src into a new directory, as a
// crash would leave them (the store in src stays open).
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	ents, err := os.ReadDir(src)
	require.NoError(t, err)
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dst, e.Name()), b, 0o600))
	}
	return dst
}

// recordsEnd is where a WAL file's records end: zeros follow.
func recordsEnd(wal []byte) int {
	end := len(wal)
	for end > 0 && wal[end-1] == 0 {
		end--
	}
	return end
}

// enqueueOneByOne enqueues n items of size bytes, one call (one fsync) each.
func enqueueOneByOne(b *testBundle, q string, n, size int) {
	b.t.Helper()
	for i := 0; i < n; i++ {
		b.enqueue(q, at(0), storage.EnqueueItem{Payload: bytes.Repeat([]byte{'x'}, size)})
	}
}

// With SyncAlways the log Open creates is a zero-filled spare, and a crash
// leaves it with zeros after the records: Open replays the records and
// Check passes.
func TestZeroedWAL_CrashLeavesZeroTail(t *testing.T) {
	t.Parallel()
	b := setup(t, zeroedWALOptions)
	zeroed, plain := b.s.db.walFiles()
	require.Equal(t, [2]int64{1, 0}, [2]int64{zeroed, plain})
	spareReady(t, b.dir)
	enqueueOneByOne(b, "q", 100, 100)

	crashed, _, wal := crashCopy(t, b.dir)
	require.Len(t, wal, testSpare, "the log's file is the spare's size")
	end := recordsEnd(wal)
	require.Greater(t, end, 100*100, "the records")
	require.Less(t, end, testSpare/2, "zeros after the records")

	c := setupDir(t, crashed, zeroedWALOptions)
	require.Equal(t, int64(100), c.stats("q", at(time.Second)).Ready)
}

// A crash mid-write leaves the last record torn with zeros after it, not
// at the end of the file: Open and CheckDir replay up to it; the enqueue
// it held was never answered.
func TestZeroedWAL_TornLastRecord(t *testing.T) {
	t.Parallel()
	b := setup(t, zeroedWALOptions)
	enqueueOneByOne(b, "q", 100, 100)

	crashed, _, _ := crashCopy(t, b.dir)
	log, wal := tearNewestLog(t, crashed)

	torn, err := walTornTail(crashed)
	require.NoError(t, err)
	require.NotNil(t, torn)
	require.Equal(t, log, torn.File)
	rep, err := CheckDir(b.ctx, crashed)
	require.NoError(t, err)
	require.True(t, rep.OK(), "violations: %v", rep.Violations)
	after, err := os.ReadFile(log)
	require.NoError(t, err)
	require.Equal(t, wal, after, "CheckDir changed the log")

	c := setupDir(t, crashed, zeroedWALOptions)
	require.Equal(t, int64(99), c.stats("q", at(time.Second)).Ready)
}

// Zeros are used while RocksDB syncs the log often for its bytes: after a
// log written in large batches the next one is created empty, after a log
// of single items the next one takes the spare again.
func TestZeroedWAL_OnlyForFrequentSyncs(t *testing.T) {
	t.Parallel()
	b := setup(t, zeroedWALOptions)
	spareReady(t, b.dir)
	big := make([]storage.EnqueueItem, 100)
	for i := range big {
		big[i] = storage.EnqueueItem{Payload: bytes.Repeat([]byte{'b'}, 4000)}
	}
	for range 3 { // 1.2 MB in three fsyncs
		b.enqueue("q", at(0), big...)
	}
	require.NoError(t, b.s.db.flush()) // a new log
	zeroed, plain := b.s.db.walFiles()
	require.Equal(t, [2]int64{1, 1}, [2]int64{zeroed, plain}, "after large batches")

	// 1.2 MB in 300 fsyncs (the memtable may fill and start a log too).
	enqueueOneByOne(b, "q", 300, 4000)
	require.NoError(t, b.s.db.flush())
	zeroed, plain = b.s.db.walFiles()
	require.Equal(t, int64(1), plain, "after single items")
	require.GreaterOrEqual(t, zeroed, int64(2), "after single items")
	b.reopen()
	require.Equal(t, int64(600), b.stats("q", at(time.Second)).Ready)
}

// SyncNone makes no spare and removes one left by a SyncAlways open.
func TestZeroedWAL_SyncNoneRemovesSpare(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s, err := Open(dir, func() Options { o := testOptions(t); zeroedWALOptions(&o); return o }())
	require.NoError(t, err)
	spareReady(t, dir)
	require.NoError(t, s.Close())

	b := setupDir(t, dir, func(o *Options) { o.memtable = testSpare / 2 })
	zeroed, plain := b.s.db.walFiles()
	require.Equal(t, [2]int64{0, 0}, [2]int64{zeroed, plain})
	_, err = os.Stat(filepath.Join(dir, "LEASEQ-SPARE-WAL"))
	require.True(t, os.IsNotExist(err), "spare left: %v", err)
}

// openLoggedRDB opens a transaction database with zeroed WALs, whose logs
// tell when a marked commit's record is in the file (WALProgress).
func openLoggedRDB(t *testing.T) *rdb {
	t.Helper()
	db, err := openRDB(t.TempDir(), rdbOptions{mode: txnDB, lockTimeoutMs: lockTimeoutMillis, memtable: testSpare / 2, zeroedWAL: testSpare}, familyList())
	require.NoError(t, err)
	t.Cleanup(db.close)
	return db
}

// A marked commit is told logged once, when its whole record is in the
// WAL file: RocksDB writes a record that fits its write buffer with one
// flush, at its end, which is what the early fsync relies on (a RocksDB
// that flushed a record in pieces would be told early, and this test would
// count more tellings than commits). Records beyond the mark's limit go
// unmarked; a mark that commits nothing ends with markDone; a database
// without zeroed WALs cannot tell at all.
func TestWALProgress_MarkedCommitsAreToldOnceLogged(t *testing.T) {
	t.Parallel()
	plain, _ := openTestRDB(t)
	require.False(t, plain.canWaitLogged())
	db := openLoggedRDB(t)
	require.True(t, db.canWaitLogged())

	rng := rand.New(rand.NewPCG(1, 2))
	mark := uint64(0)
	sizes := []int{1, 300, 8 << 10, 32 << 10, 33 << 10, 100 << 10, 200 << 10, 250 << 10}
	for i, size := range sizes {
		mark++
		value := make([]byte, size)
		for j := range value {
			value[j] = byte(rng.Uint32())
		}
		told := make(chan bool, 1)
		go func(m uint64) { told <- db.waitLogged(m) }(mark)
		var w writeBuf
		w.put([]byte{dbkeys.NsAvailable, byte(i)}, value)
		if i%2 == 0 {
			require.NoError(t, db.writeMarked(&w, false, mark))
		} else {
			tx := db.begin(nil)
			tx.write(&w)
			require.NoError(t, tx.commit(mark))
			tx.destroy()
		}
		require.True(t, <-told, "a record of %d bytes", size)
		require.Equal(t, mark, db.marksLogged(), "told once per commit, up to %d bytes", size)
	}

	// Too large to be marked: the commit ends untold.
	mark++
	var w writeBuf
	w.put([]byte{dbkeys.NsAvailable, 'L'}, make([]byte, 300<<10))
	require.NoError(t, db.writeMarked(&w, false, mark))
	require.False(t, db.waitLogged(mark))
	require.Equal(t, mark-1, db.marksLogged())

	// A batch that commits nothing: its waiter is released by markDone.
	mark++
	told := make(chan bool, 1)
	go func() { told <- db.waitLogged(mark) }()
	select {
	case <-told:
		t.Fatal("told before the mark ended")
	case <-time.After(20 * time.Millisecond):
	}
	db.markDone(mark)
	require.False(t, <-told)
}

// newestLog returns the newest WAL file in dir and its bytes.
func newestLog(t *testing.T, dir string) (string, []byte) {
	t.Helper()
	logs, err := walFiles(dir)
	require.NoError(t, err)
	require.NotEmpty(t, logs)
	log := logs[len(logs)-1]
	wal, err := os.ReadFile(log)
	require.NoError(t, err)
	return log, wal
}

// tearNewestLog clears the last 8 bytes of the newest log's records in
// dir, as a crash mid-write over zeros leaves them, and returns that log
// and its bytes as torn.
func tearNewestLog(t *testing.T, dir string) (string, []byte) {
	t.Helper()
	log, wal := newestLog(t, dir)
	end := recordsEnd(wal)
	clear(wal[end-8 : end]) // the last record's end never reached the disk
	require.NoError(t, os.WriteFile(log, wal, 0o600))
	return log, wal
}

// Two crashes mid-write in a row: the store opened past the first torn
// record is torn again in its own newest log, and opens again.
func TestZeroedWAL_TornTwice(t *testing.T) {
	t.Parallel()
	b := setup(t, zeroedWALOptions)
	enqueueOneByOne(b, "q", 100, 100)
	first := copyDir(t, b.dir)
	tearNewestLog(t, first)

	c := setupDir(t, first, zeroedWALOptions)
	require.Equal(t, int64(99), c.stats("q", at(time.Second)).Ready)
	// The open cut the torn record off: no log of the directory holds a
	// bad record now, whether or not RocksDB has deleted the old log.
	logs, err := filepath.Glob(filepath.Join(first, "*.log"))
	require.NoError(t, err)
	for _, l := range logs {
		wal, err := os.ReadFile(l)
		require.NoError(t, err)
		bad, _ := scanWAL(wal)
		require.Equal(t, int64(-1), bad, "%s still holds a bad record", l)
	}
	enqueueOneByOne(c, "q", 50, 100)
	second := copyDir(t, first)
	tearNewestLog(t, second)

	d := setupDir(t, second, zeroedWALOptions)
	require.Equal(t, int64(148), d.stats("q", at(time.Second)).Ready)
}

// A log torn at its end (a plain log, not over zeros: RocksDB accepts the
// tear as it is) and then, after a reopen, the newest log torn over
// zeros: the store opens again.
func TestZeroedWAL_TornPlainThenZeroed(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *Options) { o.Sync = SyncNone })
	enqueueOneByOne(b, "q", 100, 100)
	first := copyDir(t, b.dir)
	last, wal := newestLog(t, first)
	require.NoError(t, os.WriteFile(last, wal[:len(wal)-8], 0o600)) // the last record's end never reached the disk

	c := setupDir(t, first, zeroedWALOptions)
	require.Equal(t, int64(99), c.stats("q", at(time.Second)).Ready)
	enqueueOneByOne(c, "q", 50, 100)
	second := copyDir(t, first)
	tearNewestLog(t, second)

	d := setupDir(t, second, zeroedWALOptions)
	require.Equal(t, int64(148), d.stats("q", at(time.Second)).Ready)
}
