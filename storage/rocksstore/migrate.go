package rocksstore

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// Database formats (the meta format key):
//
//   - 1: every namespace in RocksDB's default column family;
//   - 2: a column family per namespace (families.go), default empty.
//
// Open moves a format 1 database to format 2 before it serves anything
// (migrateFormat1). The move is a sequence of batches, each putting a
// slice of keys into their families and deleting them from default, so a
// crash during it leaves every key in exactly one place, and the next
// Open goes on from where it stopped. The format key moves last, in a
// synced batch: a database whose meta family holds the format key is
// fully moved.
const (
	format1       = 1
	formatVersion = 2 // what this build writes
)

// errFormat1 is load's answer for a database still (or partly) in format
// 1: openDB migrates it and opens again.
var errFormat1 = errors.New("rocksstore: database in format 1")

// migrateChunk is how many keys one migration batch moves; migrateFail,
// if set, fails the migration after that many batches (tests: a crash
// halfway).
var (
	migrateChunk = 4096
	migrateFail  = 0
)

// readFormat reads the format key. In format 2 it is in the meta family;
// a format 1 database has it in default (errFormat1). ok is false for a
// new, empty database.
func (s *Store) readFormat() (ok bool, err error) {
	key := dbkeys.MetaFormatKey()
	v, ok, err := s.getRaw(key)
	if err != nil {
		return false, err
	}
	if !ok {
		old, err := s.defaultFormat()
		if err != nil {
			return false, err
		}
		if old {
			return false, errFormat1
		}
		return false, s.requireEmptyDefault()
	}
	f, err := dbkeys.DecodeUint64(v)
	if err != nil {
		return false, fmt.Errorf("rocksstore: open: format version: %w: %v", storage.ErrCorrupt, err)
	}
	if f > formatVersion {
		// Not damage: a newer build wrote it (found by review, session
		// 71: this was ErrCorrupt, which sends an operator to recovery).
		return false, newerFormat(f)
	}
	if f != formatVersion {
		return false, fmt.Errorf("rocksstore: open: %w: database format %d in the meta column family, this build reads %d", storage.ErrCorrupt, f, formatVersion)
	}
	return true, nil
}

// defaultFormat reports whether the default family holds the format key
// (a format 1 database, or one part way through its move); any value but
// 1 there is damage.
func (s *Store) defaultFormat() (bool, error) {
	key := dbkeys.MetaFormatKey()
	v, found, err := s.db.getIn(nil, s.fams.def, key)
	if err != nil || !found {
		return false, translate("get", err)
	}
	if f, err := dbkeys.DecodeUint64(v); err != nil || f != format1 {
		return false, fmt.Errorf("rocksstore: open: %w: format key %x in the default column family (want format %d)", storage.ErrCorrupt, v, format1)
	}
	return true, nil
}

// requireEmptyDefault fails when the default family holds a key although
// no format key says the database is format 1.
func (s *Store) requireEmptyDefault() error {
	k, err := s.firstKey(s.fams.def)
	if err != nil || k == nil {
		return err
	}
	return fmt.Errorf("rocksstore: open: %w: the default column family holds key %x but no format version", storage.ErrCorrupt, k)
}

// firstKey returns a copy of the first key in family fam, nil when it is
// empty.
func (s *Store) firstKey(fam int) ([]byte, error) {
	it := s.db.iter(nil, fam, nil, nil, false)
	defer it.close()
	if !it.seek(nil) {
		return nil, translate("iterate", it.err)
	}
	return bytes.Clone(it.key), nil
}

// migrateFormat1 moves every key of the default family of the database in
// dir into its namespace's family, on a plain DB opened with Open's
// options: its compaction then drops the moved keys' old copies. A key of
// default in no namespace has no family to go to: the move refuses it
// before its first write, so the database stays as it was.
// REQUIRES: the database is closed.
func migrateFormat1(dir string, cacheBytes, memtable int64) (moved int, err error) {
	names := familyList()
	db, err := openRDB(dir, rdbOptions{mode: plainDB, cacheBytes: cacheBytes, memtable: memtable}, names)
	if err != nil {
		return 0, walOpenError(dir, translate("migrate: open "+dir, err))
	}
	defer db.close()
	fams := newFamilies(db, names)
	// Found by review (session 71): the move met a key in no namespace
	// only when it reached it, after its batches had moved every key
	// before it, and failed there at every later Open: a database half
	// moved that no Open could finish. Look for such a key before the
	// first write, and move nothing if there is one.
	var stray []byte
	if err := strayKeys(db, nil, fams.def, func(k []byte) bool { stray = k; return false }); err != nil {
		return 0, fmt.Errorf("rocksstore: migrate: %w", err)
	}
	if stray != nil {
		return 0, strayKeyError(dir, stray)
	}
	// An implicit snapshot: the deletes below do not disturb it.
	it := db.iter(nil, fams.def, nil, nil, true)
	defer it.close()
	var wb writeBuf
	formatKey := dbkeys.MetaFormatKey()
	batches, n := 0, 0
	write := func(sync bool) error {
		if migrateFail > 0 && batches == migrateFail {
			return fmt.Errorf("rocksstore: migrate: stopped after %d batches (test)", batches)
		}
		if err := db.write(&wb, sync); err != nil {
			return translate("migrate: write", err)
		}
		batches++
		wb.reset()
		n = 0
		return nil
	}
	for ok := it.seek(nil); ok; ok = it.next() {
		k, v := it.key, it.value
		if string(k) == string(formatKey) {
			continue // moves last
		}
		if len(k) == 0 || !fams.has(k[0]) {
			return moved, strayKeyError(dir, k) // not after strayKeys
		}
		wb.put(k, v)
		wb.delIn(fams.def, k)
		moved++
		if n++; n == migrateChunk {
			if err := write(false); err != nil {
				return moved, err
			}
		}
	}
	if it.err != nil {
		return moved, translate("migrate: iterate", it.err)
	}
	wb.put(formatKey, dbkeys.EncodeUint64(formatVersion))
	wb.delIn(fams.def, formatKey)
	if err := write(true); err != nil {
		return moved, err
	}
	// Flush the moved keys, so the Open that follows does not replay
	// them from the WAL, and drop their old copies and their tombstones
	// from default.
	if err := db.flush(); err != nil {
		return moved, translate("migrate: flush", err)
	}
	if err := db.compact(fams.def); err != nil {
		return moved, translate("migrate: compact", err)
	}
	return moved, nil
}

// strayKeyError is the move's refusal of key, in the default family of
// the database in dir but in no namespace: not a key leaseq writes (damage,
// or another program's), so there is no family to move it to.
func strayKeyError(dir string, key []byte) error {
	return fmt.Errorf("rocksstore: migrate: %w: key %x in the default column family is in no namespace, so the move to format 2 cannot place it and moved nothing; keep a copy of %s, delete the key (ldb --db=%s --key_hex delete 0x%x) and open again", storage.ErrCorrupt, key, dir, dir, key)
}

// checkLayout fits the families of a read-only store (CheckDir) to its
// database's format: format 2 is read family by family; format 1 is read
// from default alone; a format 1 database part way through its move (an
// Open that stopped during the migration) is refused, since its keys are
// in two places, with the advice to finish the move, or, when a key in no
// namespace blocks the move, naming that key.
func (s *Store) checkLayout() error {
	v1, err := s.defaultFormat()
	if err != nil {
		return err
	}
	if !v1 {
		for b, name := range familyNames {
			if !s.fams.has(b) {
				return fmt.Errorf("rocksstore: check: %w: column family %q missing", storage.ErrCorrupt, name)
			}
		}
		_, err := s.readFormat()
		return err
	}
	for b, name := range familyNames {
		if !s.fams.has(b) {
			continue
		}
		k, err := s.firstKey(s.fams.byNs[b] - 1)
		if err != nil {
			return err
		}
		if k == nil {
			continue
		}
		// A key in no namespace blocks the move (migrateFormat1 refuses
		// it): opening cannot finish it until the key is gone. Found by
		// review (session 71): check advised an open that always failed.
		var stray []byte
		if err := strayKeys(s.db, nil, s.fams.def, func(k []byte) bool { stray = k; return false }); err != nil {
			return fmt.Errorf("rocksstore: check: %w", err)
		}
		if stray != nil {
			return fmt.Errorf("rocksstore: check: %w: the database is part way through its move from format 1 to format 2 (column family %q is in use), and key %x in the default column family, in no namespace, blocks the move: keep a copy of %s, delete the key (ldb --db=%s --key_hex delete 0x%x); the next open (leaseq serve) then finishes the move", storage.ErrCorrupt, name, stray, s.dir, s.dir, stray)
		}
		return fmt.Errorf("rocksstore: check: the database is part way through its move from format 1 to format 2 (column family %q is in use): open it once (leaseq serve) to finish the move", name)
	}
	s.fams.singleFamily()
	return nil
}
