package bench

import (
	"slices"
	"sort"
)

// maxRounds bounds Config.Rounds: a full run takes about half an hour a
// round on a small machine.
const maxRounds = 20

// On a machine whose speed drifts from minute to minute, one row of one
// system can come out 10 % faster or slower than the same code a few
// minutes later, and a ratio against a peer moves with it. With several
// rounds, every system runs each row once per round, in turn, and the
// report gives each row's median: items/s, CPU, RSS, each latency
// percentile and each extra figure are each the median of that figure
// over the rounds the row completed. With an even number of completed
// rounds every figure's median is the lower of its two middle values, not
// their mean: so a row's items/s is that of one real round, the one with
// the lower middle items/s, and its items and seconds are that same
// round's, describing one real window (items / seconds = items/s). The
// ratios and goals are computed from the medians. Every round's own row
// stays in the report (Report.RoundResults).
//
// A row that failed at least half of its rounds is not compared on the
// few that completed (they would stand for the row as if it ran well):
// its ratios and goals say "failed k/n rounds" instead (report.go). One
// that failed fewer is compared on the rounds it completed, and its notes
// say how many failed.

// medianRows folds the rows of several rounds (rs, in the order they ran)
// into one row per row name and system, in order of first appearance.
func medianRows(rs []Result) []Result {
	type key struct{ row, system string }
	var order []key
	groups := make(map[key][]Result)
	for _, r := range rs {
		k := key{r.Row, r.System}
		if _, seen := groups[k]; !seen {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	out := make([]Result, 0, len(order))
	for _, k := range order {
		out = append(out, medianRow(groups[k]))
	}
	return out
}

// medianRow folds one row's rounds. A row no round completed is the last
// round's, failure and all.
func medianRow(rounds []Result) Result {
	perRound := make([]float64, len(rounds))
	var done []Result
	for i, r := range rounds {
		if ok(r) && !r.Interrupted {
			perRound[i] = r.ItemsPerSec
			done = append(done, r)
		}
	}
	m := rounds[len(rounds)-1]
	if len(done) > 0 {
		byRate := slices.Clone(done)
		sort.SliceStable(byRate, func(i, j int) bool { return byRate[i].ItemsPerSec < byRate[j].ItemsPerSec })
		m = byRate[(len(byRate)-1)/2] // the lower middle when even, as median()
	}
	m.Round = 0
	m.RoundsItemsPerSec = perRound
	m.RoundsFailed = len(rounds) - len(done)
	// A lost ack in any round flags the row, failed rounds' included.
	m.AcksLost = 0
	for _, r := range rounds {
		m.AcksLost += r.AcksLost
	}
	if len(done) == 0 {
		return m
	}
	m.Interrupted = slices.ContainsFunc(rounds, func(r Result) bool { return r.Interrupted })
	m.ItemsPerSec = medianBy(done, func(r Result) float64 { return r.ItemsPerSec })
	m.CPUSeconds = medianBy(done, func(r Result) float64 { return r.CPUSeconds })
	m.CPUPerItem = medianBy(done, func(r Result) float64 { return r.CPUPerItem })
	m.ClientCPUSeconds = medianBy(done, func(r Result) float64 { return r.ClientCPUSeconds })
	m.ClientCPUPerItem = medianBy(done, func(r Result) float64 { return r.ClientCPUPerItem })
	m.PeakRSS = int64(medianBy(done, func(r Result) float64 { return float64(r.PeakRSS) }))
	m.Steal = medianBy(done, func(r Result) float64 { return r.Steal })
	m.E2E = medianLatency(done, func(r Result) *Latency { return r.E2E })
	m.Enqueue = medianLatency(done, func(r Result) *Latency { return r.Enqueue })
	m.Intervals = medianIntervals(done)
	m.Extra = medianExtra(done)
	return m
}

// median returns the median of xs, the lower of the two middle values
// when their number is even (so that a row's items/s is the median
// round's, as its items and seconds are); xs is sorted in place.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	return xs[(len(xs)-1)/2]
}

// medianBy returns the median of f over xs.
func medianBy[T any](xs []T, f func(T) float64) float64 {
	vs := make([]float64, len(xs))
	for i, x := range xs {
		vs[i] = f(x)
	}
	return median(vs)
}

// medianLatency takes each percentile's median over the rounds that
// measured it; nil when none did.
func medianLatency(rs []Result, f func(Result) *Latency) *Latency {
	var ls []*Latency
	for _, r := range rs {
		if l := f(r); l != nil {
			ls = append(ls, l)
		}
	}
	if len(ls) == 0 {
		return nil
	}
	return &Latency{
		Count: int64(medianBy(ls, func(l *Latency) float64 { return float64(l.Count) })),
		P50:   medianBy(ls, func(l *Latency) float64 { return l.P50 }),
		P99:   medianBy(ls, func(l *Latency) float64 { return l.P99 }),
		P999:  medianBy(ls, func(l *Latency) float64 { return l.P999 }),
		Max:   medianBy(ls, func(l *Latency) float64 { return l.Max }),
		Mean:  medianBy(ls, func(l *Latency) float64 { return l.Mean }),
	}
}

// medianIntervals takes each interval's median (churn), over the rounds
// that have as many intervals as the first; nil when none has any.
func medianIntervals(rs []Result) []float64 {
	if len(rs) == 0 || len(rs[0].Intervals) == 0 {
		return nil
	}
	n := len(rs[0].Intervals)
	out := make([]float64, n)
	for i := range out {
		var xs []float64
		for _, r := range rs {
			if len(r.Intervals) == n {
				xs = append(xs, r.Intervals[i])
			}
		}
		out[i] = median(xs)
	}
	return out
}

// medianExtra takes each extra figure's median over the rounds that
// report it, a counter that did not move in a round counting 0 there.
func medianExtra(rs []Result) map[string]float64 {
	vals := make(map[string][]float64)
	for _, r := range rs {
		for k, v := range r.Extra {
			vals[k] = append(vals[k], v)
		}
	}
	if len(vals) == 0 {
		return nil
	}
	for k := range vals {
		for _, r := range rs {
			if _, has := r.Extra[k]; !has && r.still[k] {
				vals[k] = append(vals[k], 0)
			}
		}
	}
	out := make(map[string]float64, len(vals))
	for k, xs := range vals {
		out[k] = median(xs)
	}
	return out
}
