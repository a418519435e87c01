package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/leaseq/leaseq/bench/procx"
	"github.com/leaseq/leaseq/bench/target"
)

// defaultLease is the lease of every workload but the storm: long enough
// that no item is redelivered during a run, so throughput is not inflated
// or deflated by expiry work.
const defaultLease = 30 * time.Second

// Result is one row: one workload variant against one system.
type Result struct {
	Row         string   `json:"row"`      // workload variant, such as "produce-b1"
	Workload    string   `json:"workload"` // workload it belongs to
	Shape       string   `json:"shape"`    // producers, consumers, batches, ...
	System      string   `json:"system"`
	Family      string   `json:"family"`
	Class       string   `json:"class"`
	Durability  string   `json:"durability"`
	Items       int64    `json:"items"`                     // items completed in the window (acked; enqueued for produce rows)
	Seconds     float64  `json:"seconds"`                   // window length
	ItemsPerSec float64  `json:"items_per_s"`               // Items / Seconds
	E2E         *Latency `json:"e2e_latency,omitempty"`     // enqueue call start (or scheduled send) -> ack confirmed
	Enqueue     *Latency `json:"enqueue_latency,omitempty"` // one enqueue call
	CPUSeconds  float64  `json:"cpu_s"`                     // server process CPU (user+sys) during the row's window (package doc)
	CPUPerItem  float64  `json:"cpu_us_per_item"`           // CPUSeconds per completed item, in µs
	// ClientCPUSeconds is the harness process's own CPU during the row of
	// a system in a process of its own: the system's client library and
	// the load generator (0 for in-process rows, whose CPUSeconds holds
	// both sides). The two processes share the machine's cores.
	ClientCPUSeconds float64 `json:"client_cpu_s,omitempty"`
	ClientCPUPerItem float64 `json:"client_cpu_us_per_item,omitempty"` // ClientCPUSeconds per completed item, in µs
	PeakRSS          int64   `json:"peak_rss_bytes"`
	InProcess        bool    `json:"in_process"` // CPU and RSS include the harness
	// Steal is the share of the machine's CPU time that the hypervisor
	// gave to someone else during the row (/proc/stat): on a shared
	// virtual machine, how much of the row ran on CPUs it did not have.
	Steal float64 `json:"steal_share,omitempty"`
	// Intervals are items/s per equal interval (churn).
	Intervals []float64          `json:"intervals,omitempty"`
	Extra     map[string]float64 `json:"extra,omitempty"`
	// AcksLost counts the deliveries whose ack the system answered was
	// not an ack (target.LostAcks: lease expired, item not found), over
	// the whole row; they are not in Items. In a run of several rounds
	// it is the sum over the rounds. A row that lost acks is flagged in
	// its notes, ratios and goals, none of which read as met.
	AcksLost int64 `json:"acks_lost,omitempty"`
	// still are an instance's counters that did not move over the row
	// (addCounters leaves them out of Extra): a round's median counts
	// them as 0 (medianExtra).
	still       map[string]bool
	Interrupted bool `json:"interrupted,omitempty"`
	// Incomplete says why a row that ran to its end did not complete its
	// work (a system that did not redeliver in time); it is reported and
	// never compared.
	Incomplete string `json:"incomplete,omitempty"`
	Err        string `json:"error,omitempty"`
	// Round is which round a row of Report.RoundResults ran in (1-based;
	// 0 in a run of one round).
	Round int `json:"round,omitempty"`
	// RoundsItemsPerSec is, in a run of several rounds, each round's
	// items/s in the order they ran (failed rounds 0); the row's own
	// figures are the medians over the rounds that completed (rounds.go).
	RoundsItemsPerSec []float64 `json:"rounds_items_per_s,omitempty"`
	// RoundsFailed counts the rounds that failed or did not complete.
	RoundsFailed int `json:"rounds_failed,omitempty"`
	// notApplicable: the system cannot run this row (the roundtrip row
	// for a system without a call that does no queue work); Run leaves
	// the row out of the report.
	notApplicable bool
}

// Skipped is a system that did not run, and why.
type Skipped struct {
	System string `json:"system"`
	Reason string `json:"reason"`
}

// Report is the outcome of Run.
type Report struct {
	Started time.Time `json:"started"`
	Machine Machine   `json:"machine"`
	Config  ConfigDoc `json:"config"`
	Results []Result  `json:"results"`
	// RoundResults holds every round's row in a run of several rounds
	// (Config.Rounds); Results then holds their medians.
	RoundResults []Result  `json:"round_results,omitempty"`
	Skipped      []Skipped `json:"skipped,omitempty"`
	Ratios       []Ratio   `json:"ratios,omitempty"`
	Goals        []Goal    `json:"goals,omitempty"`
	Interrupted  bool      `json:"interrupted,omitempty"`
	// LoadAvg is /proc/loadavg's 1-minute average at the start and end
	// of the run: on a shared machine, how busy it was besides us.
	LoadAvg [2]float64 `json:"loadavg_start_end"`
}

// loadAvg1 returns the 1-minute load average, or 0 when unknown.
func loadAvg1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0
	}
	return v
}

// Machine describes where the run happened.
type Machine struct {
	CPUs      int    `json:"cpus"`
	GoVersion string `json:"go"`
	OS        string `json:"os"`
	Kernel    string `json:"kernel"`
	CPUModel  string `json:"cpu_model"`
	// CPUIdle is the kernel's cpuidle driver, and on a KVM guest with
	// the haltpoll driver how long an idle vCPU polls before it halts:
	// waking an idle vCPU that halted is slow, and on the project's
	// machine that setting moved the durable rows by 10-60 %
	// (docs/BENCHMARKS.md, "The VM's idle polling, measured").
	CPUIdle string `json:"cpu_idle,omitempty"`
}

// ConfigDoc is the part of Config that shapes numbers, for the record.
type ConfigDoc struct {
	Workloads     []string `json:"workloads"`
	Systems       []string `json:"systems"`
	Duration      string   `json:"duration"`
	ChurnDuration string   `json:"churn_duration"`
	Intervals     int      `json:"intervals"`
	Producers     int      `json:"producers"`
	Consumers     int      `json:"consumers"`
	Batch         int      `json:"batch"`
	AckPerItem    bool     `json:"ack_per_item"`
	AckPoll       bool     `json:"ack_poll,omitempty"`
	PayloadSize   int      `json:"payload_bytes"`
	Rate          int      `json:"rate"`
	MaxBacklog    int      `json:"max_backlog"`
	DrainItems    int      `json:"drain_items"`
	StormItems    int      `json:"storm_items"`
	StormLease    string   `json:"storm_lease"`
	Queues        int      `json:"queues"`
	ZipfS         float64  `json:"zipf_s"`
	Seed          int64    `json:"seed"`
	Rounds        int      `json:"rounds,omitempty"`
}

func machine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.CPUIdle = cpuIdle(os.ReadFile)
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

// cpuIdle describes the machine's cpuidle driver ("haltpoll, polls 0 ns
// before halting"); empty when the kernel does not say.
func cpuIdle(readFile func(string) ([]byte, error)) string {
	b, err := readFile("/sys/devices/system/cpu/cpuidle/current_driver")
	if err != nil {
		return ""
	}
	d := strings.TrimSpace(string(b))
	if d == "" || d == "none" {
		return ""
	}
	if d == "haltpoll" {
		if b, err := readFile("/sys/module/haltpoll/parameters/guest_halt_poll_ns"); err == nil {
			return fmt.Sprintf("%s, polls %s ns before halting", d, strings.TrimSpace(string(b)))
		}
	}
	return d
}

// variant is one row shape of a workload.
type variant struct {
	workload string
	row      string
	shape    string
	queues   []string
	lease    time.Duration
	planned  time.Duration // expected length, for the timeout
	run      func(ctx context.Context, e *env, in target.Instance, r *Result) error
}

// oneQueue is the queue picker of single-queue workloads.
func oneQueue(name string) func(*rand.Rand) string {
	return func(*rand.Rand) string { return name }
}

func variants(c Config, workload string) []variant {
	q := []string{"bench"}
	pick := oneQueue("bench")
	flow := func(row, shape string, s flowSpec, planned time.Duration, keepSamples bool) variant {
		s.row = row
		return variant{workload: workload, row: row, shape: shape, queues: q, lease: defaultLease, planned: planned,
			run: func(ctx context.Context, e *env, in target.Instance, r *Result) error {
				out, err := runFlow(ctx, e, in, s)
				if err != nil {
					return err
				}
				r.Interrupted = out.interrupted
				r.Seconds = out.window.Seconds()
				r.Items = out.acked
				r.AcksLost = out.acksLost
				if s.consumers == 0 {
					r.Items = out.enqueued
				}
				r.E2E = summarize(out.e2e)
				r.Enqueue = summarize(out.enq)
				r.Extra = map[string]float64{"enqueued": float64(out.enqueued)}
				if s.consumers > 0 && r.Seconds > 0 {
					r.Extra["enqueue_items_per_s"] = float64(out.enqueued) / r.Seconds
				}
				if out.polls > 0 {
					// How full the consumers' polls came back: with a
					// batch of N, the calls per item a system's
					// consumers made (N means every poll was full).
					r.Extra["items_per_poll"] = float64(out.polled) / float64(out.polls)
				}
				if keepSamples {
					r.Intervals = intervals(out.samples, c.Intervals)
					if n := len(r.Intervals); n >= 2 && r.Intervals[0] > 0 {
						r.Extra["last_first_ratio"] = r.Intervals[n-1] / r.Intervals[0]
					}
				}
				return nil
			}}
	}
	e2e := flowSpec{producers: c.Producers, consumers: c.Consumers, enqBatch: c.Batch, pollMax: c.Batch,
		ackPerItem: c.AckPerItem, ackPoll: c.AckPoll, duration: c.Duration, pickQueue: pick, pollQueue: pick, pollWait: consumerPollWait,
		maxBacklog: int64(c.MaxBacklog)}
	ack := "ack per batch"
	if c.AckPerItem {
		ack = "ack per item"
	} else if c.AckPoll {
		ack = "ack with the next poll"
	}
	switch workload {
	case WorkloadRoundTrip:
		return []variant{{workload: workload, row: "roundtrip", queues: q, lease: defaultLease, planned: c.Duration,
			shape: "1 client, calls without queue work (nodeInfo, PING), one at a time",
			run: func(ctx context.Context, e *env, in target.Instance, r *Result) error {
				out, err := runRoundTrip(ctx, e, in, c.Duration)
				if err != nil {
					return err
				}
				r.Interrupted = out.interrupted
				r.Seconds = out.window.Seconds()
				r.Items = out.calls
				if l := summarize(out.lat); l != nil {
					r.Extra = map[string]float64{"rtt_p50_us": l.P50, "rtt_p99_us": l.P99}
				}
				return nil
			}}}
	case WorkloadProduce:
		p := flowSpec{producers: c.Producers, duration: c.Duration, pickQueue: pick}
		p1, p100 := p, p
		p1.enqBatch, p100.enqBatch = 1, 100
		return []variant{
			flow("produce-b1", fmt.Sprintf("%dP, batch 1", c.Producers), p1, c.Duration, false),
			flow("produce-b100", fmt.Sprintf("%dP, batch 100", c.Producers), p100, c.Duration, false),
		}
	case WorkloadE2E:
		return []variant{flow("e2e", fmt.Sprintf("%dP+%dC, batch %d, %s", c.Producers, c.Consumers, c.Batch, ack), e2e, c.Duration, false)}
	case WorkloadLatency:
		rate := e2e
		rate.enqBatch, rate.rate = 1, float64(c.Rate)
		max := e2e
		max.enqBatch, max.producers = 1, 1
		return []variant{
			flow("latency-rate", fmt.Sprintf("%dP at %d items/s, batch 1; %dC", c.Producers, c.Rate, c.Consumers), rate, c.Duration, false),
			flow("latency-max", fmt.Sprintf("1P flat out, batch 1; %dC", c.Consumers), max, c.Duration, false),
		}
	case WorkloadChurn:
		ch := e2e
		ch.duration = c.ChurnDuration
		return []variant{flow("churn", fmt.Sprintf("%dP+%dC, batch %d, %v in %d intervals", c.Producers, c.Consumers, c.Batch, c.ChurnDuration, c.Intervals), ch, c.ChurnDuration, true)}
	case WorkloadManyQueues:
		names := make([]string, c.Queues)
		for i := range names {
			names[i] = fmt.Sprintf("q%04d", i)
		}
		// The cumulative weights are computed once per row and only read
		// by the worker goroutines.
		cdf := zipfCDF(c.ZipfS, c.Queues)
		picker := func(r *rand.Rand) string { return names[zipfIndex(r, cdf)] }
		mq := e2e
		mq.pickQueue, mq.pollQueue = picker, picker
		// Consumers poll without waiting and move on to another queue;
		// after 64 empty polls in a row they pause briefly instead of
		// spinning on cold queues.
		mq.pollWait, mq.idleBackof = 0, time.Millisecond
		v := flow("manyqueues", fmt.Sprintf("%d queues, zipf s=%.2f, %dP+%dC, batch %d", c.Queues, c.ZipfS, c.Producers, c.Consumers, c.Batch), mq, c.Duration, false)
		v.queues = names
		return []variant{v}
	case WorkloadDrain:
		return []variant{{workload: workload, row: "drain", queues: q, lease: defaultLease,
			shape:   fmt.Sprintf("enqueue %d (%dP, batch %d), then drain with %dC", c.DrainItems, c.Producers, phaseBatch, c.Consumers),
			planned: 0,
			run: func(ctx context.Context, e *env, in target.Instance, r *Result) error {
				ctx, stop := untilDrained(ctx, e.drain)
				defer stop()
				out, err := runDrain(ctx, e, in, c.Producers, c.Consumers, c.DrainItems, "bench")
				if err != nil && drainRequested(e.drain) {
					r.Interrupted = true
					return nil
				}
				if err != nil {
					return err
				}
				r.Items = int64(c.DrainItems)
				r.AcksLost = out.acksLost
				r.Seconds = out.drainTook.Seconds()
				r.Enqueue = summarize(out.enq)
				r.E2E = summarize(out.e2e)
				r.Extra = map[string]float64{
					"enqueue_s":           out.enqueueTook.Seconds(),
					"enqueue_items_per_s": float64(c.DrainItems) / out.enqueueTook.Seconds(),
				}
				return nil
			}}}
	case WorkloadStorm:
		return []variant{{workload: workload, row: "storm", queues: q, lease: c.StormLease,
			shape: fmt.Sprintf("%d items leased by %dC that hang, lease %v; %dC redeliver", c.StormItems, c.Consumers, c.StormLease, c.Consumers),
			// The rescuers may take up to stormWait after the last expiry
			// before the row is reported incomplete: that is part of the
			// plan, or the row's deadline cuts the storm short first and a
			// slow redelivery reads as a failure.
			planned: c.StormLease + stormWait,
			run: func(ctx context.Context, e *env, in target.Instance, r *Result) error {
				ctx, stop := untilDrained(ctx, e.drain)
				defer stop()
				out, err := runStorm(ctx, e, in, c.Producers, c.Consumers, c.StormItems, "bench", c.StormLease)
				if err != nil && drainRequested(e.drain) {
					r.Interrupted = true
					return nil
				}
				var inc *incompleteError
				if errors.As(err, &inc) && ctx.Err() == nil {
					// The system did not redeliver everything within
					// stormWait: report how far it got; such a row is shown but
					// never compared.
					r.Incomplete = fmt.Sprintf("%d of %d items redelivered within %v of the last expiry", inc.got, inc.want, stormWait)
					r.Items = int64(inc.got)
					r.AcksLost = out.acksLost
					r.Seconds = e.clk.Since(out.firstExpiry).Seconds()
					return nil
				}
				if err != nil {
					return err
				}
				r.Items = int64(c.StormItems)
				r.AcksLost = out.acksLost
				// Seconds: from the first lease that could expire to the last
				// item acked by the rescuers.
				r.Seconds = out.done.Sub(out.firstExpiry).Seconds()
				r.E2E = summarize(out.e2e)
				r.Extra = map[string]float64{
					"after_last_expiry_s": out.done.Sub(out.lastExpiry).Seconds(),
					"leasing_s":           out.lastExpiry.Sub(out.firstExpiry).Seconds(),
				}
				return nil
			}}}
	}
	return nil
}

// zipfIndex draws an index in [0, len(cdf)) with P(k) ~ 1/(k+1)^s by
// inverting the cumulative weights cdf (from zipfCDF).
func zipfIndex(r *rand.Rand, cdf []float64) int {
	u := r.Float64() * cdf[len(cdf)-1]
	lo, hi := 0, len(cdf)-1
	for lo < hi {
		m := (lo + hi) / 2
		if cdf[m] < u {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// intervals splits per-sample counts into k equal intervals and returns
// items/s for each.
func intervals(samples []int64, k int) []float64 {
	if len(samples) < k || k < 1 {
		return nil
	}
	per := len(samples) / k
	out := make([]float64, k)
	for i := 0; i < k; i++ {
		var sum int64
		for _, v := range samples[i*per : (i+1)*per] {
			sum += v
		}
		out[i] = float64(sum) / (float64(per) * sampleEvery.Seconds())
	}
	return out
}

// Run executes the configured workloads against the selected systems, one
// fresh instance per row, and returns the report. An error means the run
// could not start (bad config, no system); a failing row is recorded in
// its Result and the run goes on.
func Run(ctx context.Context, c Config, systems []target.System) (*Report, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	wls := c.Workloads
	if len(wls) == 0 {
		wls = AllWorkloads()
	}
	rep := &Report{Started: c.Clock.Now().UTC(), Machine: machine(), Config: configDoc(c, wls)}
	rep.LoadAvg[0] = loadAvg1()
	defer func() { rep.LoadAvg[1] = loadAvg1() }()
	var run []target.System
	for _, s := range selectSystems(systems, c.Systems) {
		if err := s.Available(); err != nil {
			rep.Skipped = append(rep.Skipped, Skipped{System: s.Name(), Reason: err.Error()})
			continue
		}
		run = append(run, s)
		rep.Config.Systems = append(rep.Config.Systems, s.Name())
	}
	if len(run) == 0 {
		return rep, fmt.Errorf("bench: no system to run (selected %v; skipped %v)", c.Systems, rep.Skipped)
	}
	logf := func(format string, a ...any) { progressf(c, format, a...) }
	logf("leaseq bench: load average %.2f; seed=%d workloads=%s systems=%s\n", rep.LoadAvg[0], c.Seed, strings.Join(wls, ","), strings.Join(rep.Config.Systems, ","))
	// Rows of a harness that was killed left their data behind.
	n, size, err := removeStaleDataDirs("")
	if n > 0 {
		logf("removed %d data directories (%.1f MB) left by harness processes that no longer run\n", n, float64(size)/1e6)
	}
	if err != nil {
		logf("could not remove every data directory left by harness processes that no longer run: %v\n", err)
	}
	logf("config: P=%d C=%d batch=%d ack_per_item=%v ack_poll=%v payload=%dB duration=%v churn=%v/%d rate=%d/s drain=%d storm=%d lease=%v queues=%d zipf=%.2f timeout=+%v\n",
		c.Producers, c.Consumers, c.Batch, c.AckPerItem, c.AckPoll, c.PayloadSize, c.Duration, c.ChurnDuration, c.Intervals, c.Rate,
		c.DrainItems, c.StormItems, c.StormLease, c.Queues, c.ZipfS, c.Timeout)
	for _, s := range rep.Skipped {
		logf("skipped %s: %s\n", s.System, s.Reason)
	}
	drain := c.Drain
	if drain == nil {
		drain = make(chan struct{})
	}
	rounds := max(c.Rounds, 1)
	var all []Result
	for _, w := range wls {
		for _, v := range variants(c, w) {
			// Every system runs the row once per round before the next
			// round starts, so a machine that speeds up or slows down
			// over the run touches every system alike; each round starts
			// one system further on, so that no system always runs right
			// after the same one (whose dirty pages or leftover memory it
			// would always inherit).
			for round := 1; round <= rounds; round++ {
				for _, s := range rotate(run, round-1) {
					if rep.Interrupted || drainRequested(drain) || ctx.Err() != nil {
						rep.Interrupted = true
						break
					}
					r := runRow(ctx, c, drain, v, s)
					if r.notApplicable {
						if round == 1 {
							logf("%-14s %-22s left out: %s\n", r.Row, r.System, errNoRoundTrip)
						}
						continue
					}
					if r.Interrupted {
						rep.Interrupted = true
					}
					if rounds > 1 {
						r.Round = round
						logf("round %d/%d: %s\n", round, rounds, rowLine(r))
					} else {
						logf("%s\n", rowLine(r))
					}
					all = append(all, r)
				}
			}
		}
	}
	if len(all) == 0 && !rep.Interrupted {
		return rep, fmt.Errorf("bench: no row ran: every system selected (%s) sits out every workload selected (%s)",
			strings.Join(rep.Config.Systems, ","), strings.Join(wls, ","))
	}
	rep.Results = all
	if rounds > 1 {
		rep.RoundResults = all
		rep.Results = medianRows(all)
	}
	rep.Ratios, rep.Goals = compare(rep.Results)
	if rounds > 1 {
		roundGoals(rep.Goals, all)
	}
	return rep, nil
}

func configDoc(c Config, wls []string) ConfigDoc {
	return ConfigDoc{Workloads: wls, Duration: c.Duration.String(), ChurnDuration: c.ChurnDuration.String(),
		Intervals: c.Intervals, Producers: c.Producers, Consumers: c.Consumers, Batch: c.Batch, AckPerItem: c.AckPerItem, AckPoll: c.AckPoll,
		PayloadSize: c.PayloadSize, Rate: c.Rate, MaxBacklog: c.MaxBacklog, DrainItems: c.DrainItems, StormItems: c.StormItems,
		StormLease: c.StormLease.String(), Queues: c.Queues, ZipfS: c.ZipfS, Seed: c.Seed, Rounds: c.Rounds}
}

// selectSystems keeps the systems named (by name, name prefix, family, or
// the groups "peers" and "all"). A system that runs only when named (the
// loopback and HTTP diagnostics) is kept only by its name or a prefix of
// it such as "leaseq-http", never by its family or a group: `-systems
// leaseq` means the leaseq rows the goals compare.
func selectSystems(all []target.System, names []string) []target.System {
	var out []target.System
	for _, s := range all {
		o, isOpt := s.(interface{ OnlyWhenNamed() bool })
		onlyNamed := isOpt && o.OnlyWhenNamed()
		if len(names) == 0 {
			if !onlyNamed {
				out = append(out, s)
			}
			continue
		}
		for _, n := range names {
			byName := n == s.Name() || strings.HasPrefix(s.Name(), n+"-")
			byGroup := n == "all" || n == s.Family() || (n == "peers" && s.Family() != "leaseq")
			keep := byName || byGroup
			if onlyNamed {
				// "leaseq" is a family as well as a prefix of the name.
				keep = byName && n != s.Family()
			}
			if keep {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// runRow starts a fresh instance of s, runs one variant, and tears down.
func runRow(ctx context.Context, c Config, drain <-chan struct{}, v variant, s target.System) (r Result) {
	d := s.Durability()
	r = Result{Row: v.row, Workload: v.workload, Shape: v.shape, System: s.Name(), Family: s.Family(), Class: string(d.Class), Durability: d.Mode}
	ctx, cancel := c.Clock.WithTimeout(ctx, v.planned+c.Timeout)
	defer cancel()
	dir, err := newDataDir("", s.Name(), c.KeepData)
	if err != nil {
		r.Err = err.Error()
		return r
	}
	defer func() {
		if c.KeepData {
			return
		}
		if err := os.RemoveAll(dir); err != nil && r.Err == "" {
			r.Err = fmt.Sprintf("cleanup: %v", err)
		}
	}()
	in, err := s.Start(ctx, target.StartOptions{Dir: dir, Queues: v.queues, Lease: v.lease, Clock: c.Clock, Trace: c.Trace != ""})
	if err != nil {
		r.Err = fmt.Sprintf("start: %v", err)
		return r
	}
	pid, self := in.PID(), os.Getpid()
	r.InProcess = pid == self
	// An instance's own counters are read outside the CPU window: reading
	// them may cost the server CPU (a scrape of its metrics).
	cs, hasCounters := in.(target.Counters)
	var c0 map[string]float64
	if hasCounters {
		c0 = cs.Counters()
	}
	if r.InProcess {
		// The harness's heap holds what earlier rows left (a memstore's
		// items, say) until the collector hands it back: without this a
		// row's peak depended on the rows before it.
		runtime.GC()
		debug.FreeOSMemory()
	}
	_ = procx.ResetPeak(pid) // best effort: without it the peak covers the process's life
	// The CPU over the whole row, the server's and (for a server of its
	// own) the harness's, as the client's. A timed flow also reads it at
	// the edges of the window its items are counted in (win), so that
	// connecting, and enqueues still unacked or calls still running when
	// the window ends, are not charged to the items; other workloads are
	// timed whole.
	var whole, win cpuWindow
	whole.mark(false, pid, self, r.InProcess)
	e := &env{clk: c.Clock, base: c.Clock.Now(), progress: c.Progress, label: s.Name() + " " + v.row,
		drain: drain, seed: c.Seed, payload: c.PayloadSize}
	e.window = func(end bool) { win.mark(end, pid, self, r.InProcess) }
	t0, terr := procx.ReadCPUTimes()
	traced := startNodeTrace(ctx, c, v, s, in) // nodetrace.go
	runErr := v.run(ctx, e, in, &r)
	if t1, err := procx.ReadCPUTimes(); terr == nil && err == nil {
		r.Steal = procx.StealShare(t0, t1)
	}
	whole.mark(true, pid, self, r.InProcess)
	if cpu, client, ok := whole.seconds(); ok {
		r.CPUSeconds, r.ClientCPUSeconds = cpu, client
		r.PeakRSS = whole.u1.PeakRSS
	}
	if cpu, client, ok := win.seconds(); ok {
		r.CPUSeconds, r.ClientCPUSeconds = cpu, client
	}
	if hasCounters {
		addCounters(&r, c0, cs.Counters())
	}
	traced(&r)
	closeErr := in.Close()
	if errors.Is(runErr, errNoRoundTrip) && closeErr == nil {
		r.notApplicable = true
		return r
	}
	if err := errors.Join(runErr, closeErr); err != nil {
		r.Err = err.Error()
	}
	if r.Seconds > 0 {
		r.ItemsPerSec = float64(r.Items) / r.Seconds
	}
	if r.Items > 0 {
		r.CPUPerItem = r.CPUSeconds * 1e6 / float64(r.Items)
		r.ClientCPUPerItem = r.ClientCPUSeconds * 1e6 / float64(r.Items)
	}
	addFsyncFigures(&r)
	return r
}

// addFsyncFigures derives two notes from a row's WAL counters: the items
// per fsync and an fsync's mean length in µs. Where each caller waits
// for the fsync in flight and then for its own, the callers fix the
// items per fsync (32 in e2e), so a durable row's items/s follows the
// length of its fsyncs, and the two notes say what they allowed
// (docs/BENCHMARKS.md, "Two ceilings measured, and five tries that did
// not pay").
func addFsyncFigures(r *Result) {
	n := r.Extra["wal_fsyncs"]
	if n <= 0 || r.Items <= 0 {
		return
	}
	r.Extra["items_per_fsync"] = float64(r.Items) / n
	if s := r.Extra["wal_fsync_s"]; s > 0 {
		r.Extra["fsync_us"] = s * 1e6 / n
	}
}

// addCounters puts the increase of each of an instance's counters over a
// row into the row's Extra; counters that did not move are left out, so
// a row's notes name only what happened, and so are all of them when
// either reading failed (nil).
func addCounters(r *Result, before, after map[string]float64) {
	if before == nil || after == nil {
		return
	}
	for k, v := range after {
		b, ok := before[k]
		if !ok {
			continue
		}
		d := v - b
		if d <= 0 {
			if r.still == nil {
				r.still = map[string]bool{}
			}
			r.still[k] = true
			continue
		}
		if r.Extra == nil {
			r.Extra = map[string]float64{}
		}
		r.Extra[k] = d
	}
}

// rotate returns ss starting at its element k mod len(ss), wrapping.
func rotate[T any](ss []T, k int) []T {
	if len(ss) == 0 {
		return ss
	}
	k %= len(ss)
	return append(append(make([]T, 0, len(ss)), ss[k:]...), ss[:k]...)
}

// cpuWindow holds the CPU readings taken at the edges of a row or of a
// timed flow's window (env.window): the server's (pid) and, for a server
// of its own, the harness's.
type cpuWindow struct {
	begun, ended, bad bool
	u0, u1, h0, h1    procx.Usage
}

// mark reads the CPU at the window's beginning or end.
func (w *cpuWindow) mark(end bool, pid, self int, inProcess bool) {
	u, err := procx.ReadUsage(pid)
	var h procx.Usage
	if err == nil && !inProcess {
		h, err = procx.ReadUsage(self)
	}
	switch {
	case err != nil:
		w.bad = true
	case end:
		w.u1, w.h1, w.ended = u, h, true
	default:
		w.u0, w.h0, w.begun = u, h, true
	}
}

// seconds returns the server's and the harness's CPU over the window,
// ok false unless both edges were read.
func (w *cpuWindow) seconds() (server, client float64, ok bool) {
	if !w.begun || !w.ended || w.bad {
		return 0, 0, false
	}
	return (w.u1.CPU - w.u0.CPU).Seconds(), (w.h1.CPU - w.h0.CPU).Seconds(), true
}
