package bench

import (
	"context"
	"fmt"

	"github.com/leaseq/leaseq/bench/target"
	"github.com/leaseq/leaseq/bench/tracestat"
)

// With -trace, each row of a system whose server can record an execution
// trace (target.Tracer: leaseq serve --pprof) also traces the server for
// the row's planned length, into -trace's path with the row and system
// appended (the last round's, with -rounds), and puts what package
// tracestat reads in it into the row's notes:
//
//	node_fsync_busy      share of the traced time the node's WAL fsyncs ran
//	node_batch_busy      share the commit pipeline's batches ran
//	node_batch_in_fsync  share of the batches' time that ran during an fsync
//	node_calls_per_batch calls per batch
//	node_wait_p50_us     how long a goroutine made runnable waited to run,
//	node_wait_p99_us     p50 and p99, in µs
//
// The trace costs the node some CPU, which the row's CPU figures then
// include.

// startNodeTrace starts tracing in's server for row v when the run asks
// for traces and the instance can; finish, called after the row and
// before in closes, waits for the trace and notes its summary in r.
func startNodeTrace(ctx context.Context, c Config, v variant, s target.System, in target.Instance) (finish func(r *Result)) {
	tr, ok := in.(target.Tracer)
	if !ok || c.Trace == "" || v.planned <= 0 {
		return func(*Result) {}
	}
	path := nodeTracePath(c.Trace, v.row, s.Name())
	wait := tr.Trace(ctx, v.planned, path)
	return func(r *Result) {
		if err := wait(); err != nil {
			progressf(c, "bench: %s %s: node trace: %v\n", s.Name(), v.row, err)
			return
		}
		sum, err := readTrace(path)
		if err != nil {
			progressf(c, "bench: %s %s: node trace: %v\n", s.Name(), v.row, err)
			return
		}
		noteTrace(r, sum)
	}
}

// nodeTracePath is where the node trace of a row goes: base with the row
// and system appended.
func nodeTracePath(base, row, system string) string {
	return base + "." + row + "." + system
}

// noteTrace puts a node trace's summary into the row's notes, leaving
// out what is zero (a row with no fsyncs notes none), as addCounters does.
func noteTrace(r *Result, sum *tracestat.Summary) {
	note := func(k string, v float64) {
		if v <= 0 {
			return
		}
		if r.Extra == nil {
			r.Extra = map[string]float64{}
		}
		r.Extra[k] = v
	}
	note("node_fsync_busy", sum.FsyncBusy())
	note("node_batch_busy", sum.BatchBusy())
	note("node_batch_in_fsync", sum.BatchInFsync())
	note("node_calls_per_batch", sum.CallsPerBatch())
	note("node_wait_p50_us", float64(tracestat.Quantile(sum.Waits, 0.5))/1e3)
	note("node_wait_p99_us", float64(tracestat.Quantile(sum.Waits, 0.99))/1e3)
}

// progressf writes a line to the run's progress output, if any.
func progressf(c Config, format string, a ...any) {
	if c.Progress != nil {
		fmt.Fprintf(c.Progress, format, a...)
	}
}
