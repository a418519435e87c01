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
	// Concurrent commits share one fsync (RocksDB write groups). The zero
	// value, so the safe default.
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

// Options configure Open. The zero value is a valid, safe configuration.
type Options struct {
	// Sync is the WAL durability of every mutating call.
	Sync SyncMode
	// Limits the store enforces; the zero value means storage.DefaultLimits.
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
	// CacheBytes sizes the RocksDB block cache, which also holds index and
	// filter blocks so memory stays bounded as the database grows; 0 means
	// DefaultCacheBytes.
	CacheBytes int64

	// Unexported knobs used by this package's measurements and tests.
	engine       engineKind // which transaction DB
	inlineMax    int        // payloads up to this many bytes are stored inline; <0: never
	noDelCompact bool       // disable the deletion-triggered compaction collector
	noHeads      bool       // claim scans start at the index start (measurement only)
	memtable     int        // memtable bytes; 0: defaultMemtable
	noStats      bool       // RocksDB statistics off (measurement only: Metrics times stay zero)
	noCloseFlush bool       // Close leaves the memtables to WAL replay, as a crash does (measurement only)
}

// DefaultCacheBytes is the block cache size when Options.CacheBytes is 0: a
// sensible share of an edge box's memory that still holds the hot head of
// many queues.
const DefaultCacheBytes = 64 << 20

// defaultInlineMax is the largest payload stored inside the item record.
// Measured (see doc.go): at 256 B inline is faster (one key per item); at
// 64 KiB an external payload avoids rewriting it on poll, nack and expiry.
const defaultInlineMax = 4 << 10

// engineKind selects the RocksDB transaction flavour.
type engineKind int

const (
	enginePessimistic engineKind = iota // TransactionDB (the default; see doc.go)
	engineOptimistic                    // OptimisticTransactionDB
)

// String names the engine in logs and benchmark names.
func (k engineKind) String() string {
	if k == engineOptimistic {
		return "optimistic"
	}
	return "pessimistic"
}

// Metrics is a snapshot of the store's write-path counters. Every field only
// increases; use Sub for interval deltas.
type Metrics struct {
	// Commits counts committed write transactions (and single writes).
	Commits uint64
	// SyncCommits counts commits that waited for a WAL fsync.
	SyncCommits uint64
	// WALSyncs counts WAL fsyncs RocksDB performed. Concurrent synced
	// commits share one fsync (group commit), so WALSyncs < SyncCommits
	// under concurrency.
	WALSyncs uint64
	// CommitTime is the cumulative time RocksDB spent in writes (the
	// commit of every transaction, fsync included), from its statistics.
	CommitTime time.Duration
	// SyncTime is the cumulative time of the WALSyncs fsyncs: SyncTime /
	// WALSyncs is the mean fsync latency.
	SyncTime time.Duration
	// Retries counts transactions rerun after a conflict, lock timeout or
	// deadlock.
	Retries uint64
	// ClaimPasses counts poll claim transactions; Polls counts Poll calls
	// served by them. Polls/ClaimPasses > 1 shows coalescing.
	ClaimPasses uint64
	Polls       uint64
	// Claimed counts items handed out by polls.
	Claimed uint64
}

// Sub returns m - prev field by field.
func (m Metrics) Sub(prev Metrics) Metrics {
	return Metrics{
		Commits:     m.Commits - prev.Commits,
		SyncCommits: m.SyncCommits - prev.SyncCommits,
		WALSyncs:    m.WALSyncs - prev.WALSyncs,
		CommitTime:  m.CommitTime - prev.CommitTime,
		SyncTime:    m.SyncTime - prev.SyncTime,
		Retries:     m.Retries - prev.Retries,
		ClaimPasses: m.ClaimPasses - prev.ClaimPasses,
		Polls:       m.Polls - prev.Polls,
		Claimed:     m.Claimed - prev.Claimed,
	}
}

type rocksStatistics struct {
	walSyncs  uint64
	syncTime  time.Duration
	writeTime time.Duration
}

// parseStatistics reads the fsync and write histograms out of RocksDB's
// statistics dump, lines like
// "rocksdb.wal.file.sync.micros P50 : 1.0 ... COUNT : 5 SUM : 120".
func parseStatistics(dump string) rocksStatistics {
	var st rocksStatistics
	for _, line := range strings.Split(dump, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		var count, sum uint64
		for i := 0; i+2 < len(f); i++ {
			if f[i+1] != ":" {
				continue
			}
			switch f[i] {
			case "COUNT":
				count, _ = strconv.ParseUint(f[i+2], 10, 64)
			case "SUM":
				sum, _ = strconv.ParseUint(f[i+2], 10, 64)
			}
		}
		switch f[0] {
		case "rocksdb.wal.file.sync.micros":
			st.walSyncs = count
			st.syncTime = time.Duration(sum) * time.Microsecond
		case "rocksdb.db.write.micros":
			st.writeTime = time.Duration(sum) * time.Microsecond
		}
	}
	return st
}
