package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// workRun is a `leaseq work` process owned by one test.
type workRun struct {
	t              *testing.T
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	exited         chan struct{}
}

// startWork runs `leaseq work ARGS...` against the node, with env added
// to a clean environment (the children inherit it).
func (n *node) startWork(t *testing.T, env []string, args ...string) *workRun {
	t.Helper()
	w := &workRun{t: t, stdout: &syncBuffer{}, stderr: &syncBuffer{}, exited: make(chan struct{})}
	w.cmd = exec.Command(leaseqBin, append([]string{"work"}, args...)...)
	w.cmd.Env = cleanEnv(append([]string{"LEASEQ_ADDR=" + n.addr}, env...)...)
	w.cmd.Stdout, w.cmd.Stderr = w.stdout, w.stderr
	// A child killed with leaseq work (on a failed test) may hold the
	// output pipes.
	w.cmd.WaitDelay = 5 * time.Second
	require.NoError(t, w.cmd.Start())
	go func() {
		_ = w.cmd.Wait()
		close(w.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-w.exited:
		default:
			_ = w.cmd.Process.Kill()
			<-w.exited
		}
		if t.Failed() {
			t.Logf("leaseq work stdout:\n%s\nstderr:\n%s", w.stdout, w.stderr)
		}
	})
	return w
}

// wait waits for the process to exit and returns its exit code.
func (w *workRun) wait(timeout time.Duration) int {
	w.t.Helper()
	select {
	case <-w.exited:
	case <-time.After(timeout):
		w.t.Fatalf("leaseq work did not exit within %v:\nstdout:\n%s\nstderr:\n%s", timeout, w.stdout, w.stderr)
	}
	return w.cmd.ProcessState.ExitCode()
}

func (w *workRun) signal(sig os.Signal) {
	w.t.Helper()
	require.NoError(w.t, w.cmd.Process.Signal(sig))
}

// script writes an executable sh script into dir and returns its path.
func script(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755))
	return p
}

// waitFile waits for path to exist and returns its contents.
func waitFile(t *testing.T, path string) string {
	t.Helper()
	var b []byte
	rpctest.Eventually(t, 30*time.Second, func() bool {
		var err error
		b, err = os.ReadFile(path)
		return err == nil && len(b) > 0
	}, "%s never appeared", path)
	return string(b)
}

// readPID reads a pid written by a script.
func readPID(t *testing.T, path string) int {
	t.Helper()
	pid, err := strconv.Atoi(strings.TrimSpace(waitFile(t, path)))
	require.NoError(t, err)
	return pid
}

// processGone reports whether pid has exited (a zombie waiting to be
// reaped by init counts as gone).
func processGone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')') // comm may hold spaces; the state follows it
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// peekOne returns the one item of queue (ready, delayed or dead ones
// through dlq ls when dead).
func (n *node) peekOne(queue string) polled {
	n.t.Helper()
	items := parsePolled(n.t, n.cli("peek", queue))
	require.Len(n.t, items, 1)
	return items[0]
}

// TestWork runs `leaseq work` as a real process against a real node, with
// sh scripts as the commands. One node serves every subtest, each on a
// queue of its own.
func TestWork(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--sync", "none")

	t.Run("AckEnvStdinAndMaxItems", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		job := script(t, dir, "job.sh", `
cat > "$OUT/$LEASEQ_ID.stdin"
env | grep '^LEASEQ_' | sort > "$OUT/$LEASEQ_ID.env"
echo "stdout of $LEASEQ_ID"
`)
		// The first item was delivered once already and nacked.
		first := strings.TrimSpace(n.cli("enqueue", "envq", "first").stdout)
		p := parsePolled(t, n.cli("poll", "envq"))[0]
		n.cli("nack", "envq", p.Lease, first, "--delay", "0", "--reason", "db down")
		binary := "two\nlines\x00and a NUL"
		r := runCLI(t, []string{"LEASEQ_ADDR=" + n.addr}, binary, "enqueue", "envq", "-")
		require.Equal(t, 0, r.code, r.stderr)
		second := strings.TrimSpace(r.stdout)
		third := strings.TrimSpace(n.cli("enqueue", "envq", "left for later").stdout)
		enqueuedAt := map[string]string{}
		for _, it := range parsePolled(t, n.cli("peek", "envq")) {
			enqueuedAt[it.ID] = it.EnqueuedAt
		}

		before := time.Now()
		w := n.startWork(t, []string{"OUT=" + dir}, "envq", "--lease", "1m", "--max-items", "2", "--", job)
		require.Equal(t, exitOK, w.wait(time.Minute), w.stderr.String())

		require.Equal(t, "first", waitFile(t, filepath.Join(dir, first+".stdin")))
		require.Equal(t, binary, waitFile(t, filepath.Join(dir, second+".stdin")))
		for id, want := range map[string]map[string]string{
			first:  {"LEASEQ_ATTEMPTS": "2", "LEASEQ_LAST_ERROR": "db down"},
			second: {"LEASEQ_ATTEMPTS": "1", "LEASEQ_LAST_ERROR": ""},
		} {
			env := map[string]string{}
			for _, l := range strings.Split(strings.TrimSpace(waitFile(t, filepath.Join(dir, id+".env"))), "\n") {
				k, v, _ := strings.Cut(l, "=")
				env[k] = v
			}
			require.Equal(t, "envq", env["LEASEQ_QUEUE"])
			require.Equal(t, id, env["LEASEQ_ID"])
			require.Equal(t, want["LEASEQ_ATTEMPTS"], env["LEASEQ_ATTEMPTS"])
			require.Equal(t, want["LEASEQ_LAST_ERROR"], env["LEASEQ_LAST_ERROR"])
			require.Equal(t, enqueuedAt[id], env["LEASEQ_ENQUEUED_AT"], "as the CLI prints it")
			exp, err := time.Parse(timeFormat, env["LEASEQ_LEASE_EXPIRES_AT"])
			require.NoError(t, err, "RFC 3339 with ms: %q", env["LEASEQ_LEASE_EXPIRES_AT"])
			require.WithinRange(t, exp, before.Add(time.Minute-time.Second), time.Now().Add(time.Minute+time.Second))
			require.Equal(t, n.addr, env["LEASEQ_ADDR"], "leaseq work's environment is passed on")
			require.Len(t, env, 7, "%v", env)
		}
		// Alone, CMD's output passes through unprefixed.
		require.Equal(t, "stdout of "+first+"\nstdout of "+second+"\n", w.stdout.String())
		s := n.stats("envq")
		require.Equal(t, uint64(3), s.Acked+s.Nacked, "the CLI's nack, then two acks")
		require.Equal(t, uint64(2), s.Acked)
		require.Equal(t, int64(1), s.Ready, "--max-items 2 left the third item")
		require.Equal(t, third, n.peekOne("envq").ID)
	})

	t.Run("FailureNacksWithStderrTailAndDeadLetters", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		job := script(t, dir, "fail.sh", `
head -c 3000 /dev/zero | tr '\0' x >&2
printf '\ndisk full on attempt %s\n' "$LEASEQ_ATTEMPTS" >&2
exit 3
`)
		n.cli("config", "failq", "--max-attempts", "2", "--backoff-base", "10ms", "--backoff-max", "20ms")
		n.cli("enqueue", "failq", "p")
		w := n.startWork(t, nil, "failq", "--max-items", "2", "--", job)
		require.Equal(t, exitItemsFailed, w.wait(time.Minute))
		require.Contains(t, w.stderr.String(), "leaseq work: 2 of 2 items failed (nacked)\n")
		require.Contains(t, w.stderr.String(), "disk full on attempt 1\n", "stderr passes through")

		dead := parsePolled(t, n.cli("dlq", "ls", "failq"))
		require.Len(t, dead, 1)
		require.Equal(t, 2, dead[0].Attempts)
		prefix := "nack: exit status 3: "
		require.True(t, strings.HasPrefix(dead[0].Reason, prefix), dead[0].Reason)
		require.True(t, strings.HasSuffix(dead[0].Reason, "xxx\ndisk full on attempt 2"), dead[0].Reason)
		tail := len(dead[0].Reason) - len(prefix)
		require.LessOrEqual(t, tail, 1024, "the last 1 KiB of stderr")
		require.GreaterOrEqual(t, tail, 1000)
		require.Equal(t, queueStats{Dead: 1, Enqueued: 1, Delivered: 2, Nacked: 2, DeadLettered: 1}, n.stats("failq"))
	})

	t.Run("TimeoutKillsProcessGroup", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		// Exits on SIGTERM: settled at once, not after the 30 s grace.
		polite := script(t, dir, "polite.sh", `
sleep 60 &
echo $! > "$OUT/polite.grandchild"
echo working >&2
wait
`)
		// Ignores SIGTERM, and so does its background job (an ignored
		// signal stays ignored across exec): only SIGKILL ends them.
		stubborn := script(t, dir, "stubborn.sh", `
trap '' TERM
sleep 60 &
echo $! > "$OUT/stubborn.grandchild"
wait
sleep 60
`)
		for _, tc := range []struct {
			name, job, grace string
			minTime          time.Duration
		}{
			{"polite", polite, "30s", 500 * time.Millisecond},
			{"stubborn", stubborn, "300ms", 800 * time.Millisecond},
		} {
			queue := "timeout-" + tc.name
			n.cli("enqueue", queue, "x")
			start := time.Now()
			w := n.startWork(t, []string{"OUT=" + dir}, queue, "--max-items", "1", "--timeout", "500ms", "--kill-grace", tc.grace, "--", tc.job)
			grandchild := readPID(t, filepath.Join(dir, tc.name+".grandchild"))
			require.False(t, processGone(grandchild), "the background job runs")
			require.Equal(t, exitItemsFailed, w.wait(time.Minute), tc.name)
			elapsed := time.Since(start)
			require.GreaterOrEqual(t, elapsed, tc.minTime, tc.name)
			require.Less(t, elapsed, 20*time.Second, "%s: a group gone on SIGTERM is not waited for", tc.name)
			rpctest.Eventually(t, 10*time.Second, func() bool { return processGone(grandchild) }, "%s: the background job %d survived", tc.name, grandchild)

			it := n.peekOne(queue)
			require.Equal(t, 1, it.Attempts)
			require.True(t, strings.HasPrefix(it.LastError, "timed out after 500ms (process group killed)"), it.LastError)
			if tc.name == "polite" {
				require.Equal(t, "timed out after 500ms (process group killed): working", it.LastError, "with the stderr tail")
			}
			require.Equal(t, queueStats{Ready: 1, Enqueued: 1, Delivered: 1, Nacked: 1}, withoutDelayed(n.stats(queue)))
		}
	})

	t.Run("ExtendsLeaseOfLongJob", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		job := script(t, dir, "long.sh", "sleep 2.5\n")
		n.cli("enqueue", "longq", "x")
		w := n.startWork(t, nil, "longq", "--lease", "1s", "--max-items", "1", "--", job)
		require.Equal(t, exitOK, w.wait(time.Minute), w.stderr.String())
		// 2.5 s on a 1 s lease: without the extends it would have expired
		// and been delivered again.
		require.Equal(t, queueStats{Enqueued: 1, Delivered: 1, Acked: 1}, n.stats("longq"))
	})

	t.Run("DrainOnSIGTERM", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		job := script(t, dir, "drain.sh", `
touch "$OUT/started.$LEASEQ_ID"
sleep 1
echo "finished $(cat)"
`)
		first := strings.TrimSpace(n.cli("enqueue", "drainq", "one").stdout)
		w := n.startWork(t, []string{"OUT=" + dir}, "drainq", "--", job)
		waitExists(t, filepath.Join(dir, "started."+first))
		n.cli("enqueue", "drainq", "two") // arrives while the first runs; not taken
		w.signal(syscall.SIGTERM)
		require.Equal(t, exitOK, w.wait(time.Minute), w.stderr.String())
		require.Equal(t, "finished one\n", w.stdout.String())
		require.Contains(t, w.stderr.String(), `msg="stopping: no new items, waiting for the running ones" svc=work queue=drainq signal=terminated running=1`)
		require.Equal(t, queueStats{Ready: 1, Enqueued: 2, Delivered: 1, Acked: 1}, n.stats("drainq"))
	})

	t.Run("SecondSignalKills", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		job := script(t, dir, "hang.sh", `
sleep 60 &
echo $! > "$OUT/grandchild"
wait
`)
		n.cli("enqueue", "killq", "x")
		w := n.startWork(t, []string{"OUT=" + dir}, "killq", "--kill-grace", "1m", "--", job)
		grandchild := readPID(t, filepath.Join(dir, "grandchild"))
		w.signal(syscall.SIGINT)
		rpctest.Eventually(t, 30*time.Second, func() bool { return strings.Contains(w.stderr.String(), "stopping: no new items") },
			"first signal not handled")
		select {
		case <-w.exited:
			t.Fatal("leaseq work exited on the first signal with a job running")
		default:
		}
		require.False(t, processGone(grandchild), "the first signal lets the job run")
		start := time.Now()
		w.signal(syscall.SIGINT)
		require.Equal(t, exitFailure, w.wait(time.Minute))
		require.Less(t, time.Since(start), 30*time.Second, "SIGKILL at once, not after --kill-grace")
		require.Contains(t, w.stderr.String(), "leaseq work: stopped by a second signal (1 items handled, 1 failed)\n")
		rpctest.Eventually(t, 10*time.Second, func() bool { return processGone(grandchild) }, "the job's background process %d survived", grandchild)
		it := n.peekOne("killq")
		require.Equal(t, "interrupted: leaseq work got a second signal (process group killed)", it.LastError)
		require.Equal(t, queueStats{Ready: 1, Enqueued: 1, Delivered: 1, Nacked: 1}, n.stats("killq"), "nacked for redelivery at once")
	})

	t.Run("DrainTimeoutKills", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		job := script(t, dir, "hang.sh", `
sleep 60 &
echo $! > "$OUT/grandchild"
echo "still busy" >&2
wait
`)
		n.cli("enqueue", "drainkillq", "x")
		w := n.startWork(t, []string{"OUT=" + dir}, "drainkillq", "--drain-timeout", "300ms", "--kill-grace", "1m", "--", job)
		grandchild := readPID(t, filepath.Join(dir, "grandchild"))
		w.signal(syscall.SIGTERM)
		require.Equal(t, exitOK, w.wait(time.Minute), "a drain that ran out still ends the run normally")
		require.Contains(t, w.stderr.String(), `msg="drain timeout: killing the running commands"`)
		rpctest.Eventually(t, 10*time.Second, func() bool { return processGone(grandchild) }, "the job's background process %d survived", grandchild)
		it := n.peekOne("drainkillq")
		require.Equal(t, "interrupted: leaseq work stopped and its --drain-timeout ran out (process group killed): still busy", it.LastError)
		require.Equal(t, queueStats{Ready: 1, Enqueued: 1, Delivered: 1, Nacked: 1}, n.stats("drainkillq"), "nacked for redelivery at once")
	})

	t.Run("LostLeaseKillsCommand", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		// The first delivery hangs; the second succeeds.
		job := script(t, dir, "once.sh", `
if [ "$LEASEQ_ATTEMPTS" = 1 ]; then
	sleep 60 &
	echo $! > "$OUT/grandchild"
	wait
fi
`)
		n.cli("enqueue", "lostq", "x")
		w := n.startWork(t, []string{"OUT=" + dir}, "lostq", "--lease", "500ms", "--kill-grace", "1m", "--max-items", "2", "--", job)
		grandchild := readPID(t, filepath.Join(dir, "grandchild"))
		// Frozen past its lease, leaseq work cannot extend: the node
		// expires the lease, the next extend finds it gone, and leaseq
		// work kills the job rather than let it run on beside a
		// redelivery.
		w.signal(syscall.SIGSTOP)
		rpctest.Eventually(t, 30*time.Second, func() bool { return n.stats("lostq").Expired == 1 }, "the lease never expired")
		w.signal(syscall.SIGCONT)
		require.Equal(t, exitItemsFailed, w.wait(time.Minute), "the first delivery counts as failed")
		rpctest.Eventually(t, 10*time.Second, func() bool { return processGone(grandchild) }, "the job's background process %d survived", grandchild)
		require.Contains(t, w.stderr.String(), `outcome="lease lost (the item will be delivered again) (process group killed)"`)
		s := n.stats("lostq")
		require.Equal(t, uint64(1), s.Expired, "the first lease ran out")
		require.Equal(t, uint64(2), s.Delivered)
		require.Equal(t, uint64(1), s.Acked, "the redelivery ran and was acked")
	})

	t.Run("TempFailUsesRetryDelay", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		job := script(t, dir, "temp.sh", `
case "$(cat)" in
temp) echo "busy, later" >&2; exit 75 ;;
*) echo "broken" >&2; exit 1 ;;
esac
`)
		n.cli("enqueue", "tempq", "temp")
		n.cli("enqueue", "tempq", "fail")
		before := time.Now()
		w := n.startWork(t, nil, "tempq", "--max-items", "2", "--retry-delay", "1h", "--", job)
		require.Equal(t, exitItemsFailed, w.wait(time.Minute))
		items := map[string]polled{}
		for _, it := range parsePolled(t, n.cli("peek", "tempq")) {
			items[string(it.Payload)] = it
		}
		require.Equal(t, "exit status 75 (EX_TEMPFAIL): busy, later", items["temp"].LastError)
		require.WithinRange(t, visibleAt(t, items["temp"]), before.Add(time.Hour-time.Second), time.Now().Add(time.Hour+time.Second))
		require.Equal(t, "exit status 1: broken", items["fail"].LastError)
		require.True(t, visibleAt(t, items["fail"]).Before(time.Now().Add(time.Minute)), "other failures use the queue's backoff (at most 30 s)")
	})

	t.Run("ConcurrencyBoundAndPrefixedLines", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		require.NoError(t, os.Mkdir(filepath.Join(dir, "active"), 0o755))
		job := script(t, dir, "par.sh", `
touch "$OUT/active/$LEASEQ_ID"
ls "$OUT/active" | wc -l >> "$OUT/counts"
printf 'half a line from %s' "$LEASEQ_ID"
sleep 0.3
printf ', then the rest\n'
echo "to stderr from $LEASEQ_ID" >&2
rm "$OUT/active/$LEASEQ_ID"
`)
		for i := range 9 {
			n.cli("enqueue", "parq", strconv.Itoa(i))
		}
		w := n.startWork(t, []string{"OUT=" + dir}, "parq", "--concurrency", "3", "--max-items", "9", "--", job)
		require.Equal(t, exitOK, w.wait(time.Minute), w.stderr.String())
		var counts []int
		for _, l := range strings.Fields(waitFile(t, filepath.Join(dir, "counts"))) {
			c, err := strconv.Atoi(l)
			require.NoError(t, err)
			counts = append(counts, c)
		}
		require.Len(t, counts, 9)
		require.LessOrEqual(t, slices.Max(counts), 3, "never more than --concurrency children: %v", counts)
		require.GreaterOrEqual(t, slices.Max(counts), 2, "children ran in parallel: %v", counts)

		lines := strings.Split(strings.TrimSuffix(w.stdout.String(), "\n"), "\n")
		require.Len(t, lines, 9)
		re := regexp.MustCompile(`^\[([0-9a-f]{32})\] half a line from ([0-9a-f]{32}), then the rest$`)
		for _, l := range lines {
			m := re.FindStringSubmatch(l)
			require.NotNil(t, m, "line %q", l)
			require.Equal(t, m[1], m[2], "prefixed with its own item's id")
		}
		require.Regexp(t, `(?m)^\[[0-9a-f]{32}\] to stderr from [0-9a-f]{32}$`, w.stderr.String())
		require.Equal(t, uint64(9), n.stats("parq").Acked)
	})
}

// waitExists waits for a marker file to exist.
func waitExists(t *testing.T, path string) {
	t.Helper()
	rpctest.Eventually(t, 30*time.Second, func() bool {
		_, err := os.Stat(path)
		return err == nil
	}, "%s never appeared", path)
}

// withoutDelayed folds delayed items into ready: whether a nacked item is
// still in its backoff depends on timing.
func withoutDelayed(s queueStats) queueStats {
	s.Ready += s.Delayed
	s.Delayed = 0
	return s
}

func visibleAt(t *testing.T, p polled) time.Time {
	t.Helper()
	v, err := time.Parse(timeFormat, p.VisibleAt)
	require.NoError(t, err)
	return v
}

// TestWork_Usage: bad command lines fail with one clear line and exit
// code 2, before connecting; help documents the environment and exit codes.
func TestWork_Usage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"NoDash", []string{"work", "q", "true"}, exitUsage, `leaseq work: missing "--" before the command: want QUEUE -- CMD [ARGS...]`},
		{"NoDashCommandFlags", []string{"work", "q", "sh", "-c", "true"}, exitUsage, `leaseq work: missing "--" before the command (flag provided but not defined: -c): want QUEUE -- CMD [ARGS...]`},
		{"NoCommand", []string{"work", "q", "--"}, exitUsage, `leaseq work: missing the command after "--"`},
		{"NoQueue", []string{"work", "--", "true"}, exitUsage, "leaseq work: missing arguments: want QUEUE -- CMD [ARGS...]"},
		{"ExtraArg", []string{"work", "q", "x", "--", "true"}, exitUsage, `leaseq work: unexpected argument "x"`},
		{"UnknownCommand", []string{"work", "q", "--", "no-such-program-leaseq"}, exitUsage, `leaseq work: cannot run "no-such-program-leaseq": executable file not found in $PATH`},
		{"BadConcurrency", []string{"work", "q", "--concurrency", "0", "--", "true"}, exitUsage, "-concurrency: want an integer from 1 to 1000"},
		{"BadTimeout", []string{"work", "q", "--timeout", "soon", "--", "true"}, exitUsage, "-timeout: want a duration >= 0"},
		{"BadLease", []string{"work", "q", "--lease", "0s", "--", "true"}, exitUsage, "-lease: want a positive duration"},
		{"BadMaxItems", []string{"work", "q", "--max-items", "-1", "--", "true"}, exitUsage, "-max-items: want an integer from 0"},
		{"FlagAfterDashIsCommands", []string{"work", "q", "--", "no-such-program-leaseq", "--concurrency", "0"}, exitUsage, `cannot run "no-such-program-leaseq"`},
		{"NoNode", []string{"work", "q", "--addr", "unix:/nonexistent/leaseq.sock", "--", "true"}, exitFailure, "leaseq work: cannot connect to a leaseq node at unix:/nonexistent/leaseq.sock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			te := newTestEnv(nil)
			require.Equal(t, tc.code, run(context.Background(), tc.args, &te.env), te.errOut.String())
			require.Contains(t, te.errOut.String(), tc.stderr)
			require.Equal(t, 1, strings.Count(te.errOut.String(), "\n"), "one line: %q", te.errOut)
		})
	}

	te := newTestEnv(nil)
	require.Equal(t, exitOK, run(context.Background(), []string{"work", "--help"}, &te.env))
	help := te.out.String()
	for _, s := range []string{
		"leaseq work [flags] QUEUE -- CMD [ARGS...]",
		"LEASEQ_QUEUE", "LEASEQ_ID", "LEASEQ_ATTEMPTS", "LEASEQ_ENQUEUED_AT", "LEASEQ_LAST_ERROR", "LEASEQ_LEASE_EXPIRES_AT",
		"RFC 3339", "Exit codes", "EX_TEMPFAIL",
		"--timeout duration", "[command line only]", "--concurrency items", "[LEASEQ_CONCURRENCY]",
	} {
		require.Contains(t, help, s)
	}
	require.NotContains(t, help, "LEASEQ_TIMEOUT]", "--timeout is per item here: a LEASEQ_TIMEOUT meant for other commands must not apply")
}

// TestWork_CommandLineOnlyFlags: LEASEQ_TIMEOUT, which bounds a call of
// the other client commands, is not read as work's per-item --timeout, nor
// are LEASEQ_MAX_ITEMS and LEASEQ_RETRY_DELAY; the connection flags are
// read from the environment.
func TestWork_CommandLineOnlyFlags(t *testing.T) {
	t.Parallel()
	te := newTestEnv(map[string]string{
		"LEASEQ_TIMEOUT": "garbage", "LEASEQ_MAX_ITEMS": "garbage", "LEASEQ_RETRY_DELAY": "garbage",
		"LEASEQ_ADDR": "unix:/nonexistent/leaseq.sock",
	})
	require.Equal(t, exitFailure, run(context.Background(), []string{"work", "q", "--", "true"}, &te.env), te.errOut.String())
	require.Contains(t, te.errOut.String(), "cannot connect to a leaseq node at unix:/nonexistent/leaseq.sock")

	te = newTestEnv(map[string]string{"LEASEQ_CONCURRENCY": "0"})
	require.Equal(t, exitUsage, run(context.Background(), []string{"work", "q", "--", "true"}, &te.env))
	require.Contains(t, te.errOut.String(), `environment LEASEQ_CONCURRENCY="0"`)
}

// TestWork_EnvNames: the variables set for CMD are none of the variables
// that set a flag of some command, so a leaseq command CMD runs is not
// changed by them.
func TestWork_EnvNames(t *testing.T) {
	t.Parallel()
	vars := childEnv("q", storage.Item{}, rpc.HandlerLease{})
	require.Len(t, vars, 6)
	for _, cmd := range commands {
		fs, _ := newFlagSet(cmd, &newTestEnv(nil).env)
		fs.VisitAll(func(f *flag.Flag) {
			for _, kv := range vars {
				name, _, _ := strings.Cut(kv, "=")
				require.NotEqual(t, envName(f.Name), name, "leaseq %s --%s", cmd.name, f.Name)
			}
		})
	}
}

func TestLinePrefixer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		writes []string
		want   string
	}{
		{"WholeLines", []string{"a\nb\n"}, "[p] a\n[p] b\n"},
		{"SplitLine", []string{"a", "b", "c\nd", "\n"}, "[p] abc\n[p] d\n"},
		{"PartialAtEndIsFlushed", []string{"a\nno newline"}, "[p] a\n[p] no newline\n"},
		{"EmptyLine", []string{"\n"}, "[p] \n"},
		{"LongLineWhole", []string{strings.Repeat("x", maxPrefixedLine-1), "y\n"}, "[p] " + strings.Repeat("x", maxPrefixedLine-1) + "y\n"},
		// A line over the cap is written in pieces of maxPrefixedLine
		// bytes, each prefixed and ended with a newline.
		{"OverCapInPieces", []string{strings.Repeat("x", 2*maxPrefixedLine+1), "y\n"}, strings.Repeat("[p] "+strings.Repeat("x", maxPrefixedLine)+"\n", 2) + "[p] xy\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var writes []string
			var out bytes.Buffer
			p := &linePrefixer{prefix: "[p] ", w: writerFunc(func(b []byte) (int, error) {
				writes = append(writes, string(b))
				return out.Write(b)
			})}
			for _, w := range tc.writes {
				n, err := p.Write([]byte(w))
				require.NoError(t, err)
				require.Equal(t, len(w), n)
			}
			p.flush()
			require.Equal(t, tc.want, out.String())
			for _, w := range writes {
				require.True(t, strings.HasPrefix(w, "[p] ") && strings.HasSuffix(w, "\n"), "every write is whole lines: %q", w)
			}
		})
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func TestTailBuffer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		writes []string
		want   string
	}{
		{"Short", []string{"err", "or\n"}, "error"},
		{"KeepsTheEnd", []string{"0123456789", "abcdef"}, "89abcdef"},
		{"OneBigWrite", []string{"0123456789abcdef"}, "89abcdef"},
		{"CutRuneDropped", []string{"xxx\u00e9abcdefg"}, "abcdefg"}, // é is 2 bytes; its second byte is the first kept
		{"InvalidUTF8Replaced", []string{"a\xffb"}, "a\uFFFDb"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tb := &tailBuffer{max: 8}
			for _, w := range tc.writes {
				n, err := tb.Write([]byte(w))
				require.NoError(t, err)
				require.Equal(t, len(w), n)
			}
			require.Equal(t, tc.want, tb.String())
			require.LessOrEqual(t, len(tb.b), 8)
		})
	}
}

// TestWork_RetryDelayOverNodeMaxDelay: a --retry-delay over the node's
// --max-delay (168h by default) is refused once leaseq work has asked
// the node for its limits, before anything is leased. A node too old to
// tell its --max-delay refuses such a delay at the first nack instead;
// leaseq work then nacks the item with the queue's backoff, so the item
// is not left in flight, keeps its last_error, and the run says what
// happened (runWork without the check, as against such a node). A
// --retry-delay over what any node takes (100 years) is a bad command
// line.
func TestWork_RetryDelayOverNodeMaxDelay(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--sync", "none")
	dir := t.TempDir()
	job := script(t, dir, "temp.sh", "echo later >&2\nexit 75\n")
	n.cli("enqueue", "rdq", "x")
	n.cli("enqueue", "rdq", "y")
	w := n.startWork(t, nil, "rdq", "--max-items", "2", "--retry-delay", "200h", "--", job)
	require.Equal(t, exitUsage, w.wait(time.Minute), "a bad flag value for this node")
	require.Contains(t, w.stderr.String(), "--retry-delay 200h0m0s is over the node's --max-delay 168h0m0s")
	require.Equal(t, queueStats{Ready: 2, Enqueued: 2}, withoutDelayed(n.stats("rdq")), "nothing leased")

	c, err := rpc.Dial(context.Background(), n.addr, rpc.ClientOptions{})
	require.NoError(t, err)
	defer c.Close()
	wc, err := parseWorkArgs([]string{"rdq", "--", job})
	require.NoError(t, err)
	delay := 200 * time.Hour
	wc.concurrency, wc.lease, wc.killGrace, wc.maxItems, wc.retryDelay = 1, storage.DefaultLeaseDuration, 10*time.Second, 2, &delay
	te := newTestEnv(nil)
	stderr := &lockedWriter{w: te.errOut}
	err = runWork(context.Background(), &te.env, c, wc, stderr, slog.New(slog.NewTextHandler(stderr, nil)))
	var ee exitError
	require.ErrorAs(t, err, &ee)
	require.Equal(t, exitItemsFailed, ee.code)
	require.EqualError(t, err, "2 of 2 items failed (nacked); 2 of them with the queue's backoff, as the node refused --retry-delay 200h0m0s")
	s := withoutDelayed(n.stats("rdq"))
	require.Equal(t, queueStats{Ready: 2, Enqueued: 2, Delivered: 2, Nacked: 2}, s, "both items nacked, none left in flight")
	for _, it := range parsePolled(t, n.cli("peek", "rdq")) {
		require.Equal(t, "exit status 75 (EX_TEMPFAIL): later", it.LastError)
		require.True(t, visibleAt(t, it).Before(time.Now().Add(time.Minute)), "the queue's backoff (at most 30 s)")
	}
	log := te.errOut.String()
	require.Equal(t, 1, strings.Count(log, "the node refused --retry-delay (over its --max-delay)"), "warned once:\n%s", log)
	require.NotContains(t, log, "nack failed")

	te = newTestEnv(nil)
	require.Equal(t, exitUsage, run(context.Background(), []string{"work", "q", "--retry-delay", "900000h", "--", "true"}, &te.env))
	require.Contains(t, te.errOut.String(), "--retry-delay 900000h0m0s is over 876000h0m0s (100 years)")
}

// TestWork_MaxItemsAckLostExitsFailure: when the ack of a successful item
// cannot be made (the node went away while the command ran), the item
// will be delivered again, and the run exits 1 saying so rather than 0
// ("handled and all acked").
func TestWork_MaxItemsAckLostExitsFailure(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--sync", "none")
	dir := t.TempDir()
	job := script(t, dir, "slow.sh", "touch \"$OUT/started\"\nsleep 2\n")
	n.cli("enqueue", "ackq", "x")
	w := n.startWork(t, []string{"OUT=" + dir}, "ackq", "--max-items", "1", "--", job)
	waitExists(t, filepath.Join(dir, "started"))
	n.kill() // gone before the command ends: the ack cannot be made
	require.Equal(t, exitFailure, w.wait(time.Minute))
	require.Contains(t, w.stderr.String(), `msg="ack failed: the item will be delivered again"`)
	require.Contains(t, w.stderr.String(), "leaseq work: 1 of 1 items could not be acked or nacked (see the log): they will be delivered again once their lease runs out\n")
}

// TestWork_SIGHUPDrainsLikeSIGTERM: SIGHUP (the terminal closed) stops
// leaseq work as SIGTERM does: no new items, the running command is
// waited for up to --drain-timeout, then killed and its item nacked for
// redelivery at once; the command, in a process group of its own that the
// hangup does not reach, never outlives leaseq work.
func TestWork_SIGHUPDrainsLikeSIGTERM(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--sync", "none")
	dir := t.TempDir()
	job := script(t, dir, "hang.sh", "echo $$ > \"$OUT/pid\"\nexec sleep 60\n")
	n.cli("enqueue", "hupq", "x")
	w := n.startWork(t, []string{"OUT=" + dir}, "hupq", "--lease", "1s", "--drain-timeout", "1s", "--kill-grace", "1s", "--", job)
	pid := readPID(t, filepath.Join(dir, "pid"))
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	w.signal(syscall.SIGHUP)
	require.Equal(t, exitOK, w.wait(time.Minute))
	require.Contains(t, w.stderr.String(), `msg="stopping: no new items, waiting for the running ones" svc=work queue=hupq signal=hangup`)
	require.True(t, processGone(pid), "CMD (pid %d) outlived leaseq work", pid)
	it := n.peekOne("hupq")
	require.Equal(t, "interrupted: leaseq work stopped and its --drain-timeout ran out (process group killed)", it.LastError)
	require.Equal(t, queueStats{Ready: 1, Enqueued: 1, Delivered: 1, Nacked: 1}, n.stats("hupq"))
}

// TestWork_CommandDiesWithLeaseqWork: if leaseq work itself dies (here
// SIGKILL, which it cannot handle), the kernel SIGKILLs the commands it
// was running, rather than leave them running beside their items'
// redelivery.
func TestWork_CommandDiesWithLeaseqWork(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--sync", "none")
	dir := t.TempDir()
	job := script(t, dir, "hang.sh", "echo $$ > \"$OUT/pid.$LEASEQ_ID\"\nexec sleep 60\n")
	// Two at once: each command is started from a thread of its own.
	ids := []string{strings.TrimSpace(n.cli("enqueue", "killq", "x").stdout), strings.TrimSpace(n.cli("enqueue", "killq", "y").stdout)}
	w := n.startWork(t, []string{"OUT=" + dir}, "killq", "--concurrency", "2", "--", job)
	var pids []int
	for _, id := range ids {
		pid := readPID(t, filepath.Join(dir, "pid."+id))
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
		pids = append(pids, pid)
	}
	w.signal(syscall.SIGKILL)
	w.wait(time.Minute)
	for _, pid := range pids {
		rpctest.Eventually(t, 10*time.Second, func() bool { return processGone(pid) }, "CMD (pid %d) outlived leaseq work", pid)
	}
}

// TestWork_LongLinesWrittenWhole: with --concurrency above 1, a line of
// 100,000 bytes (under the 1 MiB cap) is written as one prefixed line.
func TestWork_LongLinesWrittenWhole(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--sync", "none")
	dir := t.TempDir()
	job := script(t, dir, "long.sh", "head -c 100000 /dev/zero | tr '\\0' x; echo\n")
	id := strings.TrimSpace(n.cli("enqueue", "longlq", "x").stdout)
	// Run directly (not startWork) so a failure does not dump 100 KB.
	cmd := exec.Command(leaseqBin, "work", "longlq", "--concurrency", "2", "--max-items", "1", "--", job)
	cmd.Env = cleanEnv("LEASEQ_ADDR=" + n.addr)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	require.NoError(t, cmd.Run(), errOut.String())
	want := "[" + id + "] " + strings.Repeat("x", 100_000) + "\n"
	got := out.String()
	require.True(t, got == want, "stdout has %d lines (want 1 line of %d bytes): %d bytes", strings.Count(got, "\n"), len(want), len(got))
}

// TestWork_NodeLostKillsCommand: as `leaseq work --help` says, "If the
// lease is lost (the node was unreachable for a whole lease), CMD is killed
// the same way: the item will be delivered again." Here the node crashes
// and comes back: the item's lease runs out and the node hands the item to
// another consumer, so the first CMD must not run on beside it (its
// extends fail with a transport error, not one that says the lease is
// gone: a whole lease without an extend through is what tells).
func TestWork_NodeLostKillsCommand(t *testing.T) {
	t.Parallel()
	data := filepath.Join(t.TempDir(), "data")
	n := startNode(t, data, "--sync", "none")
	dir := t.TempDir()
	job := script(t, dir, "long.sh", `
echo $$ > "$OUT/pid"
exec sleep 40
`)
	n.cli("enqueue", "nodelostq", "x")
	w := n.startWork(t, []string{"OUT=" + dir}, "nodelostq", "--lease", "1s", "--kill-grace", "1s", "--", job)
	pid := readPID(t, filepath.Join(dir, "pid"))
	require.False(t, processGone(pid))

	n.kill()
	// The node restarts on the same data and address.
	n2 := startNode(t, data, "--sync", "none", "--listen", n.addr)
	// Its lease ran out while the node was down: another consumer gets
	// the item.
	var got []polled
	rpctest.Eventually(t, 20*time.Second, func() bool {
		got = parsePolled(t, n2.cli("poll", "nodelostq"))
		return len(got) == 1
	}, "the item never came back")
	require.Equal(t, 2, got[0].Attempts)

	// The first run must not go on beside the redelivery.
	deadline := time.Now().Add(10 * time.Second)
	for !processGone(pid) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	require.True(t, processGone(pid), "CMD %d of the lost lease still runs beside the item's redelivery", pid)
	_ = w
}

// TestWork_TooManyWaitersIsNotFatal: a poll refused with tooManyWaiters
// is a "retry later" condition (an "overloaded" error on every protocol),
// not a reason for leaseq work to end: here two workers of one `leaseq
// work --concurrency 2` on a node with --max-waiters 1.
func TestWork_TooManyWaitersIsNotFatal(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--sync", "none", "--max-waiters", "1")
	dir := t.TempDir()
	job := script(t, dir, "ok.sh", "cat >/dev/null\n")
	w := n.startWork(t, nil, "waitersq", "--concurrency", "2", "--", job)
	select {
	case <-w.exited:
		t.Fatalf("leaseq work exited (code %d) on an idle queue: %s", w.cmd.ProcessState.ExitCode(), w.stderr.String())
	case <-time.After(3 * time.Second):
	}
}

// TestWork_DefaultLeaseWithinNodeMaxLease: without --lease, leaseq work
// leases for the default 30 s, or the node's --max-lease when shorter.
// Found by review (session 70): it sent 30 s, and a node with --max-lease
// 10s refused every poll.
func TestWork_DefaultLeaseWithinNodeMaxLease(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--sync", "none", "--max-lease", "10s")
	dir := t.TempDir()
	job := script(t, dir, "ok.sh", "cat >/dev/null\n")
	n.cli("enqueue", "leaseq10", "x")
	w := n.startWork(t, nil, "leaseq10", "--max-items", "1", "--", job)
	require.Equal(t, 0, w.wait(time.Minute), w.stderr.String())
	require.Contains(t, w.stderr.String(), "lease=10s")
}
