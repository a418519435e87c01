// Flag sets, LEASEQ_* environment handling, usage text and the value
// parsers shared by the commands.

package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/leaseq/leaseq/storage/rocksstore"
)

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
			return
		}
		if e, ok := f.Value.(interface{ fromEnv(string) }); ok {
			e.fromEnv(name)
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
--priority, --key, --max-attempts and --lines; nack's --delay and
--reason; work's --retry-delay), work's --timeout and --max-items, dlq's
-n and --after, serve's --check-config, and the flags that widen a
deletion (dlq's --all, queue delete's --force), are read from the
command line only, so a leftover variable cannot change queues or items.
Client commands connect to --addr (default 127.0.0.1:7700, or
LEASEQ_ADDR; unix:/path for a unix socket). Errors are one line on stderr
and a non-zero exit code (2 for a bad command line).
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
	set   bool   // Set was called (the flag or its variable was given)
	env   string // the variable the value came from, if not the command line
}

// fromEnv notes the variable the value was set from (parseArgs).
func (c *choice[T]) fromEnv(name string) { c.env = name }

// source names where the value came from, for an error about it: the
// flag, or the environment variable that set it.
func (c *choice[T]) source(flagName string) string {
	if c.env != "" {
		return c.env + " (from the environment)"
	}
	return "--" + flagName
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
// parseBackend accepts the --backend values of serve and check.
func parseBackend(s string) (string, error) {
	if s != "rocksdb" && s != "fdb" {
		return "", fmt.Errorf("want rocksdb or fdb, got %q", s)
	}
	return s, nil
}

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

// longestLimit bounds the duration limits a node takes (--max-lease,
// --max-delay): item times are Unix nanoseconds, which end in 2262.
const longestLimit = 100 * 365 * 24 * time.Hour

// limitDuration parses a positive duration of at most longestLimit.
func limitDuration(s string) (time.Duration, error) {
	d, err := positiveDuration(s)
	if err != nil {
		return 0, err
	}
	if d > longestLimit {
		return 0, fmt.Errorf("want at most %v (100 years), got %q", longestLimit, s)
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
