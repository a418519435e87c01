package rocksstore

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/leaseq/leaseq/storage"
)

// SyncMode says whether a commit waits for the WAL to reach stable storage.
type SyncMode int

const (
	// SyncAlways fsyncs the WAL before a mutating call returns: an
	// acknowledged enqueue, poll, ack, nack or extend survives power loss.
	// Every call committed since the last fsync shares the next one (the
	// commit pipeline, see commit.go). The zero value, so the safe default.
	SyncAlways SyncMode = iota
	// SyncNone writes the WAL without fsync: commits survive a process
	// crash but not a power loss or kernel panic.
	SyncNone
)

// ParseSyncMode parses "always" or "none". The error wraps
// storage.ErrInvalidArgument.
func ParseSyncMode(s string) (SyncMode, error) {
	switch s {
	case "always":
		return SyncAlways, nil
	case "none":
		return SyncNone, nil
	}
	return SyncAlways, fmt.Errorf("%w: sync mode %q: want always or none", storage.ErrInvalidArgument, s)
}

// String returns "always" or "none".
func (m SyncMode) String() string {
	switch m {
	case SyncAlways:
		return "always"
	case SyncNone:
		return "none"
	}
	return fmt.Sprintf("SyncMode(%d)", int(m))
}

// SuggestedProcs returns the GOMAXPROCS this package suggests for a
// process whose store runs with mode, given Go's default (procs): one
// more with SyncAlways, procs with SyncNone. `leaseq serve` runs with it;
// an application embedding a SyncAlways store can set it with
// runtime.GOMAXPROCS.
//
// Why: with SyncAlways a goroutine holds its P in a cgo fsync for
// hundreds of µs at a time while the commit pipeline's leader holds
// another in its commit. With no P left idle, Go's sysmon retakes one of
// them and goes on waking every 20 µs; with one P more it leaves them
// alone. Measured in process on 2 CPUs, interleaved pairs: e2e (4
// producers, 4 consumers, batches of 32) 14 % more items/s at less CPU
// per item with 3 Ps than with 2, sysmon's sleeps from 7.9 % to 1.8 % of
// the samples (docs/BENCHMARKS.md, session 51). With SyncNone the extra
// P measured worse.
func SuggestedProcs(mode SyncMode, procs int) int {
	if mode == SyncAlways {
		return procs + 1
	}
	return procs
}

// Options configure Open. The zero value is a valid, safe configuration.
type Options struct {
	// Sync is the WAL durability of every mutating call.
	Sync SyncMode
	// Limits the store enforces; zero fields take storage.DefaultLimits'.
	Limits storage.Limits
	// Logger receives lifecycle and recovery messages (never payloads);
	// nil discards.
	Logger *slog.Logger
	// JitterFunc returns a uniform number in [0, 1) for nack backoff; nil
	// uses math/rand/v2.
	JitterFunc func() float64
	// OnDeadline, if set, is called after a commit that created a lease
	// expiry or a delayed VisibleAt (see storage.DeadlineFunc).
	OnDeadline storage.DeadlineFunc
	// Now, if set, times the WAL fsyncs for Metrics.SyncTime (nothing
	// else reads it: store semantics take instants from the callers).
	Now func() time.Time
	// CacheBytes sizes the RocksDB block cache, which also holds index and
	// filter blocks so memory stays bounded as the database grows; 0 means
	// DefaultCacheBytes.
	CacheBytes int64
	// ReadyCacheBytes bounds the copies of available records the committer
	// keeps so that a claim need not read them back (readycache.go); 0
	// means DefaultReadyCacheBytes, < 0 turns the cache off.
	ReadyCacheBytes int64
	// MinFreeDisk is the free space (bytes) the data directory's
	// filesystem keeps in reserve: while less is free, Enqueue fails with
	// storage.ErrNoSpace (acks, nacks and purges, which free space or
	// rewrite records in place, still run), and Recover does not reopen a
	// failed store. 0: no check.
	MinFreeDisk int64
	// RecoverPointInTime opens a database whose write-ahead log is damaged
	// before its end by dropping everything from the damage on (RocksDB's
	// point-in-time recovery), acknowledged writes included. Without it
	// such an Open fails with ErrWALDamaged naming the file and the range;
	// a torn last record (a crash mid-write) is accepted either way.
	RecoverPointInTime bool
	// PrefetchHold is how long a batch claimed ahead by an ack waits for
	// the acking consumer's next poll (SyncAlways only; prefetch.go): 0
	// means DefaultPrefetchHold, < 0 turns claims ahead off.
	PrefetchHold time.Duration

	// Unexported knobs used by this package's measurements and tests.
	inlineMax    int  // payloads up to this many bytes are stored inline; <0: never
	noDelCompact bool // disable the deletion-triggered compaction collector
	memtable     int  // memtable bytes; 0: defaultMemtable
	noStats      bool // RocksDB statistics off (measurement only: Metrics times stay zero)
	noCloseFlush bool // Close leaves the memtables to WAL replay, as a crash does (measurement only)
	// syncHook, if set, runs every WAL fsync (sync is the real one): tests
	// delay or fail it.
	syncHook func(sync func() error) error
}

// DefaultCacheBytes is the block cache size when Options.CacheBytes is 0: a
// sensible share of an edge box's memory that still holds the hot head of
// many queues.
const DefaultCacheBytes = 64 << 20

// defaultInlineMax is the largest payload stored inside the item record.
// Measured (see doc.go): at 256 B inline is faster (one key per item); at
// 64 KiB an external payload avoids rewriting it on poll, nack and expiry.
const defaultInlineMax = 4 << 10

// Metrics is a snapshot of the store's write-path counters. Every field only
// increases; use Sub for interval deltas.
type Metrics struct {
	// Commits counts batches the committer wrote to RocksDB (one
	// transaction and one WAL write each).
	Commits uint64
	// Ops counts calls committed in those batches (an ack's claim ahead,
	// prefetch.go, counts as one more), Items the items they touched
	// (enqueued, claimed, acked, ...): Ops/Commits and Items/Commits show
	// how much one commit carries.
	Ops   uint64
	Items uint64
	// SyncCommits counts written batches that waited for a WAL fsync
	// (SyncAlways only).
	SyncCommits uint64
	// WALSyncs counts WAL fsyncs. One fsync covers every batch written
	// since the previous one, so WALSyncs <= SyncCommits, and
	// Items/WALSyncs is the items made durable per fsync.
	WALSyncs uint64
	// InlineSyncs counts the WALSyncs run by the goroutine of a call that
	// had written its batch with nobody waiting behind it, instead of by
	// the syncer goroutine (no goroutine hand-off for a lone caller).
	InlineSyncs uint64
	// EarlySyncs counts the WALSyncs a syncer began as soon as a batch's
	// record was in the WAL file, while its commit still inserted into the
	// memtables (SyncAlways, batches of 32 items or more that are not a
	// lone synchronous call's; commit.go, fsyncEarlyLocked).
	EarlySyncs uint64
	// CommitTime is the cumulative time RocksDB spent in writes (the
	// commit of every batch), from its statistics.
	CommitTime time.Duration
	// SyncTime is the cumulative time of the WALSyncs fsyncs, timed with
	// Options.Now (zero without it).
	SyncTime time.Duration
	// WriteStall is the cumulative time commits waited on RocksDB's write
	// stalls: writes slowed down or stopped until flushes and compactions
	// caught up (as when every memtable of a family waits for its flush).
	// Time in it is time the store accepted nothing; it should stay near
	// zero.
	WriteStall time.Duration
	// ClaimPasses counts batches that held at least one poll; Polls counts
	// Poll calls. Polls/ClaimPasses > 1 shows polls sharing a commit.
	ClaimPasses uint64
	Polls       uint64
	// Claimed counts items handed out by polls; ClaimReads counts those
	// whose record a claim read back from the database because the
	// ready-record cache did not hold it (readycache.go).
	Claimed    uint64
	ClaimReads uint64
	// Prefetched counts batches claimed ahead by acks (prefetch.go),
	// PrefetchHits those a poll was answered with, PrefetchReleased those
	// given back unused.
	Prefetched       uint64
	PrefetchHits     uint64
	PrefetchReleased uint64
}

// Sub returns m - prev field by field.
func (m Metrics) Sub(prev Metrics) Metrics {
	return Metrics{
		Commits:     m.Commits - prev.Commits,
		Ops:         m.Ops - prev.Ops,
		Items:       m.Items - prev.Items,
		SyncCommits: m.SyncCommits - prev.SyncCommits,
		WALSyncs:    m.WALSyncs - prev.WALSyncs,
		InlineSyncs: m.InlineSyncs - prev.InlineSyncs,
		EarlySyncs:  m.EarlySyncs - prev.EarlySyncs,
		CommitTime:  m.CommitTime - prev.CommitTime,
		SyncTime:    m.SyncTime - prev.SyncTime,
		WriteStall:  m.WriteStall - prev.WriteStall,
		ClaimPasses: m.ClaimPasses - prev.ClaimPasses,
		Polls:       m.Polls - prev.Polls,
		Claimed:     m.Claimed - prev.Claimed,
		ClaimReads:  m.ClaimReads - prev.ClaimReads,

		Prefetched:       m.Prefetched - prev.Prefetched,
		PrefetchHits:     m.PrefetchHits - prev.PrefetchHits,
		PrefetchReleased: m.PrefetchReleased - prev.PrefetchReleased,
	}
}

type rocksStatistics struct {
	writeTime  time.Duration
	writeStall time.Duration // not from the statistics: from the DB's stats property
}

// parseStatistics reads the write histogram out of RocksDB's statistics
// dump, lines like "rocksdb.db.write.micros P50 : 1.0 ... COUNT : 5 SUM : 120".
func parseStatistics(dump string) rocksStatistics {
	var st rocksStatistics
	for _, line := range strings.Split(dump, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if f[0] != "rocksdb.db.write.micros" {
			continue
		}
		for i := 0; i+2 < len(f); i++ {
			if f[i] == "SUM" && f[i+1] == ":" {
				sum, _ := strconv.ParseUint(f[i+2], 10, 64)
				st.writeTime = time.Duration(sum) * time.Microsecond
			}
		}
	}
	return st
}
