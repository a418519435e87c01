package rocksstore

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// Found by review (session 71): a WAL record that fails its checksum with
// a whole, synced record after it in the same 32 KiB block is damage, not
// a tear: the record after it was acknowledged. scanLog skipped the rest of
// the block after a checksum failure, as RocksDB's reader does, so it never
// saw the whole record, took the damage for a torn tail, and Open cut both
// records off without being asked to (RecoverPointInTime unset): 20
// acknowledged items were gone. Open must refuse with ErrWALDamaged.
func TestWAL_DamageBeforeWholeRecordInBlockIsNotATear(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	wal := synced(t, dir, 20) // two synced Enqueue calls of 10 items
	b, err := os.ReadFile(wal)
	require.NoError(t, err)
	var offs []int
	for off := 0; off+walHeaderSize <= len(b); {
		n, typ := walHeader(b[off:])
		if typ == walZeroType && n == 0 {
			break
		}
		require.Equal(t, byte(walFullType), typ)
		offs = append(offs, off)
		off += walHeaderSize + n
	}
	require.GreaterOrEqual(t, len(offs), 2)
	first := offs[len(offs)-2] // the first Enqueue's record
	b[first+walHeaderSize+walBatchHeader+5] ^= 0xff
	require.NoError(t, os.WriteFile(wal, b, 0o600))

	s, err := Open(dir, Options{})
	if err == nil {
		st, _ := s.Stats(context.Background(), storage.StatsParams{Now: t0})
		require.NoError(t, s.Close())
		t.Fatalf("opened without the 20 acknowledged items (queues: %v): damage taken for a torn tail", st)
	}
	require.ErrorIs(t, err, ErrWALDamaged)
}

// scanLog looks for a whole record in the rest of a block after a record
// that fails its checksum or runs past its block: one there makes the log
// damaged, while zeros, or a record cut short by the file's end, after the
// bad record leave it a tear.
func TestWAL_ScanLogResyncsInBlock(t *testing.T) {
	t.Parallel()
	a := walRecord(walFullType, batchRecord(1, 1, 40))
	bRec := walRecord(walFullType, batchRecord(2, 1, 40))
	c := walRecord(walFullType, batchRecord(3, 1, 40))
	log := func(recs ...[]byte) []byte {
		var b []byte
		for _, r := range recs {
			b = append(b, r...)
		}
		return b
	}
	atB, atC := len(a), len(a)+len(bRec)

	damaged := func(name string, wal []byte, bad int) {
		t.Helper()
		l := scanLog(wal)
		require.Equal(t, int64(bad), l.bad, name)
		require.True(t, l.goodAfter, "%s: a whole record follows the bad one", name)
	}
	torn := func(name string, wal []byte, bad int) {
		t.Helper()
		l := scanLog(wal)
		require.Equal(t, int64(bad), l.bad, name)
		require.False(t, l.goodAfter, "%s: nothing whole follows the bad one", name)
	}

	// A payload byte of b flipped, c after it, zeros to the block's end.
	w := padBlock(log(a, bRec, c))
	w[atB+walHeaderSize+walBatchHeader+3] ^= 0xff
	damaged("checksum", w, atB)
	damaged("checksum, no zeros", w[:atC+len(c)], atB)

	// b's length damaged: longer than its block, or shorter.
	w = padBlock(log(a, bRec, c))
	w[atB+4], w[atB+5] = 0xff, 0xff
	damaged("length past the block", w, atB)
	w = padBlock(log(a, bRec, c))
	w[atB+4] -= 5
	damaged("length short", w, atB)

	// A record split across blocks after the damage: its first fragment
	// fills the block, its last one starts the next.
	split := batchRecord(4, 1, walBlockSize)
	first := walRecord(walFirstType, split[:walBlockSize-atC-walHeaderSize])
	w = log(a, bRec, first, walRecord(walLastType, split[len(first)-walHeaderSize:]))
	require.Len(t, w[:walBlockSize], atC+len(first))
	w[atB+walHeaderSize+walBatchHeader+3] ^= 0xff
	damaged("split record after", padBlock(w), atB)

	// The last record torn over zeros (its end never reached the disk),
	// or flipped, with zeros after it; or one before a record cut short by
	// the file's end.
	w = padBlock(log(a, bRec, c))
	clear(w[atC+len(c)-8 : atC+len(c)])
	torn("torn over zeros", w, atC)
	w = padBlock(log(a, bRec, c))
	w[atC+walHeaderSize] ^= 1
	torn("last record flipped", w, atC)
	w = log(a, bRec, c)
	w[atB+walHeaderSize] ^= 1
	torn("before a record cut short", w[:len(w)-3], atB)
}
