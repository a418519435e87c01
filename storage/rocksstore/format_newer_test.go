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

// reviewPutFormat writes format version f into the meta family of the
// closed format 2 database in dir, opening it with extra families too.
func reviewPutFormat(t *testing.T, dir string, f uint64, extra ...string) {
	t.Helper()
	names := append(familyList(), extra...)
	db, err := openRDB(dir, rdbOptions{mode: plainDB}, names)
	require.NoError(t, err)
	newFamilies(db, names)
	require.NoError(t, db.put(dbkeys.MetaFormatKey(), dbkeys.EncodeUint64(f), true))
	db.close()
}

// reviewFormat2DB makes a format 2 database with one queue of 3 items.
func reviewFormat2DB(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	s, err := Open(dir, testOptions(t))
	require.NoError(t, err)
	b := &testBundle{t: t, dir: dir, opts: testOptions(t), s: s, ctx: context.Background()}
	b.enqueueN("q", at(0), 3)
	require.NoError(t, s.Close())
	return dir
}

// Found by review (session 71): a database written by a newer build
// (format 3) was refused as ErrCorrupt, which says the data is damaged
// and sends an operator to recovery tools. It is refused as
// ErrNewerFormat: a newer leaseq wrote it. CheckDir says the same.
func TestOpen_NewerFormatIsNotCorruption(t *testing.T) {
	t.Parallel()
	dir := reviewFormat2DB(t)
	reviewPutFormat(t, dir, formatVersion+1)

	_, err := Open(dir, testOptions(t))
	require.Error(t, err)
	require.NotErrorIs(t, err, storage.ErrCorrupt, "a newer format is not damage: %v", err)
	require.ErrorIs(t, err, ErrNewerFormat)
	require.ErrorContains(t, err, "format 3; this build reads up to 2")

	_, err = CheckDir(context.Background(), dir)
	require.Error(t, err)
	require.NotErrorIs(t, err, storage.ErrCorrupt, "check: a newer format is not damage: %v", err)
	require.ErrorIs(t, err, ErrNewerFormat)

	// Format 0 in the meta family is still damage.
	reviewPutFormat(t, dir, 0)
	_, err = Open(dir, testOptions(t))
	require.ErrorIs(t, err, storage.ErrCorrupt)
}

// Found by review (session 71): a newer build that adds a namespace (a
// column family this build does not know) and bumps the format: Open
// failed inside RocksDB ("Column families not opened") before it read the
// format key, so the operator was not told that a newer leaseq wrote the
// database.
func TestOpen_NewerFormatWithNewFamily(t *testing.T) {
	t.Parallel()
	dir := reviewFormat2DB(t)
	reviewPutFormat(t, dir, formatVersion+1, "future_namespace")

	_, err := Open(dir, testOptions(t))
	require.Error(t, err)
	require.ErrorContains(t, err, "format", "the error should name the database format: %v", err)
	require.ErrorIs(t, err, ErrNewerFormat)
	names, err := listFamilies(dir)
	require.NoError(t, err)
	require.Contains(t, names, "future_namespace")

	// An unknown family in a database of this build's format: refused,
	// naming the family (not opened without it, not dropped).
	reviewPutFormat(t, dir, formatVersion, "future_namespace")
	_, err = Open(dir, testOptions(t))
	require.ErrorContains(t, err, "future_namespace")
	require.NotErrorIs(t, err, ErrNewerFormat)
}

// Found by review (session 71): leaseq serve pointed at another
// application's RocksDB database (keys in default, no leaseq format key)
// refused it, but only after creating leaseq's 11 column families in it:
// that application, which opens the families it knows, then failed with
// "Column families not opened".
func TestOpen_ForeignDatabaseLeftUnchanged(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db, err := openRDB(dir, rdbOptions{mode: plainDB}, []string{defaultFamily})
	require.NoError(t, err)
	db.route('h', 0)
	require.NoError(t, db.put([]byte("hello"), []byte("world"), true))
	db.close()

	_, err = Open(dir, testOptions(t))
	require.ErrorContains(t, err, "not a leaseq database")
	// leaseq check says the same, not that the data is damaged.
	_, err = CheckDir(context.Background(), dir)
	require.ErrorContains(t, err, "not a leaseq database")
	require.NotErrorIs(t, err, storage.ErrCorrupt)
	names, err := listFamilies(dir)
	require.NoError(t, err)
	require.Equal(t, []string{defaultFamily}, names, "Open changed the layout of a database it refused")
	// The other application can still open its database as it was.
	db, err = openRDB(dir, rdbOptions{mode: plainDB}, []string{defaultFamily})
	require.NoError(t, err, "the foreign database no longer opens with its own families")
	db.close()
}

// Found by review (session 71): a second Open of a database another
// store holds open (RocksDB's LOCK) fails, but lq_open removed (or made)
// the WAL spare before RocksDB took the lock: the running store's spare
// was deleted, so its next WAL was not zero-filled.
func TestOpen_LockedOpenLeavesRunningSpare(t *testing.T) {
	t.Parallel()
	b := setup(t, zeroedWALOptions)
	spareReady(t, b.dir)
	_, err := Open(b.dir, testOptions(t)) // SyncNone
	require.Error(t, err)
	require.ErrorContains(t, err, "another process holds this data directory")
	_, err = os.Stat(filepath.Join(b.dir, "LEASEQ-SPARE-WAL"))
	require.NoError(t, err, "a refused Open deleted the running store's spare WAL")
	// Nor did it rotate the running store's info log (RocksDB does that
	// before it takes the lock).
	old, err := filepath.Glob(filepath.Join(b.dir, "LOG.old.*"))
	require.NoError(t, err)
	require.Empty(t, old, "a refused Open renamed the running store's LOG")
	// The running store still works, and reopens after it closes.
	b.enqueueN("q", at(0), 1)
	b.reopen()
}
