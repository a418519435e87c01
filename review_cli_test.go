package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
)

// TestReviewCLI_WorkMaxItemsSignal: the exit code of `leaseq work
// --max-items N` stopped by a signal before N items were handled (review,
// session 74). A signal ends the run normally (0) unless an item's own
// command failed (3, as --max-items promises to tell); an item killed by
// the stop itself (--drain-timeout) is not a failure of its command: the
// same run without --max-items exits 0 (TestWork/DrainTimeoutKills).
func TestReviewCLI_WorkMaxItemsSignal(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--sync", "none")
	// The command fails on "bad", and on "slow" announces itself and
	// waits for $OUT/release (or is killed).
	const body = `
p=$(cat)
case "$p" in
bad) echo "bad item" >&2; exit 1 ;;
slow)
	touch "$OUT/started"
	while [ ! -e "$OUT/release" ]; do sleep 0.05; done ;;
esac
`
	// startedWork waits until leaseq work handles signals (its first log
	// line is written after they are set up).
	startedWork := func(t *testing.T, dir string, args ...string) *workRun {
		t.Helper()
		job := script(t, dir, "job.sh", body)
		w := n.startWork(t, []string{"OUT=" + dir}, append(args, "--", job)...)
		rpctest.Eventually(t, 30*time.Second, func() bool { return strings.Contains(w.stderr.String(), "leaseq work started") },
			"leaseq work never started")
		return w
	}
	stopped := func(t *testing.T, w *workRun) {
		t.Helper()
		rpctest.Eventually(t, 30*time.Second, func() bool { return strings.Contains(w.stderr.String(), "stopping: no new items") },
			"the signal was not handled")
	}

	t.Run("BeforeAnyItemExits0", func(t *testing.T) {
		t.Parallel()
		w := startedWork(t, t.TempDir(), "sig0q", "--max-items", "3")
		w.signal(syscall.SIGTERM)
		require.Equal(t, exitOK, w.wait(time.Minute), w.stderr.String())
	})

	t.Run("AllSucceededExits0", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		n.cli("enqueue", "sig1q", "ok")
		n.cli("enqueue", "sig1q", "slow")
		n.cli("enqueue", "sig1q", "left")
		w := startedWork(t, dir, "sig1q", "--max-items", "5")
		waitExists(t, filepath.Join(dir, "started"))
		w.signal(syscall.SIGTERM)
		stopped(t, w)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "release"), nil, 0o644))
		require.Equal(t, exitOK, w.wait(time.Minute), w.stderr.String())
		require.Equal(t, queueStats{Ready: 1, Enqueued: 3, Delivered: 2, Acked: 2}, n.stats("sig1q"))
	})

	t.Run("FailureBeforeTheSignalExits3", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		n.cli("enqueue", "sig2q", "bad")
		n.cli("enqueue", "sig2q", "slow")
		n.cli("enqueue", "sig2q", "left")
		w := startedWork(t, dir, "sig2q", "--max-items", "5")
		waitExists(t, filepath.Join(dir, "started"))
		w.signal(syscall.SIGTERM)
		stopped(t, w)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "release"), nil, 0o644))
		require.Equal(t, exitItemsFailed, w.wait(time.Minute), w.stderr.String())
		require.Contains(t, w.stderr.String(), "leaseq work: 1 of 2 items failed (nacked)\n")
	})

	t.Run("DrainTimeoutKillIsNotAFailure", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		n.cli("enqueue", "sig3q", "slow")
		w := startedWork(t, dir, "sig3q", "--max-items", "2", "--drain-timeout", "200ms", "--kill-grace", "1m")
		waitExists(t, filepath.Join(dir, "started"))
		w.signal(syscall.SIGTERM)
		require.Equal(t, exitOK, w.wait(time.Minute), "the stop killed the item, its command did not fail: %s", w.stderr)
		require.Contains(t, w.stderr.String(), `msg="drain timeout: killing the running commands"`)
		it := n.peekOne("sig3q")
		require.True(t, strings.HasPrefix(it.LastError, "interrupted: leaseq work stopped and its --drain-timeout ran out"), it.LastError)
	})

	t.Run("DrainTimeoutKillAfterAFailureExits3", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		n.cli("enqueue", "sig4q", "bad")
		n.cli("enqueue", "sig4q", "slow")
		w := startedWork(t, dir, "sig4q", "--max-items", "5", "--drain-timeout", "200ms", "--kill-grace", "1m")
		waitExists(t, filepath.Join(dir, "started"))
		w.signal(syscall.SIGTERM)
		require.Equal(t, exitItemsFailed, w.wait(time.Minute), w.stderr.String())
		require.Contains(t, w.stderr.String(), "leaseq work: 1 of 2 items failed (nacked); 1 more was interrupted by the stop and nacked for redelivery\n")
	})
}

// TestReviewCLI_StalledNodeBoundedByTimeout: a node that answered the
// dial and then stalled. Every client command gives up after --timeout
// with one line saying so, exit 1.
func TestReviewCLI_StalledNodeBoundedByTimeout(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--sync", "none")
	addr := stallProxy(t, n.addr)
	lease := "0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name  string
		args  []string
		stdin string
	}{
		{"Enqueue", []string{"enqueue", "q", "x"}, ""},
		{"EnqueueLines", []string{"enqueue", "q", "--lines"}, "a\nb\n"},
		{"Poll", []string{"poll", "q"}, ""},
		{"PollWait", []string{"poll", "q", "--wait", "1s"}, ""},
		{"Ack", []string{"ack", "q", lease, lease}, ""},
		{"AckStdin", []string{"ack", "q", "-"}, `{"id":"` + lease + `","lease":"` + lease + `"}`},
		{"Nack", []string{"nack", "q", lease, lease, "--delay", "0"}, ""},
		{"Extend", []string{"extend", "q", lease}, ""},
		{"ExtendLease", []string{"extend", "q", lease, "--lease", "1m"}, ""},
		{"Stats", []string{"stats"}, ""},
		{"Queues", []string{"queues"}, ""},
		{"Peek", []string{"peek", "q"}, ""},
		{"Purge", []string{"purge", "q"}, ""},
		{"DlqLs", []string{"dlq", "ls", "q"}, ""},
		{"DlqRedriveAll", []string{"dlq", "redrive", "q", "--all"}, ""},
		{"DlqPurgeIDs", []string{"dlq", "purge", "q", lease}, ""},
		{"Config", []string{"config", "q"}, ""},
		{"ConfigSet", []string{"config", "q", "--max-attempts", "3"}, ""},
		{"QueueDelete", []string{"queue", "delete", "q"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, []string{"LEASEQ_ADDR=" + addr, "LEASEQ_TIMEOUT=1s"}, tc.stdin, tc.args...)
			require.Equal(t, exitFailure, r.code, "stdout %q stderr %q", r.stdout, r.stderr)
			require.Contains(t, r.stderr, "no answer from "+addr+" within ")
			require.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line: %q", r.stderr)
		})
	}
}

// silentListener accepts unix connections and never answers: a node
// that stalled before the dial's bootstrap was answered.
func silentListener(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "silent.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	return "unix:" + sock
}

// TestReviewCLI_DialBoundedByTimeoutNotWait: poll's --wait is how long the
// node may hold the poll, not more time to connect. Connecting to a node
// that never answers took --timeout plus --wait, while the error said
// "within --timeout" (found by review, session 74).
func TestReviewCLI_DialBoundedByTimeoutNotWait(t *testing.T) {
	t.Parallel()
	addr := silentListener(t)
	start := time.Now()
	r := runCLI(t, nil, "", "poll", "q", "--addr", addr, "--timeout", "1s", "--wait", "50s")
	elapsed := time.Since(start)
	require.Equal(t, exitFailure, r.code, r.stderr)
	require.Equal(t, "leaseq poll: cannot reach a leaseq node at "+addr+" within 1s (is 'leaseq serve' running there?)\n", r.stderr)
	require.Less(t, elapsed, 30*time.Second, "gave up after --timeout, not --timeout plus --wait")
}

// TestReviewCLI_BadNumbers: numbers and durations that do not parse are a
// bad command line (exit 2) whose one line says what is wanted, from a
// flag or from the environment.
func TestReviewCLI_BadNumbers(t *testing.T) {
	t.Parallel()
	lease := "0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"TimeoutWithoutUnit", nil, []string{"poll", "q", "--timeout", "10"}, `leaseq poll: invalid value "10" for flag -timeout: want a positive duration such as 500ms or 30s, got "10"`},
		{"TimeoutZero", nil, []string{"stats", "--timeout", "0"}, `want a positive duration such as 500ms or 30s, got "0"`},
		{"TimeoutNegative", nil, []string{"queues", "--timeout", "-1s"}, `want a positive duration such as 500ms or 30s, got "-1s"`},
		{"TimeoutFromEnv", []string{"LEASEQ_TIMEOUT=soon"}, []string{"queues"}, `environment LEASEQ_TIMEOUT="soon": want a positive duration such as 500ms or 30s, got "soon"`},
		{"PollLeaseWithoutUnit", nil, []string{"poll", "q", "--lease", "5"}, `want a duration >= 0 such as 0, 500ms or 30s, got "5"`},
		{"PollNegativeN", nil, []string{"poll", "q", "-n", "-3"}, "-n must be positive, got -3"},
		{"PollNMissingValue", nil, []string{"poll", "q", "-n"}, "flag needs an argument: -n"},
		{"PeekNZero", nil, []string{"peek", "q", "-n", "0"}, "-n must be positive, got 0"},
		{"PeekBadAfter", nil, []string{"peek", "q", "--after", "zz"}, `bad --after id "zz": want 32 hex digits`},
		{"NackDelayWithoutUnit", nil, []string{"nack", "q", lease, lease, "--delay", "5"}, `want a duration >= 0 such as 0, 500ms or 30s, got "5"`},
		{"ExtendNegativeLease", nil, []string{"extend", "q", lease, "--lease", "-1s"}, `want a duration >= 0`},
		{"EnqueueNegativeDelay", nil, []string{"enqueue", "q", "x", "--delay", "-1s"}, `want a duration >= 0`},
		{"EnqueueMaxAttemptsOverflow", nil, []string{"enqueue", "q", "x", "--max-attempts", "4294967296"}, "want an integer from 0 to 2147483647"},
		{"ConfigZeroMaxAttempts", nil, []string{"config", "q", "--max-attempts", "0"}, "want an integer from 1 to 2147483647"},
		{"ConfigZeroLease", nil, []string{"config", "q", "--lease", "0"}, `want a positive duration such as 500ms or 30s, got "0"`},
		{"WorkKillGraceZero", nil, []string{"work", "q", "--kill-grace", "0", "--", "true"}, `-kill-grace: want a positive duration`},
		{"WorkDrainNegative", nil, []string{"work", "q", "--drain-timeout", "-1s", "--", "true"}, `-drain-timeout: want a duration >= 0`},
		{"WorkConcurrencyFromEnv", []string{"LEASEQ_CONCURRENCY=lots"}, []string{"work", "q", "--", "true"}, `environment LEASEQ_CONCURRENCY="lots": want an integer from 1 to 1000`},
		{"WorkRetryDelayOver100Years", nil, []string{"work", "q", "--retry-delay", "900000h", "--", "true"}, "--retry-delay 900000h0m0s is over"},
		{"DlqRedriveNoIDs", nil, []string{"dlq", "redrive", "q"}, "dlq redrive: give either ids or --all"},
		{"DlqPurgeWithN", nil, []string{"dlq", "purge", "q", "--all", "-n", "5"}, "dlq purge takes ids or --all, not -n"},
		{"QueueUnknownSub", nil, []string{"queue", "rm", "q"}, `unknown sub-command "rm": want delete`},
		{"AckStdinGarbage", nil, []string{"ack", "q", "-"}, "stdin: want poll's JSON lines"},
		{"EnqueueLinesWithKey", nil, []string{"enqueue", "q", "--lines", "--key", "k"}, "--key applies to one item"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// No node: a bad command line is refused before connecting.
			env := append([]string{"LEASEQ_ADDR=unix:/nonexistent/leaseq.sock"}, tc.env...)
			stdin := ""
			if tc.name == "AckStdinGarbage" {
				stdin = "garbage\n"
			}
			r := runCLI(t, env, stdin, tc.args...)
			require.Equal(t, exitUsage, r.code, "stdout %q stderr %q", r.stdout, r.stderr)
			require.Contains(t, r.stderr, tc.want)
			require.Equal(t, 1, strings.Count(r.stderr, "\n"), "one line: %q", r.stderr)
			require.Empty(t, r.stdout)
		})
	}
}

// TestReviewCLI_DialDeadlineOnTheSocketIsNotAHangUp: the dial sets the
// socket's deadline from its ctx's, so a node that never answers can end
// the dial with a read's "i/o timeout" just before ctx ends. That is the
// node not answering within --timeout, not a node that closed the
// connection (found in CI, session 74, as a flake of
// TestReviewCLI_DialBoundedByTimeoutNotWait under load).
func TestReviewCLI_DialDeadlineOnTheSocketIsNotAHangUp(t *testing.T) {
	t.Parallel()
	addr, timeout := "unix:/tmp/x.sock", time.Second
	cf := &clientFlags{addr: &addr, timeout: &timeout}
	read := &net.OpError{Op: "raw-read", Net: "unix", Err: os.ErrDeadlineExceeded}
	err := cf.dialError(nil, fmt.Errorf("rpc: dial %s: %w", addr, fmt.Errorf("rpc: bootstrap: %w", read)))
	require.EqualError(t, err, "cannot reach a leaseq node at unix:/tmp/x.sock within 1s (is 'leaseq serve' running there?)")
}
