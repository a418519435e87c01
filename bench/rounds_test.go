package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
)

func TestMedianRows_EachFigureIsItsMedianOverCompletedRounds(t *testing.T) {
	t.Parallel()
	row := func(system string, round int, rate, cpu, p50 float64, items int64) Result {
		return Result{Row: "e2e", System: system, Round: round, Items: items, Seconds: 10, ItemsPerSec: rate,
			CPUPerItem: cpu, Enqueue: &Latency{Count: items, P50: p50, P99: 2 * p50},
			Extra: map[string]float64{"enqueued": float64(items)}}
	}
	failed := row("b", 2, 0, 0, 0, 0)
	failed.Err = "start: boom"
	rs := []Result{
		row("a", 1, 100, 3, 30, 1000), row("b", 1, 50, 9, 90, 500),
		row("a", 2, 300, 1, 10, 3000), failed,
		row("a", 3, 200, 2, 20, 2000), row("b", 3, 70, 7, 70, 700),
	}
	got := medianRows(rs)
	require.Len(t, got, 2)

	a := got[0]
	require.Equal(t, "a", a.System, "rows keep the order they first ran in")
	require.Zero(t, a.Round)
	require.Equal(t, []float64{100, 300, 200}, a.RoundsItemsPerSec, "each round's items/s, in the order run")
	require.Zero(t, a.RoundsFailed)
	require.InDelta(t, 200, a.ItemsPerSec, 1e-9)
	require.InDelta(t, 2, a.CPUPerItem, 1e-9)
	require.InDelta(t, 20, a.Enqueue.P50, 1e-9)
	require.InDelta(t, 40, a.Enqueue.P99, 1e-9)
	require.EqualValues(t, 2000, a.Items, "items and seconds are the median round's")
	require.InDelta(t, 2000, a.Extra["enqueued"], 1e-9)

	b := got[1]
	require.Equal(t, []float64{50, 0, 70}, b.RoundsItemsPerSec, "a failed round shows as 0")
	require.Equal(t, 1, b.RoundsFailed)
	require.Empty(t, b.Err, "the median comes from the rounds that completed")
	require.InDelta(t, 50, b.ItemsPerSec, 1e-9, "an even number of rounds: the lower of the middle two")
	require.InDelta(t, 70, b.Enqueue.P50, 1e-9)
	require.Contains(t, note(b), "median of 3 rounds (items/s 50, failed, 70), 1 failed")

	allFailed := medianRows([]Result{failed, failed})
	require.Len(t, allFailed, 1)
	require.Equal(t, "start: boom", allFailed[0].Err, "a row no round completed keeps its failure")
	require.Equal(t, 2, allFailed[0].RoundsFailed)
}

func TestRotate(t *testing.T) {
	t.Parallel()
	xs := []int{1, 2, 3}
	require.Equal(t, []int{1, 2, 3}, rotate(xs, 0))
	require.Equal(t, []int{2, 3, 1}, rotate(xs, 1))
	require.Equal(t, []int{3, 1, 2}, rotate(xs, 5))
	require.Equal(t, []int{1, 2, 3}, xs, "rotate leaves its argument alone")
	require.Empty(t, rotate([]int(nil), 2))
}

func TestRun_RoundsTakeTurnsAndReportMedians(t *testing.T) {
	t.Parallel()
	c := tinyConfig(t)
	c.Workloads = []string{WorkloadProduce}
	c.Rounds = 3
	sys := inprocSystems()
	rep, err := Run(context.Background(), c, sys)
	require.NoError(t, err)
	require.Equal(t, 3, rep.Config.Rounds)

	// produce has two rows; each runs three rounds of both systems, the
	// systems taking turns within a round, each round starting one
	// system further on.
	require.Len(t, rep.RoundResults, 2*3*len(sys))
	i := 0
	for _, row := range []string{"produce-b1", "produce-b100"} {
		for round := 1; round <= 3; round++ {
			for _, s := range rotate(sys, round-1) {
				r := rep.RoundResults[i]
				require.Equal(t, row, r.Row)
				require.Equal(t, s.Name(), r.System)
				require.Equal(t, round, r.Round)
				require.Empty(t, r.Err)
				i++
			}
		}
	}
	require.Len(t, rep.Results, 2*len(sys))
	for _, m := range rep.Results {
		require.Empty(t, m.Err)
		require.Len(t, m.RoundsItemsPerSec, 3)
		rates := append([]float64(nil), m.RoundsItemsPerSec...)
		require.InDelta(t, median(rates), m.ItemsPerSec, 1e-6, "%s/%s", m.Row, m.System)
		require.NotNil(t, m.Enqueue)
	}

	var md bytes.Buffer
	require.NoError(t, WriteMarkdown(&md, rep))
	require.Contains(t, md.String(), "Every row ran 3 times")
	require.Contains(t, md.String(), "median of 3 rounds (items/s ")
	var gb bytes.Buffer
	require.NoError(t, WriteGoBench(&gb, rep))
	require.Equal(t, 2*3*len(sys), strings.Count(gb.String(), "BenchmarkLeaseqBench/"), "one line per round, for benchstat")
}

func TestMain_RejectsRoundsOutOfRange(t *testing.T) {
	t.Parallel()
	for _, n := range []string{"0", "-1", "21"} {
		var stdout, stderr bytes.Buffer
		err := Main(context.Background(), clock.New(), []string{"-rounds", n, "-systems", "leaseq-inproc-mem", "e2e"}, &stdout, &stderr)
		require.ErrorContains(t, err, "rounds "+n+" outside [1, 20]")
	}
}

func TestAddFsyncFigures(t *testing.T) {
	r := Result{Items: 640, Extra: map[string]float64{"wal_fsyncs": 20, "wal_fsync_s": 0.007}}
	addFsyncFigures(&r)
	require.InDelta(t, 32.0, r.Extra["items_per_fsync"], 1e-9)
	require.InDelta(t, 350.0, r.Extra["fsync_us"], 1e-9)
	require.Contains(t, note(r), "items_per_fsync=32")
	require.Contains(t, note(r), "fsync_us=350")

	noFsync := Result{Items: 640, Extra: map[string]float64{"commits": 9}}
	addFsyncFigures(&noFsync)
	require.Equal(t, map[string]float64{"commits": 9}, noFsync.Extra, "a row without fsyncs (sync=none, a peer) gets neither note")
	noTime := Result{Items: 64, Extra: map[string]float64{"wal_fsyncs": 4}}
	addFsyncFigures(&noTime)
	require.Equal(t, map[string]float64{"wal_fsyncs": 4, "items_per_fsync": 16}, noTime.Extra, "no fsync time counted: no mean")
	var empty Result
	addFsyncFigures(&empty)
	require.Nil(t, empty.Extra)
}

func TestAddCounters(t *testing.T) {
	r := Result{Extra: map[string]float64{"enqueued": 10}}
	addCounters(&r, map[string]float64{"write_stall_s": 1.5, "same": 2}, map[string]float64{"write_stall_s": 2.0, "same": 2, "new": 3})
	require.Equal(t, map[string]float64{"enqueued": 10, "write_stall_s": 0.5}, r.Extra,
		"increases only; an unmoved counter, or one missing from the first reading, is left out")
	var empty Result
	addCounters(&empty, map[string]float64{"write_stall_s": 0}, map[string]float64{"write_stall_s": 0})
	require.Nil(t, empty.Extra)
	addCounters(&empty, nil, map[string]float64{"write_stall_s": 0.25})
	require.Nil(t, empty.Extra, "a failed first reading: no increase can be told")
	addCounters(&empty, map[string]float64{"write_stall_s": 0.25}, nil)
	require.Nil(t, empty.Extra, "a failed last reading")
	addCounters(&empty, map[string]float64{"write_stall_s": 0}, map[string]float64{"write_stall_s": 0.25})
	require.Equal(t, map[string]float64{"write_stall_s": 0.25}, empty.Extra)
	require.Contains(t, note(empty), "write_stall_s=0.25")
}

func TestRoundGoals_RatioWithinEachRound(t *testing.T) {
	t.Parallel()
	in := func(round int, r Result) Result { r.Round = round; return r }
	rounds := []Result{
		in(1, row("e2e", "leaseq-rpc-none", "leaseq", "relaxed", 70000, 0)),
		in(1, row("e2e", "redis-everysec", "redis", "relaxed", 50000, 0)),
		in(2, row("e2e", "leaseq-rpc-none", "leaseq", "relaxed", 40000, 0)),
		in(2, row("e2e", "redis-everysec", "redis", "relaxed", 50000, 0)),
		in(3, Result{Row: "e2e", System: "leaseq-rpc-none", Family: "leaseq", Class: "relaxed", Err: "boom"}),
		in(3, row("e2e", "redis-everysec", "redis", "relaxed", 40000, 0)),
		in(4, row("e2e", "leaseq-rpc-none", "leaseq", "relaxed", 90000, 0)),
		in(4, row("e2e", "redis-everysec", "redis", "relaxed", 30000, 0)),
	}
	rep := &Report{RoundResults: rounds, Results: medianRows(rounds)}
	rep.Ratios, rep.Goals = compare(rep.Results)
	roundGoals(rep.Goals, rounds)

	var g Goal
	for _, x := range rep.Goals {
		if x.Goal == "e2e items/s vs Redis, same class" && x.System == "leaseq-rpc-none" {
			g = x
		}
	}
	require.Equal(t, "redis-everysec", g.Versus)
	// Medians: leaseq 70k of three completed rounds, Redis 40k of four
	// (the lower middle); within the rounds 1.4, 0.8, none (leaseq
	// failed), 3.
	require.InDelta(t, 70000.0/40000, g.Ratio, 1e-9)
	require.Len(t, g.Rounds, 4)
	for i, want := range []float64{1.4, 0.8, 0, 3} {
		require.InDelta(t, want, g.Rounds[i], 1e-9, "round %d", i+1)
	}
	require.Equal(t, "rounds 1.40 0.80 - 3.00", roundRatios(g))

	var txt, md bytes.Buffer
	require.NoError(t, WriteTable(&txt, rep))
	require.Contains(t, txt.String(), "rounds 1.40 0.80 - 3.00")
	require.NoError(t, WriteMarkdown(&md, rep))
	require.Contains(t, md.String(), "| by round |")
	require.Contains(t, md.String(), "| rounds 1.40 0.80 - 3.00 |")
}
