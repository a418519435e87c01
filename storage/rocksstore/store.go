package rocksstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// Store is the RocksDB implementation of storage.Store. It is safe for
// concurrent use. Returned slices (payloads) are owned by the caller.
type Store struct {
	dir        string
	opts       Options
	limits     storage.Limits
	log        *slog.Logger
	jitter     func() float64
	inlineMax  int
	onDeadline storage.DeadlineFunc
	rcache     readyCache // the ready-record cache's budget (readycache.go)

	// db is the database (rdb.go): a TransactionDB, or the read-only DB
	// of CheckDir. Commits are never synced (see syncGroup); metadata
	// writes outside the pipeline are synced per Options.Sync.
	db   *rdb
	fams *families // the column family of each namespace (families.go)

	// life guards use of the database: every call holds it shared and
	// Close and Recover take it exclusively, so they wait for calls in
	// flight.
	life struct {
		sync.RWMutex
		closed bool
		down   error // set when Recover failed to reopen: no database open
	}
	// closing is set when Close begins: acks claim nothing ahead from
	// then on, so the batches Close gives back are all there are.
	closing atomic.Bool
	// aside is what Recover gives back and writes once it has reopened
	// a failed store (prefetch.go, setAside), kept until that is
	// durable. REQUIRES: life held exclusively.
	aside asideNotes

	// space caches the free-space check of Enqueue (MinFreeDisk).
	space struct {
		sync.Mutex
		at   int64 // caller instant of the last statfs; 0: never
		free int64
	}

	// mu guards the queue map; queues are added by the committer (and
	// Open) only.
	mu struct {
		sync.Mutex
		queues map[string]*queueState
	}

	pipe pipeline

	slots []*txnSlot // the pipeline's transactions, destroyed by Close

	// Owned by the committer goroutine (and Open, before it starts).
	ids      struct{ next, limit, seen uint64 } // seen: the highest sequence rebuild met, plus one
	latest   atomic.Int64                       // Latest, unix ns (set by rebuild)
	leases   map[storage.LeaseID]*leaseState
	leaseSeq uint64 // the counting half of the next lease token (newToken)
	inflight map[storage.ItemID]*leaseState
	expiry   timedHeap // lease expiries (stale entries skipped)
	delayed  timedHeap // delayed items by visible_at (stale entries skipped)
	// afterDedupChunk, when set (tests), runs after each op of
	// dropDedupChunks.
	afterDedupChunk func()
	// afterSweepAhead, when set (tests), runs in each Sweep after its
	// give-back of stale batches claimed ahead (sweepAhead).
	afterSweepAhead func()
	// orphanMarks are the queues whose delete mark Open found without
	// their config (deletemark.go), for finishDeletes to drop.
	orphanMarks []string
	// delayedKept is the delayed heap's length after it was last
	// compacted (compactDelayed).
	delayedKept int

	// dedupCur is the sweep's lower bound in the dedup_expiry index,
	// which stays on disk (it can be large); sweepMu serializes sweeps.
	dedupCur cursor
	sweepMu  sync.Mutex

	lastStats struct {
		sync.Mutex
		st rocksStatistics
		// base sums the statistics of the databases closed before this
		// one (Recover reopens, and a new database's statistics start
		// from zero), so that the counters never go backwards.
		base rocksStatistics
	}

	m struct {
		commits, ops, items, walSyncs, inlineSyncs, earlySyncs, syncedBatches atomic.Uint64
		plainCommits                                                          atomic.Uint64 // commits without a transaction (runBatch)
		syncNanos                                                             atomic.Uint64
		claimPasses, polls, claimed, claimReads                               atomic.Uint64
		prefetched, prefetchHits, prefetchReleased                            atomic.Uint64
		corrupt                                                               atomic.Uint64
	}
	corruptFirst atomic.Pointer[error]
	// corruptQ counts, per queue, the calls that met damaged data.
	corruptQ struct {
		sync.Mutex
		n map[string]uint64
	}
}

var _ storage.Store = (*Store)(nil)

// idBlock is how many item ids are reserved per persisted high-water
// update: one extra key written per 64Ki enqueued items, and a restart
// skips at most that many sequence numbers.
const idBlock = 1 << 16

// lockTimeoutMillis bounds how long a transaction waits for a row lock.
// The committer is the only transaction, so it never waits; the bound is
// a guard against a bug, not a tuning knob.
const lockTimeoutMillis = 1000

// Open opens (creating if needed) the database in dir and rebuilds the
// in-memory indexes from it.
func Open(dir string, opts Options) (*Store, error) {
	// Owner only: the WAL and SSTs hold payloads. (RocksDB creates its
	// files 0644 less the umask; a 0700 directory keeps others out either
	// way, and leaseq serve also sets its umask to 077.)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("rocksstore: open: %w", err)
	}
	s := &Store{dir: dir, opts: opts, limits: opts.Limits, log: opts.Logger, jitter: opts.JitterFunc, onDeadline: opts.OnDeadline}
	s.limits = s.limits.WithDefaults()
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.jitter == nil {
		s.jitter = rand.Float64
	}
	if fi, err := os.Stat(dir); err == nil && fi.Mode().Perm()&0o077 != 0 {
		s.log.Warn("the data directory is open to other users, who can read payloads from its files; chmod 700 it",
			"data", dir, "mode", fmt.Sprintf("%#o", fi.Mode().Perm()))
	}
	switch {
	case opts.inlineMax == 0:
		s.inlineMax = defaultInlineMax
	case opts.inlineMax < 0:
		s.inlineMax = -1
	default:
		s.inlineMax = opts.inlineMax
	}
	if err := s.openDB(); err != nil {
		return nil, err
	}
	if s.enter("open") == nil {
		s.finishDeletes()
		s.exit()
	}
	s.log.Info("rocksstore opened", "data", dir, "sync", opts.Sync.String(), "queues", len(s.mu.queues),
		"leases", len(s.leases), "prefetch_hold", time.Duration(s.prefetchHold()))
	return s, nil
}

// openDB opens the database in s.dir with s.opts and rebuilds every
// in-memory index from it; Open and Recover call it. A format 1 database
// is migrated first (migrate.go). REQUIRES: no database open, no call in
// flight.
func (s *Store) openDB() error { return s.openDBOnce(false) }

func (s *Store) openDBOnce(migrated bool) error {
	if s.opts.Sync != SyncAlways && s.opts.Sync != SyncNone {
		return fmt.Errorf("rocksstore: open: %w: sync mode %d", storage.ErrInvalidArgument, int(s.opts.Sync))
	}
	cacheBytes := s.opts.CacheBytes
	if cacheBytes == 0 {
		cacheBytes = DefaultCacheBytes
	}
	if cacheBytes < 0 {
		return fmt.Errorf("rocksstore: open: %w: negative CacheBytes", storage.ErrInvalidArgument)
	}
	s.rcache.max = s.opts.ReadyCacheBytes
	if s.rcache.max == 0 {
		s.rcache.max = DefaultReadyCacheBytes
	}
	// Memtables of defaultMemtable bytes, at most 3 per family and 3
	// memtables' worth in all (db_write_buffer_size flushes the family
	// with the oldest data beyond it): bounded memory (96 MiB) and flushes
	// small enough to keep Open's WAL replay short. The rest of the
	// options are in rdb.cc (lq_open), with why.
	memtable := s.opts.memtable
	if memtable <= 0 {
		memtable = defaultMemtable
	}
	// With SyncAlways every commit waits for an fdatasync of the WAL,
	// which costs less on a file already written (zerowal.h): new WALs
	// are made over a zero-filled spare of two memtables, about what one
	// WAL holds before a memtable switch starts the next.
	var zeroedWAL int64
	if s.opts.Sync == SyncAlways {
		zeroedWAL = 2 * int64(memtable)
	}
	if err := checkFamilies(s.dir); err != nil {
		return err
	}
	names := familyList()
	o := rdbOptions{
		mode:          txnDB,
		cacheBytes:    cacheBytes,
		memtable:      int64(memtable),
		stats:         !s.opts.noStats,
		delCompact:    !s.opts.noDelCompact,
		pointInTime:   s.opts.RecoverPointInTime,
		lockTimeoutMs: lockTimeoutMillis,
		zeroedWAL:     zeroedWAL,
	}
	db, torn, err := openRDBPastTornTail(s.dir, o, names)
	if torn != nil {
		s.log.Warn("a write-ahead log ended in a record torn by a crash mid-write; cut it off there, with any newer log written after it, replaying up to it",
			"file", torn.File, "offset", torn.Offset)
	}
	if err != nil {
		return walOpenError(s.dir, translate("open "+s.dir, err))
	}
	if s.opts.RecoverPointInTime {
		s.log.Warn("opened with point-in-time WAL recovery: writes after a damaged WAL record, if any, were dropped", "data", s.dir)
	}
	s.db = db
	s.fams = newFamilies(db, names)
	// Everything in memory is rebuilt from the database.
	s.mu.queues = make(map[string]*queueState)
	s.leases = make(map[storage.LeaseID]*leaseState)
	s.inflight = make(map[storage.ItemID]*leaseState)
	s.ids.next, s.ids.limit = 0, 0
	s.expiry, s.delayed = nil, nil
	s.delayedKept = 0
	s.rcache.bytes = 0
	s.dedupCur.reset()
	if err := s.load(); err != nil {
		if !errors.Is(err, errFormat1) || migrated {
			s.closeDB()
			return err
		}
		s.closeDB()
		moved, err := migrateFormat1(s.dir, cacheBytes, int64(memtable))
		if err != nil {
			return err
		}
		s.log.Info("moved the database from format 1 (one column family) to format 2 (a column family per namespace)", "data", s.dir, "keys", moved)
		return s.openDBOnce(true)
	}
	s.ids.seen = 0
	if err := s.rebuild(); err != nil {
		s.closeDB()
		return err
	}
	if err := s.raiseLatest(); err != nil {
		s.closeDB()
		return err
	}
	if s.ids.seen > s.ids.limit {
		// Damage (found by review, session 69): ids are issued below the
		// stored mark, so new ones would overwrite these items. Issue
		// past every ready, delayed and leased item (dead ones are not
		// scanned at open; leaseq check reports the mark below any item).
		s.log.Warn("the stored id sequence is below ids in use; issuing past them (run leaseq check)", "stored", s.ids.limit, "in_use_below", s.ids.seen)
		s.ids.next, s.ids.limit = s.ids.seen, s.ids.seen
	}
	s.startPipeline()
	return nil
}

// load reads the format version, queue configs, counters and the id
// high-water mark.
func (s *Store) load() error {
	ok, err := s.readFormat()
	if err != nil {
		return err
	}
	if !ok {
		if err := s.db.put(dbkeys.MetaFormatKey(), dbkeys.EncodeUint64(formatVersion), s.opts.Sync == SyncAlways); err != nil {
			return translate("open", err)
		}
	}
	hw, ok, err := s.getRaw(dbkeys.MetaIDSeqKey())
	if err != nil {
		return err
	}
	s.ids.next = 1
	if ok {
		n, err := dbkeys.DecodeUint64(hw)
		if err != nil {
			return fmt.Errorf("rocksstore: open: id sequence: %w: %v", storage.ErrCorrupt, err)
		}
		s.ids.next = max(n, 1)
		s.ids.limit = n
	}
	err = s.scan(dbkeys.QueueConfigPrefix(), dbkeys.PrefixEnd(dbkeys.QueueConfigPrefix()), nil, func(k, v []byte) (bool, error) {
		name, err := dbkeys.DecodeQueueConfigKey(k)
		if err != nil {
			return false, fmt.Errorf("rocksstore: open: %w: %v", storage.ErrCorrupt, err)
		}
		rec, err := dbkeys.DecodeQueueConfig(v)
		if err != nil {
			return false, fmt.Errorf("rocksstore: open: queue %q: %w: %v", name, storage.ErrCorrupt, err)
		}
		// Within this open's limits, which may be lower than those the
		// config was set under.
		s.mu.queues[name] = newQueueState(name, s.limits.ClampQueueConfig(configFromRecord(rec)))
		return true, nil
	})
	if err != nil {
		return err
	}
	for name, q := range s.mu.queues {
		c, err := s.readCounters(name)
		if err != nil {
			return err
		}
		q.counters = c
	}
	return s.loadDeleting()
}

// defaultMemtable is the memtable size (see doc.go for the measurement).
const defaultMemtable = 32 << 20

func (s *Store) readCounters(name string) (dbkeys.Counters, error) {
	v, ok, err := s.getRaw(dbkeys.CountersKey(name))
	if err != nil || !ok {
		return dbkeys.Counters{}, err
	}
	c, err := dbkeys.DecodeCounters(v)
	if err != nil {
		return c, fmt.Errorf("rocksstore: counters of %q: %w: %v", name, storage.ErrCorrupt, err)
	}
	return c, nil
}

// Close implements storage.Store. It waits for calls in flight.
func (s *Store) Close() error {
	s.pipe.breakHoldsForGood()
	// Batches claimed ahead go back first, so that a clean close leaves
	// no lease that no consumer holds (prefetch.go). Calls still in
	// flight claim none after this (closing): an op behind the give-back
	// sees the flag, one ahead of it claimed a batch the give-back finds.
	s.closing.Store(true)
	if s.enter("close") == nil {
		_ = s.giveBackEvery()
		_ = s.keepPromises()
		s.exit()
	}
	s.life.Lock()
	defer s.life.Unlock()
	if s.life.closed {
		return nil
	}
	s.life.closed = true
	if s.life.down != nil {
		return nil // no database open (a failed Recover closed it)
	}
	s.stopPipeline()
	// A clean close flushes the memtables so the next Open does not
	// replay up to max_total_wal_size of WAL (see BenchmarkOpenBacklog).
	var err error
	if !s.opts.noCloseFlush {
		err = s.db.flush()
	}
	s.closeDB() // keeps the last statistics (saveStats)
	if err != nil {
		return translate("close: flush", err)
	}
	s.log.Info("rocksstore closed", "data", s.dir)
	return nil
}

// closeDB closes the database, keeping its statistics for Metrics.
func (s *Store) closeDB() {
	s.saveStats()
	s.lastStats.Lock()
	s.lastStats.base = s.lastStats.st
	s.lastStats.Unlock()
	for _, sl := range s.slots {
		sl.t.destroy()
	}
	s.slots = nil
	s.db.close()
}

// enter marks a call in flight; it fails with ErrClosed after Close.
func (s *Store) enter(op string) error {
	s.life.RLock()
	if s.life.closed {
		s.life.RUnlock()
		return fmt.Errorf("rocksstore: %s: %w", op, storage.ErrClosed)
	}
	if s.life.down != nil {
		err := s.life.down
		s.life.RUnlock()
		return fmt.Errorf("rocksstore: %s: %w", op, err)
	}
	return nil
}

// spaceCheckEvery is how long (in caller time) one statfs answers for.
const spaceCheckEvery = int64(100 * time.Millisecond)

// freeDisk is the space available to the node on dir's filesystem.
func freeDisk(dir string) (int64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, err
	}
	// Block counts are in fragment units (f_frsize, as statvfs and df
	// read them); it equals f_bsize on common Linux filesystems, and
	// Linux reports it as f_bsize when a filesystem leaves it 0.
	unit := st.Frsize
	if unit <= 0 {
		unit = st.Bsize
	}
	return int64(st.Bavail) * unit, nil
}

// FreeDisk reports the bytes free for the node on the data directory's
// filesystem.
func (s *Store) FreeDisk() (int64, error) { return freeDisk(s.dir) }

// checkSpace refuses a write that adds data while the filesystem is below
// MinFreeDisk; now is the caller's instant (it paces the statfs calls).
func (s *Store) checkSpace(now int64) error {
	min := s.opts.MinFreeDisk
	if min <= 0 {
		return nil
	}
	s.space.Lock()
	if s.space.at == 0 || now-s.space.at >= spaceCheckEvery || now < s.space.at {
		free, err := freeDisk(s.dir)
		if err != nil {
			s.space.Unlock()
			return fmt.Errorf("rocksstore: free space of %s: %w", s.dir, err)
		}
		s.space.at, s.space.free = now, free
	}
	free := s.space.free
	s.space.Unlock()
	if free < min {
		return fmt.Errorf("%w: %d MiB free on the data disk, below the %d MiB reserve (--min-free-disk); acks and purges still run",
			storage.ErrNoSpace, free>>20, min>>20)
	}
	return nil
}

// Failed reports why the store stopped taking writes (a write or fsync
// failed: the in-memory indexes may be ahead of the database), or nil.
// Recover reopens it.
func (s *Store) Failed() error {
	s.life.RLock()
	down := s.life.down
	s.life.RUnlock()
	if down != nil {
		return down
	}
	p := &s.pipe
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

// Recover reopens a failed store from its database, once its filesystem
// has MinFreeDisk free again: every in-memory index is rebuilt from what
// was committed, so nothing acknowledged is lost. It waits for calls in
// flight (which fail fast while the store is failed). It reports whether
// it reopened; false with a nil error means there was nothing to do or
// not yet enough space. A reopen that fails leaves the store down (every
// call fails with storage.ErrUnavailable) for the next Recover. Once
// reopened, it gives back the batches claimed ahead that no poll had
// taken and writes the expiries polls answered with one were promised,
// as Close does first (prefetch.go, setAside); if that write fails, the
// store is failed again and Recover returns false with the error. Then,
// as Open does, it finishes the deletes of queues marked deleting
// (deletemark.go) before it returns.
func (s *Store) Recover() (recovered bool, err error) {
	if s.Failed() == nil {
		return false, nil
	}
	// After s.life is unlocked (deferred below): the deletes a failed
	// write cut short are finished, as at Open (deletemark.go).
	defer func() {
		if recovered && s.enter("recover") == nil {
			s.finishDeletes()
			s.exit()
		}
	}()
	if min := s.opts.MinFreeDisk; min > 0 {
		if free, err := freeDisk(s.dir); err != nil || free < min {
			return false, err
		}
	}
	s.pipe.breakHolds()
	defer s.pipe.mendHolds()
	s.life.Lock()
	defer s.life.Unlock()
	if s.life.closed {
		return false, fmt.Errorf("rocksstore: recover: %w", storage.ErrClosed)
	}
	p := &s.pipe
	if s.life.down == nil {
		p.mu.Lock()
		failed := p.failed
		p.mu.Unlock()
		if failed == nil {
			return false, nil // recovered meanwhile
		}
		s.stopPipeline()
		s.setAside()
		s.closeDB()
	}
	// Under p.mu: Failed (/readyz) reads p.failed without s.life.
	p.mu.Lock()
	p.failed, p.pending, p.leading, p.buf, p.slot = nil, nil, false, nil, nil
	p.mu.Unlock()
	if err := s.openDB(); err != nil {
		s.life.down = fmt.Errorf("%w: the database could not be reopened after a failed write (%v)", storage.ErrUnavailable, err)
		s.log.Error("rocksstore reopen failed; retrying later", "err", err)
		return false, err
	}
	s.life.down = nil
	given, kept, err := s.restoreAside()
	if err != nil {
		// Failed again: the next Recover reopens and restores from the
		// same notes.
		return false, fmt.Errorf("rocksstore: recover: give back batches claimed ahead: %w", err)
	}
	s.log.Info("rocksstore recovered: reopened after a failed write", "data", s.dir, "queues", len(s.mu.queues), "leases", len(s.leases),
		"ahead_given_back", given, "promises_kept", kept)
	return true, nil
}

func (s *Store) exit() { s.life.RUnlock() }

// Metrics returns a snapshot of the write-path counters.
func (s *Store) Metrics() Metrics {
	// After Close the statistics are gone: report the last ones read, so
	// counters never go backwards (Sub would wrap).
	if s.enter("metrics") == nil {
		s.saveStats()
		s.exit()
	}
	s.lastStats.Lock()
	st := s.lastStats.st
	s.lastStats.Unlock()
	m := Metrics{
		Commits:     s.m.commits.Load(),
		Ops:         s.m.ops.Load(),
		Items:       s.m.items.Load(),
		WALSyncs:    s.m.walSyncs.Load(),
		InlineSyncs: s.m.inlineSyncs.Load(),
		EarlySyncs:  s.m.earlySyncs.Load(),
		CommitTime:  st.writeTime,
		SyncTime:    time.Duration(s.m.syncNanos.Load()),
		WriteStall:  st.writeStall,
		ClaimPasses: s.m.claimPasses.Load(),
		Polls:       s.m.polls.Load(),
		Claimed:     s.m.claimed.Load(),
		ClaimReads:  s.m.claimReads.Load(),

		Prefetched:       s.m.prefetched.Load(),
		PrefetchHits:     s.m.prefetchHits.Load(),
		PrefetchReleased: s.m.prefetchReleased.Load(),
	}
	if s.opts.Sync == SyncAlways {
		m.SyncCommits = s.m.syncedBatches.Load()
	}
	return m
}

// saveStats reads RocksDB's statistics, added to those of the databases
// closed before, into lastStats. REQUIRES: s.life held (shared or
// exclusive) and the database open.
func (s *Store) saveStats() {
	st := parseStatistics(s.db.statistics())
	st.writeStall = s.db.writeStall()
	s.lastStats.Lock()
	st.writeTime += s.lastStats.base.writeTime
	st.writeStall += s.lastStats.base.writeStall
	s.lastStats.st = st
	s.lastStats.Unlock()
}

// getRaw reads one committed key; the value is a copy.
func (s *Store) getRaw(key []byte) ([]byte, bool, error) {
	s.fams.of(key) // a key outside the open families is a bug
	v, ok, err := s.db.get(nil, key)
	return v, ok, translate("get", err)
}

// scan iterates [lower, upper) (upper nil: unbounded) of the committed
// state starting at seek (nil: lower), calling fn with copies of each key
// and value until fn returns false. The iterator has explicit bounds so it
// never wanders into other namespaces' tombstones.
func (s *Store) scan(lower, upper, seek []byte, fn func(k, v []byte) (bool, error)) error {
	return s.scanAt(nil, lower, upper, seek, fn)
}

// scanAt is scan at snapshot snap (nil: the latest state).
func (s *Store) scanAt(snap *rdbSnap, lower, upper, seek []byte, fn func(k, v []byte) (bool, error)) error {
	return s.scanViewAt(snap, false, lower, upper, seek, func(k, v []byte) (bool, error) {
		return fn(bytes.Clone(k), bytes.Clone(v))
	})
}

// scanView is scan without copies: k and v are valid only during fn.
func (s *Store) scanView(lower, upper, seek []byte, fn func(k, v []byte) (bool, error)) error {
	return s.scanViewAt(nil, false, lower, upper, seek, fn)
}

// scanOnce is scanView for a scan that reads a namespace once from start
// to end (Open's rebuild): its blocks do not evict the block cache, and it
// reads ahead.
func (s *Store) scanOnce(lower, upper []byte, fn func(k, v []byte) (bool, error)) error {
	return s.scanViewAt(nil, true, lower, upper, nil, fn)
}

func (s *Store) scanViewAt(snap *rdbSnap, once bool, lower, upper, seek []byte, fn func(k, v []byte) (bool, error)) error {
	it := s.db.iter(snap, s.fams.of(lower), lower, upper, once)
	defer it.close()
	if seek == nil || bytes.Compare(seek, lower) < 0 {
		seek = lower
	}
	for ok := it.seek(seek); ok; ok = it.next() {
		more, err := fn(it.key, it.value)
		if err != nil {
			return err
		}
		if !more {
			break
		}
	}
	return translate("iterate", it.err)
}

// queueState is the in-memory view of one queue. Lock order:
// Store.mu -> queueState.mu.
type queueState struct {
	name string
	// deleting is set by DeleteQueue once it has begun to drop the
	// queue's dedup keys (dropDedupChunks): nothing may enter the queue
	// (ensureQueue refuses), so the delete that dropped them is the one
	// that removes the queue. Committer only.
	deleting bool
	// countersKey is dbkeys.CountersKey(name), made once: every batch
	// that changes the queue writes it.
	countersKey []byte
	// visPrefix is dbkeys.VisibilityPrefix(name) (batch.headRun).
	visPrefix string
	mu        sync.Mutex
	// cfg and counters: written by the committer, read by anyone.
	// REQUIRES: mu held.
	cfg      storage.QueueConfig
	counters dbkeys.Counters
	// ready is the serve order of the available items. Written by the
	// committer under mu; read by Stats under mu.
	ready readyIndex

	// Committer only: items that count as delayed (their delayed entry
	// exists) with their visible_at, and the queue's live leases.
	delayed map[storage.ItemID]int64
	leases  map[storage.LeaseID]*leaseState
	// recs caches available records the committer wrote (readycache.go).
	// Committer only.
	recs readyRecs
	// recsFull: recs had no room left when last changed (cacheFull).
	// Written by the committer, read by anyone.
	recsFull atomic.Bool

	// prefetch holds the batches claimed ahead (prefetch.go), oldest
	// first. REQUIRES: mu held.
	prefetch []*prefetched
	// returning holds the batches an op still being applied took out of
	// prefetch to give back or end (leaveAheadLocked): Stats hides them
	// until the op's counters land with them (opTx.finish), or the op
	// fails and they go back to prefetch. REQUIRES: mu held.
	returning []*prefetched
	// claimingAhead counts the claims ahead under way (claimAhead): their
	// items have left the ready index and their batch is not yet in
	// prefetch. A poll that looks meanwhile takes the queue as held, as it
	// does for returning, so that its op, which runs after the claim, sees
	// the items (found by review, session 70: it found nothing ready and
	// nothing held, parked, and nobody woke it). REQUIRES: mu held.
	claimingAhead int
	// prefetchSkip counts down the ends of leases that claim nothing
	// ahead. Committer only.
	prefetchSkip int
	// peeking counts the Peeks under way: acks claim nothing ahead
	// meanwhile (claimAhead). REQUIRES: mu held.
	peeking int
}

func newQueueState(name string, cfg storage.QueueConfig) *queueState {
	return &queueState{name: name, countersKey: dbkeys.CountersKey(name), visPrefix: string(dbkeys.VisibilityPrefix(name)), cfg: cfg, delayed: make(map[storage.ItemID]int64), leases: make(map[storage.LeaseID]*leaseState)}
}

func (q *queueState) config() storage.QueueConfig {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.cfg
}

func (q *queueState) maxAttempts(rec *dbkeys.ItemRecord) uint32 {
	if rec.MaxAttempts > 0 {
		return rec.MaxAttempts
	}
	return q.config().MaxAttempts
}

// queue returns the state of an existing queue, or nil.
func (s *Store) queue(name string) *queueState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.queues[name]
}

// live reports whether q is still the state of its queue (not deleted).
func (s *Store) live(q *queueState) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.queues[q.name] == q
}

// ensureQueue returns the queue, creating it with cfg (the default config
// when nil) inside o's batch if needed and Limits.MaxQueues allows.
// REQUIRES: on the committer.
func (s *Store) ensureQueue(o *opTx, name string, cfg *storage.QueueConfig) (*queueState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.mu.queues[name]; q != nil {
		if q.deleting {
			return nil, fmt.Errorf("%w: queue %q is being deleted; retry to create it anew", storage.ErrUnavailable, name)
		}
		return q, nil
	}
	if err := s.limits.CheckNewQueue(len(s.mu.queues)); err != nil {
		return nil, err
	}
	c := s.limits.DefaultQueueConfig()
	if cfg != nil {
		c = *cfg
	}
	o.put(dbkeys.QueueConfigKey(name), dbkeys.EncodeQueueConfig(recordFromConfig(c)))
	q := newQueueState(name, c)
	s.mu.queues[name] = q
	o.onUndo(func() {
		s.mu.Lock()
		delete(s.mu.queues, name)
		s.mu.Unlock()
	})
	s.log.Info("queue created", "queue", name)
	return q, nil
}

func (s *Store) queueNames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.mu.queues))
	for n := range s.mu.queues {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// allocIDs reserves n increasing ids for the op, writing a new
// high-water mark into the batch when the reserved block is used up, and
// returns the first one's sequence number: the op's k-th id is
// dbkeys.NewID(first+k, now). REQUIRES: on the committer.
func (s *Store) allocIDs(o *opTx, n int) (first uint64) {
	first, limit := s.ids.next, s.ids.limit
	if first+uint64(n) > s.ids.limit {
		s.ids.limit = first + uint64(n) + idBlock
		o.put(dbkeys.MetaIDSeqKey(), dbkeys.EncodeUint64(s.ids.limit))
	}
	s.ids.next = first + uint64(n)
	o.undoFn = append(o.undoFn, undoStep{ids: true, idNext: first, idLimit: limit})
	return first
}

func configFromRecord(r dbkeys.QueueConfigRecord) storage.QueueConfig {
	return storage.QueueConfig{
		MaxAttempts:   r.MaxAttempts,
		LeaseDuration: time.Duration(r.Lease),
		DedupWindow:   time.Duration(r.DedupWindow),
		BackoffBase:   time.Duration(r.BackoffBase),
		BackoffMax:    time.Duration(r.BackoffMax),
	}
}

func recordFromConfig(c storage.QueueConfig) dbkeys.QueueConfigRecord {
	return dbkeys.QueueConfigRecord{
		MaxAttempts: c.MaxAttempts,
		Lease:       int64(c.LeaseDuration),
		DedupWindow: int64(c.DedupWindow),
		BackoffBase: int64(c.BackoffBase),
		BackoffMax:  int64(c.BackoffMax),
	}
}

// nanos converts an instant to the persisted unix nanoseconds.
func nanos(t time.Time) int64 { return t.UnixNano() }

// instant converts persisted unix nanoseconds back, in UTC.
func instant(n int64) time.Time { return time.Unix(0, n).UTC() }

func corrupt(op string, key []byte, err error) error {
	return fmt.Errorf("rocksstore: %s: key %x: %w: %v", op, key, storage.ErrCorrupt, err)
}

// translate is the one place RocksDB errors become this package's errors.
// rdb.go reports a RocksDB Status only as its message text, so the Status
// code is recovered from the fixed prefix RocksDB's Status::ToString puts
// first: corruption becomes storage.ErrCorrupt; anything else is wrapped
// as an I/O failure.
func translate(op string, err error) error {
	if err == nil {
		return nil
	}
	if strings.HasPrefix(err.Error(), "Corruption") {
		return fmt.Errorf("rocksstore: %s: %w: %v", op, storage.ErrCorrupt, err)
	}
	if strings.Contains(err.Error(), lockedText) {
		return fmt.Errorf("rocksstore: %s: %w: rocksdb: %v", op, ErrLocked, err)
	}
	return fmt.Errorf("rocksstore: %s: rocksdb: %v", op, err)
}

// checkCtx returns ctx's error wrapped for op, between batches of work.
func checkCtx(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("rocksstore: %s: %w", op, err)
	}
	return nil
}

// cursor is a lower bound for scans of the dedup_expiry index, whose head
// is deleted over and over: every key below bound is known to be gone. The
// committer notes each entry before its batch commits (lowering the bound)
// and marks it done after. A scan raises the bound afterwards, but never
// above an entry that was pending when the scan began or noted while it
// ran: such an entry may be invisible to the scan's iterator.
type cursor struct {
	mu       sync.Mutex
	bound    []byte // nil: the start of the index
	scanning bool
	low      []byte         // lowest key pending at begin or noted during the scan
	pending  map[string]int // entries noted and not yet done
}

// reset forgets the bound (Recover reopens the database).
func (c *cursor) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bound, c.scanning, c.low, c.pending = nil, false, nil, nil
}

func (c *cursor) note(k []byte) {
	c.mu.Lock()
	if c.bound != nil && bytes.Compare(k, c.bound) < 0 {
		c.bound = bytes.Clone(k)
	}
	if c.scanning && (c.low == nil || bytes.Compare(k, c.low) < 0) {
		c.low = bytes.Clone(k)
	}
	if c.pending == nil {
		c.pending = make(map[string]int)
	}
	c.pending[string(k)]++
	c.mu.Unlock()
}

func (c *cursor) done(k string) {
	c.mu.Lock()
	if c.pending[k]--; c.pending[k] <= 0 {
		delete(c.pending, k)
	}
	c.mu.Unlock()
}

// begin starts a scan and returns where it starts. The caller creates its
// iterator after begin returns.
func (c *cursor) begin() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.scanning, c.low = true, nil
	for k := range c.pending {
		if c.low == nil || k < string(c.low) {
			c.low = []byte(k)
		}
	}
	return c.bound
}

// end finishes a scan; with advance set, every entry below newBound that
// the scan could see is gone.
func (c *cursor) end(newBound []byte, advance bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if advance && newBound != nil {
		if c.low != nil && bytes.Compare(c.low, newBound) < 0 {
			newBound = c.low
		}
		c.bound = newBound
	}
	c.scanning, c.low = false, nil
}

func (c *cursor) get() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bound
}

// successor returns the smallest key greater than k.
func successor(k []byte) []byte { return append(bytes.Clone(k), 0) }

// Nonblocking implements storage.Nonblocking: with SyncNone no call waits
// for an fsync (a write may still wait for another caller's batch, which
// does not touch the device either).
func (s *Store) Nonblocking() bool { return s.opts.Sync == SyncNone }
