package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"runtime/trace"
	"sync"
	"syscall"

	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/bench/leaseqt"
	"github.com/leaseq/leaseq/bench/peers"
	"github.com/leaseq/leaseq/bench/target"
	"github.com/leaseq/leaseq/bench/tracestat"
)

// Systems returns every system the harness knows, leaseq's first, in the
// order rows are run and drawn. Unavailable ones are skipped by Run. bin
// locates (or builds) the leaseq binary for the RPC systems; the caller
// closes it after the run.
func Systems(bin *leaseqt.Binary) []target.System {
	return append(leaseqSystems(bin),
		peers.Redis{Fsync: "always"}, peers.Redis{Fsync: "everysec"},
		peers.Beanstalkd{Fsync: true}, peers.Beanstalkd{Fsync: false},
		peers.NATS{SyncAlways: true}, peers.NATS{SyncAlways: false},
	)
}

// Main is `leaseq bench [WORKLOAD...] [flags]`: it parses args, runs the
// workloads, prints progress to stderr and the summary (and -gobench
// lines) to stdout, and writes results.json, results.md and chart.svg to
// -out. The first SIGINT (or SIGTERM) drains: producers stop, in-flight
// items are acked, the summary is printed and remaining rows skipped; a
// second one aborts through ctx. clk is the process's clock (main.go's
// clock.New()). It returns an error when the run could not start or any
// row failed.
func Main(ctx context.Context, clk clock.Clock, args []string, stdout, stderr io.Writer) error {
	cfg, err := ParseFlags(args, stderr)
	if err != nil {
		return err
	}
	if cfg.ReadTrace != "" {
		return printTrace(stdout, cfg.ReadTrace)
	}
	cfg.Clock = clk
	cfg.Progress = stderr
	ctx, abort := context.WithCancel(ctx)
	defer abort()
	drain := make(chan struct{})
	cfg.Drain = drain
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	sigDone := make(chan struct{})
	defer close(sigDone)
	go func() {
		n := 0
		for {
			select {
			case <-sigDone:
				return
			case <-sigs:
				n++
				if n == 1 {
					fmt.Fprintln(stderr, "bench: interrupt: draining (interrupt again to abort)")
					close(drain)
					continue
				}
				fmt.Fprintln(stderr, "bench: interrupt: aborting")
				abort()
				return
			}
		}
	}()

	if cfg.CPUProfile != "" {
		f, err := os.Create(cfg.CPUProfile)
		if err != nil {
			return fmt.Errorf("bench: cpu profile: %w", err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			f.Close()
			return fmt.Errorf("bench: cpu profile: %w", err)
		}
		defer func() {
			pprof.StopCPUProfile()
			if cerr := f.Close(); cerr != nil {
				fmt.Fprintf(stderr, "bench: cpu profile: %v\n", cerr)
			}
		}()
	}
	var stopTrace func() error
	if cfg.Trace != "" {
		if stopTrace, err = startTrace(cfg.Trace); err != nil {
			return err
		}
		defer func() {
			// The first stop, on an early return; else the one below
			// again, whose error only this reports.
			if err := stopTrace(); err != nil {
				fmt.Fprintf(stderr, "bench: %v\n", err)
			}
		}()
	}
	bin := &leaseqt.Binary{Path: cfg.LeaseqBin}
	rep, err := Run(ctx, cfg, Systems(bin))
	if cerr := bin.Close(); cerr != nil {
		fmt.Fprintf(stderr, "bench: %v\n", cerr)
	}
	if err != nil {
		return err
	}
	var traced *tracestat.Summary
	if stopTrace != nil {
		if stopTrace() == nil {
			var terr error
			if traced, terr = readTrace(cfg.Trace); terr != nil {
				fmt.Fprintf(stderr, "bench: %v\n", terr)
			}
		}
	}
	fmt.Fprintln(stdout)
	if err := WriteTable(stdout, rep); err != nil {
		return fmt.Errorf("bench: summary: %w", err)
	}
	if traced != nil {
		fmt.Fprintf(stdout, "\n%s: this process only (in-process systems; for a node's pipeline, -read-trace a trace of the node)\n", cfg.Trace)
		if err := traced.Write(stdout); err != nil {
			return fmt.Errorf("bench: summary: %w", err)
		}
	}
	if cfg.GoBench {
		fmt.Fprintln(stdout)
		if err := WriteGoBench(stdout, rep); err != nil {
			return fmt.Errorf("bench: gobench: %w", err)
		}
	}
	if cfg.OutDir != "" {
		paths, err := WriteFiles(cfg.OutDir, rep)
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "bench: wrote %v\n", paths)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("aborted by a second interrupt; partial results above: %w", ctx.Err())
	}
	var failed []error
	for _, r := range rep.Results {
		if r.Err != "" {
			failed = append(failed, fmt.Errorf("%s/%s: %s", r.Row, r.System, r.Err))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d rows failed: %w", len(failed), errors.Join(failed...))
	}
	return nil
}

// startTrace starts a Go execution trace of this process into a new file
// at path; stop stops it and closes the file (the first call; later ones
// return its error again).
func startTrace(path string) (stop func() error, err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("bench: trace: %w", err)
	}
	if err := trace.Start(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("bench: trace: %w", err)
	}
	return sync.OnceValue(func() error {
		trace.Stop()
		if err := f.Close(); err != nil {
			return fmt.Errorf("bench: trace: %w", err)
		}
		return nil
	}), nil
}

// readTrace summarizes the execution trace in the file at path.
func readTrace(path string) (*tracestat.Summary, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("bench: trace: %w", err)
	}
	defer f.Close()
	sum, err := tracestat.Read(f)
	if err != nil {
		return nil, fmt.Errorf("bench: trace %s: %w", path, err)
	}
	return &sum, nil
}

// printTrace is -read-trace: the summary of the trace at path, on w.
func printTrace(w io.Writer, path string) error {
	sum, err := readTrace(path)
	if err != nil {
		return err
	}
	return sum.Write(w)
}
