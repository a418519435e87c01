package rocksstore

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// synced writes n items in batches of 10 with SyncAlways and closes the
// store without flushing, so the items live only in the WAL (as after a
// crash). It returns the WAL file.
func synced(t *testing.T, dir string, n int) string {
	t.Helper()
	s, err := Open(dir, Options{Sync: SyncAlways, noCloseFlush: true})
	require.NoError(t, err)
	for i := 0; i < n; i += 10 {
		items := make([]storage.EnqueueItem, 10)
		for j := range items {
			items[j] = storage.EnqueueItem{Payload: []byte(fmt.Sprintf("item %06d, some padding to fill the log", i+j))}
		}
		_, err := s.Enqueue(context.Background(), storage.EnqueueParams{Queue: "q", Items: items, Now: t0})
		require.NoError(t, err)
	}
	require.NoError(t, s.Close())
	logs, err := walFiles(dir)
	require.NoError(t, err)
	require.NotEmpty(t, logs)
	return logs[len(logs)-1]
}

// dirState maps every file under dir to a hash of its bytes.
func dirState(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	m := map[string][32]byte{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		m[p] = sha256.Sum256(b)
		return nil
	}))
	return m
}

func readyItems(t *testing.T, s *Store) int64 {
	t.Helper()
	st, err := s.Stats(context.Background(), storage.StatsParams{Queue: "q", Now: t0})
	require.NoError(t, err)
	return st[0].Ready
}

func TestRocksStore_WALDamageRefusesOpen(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	wal := synced(t, dir, 3000)
	b, err := os.ReadFile(wal)
	require.NoError(t, err)
	mid := len(b) / 2
	for i := 0; i < 16; i++ {
		b[mid+i] ^= 0xff
	}
	require.NoError(t, os.WriteFile(wal, b, 0o600))
	before := dirState(t, dir)

	// check: reports the damage, names the file, writes nothing.
	_, err = CheckDir(context.Background(), dir)
	require.ErrorIs(t, err, ErrWALDamaged)
	require.ErrorIs(t, err, storage.ErrCorrupt)
	require.ErrorContains(t, err, filepath.Base(wal))
	require.ErrorContains(t, err, "would be lost")
	require.Equal(t, before, dirState(t, dir), "check changed the database directory")

	// The default open refuses, with the same description.
	_, err = Open(dir, Options{})
	require.ErrorIs(t, err, ErrWALDamaged)
	require.ErrorContains(t, err, filepath.Base(wal))
	require.ErrorContains(t, err, "--recover=point-in-time")

	// The damage is where the scanner says: the first record that covers
	// the flipped bytes.
	d, err := walDamage(dir)
	require.NoError(t, err)
	require.NotNil(t, d)
	require.Equal(t, wal, d.File)
	require.LessOrEqual(t, d.Offset, int64(mid))
	require.Greater(t, d.Offset, int64(mid)-walBlockSize)
	require.Equal(t, int64(len(b)), d.Size)

	// Accepting the loss opens what precedes the damage.
	s, err := Open(dir, Options{RecoverPointInTime: true})
	require.NoError(t, err)
	n := readyItems(t, s)
	require.Greater(t, n, int64(0))
	require.Less(t, n, int64(3000), "writes after the damage are gone")
	require.NoError(t, s.Close())
	rep, err := CheckDir(context.Background(), dir)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Violations)
	require.Equal(t, n, int64(rep.Items))
}

func TestRocksStore_TornWALTailOpens(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	wal := synced(t, dir, 500)
	fi, err := os.Stat(wal)
	require.NoError(t, err)
	// A crash in the middle of the last write: its record is cut short.
	require.NoError(t, os.Truncate(wal, fi.Size()-20))
	d, err := walDamage(dir)
	require.NoError(t, err)
	require.Nil(t, d, "a torn tail is not damage")

	rep, err := CheckDir(context.Background(), dir)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Violations)
	s, err := Open(dir, Options{})
	require.NoError(t, err)
	n := readyItems(t, s)
	require.GreaterOrEqual(t, n, int64(490), "only the torn last batch may be missing")
	require.NoError(t, s.Close())
}

func TestRocksStore_CheckDirNeverWrites(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	synced(t, dir, 200) // in the WAL only: a writing open would flush it
	s, err := Open(filepath.Join(t.TempDir(), "unused"), Options{})
	require.NoError(t, err)
	require.NoError(t, s.Close())

	before := dirState(t, dir)
	rep, err := CheckDir(context.Background(), dir)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Violations)
	require.Equal(t, 200, rep.Items)
	require.Equal(t, before, dirState(t, dir), "check changed the database directory")

	// The database still opens normally afterwards.
	s, err = Open(dir, Options{Sync: SyncAlways})
	require.NoError(t, err)
	require.Equal(t, int64(200), readyItems(t, s))
	require.NoError(t, s.Close())
}

func TestFirstDamage(t *testing.T) {
	t.Parallel()
	// Three records in one block, built the way RocksDB writes them: each
	// a write batch, whose header comes first.
	rec := func(payload string) []byte {
		return walRecord(walFullType, append(batchRecord(1, 1, 0), payload...))
	}
	var b []byte
	for _, p := range []string{"first", "second", "third"} {
		b = append(b, rec(p)...)
	}
	_, bad := firstDamage(b)
	require.False(t, bad)

	damaged := append([]byte(nil), b...)
	damaged[len(rec("first"))+walHeaderSize] ^= 1 // a payload byte of "second"
	off, bad := firstDamage(damaged)
	require.True(t, bad, "a readable record after it in the same block makes it damage")
	require.Equal(t, int64(len(rec("first"))), off)

	torn := append([]byte(nil), b...)
	third := len(rec("first")) + len(rec("second"))
	torn[third+walHeaderSize] ^= 1 // a payload byte of "third"
	_, bad = firstDamage(torn)
	require.False(t, bad, "damage with nothing readable after it is a torn tail")

	// A readable record in a later block makes it damage.
	pad := make([]byte, walBlockSize-len(torn))
	torn = append(append(torn, pad...), rec("fourth")...)
	off, bad = firstDamage(torn)
	require.True(t, bad)
	require.Equal(t, int64(third), off)

}

// walRecord encodes one physical record of type typ.
func walRecord(typ byte, payload []byte) []byte {
	h := make([]byte, walHeaderSize, walHeaderSize+len(payload))
	h[4], h[5], h[6] = byte(len(payload)), byte(len(payload)>>8), typ
	crc := recordCRC(typ, payload)
	m := (crc>>15 | crc<<17) + 0xa282ead8
	h[0], h[1], h[2], h[3] = byte(m), byte(m>>8), byte(m>>16), byte(m>>24)
	return append(h, payload...)
}
