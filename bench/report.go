package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/leaseq/leaseq/bench/target"
)

// Ratio compares a leaseq row with the best row of one peer family in the
// same durability class, from the same run.
type Ratio struct {
	Row    string  `json:"row"`
	Leaseq string  `json:"leaseq"`
	Peer   string  `json:"peer"`
	Class  string  `json:"class"`
	Metric string  `json:"metric"` // "items/s" (higher is better) or a latency in µs (lower is better)
	Value  float64 `json:"leaseq_value"`
	PeerV  float64 `json:"peer_value"`
	Ratio  float64 `json:"ratio"` // leaseq / peer
	// Failed names the row of the two that failed at least half of its
	// rounds ("redis-always failed 2/3 rounds"): Ratio is then 0, as
	// its few completed rounds do not stand for it (rounds.go).
	Failed string `json:"failed,omitempty"`
	// Note names what else qualifies the ratio: a row that lost acks
	// (Result.AcksLost) or failed a minority of its rounds.
	Note string `json:"note,omitempty"`
}

// Goal is one target of the issue, checked on this run's numbers.
type Goal struct {
	Goal   string  `json:"goal"`
	System string  `json:"system"`
	Versus string  `json:"versus"`
	Ratio  float64 `json:"ratio"`
	Want   string  `json:"want"` // such as ">= 5" or "<= 1"
	Met    bool    `json:"met"`
	// Rounds is, in a run of several rounds, the same ratio within each
	// round, in round order, 0 for a round that either row did not
	// complete or in which another peer was the best (roundGoals). Met
	// judges Ratio, the ratio of the medians; Rounds shows how far the
	// day's machine moved it, as the two rows of one round ran minutes
	// apart and the medians' rounds up to a quarter of an hour.
	Rounds []float64 `json:"rounds,omitempty"`
	// Failed and Note are as Ratio's. A goal with Failed set, or whose
	// rows lost acks, is not met whatever its ratio: a bug that turned
	// acks into NotFound, or a row that mostly failed, must not read as
	// speed.
	Failed string `json:"failed,omitempty"`
	Note   string `json:"note,omitempty"`
}

// failedMost reports whether a row of several rounds failed at least
// half of them: it is then not compared on the rounds that completed.
func failedMost(r Result) bool {
	n := len(r.RoundsItemsPerSec)
	return n > 0 && 2*r.RoundsFailed >= n
}

// judge says what qualifies a comparison of rows: which failed most of
// their rounds (failed), and which lost acks or failed fewer (note); lost
// is whether any lost acks.
func judge(rows ...Result) (failed, note string, lost bool) {
	var fs, ns []string
	for _, r := range rows {
		switch n := len(r.RoundsItemsPerSec); {
		case failedMost(r):
			fs = append(fs, fmt.Sprintf("%s failed %d/%d rounds", r.System, r.RoundsFailed, n))
		case r.RoundsFailed > 0:
			ns = append(ns, fmt.Sprintf("%s failed %d/%d rounds, compared on the others", r.System, r.RoundsFailed, n))
		}
		if r.AcksLost > 0 {
			ns = append(ns, fmt.Sprintf("%s lost %d acks", r.System, r.AcksLost))
			lost = true
		}
	}
	return strings.Join(fs, "; "), strings.Join(ns, "; "), lost
}

// judged qualifies g by its rows (judge): a failed comparison has no
// ratio, and neither it nor one whose rows lost acks is met.
func judged(g Goal, rows ...Result) Goal {
	failed, note, lost := judge(rows...)
	g.Failed, g.Note = failed, note
	if failed != "" {
		g.Ratio = 0
	}
	if failed != "" || lost {
		g.Met = false
	}
	return g
}

// judgedRatio is judged for a Ratio.
func judgedRatio(r Ratio, rows ...Result) Ratio {
	r.Failed, r.Note, _ = judge(rows...)
	if r.Failed != "" {
		r.Ratio = 0
	}
	return r
}

func ok(r Result) bool { return r.Err == "" && r.Incomplete == "" && r.Items > 0 }

func isLeaseq(r Result) bool { return r.Family == "leaseq" }

// compare computes ratios and goal checks. Only rows that completed count,
// and rows of several rounds that failed at least half of them, which are
// shown as failed (judge).
func compare(rs []Result) ([]Ratio, []Goal) {
	var ratios []Ratio
	byRow := map[string][]Result{}
	var rows []string
	for _, r := range rs {
		if !ok(r) && !failedMost(r) {
			continue
		}
		if _, seen := byRow[r.Row]; !seen {
			rows = append(rows, r.Row)
		}
		byRow[r.Row] = append(byRow[r.Row], r)
	}
	for _, row := range rows {
		for _, l := range byRow[row] {
			if !isLeaseq(l) || (l.Class != string(target.ClassDurable) && l.Class != string(target.ClassRelaxed)) {
				continue
			}
			best := map[string]Result{}
			var fams []string
			for _, p := range byRow[row] {
				if isLeaseq(p) || p.Class != l.Class {
					continue
				}
				b, seen := best[p.Family]
				if !seen {
					fams = append(fams, p.Family)
				}
				if !seen || p.ItemsPerSec > b.ItemsPerSec {
					best[p.Family] = p
				}
			}
			for _, f := range fams {
				p := best[f]
				ratios = append(ratios, judgedRatio(Ratio{Row: row, Leaseq: l.System, Peer: p.System, Class: l.Class, Metric: "items/s",
					Value: l.ItemsPerSec, PeerV: p.ItemsPerSec, Ratio: div(l.ItemsPerSec, p.ItemsPerSec)}, l, p))
				if strings.HasPrefix(row, "latency") && l.Enqueue != nil && p.Enqueue != nil {
					ratios = append(ratios, judgedRatio(Ratio{Row: row, Leaseq: l.System, Peer: p.System, Class: l.Class, Metric: "enqueue p50 µs",
						Value: l.Enqueue.P50, PeerV: p.Enqueue.P50, Ratio: div(l.Enqueue.P50, p.Enqueue.P50)}, l, p))
				}
			}
		}
	}
	return ratios, append(goals(byRow), speedGoals(byRow)...)
}

func div(a, b float64) float64 {
	if b == 0 {
		return 0 // JSON has no infinity; a zero peer value cannot happen for a completed row
	}
	return a / b
}

func goals(byRow map[string][]Result) []Goal {
	var gs []Goal
	find := func(row, system string) (Result, bool) { return findSystem(byRow, row, system) }
	for _, l := range byRow["e2e"] {
		if !isLeaseq(l) {
			continue
		}
		switch l.Class {
		case string(target.ClassDurable):
			if p, found := find("e2e", "redis-always"); found {
				r := div(l.ItemsPerSec, p.ItemsPerSec)
				gs = append(gs, judged(Goal{Goal: "e2e items/s vs Redis appendfsync always", System: l.System, Versus: p.System, Ratio: r, Want: ">= 5", Met: r >= 5}, l, p))
			}
			if p, found := find("e2e", "redis-everysec"); found {
				r := div(l.ItemsPerSec, p.ItemsPerSec)
				gs = append(gs, judged(Goal{Goal: "e2e items/s vs Redis everysec", System: l.System, Versus: p.System, Ratio: r, Want: ">= 1", Met: r >= 1}, l, p))
			}
		case string(target.ClassRelaxed):
			var best Result
			for _, p := range byRow["e2e"] {
				if !isLeaseq(p) && p.Class == string(target.ClassRelaxed) && p.ItemsPerSec > best.ItemsPerSec {
					best = p
				}
			}
			if best.System != "" {
				r := div(l.ItemsPerSec, best.ItemsPerSec)
				gs = append(gs, judged(Goal{Goal: "e2e items/s vs best relaxed-durability peer", System: l.System, Versus: best.System, Ratio: r, Want: ">= 2", Met: r >= 2}, l, best))
			}
		}
	}
	for _, l := range byRow["latency-max"] {
		// In process, an enqueue is a call, not a round trip over the wire
		// as the peers' are: no goal (speedGoals leaves them out too).
		if !isLeaseq(l) || l.InProcess || l.Class != string(target.ClassDurable) || l.Enqueue == nil {
			continue
		}
		var best Result
		for _, p := range byRow["latency-max"] {
			if !isLeaseq(p) && p.Class == string(target.ClassDurable) && p.Enqueue != nil && (best.Enqueue == nil || p.Enqueue.P50 < best.Enqueue.P50) {
				best = p
			}
		}
		if best.Enqueue != nil {
			r := div(l.Enqueue.P50, best.Enqueue.P50)
			gs = append(gs, judged(Goal{Goal: "single durable enqueue p50 vs best durable peer", System: l.System, Versus: best.System, Ratio: r, Want: "<= 1", Met: r <= 1}, l, best))
		}
	}
	for _, l := range byRow["churn"] {
		if !isLeaseq(l) || l.Class == string(target.ClassMemory) {
			continue
		}
		if v, found := l.Extra["last_first_ratio"]; found {
			gs = append(gs, judged(Goal{Goal: "tombstone churn last/first interval", System: l.System, Versus: "itself", Ratio: v, Want: ">= 0.8", Met: v >= 0.8}, l))
		}
	}
	return gs
}

// findSystem returns system's completed result in row.
func findSystem(byRow map[string][]Result, row, system string) (Result, bool) {
	for _, r := range byRow[row] {
		if r.System == system {
			return r, true
		}
	}
	return Result{}, false
}

// speedGoals are the targets of the engine and RPC speed work: leaseq
// against Redis in the same durability class (sync=always against
// appendfsync always, sync=none against everysec), the in-process rows
// for the engine and the RPC rows for the wire.
func speedGoals(byRow map[string][]Result) []Goal {
	var gs []Goal
	redis := func(row, class string) (Result, bool) {
		if class == string(target.ClassDurable) {
			return findSystem(byRow, row, "redis-always")
		}
		return findSystem(byRow, row, "redis-everysec")
	}
	for _, row := range []string{"produce-b1", "produce-b100", "e2e"} {
		for _, l := range byRow[row] {
			if !isLeaseq(l) || (l.Class != string(target.ClassDurable) && l.Class != string(target.ClassRelaxed)) {
				continue
			}
			want := 1.5
			switch {
			case row == "produce-b1" && l.InProcess:
				continue // a target of the wire only
			case row == "produce-b1":
				want = 1
			case l.InProcess:
				want = 2
			}
			p, found := redis(row, l.Class)
			if !found {
				continue
			}
			r := div(l.ItemsPerSec, p.ItemsPerSec)
			gs = append(gs, judged(Goal{Goal: row + " items/s vs Redis, same class", System: l.System, Versus: p.System, Ratio: r,
				Want: fmt.Sprintf(">= %g", want), Met: r >= want}, l, p))
			if row == "produce-b1" && l.CPUPerItem > 0 && p.CPUPerItem > 0 {
				r := div(l.CPUPerItem, p.CPUPerItem)
				gs = append(gs, judged(Goal{Goal: "produce-b1 server cpu-µs per call vs Redis, same class", System: l.System, Versus: p.System, Ratio: r,
					Want: "<= 1", Met: r <= 1}, l, p))
			}
		}
	}
	for _, l := range byRow["roundtrip"] {
		if !isLeaseq(l) || l.InProcess || l.CPUPerItem <= 0 {
			continue
		}
		p, found := redis("roundtrip", l.Class)
		if !found || p.CPUPerItem <= 0 {
			continue
		}
		r := div(l.CPUPerItem, p.CPUPerItem)
		gs = append(gs, judged(Goal{Goal: "roundtrip (nodeInfo vs PING) server cpu-µs per call vs Redis", System: l.System, Versus: p.System, Ratio: r,
			Want: "<= 1", Met: r <= 1}, l, p))
	}
	for _, l := range byRow["latency-max"] {
		if !isLeaseq(l) || l.InProcess || l.Class != string(target.ClassDurable) || l.Enqueue == nil {
			continue
		}
		p, found := redis("latency-max", l.Class)
		if !found || p.Enqueue == nil {
			continue
		}
		r := div(l.Enqueue.P50, p.Enqueue.P50)
		gs = append(gs, judged(Goal{Goal: "single durable enqueue p50 vs Redis appendfsync always", System: l.System, Versus: p.System, Ratio: r, Want: "<= 1", Met: r <= 1}, l, p))
		r = div(l.Enqueue.P99, p.Enqueue.P99)
		gs = append(gs, judged(Goal{Goal: "single durable enqueue p99 vs Redis appendfsync always", System: l.System, Versus: p.System, Ratio: r, Want: "<= 2", Met: r <= 2}, l, p))
	}
	return gs
}

func ms(l *Latency, f func(*Latency) float64) string {
	if l == nil {
		return "-"
	}
	return fmt.Sprintf("%.2f", f(l)/1000)
}

func p50(l *Latency) float64  { return l.P50 }
func p99(l *Latency) float64  { return l.P99 }
func p999(l *Latency) float64 { return l.P999 }

// rowLine is the one-line summary printed after each row.
func rowLine(r Result) string {
	if r.Err != "" {
		return fmt.Sprintf("%-14s %-22s FAILED: %s", r.Row, r.System, r.Err)
	}
	return fmt.Sprintf("%-14s %-22s %10.0f items/s  e2e p50/p99 %s/%s ms  enq p50/p99 %s/%s ms  cpu %.1fs  client cpu %s  rss %.0fMB",
		r.Row, r.System, r.ItemsPerSec, ms(r.E2E, p50), ms(r.E2E, p99), ms(r.Enqueue, p50), ms(r.Enqueue, p99), r.CPUSeconds, clientCPU(r, "%.1fs", r.ClientCPUSeconds), float64(r.PeakRSS)/(1<<20))
}

// clientCPU formats a client CPU figure, "-" for an in-process row (its
// client shares the server's process and CPU figure).
func clientCPU(r Result, format string, v float64) string {
	if r.InProcess {
		return "-"
	}
	return fmt.Sprintf(format, v)
}

// stealNoted is the stolen share of the machine's CPU time (Result.Steal)
// from which a row's notes show it: the row then ran on a machine whose
// CPU was partly someone else's, and its figures may move with that.
const stealNoted = 0.02

func note(r Result) string {
	var n []string
	if r.Err != "" {
		n = append(n, "FAILED: "+r.Err)
	}
	if r.Interrupted {
		n = append(n, "interrupted")
	}
	if r.Incomplete != "" {
		n = append(n, "INCOMPLETE: "+r.Incomplete)
	}
	if r.AcksLost > 0 {
		n = append(n, fmt.Sprintf("ACKS LOST: %d (answered lease expired or not found; not counted as items)", r.AcksLost))
	}
	if len(r.RoundsItemsPerSec) > 0 {
		n = append(n, roundsNote(r))
	}
	keys := make([]string, 0, len(r.Extra))
	for k := range r.Extra {
		if k == "enqueued" {
			continue
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		n = append(n, fmt.Sprintf("%s=%.3g", k, r.Extra[k]))
	}
	if r.InProcess {
		n = append(n, "cpu/rss include harness")
	}
	if r.Steal >= stealNoted {
		n = append(n, fmt.Sprintf("steal %.0f%%", 100*r.Steal))
	}
	return strings.Join(n, "; ")
}

// roundsNote says a row is a median and shows each round's items/s.
func roundsNote(r Result) string {
	rates := make([]string, len(r.RoundsItemsPerSec))
	for i, v := range r.RoundsItemsPerSec {
		rates[i] = fmt.Sprintf("%.0f", v)
		if v == 0 {
			rates[i] = "failed"
		}
	}
	s := fmt.Sprintf("median of %d rounds (items/s %s)", len(r.RoundsItemsPerSec), strings.Join(rates, ", "))
	if r.RoundsFailed > 0 {
		s += fmt.Sprintf(", %d failed", r.RoundsFailed)
	}
	if failedMost(r) {
		s += ": not compared"
	}
	return s
}

// figure formats a row's items/s or a per-item figure, "-" for a row
// that did not complete: its 0 items/s, or its CPU over no item, beside
// real CPU seconds would read as a measurement.
func figure(r Result, format string, v float64) string {
	if !ok(r) {
		return "-"
	}
	return fmt.Sprintf(format, v)
}

// perItemClientCPU is a row's client CPU per item ("-" as clientCPU or
// figure say).
func perItemClientCPU(r Result) string {
	if !ok(r) {
		return "-"
	}
	return clientCPU(r, "%.0f", r.ClientCPUPerItem)
}

// ratioText is a ratio's figure, or why it has none.
func ratioText(r Ratio, format string) string {
	if r.Failed != "" {
		return r.Failed
	}
	return fmt.Sprintf(format, r.Ratio)
}

// goalStatus is a goal's verdict: MET, SHORT, FAILED (a row failed most
// of its rounds), or LOST ACKS (the ratio reaches the target, but a row
// lost acks, so it is not met).
func goalStatus(g Goal) string {
	switch {
	case g.Failed != "":
		return "FAILED"
	case g.Met:
		return "MET"
	case ratioMeets(g):
		return "LOST ACKS"
	default:
		return "SHORT"
	}
}

// WriteTable prints the summary table, the ratios and the goals as
// aligned text.
func WriteTable(w io.Writer, rep *Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "row\tsystem\tdurability\titems/s\te2e p50/p99/p999 ms\tenqueue p50/p99/p999 ms\tcpu s\tcpu µs/item\tclient µs/item\tpeak rss MB\tnotes")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s/%s/%s\t%s/%s/%s\t%.1f\t%s\t%s\t%.0f\t%s\n", r.Row, r.System, r.Durability, figure(r, "%.0f", r.ItemsPerSec),
			ms(r.E2E, p50), ms(r.E2E, p99), ms(r.E2E, p999), ms(r.Enqueue, p50), ms(r.Enqueue, p99), ms(r.Enqueue, p999),
			r.CPUSeconds, figure(r, "%.0f", r.CPUPerItem), perItemClientCPU(r), float64(r.PeakRSS)/(1<<20), note(r))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rep.Ratios) > 0 {
		fmt.Fprintln(w, "\nratios leaseq/peer (same run, same durability class):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "row\tleaseq\tpeer\tclass\tmetric\tleaseq\tpeer\tratio\tnotes")
		for _, r := range rep.Ratios {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.0f\t%.0f\t%s\t%s\n", r.Row, r.Leaseq, r.Peer, r.Class, r.Metric, r.Value, r.PeerV, ratioText(r, "%.2fx"), r.Note)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(rep.Goals) > 0 {
		fmt.Fprintln(w, "\ngoals:")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, g := range rep.Goals {
			fmt.Fprintf(tw, "%s\t%s\tvs %s\t%s\t(want %s)\t%s\t%s\t%s\n", g.Goal, g.System, g.Versus, goalRatio(g), g.Want, goalStatus(g), roundRatios(g), g.Note)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, s := range rep.Skipped {
		fmt.Fprintf(w, "skipped %s: %s\n", s.System, s.Reason)
	}
	return nil
}

// roundRatios formats g.Rounds ("rounds 1.40 0.77 0.89"), empty in a run
// of one round.
func roundRatios(g Goal) string {
	if len(g.Rounds) == 0 {
		return ""
	}
	rs := make([]string, len(g.Rounds))
	for i, r := range g.Rounds {
		rs[i] = "-"
		if r != 0 {
			rs[i] = fmt.Sprintf("%.2f", r)
		}
	}
	return "rounds " + strings.Join(rs, " ")
}

// roundGoals sets each goal's Rounds from the rows of every round
// (Report.RoundResults): the goals computed on one round's rows alone,
// matched to gs by goal, system and peer; 0 where a round has no match.
func roundGoals(gs []Goal, roundRows []Result) {
	type key struct{ goal, system, versus string }
	at := make(map[key]int, len(gs))
	for i, g := range gs {
		at[key{g.Goal, g.System, g.Versus}] = i
	}
	var rounds []int
	byRound := map[int][]Result{}
	for _, r := range roundRows {
		if _, seen := byRound[r.Round]; !seen {
			rounds = append(rounds, r.Round)
		}
		byRound[r.Round] = append(byRound[r.Round], r)
	}
	sort.Ints(rounds)
	for _, n := range rounds {
		got := make([]float64, len(gs))
		_, rgs := compare(byRound[n])
		for _, g := range rgs {
			if i, found := at[key{g.Goal, g.System, g.Versus}]; found {
				got[i] = g.Ratio
			}
		}
		for i := range gs {
			gs[i].Rounds = append(gs[i].Rounds, got[i])
		}
	}
}

// goalRatio formats g.Ratio with two decimals, or with four where two
// would contradict whether the ratio reaches g.Want: 1.9994 against ">= 2"
// reads "1.9994", not a "2.00" marked short. A failed goal shows why it
// has no ratio ("redis-always failed 2/3 rounds").
func goalRatio(g Goal) string {
	if g.Failed != "" {
		return g.Failed
	}
	s := fmt.Sprintf("%.2f", g.Ratio)
	shown, _ := strconv.ParseFloat(s, 64) // s is a number: %.2f wrote it
	if meets(shown, g.Want) != ratioMeets(g) {
		return fmt.Sprintf("%.4f", g.Ratio)
	}
	return s
}

// ratioMeets reports whether g.Ratio reaches g.Want, whatever else made
// the goal short (judged).
func ratioMeets(g Goal) bool { return meets(g.Ratio, g.Want) }

// meets reports whether v reaches want (">= 2", "<= 1"); false when want
// is not of that form.
func meets(v float64, want string) bool {
	var op string
	var w float64
	if _, err := fmt.Sscanf(want, "%s %g", &op, &w); err != nil {
		return false
	}
	return (op == ">=" && v >= w) || (op == "<=" && v <= w)
}

// WriteMarkdown writes the table, ratios and goals as Markdown (what
// docs/BENCHMARKS.md embeds).
func WriteMarkdown(w io.Writer, rep *Report) error {
	var b strings.Builder
	idle := ""
	if rep.Machine.CPUIdle != "" {
		idle = ", cpuidle " + rep.Machine.CPUIdle
	}
	fmt.Fprintf(&b, "Run %s, seed %d, %d CPUs (%s), %s, %s%s, load average %.1f at start and %.1f at end.\n\n", rep.Started.Format("2006-01-02 15:04 UTC"), rep.Config.Seed,
		rep.Machine.CPUs, rep.Machine.CPUModel, rep.Machine.Kernel, rep.Machine.GoVersion, idle, rep.LoadAvg[0], rep.LoadAvg[1])
	if rep.Config.Rounds > 1 {
		fmt.Fprintf(&b, "Every row ran %d times, the systems taking turns round by round; each figure is its median over the rounds (notes: each round's items/s).\n\n", rep.Config.Rounds)
	}
	b.WriteString("| row | system | durability | items/s | e2e p50 / p99 / p999 ms | enqueue p50 / p99 / p999 ms | CPU s | CPU µs/item | client µs/item | peak RSS MB | notes |\n")
	b.WriteString("|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|\n")
	shape := ""
	for _, r := range rep.Results {
		if r.Shape != shape {
			shape = r.Shape
			fmt.Fprintf(&b, "| **%s** | *%s* | | | | | | | | | |\n", r.Row, strings.ReplaceAll(r.Shape, "|", "/"))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s / %s / %s | %s / %s / %s | %.1f | %s | %s | %.0f | %s |\n", r.Row, r.System, r.Durability,
			figure(r, "%.0f", r.ItemsPerSec), ms(r.E2E, p50), ms(r.E2E, p99), ms(r.E2E, p999), ms(r.Enqueue, p50), ms(r.Enqueue, p99), ms(r.Enqueue, p999),
			r.CPUSeconds, figure(r, "%.0f", r.CPUPerItem), perItemClientCPU(r), float64(r.PeakRSS)/(1<<20), strings.ReplaceAll(note(r), "|", "/"))
	}
	if len(rep.Ratios) > 0 {
		b.WriteString("\n| row | leaseq | peer | class | metric | leaseq | peer | leaseq/peer | notes |\n|---|---|---|---|---|--:|--:|--:|---|\n")
		for _, r := range rep.Ratios {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %.0f | %.0f | %s | %s |\n", r.Row, r.Leaseq, r.Peer, r.Class, r.Metric, r.Value, r.PeerV, ratioText(r, "%.2f×"), r.Note)
		}
	}
	if len(rep.Goals) > 0 {
		b.WriteString("\n| goal | leaseq | versus | ratio | want | | by round | notes |\n|---|---|---|--:|---|---|---|---|\n")
		for _, g := range rep.Goals {
			met := "met"
			if st := goalStatus(g); st != "MET" {
				met = "**" + strings.ToLower(st) + "**"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", g.Goal, g.System, g.Versus, goalRatio(g), g.Want, met, roundRatios(g), g.Note)
		}
	}
	for _, s := range rep.Skipped {
		fmt.Fprintf(&b, "\nSkipped %s: %s\n", s.System, s.Reason)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteGoBench prints one Go benchmark line per completed row, so runs can
// be compared with benchstat. ns/op is the wall time per completed item.
// With several rounds it prints every round's row, as `go test -count`
// would, and benchstat computes its own statistics.
func WriteGoBench(w io.Writer, rep *Report) error {
	rows := rep.Results
	if len(rep.RoundResults) > 0 {
		rows = rep.RoundResults
	}
	for _, r := range rows {
		if !ok(r) {
			continue
		}
		line := fmt.Sprintf("BenchmarkLeaseqBench/row=%s/system=%s-%d\t%d\t%.1f ns/op\t%.0f items/s\t%.3f cpu-s\t%d peak-rss-B",
			r.Row, r.System, runtime.GOMAXPROCS(0), r.Items, r.Seconds*1e9/float64(r.Items), r.ItemsPerSec, r.CPUSeconds, r.PeakRSS)
		if !r.InProcess {
			line += fmt.Sprintf("\t%.3f client-cpu-s", r.ClientCPUSeconds)
		}
		if r.E2E != nil {
			line += fmt.Sprintf("\t%.0f e2e-p50-us\t%.0f e2e-p99-us\t%.0f e2e-p999-us", r.E2E.P50, r.E2E.P99, r.E2E.P999)
		}
		if r.Enqueue != nil {
			line += fmt.Sprintf("\t%.0f enq-p50-us\t%.0f enq-p99-us\t%.0f enq-p999-us", r.Enqueue.P50, r.Enqueue.P99, r.Enqueue.P999)
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return err
		}
	}
	return nil
}

// WriteFiles writes results.json, results.md and chart.svg into dir.
func WriteFiles(dir string, rep *Report) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: output dir: %w", err)
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("bench: results json: %w", err)
	}
	var md strings.Builder
	if err := WriteMarkdown(&md, rep); err != nil {
		return nil, err
	}
	files := map[string][]byte{
		"results.json": append(js, '\n'),
		"results.md":   []byte(md.String()),
		"chart.svg":    []byte(Chart(rep)),
	}
	var paths []string
	for _, name := range []string{"results.json", "results.md", "chart.svg"} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, files[name], 0o644); err != nil {
			return paths, fmt.Errorf("bench: write %s: %w", p, err)
		}
		paths = append(paths, p)
	}
	return paths, nil
}
