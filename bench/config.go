package bench

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/benbjohnson/clock"
)

// Workload names, in the order a full run executes them. A workload may
// produce several rows (produce runs batch 1 and batch 100; latency runs
// at a fixed offered rate and flat out).
const (
	WorkloadProduce    = "produce"
	WorkloadE2E        = "e2e"
	WorkloadLatency    = "latency"
	WorkloadDrain      = "drain"
	WorkloadChurn      = "churn"
	WorkloadStorm      = "storm"
	WorkloadManyQueues = "manyqueues"
	// WorkloadRoundTrip: one client making calls that do no queue work
	// (leaseq's nodeInfo, Redis's PING), one at a time: the wire's cost
	// per call on its own. Systems without such a call sit it out.
	WorkloadRoundTrip = "roundtrip"
)

// AllWorkloads lists every workload in run order (a new slice each call:
// the package holds no mutable globals).
func AllWorkloads() []string {
	return []string{WorkloadRoundTrip, WorkloadProduce, WorkloadE2E, WorkloadLatency, WorkloadDrain, WorkloadChurn, WorkloadStorm, WorkloadManyQueues}
}

// Config is one harness run. DefaultConfig gives the numbers of the
// documented comparison; tests shrink them.
type Config struct {
	// Workloads to run (AllWorkloads() when empty).
	Workloads []string
	// Systems to run by name or family ("redis", "leaseq-rpc-always",
	// "peers", "leaseq"); every available system when empty.
	Systems []string

	Duration      time.Duration // length of each timed workload (roundtrip, produce, e2e, latency, manyqueues)
	ChurnDuration time.Duration // length of the tombstone churn run
	Intervals     int           // churn: number of equal intervals the run is split into
	Producers     int
	Consumers     int
	Batch         int  // e2e and manyqueues: items per enqueue and per poll
	AckPerItem    bool // ack each item in its own call instead of one call per poll batch
	AckPoll       bool // ack a batch and poll for the next in one round trip, where the system can
	PayloadSize   int  // bytes per item, at least 16 (timestamp and sequence)
	Rate          int  // latency: offered items/s of the fixed-rate row
	MaxBacklog    int  // steady-state rows: producers pause while this many items are enqueued but not acked (0: no cap)
	DrainItems    int  // drain: backlog size
	StormItems    int  // storm: items leased by consumers that vanish
	StormLease    time.Duration
	Queues        int     // manyqueues: number of queues
	ZipfS         float64 // manyqueues: skew (> 1; larger is more skewed)
	Seed          int64
	// Rounds runs every row this many times, the systems taking turns
	// round by round, and reports each row's median (rounds.go); 1 runs
	// each row once.
	Rounds int
	// Timeout bounds every workload of every system beyond its planned
	// length (setup, drain, stragglers); past it the workload is aborted
	// and reported as failed.
	Timeout time.Duration

	OutDir    string // JSON results and SVG chart; "" writes none
	GoBench   bool   // print Go benchmark lines for benchstat
	LeaseqBin string // leaseq binary for the RPC systems; "" builds one
	KeepData  bool   // keep data directories (for debugging)
	// CPUProfile, if set, is where Main writes a CPU profile of the
	// harness process (which includes the in-process systems).
	CPUProfile string
	// Trace, if set, is where Main writes a Go execution trace of the
	// harness process, in-process systems included (go tool trace), and
	// prints its summary (package tracestat) after the table. Run also
	// traces the server of each row whose instance can (nodetrace.go).
	Trace string
	// ReadTrace, if set, names a trace written before (by -trace, or a
	// node's /debug/pprof/trace): Main prints its summary and runs
	// nothing.
	ReadTrace string

	// Clock is the only time source (DESIGN: main.go creates it).
	Clock clock.Clock
	// Progress receives the once-a-second ticks and notes; nil discards.
	Progress io.Writer
	// Drain, when closed, asks the run to stop producing, finish what is
	// in flight, report and skip the remaining workloads.
	Drain <-chan struct{}
}

// DefaultConfig returns the configuration of the documented comparison.
func DefaultConfig() Config {
	return Config{
		Duration:      10 * time.Second,
		ChurnDuration: 60 * time.Second,
		Intervals:     10,
		Producers:     4,
		Consumers:     4,
		Batch:         32,
		PayloadSize:   256,
		Rate:          1000,
		// 4,096 items is about 32 poll rounds of every consumer (4C x batch 32
		// = 128 items a round): enough to keep them busy, small
		// enough that e2e latency is not dominated by a growing queue.
		MaxBacklog: 4096,
		DrainItems: 100_000,
		StormItems: 10_000,
		// beanstalkd's TTR is whole seconds, so 1 s is the shortest lease
		// every system can express.
		StormLease: time.Second,
		Queues:     1000,
		ZipfS:      1.1,
		Seed:       1,
		Rounds:     1,
		Timeout:    2 * time.Minute,
		OutDir:     "bench-results",
	}
}

// Validate reports a configuration the harness cannot run.
func (c Config) Validate() error {
	var errs []error
	if c.Clock == nil {
		errs = append(errs, errors.New("bench: config: Clock is nil"))
	}
	if c.Producers < 1 || c.Consumers < 1 {
		errs = append(errs, fmt.Errorf("bench: config: producers (%d) and consumers (%d) must be >= 1", c.Producers, c.Consumers))
	}
	if c.Batch < 1 || c.Batch > 1000 {
		errs = append(errs, fmt.Errorf("bench: config: batch %d outside [1, 1000]", c.Batch))
	}
	if c.PayloadSize < payloadHeader || c.PayloadSize > 1<<20 {
		errs = append(errs, fmt.Errorf("bench: config: payload %d outside [%d, 1MiB]", c.PayloadSize, payloadHeader))
	}
	if c.Duration <= 0 || c.ChurnDuration <= 0 || c.Timeout <= 0 {
		errs = append(errs, errors.New("bench: config: durations and timeout must be > 0"))
	}
	if c.Intervals < 2 {
		errs = append(errs, fmt.Errorf("bench: config: intervals %d < 2", c.Intervals))
	}
	if c.Rate < 1 || c.DrainItems < 1 || c.StormItems < 1 || c.Queues < 1 {
		errs = append(errs, errors.New("bench: config: rate, drain-items, storm-items and queues must be >= 1"))
	}
	if c.Rounds < 1 || c.Rounds > maxRounds {
		errs = append(errs, fmt.Errorf("bench: config: rounds %d outside [1, %d]", c.Rounds, maxRounds))
	}
	if c.ZipfS <= 1 {
		errs = append(errs, fmt.Errorf("bench: config: zipf s %v must be > 1", c.ZipfS))
	}
	if c.StormLease < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("bench: config: storm lease %v below leaseq's 100ms minimum", c.StormLease))
	}
	for _, w := range c.Workloads {
		if !contains(AllWorkloads(), w) {
			errs = append(errs, fmt.Errorf("bench: config: unknown workload %q (have %s)", w, strings.Join(AllWorkloads(), ", ")))
		}
	}
	return errors.Join(errs...)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// ParseFlags fills a Config from command-line arguments: flags and, as
// positional arguments, workload names. Flags may stand before or after
// the workload names.
func ParseFlags(args []string, stderr io.Writer) (Config, error) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("leaseq bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: leaseq bench [WORKLOAD...] [flags]\n\nWorkloads, in run order (default: all): %s.\n"+
			"roundtrip times calls without queue work (nodeInfo, PING); produce runs batch 1 and 100; latency runs at -rate and flat out.\n\nFlags:\n",
			strings.Join(AllWorkloads(), ", "))
		fs.PrintDefaults()
	}
	var systems string
	fs.StringVar(&systems, "systems", "", "comma-separated systems or families to run (leaseq, peers, redis, beanstalkd, nats, leaseq-rpc-always, leaseq-http, ...); default all available; leaseq-http and leaseq-loopback run only when named by their own name or prefix, not by a family or group")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "length of each timed workload")
	fs.DurationVar(&c.ChurnDuration, "churn-duration", c.ChurnDuration, "length of the tombstone churn run")
	fs.IntVar(&c.Intervals, "intervals", c.Intervals, "churn: intervals the run is split into for the last/first ratio")
	fs.IntVar(&c.Producers, "producers", c.Producers, "producer goroutines (P)")
	fs.IntVar(&c.Consumers, "consumers", c.Consumers, "consumer goroutines (C)")
	fs.IntVar(&c.Batch, "batch", c.Batch, "e2e, churn, manyqueues: items per enqueue and per poll; latency rows: items per poll")
	fs.BoolVar(&c.AckPerItem, "ack-per-item", c.AckPerItem, "ack each item in its own call (default: one ack call per poll batch)")
	fs.BoolVar(&c.AckPoll, "ack-poll", c.AckPoll, "consumers ack a batch and poll for the next in one round trip where the system can (leaseq, redis: pipelined); others ack, then poll")
	fs.IntVar(&c.PayloadSize, "payload", c.PayloadSize, "payload bytes per item")
	fs.IntVar(&c.Rate, "rate", c.Rate, "latency: offered items/s of the fixed-rate row")
	fs.IntVar(&c.MaxBacklog, "max-backlog", c.MaxBacklog, "steady-state rows: pause producers while this many items are unacked (0: no cap)")
	fs.IntVar(&c.DrainItems, "drain-items", c.DrainItems, "drain: backlog size")
	fs.IntVar(&c.StormItems, "storm-items", c.StormItems, "storm: items leased by consumers that vanish")
	fs.DurationVar(&c.StormLease, "storm-lease", c.StormLease, "storm: lease (>= 1s for beanstalkd)")
	fs.IntVar(&c.Queues, "queues", c.Queues, "manyqueues: number of queues")
	fs.Float64Var(&c.ZipfS, "zipf", c.ZipfS, "manyqueues: zipf skew s (> 1)")
	fs.Int64Var(&c.Seed, "seed", c.Seed, "random seed (queue choice, payload bytes)")
	fs.IntVar(&c.Rounds, "rounds", c.Rounds, "run every row this many times, the systems taking turns round by round, and report each row's median (items/s, CPU, latency percentiles; with an even number of completed rounds, the lower middle value, so items, seconds and items/s are one round's); a row that failed at least half its rounds is reported failed, not compared; results.json keeps every round")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "extra time allowed per workload and system before it is aborted")
	fs.StringVar(&c.OutDir, "out", c.OutDir, "directory for results.json, results.md and chart.svg (empty: none)")
	fs.BoolVar(&c.GoBench, "gobench", c.GoBench, "also print Go benchmark lines (for benchstat)")
	fs.StringVar(&c.LeaseqBin, "leaseq-bin", c.LeaseqBin, "leaseq binary for the RPC systems (default: this binary when it is named leaseq, else one go build makes)")
	fs.BoolVar(&c.KeepData, "keep-data", c.KeepData, "keep each row's data directory (named leaseq-bench-kept-SYSTEM-* in the temporary directory); without it a run also removes the directories of harnesses that were killed before they could")
	fs.StringVar(&c.CPUProfile, "cpuprofile", c.CPUProfile, "write a CPU profile of this process (in-process systems included) to `file`")
	fs.StringVar(&c.ReadTrace, "read-trace", c.ReadTrace, "run nothing: print the summary -trace prints for the execution trace in `file` (one written by -trace, or a node's, fetched from /debug/pprof/trace of leaseq serve --pprof)")
	fs.StringVar(&c.Trace, "trace", c.Trace, "write a Go execution trace of this process (in-process systems included) to `file`, and print after the table how busy the in-process engines' batches and WAL fsyncs kept them, how much they overlapped, and how long woken goroutines waited to run; it grows by tens of MB a second. Each leaseq-rpc row also traces its node (file.ROW.SYSTEM) and notes the same as node_* figures; the traces cost the node CPU")
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			return c, fmt.Errorf("bench: %w", err)
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		rest = append(rest, args[0])
		args = args[1:]
	}
	for _, w := range rest {
		if w == "all" {
			continue
		}
		c.Workloads = append(c.Workloads, w)
	}
	if systems != "" {
		for _, s := range strings.Split(systems, ",") {
			if s = strings.TrimSpace(s); s != "" {
				c.Systems = append(c.Systems, s)
			}
		}
	}
	return c, nil
}
