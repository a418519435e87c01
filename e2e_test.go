package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
)

// leaseqBin is the leaseq binary built once by TestMain; the end-to-end,
// TLS and crash tests run it as real processes.
var leaseqBin string

// binTags are the build tags of the test binary, passed on to the leaseq
// build so `go test -tags invariants` also runs the node with its
// invariant checks (see tags_invariants_test.go).
var binTags string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "leaseq-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "TestMain:", err)
		os.Exit(1)
	}
	leaseqBin = filepath.Join(dir, "leaseq")
	args := []string{"build", "-o", leaseqBin}
	if binTags != "" {
		args = append(args, "-tags", binTags)
	}
	cmd := exec.Command("go", append(args, ".")...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "TestMain: go build leaseq:", err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// cleanEnv is the test process's environment without LEASEQ_* variables,
// so a developer's settings cannot leak into the processes under test.
func cleanEnv(extra ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, envPrefix) {
			out = append(out, kv)
		}
	}
	return append(out, extra...)
}

// node is a `leaseq serve` process owned by one test.
type node struct {
	t      *testing.T
	data   string
	addr   string
	cmd    *exec.Cmd
	logs   *syncBuffer
	exited chan struct{}
	err    error // from Wait, valid once exited is closed
}

// startNode runs `leaseq serve` on data, listening on a unix socket in
// a fresh temporary directory (unless extra sets --listen), and waits for
// its startup log line. The process is killed at the end of the test.
func startNode(t *testing.T, data string, extra ...string) *node {
	t.Helper()
	return startNodeUmask(t, data, "", extra...)
}

// startNodeUmask is startNode with the process umask set to umask (octal;
// "": inherited) through sh, which then execs leaseq in its place.
func startNodeUmask(t *testing.T, data, umask string, extra ...string) *node {
	t.Helper()
	addr := "unix:" + filepath.Join(t.TempDir(), "s.sock")
	for i, a := range extra {
		if a == "--listen" && i+1 < len(extra) {
			addr = extra[i+1]
		}
	}
	args := append([]string{"serve", "--data", data, "--listen", addr}, extra...)
	n := &node{t: t, data: data, addr: addr, logs: &syncBuffer{}, exited: make(chan struct{})}
	n.cmd = exec.Command(leaseqBin, args...)
	if umask != "" {
		n.cmd = exec.Command("/bin/sh", append([]string{"-c", `umask ` + umask + ` && exec "$0" "$@"`, leaseqBin}, args...)...)
	}
	n.cmd.Env = cleanEnv()
	n.cmd.Stdout = n.logs
	n.cmd.Stderr = n.logs
	require.NoError(t, n.cmd.Start())
	go func() {
		n.err = n.cmd.Wait()
		close(n.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-n.exited:
		default:
			_ = n.cmd.Process.Kill()
			<-n.exited
		}
		if t.Failed() {
			t.Logf("leaseq serve logs:\n%s", n.logs)
		}
	})
	rpctest.Eventually(t, time.Minute, func() bool {
		select {
		case <-n.exited:
			t.Fatalf("leaseq serve exited early (%v):\n%s", n.err, n.logs)
		default:
		}
		return strings.Contains(n.logs.String(), "leaseq serving")
	}, "leaseq serve did not start:\n%s", n.logs)
	return n
}

// kill SIGKILLs the node and waits for it to be gone.
func (n *node) kill() {
	n.t.Helper()
	require.NoError(n.t, n.cmd.Process.Signal(syscall.SIGKILL))
	<-n.exited
}

// stop sends SIGTERM and returns the exit code.
func (n *node) stop() int {
	n.t.Helper()
	require.NoError(n.t, n.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-n.exited:
	case <-time.After(time.Minute):
		n.t.Fatalf("leaseq serve did not stop after SIGTERM:\n%s", n.logs)
	}
	return n.cmd.ProcessState.ExitCode()
}

// cliResult is what one CLI invocation produced.
type cliResult struct {
	stdout, stderr string
	code           int
}

// lines returns stdout's lines.
func (r cliResult) lines() []string {
	s := strings.TrimRight(r.stdout, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// runCLI runs the leaseq binary with args, env added to a clean
// environment, and stdin.
func runCLI(t *testing.T, env []string, stdin string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, leaseqBin, args...)
	cmd.Env = cleanEnv(env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		require.True(t, ok, "run leaseq %v: %v", args, err)
		code = ee.ExitCode()
	}
	return cliResult{stdout: out.String(), stderr: errOut.String(), code: code}
}

// cli runs a client command against the node (LEASEQ_ADDR set) and
// requires it to succeed.
func (n *node) cli(args ...string) cliResult {
	n.t.Helper()
	r := n.cliCode(args...)
	require.Equal(n.t, 0, r.code, "leaseq %v: stdout %q stderr %q", args, r.stdout, r.stderr)
	require.Empty(n.t, r.stderr, "leaseq %v", args)
	return r
}

// cliCode runs a client command against the node whatever its outcome.
func (n *node) cliCode(args ...string) cliResult {
	n.t.Helper()
	return runCLI(n.t, []string{"LEASEQ_ADDR=" + n.addr}, "", args...)
}

// polled is one line of poll (and peek, dlq ls) output.
type polled struct {
	ID         string `json:"id"`
	Queue      string `json:"queue"`
	Lease      string `json:"lease"`
	ExpiresAt  string `json:"expires_at"`
	State      string `json:"state"`
	Attempts   int    `json:"attempts"`
	Priority   int    `json:"priority"`
	EnqueuedAt string `json:"enqueued_at"`
	VisibleAt  string `json:"visible_at"`
	LastError  string `json:"last_error"`
	Reason     string `json:"reason"`
	DeadAt     string `json:"dead_at"`
	Payload    []byte `json:"payload"`
}

func parsePolled(t *testing.T, r cliResult) []polled {
	t.Helper()
	var out []polled
	for _, l := range r.lines() {
		var p polled
		require.NoError(t, json.Unmarshal([]byte(l), &p), "line %q", l)
		out = append(out, p)
	}
	return out
}

// queueStats is `stats --json` for one queue.
type queueStats struct {
	Ready, Delayed, Inflight, Dead, Leases                int64
	Enqueued, Delivered, Acked, Nacked, Expired, Redriven uint64
	DeadLettered                                          uint64 `json:"dead_lettered"`
}

func (n *node) stats(queue string) queueStats {
	n.t.Helper()
	r := n.cli("stats", queue, "--json")
	var s queueStats
	require.NoError(n.t, json.Unmarshal([]byte(r.stdout), &s), "stats %q", r.stdout)
	return s
}

// freePort returns a loopback TCP address that was free a moment ago. The
// CLI cannot report the port of :0, so tests that need TCP pick one; the
// window for another process to take it is tiny.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// metricValue returns the value of the sample line that starts with
// series (name plus labels) in a /metrics page, or "" when absent.
func metricValue(page, series string) string {
	sc := bufio.NewScanner(strings.NewReader(page))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return v
		}
	}
	return ""
}
