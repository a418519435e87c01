// Command leaseq is a durable, at-least-once work-queue node and its CLI.
//
// Package main is wiring only: it parses flags and LEASEQ_* environment
// variables, builds the slog logger, creates the one real clock
// (clock.New()), opens the storage backend, starts the sweeper and the RPC
// server, exports metrics, waits for signals, and shuts down in reverse
// order. It is the only place that chooses concrete implementations; it
// holds no queue logic. The client commands (enqueue, poll, ack, ...) are
// thin wrappers over rpc.Client that format its results for a terminal or
// a script.
//
// Files: main.go (entry, command table, exit codes), flags.go (flag sets,
// environment, usage, value parsers), serve.go (the node), metrics.go
// (HTTP endpoints and the collector), check.go, client.go (what client
// commands share, and bench), commands_items.go and commands_admin.go (the
// client commands), work.go and workchild.go (work: a program run once per
// item, as a supervised worker).
//
// Subcommands live in the commands table. Each one defines its flags on its
// own flag.FlagSet and returns the function that runs it, so a new command
// or a new flag is one table entry or one line in its setup function.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"

	"github.com/leaseq/leaseq/rpc"

	"github.com/benbjohnson/clock"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // the command ran and failed (or check found violations)
	exitUsage   = 2 // bad command line or environment
	// exitItemsFailed: work --max-items ran, and at least one item's
	// command failed (it was nacked).
	exitItemsFailed = 3
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
	if len(os.Args) > 1 && os.Args[1] == "serve" {
		reexecForSysmon() // sysmon.go
	}
	os.Exit(run(context.Background(), os.Args[1:], newEnv()))
}

// env is what a command may touch of the outside world. Tests replace it.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	lookupEnv      func(string) (string, bool)
	// notifySignals delivers SIGINT, SIGTERM and the extra signals given
	// to c until the returned stop func is called. An extra signal the
	// process was started with ignored (SIGHUP under nohup) stays ignored.
	notifySignals func(c chan<- os.Signal, extra ...os.Signal) (stop func())
	// exit ends the process at once (second signal during shutdown).
	exit func(code int)
	// clock is the process's clock (the CLI's --timeout runs on it).
	clock clock.Clock
	// shutdownStarted, when set, runs after the first signal is handled
	// and the second-signal watcher is armed, before anything stops (also
	// when a signal stops the startup). A test blocks in it to hold
	// shutdown up deterministically; nil in production.
	shutdownStarted func()
	// checkScanned, when set, runs after check's scan and before it asks
	// again who holds the database's lock. A test starts a node in it;
	// nil in production.
	checkScanned func()
}

func newEnv() *env {
	return &env{
		clock:     clock.New(),
		stdin:     os.Stdin,
		stdout:    os.Stdout,
		stderr:    os.Stderr,
		lookupEnv: os.LookupEnv,
		notifySignals: func(c chan<- os.Signal, extra ...os.Signal) func() {
			sigs := []os.Signal{os.Interrupt, syscall.SIGTERM}
			for _, sig := range extra {
				if !signal.Ignored(sig) {
					sigs = append(sigs, sig)
				}
			}
			signal.Notify(c, sigs...)
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
	// dashArgs commands take a program to run after "--" (work): what
	// follows the first "--" is not parsed, and run passes the positionals,
	// then "--" and what follows it.
	dashArgs bool
}

// commands is the subcommand table, in the order help lists them.
var commands = []*command{
	serveCommand, enqueueCommand, pollCommand, ackCommand, nackCommand, extendCommand,
	statsCommand, queuesCommand, peekCommand, purgeCommand, dlqCommand, configCommand, queueCommand,
	workCommand, checkCommand, benchCommand,
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
	var afterDash []string
	if cmd.dashArgs {
		if i := slices.Index(pos, "--"); i >= 0 {
			pos, afterDash = pos[:i], pos[i:]
		}
	}
	if !cmd.raw {
		var err error
		pos, err = parseArgs(fs, pos, e.lookupEnv)
		if errors.Is(err, flag.ErrHelp) {
			printCommandUsage(e.stdout, cmd, fs)
			return exitOK
		}
		if err != nil && cmd.dashArgs && afterDash == nil {
			// Most likely the command's own flags, without "--" before it.
			err = fmt.Errorf(`missing "--" before the command (%v): want %s`, err, cmd.args)
		}
		if err != nil {
			fmt.Fprintf(e.stderr, "leaseq %s: %s (run 'leaseq help %s')\n", cmd.name, oneLine(err), cmd.name)
			return exitUsage
		}
	}
	err := runCmd(ctx, append(pos, afterDash...))
	var ue usageError
	var xe exitError
	switch {
	case err == nil:
		return exitOK
	case cmd.raw && errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ue):
		fmt.Fprintf(e.stderr, "leaseq %s: %s (run 'leaseq help %s')\n", cmd.name, errorLine(cmd.name, err), cmd.name)
		return exitUsage
	case errors.As(err, &xe):
		fmt.Fprintf(e.stderr, "leaseq %s: %s\n", cmd.name, errorLine(cmd.name, err))
		return xe.code
	default:
		fmt.Fprintf(e.stderr, "leaseq %s: %s\n", cmd.name, errorLine(cmd.name, err))
		return exitFailure
	}
}

// errorLine is oneLine(err) for the line "leaseq NAME: ..." that run
// prints, without a "leaseq NAME: " of its own at the start: rpc.Client's
// errors begin with "leaseq <op>: ", which for enqueue, poll, ack and the
// like is the command's name already printed.
func errorLine(name string, err error) string {
	msg := oneLine(err)
	if rest, ok := strings.CutPrefix(msg, "leaseq "+name+": "); ok && rest != "" {
		return rest
	}
	return msg
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
