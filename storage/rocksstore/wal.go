package rocksstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sort"

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
// walDamage reads RocksDB's log format (db/log_format.h, documented in
// RocksDB's wiki "Write Ahead Log File Format"): 32 KiB blocks of physical
// records, each with a 7-byte header (masked CRC32C of type and payload, 2
// bytes little-endian length, 1 byte type); a block tail shorter than a
// header is zero padding. It only locates damage for the message: RocksDB
// decides whether the log is usable.

const (
	walBlockSize  = 32 << 10
	walHeaderSize = 7
	walMaxType    = 10 // highest physical record type RocksDB 7.x-8.x writes
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

// walDamage returns the first WAL file in dir (oldest first) that has an
// unreadable record followed by a readable one, or nil when every file is
// whole or only its tail is torn.
func walDamage(dir string) (*WALDamage, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files) // zero-padded numbers: oldest first
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
// first bad physical record if a good one follows it somewhere later.
func firstDamage(b []byte) (int64, bool) {
	if bad, goodAfter := scanWAL(b); goodAfter {
		return bad, true
	}
	return 0, false
}

// scanWAL returns the offset of the first bad physical record of a WAL
// file (-1: none) and whether a good one follows it.
func scanWAL(b []byte) (bad int64, goodAfter bool) {
	bad = -1
	for off := 0; off < len(b); {
		blockLeft := walBlockSize - off%walBlockSize
		if blockLeft < walHeaderSize {
			off += blockLeft
			continue
		}
		good, n := walRecordAt(b, off, blockLeft)
		switch {
		case good:
			if bad >= 0 {
				return bad, true
			}
			off += n
		case n == 0:
			// Zero padding or preallocated space: this block is done.
			off += blockLeft
		default:
			if bad < 0 {
				bad = int64(off)
			}
			// Resynchronize at the next block, as RocksDB's reader does.
			off += blockLeft
		}
	}
	return bad, false
}

// walRecordAt checks the physical record at off. It returns whether its
// checksum holds and its length (header included); n == 0 marks zero
// padding.
func walRecordAt(b []byte, off, blockLeft int) (good bool, n int) {
	if len(b)-off < walHeaderSize {
		return false, len(b) - off
	}
	length, typ := walHeader(b[off:])
	if typ == 0 && length == 0 {
		return false, 0
	}
	n = walHeaderSize + length
	if typ > walMaxType || n > blockLeft || off+n > len(b) {
		return false, min(blockLeft, len(b)-off)
	}
	crc := recordCRC(typ, b[off+walHeaderSize:off+n])
	want := unmaskCRC(binary.LittleEndian.Uint32(b[off:]))
	return crc == want, n
}

// walTornTail reports the torn record at the end of the newest WAL file in
// dir: a record that fails its checksum with no readable record after it,
// in a WAL followed by no other, and every older WAL whole or ending in a
// record cut short by its file's end (endsCutShort). A crash mid
// write leaves one; RocksDB's TolerateCorruptedTailRecords accepts it only
// where the file ends with it, and a log made over zeros (zerowal.h) ends
// with zeros after it instead. Nothing in a torn record was acknowledged
// (its write had not returned), so point-in-time recovery, which stops
// there, loses nothing that TolerateCorruptedTailRecords would keep.
func walTornTail(dir string) (*WALDamage, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil || len(files) == 0 {
		return nil, err
	}
	sort.Strings(files) // zero-padded numbers: oldest first
	var torn *WALDamage
	for i, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		off, goodAfter := scanWAL(b)
		if goodAfter {
			return nil, nil
		}
		if off >= 0 {
			if i != len(files)-1 {
				// Only the newest log can end in a torn record over
				// zeros. An older log may end in one cut short by the
				// file's end, torn by an earlier crash and kept by
				// RocksDB after it recovered from it: both recovery
				// modes read that as the log's end.
				if !endsCutShort(b, off) {
					return nil, nil
				}
				continue
			}
			torn = &WALDamage{File: f, Offset: off, Size: int64(len(b))}
		}
	}
	return torn, nil
}

// endsCutShort reports whether the bad record at off is the log's last and
// runs past the file's end (a write cut short, with no zeros after it).
func endsCutShort(b []byte, off int64) bool {
	rest := len(b) - int(off)
	if rest < walHeaderSize {
		return true
	}
	length, typ := walHeader(b[off:])
	return typ != 0 && typ <= walMaxType && walHeaderSize+length > rest
}

// walHeader decodes the payload length and type of the physical record
// header at the start of b (at least walHeaderSize bytes).
func walHeader(b []byte) (length int, typ byte) {
	return int(b[4]) | int(b[5])<<8, b[6]
}

// openRDBPastTornTail opens the database as openRDB does. If that fails
// on a WAL whose only damage is a torn last record followed by zeros
// (walTornTail), it opens again past the torn record and returns it too.
// Damage anywhere else still fails.
//
// A read-write open first cuts the torn record and the zeros after it off
// the log (cutTornTail), then opens as before, so the log ends with its
// last whole record. RocksDB may keep a log it recovered from (the
// TransactionDB did), and a log left torn would make the next crash's
// torn tail, in the log the reopened database writes, one torn record
// too many for walTornTail: the database would not open again
// (TestZeroedWAL_TornTwice; found by the crash test). A read-only open
// (CheckDir) changes nothing on disk and replays to the tear with
// point-in-time recovery instead, which stops at the same place.
func openRDBPastTornTail(dir string, o rdbOptions, names []string) (*rdb, *WALDamage, error) {
	db, err := openRDB(dir, o, names)
	if err == nil || o.pointInTime || !errors.Is(translate("", err), storage.ErrCorrupt) {
		return db, nil, err
	}
	torn, _ := walTornTail(dir)
	if torn == nil {
		return nil, nil, err
	}
	if o.mode == readOnly {
		o.pointInTime = true
	} else if err := cutTornTail(*torn); err != nil {
		return nil, torn, err
	}
	db, err = openRDB(dir, o, names)
	return db, torn, err
}

// cutTornTail truncates a log at its torn record, durably. Nothing in the
// record was acknowledged (see walTornTail), so this drops only what
// point-in-time recovery would not replay either.
func cutTornTail(torn WALDamage) error {
	f, err := os.OpenFile(torn.File, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("rocksstore: cut the torn record off %s: %w", torn.File, err)
	}
	err = f.Truncate(torn.Offset)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("rocksstore: cut the torn record off %s: %w", torn.File, err)
	}
	return nil
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
