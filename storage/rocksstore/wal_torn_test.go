package rocksstore

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// physRecord is one physical record of a WAL file.
type physRecord struct {
	off, end int
	typ      byte
}

// physicalRecords lists the physical records of a WAL file's bytes,
// stopping at the first zero header or record that fails its checksum.
func physicalRecords(b []byte) []physRecord {
	var rs []physRecord
	for off := 0; off < len(b); {
		left := walBlockSize - off%walBlockSize
		if left < walHeaderSize {
			off += left
			continue
		}
		length, typ := walHeader(b[off:])
		n := walHeaderSize + length
		if typ == 0 || n > left || off+n > len(b) ||
			recordCRC(typ, b[off+walHeaderSize:off+n]) != unmaskCRC(binary.LittleEndian.Uint32(b[off:])) {
			return rs
		}
		rs = append(rs, physRecord{off, off + n, typ})
		off += n
	}
	return rs
}

// nextLogName names the log RocksDB would create after log.
func nextLogName(t *testing.T, log string) string {
	t.Helper()
	num, err := strconv.Atoi(strings.TrimSuffix(filepath.Base(log), ".log"))
	require.NoError(t, err)
	return filepath.Join(filepath.Dir(log), fmt.Sprintf("%06d.log", num+1))
}

// enqueuePastBlock enqueues items of 100 bytes one at a time until the
// newest log's records run past its first block, and returns how many.
func enqueuePastBlock(b *testBundle) int {
	n := 0
	for {
		enqueueOneByOne(b, "q", 1, 100)
		n++
		_, wal := newestLog(b.t, b.dir)
		if recordsEnd(wal) > walBlockSize {
			return n
		}
		require.Less(b.t, n, 1000)
	}
}

// requireCheckDir checks the database in dir read-only, as `leaseq check`
// does, and requires it consistent with items items.
func requireCheckDir(t *testing.T, dir string, items int) {
	t.Helper()
	rep, err := CheckDir(t.Context(), dir)
	require.NoError(t, err)
	require.True(t, rep.OK(), "violations: %v", rep.Violations)
	require.Equal(t, items, rep.Items)
}

// crashAcrossBlock enqueues n items until a record crosses the WAL's
// first block boundary and copies the data directory as a crash would
// leave it: crashed, its log's path and content, and the log's last two
// physical records, the first fragment ending block 0 and the one after.
func crashAcrossBlock(t *testing.T) (n int, crashed, log string, wal []byte, first, last physRecord) {
	t.Helper()
	b := setup(t, zeroedWALOptions)
	n = enqueuePastBlock(b)
	crashed, log, wal = crashCopy(t, b.dir)
	rs := physicalRecords(wal)
	first, last = rs[len(rs)-2], rs[len(rs)-1]
	require.Equal(t, byte(walFirstType), first.typ, "the last record of block 0 is a first fragment")
	return n, crashed, log, wal, first, last
}

// requireOpens requires the database in dir, after a crash, to be
// consistent with items ready items when checked read-only, opened, and
// opened again.
func requireOpens(t *testing.T, dir string, items int) {
	t.Helper()
	requireCheckDir(t, dir, items)
	c := setupDir(t, dir, zeroedWALOptions)
	require.Equal(t, int64(items), c.stats("q", at(time.Second)).Ready)
	c.reopen()
	require.Equal(t, int64(items), c.stats("q", at(time.Second)).Ready)
}

// requireTornAt requires walTornTail to find the tear of dir's log at off.
func requireTornAt(t *testing.T, dir string, off int) {
	t.Helper()
	torn, err := walTornTail(dir)
	require.NoError(t, err)
	require.NotNil(t, torn)
	require.Equal(t, int64(off), torn.Offset, "cut where the torn record starts")
}

// A record that crosses a block boundary is written as a first fragment
// at the end of one block and a last fragment at the start of the next.
// A crash before its fsync, over a zero-filled spare, can leave the first
// fragment whole on disk and zeros where the last one goes (RocksDB:
// "error in middle of record"). Nothing in the record was acknowledged,
// so Open cuts the log at the record's first fragment and replays up to
// it, as for any torn last record.
func TestOpen_TornFirstFragmentAtBlockBoundary(t *testing.T) {
	t.Parallel()
	n, crashed, log, wal, first, _ := crashAcrossBlock(t)
	require.Equal(t, walBlockSize, first.end)
	// The page that starts block 1 never reached the disk.
	clear(wal[walBlockSize:])
	require.NoError(t, os.WriteFile(log, wal, 0o600))

	requireTornAt(t, crashed, first.off)
	requireOpens(t, crashed, n-1)
}

// The same record across blocks 0 and 1, with the other page lost: the
// page that ends block 0 still holds the zeros of the spare where the
// record's first fragment goes, while the page that starts block 1
// reached the disk with its last fragment. Until the fsync, the pages of
// a file go to the disk in any order, so this is a crash mid-write too
// (RocksDB: "missing start of fragmented record"), and Open cuts the log
// where the record starts.
func TestOpen_TornRecordWithoutItsFirstFragment(t *testing.T) {
	t.Parallel()
	n, crashed, log, wal, first, last := crashAcrossBlock(t)
	require.Equal(t, byte(walLastType), last.typ)
	clear(wal[first.off:walBlockSize])
	require.NoError(t, os.WriteFile(log, wal, 0o600))

	requireTornAt(t, crashed, first.off)
	requireOpens(t, crashed, n-1)
}

// RocksDB creates the next log (here: renames the zero-filled spare) at a
// memtable switch without syncing the log before it, and the pipeline
// writes a batch before the fsync of the batch before it. So a crash can
// leave an older log ending in a torn record over zeros while a newer log
// exists, here with nothing written to it yet. Open cuts the older log at
// its tear.
func TestOpen_TornOlderLogBeforeEmptyNewerLog(t *testing.T) {
	t.Parallel()
	b := setup(t, zeroedWALOptions)
	enqueueOneByOne(b, "q", 100, 100)
	crashed, log, _ := crashCopy(t, b.dir)
	tearNewestLog(t, crashed)
	require.NoError(t, os.WriteFile(nextLogName(t, log), make([]byte, testSpare), 0o600))
	requireOpens(t, crashed, 99)
}

// As above, but the batch after the torn one reached the newer log whole.
// It was never acknowledged: its fsync would have synced the older log
// too, and made the torn record whole. Open drops it with the torn record,
// rather than replay it without the batch before it, and the database is
// consistent.
func TestOpen_TornOlderLogDropsNewerLogRecords(t *testing.T) {
	t.Parallel()
	b := setup(t, zeroedWALOptions)
	enqueueOneByOne(b, "q", 50, 100)
	crashed, log, wal := crashCopy(t, b.dir)
	rs := physicalRecords(wal)
	require.Len(t, rs, 51, "the open's write and the 50 enqueues")
	torn, after := rs[49], rs[50]
	require.Equal(t, byte(walFullType), torn.typ)
	require.Equal(t, byte(walFullType), after.typ)
	// The 50th batch went to a new log, and the second half of the 49th,
	// the last one in the older log, never reached the disk.
	newer := make([]byte, testSpare)
	copy(newer, wal[after.off:after.end])
	next := nextLogName(t, log)
	require.NoError(t, os.WriteFile(next, newer, 0o600))
	clear(wal[after.off:])
	clear(wal[(torn.off+torn.end)/2 : torn.end])
	require.NoError(t, os.WriteFile(log, wal, 0o600))

	tear, err := walTornTail(crashed)
	require.NoError(t, err)
	require.NotNil(t, tear)
	require.Equal(t, []walCut{{log, int64(torn.off)}, {next, 0}}, tear.cuts)
	requireCheckDir(t, crashed, 48)

	c := setupDir(t, crashed, zeroedWALOptions)
	require.Equal(t, int64(48), c.stats("q", at(time.Second)).Ready)
	c.check()
	if got, err := os.ReadFile(next); err == nil {
		require.Zero(t, scanLog(got).records, "the newer log still holds a record written after the tear")
	}
	c.reopen()
	require.Equal(t, int64(48), c.stats("q", at(time.Second)).Ready)
}

// An open with RecoverPointInTime replays a torn log up to the tear but
// does not cut it; the writes after it go to a new log, which RocksDB
// starts with a record of the next sequence number. Those writes were
// acknowledged: after a crash, Open keeps them. The TransactionDB keeps
// the torn log too, but the open empties it once it has replayed it
// (emptyReplayedLogs in rdb.cc), so the next Open finds no tear. A
// directory that an older leaseq left with the torn log still on disk, or
// a crash inside the open before the emptying, has the tear again: Open
// cuts only the torn log there, since the newer log continues its
// sequence numbers.
func TestOpen_TornLogEmptiedByPointInTimeRecovery(t *testing.T) {
	t.Parallel()
	b := setup(t, zeroedWALOptions)
	enqueueOneByOne(b, "q", 100, 100)
	first := copyDir(t, b.dir)
	log, torn := tearNewestLog(t, first)

	c := setupDir(t, first, zeroedWALOptions, func(o *Options) { o.RecoverPointInTime = true })
	require.Equal(t, int64(99), c.stats("q", at(time.Second)).Ready)
	enqueueOneByOne(c, "q", 20, 100)
	second := copyDir(t, first)
	logs, err := walFiles(second)
	require.NoError(t, err)
	require.Len(t, logs, 2, "RocksDB kept the torn log")
	require.Equal(t, filepath.Base(log), filepath.Base(logs[0]))
	kept, err := os.ReadFile(logs[0])
	require.NoError(t, err)
	require.Empty(t, kept, "the open emptied the log it replayed")
	tear, err := walTornTail(second)
	require.NoError(t, err)
	require.Nil(t, tear)
	requireCheckDir(t, second, 119)

	// The torn log as an older leaseq left it.
	require.NoError(t, os.WriteFile(logs[0], torn, 0o600))
	tear, err = walTornTail(second)
	require.NoError(t, err)
	require.NotNil(t, tear)
	require.Len(t, tear.cuts, 1, "only the torn log is cut")
	require.Equal(t, logs[0], tear.cuts[0].file)
	requireCheckDir(t, second, 119)

	d := setupDir(t, second, zeroedWALOptions)
	require.Equal(t, int64(119), d.stats("q", at(time.Second)).Ready)
}

// RocksDB names logs "%06llu.log": past file number 999999 the names get
// a seventh digit, and only their numbers order them (RocksDB numbers
// every log, table, MANIFEST and OPTIONS file from one counter, so a
// long-lived node gets there). The newest log, 1000000.log, torn over
// zeros next to an older, empty 999999.log (a log closed before its first
// write), is cut and replayed up to the tear.
func TestOpen_TornNewestLogSevenDigitNumber(t *testing.T) {
	t.Parallel()
	b := setup(t, zeroedWALOptions)
	enqueueOneByOne(b, "q", 100, 100)
	crashed, log, _ := crashCopy(t, b.dir)
	newest := filepath.Join(crashed, "1000000.log")
	require.NoError(t, os.Rename(log, newest))
	require.NoError(t, os.WriteFile(filepath.Join(crashed, "999999.log"), nil, 0o600))
	tearNewestLog(t, crashed)

	logs, err := walFiles(crashed)
	require.NoError(t, err)
	require.Equal(t, []string{filepath.Join(crashed, "999999.log"), newest}, logs)
	c := setupDir(t, crashed, zeroedWALOptions)
	require.Equal(t, int64(99), c.stats("q", at(time.Second)).Ready)
}

// An older log with an unreadable record that a whole record follows (in
// a later block: RocksDB's reader skips the rest of the block) is damage,
// not a tear, even with a newer log after it: Open refuses it.
func TestOpen_DamagedOlderLogRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, zeroedWALOptions)
	enqueueOneByOne(b, "q", 150, 100)
	crashed, log, wal := crashCopy(t, b.dir)
	rs := physicalRecords(wal)
	wal[rs[20].off+walHeaderSize] ^= 0xff
	require.NoError(t, os.WriteFile(log, wal, 0o600))
	require.NoError(t, os.WriteFile(nextLogName(t, log), make([]byte, testSpare), 0o600))

	tear, err := walTornTail(crashed)
	require.NoError(t, err)
	require.Nil(t, tear)
	_, err = Open(crashed, func() Options { o := testOptions(t); zeroedWALOptions(&o); return o }())
	require.ErrorIs(t, err, ErrWALDamaged)
	require.ErrorContains(t, err, filepath.Base(log))
}

// batchRecord is the payload of a write batch record: its sequence number,
// its count of entries and body bytes.
func batchRecord(seq uint64, count uint32, body int) []byte {
	p := make([]byte, walBatchHeader+body)
	binary.LittleEndian.PutUint64(p, seq)
	binary.LittleEndian.PutUint32(p[8:], count)
	for i := range body {
		p[walBatchHeader+i] = byte(i)
	}
	return p
}

// padBlock pads b with zeros to the end of its block.
func padBlock(b []byte) []byte {
	return append(b, make([]byte, walBlockSize-len(b)%walBlockSize)...)
}

// scanLog follows RocksDB's fragments: a record split across blocks is
// read whole (its sequence number from its first bytes, wherever they
// fall), a first fragment without the rest, or a last one without its
// first, is a tear where the record starts, and a whole record after
// either makes it damage. A record cut short by the file's end is the
// log's end, as for RocksDB.
func TestScanLog_Fragments(t *testing.T) {
	t.Parallel()
	// A record that ends 12 bytes before its block's end, then one split
	// so that its first fragment holds 5 bytes of the batch's header.
	one := walRecord(walFullType, batchRecord(1, 2, walBlockSize-12-walHeaderSize-walBatchHeader))
	require.Len(t, one, walBlockSize-12)
	split := batchRecord(3, 4, 100)
	wal := func() []byte {
		b := append(append([]byte(nil), one...), walRecord(walFirstType, split[:5])...)
		return append(b, walRecord(walLastType, split[5:])...)
	}
	l := scanLog(wal())
	require.Equal(t, walLog{bad: -1, records: 2, firstSeq: 1, nextSeq: 7}, l)

	// The last fragment lost: torn where the split record starts.
	torn := wal()
	clear(torn[walBlockSize:])
	l = scanLog(padBlock(torn))
	require.Equal(t, int64(len(one)), l.bad)
	require.False(t, l.goodAfter)
	require.Equal(t, uint64(3), l.nextSeq)

	// The first fragment lost, the last one on disk.
	orphan := wal()
	clear(orphan[len(one):walBlockSize])
	l = scanLog(padBlock(orphan))
	require.Equal(t, int64(len(one)), l.bad)
	require.False(t, l.goodAfter)

	// A whole record after the orphan: damage.
	l = scanLog(append(orphan, walRecord(walFullType, batchRecord(7, 1, 10))...))
	require.Equal(t, int64(len(one)), l.bad)
	require.True(t, l.goodAfter)

	// Cut short by the file's end, in either fragment: the log's end.
	whole := walLog{bad: -1, records: 1, firstSeq: 1, nextSeq: 3}
	require.Equal(t, whole, scanLog(wal()[:len(wal())-3]))
	require.Equal(t, whole, scanLog(wal()[:walBlockSize-3]))
}

// walTornTail drops the records of newer logs that follow a tear, keeps a
// newer log whose sequence numbers continue from the last whole record
// before it, and leaves everything else to be refused.
func TestWALTornTail_NewerLogs(t *testing.T) {
	t.Parallel()
	// log holds batches of one entry with the sequence numbers seqs, and
	// then, if torn, a batch whose record never reached the disk whole.
	log := func(torn bool, seqs ...uint64) []byte {
		var b []byte
		for _, s := range seqs {
			b = append(b, walRecord(walFullType, batchRecord(s, 1, 10))...)
		}
		if torn {
			r := walRecord(walFullType, batchRecord(99, 1, 10))
			b = append(b, r[:len(r)-4]...)
		}
		return padBlock(b)
	}
	rec := int64(len(walRecord(walFullType, batchRecord(0, 1, 10))))
	damaged := append(log(false, 7), log(false, 8)...)
	damaged[walHeaderSize] ^= 1
	for _, tc := range []struct {
		name string
		logs [][]byte // 000010.log on
		cuts []walCut // nil: refused
	}{
		{"newest torn", [][]byte{log(true, 1, 2)}, []walCut{{"000010.log", 2 * rec}}},
		{"newer log of zeros", [][]byte{log(true, 1, 2), log(false)}, []walCut{{"000010.log", 2 * rec}}},
		{"newer log written after the tear", [][]byte{log(true, 1, 2), log(false, 4, 5)},
			[]walCut{{"000010.log", 2 * rec}, {"000011.log", 0}}},
		{"newer logs written after the tear, one torn", [][]byte{log(true, 1, 2), log(false, 4), log(true)},
			[]walCut{{"000010.log", 2 * rec}, {"000011.log", 0}, {"000012.log", 0}}},
		{"newer log continuing after a recovery", [][]byte{log(true, 1, 2), log(false, 3, 4)},
			[]walCut{{"000010.log", 2 * rec}}},
		{"continued, then torn again", [][]byte{log(true, 1, 2), log(false, 3, 4), log(true, 5)},
			[]walCut{{"000010.log", 2 * rec}, {"000012.log", rec}}},
		{"continued after a log written after the tear", [][]byte{log(true, 1, 2), log(false, 4), log(false, 3)},
			[]walCut{{"000010.log", 2 * rec}, {"000011.log", 0}}},
		{"newer log before the tear's sequence numbers", [][]byte{log(true, 1, 2), log(false, 2)}, nil},
		{"damaged newer log", [][]byte{log(true, 1, 2), damaged}, nil},
		{"nothing whole before the tear", [][]byte{log(true), log(false, 7)}, nil},
		{"nothing whole before the tear, newer log empty", [][]byte{log(true), nil}, []walCut{{"000010.log", 0}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for i, b := range tc.logs {
				require.NoError(t, os.WriteFile(filepath.Join(dir, fmt.Sprintf("%06d.log", 10+i)), b, 0o600))
			}
			tear, err := walTornTail(dir)
			require.NoError(t, err)
			if tc.cuts == nil {
				require.Nil(t, tear)
				return
			}
			require.NotNil(t, tear)
			for i := range tear.cuts {
				tear.cuts[i].file = filepath.Base(tear.cuts[i].file)
			}
			require.Equal(t, tc.cuts, tear.cuts)
			require.Equal(t, filepath.Join(dir, "000010.log"), tear.File)
			require.Equal(t, tc.cuts[0].at, tear.Offset)
		})
	}
}

// Logs are ordered by number, not by name.
func TestWALFiles_NumericOrder(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, name := range []string{"1000000.log", "999999.log", "000012.log", "LOG", "notes.log"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), nil, 0o600))
	}
	logs, err := walFiles(dir)
	require.NoError(t, err)
	for i := range logs {
		logs[i] = filepath.Base(logs[i])
	}
	require.Equal(t, []string{"000012.log", "999999.log", "1000000.log"}, logs)
}
