package rocksstore

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// A crash after each batch of the move (chunk of one key): each state
// opens to what the format 1 build read, leaves every key in one family,
// and leaseq check either checks it or says it is part way.
// (Written by a review of the format's life across versions, session 71, which
// found these states kept.)
func TestMigrate_CrashAfterEveryMoveBatch(t *testing.T) {
	defer func(c, f int) { migrateChunk, migrateFail = c, f }(migrateChunk, migrateFail)
	migrateChunk = 1
	for _, fail := range []int{1, 2, 6, 7, 20, 37, 38} {
		migrateFail = fail
		dir := format1DB(t)
		_, err := Open(dir, testOptions(t))
		require.ErrorContains(t, err, "stopped after")
		keys := familyKeys(t, dir)
		total := 0
		for _, n := range keys {
			total += n
		}
		require.Equal(t, 39, total, "fail %d: every key in exactly one place: %v", fail, keys)
		require.Equal(t, 39-fail, keys[defaultFamily], "fail %d", fail)
		_, err = CheckDir(context.Background(), dir)
		require.ErrorContains(t, err, "part way", "fail %d", fail)

		migrateFail = 0
		b := setupDir(t, dir)
		requireFormat1State(t, b.s)
		require.NoError(t, b.s.Close())
		require.Equal(t, format1Families, familyKeys(t, dir), "fail %d", fail)
		rep, err := CheckDir(context.Background(), dir)
		require.NoError(t, err)
		require.True(t, rep.OK(), "fail %d: %v", fail, rep.Violations)
		s, err := Open(dir, b.opts)
		require.NoError(t, err)
		b.s = s
	}
}

// A format 1 database whose WAL is damaged mid-file, opened with
// --recover=point-in-time as Open's error advises: the move to format 2
// must open it the same way, not refuse it again.
func TestMigrate_Format1PointInTime(t *testing.T) {
	t.Parallel()
	dir := format1DB(t)
	// Two more records in a new WAL of the format 1 database, each
	// rewriting the id sequence as it is.
	db, err := openRDB(dir, rdbOptions{mode: plainDB}, []string{defaultFamily})
	require.NoError(t, err)
	db.route(dbkeys.NsMeta, 0)
	v, ok, err := db.get(nil, dbkeys.MetaIDSeqKey())
	require.NoError(t, err)
	require.True(t, ok)
	// The first record spans two 32 KiB blocks, so that the damage in
	// its first block is seen as damage (a whole record follows in the
	// next block).
	var wb writeBuf
	for i := 0; i < 3000; i++ {
		wb.put(dbkeys.MetaIDSeqKey(), v)
	}
	require.NoError(t, db.write(&wb, true))
	require.NoError(t, db.put(dbkeys.MetaIDSeqKey(), v, true))
	db.close()
	logs, err := filepath.Glob(filepath.Join(dir, "*.log"))
	require.NoError(t, err)
	var wal string
	for _, l := range logs {
		if fi, err := os.Stat(l); err == nil && fi.Size() > 0 {
			wal = l
		}
	}
	b, err := os.ReadFile(wal)
	require.NoError(t, err)
	mid := 100 // inside the first record
	for i := 0; i < 16; i++ {
		b[mid+i] ^= 0xff
	}
	require.NoError(t, os.WriteFile(wal, b, 0o600))
	_, err = Open(dir, testOptions(t))
	require.ErrorIs(t, err, ErrWALDamaged)
	opts := testOptions(t)
	opts.RecoverPointInTime = true
	s, err := Open(dir, opts)
	require.NoError(t, err, "point-in-time recovery of a format 1 database")
	require.NoError(t, s.Close())
	rep, err := CheckDir(context.Background(), dir)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Violations)
}

// A format 1 database holding a delete mark (a kind format 1 builds never
// wrote; a hand-made state) on an empty queue: check reads it, the move
// carries it to the meta family, and Open finishes the delete.
func TestMigrate_Format1DeleteMark(t *testing.T) {
	t.Parallel()
	dir := format1DB(t)
	db, err := openRDB(dir, rdbOptions{mode: plainDB}, []string{defaultFamily})
	require.NoError(t, err)
	db.route(dbkeys.NsMeta, 0)
	cfg := recordFromConfig(storage.DefaultQueueConfig())
	require.NoError(t, db.put(dbkeys.QueueConfigKey("empty"), dbkeys.EncodeQueueConfig(cfg), true))
	require.NoError(t, db.put(dbkeys.DeletingKey("empty"), dbkeys.Marker(), true))
	db.close()
	rep, err := CheckDir(context.Background(), dir)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Violations)

	b := setupDir(t, dir)
	requireFormat1State(t, b.s)
	require.Nil(t, b.s.queue("empty"), "Open finished the delete")
	require.NoError(t, b.s.Close())
	require.Equal(t, format1Families, familyKeys(t, dir))
	s, err := Open(dir, b.opts)
	require.NoError(t, err)
	b.s = s
}
