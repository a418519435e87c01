// Package kv is the narrow transaction interface the FoundationDB layer
// (fdbsync) is written against. It holds exactly what the layer needs from
// FoundationDB: point and batched gets, range reads (limit, reverse,
// snapshot), set, clear, clear range, atomic add, versionstamped keys and
// values, watches, the read version, explicit conflict ranges, commit and
// FDB's retry rules.
//
// Two implementations exist: the real bindings (fdbsync, build tag fdb, API
// version 730) and an in-memory model of FDB's transaction semantics
// (fdbsync/fdbmodel) used by every test in the default build. Nothing here
// imports the bindings, so the default build needs no libfdb_c.
//
// Conventions follow FDB exactly so the layer behaves the same on both:
//   - a missing key reads as a nil value; a present empty value as []byte{};
//   - Add takes a little-endian int64 (FDB's ADD mutation on 8 bytes);
//   - versionstamped keys and values carry a 4-byte little-endian offset
//     suffix naming where the 10-byte versionstamp goes (API >= 520);
//   - errors are Error values with FDB's numeric codes, so retry decisions
//     (IsRetryable, IsMaybeCommitted) are the same for model and cluster.
//
// A Tx is used by one goroutine at a time. Slices passed in are not retained
// after the call returns unless the method says so; returned slices belong
// to the caller.
package kv

import (
	"errors"
	"fmt"
)

// VersionstampSize is the length of a versionstamp: 8 bytes commit version
// (big-endian) and 2 bytes batch order, as FDB assigns them.
const VersionstampSize = 10

// Versionstamp is the 10-byte stamp FDB assigns to a committed transaction.
// Byte order is commit order: later commits have larger stamps.
type Versionstamp [VersionstampSize]byte

// KeyValue is one row returned by a range read.
type KeyValue struct {
	Key   []byte
	Value []byte
}

// RangeOptions controls GetRange.
type RangeOptions struct {
	// Limit caps the number of rows returned; 0 means no limit.
	Limit int
	// Reverse returns the last rows of the range first.
	Reverse bool
	// Snapshot makes the read add no read conflict range.
	Snapshot bool
}

// DB creates transactions. It is safe for concurrent use.
type DB interface {
	// CreateTransaction returns a new transaction.
	CreateTransaction() (Tx, error)
}

// Tx is one FDB transaction. Mutations are buffered and visible to later
// reads of the same transaction (read-your-writes), except versionstamped
// ones, whose final key or value is only known at commit.
type Tx interface {
	// Get reads one key; nil when absent. snapshot avoids a read conflict.
	Get(key []byte, snapshot bool) ([]byte, error)
	// GetMany reads several keys concurrently (one round trip on a real
	// cluster); result i is the value of keys[i], nil when absent.
	GetMany(keys [][]byte, snapshot bool) ([][]byte, error)
	// GetRange reads rows with begin <= key < end.
	GetRange(begin, end []byte, o RangeOptions) ([]KeyValue, error)

	// Set writes key = value.
	Set(key, value []byte)
	// Clear deletes key.
	Clear(key []byte)
	// ClearRange deletes every key in [begin, end).
	ClearRange(begin, end []byte)
	// Add atomically adds delta to the little-endian int64 stored at key
	// (absent counts as 0). It adds no read conflict.
	Add(key []byte, delta int64)
	// SetVersionstampedKey sets a key whose last 4 bytes are a
	// little-endian offset; the 10 bytes at that offset are replaced by the
	// commit's versionstamp and the suffix is removed.
	SetVersionstampedKey(keyWithOffset, value []byte)
	// SetVersionstampedValue sets key to a value whose last 4 bytes are a
	// little-endian offset, replaced like SetVersionstampedKey.
	SetVersionstampedValue(key, valueWithOffset []byte)

	// Watch returns a watch on key that fires when its value changes from
	// the value this transaction sees. It is active only once the
	// transaction commits; a failed commit fails it.
	Watch(key []byte) (Watch, error)
	// ReadVersion returns the transaction's read version.
	ReadVersion() (int64, error)
	// AddReadConflictRange makes the transaction conflict with any
	// concurrent write to [begin, end), as if it had read that range.
	AddReadConflictRange(begin, end []byte) error
	// AddWriteConflictRange makes concurrent readers of [begin, end)
	// conflict with this transaction, as if it had written that range.
	AddWriteConflictRange(begin, end []byte) error

	// Commit commits the transaction.
	Commit() error
	// Versionstamp returns the versionstamp of the last successful Commit;
	// an error when the transaction used no versionstamped mutation.
	Versionstamp() (Versionstamp, error)
	// OnError decides what to do with err from an operation or Commit: for
	// a retryable error it resets the transaction (after the backoff the
	// implementation chooses) and returns nil; otherwise it returns an
	// error (err itself or a more specific one).
	OnError(err error) error
	// Cancel abandons the transaction; watches it created but never
	// committed fail.
	Cancel()
}

// Watch is a pending watch on one key.
type Watch interface {
	// Done is closed when the key changed, or the watch failed or was
	// cancelled.
	Done() <-chan struct{}
	// Err reports why Done closed: nil for a change.
	Err() error
	// Cancel releases the watch; Done closes with ErrWatchCancelled
	// unless it had already fired.
	Cancel()
}

// FoundationDB error codes the layer and the model use. Part of FDB's wire
// contract; the numbers are FDB's.
const (
	CodeOperationFailed          = 1000
	CodeTransactionTooOld        = 1007
	CodeFutureVersion            = 1009
	CodeNotCommitted             = 1020
	CodeCommitUnknownResult      = 1021
	CodeTransactionCancelled     = 1025
	CodeTransactionTimedOut      = 1031
	CodeTooManyWatches           = 1032
	CodeAccessedUnreadable       = 1036
	CodeProcessBehind            = 1037
	CodeDatabaseLocked           = 1038
	CodeClusterVersionChanged    = 1039
	CodeProxyMemoryLimitExceeded = 1042
	CodeBatchTxnThrottled        = 1051
	CodeGRVProxyMemoryLimit      = 1078
	CodeTagThrottled             = 1213
	CodeUsedDuringCommit         = 2017
	CodeInvertedRange            = 2005
	CodeTransactionTooLarge      = 2101
	CodeKeyTooLarge              = 2102
	CodeValueTooLarge            = 2103
)

// Limits FDB enforces; the model enforces the same numbers.
const (
	MaxKeySize         = 10_000
	MaxValueSize       = 100_000
	MaxTransactionSize = 10_000_000
)

// Error is a FoundationDB error code. Implementations return it (wrapped
// or not) so callers can match with errors.As whichever backend runs.
type Error struct {
	Code int
}

func (e Error) Error() string {
	return fmt.Sprintf("fdb error %d (%s)", e.Code, codeName(e.Code))
}

func codeName(c int) string {
	switch c {
	case CodeOperationFailed:
		return "operation_failed"
	case CodeTransactionTooOld:
		return "transaction_too_old"
	case CodeFutureVersion:
		return "future_version"
	case CodeNotCommitted:
		return "not_committed"
	case CodeCommitUnknownResult:
		return "commit_unknown_result"
	case CodeTransactionCancelled:
		return "transaction_cancelled"
	case CodeTransactionTimedOut:
		return "transaction_timed_out"
	case CodeTooManyWatches:
		return "too_many_watches"
	case CodeAccessedUnreadable:
		return "accessed_unreadable"
	case CodeProcessBehind:
		return "process_behind"
	case CodeDatabaseLocked:
		return "database_locked"
	case CodeClusterVersionChanged:
		return "cluster_version_changed"
	case CodeProxyMemoryLimitExceeded:
		return "proxy_memory_limit_exceeded"
	case CodeBatchTxnThrottled:
		return "batch_transaction_throttled"
	case CodeGRVProxyMemoryLimit:
		return "grv_proxy_memory_limit_exceeded"
	case CodeTagThrottled:
		return "tag_throttled"
	case CodeUsedDuringCommit:
		return "used_during_commit"
	case CodeInvertedRange:
		return "inverted_range"
	case CodeTransactionTooLarge:
		return "transaction_too_large"
	case CodeKeyTooLarge:
		return "key_too_large"
	case CodeValueTooLarge:
		return "value_too_large"
	}
	return "unknown"
}

// ErrWatchCancelled is the Err of a watch closed by Cancel.
var ErrWatchCancelled = errors.New("kv: watch cancelled")

// CodeOf returns the FDB error code in err's chain, or 0.
func CodeOf(err error) int {
	var e Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// IsRetryable reports whether FDB's retry loop would retry err (the
// "retryable" predicate of fdb_error_predicate: not committed, or maybe
// committed, or a transient throttle).
func IsRetryable(err error) bool {
	switch CodeOf(err) {
	case CodeTransactionTooOld, CodeFutureVersion, CodeNotCommitted, CodeCommitUnknownResult,
		CodeProcessBehind, CodeDatabaseLocked, CodeClusterVersionChanged, CodeProxyMemoryLimitExceeded,
		CodeBatchTxnThrottled, CodeGRVProxyMemoryLimit, CodeTagThrottled:
		return true
	}
	return false
}

// IsMaybeCommitted reports whether the transaction that returned err may
// have committed anyway (commit_unknown_result, cluster_version_changed).
func IsMaybeCommitted(err error) bool {
	switch CodeOf(err) {
	case CodeCommitUnknownResult, CodeClusterVersionChanged:
		return true
	}
	return false
}

// IsConflict reports whether err is a conflict (not_committed).
func IsConflict(err error) bool { return CodeOf(err) == CodeNotCommitted }

// KeyAfter returns the first key after k in byte order (k + 0x00): the
// end of the one-key range [k, KeyAfter(k)).
func KeyAfter(k []byte) []byte {
	out := make([]byte, len(k)+1)
	copy(out, k)
	return out
}

// PrefixEnd returns the first key after every key starting with prefix
// (FDB's strinc), or nil when prefix is all 0xff.
func PrefixEnd(prefix []byte) []byte {
	out := append([]byte(nil), prefix...)
	for i := len(out) - 1; i >= 0; i-- {
		if out[i] != 0xff {
			out[i]++
			return out[:i+1]
		}
	}
	return nil
}
