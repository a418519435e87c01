package rocksstore

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"github.com/leaseq/leaseq/dbkeys"
)

// Column families. Each namespace of dbkeys lives in its own column
// family, named below; keys keep their namespace byte, so every encoder
// and decoder of dbkeys is the same whatever family a key is in. A family
// per namespace keeps a namespace's appended tail (an available record, a
// visibility entry) out of other namespaces' key ranges: a flushed table
// then holds one namespace, does not overlap the tables flushed before it,
// and compaction moves it down a level instead of rewriting it (see
// doc.go for the measurement).
//
// RocksDB requires the family "default". Format 1 databases keep every
// namespace there; Open moves them into their families (migrate.go).

// familyNames maps a namespace byte to its column family's name. Part of
// the on-disk format: never rename.
var familyNames = map[byte]string{
	dbkeys.NsMeta:        "meta",
	dbkeys.NsAvailable:   "available",
	dbkeys.NsVisibility:  "visibility_index",
	dbkeys.NsInProgress:  "in_progress",
	dbkeys.NsLeases:      "leases",
	dbkeys.NsLeaseExpiry: "lease_expiry",
	dbkeys.NsDLQ:         "dlq",
	dbkeys.NsDedup:       "dedup",
	dbkeys.NsDedupExpiry: "dedup_expiry",
	dbkeys.NsDelayed:     "delayed",
	dbkeys.NsPayload:     "payload",
}

// defaultFamily is RocksDB's own family: empty in format 2.
const defaultFamily = "default"

// families routes a key to its column family by its namespace byte: in
// Go (of) and in rdb.cc (rdb.route), which finds the family of each key
// of a batch.
type families struct {
	db    *rdb
	names []string // as opened
	byNs  [256]int // family index + 1; 0: not open
	def   int      // "default"
}

// familyList returns every family's name, default first: what Open opens
// (creating those that are missing).
func familyList() []string {
	names := []string{defaultFamily}
	for ns := 0; ns < 256; ns++ {
		if n, ok := familyNames[byte(ns)]; ok {
			names = append(names, n)
		}
	}
	return names
}

// newFamilies indexes db's families, opened with names, and routes every
// namespace of dbkeys to its own. A namespace whose family was not opened
// has no route (of panics); CheckDir opens only the families a database
// has.
func newFamilies(db *rdb, names []string) *families {
	ns := make(map[string]byte, len(familyNames))
	for b, n := range familyNames {
		ns[n] = b
	}
	f := &families{db: db, names: names}
	for i, n := range names {
		if n == defaultFamily {
			f.def = i
			continue
		}
		if b, ok := ns[n]; ok {
			f.set(b, i)
		}
	}
	return f
}

func (f *families) set(ns byte, fam int) {
	f.byNs[ns] = fam + 1
	f.db.route(ns, fam)
}

// has reports whether namespace ns has a family open.
func (f *families) has(ns byte) bool { return f.byNs[ns] != 0 }

// singleFamily routes every namespace to the default family: format 1,
// read as it is by CheckDir.
func (f *families) singleFamily() {
	for b := range familyNames {
		f.set(b, f.def)
	}
}

// of returns key's family. Every key starts with a namespace byte of
// dbkeys; a key without one is a bug.
func (f *families) of(key []byte) int {
	if len(key) == 0 || f.byNs[key[0]] == 0 {
		panic(fmt.Sprintf("rocksstore: key %x outside every open column family", key))
	}
	return f.byNs[key[0]] - 1
}

// ErrNewerFormat is Open's (and CheckDir's) refusal of a database that a
// newer leaseq wrote: its format is one this build does not read. Not
// damage (storage.ErrCorrupt): the data is fine, and the remedy is a
// newer build, not recovery.
var ErrNewerFormat = errors.New("database written by a newer leaseq")

// ErrLocked is Open's refusal of a data directory whose RocksDB LOCK is
// held: by another process, or by another store of this one. Open
// changes nothing in the directory before it has the lock.
var ErrLocked = errors.New("data directory in use")

// lockedText is how rdb.cc's lockDir words that refusal.
const lockedText = "another process holds this data directory"

func newerFormat(f uint64) error {
	return fmt.Errorf("rocksstore: open: %w (format %d; this build reads up to %d): upgrade leaseq", ErrNewerFormat, f, formatVersion)
}

// checkFamilies looks at the column families of the database in dir
// before Open opens it for writing, which creates every family of
// familyList that is missing and fails on any it does not name. Found by
// review (session 71):
//
//   - a newer format that added a family failed inside RocksDB ("Column
//     families not opened"), before Open read the format key that would
//     have said a newer leaseq wrote it: with families this build does
//     not know, it reads the format read-only and refuses the database
//     as newer (ErrNewerFormat), or names the families;
//   - another application's RocksDB database (keys in default, nothing
//     else) was refused only after Open had added leaseq's families to
//     it, which that application then failed to open: a database of
//     default alone must be empty (new) or format 1 (migrate.go), and
//     is otherwise refused unchanged.
//
// A new directory, or a database this check cannot read, goes on to the
// open, which creates the one or reports why it cannot open the other.
func checkFamilies(dir string) error {
	if _, err := os.Stat(filepath.Join(dir, "CURRENT")); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	names, err := listFamilies(dir)
	if err != nil {
		return nil
	}
	known := familyList()
	var unknown []string
	for _, n := range names {
		if !slices.Contains(known, n) {
			unknown = append(unknown, n)
		}
	}
	defaultOnly := len(names) == 1 && names[0] == defaultFamily
	if len(unknown) == 0 && !defaultOnly {
		return nil
	}
	// Read-only, with RocksDB's info log elsewhere: this look changes
	// nothing in dir (as CheckDir).
	logDir, err := os.MkdirTemp("", "leaseq-open-log-")
	if err != nil {
		return fmt.Errorf("rocksstore: open: %w", err)
	}
	defer os.RemoveAll(logDir)
	db, err := openRDB(dir, rdbOptions{mode: readOnly, logDir: logDir}, names)
	if err != nil {
		return nil
	}
	defer db.close()
	s := &Store{dir: dir, db: db, fams: newFamilies(db, names), log: slog.New(slog.DiscardHandler)}
	if len(unknown) > 0 {
		if s.fams.has(dbkeys.NsMeta) {
			if _, err := s.readFormat(); err != nil && !errors.Is(err, errFormat1) {
				return err
			}
		}
		return fmt.Errorf("rocksstore: open %s: column families %q are not ones this build of leaseq knows, yet the database format is not newer than %d: refusing to open it", dir, unknown, formatVersion)
	}
	if v1, err := s.defaultFormat(); err != nil || v1 {
		return err
	}
	k, err := s.firstKey(s.fams.def)
	if err != nil || k == nil {
		return err
	}
	return fmt.Errorf("rocksstore: open %s: not a leaseq database (key %x in the default column family, and no leaseq format key): refusing it, and leaving it unchanged", dir, k)
}
