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
	"sync"
	"sync/atomic"
	"time"

	"github.com/linxGnu/grocksdb"

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

	eng    engine
	dbOpts *grocksdb.Options
	bbto   *grocksdb.BlockBasedTableOptions
	cache  *grocksdb.Cache
	wo     *grocksdb.WriteOptions // commits, synced per Options.Sync
	ro     *grocksdb.ReadOptions  // point reads; no bounds, shared

	// life guards use of the database: every call holds it shared and
	// Close takes it exclusively, so Close waits for calls in flight.
	life struct {
		sync.RWMutex
		closed bool
	}

	mu struct {
		sync.Mutex
		queues map[string]*queueState
	}

	ids struct {
		sync.Mutex
		next, limit uint64
	}

	txns struct {
		sync.Mutex
		free []*pooledTxn
	}

	// Global time-index cursors: lower bounds below which only tombstones
	// remain, so sweeps do not rescan deleted entries.
	expiryCur, delayedCur, dedupCur cursor
	sweepMu                         sync.Mutex

	lastStats struct {
		sync.Mutex
		st rocksStatistics
	}

	m struct {
		commits, syncCommits, retries atomic.Uint64
		claimPasses, polls, claimed   atomic.Uint64
	}
}

var _ storage.Store = (*Store)(nil)

// idBlock is how many item ids are reserved per persisted high-water
// update: one extra synced write per 64Ki enqueued items, and a restart
// skips at most that many sequence numbers.
const idBlock = 1 << 16

// maxTxnAttempts bounds retries of a transaction that keeps conflicting;
// conflicts are rare (claims on one queue are serialized), so hitting this
// means something is wrong and the caller gets the error.
const maxTxnAttempts = 32

// Open opens (creating if needed) the database in dir.
func Open(dir string, opts Options) (*Store, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("rocksstore: open: %w", err)
	}
	s := &Store{dir: dir, opts: opts, limits: opts.Limits, log: opts.Logger, jitter: opts.JitterFunc, onDeadline: opts.OnDeadline}
	if s.limits == (storage.Limits{}) {
		s.limits = storage.DefaultLimits
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.jitter == nil {
		s.jitter = rand.Float64
	}
	switch {
	case opts.inlineMax == 0:
		s.inlineMax = defaultInlineMax
	case opts.inlineMax < 0:
		s.inlineMax = -1
	default:
		s.inlineMax = opts.inlineMax
	}
	if opts.Sync != SyncAlways && opts.Sync != SyncNone {
		return nil, fmt.Errorf("rocksstore: open: %w: sync mode %d", storage.ErrInvalidArgument, int(opts.Sync))
	}
	cacheBytes := opts.CacheBytes
	if cacheBytes == 0 {
		cacheBytes = DefaultCacheBytes
	}
	if cacheBytes < 0 {
		return nil, fmt.Errorf("rocksstore: open: %w: negative CacheBytes", storage.ErrInvalidArgument)
	}
	s.cache = grocksdb.NewLRUCache(uint64(cacheBytes))
	s.bbto = grocksdb.NewDefaultBlockBasedTableOptions()
	s.bbto.SetBlockCache(s.cache)
	s.bbto.SetFilterPolicy(grocksdb.NewBloomFilterFull(10))
	// Index and filter blocks live in the block cache so memory stays
	// bounded by CacheBytes however large the backlog grows.
	s.bbto.SetCacheIndexAndFilterBlocks(true)
	s.bbto.SetPinL0FilterAndIndexBlocksInCache(true)
	o := grocksdb.NewDefaultOptions()
	s.dbOpts = o
	o.SetCreateIfMissing(true)
	o.SetInfoLogLevel(grocksdb.WarnInfoLogLevel)
	o.SetKeepLogFileNum(2)
	o.SetBlockBasedTableFactory(s.bbto)
	o.SetMergeOperator(countersMerge{})
	o.SetCompression(grocksdb.LZ4Compression)
	// Memtables of defaultMemtable bytes, at most 3: bounded memory (96 MiB) and flushes
	// small enough to keep Open's WAL replay short.
	memtable := opts.memtable
	if memtable <= 0 {
		memtable = defaultMemtable
	}
	o.SetWriteBufferSize(uint64(memtable))
	o.SetMaxWriteBufferNumber(3)
	o.SetMaxBackgroundJobs(2)
	o.SetMaxTotalWalSize(128 << 20)
	// RocksDB's statistics time the WAL fsyncs and writes for Metrics:
	// the store itself never reads a clock.
	if !opts.noStats {
		o.EnableStatistics()
	}
	if !opts.noDelCompact {
		// A queue deletes from its head forever. Mark an SST for
		// compaction when any window of 1000 entries holds 500
		// tombstones, so deleted heads are dropped by compaction rather
		// than skipped by every reader (see doc.go for the measurement).
		o.AddCompactOnDeletionCollectorFactory(1000, 500)
	}
	var err error
	switch opts.engine {
	case engineOptimistic:
		// Conflict checks read memtable history; keep one memtable's
		// worth so they never fail with TryAgain.
		o.SetMaxWriteBufferSizeToMaintain(int64(memtable))
		s.eng, err = openOptimistic(o, dir)
	default:
		s.eng, err = openPessimistic(o, dir)
	}
	if err != nil {
		s.destroyOptions()
		return nil, translate("open "+dir, err)
	}
	s.wo = grocksdb.NewDefaultWriteOptions()
	s.wo.SetSync(opts.Sync == SyncAlways)
	s.ro = grocksdb.NewDefaultReadOptions()
	s.mu.queues = make(map[string]*queueState)
	if err := s.load(); err != nil {
		s.closeDB()
		return nil, err
	}
	s.log.Info("rocksstore opened", "data", dir, "sync", opts.Sync.String(), "engine", opts.engine.String(),
		"queues", len(s.mu.queues))
	return s, nil
}

// load reads the format version, queue configs, counters and the id
// high-water mark. It never scans items.
func (s *Store) load() error {
	v, ok, err := s.getRaw(s.ro, dbkeys.MetaFormatKey())
	if err != nil {
		return err
	}
	if ok {
		f, err := dbkeys.DecodeUint64(v)
		if err != nil {
			return fmt.Errorf("rocksstore: open: format version: %w: %v", storage.ErrCorrupt, err)
		}
		if f != formatVersion {
			return fmt.Errorf("rocksstore: open: %w: database format %d, this build reads %d", storage.ErrCorrupt, f, formatVersion)
		}
	} else if err := s.putRaw("open", dbkeys.MetaFormatKey(), dbkeys.EncodeUint64(formatVersion)); err != nil {
		return err
	}
	hw, ok, err := s.getRaw(s.ro, dbkeys.MetaIDSeqKey())
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
	var names []string
	var cfgs []storage.QueueConfig
	err = s.scan(nil, dbkeys.QueueConfigPrefix(), dbkeys.PrefixEnd(dbkeys.QueueConfigPrefix()), nil, func(k, v []byte) (bool, error) {
		name, err := dbkeys.DecodeQueueConfigKey(k)
		if err != nil {
			return false, fmt.Errorf("rocksstore: open: %w: %v", storage.ErrCorrupt, err)
		}
		rec, err := dbkeys.DecodeQueueConfig(v)
		if err != nil {
			return false, fmt.Errorf("rocksstore: open: queue %q: %w: %v", name, storage.ErrCorrupt, err)
		}
		names = append(names, name)
		cfgs = append(cfgs, configFromRecord(rec))
		return true, nil
	})
	if err != nil {
		return err
	}
	for i, name := range names {
		c, err := s.readCounters(s.ro, name)
		if err != nil {
			return err
		}
		q := newQueueState(name, cfgs[i])
		q.counters = c
		s.mu.queues[name] = q
	}
	return nil
}

// defaultMemtable is the memtable size (see doc.go for the measurement).
const defaultMemtable = 32 << 20

// formatVersion is the database layout this build reads and writes. Part of
// the on-disk format.
const formatVersion = 1

func (s *Store) readCounters(ro *grocksdb.ReadOptions, name string) (dbkeys.Counters, error) {
	v, ok, err := s.getRaw(ro, dbkeys.CountersKey(name))
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
	s.life.Lock()
	defer s.life.Unlock()
	if s.life.closed {
		return nil
	}
	s.life.closed = true
	// A clean close flushes the memtables so the next Open does not
	// replay up to max_total_wal_size of WAL (see BenchmarkOpenBacklog).
	var err error
	if !s.opts.noCloseFlush {
		err = s.eng.flush()
	}
	s.saveStats()
	s.closeDB()
	if err != nil {
		return translate("close: flush", err)
	}
	s.log.Info("rocksstore closed", "data", s.dir)
	return nil
}

func (s *Store) closeDB() {
	s.txns.Lock()
	for _, p := range s.txns.free {
		p.t.Destroy()
	}
	s.txns.free = nil
	s.txns.Unlock()
	s.eng.close()
	if s.wo != nil {
		s.wo.Destroy()
	}
	if s.ro != nil {
		s.ro.Destroy()
	}
	s.destroyOptions()
}

func (s *Store) destroyOptions() {
	// s.dbOpts is deliberately not destroyed: grocksdb's Options.Destroy
	// deletes the options (whose shared_ptr already frees the Go merge
	// operator's C wrapper) and then destroys that wrapper again, a double
	// free that crashes. Leaking one options object per Open is the lesser
	// evil.
	s.bbto.Destroy()
	s.cache.Destroy()
}

// enter marks a call in flight; it fails with ErrClosed after Close.
func (s *Store) enter(op string) error {
	s.life.RLock()
	if s.life.closed {
		s.life.RUnlock()
		return fmt.Errorf("rocksstore: %s: %w", op, storage.ErrClosed)
	}
	return nil
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
	return Metrics{
		Commits:     s.m.commits.Load(),
		SyncCommits: s.m.syncCommits.Load(),
		WALSyncs:    st.walSyncs,
		CommitTime:  st.writeTime,
		SyncTime:    st.syncTime,
		Retries:     s.m.retries.Load(),
		ClaimPasses: s.m.claimPasses.Load(),
		Polls:       s.m.polls.Load(),
		Claimed:     s.m.claimed.Load(),
	}
}

// saveStats reads RocksDB's statistics into lastStats. REQUIRES: s.life
// held (shared or exclusive) and the database open.
func (s *Store) saveStats() {
	st := parseStatistics(s.dbOpts.GetStatisticsString())
	s.lastStats.Lock()
	s.lastStats.st = st
	s.lastStats.Unlock()
}

func (s *Store) recordCommit() {
	s.m.commits.Add(1)
	if s.opts.Sync == SyncAlways {
		s.m.syncCommits.Add(1)
	}
}

// getRaw reads one key outside a transaction; the value is a copy.
func (s *Store) getRaw(ro *grocksdb.ReadOptions, key []byte) ([]byte, bool, error) {
	sl, err := s.eng.get(ro, key)
	return copied("get", sl, err)
}

// copied turns a RocksDB read into an owned copy of the value, freeing the
// slice; op names the read in a translated error.
func copied(op string, sl *grocksdb.Slice, err error) ([]byte, bool, error) {
	if err != nil {
		return nil, false, translate(op, err)
	}
	defer sl.Free()
	if !sl.Exists() {
		return nil, false, nil
	}
	return bytes.Clone(sl.Data()), true, nil
}

// putRaw writes one key outside a transaction (metadata only).
func (s *Store) putRaw(op string, key, value []byte) error {
	if err := s.eng.put(s.wo, key, value); err != nil {
		return translate(op, err)
	}
	s.recordCommit()
	return nil
}

// scan iterates [lower, upper) (upper nil: unbounded) starting at seek (nil:
// lower), at snap (nil: the latest state), calling fn with copies of each
// key and value until fn returns false. The iterator has explicit bounds so
// it never wanders into other namespaces' tombstones.
func (s *Store) scan(snap *grocksdb.Snapshot, lower, upper, seek []byte, fn func(k, v []byte) (bool, error)) error {
	it, ro := s.newIter(snap, lower, upper)
	defer func() {
		it.Close()
		ro.Destroy()
	}()
	if seek == nil || bytes.Compare(seek, lower) < 0 {
		seek = lower
	}
	for it.Seek(seek); it.Valid(); it.Next() {
		more, err := fn(copySlice(it.Key()), copySlice(it.Value()))
		if err != nil {
			return err
		}
		if !more {
			break
		}
	}
	if err := it.Err(); err != nil {
		return translate("iterate", err)
	}
	return nil
}

// newIter returns an iterator bounded to [lower, upper), reading at snap
// (nil: the latest state), and the read options it uses, which the caller
// destroys after closing the iterator.
func (s *Store) newIter(snap *grocksdb.Snapshot, lower, upper []byte) (*grocksdb.Iterator, *grocksdb.ReadOptions) {
	ro := grocksdb.NewDefaultReadOptions()
	if snap != nil {
		ro.SetSnapshot(snap)
	}
	// The bound slices are referenced by C until ro is destroyed; they are
	// fresh allocations the caller never mutates.
	ro.SetIterateLowerBound(bytes.Clone(lower))
	if upper != nil {
		ro.SetIterateUpperBound(bytes.Clone(upper))
	}
	return s.eng.iterator(ro), ro
}

// copySlice copies an iterator slice (owned by the iterator, so there is
// nothing to free) into Go memory.
func copySlice(sl *grocksdb.Slice) []byte {
	if sl == nil {
		return nil
	}
	return bytes.Clone(sl.Data())
}

// pooledTxn is a RocksDB transaction object kept for reuse, with its write
// batch handle. Reusing the object (TransactionBegin with an old txn)
// saves an allocation per commit, and the batch handle must be fetched
// once per object because grocksdb allocates a wrapper on every call.
type pooledTxn struct {
	t  *grocksdb.Transaction
	wb *grocksdb.WriteBatchWI
}

// txn is one attempt of a read-write transaction plus the side effects to
// apply once it commits.
type txn struct {
	s      *Store
	p      *pooledTxn // nil for a blind batch (runBlind)
	deltas []queueDelta
	next   time.Time // earliest new deadline (OnDeadline)
	notes  []noteRef // index entries noted to cursors, done when the attempt ends
	// writes buffers the attempt's puts and deletes (nil value: delete).
	// They reach the RocksDB transaction at commit in key order: the
	// memtable skiplist inserts a sorted batch along one path (its
	// sequential-insert splice) instead of searching from the top for
	// every key, which was the largest CPU cost of a commit. Reads in the
	// transaction see these writes first.
	writes map[string][]byte
}

// noteRef is an index entry a transaction announced to a cursor (c) or to
// its queue's visibility heads (q).
type noteRef struct {
	c   *cursor
	q   *queueState
	key string
}

// note announces a global time-index entry this transaction will commit.
func (tx *txn) note(c *cursor, k []byte) {
	c.note(k)
	tx.notes = append(tx.notes, noteRef{c: c, key: string(k)})
}

// endNotes marks the attempt's noted entries committed or rolled back.
func (tx *txn) endNotes() {
	for _, n := range tx.notes {
		if n.c != nil {
			n.c.done(n.key)
		} else {
			n.q.doneVisible(n.key)
		}
	}
	tx.notes = nil
}

type queueDelta struct {
	q *queueState
	d dbkeys.Counters
}

func (s *Store) beginTxn() *txn {
	s.txns.Lock()
	var p *pooledTxn
	if n := len(s.txns.free); n > 0 {
		p = s.txns.free[n-1]
		s.txns.free = s.txns.free[:n-1]
	}
	s.txns.Unlock()
	if p == nil {
		t := s.eng.begin(s.wo, nil)
		p = &pooledTxn{t: t, wb: t.GetWriteBatchWI()}
	} else {
		p.t = s.eng.begin(s.wo, p.t)
	}
	return &txn{s: s, p: p, writes: make(map[string][]byte)}
}

func (s *Store) releaseTxn(p *pooledTxn) {
	s.txns.Lock()
	s.txns.free = append(s.txns.free, p)
	s.txns.Unlock()
}

// runBlind runs fn, which only writes keys no other call can touch (new
// items under fresh ids, their index entries) and reads nothing, and
// commits its writes as one plain write batch: the same atomicity and
// durability as a transaction without its per-key indexing. Counter deltas
// and cursor notes work as in runTxn.
func (s *Store) runBlind(op string, fn func(tx *txn) error) error {
	tx := &txn{s: s, writes: make(map[string][]byte)}
	defer tx.endNotes()
	if err := fn(tx); err != nil {
		return err
	}
	if err := s.commitBlind(op, tx); err != nil {
		return err
	}
	tx.endNotes()
	tx.apply()
	return nil
}

// commitBlind writes tx's buffered writes and counter deltas atomically
// without locking any key. A TransactionDB write batch would lock every key
// in it, the counters key included, for the whole commit, fsync included:
// concurrent enqueues on one queue would then queue up behind each other's
// fsync instead of sharing it. So on TransactionDB the batch goes into a
// transaction's write batch directly (untracked, as the counter deltas of
// every transaction do); the optimistic base DB writes it as it is.
func (s *Store) commitBlind(op string, tx *txn) error {
	if _, ok := s.eng.(*pessimisticEngine); ok {
		bt := s.beginTxn()
		for _, k := range tx.sortedKeys() {
			if v := tx.writes[k]; v != nil {
				bt.p.wb.Put([]byte(k), v)
			} else {
				bt.p.wb.Delete([]byte(k))
			}
		}
		bt.deltas = tx.deltas
		if err := bt.commit(op); err != nil {
			rbErr := bt.p.t.Rollback()
			s.releaseTxn(bt.p)
			if rbErr != nil {
				return errors.Join(err, translate(op+": rollback", rbErr))
			}
			return err
		}
		s.releaseTxn(bt.p)
		return nil
	}
	wb := grocksdb.NewWriteBatch()
	defer wb.Destroy()
	for _, k := range tx.sortedKeys() {
		if v := tx.writes[k]; v != nil {
			wb.Put([]byte(k), v)
		} else {
			wb.Delete([]byte(k))
		}
	}
	for _, d := range tx.deltas {
		if !d.d.IsZero() {
			wb.Merge(dbkeys.CountersKey(d.q.name), dbkeys.EncodeCounters(d.d))
		}
	}
	if err := s.eng.write(s.wo, wb); err != nil {
		return translate(op+": write", err)
	}
	s.recordCommit()
	return nil
}

func (tx *txn) sortedKeys() []string {
	keys := make([]string, 0, len(tx.writes))
	for k := range tx.writes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// runTxn runs fn in a transaction and commits it, retrying on conflicts.
// fn may run several times; it must keep its effects inside tx.
func (s *Store) runTxn(op string, fn func(tx *txn) error) error {
	for attempt := 1; ; attempt++ {
		tx := s.beginTxn()
		err := fn(tx)
		if err == nil {
			err = tx.commit(op)
		}
		if err == nil {
			s.releaseTxn(tx.p)
			tx.endNotes()
			tx.apply()
			return nil
		}
		rbErr := tx.p.t.Rollback()
		s.releaseTxn(tx.p)
		tx.endNotes()
		if rbErr != nil {
			return errors.Join(err, translate(op+": rollback", rbErr))
		}
		if !errors.Is(err, errRetry) || attempt >= maxTxnAttempts {
			return err
		}
		s.m.retries.Add(1)
	}
}

// commit hands the buffered writes to RocksDB in key order and commits.
// The writes go into the transaction's batch untracked (no row lock, no
// conflict tracking): every key a transaction writes is either fresh (a new
// id, lease token or index entry of one) or belongs to a key it read with
// GetForUpdate first (the item's record, the lease, the dedup key), so
// those reads already exclude every concurrent writer. Skipping the lock
// manager for the rest saves a lock per written key.
func (tx *txn) commit(op string) error {
	for _, k := range tx.sortedKeys() {
		if v := tx.writes[k]; v != nil {
			tx.p.wb.Put([]byte(k), v)
		} else {
			tx.p.wb.Delete([]byte(k))
		}
	}
	for _, d := range tx.deltas {
		if !d.d.IsZero() {
			// Counter deltas bypass the transaction's locking: they are
			// merge operands that commute, so concurrent commits on one
			// queue must not serialize (and hold each other's fsync) on
			// the counters key. They still commit atomically with the
			// rest of the batch.
			tx.p.wb.Merge(dbkeys.CountersKey(d.q.name), dbkeys.EncodeCounters(d.d))
		}
	}
	if err := tx.p.t.Commit(); err != nil {
		return translate(op+": commit", err)
	}
	tx.s.recordCommit()
	return nil
}

// apply publishes a committed transaction's counter deltas and deadline.
func (tx *txn) apply() {
	for _, d := range tx.deltas {
		if d.d.IsZero() {
			continue
		}
		d.q.mu.Lock()
		d.q.counters = d.q.counters.Add(d.d)
		d.q.mu.Unlock()
	}
	if !tx.next.IsZero() && tx.s.onDeadline != nil {
		tx.s.onDeadline(tx.next)
	}
}

// delta returns the pending counter delta of q.
func (tx *txn) delta(q *queueState) *dbkeys.Counters {
	for i := range tx.deltas {
		if tx.deltas[i].q == q {
			return &tx.deltas[i].d
		}
	}
	tx.deltas = append(tx.deltas, queueDelta{q: q})
	return &tx.deltas[len(tx.deltas)-1].d
}

func (tx *txn) deadline(t time.Time) {
	if tx.next.IsZero() || t.Before(tx.next) {
		tx.next = t
	}
}

// getForUpdate reads key under the transaction's lock (pessimistic) or
// conflict tracking (optimistic). The value is a copy.
func (tx *txn) getForUpdate(key []byte) ([]byte, bool, error) {
	if tx.p == nil {
		return nil, false, errBlindRead
	}
	if v, ok := tx.writes[string(key)]; ok {
		// Written by this transaction: either a fresh key nobody else
		// can know yet, or one it locked (or, optimistic, tracked) when
		// it read it first.
		return v, v != nil, nil
	}
	sl, err := tx.p.t.GetForUpdate(tx.s.ro, key)
	return copied("get for update", sl, err)
}

// get reads key through the transaction (seeing its own writes) without
// locking it.
func (tx *txn) get(key []byte) ([]byte, bool, error) {
	if v, ok := tx.writes[string(key)]; ok {
		return v, v != nil, nil
	}
	if tx.p == nil {
		return nil, false, errBlindRead
	}
	sl, err := tx.p.t.Get(tx.s.ro, key)
	return copied("get", sl, err)
}

func (tx *txn) exists(key []byte) (bool, error) {
	_, ok, err := tx.get(key)
	return ok, err
}

// put buffers a write; value must not be nil and must not change later.
func (tx *txn) put(key, value []byte) error {
	if value == nil {
		value = []byte{}
	}
	tx.writes[string(key)] = value
	return nil
}

// del buffers a delete.
func (tx *txn) del(key []byte) error {
	tx.writes[string(key)] = nil
	return nil
}

// errBlindRead reports a read inside runBlind: a bug.
var errBlindRead = errors.New("rocksstore: read in a blind batch")

// cursor is a lower bound for scans of an index whose head is deleted
// over and over (a global time index): every key below bound is known to
// be gone. A writer notes each entry before it commits it (lowering the
// bound) and marks it done after commit or rollback. A scan raises the
// bound afterwards, but never above an entry that was pending when the
// scan began or noted while it ran: such an entry may be invisible to the
// scan's iterator.
type cursor struct {
	mu       sync.Mutex
	bound    []byte // nil: the start of the index
	scanning bool
	low      []byte         // lowest key pending at begin or noted during the scan
	pending  map[string]int // entries noted and not yet done
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
// the scan could see is gone (deleted by its committed transactions).
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

// queueState is the in-memory view of one queue: config, counters (the
// persisted counters plus every committed delta) and the visibility-index
// heads. Lock order: claim.mu -> mu.
type queueState struct {
	name string
	mu   sync.Mutex
	cfg  storage.QueueConfig
	// counters mirror the persisted counters. REQUIRES: mu held.
	counters dbkeys.Counters
	// heads[p] is a lower bound of the live visibility entries of
	// priority p (nil: the priority's start). REQUIRES: mu held.
	heads    [256][]byte
	scanning bool
	low      [256][]byte    // per priority: lowest entry pending at scan start or noted during it
	pending  map[string]int // visibility entries noted and not yet committed or rolled back

	claim struct {
		sync.Mutex
		running bool
		pending []*pollReq
	}
}

func newQueueState(name string, cfg storage.QueueConfig) *queueState {
	return &queueState{name: name, cfg: cfg}
}

// noteVisible lowers the head of k's priority before a transaction that
// inserts visibility entry k commits, so no claim pass skips it.
func (q *queueState) noteVisible(tx *txn, prio uint8, k []byte) {
	q.mu.Lock()
	if h := q.heads[prio]; h != nil && bytes.Compare(k, h) < 0 {
		q.heads[prio] = bytes.Clone(k)
	}
	if q.scanning && (q.low[prio] == nil || bytes.Compare(k, q.low[prio]) < 0) {
		q.low[prio] = bytes.Clone(k)
	}
	if q.pending == nil {
		q.pending = make(map[string]int)
	}
	q.pending[string(k)]++
	q.mu.Unlock()
	tx.notes = append(tx.notes, noteRef{q: q, key: string(k)})
}

func (q *queueState) doneVisible(k string) {
	q.mu.Lock()
	if q.pending[k]--; q.pending[k] <= 0 {
		delete(q.pending, k)
	}
	q.mu.Unlock()
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

// ensureQueue returns the queue, creating it with the default config (a
// durable write) if needed.
func (s *Store) ensureQueue(name string) (*queueState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if q := s.mu.queues[name]; q != nil {
		return q, nil
	}
	cfg := storage.DefaultQueueConfig()
	if err := s.putRaw("create queue "+name, dbkeys.QueueConfigKey(name), dbkeys.EncodeQueueConfig(recordFromConfig(cfg))); err != nil {
		return nil, err
	}
	q := newQueueState(name, cfg)
	s.mu.queues[name] = q
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

// allocIDs reserves n increasing ids, persisting a new high-water mark
// first when the reserved block is used up.
func (s *Store) allocIDs(n int, now int64) ([]storage.ItemID, error) {
	s.ids.Lock()
	defer s.ids.Unlock()
	if s.ids.next+uint64(n) > s.ids.limit {
		limit := s.ids.next + uint64(n) + idBlock
		if err := s.putRaw("reserve ids", dbkeys.MetaIDSeqKey(), dbkeys.EncodeUint64(limit)); err != nil {
			return nil, err
		}
		s.ids.limit = limit
	}
	out := make([]storage.ItemID, n)
	for i := range out {
		out[i] = dbkeys.NewID(s.ids.next, now)
		s.ids.next++
	}
	return out, nil
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

// countersMerge is the merge operator of the counters keys: operands are
// deltas, merging adds them.
type countersMerge struct{}

// Name is recorded in RocksDB's OPTIONS file: part of the on-disk format.
func (countersMerge) Name() string { return "leaseq.counters.v1" }

// FullMerge adds the operands to the existing value (absent: zero).

func (countersMerge) FullMerge(_, existing []byte, operands [][]byte) ([]byte, bool) {
	var sum dbkeys.Counters
	if existing != nil {
		c, err := dbkeys.DecodeCounters(existing)
		if err != nil {
			return nil, false
		}
		sum = c
	}
	for _, op := range operands {
		c, err := dbkeys.DecodeCounters(op)
		if err != nil {
			return nil, false
		}
		sum = sum.Add(c)
	}
	return dbkeys.EncodeCounters(sum), true
}

// PartialMerge adds two operands, so compactions fold long operand runs.
func (countersMerge) PartialMerge(_, left, right []byte) ([]byte, bool) {
	l, err := dbkeys.DecodeCounters(left)
	if err != nil {
		return nil, false
	}
	r, err := dbkeys.DecodeCounters(right)
	if err != nil {
		return nil, false
	}
	return dbkeys.EncodeCounters(l.Add(r)), true
}

// checkCtx returns ctx's error wrapped for op, between batches of work.
func checkCtx(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("rocksstore: %s: %w", op, err)
	}
	return nil
}
