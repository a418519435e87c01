package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync"
	"github.com/leaseq/leaseq/rpc/rpctest"

	"github.com/benbjohnson/clock"
)

// syncBuffer is a bytes.Buffer safe for the logger and the test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testEnv is an env whose output, environment and signals the test owns.
type testEnv struct {
	env
	out, errOut *syncBuffer
	vars        map[string]string
	sigs        chan chan<- os.Signal // the channel serve registered
	exits       chan int
}

func newTestEnv(vars map[string]string) *testEnv {
	te := &testEnv{out: &syncBuffer{}, errOut: &syncBuffer{}, vars: vars, sigs: make(chan chan<- os.Signal, 1), exits: make(chan int, 1)}
	te.env = env{
		clock:  clock.New(),
		stdout: te.out,
		stderr: te.errOut,
		lookupEnv: func(k string) (string, bool) {
			v, ok := te.vars[k]
			return v, ok
		},
		notifySignals: func(c chan<- os.Signal, _ ...os.Signal) func() {
			te.sigs <- c
			return func() {}
		},
		exit: func(code int) { te.exits <- code },
	}
	return te
}

func TestParseArgs(t *testing.T) {
	t.Parallel()
	newFS := func() (*flag.FlagSet, *string, *bool, *int) {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(&bytes.Buffer{})
		return fs, fs.String("data", "./data", ""), fs.Bool("verbose", false, ""), fs.Int("max-n", 1, "")
	}
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		data    string
		verbose bool
		maxN    int
		pos     []string
		cliOnly []string
		wantErr string
	}{
		{name: "Defaults", data: "./data", maxN: 1},
		{name: "FlagsBeforeArgs", args: []string{"--data", "d", "-max-n=3", "q", "p"}, data: "d", maxN: 3, pos: []string{"q", "p"}},
		{name: "FlagsAfterArgs", args: []string{"q", "--data", "d", "p", "--verbose", "--max-n", "4"}, data: "d", verbose: true, maxN: 4, pos: []string{"q", "p"}},
		{name: "BoolDoesNotEatNextArg", args: []string{"--verbose", "q"}, data: "./data", verbose: true, maxN: 1, pos: []string{"q"}},
		{name: "DashIsPositional", args: []string{"q", "-", "--data=d"}, data: "d", maxN: 1, pos: []string{"q", "-"}},
		{name: "DoubleDashEndsFlags", args: []string{"--data", "d", "--", "--verbose", "-x"}, data: "d", maxN: 1, pos: []string{"--verbose", "-x"}},
		{name: "EnvFillsUnsetFlags", args: []string{"q"}, env: map[string]string{"LEASEQ_DATA": "envd", "LEASEQ_MAX_N": "7", "LEASEQ_VERBOSE": "true"}, data: "envd", verbose: true, maxN: 7, pos: []string{"q"}},
		{name: "FlagBeatsEnv", args: []string{"--data", "flagd"}, env: map[string]string{"LEASEQ_DATA": "envd"}, data: "flagd", maxN: 1},
		{name: "BadEnvValue", env: map[string]string{"LEASEQ_MAX_N": "many"}, wantErr: `environment LEASEQ_MAX_N="many"`},
		{name: "UnknownFlag", args: []string{"q", "--nope"}, wantErr: "flag provided but not defined: -nope"},
		{name: "MissingValue", args: []string{"--data"}, wantErr: "flag needs an argument: -data"},
		{name: "Help", args: []string{"q", "--help"}, wantErr: flag.ErrHelp.Error()},
		{name: "CommandLineOnlyIgnoresEnv", args: []string{"q"}, cliOnly: []string{"data", "verbose"}, env: map[string]string{"LEASEQ_DATA": "envd", "LEASEQ_VERBOSE": "true", "LEASEQ_MAX_N": "7"}, data: "./data", maxN: 7, pos: []string{"q"}},
		{name: "CommandLineOnlyFromFlags", args: []string{"--verbose", "q", "--data", "d"}, cliOnly: []string{"data", "verbose"}, env: map[string]string{"LEASEQ_DATA": "envd"}, data: "d", verbose: true, maxN: 1, pos: []string{"q"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fs, data, verbose, maxN := newFS()
			cliOnly(fs, tc.cliOnly...)
			pos, err := parseArgs(fs, tc.args, func(k string) (string, bool) {
				v, ok := tc.env[k]
				return v, ok
			})
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.data, *data)
			require.Equal(t, tc.verbose, *verbose)
			require.Equal(t, tc.maxN, *maxN)
			require.Equal(t, tc.pos, pos)
		})
	}
}

func TestRun_HelpAndUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		args      []string
		env       map[string]string
		code      int
		stdout    []string
		stderr    []string
		oneLineEr bool // stderr must be exactly one line
	}{
		{name: "NoArgs", code: exitUsage, stderr: []string{"Usage:", "serve", "check"}},
		{name: "Help", args: []string{"help"}, code: exitOK, stdout: []string{"Commands:", "serve", "check", "LEASEQ_DATA"}},
		{name: "DashDashHelp", args: []string{"--help"}, code: exitOK, stdout: []string{"Commands:"}},
		{name: "HelpServe", args: []string{"help", "serve"}, code: exitOK, stdout: []string{"leaseq serve [flags]", "--data dir", "--sync mode", "[LEASEQ_SYNC]", "--log-level level", "--log-format format", "(default always)"}},
		{name: "ServeDashH", args: []string{"serve", "-h"}, code: exitOK, stdout: []string{"leaseq serve [flags]"}},
		{name: "HelpCheck", args: []string{"help", "check"}, code: exitOK, stdout: []string{"leaseq check [flags]", "--data dir"}},
		{name: "HelpUnknown", args: []string{"help", "frob"}, code: exitUsage, stderr: []string{`unknown command "frob"`}, oneLineEr: true},
		{name: "UnknownCommand", args: []string{"frob"}, code: exitUsage, stderr: []string{`leaseq: unknown command "frob"`}, oneLineEr: true},
		{name: "UnknownFlag", args: []string{"serve", "--frob"}, code: exitUsage, stderr: []string{"leaseq serve: flag provided but not defined: -frob"}, oneLineEr: true},
		{name: "BadSync", args: []string{"serve", "--sync", "sometimes"}, code: exitUsage, stderr: []string{"leaseq serve:", "sometimes"}, oneLineEr: true},
		{name: "BadSyncEnv", args: []string{"serve"}, env: map[string]string{"LEASEQ_SYNC": "maybe"}, code: exitUsage, stderr: []string{"LEASEQ_SYNC", "maybe"}, oneLineEr: true},
		{name: "BadLogLevel", args: []string{"serve", "--log-level", "loud"}, code: exitUsage, stderr: []string{"want debug, info, warn or error"}, oneLineEr: true},
		{name: "BadLogFormat", args: []string{"check", "--log-format=xml"}, code: exitUsage, stderr: []string{"want text or json"}, oneLineEr: true},
		{name: "ServeExtraArg", args: []string{"serve", "extra"}, code: exitUsage, stderr: []string{`unexpected argument "extra"`}, oneLineEr: true},
		{name: "CheckConfigFromEnvAndFlags", args: []string{"serve", "--check-config", "--data", "/x"}, env: map[string]string{"LEASEQ_SYNC": "none", "LEASEQ_DATA": "/y"}, code: exitOK, stdout: []string{"data=/x\n", "sync=none\n", "log-level=info\n", "max-waiters=10000\n"}},
		{name: "BadGCPercent", args: []string{"serve", "--gc-percent", "5"}, code: exitUsage, stderr: []string{"-gc-percent", "from 10 to 10000, or off"}, oneLineEr: true},
		{name: "CheckConfigGCPercent", args: []string{"serve", "--check-config"}, env: map[string]string{"LEASEQ_GC_PERCENT": "off"}, code: exitOK, stdout: []string{"gc-percent=off\n"}},
		{name: "CheckConfigGCPercentDefault", args: []string{"serve", "--check-config"}, code: exitOK, stdout: []string{"gc-percent=300\n"}},
		{name: "HelpServeQueueber", args: []string{"help", "serve"}, code: exitOK, stdout: []string{"--queueber-listen address", "--queueber-queue name", "[LEASEQ_QUEUEBER_LISTEN]", "Queueber compatibility"}},
		{name: "QueueberListenAlone", args: []string{"serve", "--queueber-listen", "127.0.0.1:7701"}, code: exitUsage, stderr: []string{"--queueber-listen needs --queueber-queue"}, oneLineEr: true},
		{name: "QueueberQueueAlone", args: []string{"serve"}, env: map[string]string{"LEASEQ_QUEUEBER_QUEUE": "jobs"}, code: exitUsage, stderr: []string{"--queueber-queue needs --queueber-listen"}, oneLineEr: true},
		{name: "QueueberBadQueue", args: []string{"serve", "--queueber-listen", "127.0.0.1:7701", "--queueber-queue", "a/b"}, code: exitUsage, stderr: []string{"--queueber-queue:", "not in [A-Za-z0-9._-]"}, oneLineEr: true},
		{name: "QueueberSameAddr", args: []string{"serve", "--listen", "127.0.0.1:7700", "--queueber-listen", "127.0.0.1:7700", "--queueber-queue", "q"}, code: exitUsage, stderr: []string{"is --listen's address"}, oneLineEr: true},
		{name: "QueueberCheckConfig", args: []string{"serve", "--check-config", "--queueber-listen", "unix:/tmp/qb.sock", "--queueber-queue", "q", "--socket-mode", "0600"}, code: exitOK, stdout: []string{"queueber-listen=unix:/tmp/qb.sock\n", "queueber-queue=q\n", "socket-mode=0600\n"}},
		{name: "CheckMissingDir", args: []string{"check", "--data", "/nonexistent/leaseq"}, code: exitFailure, stderr: []string{"leaseq check: no database at /nonexistent/leaseq"}, oneLineEr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			te := newTestEnv(tc.env)
			code := run(context.Background(), tc.args, &te.env)
			require.Equal(t, tc.code, code, "stdout:\n%s\nstderr:\n%s", te.out, te.errOut)
			for _, s := range tc.stdout {
				require.Contains(t, te.out.String(), s)
			}
			for _, s := range tc.stderr {
				require.Contains(t, te.errOut.String(), s)
			}
			if tc.oneLineEr {
				require.Equal(t, 1, strings.Count(te.errOut.String(), "\n"), "stderr: %q", te.errOut)
			}
		})
	}
}

// TestRun_ServeThenCheck runs `serve` on a real RocksDB directory in
// process, stops it with SIGINT through the injected signal channel, then
// runs `check` on the directory it left.
func TestRun_ServeThenCheck(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "data")
	te := newTestEnv(map[string]string{"LEASEQ_SYNC": "none"})
	codes := make(chan int, 1)
	go func() {
		codes <- run(context.Background(), []string{"serve", "--data", dir, "--log-format", "json", "--listen", "unix:" + filepath.Join(filepath.Dir(dir), "s.sock")}, &te.env)
	}()
	var sigc chan<- os.Signal
	select {
	case sigc = <-te.sigs:
	case code := <-codes:
		t.Fatalf("serve exited with %d before handling signals: %s", code, te.errOut)
	case <-time.After(time.Minute):
		t.Fatal("serve never registered for signals")
	}
	rpctest.Eventually(t, time.Minute, func() bool { return strings.Contains(te.errOut.String(), `"msg":"leaseq serving"`) },
		"no startup log: %s", te.errOut)
	require.Contains(t, te.errOut.String(), `"sync":"none"`)
	sigc <- syscall.SIGINT
	select {
	case code := <-codes:
		require.Equal(t, exitOK, code, te.errOut.String())
	case <-time.After(time.Minute):
		t.Fatal("serve did not stop after SIGINT")
	}
	logs := te.errOut.String()
	require.Contains(t, logs, `"msg":"shutting down"`)
	require.Contains(t, logs, `"msg":"sweeper stopped"`)
	require.Contains(t, logs, `"msg":"leaseq stopped"`)
	require.Less(t, strings.Index(logs, "sweeper stopped"), strings.Index(logs, "leaseq stopped"), "sweeper stops before the store closes")

	ce := newTestEnv(nil)
	require.Equal(t, exitOK, run(context.Background(), []string{"check", "--data", dir}, &ce.env), ce.errOut.String())
	require.Contains(t, ce.out.String(), "all invariants hold")
}

// TestRun_SecondSignalExitsAtOnce: while the ordered shutdown after a
// first SIGINT is held up, a second SIGINT exits at once with a non-zero
// code. The env's shutdownStarted hook holds the shutdown until the test
// has seen the exit, so no timing is assumed.
func TestRun_SecondSignalExitsAtOnce(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	te := newTestEnv(map[string]string{"LEASEQ_SYNC": "none"})
	held, release := make(chan struct{}), make(chan struct{})
	te.shutdownStarted = func() {
		close(held)
		<-release
	}
	codes, sigc := startServeUnix(t, te, dir)
	sigc <- syscall.SIGINT
	select {
	case <-held:
	case <-time.After(time.Minute):
		t.Fatalf("shutdown never started: %s", te.errOut)
	}
	select {
	case code := <-te.exits:
		t.Fatalf("exited with %d after one signal", code)
	default:
	}

	sigc <- syscall.SIGINT
	select {
	case code := <-te.exits:
		require.Equal(t, exitFailure, code)
	case <-time.After(time.Minute):
		t.Fatalf("a second signal during a held-up shutdown did not exit: %s", te.errOut)
	}
	require.Contains(t, te.errOut.String(), `"msg":"second signal: exiting without clean shutdown"`)
	require.NotContains(t, te.errOut.String(), `"msg":"leaseq stopped"`, "exit came before the shutdown finished")

	// The injected exit returns, so the held shutdown goes on and closes
	// the store (a real process is gone by now).
	close(release)
	select {
	case code := <-codes:
		require.Equal(t, exitOK, code, te.errOut.String())
	case <-time.After(time.Minute):
		t.Fatal("serve did not finish its shutdown")
	}
}

// TestFDBPrefix: named subspaces are disjoint from each other and from the
// default one, also when one name starts with another; names are checked.
func TestFDBPrefix(t *testing.T) {
	t.Parallel()
	require.Nil(t, fdbPrefix(""), "empty: fdbsync's default prefix")
	require.Equal(t, []byte(fdbsync.DefaultPrefix+"\x02prod\x00"), fdbPrefix("prod"))
	names := []string{"jobs", "jobs2", "job", "a", "a.b", "A-b_9"}
	for _, a := range names {
		_, err := parseSubspace(a)
		require.NoError(t, err)
		pa := fdbPrefix(a)
		require.True(t, bytes.HasPrefix(pa, []byte(fdbsync.DefaultPrefix)))
		// The default subspace's keys are DefaultPrefix + a letter tag.
		require.NotContains(t, "abcdeilnpqrtuwxDPU", string(pa[len(fdbsync.DefaultPrefix)]))
		for _, b := range names {
			if a != b {
				require.False(t, bytes.HasPrefix(fdbPrefix(b), pa), "%q is a prefix of %q", a, b)
			}
		}
	}
	for _, bad := range []string{"a\x00b", "a/b", "a b", strings.Repeat("x", 201)} {
		_, err := parseSubspace(bad)
		require.ErrorContains(t, err, "want a subspace name")
	}
}

// TestRun_EveryCommandHasHelp: `leaseq help NAME` and `leaseq NAME --help`
// explain every command and list each of its flags with a description.
func TestRun_EveryCommandHasHelp(t *testing.T) {
	t.Parallel()
	for _, cmd := range commands {
		if cmd.raw {
			continue // bench prints its harness's own help (TestCLI_Help)
		}
		t.Run(cmd.name, func(t *testing.T) {
			t.Parallel()
			require.NotEmpty(t, strings.TrimSpace(cmd.help))
			require.NotEmpty(t, cmd.summary)
			for _, args := range [][]string{{"help", cmd.name}, {cmd.name, "--help"}} {
				te := newTestEnv(nil)
				require.Equal(t, exitOK, run(context.Background(), args, &te.env), te.errOut.String())
				out := te.out.String()
				require.Contains(t, out, "Usage:\n  leaseq "+cmd.name+" [flags]")
				require.Contains(t, out, strings.TrimSpace(cmd.help))
				fs, _ := newFlagSet(cmd, &te.env)
				fs.VisitAll(func(f *flag.Flag) {
					require.NotEmpty(t, f.Usage, "--%s has no description", f.Name)
					require.Contains(t, out, "-"+f.Name)
				})
			}
		})
	}
}

// startServeUnix runs `leaseq serve` on a unix socket in dir under te and
// returns, once the node handles signals, its exit code's channel and the
// channel its signals go to.
func startServeUnix(t *testing.T, te *testEnv, dir string) (<-chan int, chan<- os.Signal) {
	t.Helper()
	codes := make(chan int, 1)
	go func() {
		codes <- run(context.Background(), []string{"serve", "--data", filepath.Join(dir, "data"), "--log-format", "json",
			"--listen", "unix:" + filepath.Join(dir, "s.sock")}, &te.env)
	}()
	var sigc chan<- os.Signal
	select {
	case sigc = <-te.sigs:
	case code := <-codes:
		t.Fatalf("serve exited with %d before handling signals; stdout:\n%s\nstderr:\n%s", code, te.out, te.errOut)
	case <-time.After(time.Minute):
		t.Fatal("serve never registered for signals")
	}
	// Signals are taken from the start, before the store opens (a signal
	// then ends the startup): wait until the node serves, for the callers
	// test what a signal does to a serving node.
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(te.errOut.String(), `"msg":"leaseq serving"`) && !strings.Contains(te.out.String(), `"msg":"leaseq serving"`) {
		select {
		case code := <-codes:
			t.Fatalf("serve exited with %d before serving; stdout:\n%s\nstderr:\n%s", code, te.out, te.errOut)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve never served; stdout:\n%s\nstderr:\n%s", te.out, te.errOut)
		}
	}
	return codes, sigc
}
