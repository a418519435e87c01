// Package tracestat reads a Go execution trace of a process that runs a
// rocksstore engine (leaseq bench -trace, or a node's
// /debug/pprof/trace with leaseq serve --pprof) and says how the engine's
// commit pipeline spent the traced time: how busy its batches and its WAL
// fsyncs kept it, how much of the batches' time ran during an fsync (the
// overlap the pipeline counts on under load), how long the WAL stood idle
// between one fsync and the next, and how long goroutines made runnable
// waited before they ran.
//
// The batches and fsyncs are the trace's regions named
// rocksstore.TraceBatchRegion and rocksstore.TraceFsyncRegion; a region
// begun before the trace started or ended after it stopped is not
// counted. The waits are every goroutine's, harness and store alike.
package tracestat

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/exp/trace"

	"github.com/leaseq/leaseq/storage/rocksstore"
)

// Summary is what Read found in one trace.
type Summary struct {
	// Span is the time from the trace's first event to its last.
	Span time.Duration
	// Fsyncs counts WAL fsync regions, FsyncTime their summed length.
	Fsyncs    int
	FsyncTime time.Duration
	// Batches counts batch regions, BatchTime their summed length, and
	// Calls the calls their logs say they held.
	Batches   int
	BatchTime time.Duration
	Calls     int
	// Overlap is the part of BatchTime that ran while an fsync did.
	Overlap time.Duration
	// Gaps are the idle times between the end of one fsync and the start
	// of the next, in order of length (nil with fewer than two fsyncs).
	Gaps []time.Duration
	// Waits are the times goroutines spent runnable before they ran, in
	// order of length.
	Waits []time.Duration
}

// span is one region's interval, in trace time.
type span struct{ start, end trace.Time }

// Read reads a whole trace from r.
func Read(r io.Reader) (Summary, error) {
	tr, err := trace.NewReader(r)
	if err != nil {
		return Summary{}, fmt.Errorf("tracestat: %w", err)
	}
	var (
		sum         Summary
		first, last trace.Time
		seen        bool
		begun       = map[trace.GoID]map[string]trace.Time{}
		runnable    = map[trace.GoID]trace.Time{}
		fsyncs      []span
		batches     []span
	)
	for {
		ev, err := tr.ReadEvent()
		if err == io.EOF {
			break
		}
		if err != nil {
			return Summary{}, fmt.Errorf("tracestat: %w", err)
		}
		if !seen {
			first, seen = ev.Time(), true
		}
		last = ev.Time()
		switch ev.Kind() {
		case trace.EventRegionBegin:
			name := ev.Region().Type
			if name != rocksstore.TraceBatchRegion && name != rocksstore.TraceFsyncRegion {
				continue
			}
			g := ev.Goroutine()
			if begun[g] == nil {
				begun[g] = map[string]trace.Time{}
			}
			begun[g][name] = ev.Time()
		case trace.EventRegionEnd:
			name, g := ev.Region().Type, ev.Goroutine()
			start, ok := begun[g][name]
			if !ok {
				continue
			}
			delete(begun[g], name)
			switch name {
			case rocksstore.TraceBatchRegion:
				batches = append(batches, span{start, ev.Time()})
			case rocksstore.TraceFsyncRegion:
				fsyncs = append(fsyncs, span{start, ev.Time()})
			}
		case trace.EventLog:
			l := ev.Log()
			if l.Category != rocksstore.TraceBatchRegion {
				continue
			}
			if n, err := strconv.Atoi(strings.TrimPrefix(l.Message, "calls=")); err == nil {
				sum.Calls += n
			}
		case trace.EventStateTransition:
			st := ev.StateTransition()
			if st.Resource.Kind != trace.ResourceGoroutine {
				continue
			}
			g := st.Resource.Goroutine()
			from, to := st.Goroutine()
			switch {
			case to == trace.GoRunnable:
				runnable[g] = ev.Time()
			case from == trace.GoRunnable && to == trace.GoRunning:
				if t0, ok := runnable[g]; ok {
					sum.Waits = append(sum.Waits, ev.Time().Sub(t0))
					delete(runnable, g)
				}
			}
		}
	}
	sum.Span = last.Sub(first)
	sum.Fsyncs, sum.FsyncTime = len(fsyncs), total(fsyncs)
	sum.Batches, sum.BatchTime = len(batches), total(batches)
	sum.Overlap = overlap(batches, fsyncs)
	sum.Gaps = gaps(fsyncs)
	slices.Sort(sum.Gaps)
	slices.Sort(sum.Waits)
	return sum, nil
}

// total is the summed length of spans.
func total(spans []span) time.Duration {
	var d time.Duration
	for _, s := range spans {
		d += s.end.Sub(s.start)
	}
	return d
}

// overlap is how long the spans of a ran while one of b did. Each list
// is in order of its ends (the order regions end in), and within a list
// spans do not overlap: one leader builds at a time, one goroutine
// fsyncs at a time.
func overlap(a, b []span) time.Duration {
	var d time.Duration
	j := 0
	for _, x := range a {
		for j < len(b) && b[j].end <= x.start {
			j++
		}
		for k := j; k < len(b) && b[k].start < x.end; k++ {
			if lo, hi := max(x.start, b[k].start), min(x.end, b[k].end); hi > lo {
				d += hi.Sub(lo)
			}
		}
	}
	return d
}

// gaps returns the times from the end of each fsync to the start of the
// next one.
func gaps(fsyncs []span) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(fsyncs); i++ {
		if g := fsyncs[i].start.Sub(fsyncs[i-1].end); g >= 0 {
			out = append(out, g)
		}
	}
	return out
}

// Quantile returns the q-quantile (0 <= q <= 1) of sorted durations, 0
// for none.
func Quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q * float64(len(sorted)-1))
	return sorted[i]
}

// ratio is part over whole, 0 for an empty whole.
func ratio(part, whole float64) float64 {
	if whole <= 0 {
		return 0
	}
	return part / whole
}

// FsyncBusy is the share of the traced time the WAL fsyncs ran.
func (s Summary) FsyncBusy() float64 { return ratio(float64(s.FsyncTime), float64(s.Span)) }

// BatchBusy is the share of the traced time the batches ran.
func (s Summary) BatchBusy() float64 { return ratio(float64(s.BatchTime), float64(s.Span)) }

// BatchInFsync is the share of the batches' time that ran during an
// fsync.
func (s Summary) BatchInFsync() float64 { return ratio(float64(s.Overlap), float64(s.BatchTime)) }

// CallsPerBatch is the calls a batch held on average.
func (s Summary) CallsPerBatch() float64 { return ratio(float64(s.Calls), float64(s.Batches)) }

// mean is d over n, 0 for none.
func mean(d time.Duration, n int) time.Duration {
	if n == 0 {
		return 0
	}
	return d / time.Duration(n)
}

// Write prints s in a few lines.
func (s Summary) Write(w io.Writer) error {
	us := func(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e3, 'f', 1, 64) }
	var waited time.Duration
	for _, d := range s.Waits {
		waited += d
	}
	_, err := fmt.Fprintf(w, "trace: %.3f s traced\n"+
		"  WAL fsyncs      %d, mean %s µs, busy %.0f %% of the time\n"+
		"  batches         %d, mean %s µs, %.1f calls each, busy %.0f %% of the time, %.0f %% of it during an fsync\n"+
		"  fsync to fsync  idle p50 %s, p90 %s µs\n"+
		"  runnable waits  %d, p50 %s, p90 %s, p99 %s µs, %.3f s in all\n",
		s.Span.Seconds(),
		s.Fsyncs, us(mean(s.FsyncTime, s.Fsyncs)), 100*s.FsyncBusy(),
		s.Batches, us(mean(s.BatchTime, s.Batches)), s.CallsPerBatch(), 100*s.BatchBusy(), 100*s.BatchInFsync(),
		us(Quantile(s.Gaps, 0.5)), us(Quantile(s.Gaps, 0.9)),
		len(s.Waits), us(Quantile(s.Waits, 0.5)), us(Quantile(s.Waits, 0.9)), us(Quantile(s.Waits, 0.99)), waited.Seconds())
	return err
}
