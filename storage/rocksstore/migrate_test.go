package rocksstore

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// testdata/format1 holds a database written by the last format 1 build
// (ac825a7) with testdata/format1/gen_test.go.txt: two queues with ready,
// delayed, inflight (one lease) and dead items, a dedup key, a payload
// stored under its own key, and three items that live only in its WAL.
// want.json is what that build read back from it.

// format1State is what a store reads back: stats, every available and
// inflight item, and the dead items, per queue.
type format1State struct {
	Stats    []storage.QueueStats
	Ready    map[string][]storage.Item
	Inflight map[string][]storage.Item
	Dead     map[string][]storage.DeadItem
}

// format1Families is where the 39 keys of the format 1 database are once
// moved: meta holds the format, the id sequence, and each queue's config
// and counters; jobs has 10 available items (one delayed by an hour, one
// nacked with a backoff), one lease over 2 inflight items, 2 dedup keys
// and one payload under its own key; dead has its 2 items in the dlq.
var format1Families = map[string]int{
	"meta": 6, "available": 10, "visibility_index": 10, "delayed": 2,
	"in_progress": 2, "leases": 1, "lease_expiry": 1, "dlq": 2,
	"dedup": 2, "dedup_expiry": 2, "payload": 1,
}

// format1Now is the instant the generator read want.json at.
var format1Now = at(4 * time.Second)

func readState(t *testing.T, s *Store) format1State {
	t.Helper()
	ctx := context.Background()
	st := format1State{Ready: map[string][]storage.Item{}, Inflight: map[string][]storage.Item{}, Dead: map[string][]storage.DeadItem{}}
	var err error
	st.Stats, err = s.Stats(ctx, storage.StatsParams{Now: format1Now})
	require.NoError(t, err)
	for _, q := range st.Stats {
		st.Ready[q.Queue], err = s.Peek(ctx, storage.PeekParams{Queue: q.Queue, Limit: 100, Now: format1Now})
		require.NoError(t, err)
		st.Inflight[q.Queue], err = s.Peek(ctx, storage.PeekParams{Queue: q.Queue, Inflight: true, Limit: 100, Now: format1Now})
		require.NoError(t, err)
		st.Dead[q.Queue], err = s.DeadList(ctx, storage.DeadListParams{Queue: q.Queue, Limit: 100})
		require.NoError(t, err)
	}
	return st
}

// requireFormat1State checks s reads what the format 1 build read, as
// JSON (so times compare by instant).
func requireFormat1State(t *testing.T, s *Store) {
	t.Helper()
	want, err := os.ReadFile(filepath.Join("testdata", "format1", "want.json"))
	require.NoError(t, err)
	got, err := json.MarshalIndent(readState(t, s), "", "  ")
	require.NoError(t, err)
	require.JSONEq(t, string(want), string(got))
}

// format1DB copies the format 1 database into a fresh directory.
func format1DB(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "db")
	require.NoError(t, os.CopyFS(dir, os.DirFS(filepath.Join("testdata", "format1", "db"))))
	return dir
}

// familyKeys counts the keys in each column family of the closed
// database in dir, by family name.
func familyKeys(t *testing.T, dir string) map[string]int {
	t.Helper()
	names, err := listFamilies(dir)
	require.NoError(t, err)
	db, err := openRDB(dir, rdbOptions{mode: readOnly}, names)
	require.NoError(t, err)
	defer db.close()
	n := map[string]int{}
	for i, name := range names {
		it := db.iter(nil, i, nil, nil, false)
		for ok := it.seek(nil); ok; ok = it.next() {
			k := it.key
			if name != defaultFamily {
				require.Equal(t, name, familyNames[k[0]], "key %x in family %s", k, name)
			}
			n[name]++
		}
		require.NoError(t, it.err)
		it.close()
	}
	return n
}

// A format 1 database reads the same after Open moves it to format 2:
// every key in its namespace's family, none left in default, and the WAL's
// items too. CheckDir reads both formats.
func TestMigrateFormat1(t *testing.T) {
	dir := format1DB(t)
	rep, err := CheckDir(context.Background(), dir)
	require.NoError(t, err)
	require.True(t, rep.OK(), "format 1: %v", rep.Violations)
	require.Equal(t, map[string]int{defaultFamily: 39}, familyKeys(t, dir), "the format 1 database (CheckDir left it as it was)")

	b := setupDir(t, dir)
	requireFormat1State(t, b.s)
	b.check()
	require.NoError(t, b.s.Close())
	// Every key in its family, none in default.
	require.Equal(t, format1Families, familyKeys(t, dir))
	rep, err = CheckDir(context.Background(), dir)
	require.NoError(t, err)
	require.True(t, rep.OK(), "format 2: %v", rep.Violations)

	// Open again: format 2 as it is; the items are served.
	s, err := Open(dir, b.opts)
	require.NoError(t, err)
	b.s = s
	requireFormat1State(t, b.s)
	res := b.poll("jobs", 100, time.Minute, at(time.Hour+time.Minute))
	var long int
	for _, it := range res.Items {
		if len(it.Payload) == 5000 {
			long++
		}
	}
	require.Len(t, res.Items, 10, "ready and delayed items of jobs")
	require.Equal(t, 1, long, "the payload stored under its own key")
}

// A move that stops part way (a crash) leaves each key in one place;
// CheckDir refuses the half-moved database, and the next Open finishes the
// move.
func TestMigrateFormat1_Interrupted(t *testing.T) {
	dir := format1DB(t)
	defer func(c, f int) { migrateChunk, migrateFail = c, f }(migrateChunk, migrateFail)
	migrateChunk, migrateFail = 5, 3
	opts := testOptions(t)
	_, err := Open(dir, opts)
	require.ErrorContains(t, err, "stopped after 3 batches")
	keys := familyKeys(t, dir)
	require.Equal(t, 39-15, keys[defaultFamily], "keys not yet moved: %v", keys)
	_, err = CheckDir(context.Background(), dir)
	require.ErrorContains(t, err, "part way through its move")

	migrateFail = 0
	b := setupDir(t, dir)
	requireFormat1State(t, b.s)
	require.NoError(t, b.s.Close())
	require.Equal(t, format1Families, familyKeys(t, dir))
	s, err := Open(dir, opts)
	require.NoError(t, err)
	b.s = s
}

// A new database is format 2 from the start: the format key in the meta
// family, default empty.
func TestNewDatabaseIsFormat2(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueueN("q", at(0), 3)
	require.NoError(t, b.s.Close())
	keys := familyKeys(t, b.dir)
	require.Zero(t, keys[defaultFamily])
	require.Equal(t, 3, keys["available"])
	require.Equal(t, 3, keys["visibility_index"])
	s, err := Open(b.dir, b.opts)
	require.NoError(t, err)
	b.s = s
	v, ok, err := b.s.getRaw(dbkeys.MetaFormatKey())
	require.NoError(t, err)
	require.True(t, ok)
	f, err := dbkeys.DecodeUint64(v)
	require.NoError(t, err)
	require.EqualValues(t, formatVersion, f)
}

// A format key in the default family that does not say format 1 is
// damage: Open and CheckDir refuse the database instead of moving it.
func TestMigrate_UnknownFormatInDefault(t *testing.T) {
	t.Parallel()
	dir := format1DB(t)
	db, err := openRDB(dir, rdbOptions{mode: plainDB}, []string{defaultFamily})
	require.NoError(t, err)
	db.route(dbkeys.NsMeta, 0) // format 1: every key in default
	require.NoError(t, db.put(dbkeys.MetaFormatKey(), dbkeys.EncodeUint64(7), false))
	db.close()

	_, err = Open(dir, testOptions(t))
	require.ErrorIs(t, err, storage.ErrCorrupt)
	require.ErrorContains(t, err, "want format 1")
	_, err = CheckDir(context.Background(), dir)
	require.ErrorIs(t, err, storage.ErrCorrupt)
	require.Equal(t, map[string]int{defaultFamily: 39}, familyKeys(t, dir), "nothing moved")
}
