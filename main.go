// Command leaseq is a durable, at-least-once work-queue node and its CLI.
//
// main.go is wiring only: it parses flags and LEASEQ_* environment
// variables, builds the slog logger, creates the one real clock
// (clock.New()), opens the storage backend, starts the sweeper, waits for
// signals, and shuts down in reverse order. It is the only place that
// chooses concrete implementations; it holds no queue logic.
//
// Subcommands live in the commands table. Each one defines its flags on its
// own flag.FlagSet and returns the function that runs it, so a new command
// (enqueue, poll, ...) or a new serve flag (--listen) is one table entry or
// one line in its setup function.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/storage/rocksstore"
	"github.com/leaseq/leaseq/sweeper"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // the command ran and failed (or check found violations)
	exitUsage   = 2 // bad command line or environment
)

// envPrefix prefixes the environment variable that sets each flag:
// --data is LEASEQ_DATA, --log-level is LEASEQ_LOG_LEVEL.
const envPrefix = "LEASEQ_"

func main() {
	os.Exit(run(context.Background(), os.Args[1:], newEnv()))
}

// env is what a command may touch of the outside world. Tests replace it.
type env struct {
	stdout, stderr io.Writer
	lookupEnv      func(string) (string, bool)
	// notifySignals delivers SIGINT/SIGTERM to c until the returned stop
	// func is called.
	notifySignals func(c chan<- os.Signal) (stop func())
	// exit ends the process at once (second signal during shutdown).
	exit func(code int)
}

func newEnv() *env {
	return &env{
		stdout:    os.Stdout,
		stderr:    os.Stderr,
		lookupEnv: os.LookupEnv,
		notifySignals: func(c chan<- os.Signal) func() {
			signal.Notify(c, os.Interrupt, syscall.SIGTERM)
			return func() { signal.Stop(c) }
		},
		exit: os.Exit,
	}
}

// command is one subcommand of the leaseq binary.
type command struct {
	name    string
	args    string // positional synopsis for help, e.g. "QUEUE [PAYLOAD|-]"
	summary string // one line for the command list
	help    string // paragraph(s) for `leaseq help NAME`
	// setup defines the command's flags on fs and returns the function
	// that runs it with the positional arguments. Errors it returns are
	// printed as one line; wrap them in usageError for a bad invocation.
	setup func(fs *flag.FlagSet, e *env) func(ctx context.Context, args []string) error
}

// commands is the subcommand table, in the order help lists them.
var commands = []*command{serveCommand, checkCommand}

// usageError marks an error in how the command was invoked (exit 2).
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

// exitError carries a specific exit code with an already-reported failure.
type exitError struct {
	code int
	err  error
}

func (x exitError) Error() string { return x.err.Error() }
func (x exitError) Unwrap() error { return x.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// run executes the command line args (without the program name) and
// returns the exit code.
func run(ctx context.Context, args []string, e *env) int {
	if len(args) == 0 {
		printUsage(e.stderr)
		return exitUsage
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 && name == "help" {
			cmd := lookupCommand(args[1])
			if cmd == nil {
				fmt.Fprintf(e.stderr, "leaseq help: unknown command %q (run 'leaseq help')\n", args[1])
				return exitUsage
			}
			fs, _ := newFlagSet(cmd, e)
			printCommandUsage(e.stdout, cmd, fs)
			return exitOK
		}
		printUsage(e.stdout)
		return exitOK
	}
	cmd := lookupCommand(name)
	if cmd == nil {
		fmt.Fprintf(e.stderr, "leaseq: unknown command %q (run 'leaseq help')\n", name)
		return exitUsage
	}
	fs, runCmd := newFlagSet(cmd, e)
	pos, err := parseArgs(fs, args[1:], e.lookupEnv)
	if errors.Is(err, flag.ErrHelp) {
		printCommandUsage(e.stdout, cmd, fs)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "leaseq %s: %v (run 'leaseq help %s')\n", cmd.name, err, cmd.name)
		return exitUsage
	}
	err = runCmd(ctx, pos)
	var ue usageError
	var xe exitError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(e.stderr, "leaseq %s: %v (run 'leaseq help %s')\n", cmd.name, err, cmd.name)
		return exitUsage
	case errors.As(err, &xe):
		fmt.Fprintf(e.stderr, "leaseq %s: %v\n", cmd.name, err)
		return xe.code
	default:
		fmt.Fprintf(e.stderr, "leaseq %s: %v\n", cmd.name, err)
		return exitFailure
	}
}

func lookupCommand(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

func newFlagSet(cmd *command, e *env) (*flag.FlagSet, func(context.Context, []string) error) {
	fs := flag.NewFlagSet("leaseq "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // run prints errors and help itself
	return fs, cmd.setup(fs, e)
}

// parseArgs parses args with fs, allowing flags before, between and after
// positional arguments (the flag package alone stops at the first
// positional), then fills every flag not given on the command line from its
// LEASEQ_* environment variable. It returns the positional arguments. "--"
// ends the flags; "-" alone is a positional (stdin).
func parseArgs(fs *flag.FlagSet, args []string, lookupEnv func(string) (string, bool)) ([]string, error) {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			pos = append(pos, args[i+1:]...)
			break
		}
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, a)
			continue
		}
		flags = append(flags, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue // fs.Parse reports the unknown flag
		}
		if bf, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && bf.IsBoolFlag() {
			continue
		}
		if i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	if err := fs.Parse(flags); err != nil {
		return nil, err
	}

	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || envErr != nil {
			return
		}
		name := envName(f.Name)
		v, ok := lookupEnv(name)
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			envErr = fmt.Errorf("environment %s=%q: %v", name, v, err)
		}
	})
	return pos, envErr
}

// envName is the environment variable for a flag name.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, `leaseq is a durable, at-least-once work-queue node.

Usage:
  leaseq <command> [flags] [arguments]

Commands:
`)
	for _, c := range commands {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, "  %-8s %s\n", "help", "show help for a command: leaseq help <command>")
	fmt.Fprint(w, `
Flags may stand before or after the arguments. Every flag can also be set
from the environment as LEASEQ_<FLAG>, upper case with dashes as
underscores (--data is LEASEQ_DATA, --log-level is LEASEQ_LOG_LEVEL); a
flag given on the command line wins over the environment.
`)
}

func printCommandUsage(w io.Writer, cmd *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage:\n  leaseq %s [flags]", cmd.name)
	if cmd.args != "" {
		fmt.Fprintf(w, " %s", cmd.args)
	}
	fmt.Fprintf(w, "\n\n%s\n", strings.TrimSpace(cmd.help))
	var flags []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) { flags = append(flags, f) })
	if len(flags) == 0 {
		return
	}
	sort.Slice(flags, func(i, j int) bool { return flags[i].Name < flags[j].Name })
	fmt.Fprint(w, "\nFlags (each also read from the environment variable shown):\n")
	for _, f := range flags {
		typ, usage := flag.UnquoteUsage(f)
		head := "--" + f.Name
		if typ != "" {
			head += " " + typ
		}
		fmt.Fprintf(w, "  %s\n      %s", head, usage)
		if f.DefValue != "" && f.DefValue != "false" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintf(w, " [%s]\n", envName(f.Name))
	}
}

// choice is a flag.Value that parses its text with parse, so a bad value
// (from a flag or the environment) fails at parse time with a clear error.
type choice[T any] struct {
	text  string
	val   T
	parse func(string) (T, error)
}

func newChoice[T any](def string, parse func(string) (T, error)) *choice[T] {
	v, err := parse(def)
	if err != nil {
		panic(fmt.Sprintf("bad default %q: %v", def, err)) // programming error in a setup func
	}
	return &choice[T]{text: def, val: v, parse: parse}
}

func (c *choice[T]) String() string {
	if c == nil {
		return ""
	}
	return c.text
}

func (c *choice[T]) Set(s string) error {
	v, err := c.parse(s)
	if err != nil {
		return err
	}
	c.text, c.val = s, v
	return nil
}

// logFlags are the logging flags shared by commands that log.
type logFlags struct {
	level  *choice[slog.Level]
	format *choice[string]
}

func addLogFlags(fs *flag.FlagSet, defLevel string) *logFlags {
	lf := &logFlags{
		level: newChoice(defLevel, func(s string) (slog.Level, error) {
			var l slog.Level
			if err := l.UnmarshalText([]byte(s)); err != nil {
				return 0, fmt.Errorf("want debug, info, warn or error, got %q", s)
			}
			return l, nil
		}),
		format: newChoice("text", func(s string) (string, error) {
			if s != "text" && s != "json" {
				return "", fmt.Errorf("want text or json, got %q", s)
			}
			return s, nil
		}),
	}
	fs.Var(lf.level, "log-level", "minimum `level` logged: debug, info, warn or error")
	fs.Var(lf.format, "log-format", "log `format` on stderr: text or json")
	return lf
}

func (lf *logFlags) logger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: lf.level.val}
	if lf.format.val == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func parseSyncMode(s string) (rocksstore.SyncMode, error) { return rocksstore.ParseSyncMode(s) }

// version reports the module version and VCS revision the binary was
// built from, as far as the build recorded them.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += " " + s.Value[:12]
		}
		if s.Key == "vcs.modified" && s.Value == "true" {
			v += "+dirty"
		}
	}
	return v
}

var serveCommand = &command{
	name:    "serve",
	summary: "run a queue node on embedded RocksDB",
	help: `
Run a leaseq node: open (or create) the RocksDB database in --data, start
the sweeper that expires leases and wakes delayed items at their deadlines,
and run until SIGINT or SIGTERM. The first signal shuts down in order (stop
the sweeper, close the store); a second signal exits at once.

--sync=always (the default) fsyncs the write-ahead log before any enqueue,
ack, nack or poll returns; --sync=none writes the log without fsync, which
survives a process crash but not a power loss. The startup log says which
is on.`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		data := fs.String("data", "./data", "`dir`ectory of the RocksDB database (created if missing)")
		syncMode := newChoice("always", parseSyncMode)
		fs.Var(syncMode, "sync", "WAL durability `mode`: always or none")
		sweepInterval := fs.Duration("sweep-interval", sweeper.DefaultSweepInterval, "longest sleep of the sweeper when no deadline is known")
		sweepBatch := fs.Int("sweep-batch", sweeper.DefaultBatchLimit, "leases expired per sweep transaction")
		checkConfig := fs.Bool("check-config", false, "validate flags and environment, print the effective settings, and exit")
		lf := addLogFlags(fs, "info")
		return func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q", args[0])
			}
			if *sweepInterval <= 0 || *sweepBatch <= 0 {
				return usagef("--sweep-interval and --sweep-batch must be positive")
			}
			if *checkConfig {
				fs.VisitAll(func(f *flag.Flag) {
					if f.Name != "check-config" {
						fmt.Fprintf(e.stdout, "%s=%s\n", f.Name, f.Value)
					}
				})
				return nil
			}
			return serve(ctx, e, serveConfig{
				data:          *data,
				sync:          syncMode.val,
				syncText:      syncMode.text,
				sweepInterval: *sweepInterval,
				sweepBatch:    *sweepBatch,
				log:           lf.logger(e.stderr),
			})
		}
	},
}

type serveConfig struct {
	data          string
	sync          rocksstore.SyncMode
	syncText      string
	sweepInterval time.Duration
	sweepBatch    int
	log           *slog.Logger
}

func serve(ctx context.Context, e *env, c serveConfig) error {
	log := c.log
	clk := clock.New()

	// The store reports new deadlines from its first commit on, possibly
	// from other goroutines; the sweeper exists only after the store is
	// open. Notify is a no-op on a nil *Sweeper, so load it atomically.
	var sw atomic.Pointer[sweeper.Sweeper]
	store, err := rocksstore.Open(c.data, rocksstore.Options{
		Sync:       c.sync,
		Logger:     log,
		OnDeadline: func(t time.Time) { sw.Load().Notify(t) },
	})
	if err != nil {
		return fmt.Errorf("open store in %s: %w", c.data, err)
	}
	s, err := sweeper.New(sweeper.Config{
		Store:         store,
		Clock:         clk,
		Logger:        log,
		BatchLimit:    c.sweepBatch,
		SweepInterval: c.sweepInterval,
		// OnReady stays nil until the RPC dispatcher exists to wake.
	})
	if err != nil {
		return errors.Join(fmt.Errorf("sweeper: %w", err), closeStore(store))
	}
	sw.Store(s)

	sigs := make(chan os.Signal, 2)
	stopSignals := e.notifySignals(sigs)
	defer stopSignals()

	if err := s.Start(ctx); err != nil {
		return errors.Join(fmt.Errorf("start sweeper: %w", err), closeStore(store))
	}
	dir, _ := filepath.Abs(c.data)
	log.Info("leaseq serving",
		"version", version(),
		"backend", "rocksdb",
		"data", dir,
		"sync", c.syncText,
		"sweep_interval", c.sweepInterval,
		"pid", os.Getpid())

	select {
	case sig := <-sigs:
		log.Info("shutting down", "signal", sig.String())
	case <-ctx.Done():
		log.Info("shutting down", "reason", context.Cause(ctx))
	}

	// A second signal during shutdown exits at once.
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case sig := <-sigs:
			log.Warn("second signal: exiting without clean shutdown", "signal", sig.String())
			e.exit(exitFailure)
		case <-done:
		}
	})
	defer wg.Wait()
	defer close(done)

	// Reverse order of start.
	s.Stop()
	if err := closeStore(store); err != nil {
		return err
	}
	log.Info("leaseq stopped")
	return nil
}

func closeStore(s *rocksstore.Store) error {
	if err := s.Close(); err != nil {
		return fmt.Errorf("close store: %w", err)
	}
	return nil
}

var checkCommand = &command{
	name:    "check",
	summary: "verify the on-disk invariants of a stopped node's database",
	help: `
Open the database in --data (which must exist; stop the node first) and
verify every invariant with a full scan: each item in exactly one state,
index entries match items, leases and their expiry entries match, counters
equal what the scan counts, attempts within max_attempts. Prints each
violation and exits 1 if there is any; otherwise prints a one-line summary.`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		data := fs.String("data", "./data", "`dir`ectory of the RocksDB database")
		lf := addLogFlags(fs, "warn")
		return func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q", args[0])
			}
			return check(ctx, e, *data, lf.logger(e.stderr))
		}
	},
}

func check(ctx context.Context, e *env, data string, log *slog.Logger) (err error) {
	// Open would create an empty database; a typo must not pass the check.
	if _, err := os.Stat(data); err != nil {
		return fmt.Errorf("no database at %s: %w", data, err)
	}
	store, err := rocksstore.Open(data, rocksstore.Options{Logger: log})
	if err != nil {
		return fmt.Errorf("open store in %s: %w", data, err)
	}
	defer func() { err = errors.Join(err, closeStore(store)) }()
	rep, err := store.Check(ctx)
	if err != nil {
		return fmt.Errorf("check %s: %w", data, err)
	}
	for _, v := range rep.Violations {
		fmt.Fprintln(e.stdout, v)
	}
	if !rep.OK() {
		return exitError{exitFailure, fmt.Errorf("%s: %d invariant violations (%d items, %d leases)", data, len(rep.Violations), rep.Items, rep.Leases)}
	}
	fmt.Fprintf(e.stdout, "ok: %s: %d items, %d leases, all invariants hold\n", data, rep.Items, rep.Leases)
	return nil
}
