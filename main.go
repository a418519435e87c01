// Command leaseq is a durable, at-least-once work-queue node and its CLI.
//
// main.go is wiring only: it parses flags and LEASEQ_* environment
// variables, builds the slog logger, creates the one real clock
// (clock.New()), opens the storage backend, starts the sweeper and the RPC
// server, exports metrics, waits for signals, and shuts down in reverse
// order. It is the only place that chooses concrete implementations; it
// holds no queue logic. The client commands (enqueue, poll, ack, ...) are
// thin wrappers over rpc.Client that format its results for a terminal or
// a script.
//
// Subcommands live in the commands table. Each one defines its flags on its
// own flag.FlagSet and returns the function that runs it, so a new command
// or a new flag is one table entry or one line in its setup function.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/leaseq/leaseq/bench"
	"github.com/leaseq/leaseq/fdbsync"
	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/storage"
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

// defaultAddr is where serve listens and clients connect by default:
// loopback only, so a node is never exposed by accident.
const defaultAddr = "127.0.0.1:7700"

// timeFormat is how the CLI prints instants: RFC 3339 in UTC with
// milliseconds, the resolution of every time on the wire.
const timeFormat = "2006-01-02T15:04:05.000Z07:00"

func main() {
	os.Exit(run(context.Background(), os.Args[1:], newEnv()))
}

// env is what a command may touch of the outside world. Tests replace it.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	lookupEnv      func(string) (string, bool)
	// notifySignals delivers SIGINT/SIGTERM to c until the returned stop
	// func is called.
	notifySignals func(c chan<- os.Signal) (stop func())
	// exit ends the process at once (second signal during shutdown).
	exit func(code int)
	// shutdownStarted, when set, runs after the first signal is handled
	// and the second-signal watcher is armed, before anything stops. A
	// test blocks in it to hold shutdown up deterministically; nil in
	// production.
	shutdownStarted func()
}

func newEnv() *env {
	return &env{
		stdin:     os.Stdin,
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
	// raw commands parse their own arguments (bench): run passes them
	// through untouched and setup's fs stays empty.
	raw bool
}

// commands is the subcommand table, in the order help lists them.
var commands = []*command{
	serveCommand, enqueueCommand, pollCommand, ackCommand, nackCommand, extendCommand,
	statsCommand, queuesCommand, peekCommand, purgeCommand, dlqCommand, configCommand,
	checkCommand, benchCommand,
}

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
			if cmd.raw {
				return run(ctx, []string{cmd.name, "-h"}, e)
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
	pos := args[1:]
	if !cmd.raw {
		var err error
		pos, err = parseArgs(fs, args[1:], e.lookupEnv)
		if errors.Is(err, flag.ErrHelp) {
			printCommandUsage(e.stdout, cmd, fs)
			return exitOK
		}
		if err != nil {
			fmt.Fprintf(e.stderr, "leaseq %s: %s (run 'leaseq help %s')\n", cmd.name, oneLine(err), cmd.name)
			return exitUsage
		}
	}
	err := runCmd(ctx, pos)
	var ue usageError
	var xe exitError
	switch {
	case err == nil:
		return exitOK
	case cmd.raw && errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(e.stderr, "leaseq %s: %s (run 'leaseq help %s')\n", cmd.name, oneLine(err), cmd.name)
		return exitUsage
	case errors.As(err, &xe):
		fmt.Fprintf(e.stderr, "leaseq %s: %s\n", cmd.name, oneLine(err))
		return xe.code
	default:
		fmt.Fprintf(e.stderr, "leaseq %s: %s\n", cmd.name, oneLine(err))
		return exitFailure
	}
}

// oneLine renders err for the one stderr line every failure gets. A
// request-level error from the node is shown as the node's explanation and
// its class, without the client's own "leaseq <op>:" prefix (run adds the
// command name).
func oneLine(err error) string {
	msg := err.Error()
	var se *rpc.StatusError
	if errors.As(err, &se) && se.Error() == msg {
		msg = se.Message
		if s := se.Unwrap(); s != nil && !strings.Contains(msg, s.Error()) {
			msg = fmt.Sprintf("%s (%v)", msg, s)
		}
	}
	return strings.Join(strings.Fields(msg), " ")
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
		if set[f.Name] || envErr != nil || isCLIOnly(f) {
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

// cliOnlyValue marks a flag that parseArgs never fills from the
// environment. Flags whose values end up stored in the node (a queue's
// config, an item's delay, priority, dedup key or max attempts, a nack's
// delay and reason) are command-line only: an exported LEASEQ_MAX_ATTEMPTS
// or LEASEQ_KEY, meant for one command or left over in a shell, would
// otherwise silently change queues and items for every later command.
// The environment stays the place for where and how to connect, log, wait
// and print, which a shell session legitimately sets once.
type cliOnlyValue struct{ flag.Value }

// IsBoolFlag keeps a wrapped bool flag usable without a value.
func (v cliOnlyValue) IsBoolFlag() bool {
	bf, ok := v.Value.(interface{ IsBoolFlag() bool })
	return ok && bf.IsBoolFlag()
}

// cliOnly marks the named flags of fs as command-line only.
func cliOnly(fs *flag.FlagSet, names ...string) {
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil {
			panic("cliOnly: no flag " + name) // programming error in a setup func
		}
		f.Value = cliOnlyValue{f.Value}
	}
}

func isCLIOnly(f *flag.Flag) bool {
	_, ok := f.Value.(cliOnlyValue)
	return ok
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
Flags may stand before or after the arguments. A flag can also be set
from the environment as LEASEQ_<FLAG>, upper case with dashes as
underscores (--data is LEASEQ_DATA, --log-level is LEASEQ_LOG_LEVEL); a
flag given on the command line wins over the environment. Flags whose
values are stored in the node (config's settings; enqueue's --delay,
--priority, --key and --max-attempts; nack's --delay and --reason) are
read from the command line only, so a leftover variable cannot change
queues or items. Client commands
connect to --addr (default 127.0.0.1:7700, or LEASEQ_ADDR; unix:/path for a
unix socket). Errors are one line on stderr and a non-zero exit code (2 for
a bad command line).
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
	fmt.Fprint(w, "\nFlags (each also read from the environment variable shown, unless marked\ncommand line only):\n")
	for _, f := range flags {
		typ, usage := flag.UnquoteUsage(f)
		head := "--" + f.Name
		if len(f.Name) == 1 {
			head = "-" + f.Name // -n, as the synopses write it
		}
		if typ != "" {
			head += " " + typ
		}
		fmt.Fprintf(w, "  %s\n      %s", head, usage)
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0s" && f.DefValue != "0" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		if isCLIOnly(f) {
			fmt.Fprint(w, " [command line only]\n")
			continue
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
	set   bool // Set was called (the flag or its variable was given)
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
	c.text, c.val, c.set = s, v, true
	return nil
}

// parseSize parses a byte count: a plain number, or one with a KiB, MiB or
// GiB suffix (1MiB = 1048576).
// parseFileMode parses permission bits in octal ("0660", "600").
func parseFileMode(s string) (fs.FileMode, error) {
	n, err := strconv.ParseUint(s, 8, 32)
	if err != nil || n == 0 || n > 0o777 {
		return 0, fmt.Errorf("want octal permission bits between 1 and 0777, got %q", s)
	}
	return fs.FileMode(n), nil
}

func parseSize(s string) (int, error) {
	mult := 1
	num := s
	for _, u := range []struct {
		suffix string
		mult   int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = n, u.mult
			break
		}
	}
	n, err := strconv.Atoi(strings.TrimSpace(num))
	if err != nil || n <= 0 || n > (1<<40)/mult {
		return 0, fmt.Errorf("want a positive size in bytes (e.g. 1048576 or 1MiB), got %q", s)
	}
	return n * mult, nil
}

// positiveDuration parses a duration that must be > 0.
func positiveDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("want a positive duration such as 500ms or 30s, got %q", s)
	}
	return d, nil
}

// nonNegDuration parses a duration that must be >= 0.
func nonNegDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("want a duration >= 0 such as 0, 500ms or 30s, got %q", s)
	}
	return d, nil
}

// intRange returns a parser for an integer in [lo, hi].
func intRange(lo, hi int) func(string) (int, error) {
	return func(s string) (int, error) {
		n, err := strconv.Atoi(s)
		if err != nil || n < lo || n > hi {
			return 0, fmt.Errorf("want an integer from %d to %d, got %q", lo, hi, s)
		}
		return n, nil
	}
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
	summary: "run a queue node (embedded RocksDB, or FoundationDB)",
	help: `
Run a leaseq node: open (or create) the RocksDB database in --data, start
the sweeper that expires leases and wakes delayed items at their deadlines,
serve the Cap'n Proto RPC interface on --listen, and run until SIGINT or
SIGTERM. The first signal shuts down in order: stop accepting connections,
let running calls finish (parked long polls return empty), stop the
sweeper, close the store. A second signal exits at once.

--sync=always (the default) fsyncs the write-ahead log before any enqueue,
ack, nack or poll returns; --sync=none writes the log without fsync, which
survives a process crash but not a power loss. The startup log says which
is on, and the address it listens on.

--listen takes host:port or unix:/path/to/socket. The default is loopback
only. With --tls-cert and --tls-key the node speaks TLS; adding
--tls-client-ca requires every client to present a certificate signed by
that CA (mutual TLS).

--metrics ADDR serves Prometheus metrics on http://ADDR/metrics (queue
depth by state, oldest ready age, per-operation counts and latency
histograms, commit and fsync latency, sweeper lag), /healthz (the process
is up) and /readyz (200 once the store is open and the RPC listener
accepts; 503 before that and while shutting down).

The --max-* and --min-lease flags set the limits every request is checked
against; a request over a limit gets a clear error naming it.

--backend=fdb serves from a FoundationDB cluster (--fdb-cluster-file)
instead of RocksDB; it needs a binary built with 'make build-fdb'.`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		data := fs.String("data", "./data", "`dir`ectory of the RocksDB database (created if missing)")
		listen := fs.String("listen", defaultAddr, "RPC listen `address`: host:port or unix:/path")
		backend := newChoice("rocksdb", func(s string) (string, error) {
			if s != "rocksdb" && s != "fdb" {
				return "", fmt.Errorf("want rocksdb or fdb, got %q", s)
			}
			return s, nil
		})
		fs.Var(backend, "backend", "storage `backend`: rocksdb or fdb")
		clusterFile := fs.String("fdb-cluster-file", "", "FoundationDB cluster `file` for --backend=fdb (empty: the client library's default)")
		subspace := newChoice("", parseSubspace)
		fs.Var(subspace, "fdb-subspace", "`name` of this deployment's subspace for --backend=fdb: deployments sharing one cluster need distinct names (empty: the default subspace)")
		syncMode := newChoice("always", parseSyncMode)
		fs.Var(syncMode, "sync", "WAL durability `mode`: always or none")
		minFreeDisk := newChoice("256MiB", func(v string) (int, error) {
			if v == "0" {
				return 0, nil
			}
			return parseSize(v)
		})
		fs.Var(minFreeDisk, "min-free-disk", "free `bytes` kept in reserve on the data disk: below it enqueues are refused (unavailable) while acks and polls go on, and a node whose store stopped on a full disk reopens it once this much is free again (0: no reserve)")
		recoverMode := newChoice("", func(s string) (string, error) {
			if s != "" && s != "point-in-time" {
				return "", fmt.Errorf("want point-in-time, got %q", s)
			}
			return s, nil
		})
		socketMode := newChoice("0660", parseFileMode)
		fs.Var(socketMode, "socket-mode", "permission `bits` (octal) of the unix socket for --listen unix:/path; connecting needs write permission")
		fs.Var(recoverMode, "recover", "`point-in-time`: open a database whose write-ahead log is damaged, dropping every write after the damage (the node refuses to start on such a log otherwise; keep a copy of --data first)")
		metricsAddr := fs.String("metrics", "", "serve /metrics, /healthz and /readyz over HTTP on `host:port` (empty: off)")
		tlsCert := fs.String("tls-cert", "", "server certificate `file` (PEM); enables TLS with --tls-key")
		tlsKey := fs.String("tls-key", "", "server private key `file` (PEM)")
		tlsClientCA := fs.String("tls-client-ca", "", "CA bundle `file` (PEM): require client certificates signed by it (mutual TLS)")
		maxConns := fs.Int("max-conns", rpc.DefaultMaxConns, "maximum open client connections")
		maxConnsPerIP := fs.Int("max-conns-per-ip", rpc.DefaultMaxConnsPerAddr, "maximum open TCP connections from one IP address (0: no per-address limit)")
		maxWaiters := fs.Int("max-waiters", rpc.DefaultMaxWaitersPerQueue, "maximum parked long polls plus subscriptions per queue (0 means the default)")
		d := storage.DefaultLimits
		maxPayload := newChoice(strconv.Itoa(d.MaxPayload), parseSize)
		fs.Var(maxPayload, "max-payload", "largest item payload, in `bytes` (KiB/MiB suffixes allowed)")
		maxMessage := newChoice(strconv.Itoa(rpc.DefaultMaxMessageBytes), parseSize)
		fs.Var(maxMessage, "max-message", "largest incoming RPC message, in `bytes`")
		maxBatch := newChoice(strconv.Itoa(d.MaxBatch), intRange(1, 100000))
		fs.Var(maxBatch, "max-batch", "most `items` or ids in one call")
		minLease := newChoice(d.MinLease.String(), positiveDuration)
		fs.Var(minLease, "min-lease", "shortest lease (a `duration`) a poll or extend may ask for")
		maxLease := newChoice(d.MaxLease.String(), positiveDuration)
		fs.Var(maxLease, "max-lease", "longest lease (a `duration`) a poll or extend may ask for")
		maxWait := newChoice(d.MaxWait.String(), positiveDuration)
		fs.Var(maxWait, "max-wait", "longest long-poll wait (a `duration`)")
		maxDelay := newChoice(d.MaxDelay.String(), positiveDuration)
		fs.Var(maxDelay, "max-delay", "longest enqueue or nack delay (a `duration`)")
		maxDedupKey := newChoice(strconv.Itoa(d.MaxDedupKey), parseSize)
		fs.Var(maxDedupKey, "max-dedup-key", "longest dedup key, in `bytes`")
		maxReason := newChoice(strconv.Itoa(d.MaxReason), parseSize)
		fs.Var(maxReason, "max-reason", "longest nack reason kept, in `bytes` (longer ones are truncated)")
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
			if *maxConns <= 0 {
				return usagef("--max-conns must be positive, got %d", *maxConns)
			}
			if *maxConnsPerIP < 0 {
				return usagef("--max-conns-per-ip must be >= 0, got %d", *maxConnsPerIP)
			}
			if *maxWaiters < 0 {
				return usagef("--max-waiters must be >= 0, got %d", *maxWaiters)
			}
			if maxPayload.val >= maxMessage.val {
				return usagef("--max-payload %d must be below --max-message %d (an item that size could never arrive in one message)", maxPayload.val, maxMessage.val)
			}
			if minLease.val > maxLease.val {
				return usagef("--min-lease %v is longer than --max-lease %v", minLease.val, maxLease.val)
			}
			if (*tlsCert == "") != (*tlsKey == "") {
				return usagef("--tls-cert and --tls-key go together")
			}
			if *tlsClientCA != "" && *tlsCert == "" {
				return usagef("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)")
			}
			if socketMode.set && !strings.HasPrefix(*listen, "unix:") {
				return usagef("--socket-mode applies to a unix socket (--listen unix:/path) only")
			}
			if backend.val == "fdb" && recoverMode.set {
				return usagef("--recover applies to --backend=rocksdb only")
			}
			if backend.val == "fdb" && syncMode.set {
				return usagef("--sync applies to --backend=rocksdb only (FoundationDB commits are always durable)")
			}
			if *checkConfig {
				fs.VisitAll(func(f *flag.Flag) {
					if f.Name != "check-config" {
						fmt.Fprintf(e.stdout, "%s=%s\n", f.Name, f.Value)
					}
				})
				return nil
			}
			var tc *tls.Config
			if *tlsCert != "" {
				var err error
				if tc, err = serverTLS(*tlsCert, *tlsKey, *tlsClientCA); err != nil {
					return err
				}
			}
			return serve(ctx, e, serveConfig{
				data:        *data,
				listen:      *listen,
				backend:     backend.val,
				clusterFile: *clusterFile,
				subspace:    subspace.val,
				sync:        syncMode.val,
				syncText:    syncMode.text,
				pointInTime: recoverMode.val == "point-in-time",
				minFreeDisk: int64(minFreeDisk.val),
				socketMode:  socketMode.val,
				metrics:     *metricsAddr,
				tls:         tc,
				mutualTLS:   *tlsClientCA != "",
				maxConns:    *maxConns,
				maxWaiters:  *maxWaiters,
				maxPerIP:    *maxConnsPerIP,
				maxMessage:  int64(maxMessage.val),
				limits: storage.Limits{
					MaxPayload:   maxPayload.val,
					MaxBatch:     maxBatch.val,
					MinLease:     minLease.val,
					MaxLease:     maxLease.val,
					MaxWait:      maxWait.val,
					MaxDelay:     maxDelay.val,
					MaxDedupKey:  maxDedupKey.val,
					MaxReason:    maxReason.val,
					MaxQueueName: d.MaxQueueName,
				},
				sweepInterval: *sweepInterval,
				sweepBatch:    *sweepBatch,
				log:           lf.logger(e.stderr),
			})
		}
	},
}

// serverTLS builds the node's TLS config; with a client CA, clients must
// present a certificate it signed.
func serverTLS(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate %s and key %s: %w", certFile, keyFile, err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCAFile != "" {
		pool, err := loadCertPool(clientCAFile)
		if err != nil {
			return nil, err
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

func loadCertPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA bundle %s: no PEM certificates in it", file)
	}
	return pool, nil
}

type serveConfig struct {
	data          string
	listen        string
	backend       string
	clusterFile   string
	subspace      string
	sync          rocksstore.SyncMode
	syncText      string
	pointInTime   bool // --recover=point-in-time
	minFreeDisk   int64
	socketMode    fs.FileMode
	metrics       string
	tls           *tls.Config
	mutualTLS     bool
	maxConns      int
	maxWaiters    int
	maxPerIP      int // 0: no per-address limit
	maxMessage    int64
	limits        storage.Limits
	sweepInterval time.Duration
	sweepBatch    int
	log           *slog.Logger
}

// openBackend opens the configured store. rocks is the same store when it
// is RocksDB (for its write-path metrics), else nil.
func openBackend(c serveConfig, clk clock.Clock, onDeadline storage.DeadlineFunc) (store storage.Store, rocks *rocksstore.Store, err error) {
	if c.backend == "fdb" {
		fs, err := fdbsync.OpenCluster(c.clusterFile, fdbsync.Options{
			Prefix:     fdbPrefix(c.subspace),
			Limits:     c.limits,
			Logger:     c.log.With("svc", "fdbsync"),
			OnDeadline: onDeadline,
			Clock:      clk,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("open FoundationDB cluster: %w", err)
		}
		return fs, nil, nil
	}
	rs, err := rocksstore.Open(c.data, rocksstore.Options{
		Sync:               c.sync,
		RecoverPointInTime: c.pointInTime,
		MinFreeDisk:        c.minFreeDisk,
		Limits:             c.limits,
		Logger:             c.log.With("svc", "rocksstore"),
		OnDeadline:         onDeadline,
		Now:                clk.Now,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("open store in %s: %w", c.data, err)
	}
	return rs, rs, nil
}

// fdbPrefix is the key prefix of the FoundationDB subspace named name (a
// valid subspace name, see parseSubspace): fdbsync's default prefix for "",
// else the default prefix followed by the name as a tuple-layer string
// (0x02, the bytes, a 0x00 terminator). Names hold no 0x00, so the
// terminator makes the prefixes of two names disjoint even when one name
// starts with the other ("jobs" and "jobs2"), and 0x02 is none of
// fdbsync's namespace tags, so a named subspace never overlaps the
// default one either.
func fdbPrefix(name string) []byte {
	if name == "" {
		return nil // fdbsync.DefaultPrefix
	}
	p := append([]byte(fdbsync.DefaultPrefix), 0x02)
	p = append(p, name...)
	return append(p, 0x00)
}

// parseSubspace accepts an FDB subspace name: empty (the default) or, like
// a queue name, 1-200 bytes of [A-Za-z0-9._-].
func parseSubspace(s string) (string, error) {
	if s == "" {
		return s, nil
	}
	if err := storage.DefaultLimits.ValidateQueueName(s); err != nil {
		return "", fmt.Errorf("want a subspace name of 1-200 bytes of [A-Za-z0-9._-], got %q", s)
	}
	return s, nil
}

func serve(ctx context.Context, e *env, c serveConfig) (err error) {
	log := c.log
	clk := clock.New()
	// Every file the node creates (the database, its logs) is the owner's
	// only: they hold payloads. The unix socket gets --socket-mode.
	syscall.Umask(0o077)

	// Undo whatever was started, in reverse order, if startup fails.
	var undo []func() error
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				err = errors.Join(err, undo[i]())
			}
		}
	}()

	// The metrics endpoint comes up first, so /readyz can say "not yet"
	// while a large database opens.
	var ready atomic.Bool
	collector := newNodeCollector()
	var httpSrv *http.Server
	var httpWG sync.WaitGroup
	if c.metrics != "" {
		mln, err := net.Listen("tcp", c.metrics)
		if err != nil {
			return fmt.Errorf("metrics listener: %w", err)
		}
		c.metrics = mln.Addr().String() // the real port when given :0
		httpSrv = metricsServer(collector, &ready, func() error {
			if p := collector.node.Load(); p != nil && p.rocks != nil {
				return p.rocks.Failed()
			}
			return nil
		}, log)
		httpWG.Go(func() {
			if err := httpSrv.Serve(mln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server failed", "err", err)
			}
		})
		undo = append(undo, func() error { _ = httpSrv.Close(); httpWG.Wait(); return nil })
	}

	// The store reports new deadlines from its first commit on, possibly
	// from other goroutines; the sweeper exists only after the store is
	// open. Notify is a no-op on a nil *Sweeper, so load it atomically.
	var sw atomic.Pointer[sweeper.Sweeper]
	store, rocks, err := openBackend(c, clk, func(t time.Time) { sw.Load().Notify(t) })
	if err != nil {
		return err
	}
	undo = append(undo, func() error { return closeStore(store) })

	srv, err := rpc.NewServer(rpc.ServerConfig{
		Store:              store,
		Clock:              clk,
		Logger:             log, // rpc adds svc=rpc
		Limits:             c.limits,
		MaxConns:           c.maxConns,
		MaxWaitersPerQueue: c.maxWaiters,
		MaxConnsPerAddr:    perAddrLimit(c.maxPerIP),
		MaxMessageBytes:    c.maxMessage,
		TLS:                c.tls,
		Info:               nodeInfo(c),
	})
	if err != nil {
		return fmt.Errorf("rpc server: %w", err)
	}
	s, err := sweeper.New(sweeper.Config{
		Store:         store,
		Clock:         clk,
		Logger:        log,
		BatchLimit:    c.sweepBatch,
		SweepInterval: c.sweepInterval,
		// Items the sweeper made ready (expired leases, delayed items
		// come due) wake parked long polls at once.
		OnReady: srv.Wake,
	})
	if err != nil {
		return fmt.Errorf("sweeper: %w", err)
	}
	sw.Store(s)

	ln, err := rpc.ListenMode(c.listen, c.socketMode)
	if err != nil {
		return err
	}
	undo = append(undo, func() error { _ = ln.Close(); return nil })

	sigs := make(chan os.Signal, 2)
	stopSignals := e.notifySignals(sigs)
	defer stopSignals()

	if err := s.Start(ctx); err != nil {
		return fmt.Errorf("start sweeper: %w", err)
	}
	undo = append(undo, func() error { s.Stop(); return nil })
	if err := srv.Start(ctx, ln); err != nil {
		return fmt.Errorf("start rpc server: %w", err)
	}
	collector.node.Store(&nodeParts{store: store, rocks: rocks, srv: srv, sw: s, clk: clk})
	ready.Store(true)
	stopRecover := func() {}
	if rocks != nil {
		stopRecover = recoverLoop(rocks, clk, log)
	}
	undo = nil // from here on, the shutdown below stops everything in order

	addr := ln.Addr().String()
	if ln.Addr().Network() == "unix" {
		addr = "unix:" + addr
	}
	dir, _ := filepath.Abs(c.data)
	attrs := []any{
		"version", version(),
		"backend", c.backend,
		"listen", addr,
		"tls", tlsMode(c),
		"metrics", c.metrics,
		"sweep_interval", c.sweepInterval,
		"pid", os.Getpid(),
	}
	if c.backend == "rocksdb" {
		attrs = append(attrs, "data", dir, "sync", c.syncText)
	} else {
		attrs = append(attrs, "fdb_cluster_file", c.clusterFile, "fdb_subspace", c.subspace)
	}
	log.Info("leaseq serving", attrs...)

	select {
	case sig := <-sigs:
		log.Info("shutting down", "signal", sig.String())
	case <-ctx.Done():
		log.Info("shutting down", "reason", context.Cause(ctx))
	}
	ready.Store(false)

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
	if e.shutdownStarted != nil {
		e.shutdownStarted()
	}

	// Reverse order of start: no new connections or calls, running calls
	// finish (their writes are durable before they answer), then no more
	// sweeps, then the store.
	srv.Stop()
	s.Stop()
	stopRecover()
	collector.node.Store(nil)
	err = closeStore(store)
	if httpSrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if herr := httpSrv.Shutdown(sctx); herr != nil {
			_ = httpSrv.Close()
		}
		cancel()
		httpWG.Wait()
	}
	if err != nil {
		return err
	}
	log.Info("leaseq stopped")
	return nil
}

// nodeInfo is what the node tells clients about itself (stats shows it).
func nodeInfo(c serveConfig) rpc.NodeInfo {
	ni := rpc.NodeInfo{Version: version(), Backend: c.backend}
	if c.backend == "rocksdb" {
		ni.Sync = c.syncText
	}
	return ni
}

func tlsMode(c serveConfig) string {
	switch {
	case c.tls == nil:
		return "off"
	case c.mutualTLS:
		return "mutual"
	}
	return "on"
}

func closeStore(s storage.Store) error {
	if err := s.Close(); err != nil {
		return fmt.Errorf("close store: %w", err)
	}
	return nil
}

// metricsServer serves /metrics from a private registry (the node's
// collector plus the Go runtime and process collectors), /healthz, and
// /readyz from ready.
// /readyz is 503 while health reports an error (a store that stopped
// after a failed write).
func metricsServer(c prometheus.Collector, ready *atomic.Bool, health func() error, log *slog.Logger) *http.Server {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(log.With("svc", "metrics").Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
	}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		if err := health(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	// Timeouts keep a stuck scraper from holding connections forever.
	return &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second}
}

// nodeParts are what the collector reads on each scrape; nil before the
// node is up and after it stopped.
type nodeParts struct {
	store storage.Store
	rocks *rocksstore.Store // nil for other backends
	srv   *rpc.Server
	sw    *sweeper.Sweeper
	clk   clock.Clock
}

// nodeCollector turns the components' snapshot structs (Store.Stats,
// rpc.Server.Metrics, rocksstore and sweeper Metrics) into Prometheus
// metrics at scrape time, so the libraries stay free of a metrics system
// and queue depth is never stale.
type nodeCollector struct {
	node atomic.Pointer[nodeParts]

	depth, leases, oldest, itemsTotal                     *prometheus.Desc
	opCount, opErrors, opLatency                          *prometheus.Desc
	connsOpen, connsAccepted, connsRefused, waiters, subs *prometheus.Desc
	pushed                                                *prometheus.Desc
	commits, syncCommits, commitLatency, fsyncLatency     *prometheus.Desc
	calls, items, claimPasses, polls, claimed             *prometheus.Desc
	storeFailed, diskFree                                 *prometheus.Desc
	sweeps, sweepFails, sweepItems, sweepLag, sweepMaxLag *prometheus.Desc
	sweepDuration                                         *prometheus.Desc
}

func newNodeCollector() *nodeCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("leaseq_"+name, help, labels, nil)
	}
	return &nodeCollector{
		depth:         d("queue_depth", "Items in a queue by state (ready, delayed, inflight, dead).", "queue", "state"),
		leases:        d("queue_leases_active", "Lease records of a queue not yet acked, nacked or swept.", "queue"),
		oldest:        d("queue_oldest_ready_age_seconds", "Age of the oldest ready item of a queue (0 when none is ready).", "queue"),
		itemsTotal:    d("queue_items_total", "Lifetime item events of a queue (enqueued, duplicate, delivered, acked, nacked, expired, dead_lettered, redriven, purged).", "queue", "event"),
		opCount:       d("rpc_requests_total", "RPC calls handled, by operation.", "op"),
		opErrors:      d("rpc_request_errors_total", "RPC calls answered with an error status or exception, by operation.", "op"),
		opLatency:     d("rpc_request_duration_seconds", "RPC call latency by operation (a long poll includes its wait).", "op"),
		connsOpen:     d("rpc_connections_open", "Open client connections."),
		connsAccepted: d("rpc_connections_accepted_total", "Client connections served."),
		connsRefused:  d("rpc_connections_refused_total", "Connections refused at --max-conns or failing the TLS handshake."),
		waiters:       d("rpc_waiters", "Parked long polls and idle subscriptions."),
		subs:          d("rpc_subscriptions", "Open subscriptions."),
		pushed:        d("rpc_items_pushed_total", "Items delivered to subscriptions."),
		commits:       d("store_commits_total", "Batches the commit pipeline wrote, one transaction each (RocksDB)."),
		syncCommits:   d("store_sync_commits_total", "Batches that waited for a WAL fsync (RocksDB)."),
		commitLatency: d("store_commit_seconds", "Time RocksDB spent writing batches, fsync excluded (count: batches)."),
		fsyncLatency:  d("store_wal_fsync_seconds", "WAL fsync latency (count: fsyncs; one fsync covers every batch written since the last)."),
		calls:         d("store_calls_total", "Calls committed by the pipeline (RocksDB); calls_total/commits_total is calls per batch."),
		items:         d("store_items_total", "Items the committed calls touched (RocksDB); items_total/wal_fsync_seconds_count is items per fsync."),
		claimPasses:   d("store_claim_passes_total", "Batches holding at least one poll (RocksDB); polls_total/claim_passes_total > 1 shows polls sharing a commit."),
		polls:         d("store_polls_total", "Poll calls (RocksDB)."),
		claimed:       d("store_claimed_items_total", "Items handed out by polls (RocksDB)."),
		storeFailed:   d("store_failed", "1 while the store has stopped after a failed write (a full disk, say) and waits to reopen (RocksDB); /readyz is 503 meanwhile."),
		diskFree:      d("store_disk_free_bytes", "Free bytes on the data directory's filesystem (RocksDB); enqueues are refused below --min-free-disk."),
		sweeps:        d("sweeper_passes_total", "Sweeper passes."),
		sweepFails:    d("sweeper_failed_passes_total", "Sweeper passes that failed."),
		sweepItems:    d("sweeper_events_total", "Sweeper work (leases_expired, requeued, dead_lettered, promoted, dedup_dropped).", "event"),
		sweepLag:      d("sweeper_lag_seconds", "How late the last timer-driven sweep started after its deadline."),
		sweepMaxLag:   d("sweeper_max_lag_seconds", "Largest sweeper lag seen."),
		sweepDuration: d("sweeper_last_pass_seconds", "Duration of the last sweeper pass."),
	}
}

// Describe implements prometheus.Collector.
func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.depth, c.leases, c.oldest, c.itemsTotal, c.opCount, c.opErrors, c.opLatency,
		c.connsOpen, c.connsAccepted, c.connsRefused, c.waiters, c.subs, c.pushed,
		c.commits, c.syncCommits, c.commitLatency, c.fsyncLatency, c.calls, c.items, c.claimPasses, c.polls, c.claimed, c.storeFailed, c.diskFree,
		c.sweeps, c.sweepFails, c.sweepItems, c.sweepLag, c.sweepMaxLag, c.sweepDuration,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.node.Load()
	if p == nil {
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}

	// A scrape must not hang on a stuck store.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stats, err := p.store.Stats(ctx, storage.StatsParams{Now: p.clk.Now()})
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.depth, fmt.Errorf("stats: %w", err))
	}
	for _, q := range stats {
		gauge(c.depth, float64(q.Ready), q.Queue, "ready")
		gauge(c.depth, float64(q.Delayed), q.Queue, "delayed")
		gauge(c.depth, float64(q.Inflight), q.Queue, "inflight")
		gauge(c.depth, float64(q.Dead), q.Queue, "dead")
		gauge(c.leases, float64(q.Leases), q.Queue)
		gauge(c.oldest, q.OldestReadyAge.Seconds(), q.Queue)
		for _, ev := range []struct {
			name string
			v    uint64
		}{
			{"enqueued", q.Enqueued}, {"duplicate", q.Duplicates}, {"delivered", q.Delivered},
			{"acked", q.Acked}, {"nacked", q.Nacked}, {"expired", q.Expired},
			{"dead_lettered", q.DeadLettered}, {"redriven", q.Redriven}, {"purged", q.Purged},
		} {
			counter(c.itemsTotal, ev.v, q.Queue, ev.name)
		}
	}

	m := p.srv.Metrics()
	for _, o := range m.Ops {
		name := o.Op.String()
		counter(c.opCount, o.Count, name)
		counter(c.opErrors, o.Errors, name)
		buckets := make(map[float64]uint64, len(rpc.LatencyBounds))
		var cum uint64
		for i, b := range rpc.LatencyBounds {
			if i < len(o.Buckets) {
				cum += o.Buckets[i]
			}
			buckets[b.Seconds()] = cum
		}
		ch <- prometheus.MustNewConstHistogram(c.opLatency, o.Count, o.Sum.Seconds(), buckets, name)
	}
	gauge(c.connsOpen, float64(m.ConnsOpen))
	counter(c.connsAccepted, m.ConnsAccepted)
	counter(c.connsRefused, m.ConnsRefused)
	gauge(c.waiters, float64(m.Waiters))
	gauge(c.subs, float64(m.Subscriptions))
	counter(c.pushed, m.ItemsPushed)

	if p.rocks != nil {
		r := p.rocks.Metrics()
		counter(c.commits, r.Commits)
		counter(c.syncCommits, r.SyncCommits)
		ch <- prometheus.MustNewConstSummary(c.commitLatency, r.Commits, r.CommitTime.Seconds(), nil)
		ch <- prometheus.MustNewConstSummary(c.fsyncLatency, r.WALSyncs, r.SyncTime.Seconds(), nil)
		counter(c.calls, r.Ops)
		counter(c.items, r.Items)
		failed := 0.0
		if p.rocks.Failed() != nil {
			failed = 1
		}
		gauge(c.storeFailed, failed)
		if free, err := p.rocks.FreeDisk(); err == nil {
			gauge(c.diskFree, float64(free))
		}
		counter(c.claimPasses, r.ClaimPasses)
		counter(c.polls, r.Polls)
		counter(c.claimed, r.Claimed)
	}

	s := p.sw.Metrics()
	counter(c.sweeps, s.Passes)
	counter(c.sweepFails, s.FailedPasses)
	counter(c.sweepItems, s.LeasesExpired, "leases_expired")
	counter(c.sweepItems, s.Requeued, "requeued")
	counter(c.sweepItems, s.DeadLettered, "dead_lettered")
	counter(c.sweepItems, s.Promoted, "promoted")
	counter(c.sweepItems, s.DedupDropped, "dedup_dropped")
	gauge(c.sweepLag, s.LastLag.Seconds())
	gauge(c.sweepMaxLag, s.MaxLag.Seconds())
	gauge(c.sweepDuration, s.LastPassDuration.Seconds())
}

var checkCommand = &command{
	name:    "check",
	summary: "verify the on-disk invariants of a stopped node's database",
	help: `
Open the database in --data read-only (it must exist; stop the node first)
and verify every invariant with a full scan: each item in exactly one state,
index entries match items, leases and their expiry entries match, counters
equal what the scan counts, attempts within max_attempts. Prints each
violation and exits 1 if there is any; otherwise prints a one-line summary.
Check never writes to the database. A write-ahead log damaged before its
end (not just a torn last record) fails the check, naming the file and the
bytes that 'leaseq serve --recover=point-in-time' would drop.

With --backend=fdb it checks a FoundationDB deployment's subspace
(--fdb-cluster-file, --fdb-subspace) in one consistent read, while the
nodes run; it needs a 'make build-fdb' binary.`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		data := fs.String("data", "./data", "`dir`ectory of the RocksDB database")
		backend := newChoice("rocksdb", func(s string) (string, error) {
			if s != "rocksdb" && s != "fdb" {
				return "", fmt.Errorf("want rocksdb or fdb, got %q", s)
			}
			return s, nil
		})
		fs.Var(backend, "backend", "storage `backend`: rocksdb, or fdb (a consistent scan of the cluster's subspace; small deployments only, as one FDB transaction must finish within 5 s)")
		clusterFile := fs.String("fdb-cluster-file", "", "FoundationDB cluster `file` for --backend=fdb")
		subspace := newChoice("", parseSubspace)
		fs.Var(subspace, "fdb-subspace", "`name` of the deployment's subspace for --backend=fdb (as given to serve)")
		lf := addLogFlags(fs, "warn")
		return func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q", args[0])
			}
			if backend.val == "fdb" {
				return checkFDB(ctx, e, *clusterFile, subspace.val, lf.logger(e.stderr))
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
	if pid, ok := lockHolder(data); ok {
		return fmt.Errorf("the database in %s is in use by process %d (a running 'leaseq serve'? stop it first: check needs the database to itself)", data, pid)
	}
	// Read-only: check never writes to the database (a replayed WAL stays
	// in memory), so it cannot make a damaged log's loss permanent.
	rep, err := rocksstore.CheckDir(ctx, data)
	return printReport(e, rep, err, data)
}

// lockHolder reports the process holding RocksDB's lock on the database in
// dir, if any, so check can say "stop the node first" instead of passing
// on RocksDB's "IO error: While lock file". RocksDB locks DIR/LOCK with a
// POSIX record lock (fcntl F_SETLK); F_GETLK asks who holds it without
// taking it. Any failure to ask means "not known to be held": Open then
// reports what is wrong.
func lockHolder(dir string) (pid int, held bool) {
	f, err := os.Open(filepath.Join(dir, "LOCK"))
	if err != nil {
		return 0, false
	}
	defer f.Close()
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: io.SeekStart}
	if err := syscall.FcntlFlock(f.Fd(), syscall.F_GETLK, &lk); err != nil || lk.Type == syscall.F_UNLCK {
		return 0, false
	}
	return int(lk.Pid), true
}

// checkFDB checks the subspace of a FoundationDB deployment; the nodes
// may keep running (the scan reads one consistent version).
func checkFDB(ctx context.Context, e *env, clusterFile, subspace string, log *slog.Logger) error {
	store, err := fdbsync.OpenCluster(clusterFile, fdbsync.Options{Prefix: fdbPrefix(subspace), Logger: log, Clock: clock.New()})
	if err != nil {
		return fmt.Errorf("open FoundationDB cluster: %w", err)
	}
	name := "fdb:" + clusterFile
	if subspace != "" {
		name += "/" + subspace
	}
	return checkReport(ctx, e, store, name)
}

// checkReport runs store's invariant check, prints every violation and a
// summary, and closes store.
func checkReport(ctx context.Context, e *env, store storage.Store, data string) (err error) {
	defer func() { err = errors.Join(err, closeStore(store)) }()
	rep, err := store.Check(ctx)
	return printReport(e, rep, err, data)
}

// printReport prints a check's violations and summary.
func printReport(e *env, rep storage.CheckReport, err error, data string) error {
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

var benchCommand = &command{
	name:    "bench",
	args:    "[WORKLOAD...] [flags]",
	summary: "run benchmark workloads against leaseq (and peers when installed)",
	help:    `Run the benchmark harness; 'leaseq bench -h' lists its workloads and flags.`,
	raw:     true,
	setup: func(_ *flag.FlagSet, e *env) func(context.Context, []string) error {
		return func(ctx context.Context, args []string) error {
			return bench.Main(ctx, clock.New(), args, e.stdout, e.stderr)
		}
	},
}

// clientFlags are the connection flags of every client command. The
// client certificate flags are --tls-client-cert/--tls-client-key, not
// serve's --tls-cert/--tls-key: each flag reads the variable named after
// it, and LEASEQ_TLS_CERT exported for a node (its server certificate) must
// not also become the certificate every client command in the same shell
// presents. --tls-ca (verify the node) and serve's --tls-client-ca (verify
// clients) are distinct for the same reason.
type clientFlags struct {
	addr       *string
	tlsCert    *string
	tlsKey     *string
	tlsCA      *string
	serverName *string
	timeout    *time.Duration
}

func addClientFlags(fs *flag.FlagSet) *clientFlags {
	return &clientFlags{
		addr:       fs.String("addr", defaultAddr, "node `address`: host:port or unix:/path"),
		tlsCA:      fs.String("tls-ca", "", "CA bundle `file` (PEM) to verify the node; enables TLS"),
		tlsCert:    fs.String("tls-client-cert", "", "client certificate `file` (PEM) for mutual TLS; enables TLS"),
		tlsKey:     fs.String("tls-client-key", "", "client private key `file` (PEM)"),
		serverName: fs.String("tls-server-name", "", "`name` expected in the node's certificate (default: the host of --addr)"),
		timeout:    fs.Duration("timeout", 10*time.Second, "give up on the node after this long (a poll's --wait comes on top)"),
	}
}

func (cf *clientFlags) tlsConfig() (*tls.Config, error) {
	if *cf.tlsCA == "" && *cf.tlsCert == "" && *cf.tlsKey == "" {
		return nil, nil
	}
	if (*cf.tlsCert == "") != (*cf.tlsKey == "") {
		return nil, usagef("--tls-client-cert and --tls-client-key go together")
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: *cf.serverName}
	if *cf.tlsCA != "" {
		pool, err := loadCertPool(*cf.tlsCA)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = pool
	}
	if *cf.tlsCert != "" {
		cert, err := tls.LoadX509KeyPair(*cf.tlsCert, *cf.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("load TLS client certificate %s and key %s: %w", *cf.tlsCert, *cf.tlsKey, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// with dials the node, runs fn with a context bounded by --timeout plus
// extra, and closes the connection.
func (cf *clientFlags) with(ctx context.Context, extra time.Duration, fn func(ctx context.Context, c *rpc.Client) error) error {
	if *cf.timeout <= 0 {
		return usagef("--timeout must be positive")
	}
	tc, err := cf.tlsConfig()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *cf.timeout+extra)
	defer cancel()
	c, err := rpc.Dial(ctx, *cf.addr, rpc.ClientOptions{TLS: tc})
	if err != nil {
		return cf.dialError(tc, err)
	}
	defer c.Close()
	if err := fn(ctx, c); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("no answer from %s within %v: %w", *cf.addr, *cf.timeout+extra, err)
		}
		if rpc.IsDisconnected(err) {
			return fmt.Errorf("the node at %s closed the connection during the call, so its outcome is unknown (a request over the node's --max-message, or the node stopped): %w", *cf.addr, err)
		}
		return err
	}
	return nil
}

// dialError explains a failed Dial: nothing listening, a TLS certificate
// the client cannot verify, or a node that hung up during setup (most
// often a TLS mismatch, which the client only learns as a closed
// connection under TLS 1.3).
func (cf *clientFlags) dialError(tc *tls.Config, err error) error {
	addr := *cf.addr
	var opErr *net.OpError
	var verifyErr *tls.CertificateVerificationError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("cannot reach a leaseq node at %s within %v (is 'leaseq serve' running there?)", addr, *cf.timeout)
	case errors.Is(err, rpc.ErrTooManyConns):
		return fmt.Errorf("the node at %s refused the connection: it is at its --max-conns limit: %w", addr, err)
	case errors.As(err, &verifyErr):
		return fmt.Errorf("cannot verify the TLS certificate of the node at %s (give --tls-ca with the CA that signed it): %w", addr, err)
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return fmt.Errorf("cannot connect to a leaseq node at %s (is 'leaseq serve' running there?): %w", addr, err)
	}
	hint := "does the node require TLS? then give --tls-ca"
	switch {
	case tc != nil && len(tc.Certificates) == 0:
		hint = "does the node require client certificates (--tls-client-ca)? then give --tls-client-cert and --tls-client-key"
	case tc != nil:
		hint = "is the client certificate signed by the CA of the node's --tls-client-ca?"
	}
	return fmt.Errorf("the node at %s closed the connection during setup (%s): %w", addr, hint, err)
}

// batchSize is how many items or ids the CLI sends per call: at most 500
// (well under the default limit of 1000, so a call stays a modest
// transaction), and never more than the node's --max-batch. Only a call
// that needs more than one item asks the node.
func batchSize(ctx context.Context, c *rpc.Client, n int) (int, error) {
	const batch = 500
	if n <= 1 {
		return batch, nil
	}
	ni, err := c.NodeInfo(ctx)
	if err != nil {
		return 0, err
	}
	if ni.MaxBatch > 0 && ni.MaxBatch < batch {
		return ni.MaxBatch, nil
	}
	return batch, nil
}

// argsBetween checks the number of positional arguments.
func argsBetween(args []string, lo, hi int, what string) error {
	switch {
	case len(args) < lo:
		return usagef("missing arguments: want %s", what)
	case hi >= 0 && len(args) > hi:
		return usagef("unexpected argument %q (want %s)", args[hi], what)
	}
	return nil
}

func parseLease(s string) (storage.LeaseID, error) {
	l, err := storage.ParseLeaseID(s)
	if err != nil {
		return l, usagef("bad lease %q: want the 32 hex digits printed by poll", s)
	}
	return l, nil
}

func parseIDs(ss []string) ([]storage.ItemID, error) {
	ids := make([]storage.ItemID, 0, len(ss))
	for _, s := range ss {
		id, err := storage.ParseItemID(s)
		if err != nil {
			return nil, usagef("bad item id %q: want 32 hex digits", s)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// itemJSON is one line of poll, peek and dlq ls output. Times are RFC 3339
// in UTC with milliseconds; payload is standard base64 (encoding/json's
// []byte).
type itemJSON struct {
	ID          string `json:"id"`
	Queue       string `json:"queue"`
	Lease       string `json:"lease,omitempty"`
	ExpiresAt   string `json:"expires_at,omitempty"`
	State       string `json:"state,omitempty"`
	Attempts    uint32 `json:"attempts"`
	MaxAttempts uint32 `json:"max_attempts,omitempty"`
	Priority    uint8  `json:"priority"`
	EnqueuedAt  string `json:"enqueued_at"`
	VisibleAt   string `json:"visible_at,omitempty"`
	DedupKey    string `json:"dedup_key,omitempty"`
	LastError   string `json:"last_error,omitempty"`
	Reason      string `json:"reason,omitempty"`
	DeadAt      string `json:"dead_at,omitempty"`
	Payload     []byte `json:"payload"`
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(timeFormat)
}

func toJSON(it storage.Item) itemJSON {
	j := itemJSON{
		ID:          it.ID.String(),
		Queue:       it.Queue,
		Attempts:    it.Attempts,
		MaxAttempts: it.MaxAttempts,
		Priority:    it.Priority,
		EnqueuedAt:  fmtTime(it.EnqueuedAt),
		VisibleAt:   fmtTime(it.VisibleAt),
		DedupKey:    it.DedupKey,
		LastError:   it.LastError,
		Payload:     it.Payload,
	}
	if it.State != storage.StateUnknown {
		j.State = it.State.String()
	}
	if j.Payload == nil {
		j.Payload = []byte{}
	}
	return j
}

// printCodes prints one "ID RESULT" line per id and returns how many ids
// did not succeed.
func printCodes(w io.Writer, ids []storage.ItemID, codes []storage.Code) (bad int) {
	for i, id := range ids {
		c := storage.CodeInvalid
		if i < len(codes) {
			c = codes[i]
		}
		if c != storage.CodeOK {
			bad++
		}
		fmt.Fprintf(w, "%s %s\n", id, c)
	}
	return bad
}

// notAll is the error of a batch command some of whose ids failed.
func notAll(bad, total int, verb string) error {
	if bad > 0 {
		return fmt.Errorf("%d of %d ids not %s", bad, total, verb)
	}
	return nil
}

// leased is one lease and the ids to settle under it.
type leased struct {
	lease storage.LeaseID
	ids   []storage.ItemID
}

// parseLeased reads the "LEASE ID..." arguments of ack and nack, or, when
// they are just "-", poll's JSON lines from stdin (so `leaseq poll q -n 10 |
// leaseq ack q -` acks a whole poll), grouped by lease in input order.
func parseLeased(args []string, stdin io.Reader) ([]leased, error) {
	if len(args) == 1 && args[0] == "-" {
		var out []leased
		dec := json.NewDecoder(stdin)
		for {
			var it itemJSON
			err := dec.Decode(&it)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, usagef("stdin: want poll's JSON lines: %v", err)
			}
			l, err := parseLease(it.Lease)
			if err != nil {
				return nil, err
			}
			ids, err := parseIDs([]string{it.ID})
			if err != nil {
				return nil, err
			}
			if len(out) == 0 || out[len(out)-1].lease != l {
				out = append(out, leased{lease: l})
			}
			out[len(out)-1].ids = append(out[len(out)-1].ids, ids[0])
		}
		if len(out) == 0 {
			return nil, usagef("stdin: no items (pipe in the output of poll)")
		}
		return out, nil
	}
	if len(args) < 2 {
		return nil, usagef("missing arguments: want QUEUE LEASE ID... (or QUEUE - to read poll output from stdin)")
	}
	l, err := parseLease(args[0])
	if err != nil {
		return nil, err
	}
	ids, err := parseIDs(args[1:])
	if err != nil {
		return nil, err
	}
	return []leased{{lease: l, ids: ids}}, nil
}

var enqueueCommand = &command{
	name:    "enqueue",
	args:    "QUEUE [PAYLOAD|-]",
	summary: "add an item to a queue and print its id",
	help: `
Enqueue one item into QUEUE (created on first use) and print its id (32 hex
digits). PAYLOAD is taken literally; "-" reads the payload from stdin (raw
bytes, up to the node's --max-payload); no PAYLOAD enqueues an empty one.
With --lines, every line of stdin becomes one item (sent in batches) and one
id is printed per line. When --key matches an item enqueued within the
queue's dedup window, nothing is written and the first item's id is printed
followed by "duplicate".`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs)
		delay := newChoice("0s", nonNegDuration)
		fs.Var(delay, "delay", "make the item ready only after this `duration`")
		prio := newChoice("0", intRange(0, 255))
		fs.Var(prio, "priority", "`priority` 0-255; lower is served first (default 0)")
		key := fs.String("key", "", "dedup `key`: a repeat within the queue's dedup window is not enqueued again")
		maxAttempts := newChoice("0", intRange(0, 1<<31-1))
		fs.Var(maxAttempts, "max-attempts", "`deliveries` before the item is dead-lettered (0: the queue's setting)")
		lines := fs.Bool("lines", false, "enqueue every line of stdin as one item")
		cliOnly(fs, "delay", "priority", "key", "max-attempts")
		return func(ctx context.Context, args []string) error {
			if err := argsBetween(args, 1, 2, "QUEUE [PAYLOAD|-]"); err != nil {
				return err
			}
			queue := args[0]
			base := storage.EnqueueItem{Delay: delay.val, Priority: uint8(prio.val), DedupKey: *key, MaxAttempts: uint32(maxAttempts.val)}
			var payloads [][]byte
			switch {
			case *lines:
				if len(args) > 1 {
					return usagef("--lines reads stdin; drop the PAYLOAD argument")
				}
				if *key != "" {
					return usagef("--key applies to one item; it cannot be used with --lines")
				}
				sc := bufio.NewScanner(e.stdin)
				sc.Buffer(make([]byte, 64<<10), 64<<20)
				for sc.Scan() {
					payloads = append(payloads, bytes.Clone(sc.Bytes()))
				}
				if err := sc.Err(); err != nil {
					return fmt.Errorf("read stdin: %w", err)
				}
			case len(args) == 2 && args[1] == "-":
				b, err := io.ReadAll(e.stdin)
				if err != nil {
					return fmt.Errorf("read stdin: %w", err)
				}
				payloads = [][]byte{b}
			case len(args) == 2:
				payloads = [][]byte{[]byte(args[1])}
			default:
				payloads = [][]byte{{}}
			}
			return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
				batch, err := batchSize(ctx, c, len(payloads))
				if err != nil {
					return err
				}
				for len(payloads) > 0 {
					n := min(batch, len(payloads))
					items := make([]storage.EnqueueItem, n)
					for i := range items {
						items[i] = base
						items[i].Payload = payloads[i]
					}
					payloads = payloads[n:]
					res, err := c.Enqueue(ctx, queue, items)
					if err != nil {
						return err
					}
					for _, r := range res {
						switch {
						case r.Code != storage.CodeOK:
							return fmt.Errorf("item rejected: %s", r.Err)
						case r.Duplicate:
							fmt.Fprintf(e.stdout, "%s duplicate\n", r.ID)
						default:
							fmt.Fprintln(e.stdout, r.ID)
						}
					}
				}
				return nil
			})
		}
	},
}

var pollCommand = &command{
	name:    "poll",
	args:    "QUEUE",
	summary: "lease ready items and print them as JSON lines",
	help: `
Claim up to -n ready items of QUEUE under one new lease and print one JSON
object per item and line:

  {"id":"…","queue":"jobs","lease":"…","expires_at":"2026-01-02T15:04:05.123Z",
   "state":"inflight","attempts":1,"priority":0,"enqueued_at":"…","visible_at":"…",
   "payload":"aGVsbG8="}

ids and leases are 32 hex digits; times are RFC 3339 UTC with milliseconds;
payload is standard base64; dedup_key and last_error appear when set. All
items of one poll share the lease: ack, nack or extend them with it before
expires_at, or they are delivered again. --wait blocks until an item is
ready or the wait ends (nothing is printed then, exit code 0).`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs)
		n := fs.Int("n", 1, "most items to lease")
		lease := newChoice("0s", nonNegDuration)
		fs.Var(lease, "lease", "lease `duration` (0: the queue's default lease)")
		wait := newChoice("0s", nonNegDuration)
		fs.Var(wait, "wait", "wait up to this `duration` for an item (long poll; at most 60s by default)")
		return func(ctx context.Context, args []string) error {
			if err := argsBetween(args, 1, 1, "QUEUE"); err != nil {
				return err
			}
			if *n <= 0 {
				return usagef("-n must be positive, got %d", *n)
			}
			return cf.with(ctx, wait.val, func(ctx context.Context, c *rpc.Client) error {
				res, err := c.Poll(ctx, args[0], *n, lease.val, wait.val)
				if err != nil {
					return err
				}
				enc := json.NewEncoder(e.stdout)
				for _, it := range res.Items {
					j := toJSON(it)
					j.Lease = res.Lease.String()
					j.ExpiresAt = fmtTime(res.ExpiresAt)
					if err := enc.Encode(j); err != nil {
						return err
					}
				}
				return nil
			})
		}
	},
}

var ackCommand = &command{
	name:    "ack",
	args:    "QUEUE LEASE ID... | QUEUE -",
	summary: "acknowledge leased items (they are deleted)",
	help: `
Acknowledge the items ID... that poll handed out under LEASE: they are done
and never come back. Prints "ID RESULT" per id, RESULT one of ok,
not_found (already acked or gone), lease_mismatch (held under another
lease), lease_expired (the lease ran out; the item was or will be
delivered again). Exits 1 if any id was not ok.

With "-" instead of LEASE and ids, the items are read from stdin in poll's
output format: leaseq poll jobs -n 10 | leaseq ack jobs -`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs)
		return func(ctx context.Context, args []string) error {
			if err := argsBetween(args, 2, -1, "QUEUE LEASE ID... or QUEUE -"); err != nil {
				return err
			}
			batches, err := parseLeased(args[1:], e.stdin)
			if err != nil {
				return err
			}
			return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
				bad, total := 0, 0
				for _, b := range batches {
					codes, err := c.Ack(ctx, args[0], b.lease, b.ids)
					if err != nil {
						return err
					}
					bad += printCodes(e.stdout, b.ids, codes)
					total += len(b.ids)
				}
				return notAll(bad, total, "acked")
			})
		}
	},
}

// optDuration is a duration flag that remembers whether it was given.
type optDuration struct {
	d   time.Duration
	set bool
}

func (o *optDuration) String() string {
	if o == nil || !o.set {
		return ""
	}
	return o.d.String()
}

func (o *optDuration) Set(s string) error {
	d, err := nonNegDuration(s)
	if err != nil {
		return err
	}
	o.d, o.set = d, true
	return nil
}

var nackCommand = &command{
	name:    "nack",
	args:    "QUEUE LEASE ID... | QUEUE -",
	summary: "give leased items back (retry later, or dead-letter)",
	help: `
End the delivery of ID... under LEASE without success. Each item is ready
again after --delay (without --delay: the queue's exponential backoff with
jitter), or goes to the dead-letter queue if it has used its max attempts;
--reason is kept as its last error (and dead-letter reason). Prints
"ID RESULT" per id as ack does; exits 1 if any id was not ok. "-" reads
the items from poll's output on stdin, as for ack.`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs)
		delay := &optDuration{}
		fs.Var(delay, "delay", "ready again after this `duration` (default: the queue's backoff)")
		reason := fs.String("reason", "", "why the item failed, as `text` (kept as last error and dead-letter reason)")
		cliOnly(fs, "delay", "reason")
		return func(ctx context.Context, args []string) error {
			if err := argsBetween(args, 2, -1, "QUEUE LEASE ID... or QUEUE -"); err != nil {
				return err
			}
			batches, err := parseLeased(args[1:], e.stdin)
			if err != nil {
				return err
			}
			var d *time.Duration
			if delay.set {
				d = &delay.d
			}
			return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
				bad, total := 0, 0
				for _, b := range batches {
					codes, err := c.Nack(ctx, args[0], b.lease, b.ids, d, *reason)
					if err != nil {
						return err
					}
					bad += printCodes(e.stdout, b.ids, codes)
					total += len(b.ids)
				}
				return notAll(bad, total, "nacked")
			})
		}
	},
}

var extendCommand = &command{
	name:    "extend",
	args:    "QUEUE LEASE [ID...]",
	summary: "extend a lease and print its new expiry",
	help: `
Set LEASE's expiry to now + --lease (it may also shorten it) and print the
new expiry (RFC 3339 UTC, milliseconds). Fails if the lease already
expired (lease expired) or belongs to another queue (lease mismatch).

A lease covers every item of its poll and is extended as a whole, so ids
are optional. Given ids (as for ack and nack), extend prints "ID RESULT
EXPIRY" per id instead, RESULT being the lease's outcome (ok,
lease_expired, lease_mismatch): the node extends leases, not single items,
and does not check that each id is one of the lease's items. Exits 1 if
the lease was not extended.`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs)
		lease := newChoice(storage.DefaultLeaseDuration.String(), positiveDuration)
		fs.Var(lease, "lease", "new lease `duration`, from now")
		return func(ctx context.Context, args []string) error {
			if err := argsBetween(args, 2, -1, "QUEUE LEASE [ID...]"); err != nil {
				return err
			}
			l, err := parseLease(args[1])
			if err != nil {
				return err
			}
			ids, err := parseIDs(args[2:])
			if err != nil {
				return err
			}
			return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
				exp, err := c.Extend(ctx, args[0], l, lease.val)
				if len(ids) == 0 {
					if err != nil {
						return err
					}
					fmt.Fprintln(e.stdout, fmtTime(exp))
					return nil
				}
				code := storage.CodeOK
				switch {
				case errors.Is(err, storage.ErrLeaseExpired):
					code = storage.CodeLeaseExpired
				case errors.Is(err, storage.ErrLeaseMismatch):
					code = storage.CodeLeaseMismatch
				case err != nil:
					return err // the request failed; nothing to say per id
				}
				for _, id := range ids {
					if code == storage.CodeOK {
						fmt.Fprintf(e.stdout, "%s %s %s\n", id, code, fmtTime(exp))
					} else {
						fmt.Fprintf(e.stdout, "%s %s\n", id, code)
					}
				}
				if code != storage.CodeOK {
					return notAll(len(ids), len(ids), "extended")
				}
				return nil
			})
		}
	},
}

// statsJSON is one queue in `stats --json`. Durations are milliseconds.
type statsJSON struct {
	Queue            string     `json:"queue"`
	Ready            int64      `json:"ready"`
	Delayed          int64      `json:"delayed"`
	Inflight         int64      `json:"inflight"`
	Dead             int64      `json:"dead"`
	Leases           int64      `json:"leases"`
	OldestReadyAgeMs int64      `json:"oldest_ready_age_ms"`
	Enqueued         uint64     `json:"enqueued"`
	Duplicates       uint64     `json:"duplicates"`
	Delivered        uint64     `json:"delivered"`
	Acked            uint64     `json:"acked"`
	Nacked           uint64     `json:"nacked"`
	Expired          uint64     `json:"expired"`
	DeadLettered     uint64     `json:"dead_lettered"`
	Redriven         uint64     `json:"redriven"`
	Purged           uint64     `json:"purged"`
	Config           configJSON `json:"config"`
	// Backend and Sync describe the node, not the queue: repeated on every
	// line so each line stands alone.
	Backend string `json:"backend,omitempty"`
	Sync    string `json:"sync,omitempty"`
}

// configJSON is a queue config in JSON output. Durations are milliseconds.
type configJSON struct {
	MaxAttempts   uint32 `json:"max_attempts"`
	LeaseMs       int64  `json:"lease_ms"`
	DedupWindowMs int64  `json:"dedup_window_ms"`
	BackoffBaseMs int64  `json:"backoff_base_ms"`
	BackoffMaxMs  int64  `json:"backoff_max_ms"`
}

func toConfigJSON(c storage.QueueConfig) configJSON {
	return configJSON{
		MaxAttempts:   c.MaxAttempts,
		LeaseMs:       c.LeaseDuration.Milliseconds(),
		DedupWindowMs: c.DedupWindow.Milliseconds(),
		BackoffBaseMs: c.BackoffBase.Milliseconds(),
		BackoffMaxMs:  c.BackoffMax.Milliseconds(),
	}
}

var statsCommand = &command{
	name:    "stats",
	args:    "[QUEUE]",
	summary: "show queue depths and counters",
	help: `
Show, for QUEUE or every queue, the items by state (ready, delayed,
inflight, dead), live leases, the age of the oldest ready item, and the
lifetime counters (enqueued, acked, nacked, expired, dead-lettered, ...).
A first line describes the node: its backend, its --sync mode (RocksDB)
and version. --json prints one JSON object per queue and line instead
(durations in milliseconds; backend and sync on every line).`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs)
		asJSON := fs.Bool("json", false, "print JSON lines instead of a table")
		return func(ctx context.Context, args []string) error {
			if err := argsBetween(args, 0, 1, "[QUEUE]"); err != nil {
				return err
			}
			queue := ""
			if len(args) == 1 {
				queue = args[0]
			}
			return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
				stats, err := c.Stats(ctx, queue)
				if err != nil {
					return err
				}
				ni, err := c.NodeInfo(ctx)
				if err != nil {
					return err
				}
				if *asJSON {
					enc := json.NewEncoder(e.stdout)
					for _, q := range stats {
						if err := enc.Encode(statsJSON{
							Queue: q.Queue, Ready: q.Ready, Delayed: q.Delayed, Inflight: q.Inflight, Dead: q.Dead,
							Leases: q.Leases, OldestReadyAgeMs: q.OldestReadyAge.Milliseconds(),
							Enqueued: q.Enqueued, Duplicates: q.Duplicates, Delivered: q.Delivered, Acked: q.Acked,
							Nacked: q.Nacked, Expired: q.Expired, DeadLettered: q.DeadLettered, Redriven: q.Redriven,
							Purged: q.Purged, Config: toConfigJSON(q.Config), Backend: ni.Backend, Sync: ni.Sync,
						}); err != nil {
							return err
						}
					}
					return nil
				}
				fmt.Fprintf(e.stdout, "node %s: %s\n", *cf.addr, describeNode(ni))
				tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "QUEUE\tREADY\tDELAYED\tINFLIGHT\tDEAD\tLEASES\tOLDEST\tENQUEUED\tACKED\tNACKED\tEXPIRED\tDEAD_LETTERED")
				for _, q := range stats {
					fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%d\n",
						q.Queue, q.Ready, q.Delayed, q.Inflight, q.Dead, q.Leases, q.OldestReadyAge.Round(time.Millisecond),
						q.Enqueued, q.Acked, q.Nacked, q.Expired, q.DeadLettered)
				}
				return tw.Flush()
			})
		}
	},
}

// describeNode is the node line of `stats`.
func describeNode(ni rpc.NodeInfo) string {
	d := "backend=" + ni.Backend
	switch {
	case ni.Sync != "":
		d += " sync=" + ni.Sync
	case ni.Backend == "fdb":
		d += " (commits durable on the cluster)"
	}
	return d + " version=" + strings.ReplaceAll(ni.Version, " ", "@")
}

var queuesCommand = &command{
	name:    "queues",
	summary: "list queue names",
	help:    `Print the name of every queue, one per line, in byte order.`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs)
		return func(ctx context.Context, args []string) error {
			if err := argsBetween(args, 0, 0, "no arguments"); err != nil {
				return err
			}
			return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
				qs, err := c.Queues(ctx)
				if err != nil {
					return err
				}
				for _, q := range qs {
					fmt.Fprintln(e.stdout, q)
				}
				return nil
			})
		}
	},
}

// pageFlags page through items in id order.
type pageFlags struct {
	fs    *flag.FlagSet
	n     *int
	after *string
}

func addPageFlags(fs *flag.FlagSet) *pageFlags {
	return &pageFlags{
		fs:    fs,
		n:     fs.Int("n", rpc.DefaultPageLimit, "most items to list"),
		after: fs.String("after", "", "list items after this `id` (for paging)"),
	}
}

func (p *pageFlags) parse() (after storage.ItemID, limit int, err error) {
	if *p.n <= 0 {
		return after, 0, usagef("-n must be positive, got %d", *p.n)
	}
	if *p.after != "" {
		if after, err = storage.ParseItemID(*p.after); err != nil {
			return after, 0, usagef("bad --after id %q: want 32 hex digits", *p.after)
		}
	}
	return after, *p.n, nil
}

// fit lowers the default page size to the node's --max-batch; an -n the
// user gave (flag or LEASEQ_N) is sent as given, so the node's limit error
// names it.
func (p *pageFlags) fit(ctx context.Context, c *rpc.Client, limit int) (int, error) {
	given := false
	p.fs.Visit(func(f *flag.Flag) { given = given || f.Name == "n" })
	if given {
		return limit, nil
	}
	bs, err := batchSize(ctx, c, limit)
	if err != nil {
		return 0, err
	}
	return min(limit, bs), nil
}

var peekCommand = &command{
	name:    "peek",
	args:    "QUEUE",
	summary: "list items without leasing them (JSON lines)",
	help: `
List QUEUE's ready and delayed items (with --inflight: its leased items) in
id order without leasing them, as JSON lines in the format of poll (without
lease fields; state says ready, delayed or inflight). Page with -n and
--after ID.`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs)
		inflight := fs.Bool("inflight", false, "list leased (inflight) items instead")
		pf := addPageFlags(fs)
		return func(ctx context.Context, args []string) error {
			if err := argsBetween(args, 1, 1, "QUEUE"); err != nil {
				return err
			}
			after, limit, err := pf.parse()
			if err != nil {
				return err
			}
			return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
				limit, err := pf.fit(ctx, c, limit)
				if err != nil {
					return err
				}
				items, err := c.Peek(ctx, storage.PeekParams{Queue: args[0], Inflight: *inflight, After: after, Limit: limit})
				if err != nil {
					return err
				}
				enc := json.NewEncoder(e.stdout)
				for _, it := range items {
					if err := enc.Encode(toJSON(it)); err != nil {
						return err
					}
				}
				return nil
			})
		}
	},
}

var purgeCommand = &command{
	name:    "purge",
	args:    "QUEUE",
	summary: "delete every ready, delayed and inflight item of a queue",
	help: `
Delete every available and inflight item of QUEUE and print how many went.
Dead items stay (see 'leaseq dlq purge'); the queue and its config remain.`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs)
		return func(ctx context.Context, args []string) error {
			if err := argsBetween(args, 1, 1, "QUEUE"); err != nil {
				return err
			}
			return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
				n, err := c.Purge(ctx, args[0])
				if err != nil {
					return err
				}
				fmt.Fprintf(e.stdout, "purged %d\n", n)
				return nil
			})
		}
	},
}

var dlqCommand = &command{
	name:    "dlq",
	args:    "ls|redrive|purge QUEUE [ID...]",
	summary: "list, redrive or purge dead-lettered items",
	help: `
Inspect and act on a queue's dead-letter items (items that used up their
max attempts):

  dlq ls QUEUE [-n N] [--after ID]
      print dead items as JSON lines (poll's format plus reason and dead_at)
  dlq redrive QUEUE ID... | --all
      move dead items back to ready with attempts reset; prints "ID RESULT"
      per id, or "redriven N" with --all
  dlq purge QUEUE ID... | --all
      delete dead items; prints "ID RESULT" per id, or "purged N" with --all`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs)
		pf := addPageFlags(fs)
		all := fs.Bool("all", false, "redrive or purge every dead item of the queue")
		return func(ctx context.Context, args []string) error {
			if len(args) == 0 {
				return usagef("missing sub-command: want ls, redrive or purge")
			}
			sub, args := args[0], args[1:]
			switch sub {
			case "ls", "list":
				if err := argsBetween(args, 1, 1, "dlq ls QUEUE"); err != nil {
					return err
				}
				after, limit, err := pf.parse()
				if err != nil {
					return err
				}
				return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
					limit, err := pf.fit(ctx, c, limit)
					if err != nil {
						return err
					}
					items, err := c.DeadList(ctx, storage.DeadListParams{Queue: args[0], After: after, Limit: limit})
					if err != nil {
						return err
					}
					enc := json.NewEncoder(e.stdout)
					for _, d := range items {
						j := toJSON(d.Item)
						j.State = storage.StateDead.String()
						j.Reason = d.Reason
						j.DeadAt = fmtTime(d.DeadAt)
						if err := enc.Encode(j); err != nil {
							return err
						}
					}
					return nil
				})
			case "redrive", "purge":
				if err := argsBetween(args, 1, -1, "dlq "+sub+" QUEUE ID... | --all"); err != nil {
					return err
				}
				if *all == (len(args) > 1) {
					return usagef("dlq %s: give either ids or --all", sub)
				}
				ids, err := parseIDs(args[1:])
				if err != nil {
					return err
				}
				op, verb := (*rpc.Client).Redrive, "redriven"
				if sub == "purge" {
					op, verb = (*rpc.Client).PurgeDead, "purged"
				}
				return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
					if !*all {
						res, err := op(c, ctx, storage.RedriveParams{Queue: args[0], IDs: ids})
						if err != nil {
							return err
						}
						return notAll(printCodes(e.stdout, ids, res.Codes), len(ids), verb)
					}
					// Page by page until a page comes back short: each
					// call is one bounded transaction on the node.
					page, err := batchSize(ctx, c, rpc.DefaultPageLimit)
					if err != nil {
						return err
					}
					page = min(page, rpc.DefaultPageLimit)
					total := 0
					for {
						res, err := op(c, ctx, storage.RedriveParams{Queue: args[0], Limit: page})
						if err != nil {
							return err
						}
						total += res.Moved
						if res.Moved < page {
							break
						}
					}
					fmt.Fprintf(e.stdout, "%s %d\n", verb, total)
					return nil
				})
			default:
				return usagef("unknown dlq sub-command %q: want ls, redrive or purge", sub)
			}
		}
	},
}

var configCommand = &command{
	name:    "config",
	args:    "QUEUE",
	summary: "show or change a queue's configuration",
	help: `
Print QUEUE's configuration. With any of the setting flags, change those
settings first (creating the queue if needed) and print the result. The
setting flags are read from the command line only, never from LEASEQ_*
variables: an exported LEASEQ_MAX_ATTEMPTS must not turn a look at a
queue into a change of it.`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addClientFlags(fs)
		asJSON := fs.Bool("json", false, "print JSON instead of name=value lines")
		d := storage.DefaultQueueConfig()
		maxAttempts := newChoice("5", intRange(1, 1<<31-1))
		fs.Var(maxAttempts, "max-attempts", fmt.Sprintf("set how many deliveries (`n`) an item gets before it is dead-lettered (new queues: %d)", d.MaxAttempts))
		lease := newChoice(storage.DefaultLeaseDuration.String(), positiveDuration)
		fs.Var(lease, "lease", fmt.Sprintf("set the default lease `duration` of a poll (new queues: %v)", d.LeaseDuration))
		dedup := newChoice(storage.DefaultDedupWindow.String(), positiveDuration)
		fs.Var(dedup, "dedup-window", fmt.Sprintf("set how long (a `duration`) a dedup key suppresses repeats (new queues: %v)", d.DedupWindow))
		base := newChoice(storage.DefaultBackoffBase.String(), positiveDuration)
		fs.Var(base, "backoff-base", fmt.Sprintf("set the nack backoff base (a `duration`; new queues: %v)", d.BackoffBase))
		bmax := newChoice(storage.DefaultBackoffMax.String(), positiveDuration)
		fs.Var(bmax, "backoff-max", fmt.Sprintf("set the nack backoff cap (a `duration`; new queues: %v)", d.BackoffMax))
		cliOnly(fs, "max-attempts", "lease", "dedup-window", "backoff-base", "backoff-max")
		// A setting flag left out leaves the setting as it is: there is
		// no default to show, only what new queues start with.
		for _, name := range []string{"max-attempts", "lease", "dedup-window", "backoff-base", "backoff-max"} {
			fs.Lookup(name).DefValue = ""
		}
		return func(ctx context.Context, args []string) error {
			if err := argsBetween(args, 1, 1, "QUEUE"); err != nil {
				return err
			}
			queue := args[0]
			change := maxAttempts.set || lease.set || dedup.set || base.set || bmax.set
			return cf.with(ctx, 0, func(ctx context.Context, c *rpc.Client) error {
				cfg, err := c.QueueConfig(ctx, queue)
				switch {
				case errors.Is(err, storage.ErrNotFound) && change:
					cfg = storage.DefaultQueueConfig()
				case errors.Is(err, storage.ErrNotFound):
					return fmt.Errorf("no queue %q (a queue exists after its first enqueue or config change)", queue)
				case err != nil:
					return err
				}
				if change {
					if maxAttempts.set {
						cfg.MaxAttempts = uint32(maxAttempts.val)
					}
					if lease.set {
						cfg.LeaseDuration = lease.val
					}
					if dedup.set {
						cfg.DedupWindow = dedup.val
					}
					if base.set {
						cfg.BackoffBase = base.val
					}
					if bmax.set {
						cfg.BackoffMax = bmax.val
					}
					if err := c.SetQueueConfig(ctx, queue, cfg); err != nil {
						return err
					}
					if cfg, err = c.QueueConfig(ctx, queue); err != nil {
						return err
					}
				}
				if *asJSON {
					return json.NewEncoder(e.stdout).Encode(toConfigJSON(cfg))
				}
				fmt.Fprintf(e.stdout, "max-attempts=%d\nlease=%v\ndedup-window=%v\nbackoff-base=%v\nbackoff-max=%v\n",
					cfg.MaxAttempts, cfg.LeaseDuration, cfg.DedupWindow, cfg.BackoffBase, cfg.BackoffMax)
				return nil
			})
		}
	},
}

// perAddrLimit maps --max-conns-per-ip (0: none) to rpc's MaxConnsPerAddr
// (negative: none).
func perAddrLimit(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// recoverEvery is how often a node whose store stopped after a failed
// write (a full disk, say) tries to reopen it.
const recoverEvery = time.Second

// recoverLoop reopens rocks whenever it has failed and --min-free-disk is
// free again, until the returned stop is called.
func recoverLoop(rocks *rocksstore.Store, clk clock.Clock, log *slog.Logger) (stop func()) {
	t := clk.Ticker(recoverEvery)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if rocks.Failed() == nil {
				continue
			}
			if ok, err := rocks.Recover(); err != nil {
				log.Warn("store recovery failed; retrying", "err", err)
			} else if ok {
				log.Info("store recovered: writes accepted again")
			}
		}
	})
	return func() {
		t.Stop()
		close(done)
		wg.Wait()
	}
}
