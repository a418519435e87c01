package kv

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
)

// ErrRetryLimit wraps the last error of a transaction that was still
// retryable when the retry bound (attempts or time) ran out.
var ErrRetryLimit = errors.New("kv: transaction retry limit reached")

// DefaultMaxAttempts bounds attempts per Transact call. FDB's own loop is
// unbounded; a queue node prefers failing one call to stalling a client
// forever behind a hot key. 100 attempts with FDB's backoff (capped at 1 s)
// is well over a minute on a real cluster.
const DefaultMaxAttempts = 100

// Call describes the attempt a transaction function is running.
type Call struct {
	// Attempt counts from 1.
	Attempt int
	// MaybeCommitted is true when an earlier attempt of this call ended
	// in commit_unknown_result: its writes may be in the database, so the
	// function must check its idempotency marker before writing again.
	MaybeCommitted bool
}

// Report counts what one Transact call went through.
type Report struct {
	Attempts       int
	Retries        int // attempts after the first
	Conflicts      int // not_committed among the retries
	UnknownResults int // commit_unknown_result among the retries
}

// Retrier runs transaction functions with FDB's retry rules. It is safe for
// concurrent use and counts every call for metrics.
type Retrier struct {
	db          DB
	maxAttempts int
	maxDuration time.Duration
	clock       clock.Clock

	calls, retries, conflicts, unknown, failed atomic.Int64
}

// RetrierOptions configures a Retrier.
type RetrierOptions struct {
	// MaxAttempts bounds attempts per call; 0 means DefaultMaxAttempts.
	MaxAttempts int
	// MaxDuration bounds the time spent in one call, measured on Clock;
	// 0 (or a nil Clock) means only MaxAttempts and the context bound it.
	MaxDuration time.Duration
	Clock       clock.Clock
}

// NewRetrier returns a Retrier over db.
func NewRetrier(db DB, o RetrierOptions) *Retrier {
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	return &Retrier{db: db, maxAttempts: o.MaxAttempts, maxDuration: o.MaxDuration, clock: o.Clock}
}

// RetrierMetrics is a snapshot of a Retrier's counters.
type RetrierMetrics struct {
	Calls          int64 // Transact calls
	Retries        int64 // attempts after the first, over all calls
	Conflicts      int64 // not_committed retries
	UnknownResults int64 // commit_unknown_result retries
	Failed         int64 // calls that returned an error
}

// Sub returns m - prev, for interval deltas.
func (m RetrierMetrics) Sub(prev RetrierMetrics) RetrierMetrics {
	return RetrierMetrics{
		Calls: m.Calls - prev.Calls, Retries: m.Retries - prev.Retries, Conflicts: m.Conflicts - prev.Conflicts,
		UnknownResults: m.UnknownResults - prev.UnknownResults, Failed: m.Failed - prev.Failed,
	}
}

// Metrics returns the counters so far.
func (r *Retrier) Metrics() RetrierMetrics {
	return RetrierMetrics{
		Calls: r.calls.Load(), Retries: r.retries.Load(), Conflicts: r.conflicts.Load(),
		UnknownResults: r.unknown.Load(), Failed: r.failed.Load(),
	}
}

// Transact runs fn in a transaction and commits it, retrying while the
// error (from fn or from Commit) is retryable. It returns fn's value from
// the attempt that committed. Any error is returned: a non-FDB error from fn
// ends the call at once (nothing was committed by that attempt), a fatal FDB
// error is returned as OnError reports it, and an exhausted bound returns
// ErrRetryLimit wrapping the last error. A value returned together with an
// error is discarded, never the error.
func (r *Retrier) Transact(ctx context.Context, fn func(tx Tx) (any, error)) (any, error) {
	v, _, err := r.Run(ctx, func(tx Tx, _ Call) (any, error) { return fn(tx) })
	return v, err
}

// Run is Transact with attempt information for fn and a per-call Report.
// After a successful Run, the Tx passed to the last attempt is committed and
// its Versionstamp may be read by fn's caller if fn kept it.
func (r *Retrier) Run(ctx context.Context, fn func(tx Tx, c Call) (any, error)) (any, Report, error) {
	r.calls.Add(1)
	v, rep, err := r.run(ctx, fn)
	if err != nil {
		r.failed.Add(1)
	}
	return v, rep, err
}

func (r *Retrier) run(ctx context.Context, fn func(tx Tx, c Call) (any, error)) (any, Report, error) {
	var rep Report
	tx, err := r.db.CreateTransaction()
	if err != nil {
		return nil, rep, fmt.Errorf("kv: create transaction: %w", err)
	}
	var start time.Time
	if r.clock != nil && r.maxDuration > 0 {
		start = r.clock.Now()
	}
	call := Call{}
	for {
		call.Attempt++
		rep.Attempts++
		if err := ctx.Err(); err != nil {
			tx.Cancel()
			return nil, rep, fmt.Errorf("kv: transaction attempt %d: %w", call.Attempt, err)
		}
		v, err := fn(tx, call)
		if err == nil {
			err = tx.Commit()
			if err == nil {
				return v, rep, nil
			}
		}
		if CodeOf(err) == 0 {
			// Not an FDB error: the function itself failed. Its writes
			// were never committed by this attempt.
			tx.Cancel()
			return nil, rep, err
		}
		if !IsRetryable(err) {
			// Let the implementation map it (it may know better), but
			// never lose it.
			oerr := tx.OnError(err)
			tx.Cancel()
			if oerr == nil {
				oerr = err
			}
			return nil, rep, oerr
		}
		if call.Attempt >= r.maxAttempts || r.outOfTime(start) {
			tx.Cancel()
			return nil, rep, fmt.Errorf("%w after %d attempts: %w", ErrRetryLimit, call.Attempt, err)
		}
		if oerr := tx.OnError(err); oerr != nil {
			tx.Cancel()
			return nil, rep, oerr
		}
		rep.Retries++
		r.retries.Add(1)
		if IsConflict(err) {
			rep.Conflicts++
			r.conflicts.Add(1)
		}
		if IsMaybeCommitted(err) {
			call.MaybeCommitted = true
			rep.UnknownResults++
			r.unknown.Add(1)
		}
	}
}

func (r *Retrier) outOfTime(start time.Time) bool {
	if start.IsZero() {
		return false
	}
	return r.clock.Now().Sub(start) >= r.maxDuration
}
