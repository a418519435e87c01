package bench

import (
	"bytes"
	"io/fs"
	"math/rand"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func row(rowName, system, family, class string, perSec, enqP50 float64) Result {
	return Result{Row: rowName, System: system, Family: family, Class: class, Durability: class, Items: 1000, Seconds: 1000 / perSec,
		ItemsPerSec: perSec, Enqueue: &Latency{Count: 10, P50: enqP50, P99: enqP50 * 2, P999: enqP50 * 3}}
}

func inproc(r Result) Result { r.InProcess = true; return r }

func cpu(r Result, perItem float64) Result { r.CPUPerItem = perItem; return r }

func TestCompare_RatiosAndGoals(t *testing.T) {
	t.Parallel()
	rs := []Result{
		row("e2e", "leaseq-rpc-always", "leaseq", "durable", 60000, 0),
		row("e2e", "leaseq-rpc-none", "leaseq", "relaxed", 90000, 0),
		row("e2e", "redis-always", "redis", "durable", 10000, 0),
		row("e2e", "redis-everysec", "redis", "relaxed", 50000, 0),
		row("e2e", "nats-default", "nats", "relaxed", 40000, 0),
		row("e2e", "beanstalkd-fsync", "beanstalkd", "durable", 3000, 0),
		row("latency-max", "leaseq-rpc-always", "leaseq", "durable", 3000, 300),
		row("latency-max", "redis-always", "redis", "durable", 3000, 250),
		row("latency-max", "beanstalkd-fsync", "beanstalkd", "durable", 3000, 400),
		{Row: "churn", System: "leaseq-rpc-always", Family: "leaseq", Class: "durable", Items: 10, Seconds: 1, ItemsPerSec: 10,
			Extra: map[string]float64{"last_first_ratio": 0.7}},
		{Row: "e2e", System: "nats-syncalways", Family: "nats", Class: "durable", Err: "start: boom"},
		inproc(row("e2e", "leaseq-inproc-none", "leaseq", "relaxed", 90000, 0)),
		inproc(row("produce-b1", "leaseq-inproc-none", "leaseq", "relaxed", 90000, 0)),
		cpu(row("produce-b1", "leaseq-rpc-none", "leaseq", "relaxed", 20000, 0), 40),
		cpu(row("produce-b1", "redis-everysec", "redis", "relaxed", 30000, 0), 16),
		row("produce-b100", "leaseq-rpc-always", "leaseq", "durable", 150000, 0),
		row("produce-b100", "redis-always", "redis", "durable", 100000, 0),
		cpu(row("roundtrip", "leaseq-rpc-always", "leaseq", "durable", 14000, 0), 30),
		cpu(row("roundtrip", "redis-always", "redis", "durable", 12000, 0), 40),
		cpu(row("roundtrip", "leaseq-rpc-none", "leaseq", "relaxed", 14000, 0), 30),
		cpu(row("roundtrip", "redis-everysec", "redis", "relaxed", 12000, 0), 24),
	}
	ratios, goals := compare(rs)
	find := func(rowName, l, p, metric string) Ratio {
		for _, r := range ratios {
			if r.Row == rowName && r.Leaseq == l && r.Peer == p && r.Metric == metric {
				return r
			}
		}
		t.Fatalf("no ratio %s %s/%s %s in %+v", rowName, l, p, metric, ratios)
		return Ratio{}
	}
	require.InDelta(t, 6.0, find("e2e", "leaseq-rpc-always", "redis-always", "items/s").Ratio, 1e-9)
	require.InDelta(t, 20.0, find("e2e", "leaseq-rpc-always", "beanstalkd-fsync", "items/s").Ratio, 1e-9)
	require.InDelta(t, 1.8, find("e2e", "leaseq-rpc-none", "redis-everysec", "items/s").Ratio, 1e-9)
	require.InDelta(t, 1.2, find("latency-max", "leaseq-rpc-always", "redis-always", "enqueue p50 µs").Ratio, 1e-9)
	for _, r := range ratios {
		require.NotEqual(t, r.Class == "durable", r.Peer == "redis-everysec" || r.Peer == "nats-default", "classes are never mixed: %+v", r)
		require.NotEqual(t, "nats-syncalways", r.Peer, "failed rows are not compared")
	}

	want := map[string]struct {
		ratio float64
		met   bool
	}{
		"e2e items/s vs Redis appendfsync always/leaseq-rpc-always":         {6, true},
		"e2e items/s vs Redis everysec/leaseq-rpc-always":                   {1.2, true},
		"e2e items/s vs best relaxed-durability peer/leaseq-rpc-none":       {1.8, false},
		"single durable enqueue p50 vs best durable peer/leaseq-rpc-always": {1.2, false},
		"tombstone churn last/first interval/leaseq-rpc-always":             {0.7, false},
		"e2e items/s vs best relaxed-durability peer/leaseq-inproc-none":    {1.8, false},
		// The speed targets: rpc >= 1.5, in process >= 2, produce-b1 over
		// RPC >= 1 at no more server CPU per call, the durable enqueue's
		// p50 <= Redis always's and its p99 <= 2x.
		"e2e items/s vs Redis, same class/leaseq-rpc-always":                       {6, true},
		"e2e items/s vs Redis, same class/leaseq-rpc-none":                         {1.8, true},
		"e2e items/s vs Redis, same class/leaseq-inproc-none":                      {1.8, false},
		"produce-b1 items/s vs Redis, same class/leaseq-rpc-none":                  {2.0 / 3, false},
		"produce-b1 server cpu-µs per call vs Redis, same class/leaseq-rpc-none":   {2.5, false},
		"produce-b100 items/s vs Redis, same class/leaseq-rpc-always":              {1.5, true},
		"single durable enqueue p50 vs Redis appendfsync always/leaseq-rpc-always": {1.2, false},
		"single durable enqueue p99 vs Redis appendfsync always/leaseq-rpc-always": {1.2, true},
		// A call without queue work: the node's CPU per nodeInfo at most
		// Redis's per PING, same run.
		"roundtrip (nodeInfo vs PING) server cpu-µs per call vs Redis/leaseq-rpc-always": {0.75, true},
		"roundtrip (nodeInfo vs PING) server cpu-µs per call vs Redis/leaseq-rpc-none":   {1.25, false},
	}
	require.Len(t, goals, len(want))
	for _, g := range goals {
		w, found := want[g.Goal+"/"+g.System]
		require.True(t, found, "unexpected goal %+v", g)
		require.InDelta(t, w.ratio, g.Ratio, 1e-9, g.Goal)
		require.Equal(t, w.met, g.Met, g.Goal)
	}

	rep := &Report{Results: rs, Ratios: ratios, Goals: goals}
	var txt, md bytes.Buffer
	require.NoError(t, WriteTable(&txt, rep))
	require.Contains(t, txt.String(), "SHORT")
	require.Contains(t, txt.String(), "FAILED: start: boom")
	require.NoError(t, WriteMarkdown(&md, rep))
	require.Contains(t, md.String(), "| e2e items/s vs Redis appendfsync always | leaseq-rpc-always | redis-always | 6.00 | >= 5 | met |")
	svg := Chart(rep)
	require.Equal(t, 1, strings.Count(svg, "<svg "))
	require.Contains(t, svg, "failed", "a failed row is marked on the chart")
}

func TestIntervals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		samples []int64
		k       int
		want    []float64
	}{
		{[]int64{10, 10, 20, 20}, 2, []float64{100, 200}},     // 0.1 s samples: 20 items per 0.2 s
		{[]int64{10, 10, 20, 20, 99}, 2, []float64{100, 200}}, // a trailing partial sample is dropped
		{[]int64{10}, 2, nil},
	} {
		require.Equal(t, tc.want, intervals(tc.samples, tc.k))
	}
}

func TestZipfIndex_SkewedAndInRange(t *testing.T) {
	t.Parallel()
	cdf := zipfCDF(1.1, 100)
	r := newTestRand()
	counts := make([]int, 100)
	for i := 0; i < 20000; i++ {
		k := zipfIndex(r, cdf)
		require.GreaterOrEqual(t, k, 0)
		require.Less(t, k, 100)
		counts[k]++
	}
	require.Greater(t, counts[0], 5*counts[50], "queue 0 is much hotter than queue 50")
	require.Greater(t, counts[0], counts[1])
}

func TestPayloadStamp_RoundTrip(t *testing.T) {
	t.Parallel()
	pm := newPayloadMaker(64, 7, 0)
	ps := pm.batch(3, 12345, 100)
	require.Len(t, ps, 3)
	for i, p := range ps {
		require.Len(t, p, 64)
		sent, seq, ok := stamp(p)
		require.True(t, ok)
		require.EqualValues(t, 12345, sent)
		require.EqualValues(t, 100+i, seq)
	}
	_, _, ok := stamp([]byte("short"))
	require.False(t, ok)
}

// TestPayloadMaker_NoSharedFiller: after the stamp, no two payloads of a
// worker, or of two workers, carry the same bytes (a compressing system
// must not gain from the harness's filler), and the minimum payload (the
// stamp alone) works.
func TestPayloadMaker_NoSharedFiller(t *testing.T) {
	t.Parallel()
	seen := map[string]int{}
	for w := range 2 {
		pm := newPayloadMaker(256, 7, w)
		for b := range 200 { // 6,400 payloads, 1.6 MB of filler: past the pool's end
			for i, p := range pm.batch(32, 1, uint64(b*32)) {
				require.Len(t, p, 256)
				// Any 64-byte run of the filler identifies it.
				for _, at := range []int{payloadHeader, 256 - 64} {
					k := string(p[at : at+64])
					prev, dup := seen[k]
					require.False(t, dup, "worker %d batch %d item %d repeats payload %d's bytes at %d", w, b, i, prev, at)
					seen[k] = w<<20 | b<<5 | i
				}
			}
		}
	}
	pm := newPayloadMaker(payloadHeader, 7, 0)
	for i, p := range pm.batch(3, 5, 9) {
		sent, seq, ok := stamp(p)
		require.True(t, ok)
		require.EqualValues(t, 5, sent)
		require.EqualValues(t, 9+i, seq)
	}
}

func newTestRand() *rand.Rand { return rand.New(rand.NewSource(1)) }

// TestReport_ClientCPUColumn: rows of a server in a process of its own
// show the harness's CPU per item as the client's; in-process rows, whose
// CPU figure already holds both sides, show "-".
func TestReport_ClientCPUColumn(t *testing.T) {
	t.Parallel()
	out := cpu(row("produce-b1", "redis-everysec", "redis", "relaxed", 50000, 0), 14)
	out.ClientCPUSeconds, out.ClientCPUPerItem = 0.025, 25
	in := cpu(inproc(row("produce-b1", "leaseq-inproc-none", "leaseq", "relaxed", 90000, 0)), 30)
	rep := &Report{Results: []Result{out, in}}

	var tb bytes.Buffer
	require.NoError(t, WriteTable(&tb, rep))
	lines := strings.Split(tb.String(), "\n")
	require.Contains(t, lines[0], "client µs/item")
	require.Regexp(t, `redis-everysec .* 14 +25 +`, lines[1], "server then client µs/item")
	require.Regexp(t, `leaseq-inproc-none .* 30 +- +`, lines[2])

	var md bytes.Buffer
	require.NoError(t, WriteMarkdown(&md, rep))
	require.Contains(t, md.String(), "| CPU µs/item | client µs/item |")
	require.Contains(t, md.String(), "| 14 | 25 |")
	require.Contains(t, md.String(), "| 30 | - |")

	require.Contains(t, rowLine(out), "client cpu 0.0s")
	require.Contains(t, rowLine(in), "client cpu -")

	var gb bytes.Buffer
	require.NoError(t, WriteGoBench(&gb, rep))
	lines = strings.Split(gb.String(), "\n")
	require.Contains(t, lines[0], "\t0.025 client-cpu-s\t", "benchstat sees the client's CPU")
	require.NotContains(t, lines[1], "client-cpu-s")
}

// A row that ran while the hypervisor took a noticeable share of the
// machine's CPU says so in its notes; the share is a median over rounds
// like the row's other figures.
func TestReport_StealNoted(t *testing.T) {
	t.Parallel()
	r := row("e2e", "leaseq-rpc-none", "leaseq", "relaxed", 90000, 0)
	r.Steal = 0.25
	require.Contains(t, note(r), "steal 25%")
	r.Steal = 0.01
	require.NotContains(t, note(r), "steal")

	rounds := []Result{r, r, r}
	rounds[0].Steal, rounds[1].Steal, rounds[2].Steal = 0.30, 0.02, 0.10
	require.InDelta(t, 0.10, medianRow(rounds).Steal, 1e-12)
}

func TestCPUIdle(t *testing.T) {
	t.Parallel()
	files := func(m map[string]string) func(string) ([]byte, error) {
		return func(name string) ([]byte, error) {
			v, ok := m[name]
			if !ok {
				return nil, fs.ErrNotExist
			}
			return []byte(v), nil
		}
	}
	const drv, poll = "/sys/devices/system/cpu/cpuidle/current_driver", "/sys/module/haltpoll/parameters/guest_halt_poll_ns"
	require.Equal(t, "haltpoll, polls 0 ns before halting", cpuIdle(files(map[string]string{drv: "haltpoll\n", poll: "0\n"})))
	require.Equal(t, "haltpoll", cpuIdle(files(map[string]string{drv: "haltpoll\n"})), "no parameter file: the driver alone")
	require.Equal(t, "intel_idle", cpuIdle(files(map[string]string{drv: "intel_idle\n", poll: "0\n"})), "only haltpoll polls")
	require.Equal(t, "", cpuIdle(files(map[string]string{drv: "none\n"})))
	require.Equal(t, "", cpuIdle(files(nil)))

	var md bytes.Buffer
	rep := &Report{Machine: Machine{CPUs: 2, CPUModel: "cpu", Kernel: "k", GoVersion: "go", CPUIdle: "haltpoll, polls 0 ns before halting"}}
	require.NoError(t, WriteMarkdown(&md, rep))
	require.Contains(t, md.String(), "2 CPUs (cpu), k, go, cpuidle haltpoll, polls 0 ns before halting, load average")
	md.Reset()
	rep.Machine.CPUIdle = ""
	require.NoError(t, WriteMarkdown(&md, rep))
	require.Contains(t, md.String(), "2 CPUs (cpu), k, go, load average", "no cpuidle: nothing added")
}

func TestGoalRatio_NoShortGoalReadsAsMet(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		g    Goal
		want string
	}{
		{Goal{Ratio: 1.9994, Want: ">= 2", Met: false}, "1.9994"},
		{Goal{Ratio: 1.0004, Want: "<= 1", Met: false}, "1.0004"},
		{Goal{Ratio: 2.004, Want: ">= 2", Met: true}, "2.00"},
		{Goal{Ratio: 1.95, Want: ">= 2", Met: false}, "1.95"},
		{Goal{Ratio: 0.96, Want: "<= 1", Met: true}, "0.96"},
		{Goal{Ratio: 1.5, Want: "odd", Met: true}, "1.50"},
	} {
		require.Equal(t, c.want, goalRatio(c.g), "%+v", c.g)
	}
	rep := &Report{Goals: []Goal{{Goal: "e2e items/s vs Redis, same class", System: "leaseq-inproc-always", Versus: "redis-always", Ratio: 1.9994, Want: ">= 2"}}}
	var text, md bytes.Buffer
	require.NoError(t, WriteTable(&text, rep))
	require.NoError(t, WriteMarkdown(&md, rep))
	require.Contains(t, text.String(), "1.9994")
	require.Contains(t, md.String(), "| 1.9994 | >= 2 | **short** |")
}
