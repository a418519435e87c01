package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/bench/leaseqt"
	"github.com/leaseq/leaseq/bench/target"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// tinyConfig is a configuration that runs every workload in seconds. The
// numbers it yields mean nothing; the tests check that every workload
// runs, completes items end to end, and reports them.
func tinyConfig(t *testing.T) Config {
	t.Helper()
	c := DefaultConfig()
	c.Clock = clock.New()
	c.Duration = 300 * time.Millisecond
	c.ChurnDuration = time.Second
	c.Intervals = 2
	c.Producers, c.Consumers = 2, 2
	c.Batch = 8
	c.Rate = 200
	c.DrainItems = 300
	c.StormItems = 200
	c.StormLease = 200 * time.Millisecond
	c.Queues = 20
	c.Timeout = 30 * time.Second
	c.OutDir = ""
	c.Progress = testWriter{t}
	return c
}

// testWriter sends progress lines to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func inprocSystems() []target.System {
	return []target.System{
		leaseqt.InProcess{Backend: leaseqt.BackendRocks, Sync: rocksstore.SyncNone},
		leaseqt.InProcess{Backend: leaseqt.BackendMem},
	}
}

// wantRows is every row a full run produces per system, in order.
var wantRows = []string{"produce-b1", "produce-b100", "e2e", "latency-rate", "latency-max", "drain", "churn", "storm", "manyqueues"}

func TestRun_EveryWorkloadInProcess(t *testing.T) {
	t.Parallel()
	c := tinyConfig(t)
	rep, err := Run(context.Background(), c, inprocSystems())
	require.NoError(t, err)
	require.Len(t, rep.Results, len(wantRows)*2)
	for i, r := range rep.Results {
		require.Equal(t, wantRows[i/2], r.Row, "row order")
		require.Empty(t, r.Err, "%s/%s", r.Row, r.System)
		require.Positive(t, r.Items, "%s/%s completed nothing", r.Row, r.System)
		require.Positive(t, r.ItemsPerSec, "%s/%s", r.Row, r.System)
		require.True(t, r.InProcess, "in-process rows say their CPU includes the harness")
		require.Zero(t, r.ClientCPUSeconds, "an in-process row has no separate client")
		require.NotEmpty(t, r.Durability)
		if strings.HasPrefix(r.Row, "produce") {
			require.NotNil(t, r.Enqueue, "%s/%s enqueue latency", r.Row, r.System)
			require.Nil(t, r.E2E)
			continue
		}
		require.NotNil(t, r.E2E, "%s/%s e2e latency", r.Row, r.System)
		require.LessOrEqual(t, r.E2E.P50, r.E2E.P99)
		require.LessOrEqual(t, r.E2E.P99, r.E2E.P999)
		if r.Row == "e2e" {
			// Consumers poll batches of c.Batch; the mean over the run
			// is above zero (they got items) and at most a full batch.
			require.Positive(t, r.Extra["items_per_poll"], "%s", r.System)
			require.LessOrEqual(t, r.Extra["items_per_poll"], float64(c.Batch), "%s", r.System)
		}
	}
	churn := rep.Results[2*6]
	require.Equal(t, "churn", churn.Row)
	require.Len(t, churn.Intervals, 2)
	require.Contains(t, churn.Extra, "last_first_ratio")
	storm := rep.Results[2*7]
	require.Equal(t, "storm", storm.Row)
	require.EqualValues(t, c.StormItems, storm.Items, "every leased item is redelivered")
	drain := rep.Results[2*5]
	require.EqualValues(t, c.DrainItems, drain.Items)
	require.Contains(t, drain.Extra, "enqueue_items_per_s")
}

// With -ack-poll, consumers ack each batch with the poll for the next:
// the steady rows still complete every item they count, and a drain
// still acks the whole backlog.
func TestRun_AckPollConsumers(t *testing.T) {
	t.Parallel()
	c := tinyConfig(t)
	c.AckPoll = true
	c.Workloads = []string{WorkloadE2E, WorkloadDrain, WorkloadChurn, WorkloadManyQueues}
	sys := append(inprocSystems(), leaseqt.InProcess{Backend: leaseqt.BackendRocks, Sync: rocksstore.SyncAlways})
	rep, err := Run(context.Background(), c, sys)
	require.NoError(t, err)
	require.True(t, rep.Config.AckPoll)
	require.Len(t, rep.Results, 4*len(sys))
	for _, r := range rep.Results {
		require.Empty(t, r.Err, "%s/%s", r.Row, r.System)
		require.Positive(t, r.Items, "%s/%s completed nothing", r.Row, r.System)
		require.NotNil(t, r.E2E, "%s/%s", r.Row, r.System)
		if r.Row == "drain" {
			require.EqualValues(t, c.DrainItems, r.Items, "%s: the whole backlog acked", r.System)
		}
	}
}

func TestMain_WritesTableGoBenchJSONAndChart(t *testing.T) {
	t.Parallel()
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	args := []string{"e2e", "-systems", "leaseq-inproc-mem", "-duration", "300ms", "-producers", "2", "-consumers", "2",
		"-batch", "8", "-gobench", "-out", out, "-seed", "42"}
	err := Main(context.Background(), clock.New(), args, &stdout, &stderr)
	require.NoError(t, err, "stderr: %s", stderr.String())
	require.Contains(t, stderr.String(), "seed=42", "seed and config are printed at start")
	require.Contains(t, stderr.String(), "P=2 C=2 batch=8")
	require.Contains(t, stdout.String(), "leaseq-inproc-mem")
	require.Contains(t, stdout.String(), "memory only (baseline)", "every row states its durability")
	require.Regexp(t, `(?m)^BenchmarkLeaseqBench/row=e2e/system=leaseq-inproc-mem-\d+\t\d+\t[0-9.]+ ns/op\t\d+ items/s`, stdout.String())

	b, err := os.ReadFile(filepath.Join(out, "results.json"))
	require.NoError(t, err)
	var rep Report
	require.NoError(t, json.Unmarshal(b, &rep))
	require.Len(t, rep.Results, 1)
	require.Equal(t, "e2e", rep.Results[0].Row)
	require.EqualValues(t, 42, rep.Config.Seed)
	require.Positive(t, rep.Results[0].ItemsPerSec)

	svg, err := os.ReadFile(filepath.Join(out, "chart.svg"))
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(svg), "<svg "), "chart is an SVG document")
	require.Contains(t, string(svg), "leaseq-inproc-mem")
	require.True(t, strings.HasSuffix(strings.TrimSpace(string(svg)), "</svg>"))

	md, err := os.ReadFile(filepath.Join(out, "results.md"))
	require.NoError(t, err)
	require.Contains(t, string(md), "| e2e |")
}

func TestMain_RejectsBadArguments(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"nosuchworkload"},
		{"-batch", "0"},
		{"-payload", "8"},
		{"-zipf", "1"},
		{"-nosuchflag"},
	} {
		var stdout, stderr bytes.Buffer
		err := Main(context.Background(), clock.New(), args, &stdout, &stderr)
		require.Error(t, err, "%v", args)
	}
	var stdout, stderr bytes.Buffer
	err := Main(context.Background(), clock.New(), []string{"-systems", "nosuchsystem", "e2e"}, &stdout, &stderr)
	require.ErrorContains(t, err, "no system to run")
}

// -h names every workload, in the order a full run takes them.
func TestParseFlags_HelpListsWorkloads(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	_, err := ParseFlags([]string{"-h"}, &stderr)
	require.ErrorIs(t, err, flag.ErrHelp)
	require.Contains(t, stderr.String(), "(default: all): "+strings.Join(AllWorkloads(), ", ")+".")
	require.Contains(t, stderr.String(), "-duration")
}

func TestParseFlags_FlagsAroundWorkloads(t *testing.T) {
	t.Parallel()
	c, err := ParseFlags([]string{"-producers", "3", "e2e", "-consumers", "5", "storm", "-systems", "redis, leaseq-rpc-always"}, &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, []string{"e2e", "storm"}, c.Workloads)
	require.Equal(t, 3, c.Producers)
	require.Equal(t, 5, c.Consumers)
	require.Equal(t, []string{"redis", "leaseq-rpc-always"}, c.Systems)
	c, err = ParseFlags([]string{"all"}, &bytes.Buffer{})
	require.NoError(t, err)
	require.Empty(t, c.Workloads, "all means every workload")
}

func TestSelectSystems(t *testing.T) {
	t.Parallel()
	all := append(inprocSystems(), fakeSystem{name: "redis-always", family: "redis"}, fakeSystem{name: "redis-everysec", family: "redis"})
	names := func(ss []target.System) []string {
		var out []string
		for _, s := range ss {
			out = append(out, s.Name())
		}
		return out
	}
	require.Equal(t, []string{"redis-always", "redis-everysec"}, names(selectSystems(all, []string{"peers"})))
	require.Equal(t, []string{"redis-always", "redis-everysec"}, names(selectSystems(all, []string{"redis"})))
	require.Equal(t, []string{"leaseq-inproc-none", "leaseq-inproc-mem"}, names(selectSystems(all, []string{"leaseq-inproc"})))
	require.Len(t, selectSystems(all, nil), 4)
	withDiag := append(all, leaseqt.Loopback{Sync: rocksstore.SyncNone})
	require.Len(t, selectSystems(withDiag, nil), 4, "diagnostics run only when named")
	require.Equal(t, []string{"leaseq-loopback-none"}, names(selectSystems(withDiag, []string{"leaseq-loopback"})))
	require.Equal(t, []string{"leaseq-loopback-none"}, names(selectSystems(withDiag, []string{"leaseq-loopback-none"})))
	require.Equal(t, []string{"leaseq-inproc-none", "leaseq-inproc-mem", "redis-always"},
		names(selectSystems(withDiag, []string{"leaseq", "redis-always"})), "a family or group leaves the diagnostics out")
	require.Len(t, selectSystems(withDiag, []string{"all"}), 4)
}

// In-process systems have no wire: they sit out the roundtrip row, and a
// run in which no row ran says so instead of printing an empty report.
func TestRun_RoundTripWithoutWireSaysNothingRan(t *testing.T) {
	t.Parallel()
	c := tinyConfig(t)
	c.Workloads = []string{WorkloadRoundTrip}
	rep, err := Run(context.Background(), c, inprocSystems())
	require.ErrorContains(t, err, "no row ran")
	require.Empty(t, rep.Results)
	c.Workloads = []string{WorkloadRoundTrip, WorkloadProduce}
	rep, err = Run(context.Background(), c, inprocSystems())
	require.NoError(t, err)
	require.Len(t, rep.Results, 2*2, "the produce rows ran; roundtrip was left out")
	for _, r := range rep.Results {
		require.NotEqual(t, "roundtrip", r.Row)
	}
}

func TestRun_SkipsUnavailableSystemsAndSaysWhy(t *testing.T) {
	t.Parallel()
	c := tinyConfig(t)
	c.Workloads = []string{WorkloadProduce}
	c.Duration = 100 * time.Millisecond
	sys := []target.System{leaseqt.InProcess{Backend: leaseqt.BackendMem}, fakeSystem{name: "ghost-always", family: "ghost", missing: "ghost-server not installed"}}
	rep, err := Run(context.Background(), c, sys)
	require.NoError(t, err)
	require.Equal(t, []Skipped{{System: "ghost-always", Reason: "ghost-server not installed"}}, rep.Skipped)
	require.Len(t, rep.Results, 2)
	var buf bytes.Buffer
	require.NoError(t, WriteTable(&buf, rep))
	require.Contains(t, buf.String(), "skipped ghost-always: ghost-server not installed")
}

func TestRunFlow_DrainStopsProducersAndAcksBacklog(t *testing.T) {
	t.Parallel()
	c := tinyConfig(t)
	drain := make(chan struct{})
	c.Drain = drain
	c.Workloads = []string{WorkloadE2E}
	c.Duration = time.Minute // only the drain request ends this row
	sys := leaseqt.InProcess{Backend: leaseqt.BackendMem}
	c.Progress = writerFunc(func(p []byte) {
		// The first progress tick proves work is flowing; then drain.
		if strings.Contains(string(p), "items/s") {
			select {
			case <-drain:
			default:
				close(drain)
			}
		}
	})
	rep, err := Run(context.Background(), c, []target.System{sys})
	require.NoError(t, err)
	require.True(t, rep.Interrupted)
	require.Len(t, rep.Results, 1)
	r := rep.Results[0]
	require.True(t, r.Interrupted)
	require.Empty(t, r.Err)
	require.Positive(t, r.Items)
	require.Less(t, r.Seconds, 30.0, "the row ended at the drain request, not its minute")
}

type writerFunc func(p []byte)

func (f writerFunc) Write(p []byte) (int, error) { f(p); return len(p), nil }

func TestRun_AbortedContextEndsTheRun(t *testing.T) {
	t.Parallel()
	c := tinyConfig(t)
	c.Workloads = []string{WorkloadE2E, WorkloadChurn}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rep, err := Run(ctx, c, []target.System{leaseqt.InProcess{Backend: leaseqt.BackendMem}})
	require.NoError(t, err)
	require.True(t, rep.Interrupted)
	require.Empty(t, rep.Results, "no row starts after an abort")
}

// fakeSystem is a system the tests can name; it never starts.
type fakeSystem struct {
	name, family, missing string
}

func (f fakeSystem) Name() string   { return f.name }
func (f fakeSystem) Family() string { return f.family }
func (f fakeSystem) Durability() target.Durability {
	return target.Durability{Class: target.ClassDurable, Mode: "fake"}
}
func (f fakeSystem) Available() error {
	if f.missing != "" {
		return errString(f.missing)
	}
	return nil
}
func (f fakeSystem) Start(context.Context, target.StartOptions) (target.Instance, error) {
	return nil, errString("fake system cannot start")
}

type errString string

func (e errString) Error() string { return string(e) }

// TestMain_WritesExecutionTrace is not parallel: an execution trace holds
// the whole process, and a parallel test's RocksDB store put its WAL
// fsyncs in this run's summary (a clean-clone make test, session 73).
func TestMain_WritesExecutionTrace(t *testing.T) {
	tr := filepath.Join(t.TempDir(), "bench.trace")
	var stdout, stderr bytes.Buffer
	args := []string{"e2e", "-systems", "leaseq-inproc-mem", "-duration", "200ms", "-out", "", "-trace", tr}
	err := Main(context.Background(), clock.New(), args, &stdout, &stderr)
	require.NoError(t, err, "stderr: %s", stderr.String())
	b, err := os.ReadFile(tr)
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(b, []byte("go 1.")), "an execution trace starts with its Go version header, got %q", b[:min(len(b), 16)])
	require.Greater(t, len(b), 1024, "the trace holds the run's events")
	require.Contains(t, stdout.String(), "trace: ", "the trace's summary follows the table")
	require.Contains(t, stdout.String(), "WAL fsyncs      0,", "the in-memory engine has no WAL")
	require.Contains(t, stdout.String(), "runnable waits")
	require.Contains(t, stdout.String(), tr+": this process only", "the run says whose pipeline it summed up")
	printed := stdout.String()[strings.Index(stdout.String(), "\ntrace: ")+1:]

	var again bytes.Buffer
	require.NoError(t, Main(context.Background(), clock.New(), []string{"-read-trace", tr}, &again, &stderr))
	require.Equal(t, printed, again.String(), "-read-trace prints the summary the run printed, and runs nothing")
	err = Main(context.Background(), clock.New(), []string{"-read-trace", filepath.Join(t.TempDir(), "missing.trace")}, &again, &stderr)
	require.ErrorContains(t, err, "bench: trace")
	notTrace := filepath.Join(t.TempDir(), "not.trace")
	require.NoError(t, os.WriteFile(notTrace, []byte("not a trace"), 0o644))
	err = Main(context.Background(), clock.New(), []string{"-read-trace", notTrace}, &again, &stderr)
	require.ErrorContains(t, err, "not.trace")

	err = Main(context.Background(), clock.New(), []string{"e2e", "-systems", "leaseq-inproc-mem", "-duration", "100ms", "-out", "",
		"-trace", filepath.Join(t.TempDir(), "no", "such", "dir", "x.trace")}, &stdout, &stderr)
	require.ErrorContains(t, err, "bench: trace")
}
