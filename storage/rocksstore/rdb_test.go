package rocksstore

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
)

// openTestRDB opens a fresh transaction database with every family routed.
func openTestRDB(t *testing.T) (*rdb, *families) {
	t.Helper()
	names := familyList()
	db, err := openRDB(t.TempDir(), rdbOptions{mode: txnDB, lockTimeoutMs: lockTimeoutMillis}, names)
	require.NoError(t, err)
	t.Cleanup(db.close)
	return db, newFamilies(db, names)
}

// The binding's reads and writes, at the edges the store's own tests do
// not reach on purpose: values larger than the first buffer (lq_get and
// lq_txn_get retry, lq_txn_get_for_update goes on from the value that did
// not fit), empty values, missing keys, iterator bounds, and a batch that
// goes to the family of each key's namespace.
func TestRDB_ReadsAndWrites(t *testing.T) {
	t.Parallel()
	db, fams := openTestRDB(t)
	big := bytes.Repeat([]byte("x"), 5000)
	var w writeBuf
	w.put([]byte{dbkeys.NsAvailable, 'a'}, big)
	w.put([]byte{dbkeys.NsAvailable, 'b'}, nil)
	w.put([]byte{dbkeys.NsAvailable, 'c'}, []byte("small"))
	w.put([]byte{dbkeys.NsInProgress, 'a'}, []byte("elsewhere"))
	require.NoError(t, db.write(&w, false))

	v, ok, err := db.get(nil, []byte{dbkeys.NsAvailable, 'a'})
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, big, v)
	v, ok, err = db.get(nil, []byte{dbkeys.NsAvailable, 'b'})
	require.NoError(t, err)
	require.True(t, ok)
	require.Empty(t, v)
	_, ok, err = db.get(nil, []byte{dbkeys.NsAvailable, 'z'})
	require.NoError(t, err)
	require.False(t, ok)
	// Each key went to its namespace's family only.
	_, ok, err = db.getIn(nil, fams.of([]byte{dbkeys.NsInProgress}), []byte{dbkeys.NsAvailable, 'a'})
	require.NoError(t, err)
	require.False(t, ok)

	tx := db.begin(nil)
	defer tx.destroy()
	keys := [][]byte{{dbkeys.NsAvailable, 'c'}, {dbkeys.NsAvailable, 'z'}, {dbkeys.NsAvailable, 'a'}, {dbkeys.NsAvailable, 'b'}, {dbkeys.NsInProgress, 'a'}}
	vals, err := tx.getManyForUpdate(keys) // 'a' does not fit in the first buffer (320 bytes a key)
	require.NoError(t, err)
	require.Equal(t, [][]byte{[]byte("small"), nil, big, {}, []byte("elsewhere")}, vals)
	v, ok, err = tx.get([]byte{dbkeys.NsAvailable, 'a'})
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, big, v)
	// Writes into the transaction are invisible until it commits, and
	// then all visible.
	w.reset()
	w.singleDel([]byte{dbkeys.NsAvailable, 'c'})
	w.put([]byte{dbkeys.NsAvailable, 'd'}, []byte("new"))
	tx.write(&w)
	_, ok, err = db.get(nil, []byte{dbkeys.NsAvailable, 'd'})
	require.NoError(t, err)
	require.False(t, ok)
	require.NoError(t, tx.commit(0))

	var got []string
	it := db.iter(nil, fams.of([]byte{dbkeys.NsAvailable}), []byte{dbkeys.NsAvailable, 'b'}, []byte{dbkeys.NsAvailable, 'e'}, false)
	for ok := it.seek(nil); ok; ok = it.next() {
		got = append(got, string(it.key[1:]))
	}
	require.NoError(t, it.err)
	it.close()
	require.Equal(t, []string{"b", "d"}, got, "from the lower bound, 'c' single-deleted, before the upper bound")

	// The transaction is reused, and a rollback drops its writes.
	tx = db.begin(tx)
	w.reset()
	w.del([]byte{dbkeys.NsAvailable, 'd'})
	tx.write(&w)
	require.NoError(t, tx.rollback())
	_, ok, err = db.get(nil, []byte{dbkeys.NsAvailable, 'd'})
	require.NoError(t, err)
	require.True(t, ok)
}

// The counters merge operator (rdb.cc) adds operands field by field,
// including negative deltas, and a malformed operand is an error, not a
// silent zero.
func TestRDB_CountersMerge(t *testing.T) {
	t.Parallel()
	db, _ := openTestRDB(t)
	key := dbkeys.CountersKey("q")
	var w writeBuf
	w.merge(key, dbkeys.EncodeCounters(dbkeys.Counters{Ready: 3, Enqueued: 3}))
	w.merge(key, dbkeys.EncodeCounters(dbkeys.Counters{Ready: -1, Inflight: 1, Purged: 1 << 40}))
	for range 50 { // one flush merges many operands at once
		w.merge(key, dbkeys.EncodeCounters(dbkeys.Counters{Acked: 2, Inflight: -1}))
		w.merge(key, dbkeys.EncodeCounters(dbkeys.Counters{Inflight: 1}))
	}
	require.NoError(t, db.write(&w, false))
	require.NoError(t, db.flush()) // merged again by the flush
	w.reset()
	w.merge(key, dbkeys.EncodeCounters(dbkeys.Counters{Ready: -2}))
	require.NoError(t, db.write(&w, false))
	v, ok, err := db.get(nil, key)
	require.NoError(t, err)
	require.True(t, ok)
	c, err := dbkeys.DecodeCounters(v)
	require.NoError(t, err)
	require.Equal(t, dbkeys.Counters{Ready: 0, Inflight: 1, Enqueued: 3, Acked: 100, Purged: 1 << 40}, c)

	w.reset()
	w.merge(key, []byte{1, 2, 3})
	require.NoError(t, db.write(&w, false))
	_, _, err = db.get(nil, key)
	require.Error(t, err)
}

// An iterator that meets a damaged table stops with RocksDB's error, at
// the seek or at a later move, and the database stays usable: the error
// reaches Go through the iterator's C entry (lq_entry.err).
func TestRDB_IteratorReportsCorruption(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	names := familyList()
	open := func() (*rdb, *families) {
		db, err := openRDB(dir, rdbOptions{mode: txnDB, lockTimeoutMs: lockTimeoutMillis}, names)
		require.NoError(t, err)
		return db, newFamilies(db, names)
	}
	db, _ := open()
	rng := rand.New(rand.NewPCG(1, 2))
	var w writeBuf
	for i := range 400 {
		v := make([]byte, 1024) // incompressible: many data blocks
		for j := range v {
			v[j] = byte(rng.Uint32())
		}
		w.put([]byte{dbkeys.NsAvailable, byte(i >> 8), byte(i)}, v)
	}
	require.NoError(t, db.write(&w, false))
	require.NoError(t, db.flush())
	db.close()

	// Damage the middle of every table: a data block past the first.
	tables, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	require.NoError(t, err)
	require.NotEmpty(t, tables)
	for _, p := range tables {
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		require.NoError(t, err)
		fi, err := f.Stat()
		require.NoError(t, err)
		_, err = f.WriteAt(bytes.Repeat([]byte{0xA5}, 64), fi.Size()/2)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}

	db, fams := open()
	defer db.close()
	fam := fams.of([]byte{dbkeys.NsAvailable})
	for round := 0; round < 2; round++ { // a second iterator works as the first
		it := db.iter(nil, fam, []byte{dbkeys.NsAvailable}, nil, round == 1)
		n := 0
		for ok := it.seek(nil); ok; ok = it.next() {
			n++
		}
		require.Error(t, it.err, "round %d: %d entries read", round, n)
		require.Contains(t, it.err.Error(), "Corruption")
		require.Greater(t, n, 0, "the first block is intact: the error comes from a move")
		require.Less(t, n, 400)
		require.Nil(t, it.key)
		it.close()
	}
	// Reads elsewhere still work.
	var w2 writeBuf
	w2.put([]byte{dbkeys.NsInProgress, 'x'}, []byte("y"))
	require.NoError(t, db.write(&w2, false))
	v, ok, err := db.get(nil, []byte{dbkeys.NsInProgress, 'x'})
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, []byte("y"), v)
}
