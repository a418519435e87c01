package rocksstore

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// strayKey is in no namespace of dbkeys (first byte 0xEE): damage, or
// another program's key.
var strayKey = []byte{0xEE, 1, 2}

// putStrayKey writes strayKey into the default family of the closed
// database in dir, whatever families it has.
func putStrayKey(t *testing.T, dir string) {
	t.Helper()
	names, err := listFamilies(dir)
	require.NoError(t, err)
	db, err := openRDB(dir, rdbOptions{mode: plainDB}, names)
	require.NoError(t, err)
	db.route(strayKey[0], slices.Index(names, defaultFamily))
	require.NoError(t, db.put(strayKey, dbkeys.Marker(), true))
	db.close()
}

// strayFormat1 is the format 1 fixture with strayKey in it.
func strayFormat1(t *testing.T) string {
	t.Helper()
	dir := format1DB(t)
	putStrayKey(t, dir)
	return dir
}

// requireViolationNames fails unless one of rep's violations names key.
func requireViolationNames(t *testing.T, rep storage.CheckReport, key string) {
	t.Helper()
	require.False(t, rep.OK(), "check passed a database that Open refuses")
	for _, v := range rep.Violations {
		if strings.Contains(v.Msg, key) {
			return
		}
	}
	require.Failf(t, "no violation names the key", "key %s: %v", key, rep.Violations)
}

// Found by review (session 71): leaseq check on a format 1 database with a
// key outside every namespace said all was well (it read only the
// namespaces' prefixes), yet leaseq serve refuses the database for that
// key.
func TestMigrate_Format1StrayKeyFailsCheck(t *testing.T) {
	t.Parallel()
	dir := strayFormat1(t)
	rep, err := CheckDir(context.Background(), dir)
	require.NoError(t, err)
	requireViolationNames(t, rep, "ee0102")
	_, err = Open(dir, testOptions(t))
	require.ErrorIs(t, err, storage.ErrCorrupt)
	require.ErrorContains(t, err, "ee0102")
}

// Found by review (session 71): a move that met a key in no namespace part
// way had already moved every key before it, then failed; every later Open
// failed on the same key, and leaseq check told the operator to open the
// database once to finish the move, which could not succeed. The move now
// finds the key before it writes anything, and moves nothing.
func TestMigrate_StrayKeyMovesNothing(t *testing.T) {
	defer func(c int) { migrateChunk = c }(migrateChunk)
	migrateChunk = 2
	dir := strayFormat1(t)
	for range 2 {
		_, err := Open(dir, testOptions(t))
		require.ErrorIs(t, err, storage.ErrCorrupt)
		require.ErrorContains(t, err, "key ee0102 in the default column family is in no namespace")
		require.ErrorContains(t, err, "moved nothing")
		require.ErrorContains(t, err, "--key_hex delete 0xee0102")
	}
	keys := familyKeys(t, dir)
	require.Equal(t, map[string]int{defaultFamily: 39 + 1}, keys, "a move that cannot finish moved keys")
	rep, err := CheckDir(context.Background(), dir)
	require.NoError(t, err)
	requireViolationNames(t, rep, "ee0102")
}

// Found by review (session 71): a database part way through its move (an
// older build's move that stopped at a key in no namespace, or a crash and
// then such a key) got check's advice to open it once to finish the move,
// which always fails at that key. Check names the key instead.
func TestMigrate_PartWayStrayKeyCheckNamesIt(t *testing.T) {
	dir := format1DB(t)
	defer func(c, f int) { migrateChunk, migrateFail = c, f }(migrateChunk, migrateFail)
	migrateChunk, migrateFail = 5, 1
	_, err := Open(dir, testOptions(t))
	require.ErrorContains(t, err, "stopped after 1 batches")
	migrateFail = 0
	putStrayKey(t, dir)
	before := familyKeys(t, dir)
	require.Equal(t, 39-5+1, before[defaultFamily], "%v", before)

	_, err = CheckDir(context.Background(), dir)
	require.ErrorIs(t, err, storage.ErrCorrupt)
	require.ErrorContains(t, err, "part way through its move")
	require.ErrorContains(t, err, "key ee0102 in the default column family, in no namespace, blocks the move")
	require.NotContains(t, err.Error(), "open it once", "check's advice cannot work")

	_, err = Open(dir, testOptions(t))
	require.ErrorIs(t, err, storage.ErrCorrupt)
	require.ErrorContains(t, err, "ee0102")
	require.Equal(t, before, familyKeys(t, dir), "the refused move moved keys")
}
