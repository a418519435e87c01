// Package fdbmodel is an in-memory model of FoundationDB's transaction
// semantics implementing kv.DB, so the FoundationDB layer (fdbsync) is tested
// in the default build without a cluster.
//
// What it models, rule by rule (each has a test with a hand-written history):
//   - MVCC: a transaction reads the database as of its read version (given
//     when it first needed one), plus its own writes (read-your-writes),
//     whether or not others commit meanwhile.
//   - Serializable optimistic concurrency: at commit, a transaction that has
//     writes fails with not_committed (1020) if any key or range it read
//     without snapshot (or declared with AddReadConflictRange) was written by
//     a transaction that committed after its read version. Snapshot reads add
//     no read conflict. Read-only transactions always commit.
//   - Versions follow the injected clock at 1,000,000 a second from New, as
//     FDB's advance about that fast (so a difference of versions measures
//     time alike on every node). A read version is the last commit's version
//     or the clock's, whichever is further on; a commit's is one more than
//     the last commit's and every read version given out, or the clock's if
//     that is further on. Versionstamps are the 8-byte big-endian commit
//     version followed by a 2-byte batch order (always 0: one transaction
//     per batch here), so they are strictly increasing across commits.
//   - Atomic add on little-endian integers (FDB's ADD: the stored value is
//     zero-extended or truncated to the operand's length), adding only a
//     write conflict.
//   - Versionstamped keys and values with FDB's 4-byte little-endian offset
//     suffix; such writes are not readable in their own transaction
//     (accessed_unreadable, 1036, when read).
//   - Watches: fire when the key's value differs from the value the creating
//     transaction saw; active after that transaction commits; failed with the
//     commit's error otherwise; cancelled by Tx.Cancel before commit.
//   - Limits: key 10,000 bytes (2102), value 100,000 bytes (2103), 10 MB per
//     transaction (2101, counted as mutation bytes plus conflict range
//     bytes, as FDB approximates it), and 5 s from read version to read or
//     commit (transaction_too_old, 1007), on the injected clock.
//   - Seeded fault injection at commit of write transactions: not_committed,
//     transaction_too_old, and commit_unknown_result where the commit was
//     applied or not by a seeded coin.
//
// What it does not model: a commit that lands after commit_unknown_result
// was returned (the model decides at once), latency and its effect on
// conflict windows, future_version, throttling, shard moves, and the
// client's retry backoff (OnError returns at once).
//
// Concurrency: one mutex guards the whole database; each Tx is used by one
// goroutine at a time, as with the real bindings.
package fdbmodel

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/fdbsync/kv"
)

// MaxReadVersionAge is how long a read version stays usable, as in FDB.
const MaxReadVersionAge = 5 * time.Second

// Faults configures seeded fault injection at commit. Rates are
// probabilities in [0, 1] applied to every commit of a transaction with
// writes; zero disables that fault.
type Faults struct {
	Seed          uint64
	NotCommitted  float64
	TooOld        float64
	UnknownResult float64
	// UnknownApplied is the probability that a commit reported as
	// commit_unknown_result was in fact applied.
	UnknownApplied float64
}

// Options configures a model database.
type Options struct {
	// Clock measures read version age; required.
	Clock  clock.Clock
	Faults Faults
}

// Stats counts what the model saw; tests assert on it.
type Stats struct {
	Transactions      int64 // commits attempted by transactions with writes
	Committed         int64 // write transactions applied (including unknown-but-applied)
	ReadOnly          int64 // read-only commits
	Conflicts         int64 // real not_committed conflicts
	TooOld            int64 // real transaction_too_old
	TooLarge          int64 // transaction_too_large
	InjNotCommitted   int64
	InjTooOld         int64
	InjUnknown        int64
	InjUnknownApplied int64
	MaxTxnSize        int   // largest write transaction size seen, bytes
	TxnsOver1MB       int64 // write transactions larger than 1 MB
	Keys              int   // live keys in the store (including unpruned versions)
	Watches           int   // watches registered, neither fired nor cancelled
}

// DB is the model database. It is safe for concurrent use.
type DB struct {
	clk    clock.Clock
	start  time.Time // version 0 on clk (commit versions follow it)
	faults Faults

	mu struct {
		sync.Mutex
		data    *skiplist
		version int64         // the last commit's
		maxRV   int64         // the highest read version given out
		commits []commitRec   // write sets of commits newer than some active read version
		active  map[*Tx]int64 // read versions of transactions in progress
		garbage []garbageRec  // keys with versions to prune once no reader needs them
		watches map[string][]*watch
		rng     *rand.Rand
		stats   Stats
	}
}

type commitRec struct {
	v      int64
	writes []krange // sorted by begin, merged
}

type garbageRec struct {
	v   int64
	key string
}

type krange struct{ b, e string }

// New returns an empty model database.
func New(o Options) *DB {
	if o.Clock == nil {
		panic("fdbmodel: Options.Clock is required")
	}
	db := &DB{clk: o.Clock, faults: o.Faults, start: o.Clock.Now()}
	db.mu.data = newSkiplist(o.Faults.Seed + 1)
	db.mu.active = map[*Tx]int64{}
	db.mu.watches = map[string][]*watch{}
	db.mu.rng = rand.New(rand.NewPCG(o.Faults.Seed, 0x5eed))
	return db
}

// Stats returns a snapshot of the counters.
func (db *DB) Stats() Stats {
	db.mu.Lock()
	defer db.mu.Unlock()
	s := db.mu.stats
	s.Keys = db.mu.data.len
	for _, ws := range db.mu.watches {
		s.Watches += len(ws)
	}
	return s
}

// SetFaults replaces the fault rates (the seed keeps its stream).
func (db *DB) SetFaults(f Faults) {
	db.mu.Lock()
	defer db.mu.Unlock()
	db.faults = f
}

// Version returns the last committed version.
func (db *DB) Version() int64 {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.mu.version
}

// CreateTransaction implements kv.DB.
func (db *DB) CreateTransaction() (kv.Tx, error) {
	return db.newTx(), nil
}

func (db *DB) newTx() *Tx {
	t := &Tx{db: db}
	t.reset()
	return t
}

// clockVersionLocked is the version the clock has reached: a million a
// second since New. REQUIRES: db.mu held.
func (db *DB) clockVersionLocked() int64 { return db.clk.Since(db.start).Microseconds() }

// readVersionLocked gives out a read version: the last commit's, or the
// clock's when it is further on (FDB's read versions advance while idle).
// Every later commit gets a higher version. REQUIRES: db.mu held.
func (db *DB) readVersionLocked() int64 {
	rv := max(db.mu.version, db.clockVersionLocked())
	db.mu.maxRV = max(db.mu.maxRV, rv)
	return rv
}

// minActiveLocked is the oldest read version any transaction in progress
// may still read at.
// REQUIRES: db.mu held.
func (db *DB) minActiveLocked() int64 {
	m := db.mu.version
	for _, rv := range db.mu.active {
		if rv < m {
			m = rv
		}
	}
	return m
}

// gcLocked drops conflict history and key versions no active reader needs.
// REQUIRES: db.mu held.
func (db *DB) gcLocked() {
	min := db.minActiveLocked()
	i := 0
	for i < len(db.mu.commits) && db.mu.commits[i].v <= min {
		i++
	}
	if i > 0 {
		db.mu.commits = append(db.mu.commits[:0], db.mu.commits[i:]...)
	}
	j := 0
	for j < len(db.mu.garbage) && db.mu.garbage[j].v <= min {
		db.pruneLocked(db.mu.garbage[j].key, min)
		j++
	}
	if j > 0 {
		db.mu.garbage = append(db.mu.garbage[:0], db.mu.garbage[j:]...)
	}
}

// pruneLocked keeps only the versions of key a reader at >= min can see.
// REQUIRES: db.mu held.
func (db *DB) pruneLocked(key string, min int64) {
	n := db.mu.data.get(key)
	if n == nil {
		return
	}
	// Index of the newest version <= min: everything before it is unreadable.
	keep := -1
	for i := len(n.vers) - 1; i >= 0; i-- {
		if n.vers[i].v <= min {
			keep = i
			break
		}
	}
	if keep > 0 {
		n.vers = append(n.vers[:0], n.vers[keep:]...)
	}
	if len(n.vers) == 1 && n.vers[0].del && n.vers[0].v <= min {
		db.mu.data.remove(key)
	}
}

// readLocked returns key's value at rv.
// REQUIRES: db.mu held.
func (db *DB) readLocked(key string, rv int64) ([]byte, bool) {
	n := db.mu.data.get(key)
	if n == nil {
		return nil, false
	}
	return n.at(rv)
}

// writeLocked appends a version to key.
// REQUIRES: db.mu held.
func (db *DB) writeLocked(key string, v int64, val []byte, del bool) {
	var n *node
	if del {
		n = db.mu.data.get(key)
		if n == nil {
			return
		}
		if _, ok := n.latest(); !ok {
			return
		}
	} else {
		n = db.mu.data.getOrInsert(key)
	}
	if len(n.vers) > 0 && n.vers[len(n.vers)-1].v == v {
		n.vers[len(n.vers)-1] = version{v: v, val: val, del: del}
	} else {
		n.vers = append(n.vers, version{v: v, val: val, del: del})
	}
	db.mu.garbage = append(db.mu.garbage, garbageRec{v: v, key: key})
	db.fireWatchesLocked(key, val, !del)
}

// watch is a registered (or pending) watch.
type watch struct {
	key      string
	baseline []byte
	present  bool
	done     chan struct{}
	once     sync.Once
	err      error
	db       *DB
}

func (w *watch) Done() <-chan struct{} { return w.done }

func (w *watch) Err() error {
	<-w.done
	return w.err
}

func (w *watch) Cancel() {
	w.db.mu.Lock()
	defer w.db.mu.Unlock()
	w.db.unregisterLocked(w)
	w.fire(kv.ErrWatchCancelled)
}

// fire closes the watch once; err is nil for a change.
func (w *watch) fire(err error) {
	w.once.Do(func() {
		w.err = err
		close(w.done)
	})
}

// REQUIRES: db.mu held.
func (db *DB) unregisterLocked(w *watch) {
	ws := db.mu.watches[w.key]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(db.mu.watches, w.key)
	} else {
		db.mu.watches[w.key] = ws
	}
}

// REQUIRES: db.mu held.
func (db *DB) fireWatchesLocked(key string, val []byte, present bool) {
	ws := db.mu.watches[key]
	if len(ws) == 0 {
		return
	}
	var keep []*watch
	for _, w := range ws {
		if w.present != present || !bytes.Equal(w.baseline, val) {
			w.fire(nil)
		} else {
			keep = append(keep, w)
		}
	}
	if len(keep) == 0 {
		delete(db.mu.watches, key)
	} else {
		db.mu.watches[key] = keep
	}
}

// REQUIRES: db.mu held.
func (db *DB) registerWatchLocked(w *watch) {
	val, ok := db.readLocked(w.key, db.mu.version)
	if ok != w.present || !bytes.Equal(val, w.baseline) {
		w.fire(nil)
		return
	}
	db.mu.watches[w.key] = append(db.mu.watches[w.key], w)
}

// addLE adds the little-endian operand p to existing value cur, FDB style:
// cur is zero-extended or truncated to len(p).
func addLE(cur, p []byte) []byte {
	out := make([]byte, len(p))
	var carry uint16
	for i := range p {
		var c byte
		if i < len(cur) {
			c = cur[i]
		}
		s := uint16(c) + uint16(p[i]) + carry
		out[i] = byte(s)
		carry = s >> 8
	}
	return out
}

func int64LE(d int64) []byte {
	b := make([]byte, 8)
	binary.LittleEndian.PutUint64(b, uint64(d))
	return b
}

// mergeRanges sorts and merges overlapping ranges.
func mergeRanges(rs []krange) []krange {
	if len(rs) == 0 {
		return nil
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].b < rs[j].b })
	out := []krange{rs[0]}
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		if r.b <= last.e {
			if r.e > last.e {
				last.e = r.e
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

// intersects reports whether r overlaps any range of merged (sorted,
// disjoint).
func intersects(merged []krange, r krange) bool {
	// First range whose end is after r.b.
	i := sort.Search(len(merged), func(i int) bool { return merged[i].e > r.b })
	return i < len(merged) && merged[i].b < r.e
}
