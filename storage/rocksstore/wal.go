package rocksstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/leaseq/leaseq/storage"
)

// WAL damage. RocksDB's default recovery (point-in-time) stops replaying
// the WAL at the first record that fails its checksum and opens with
// everything after it silently gone, acknowledged writes included. Open
// uses TolerateCorruptedTailRecords instead, which accepts only a torn
// last record (a crash mid-write) and fails on damage before it; the error
// then names the file and the byte range that would be lost, found by
// walDamage below, and Options.RecoverPointInTime accepts the loss.
//
// scanLog reads RocksDB's log format (db/log_format.h and db/log_reader.cc
// of 7.8.3, documented in RocksDB's wiki "Write Ahead Log File Format"):
// 32 KiB blocks of physical records, each with a 7-byte header (masked
// CRC32C of type and payload, 2 bytes little-endian length, 1 byte type);
// a block tail shorter than a header is padding. A logical record (one
// write batch) that fits the rest of its block is one kFullType record;
// a longer one is a kFirstType record at the end of its block, kMiddleType
// records filling whole blocks, and a kLastType record. scanLog follows
// the reader of TolerateCorruptedTailRecords: what it stops at, the
// fragments it expects, and what it reads as the log's end. It only
// locates damage and tears: RocksDB decides whether a log is usable.

const (
	walBlockSize  = 32 << 10
	walHeaderSize = 7
	// A recyclable record's header also holds the log's number. leaseq
	// never recycles logs (RocksDB 7.8.3 turns recycling off under
	// TolerateCorruptedTailRecords and point-in-time recovery alike); the
	// types are read so that such a record is not taken for damage.
	walRecyclableHeaderSize = 11
	// The types of RocksDB 7.8.3's physical records.
	walZeroType            = 0 // preallocated space, zeros
	walFullType            = 1
	walFirstType           = 2
	walMiddleType          = 3
	walLastType            = 4
	walRecyclableFullType  = 5
	walRecyclableLastType  = 8
	walSetCompressionType  = 9
	walRecyclableTypeDelta = walRecyclableFullType - walFullType
	// walBatchHeader is the size of a write batch's header: its first
	// sequence number (8 bytes) and its count of entries (4 bytes), both
	// little-endian (WriteBatchInternal::kHeader).
	walBatchHeader = 12
)

// ErrWALDamaged marks an Open or CheckDir refused because a WAL record
// before the log's end is unreadable (errors.Is also matches
// storage.ErrCorrupt).
var ErrWALDamaged = fmt.Errorf("%w: write-ahead log damaged", storage.ErrCorrupt)

// WALDamage describes the first damaged record of a WAL file.
type WALDamage struct {
	File   string // path of the .log file
	Offset int64  // where the first unreadable record starts
	Size   int64  // the file's size: Size-Offset bytes would be lost
}

func (d WALDamage) String() string {
	return fmt.Sprintf("%s: the record at byte %d fails its checksum; bytes %d-%d (%d bytes of later writes) would be lost",
		d.File, d.Offset, d.Offset, d.Size, d.Size-d.Offset)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// unmaskCRC undoes RocksDB's crc32c::Mask.
func unmaskCRC(m uint32) uint32 {
	r := m - 0xa282ead8
	return r>>17 | r<<15
}

// recordCRC is the CRC32C of a record's type byte and payload.
func recordCRC(typ byte, payload []byte) uint32 {
	return crc32.Update(crc32.Checksum([]byte{typ}, castagnoli), castagnoli, payload)
}

// walFiles returns the WAL files in dir, oldest first. RocksDB names them
// by number, "%06llu.log", so past 999999 the names grow a digit and only
// the number orders them. Other names ending in .log are not RocksDB's
// logs, and RocksDB ignores them too.
func walFiles(dir string) ([]string, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil {
		return nil, err
	}
	type log struct {
		path string
		num  uint64
	}
	logs := make([]log, 0, len(paths))
	for _, p := range paths {
		num, err := strconv.ParseUint(strings.TrimSuffix(filepath.Base(p), ".log"), 10, 64)
		if err == nil {
			logs = append(logs, log{p, num})
		}
	}
	sort.Slice(logs, func(i, j int) bool { return logs[i].num < logs[j].num })
	files := make([]string, len(logs))
	for i, l := range logs {
		files[i] = l.path
	}
	return files, nil
}

// walDamage returns the first WAL file in dir (oldest first) that has an
// unreadable record followed by a readable one, or nil when every file is
// whole or only its tail is torn.
func walDamage(dir string) (*WALDamage, error) {
	files, err := walFiles(dir)
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if off, ok := firstDamage(b); ok {
			return &WALDamage{File: f, Offset: off, Size: int64(len(b))}, nil
		}
	}
	return nil, nil
}

// firstDamage scans one WAL file's bytes and reports the offset of the
// first unreadable record if a readable one follows it somewhere later.
func firstDamage(b []byte) (int64, bool) {
	if bad, goodAfter := scanWAL(b); goodAfter {
		return bad, true
	}
	return 0, false
}

// scanWAL returns where the first unreadable record of a WAL file starts
// (-1: none) and whether a whole record follows it.
func scanWAL(b []byte) (bad int64, goodAfter bool) {
	l := scanLog(b)
	return l.bad, l.goodAfter
}

// walLog is what scanLog finds in one log file.
type walLog struct {
	// bad is where the first record that TolerateCorruptedTailRecords
	// fails on starts (-1: none): the end of the last whole record before
	// it, so a record whose first fragment is whole and whose next
	// fragment is not counts from its first fragment.
	bad int64
	// goodAfter: a whole record follows bad. Without one the log ends in
	// a tear; with one it is damaged.
	goodAfter bool
	// records counts the whole records before bad; firstSeq is the
	// sequence number of the first, nextSeq the one after the last (its
	// sequence number plus its count).
	records           int
	firstSeq, nextSeq uint64
}

// scanLog reads one WAL file's bytes as RocksDB 7.8.3's log reader does
// under TolerateCorruptedTailRecords (log::Reader::ReadRecord), and goes
// on past the first failure to see whether a whole record follows it.
//
// The reader fails on a record that fails its checksum, a length that runs
// past its block, a type it does not know, a kMiddleType or kLastType
// fragment with no kFirstType before it, and zeros or a new record where
// a started record's next fragment should be. It skips the rest of a block
// at zeros between records (preallocated space), and reads a record or
// header cut short by the file's end as the log's end, as it does a file
// that ends inside a fragmented record.
//
// After a record that fails its checksum or runs past its block, RocksDB's
// reader drops the rest of the block, since the length itself may be what
// is damaged. scanLog does not: it looks for the next record in the rest
// of the block (resync) and goes on from there, since a whole record there
// may have been acknowledged, and a log with one after the damage is
// damaged, not torn. Without a record there it goes on at the next block.
// Only whether a whole record follows the failure depends on this; what is
// read before it does not.
func scanLog(b []byte) walLog {
	l := walLog{bad: -1}
	var (
		end       int // the end of the last whole record before l.bad
		inRecord  bool
		fragBytes int    // payload bytes of the started record so far
		head      []byte // its first walBatchHeader bytes
		headBuf   [walBatchHeader]byte
	)
	fail := func() {
		if l.bad < 0 {
			l.bad = int64(end)
		}
		inRecord = false
	}
	whole := func(recordEnd int, batch []byte) {
		switch {
		case l.bad >= 0:
			l.goodAfter = true
		case len(batch) < walBatchHeader:
			fail() // RocksDB: "log record too small"
		default:
			seq := binary.LittleEndian.Uint64(batch)
			if l.records == 0 {
				l.firstSeq = seq
			}
			l.records++
			l.nextSeq = seq + uint64(binary.LittleEndian.Uint32(batch[8:]))
			end = recordEnd
		}
	}
	// Once a whole record follows the first failure nothing later changes
	// the answer, so a log damaged throughout is not searched to its end.
	for off := 0; off < len(b) && !l.goodAfter; {
		blockEnd := (off/walBlockSize + 1) * walBlockSize
		// The reader reads a block at a time; a short read (the file's
		// last, partial block) sets its end of file.
		atEOF := blockEnd > len(b)
		left := min(blockEnd, len(b)) - off
		if left < walHeaderSize {
			if atEOF {
				break // a header cut short by the file's end
			}
			off = blockEnd // block padding
			continue
		}
		length, typ := walHeader(b[off:])
		hs := walHeaderSize
		kind := typ
		if typ >= walRecyclableFullType && typ <= walRecyclableLastType {
			hs, kind = walRecyclableHeaderSize, typ-walRecyclableTypeDelta
			if left < hs {
				if atEOF {
					break
				}
				off = blockEnd
				continue
			}
		}
		n := hs + length
		switch {
		case typ == walZeroType && length == 0:
			// Zeros: the reader drops the rest of the block, and fails
			// only if a started record's next fragment should be there.
			if inRecord {
				fail()
			}
			off = blockEnd
			continue
		case n > left && atEOF:
			// A record cut short by the file's end: the log ends here.
			off = len(b)
			continue
		case n > left:
			fail()
			off = resync(b, off+walHeaderSize, blockEnd)
			continue
		}
		if !walRecordOK(b[off : off+n]) {
			fail()
			off = resync(b, off+walHeaderSize, blockEnd)
			continue
		}
		payload := b[off+hs : off+n]
		off += n
		switch kind {
		case walFullType:
			if inRecord && fragBytes > 0 {
				fail() // "partial record without end"
			}
			inRecord = false
			whole(off, payload)
		case walFirstType:
			if inRecord && fragBytes > 0 {
				fail()
			}
			inRecord, fragBytes = true, len(payload)
			head = append(headBuf[:0], payload[:min(len(payload), walBatchHeader)]...)
		case walMiddleType, walLastType:
			if !inRecord {
				fail() // "missing start of fragmented record"
				continue
			}
			fragBytes += len(payload)
			if len(head) < walBatchHeader {
				head = append(head, payload[:min(len(payload), walBatchHeader-len(head))]...)
			}
			if kind == walLastType {
				inRecord = false
				whole(off, head)
			}
		case walSetCompressionType:
			// Only at a log's start, and only with WAL compression, which
			// leaseq does not turn on.
			if l.bad < 0 && !inRecord {
				end = off
			}
		default:
			fail() // "unknown record type"
		}
	}
	return l
}

// walRecordOK reports whether rec, one physical record with its header,
// passes its checksum: the CRC32C of its type byte, a recyclable record's
// log number, and its payload.
func walRecordOK(rec []byte) bool {
	crc := crc32.Checksum(rec[walHeaderSize-1:], castagnoli)
	return crc == unmaskCRC(binary.LittleEndian.Uint32(rec))
}

// resync returns where, in b[from:blockEnd], the first physical record
// starts that passes its checksum and could follow a record in the middle
// of a block, or blockEnd when none does. RocksDB's writer starts every
// fragment after a record's first at a block's start, so in the middle of
// a block only a kFullType record, holding at least a write batch's
// header, or a kFirstType one, filling the block to its end, can start
// (or their recyclable forms). Zeros are neither, so a tear over zeros
// finds nothing. A record at a random offset passes its checksum about
// once in 2^32 tries; one that a damaged record's payload happens to hold
// (an item that is itself a copy of a WAL record) can make a tear look
// like damage, which refuses the open rather than lose writes.
func resync(b []byte, from, blockEnd int) int {
	end := min(blockEnd, len(b))
	for off := from; off+walHeaderSize <= end; off++ {
		length, typ := walHeader(b[off:])
		hs, kind := walHeaderSize, typ
		if typ >= walRecyclableFullType && typ <= walRecyclableLastType {
			hs, kind = walRecyclableHeaderSize, typ-walRecyclableTypeDelta
		}
		n := hs + length
		full := kind == walFullType && length >= walBatchHeader && off+n <= end
		first := kind == walFirstType && off+n == blockEnd && blockEnd <= len(b)
		if (full || first) && walRecordOK(b[off:off+n]) {
			return off
		}
	}
	return blockEnd
}

// walTear is what a read-write Open cuts off the WAL before it replays up
// to a tear: the first torn record (for the log message) and every cut.
type walTear struct {
	WALDamage
	// cuts lists the files to truncate and where, oldest first: each torn
	// log at its tear, and every newer log written after a tear in full.
	cuts []walCut
}

type walCut struct {
	file string
	at   int64
}

// walTornTail finds the records torn by a crash mid-write in the WAL
// files of dir: a log in which TolerateCorruptedTailRecords fails on a
// record that no whole record follows. A crash leaves one where the file
// ends, which RocksDB accepts as the log's end, but a log made over zeros
// (zerowal.h) has zeros after it instead, and it is not only the newest
// log that can end so: RocksDB starts a new log at a memtable switch
// without syncing the one before it, and the pipeline writes a batch
// before the fsync of the batch before it, so a crash can tear the last
// record of a log while newer logs hold records written after it, or only
// zeros. It returns nil when the WAL holds no tear, or damage: a whole
// record after an unreadable one in any log.
//
// Nothing written after a torn record was acknowledged: a batch is
// answered only after an fsync that began after its record was written,
// and that fsync (SyncWAL) syncs every live log up to the newest, so it
// would have made the torn record whole. That holds for the logs one
// opening of the database wrote, and those are the only logs with
// records: a read-write open empties every log it replayed before the
// store writes anything (emptyReplayedLogs in rdb.cc). The TransactionDB
// would keep them, and one whose last record the open replayed whole from
// the page cache could be torn on the disk after a power failure, which
// would make this rule drop the acknowledged writes of every newer log
// (TestOpen_ReplayedLogTornOnDiskKeepsNewerAckedWrites). So the records
// of newer logs that follow a tear are dropped with it, as point-in-time
// recovery drops them (replaying them past the hole would apply batches
// without the one they were built on). Unless they continue the sequence
// numbers where the last whole record before the tear left them: then
// RocksDB wrote them after a recovery that stopped at the tear and kept
// its log (an open with Options.RecoverPointInTime, whose DB::Open writes
// an empty batch of the next sequence number to its new log for this very
// distinction), and they stay. Such a log is emptied by that open now, so
// this is met only after a crash inside the open, before the emptying
// (nothing in the newer log was acknowledged yet), or in a directory an
// older leaseq wrote. A newer log whose records start before that
// sequence number is not a crash's doing, and one after a tear with no
// whole record before it anywhere cannot be told apart from one written
// after a recovery: either leaves the WAL to be refused. One case this
// cannot see, in a directory an older leaseq wrote: a log left torn by a
// point-in-time recovery that is still on disk after RocksDB deleted the
// newer log continuing it (a crash inside its purge of obsolete files,
// between the two deletes) makes the next tear's log look written after
// it, and it is dropped although its records may have been acknowledged.
func walTornTail(dir string) (*walTear, error) {
	files, err := walFiles(dir)
	if err != nil || len(files) == 0 {
		return nil, err
	}
	var (
		tear    *walTear
		pending bool   // a tear that no newer log has continued yet
		next    uint64 // the sequence number after the last whole record
		known   bool   // next is known: a whole record was read
	)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		l := scanLog(b)
		if l.goodAfter {
			return nil, nil
		}
		if pending {
			switch {
			case l.records > 0 && known && l.firstSeq == next:
				pending = false // written after a recovery from the tear
			case l.records > 0 && !(known && l.firstSeq > next):
				return nil, nil
			default:
				// Written after the torn record by the same process, or
				// no record at all: nothing in it was acknowledged.
				if l.records > 0 || l.bad >= 0 {
					tear.cuts = append(tear.cuts, walCut{file: f, at: 0})
				}
				continue
			}
		}
		if l.records > 0 {
			next, known = l.nextSeq, true
		}
		if l.bad >= 0 {
			if tear == nil {
				tear = &walTear{WALDamage: WALDamage{File: f, Offset: l.bad, Size: int64(len(b))}}
			}
			tear.cuts = append(tear.cuts, walCut{file: f, at: l.bad})
			pending = true
		}
	}
	return tear, nil
}

// walHeader decodes the payload length and type of the physical record
// header at the start of b (at least walHeaderSize bytes).
func walHeader(b []byte) (length int, typ byte) {
	return int(b[4]) | int(b[5])<<8, b[6]
}

// openRDBPastTornTail opens the database as openRDB does. If that fails
// on a WAL whose only damage is records torn by a crash, with nothing
// whole after them (walTornTail), it opens again past the tear and
// returns the first torn record too. Damage anywhere else still fails.
//
// A read-write open first cuts the torn records, and every newer log's
// records written after them, off the logs (cutTornTail), then opens as
// before, so every log ends with its last whole record, and RocksDB then
// replays them whole; the open empties them after that (walTornTail). A
// log left torn would make the next crash's torn tail, in the log the
// reopened database writes, fail the next open on the older tear again
// (TestZeroedWAL_TornTwice; found by the crash test). A read-only open
// (CheckDir) changes nothing on disk and replays to the tear with
// point-in-time recovery instead, which stops at the same place and drops
// the same newer logs (it keeps a newer log only where its sequence
// numbers continue from the tear, as walTornTail does).
func openRDBPastTornTail(dir string, o rdbOptions, names []string) (*rdb, *WALDamage, error) {
	db, err := openRDB(dir, o, names)
	if err == nil || o.pointInTime || !errors.Is(translate("", err), storage.ErrCorrupt) {
		return db, nil, err
	}
	tear, _ := walTornTail(dir)
	if tear == nil {
		return nil, nil, err
	}
	if o.mode == readOnly {
		o.pointInTime = true
	} else if err := cutTornTail(tear); err != nil {
		return nil, &tear.WALDamage, err
	}
	db, err = openRDB(dir, o, names)
	return db, &tear.WALDamage, err
}

// cutTornTail truncates the logs at their tears, and the newer logs
// written after a tear to nothing, durably. Nothing it drops was
// acknowledged (see walTornTail), and point-in-time recovery would not
// replay it either. The newest log is cut first: a crash part way leaves
// every tear it has not cut yet with the same newer logs after it, so the
// next open cuts the rest. Cut oldest first, a torn log could end whole
// while a newer log still held records written after its tear, and
// RocksDB would replay them past the hole.
func cutTornTail(tear *walTear) error {
	for i := len(tear.cuts) - 1; i >= 0; i-- {
		if err := truncateSynced(tear.cuts[i].file, tear.cuts[i].at); err != nil {
			return fmt.Errorf("rocksstore: cut the torn write-ahead log records off %s: %w", tear.cuts[i].file, err)
		}
	}
	return nil
}

// truncateSynced truncates the file at path to size and fsyncs it.
func truncateSynced(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// walOpenError turns a failed Open under TolerateCorruptedTailRecords into
// a clear refusal when the WAL is damaged; other errors pass unchanged.
func walOpenError(dir string, openErr error) error {
	if !errors.Is(openErr, storage.ErrCorrupt) {
		return openErr
	}
	d, err := walDamage(dir)
	if err != nil || d == nil {
		return fmt.Errorf("%w (%v); if the write-ahead log is at fault, `leaseq serve --recover=point-in-time` opens the database without what follows the damage",
			openErr, errOr(err, "no damaged .log record found"))
	}
	return fmt.Errorf("rocksstore: open %s: %w: %s; refusing to open, since acknowledged writes would be lost silently. "+
		"Keep a copy of the directory, then `leaseq serve --recover=point-in-time` opens the database without them",
		dir, ErrWALDamaged, d)
}

func errOr(err error, s string) string {
	if err != nil {
		return err.Error()
	}
	return s
}
