package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/rpc/rpctest"
)

// startServeInProcess runs `leaseq serve` in-process with extra flags and
// returns its --addr and a stop function.
func startServeInProcess(t *testing.T, extra ...string) (addr string, stop func()) {
	t.Helper()
	dir := t.TempDir()
	sock := filepath.Join(dir, "s.sock")
	te := newTestEnv(map[string]string{"LEASEQ_SYNC": "none"})
	codes := make(chan int, 1)
	args := append([]string{"serve", "--data", filepath.Join(dir, "data"), "--log-format", "json", "--listen", "unix:" + sock}, extra...)
	go func() { codes <- run(context.Background(), args, &te.env) }()
	var sigc chan<- os.Signal
	select {
	case sigc = <-te.sigs:
	case code := <-codes:
		t.Fatalf("serve exited with %d: %s", code, te.errOut)
	case <-time.After(time.Minute):
		t.Fatal("serve never registered for signals")
	}
	rpctest.Eventually(t, time.Minute, func() bool { return strings.Contains(te.errOut.String(), `"msg":"leaseq serving"`) },
		"no startup log: %s", te.errOut)
	return "unix:" + sock, func() {
		sigc <- syscall.SIGINT
		select {
		case <-codes:
		case <-time.After(time.Minute):
			t.Error("serve did not stop")
		}
	}
}

func runCmd(t *testing.T, args ...string) (int, string, string) {
	te := newTestEnv(nil)
	code := run(context.Background(), args, &te.env)
	return code, te.out.String(), te.errOut.String()
}

// TestServe_DurationLimitsEndBefore2262: item times are Unix
// nanoseconds, which end in 2262, so serve refuses a --max-delay or
// --max-lease over 100 years (a delay or lease within a larger limit
// would wrap and make its item ready at once) and takes 100 years.
func TestServe_DurationLimitsEndBefore2262(t *testing.T) {
	dir := t.TempDir()
	for _, flag := range []string{"--max-delay", "--max-lease"} {
		code, _, errOut := runCmd(t, "serve", "--data", filepath.Join(dir, "data"), flag, "2200000h", "--check-config")
		require.Equal(t, exitUsage, code, "%s 2200000h: %s", flag, errOut)
		require.Contains(t, errOut, "100 years")
		code, out, errOut := runCmd(t, "serve", "--data", filepath.Join(dir, "data"), flag, "876000h", "--check-config")
		require.Equal(t, exitOK, code, "%s 876000h: %s", flag, errOut)
		require.Contains(t, out, strings.TrimPrefix(flag, "--")+"=876000h")
	}
}

// TestServe_CheckConfigReadsTLSFiles: --check-config "validates flags
// and environment", TLS files included: it refuses what serve refuses.
func TestServe_CheckConfigReadsTLSFiles(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "nope.pem")
	code, _, errOut := runCmd(t, "serve", "--data", filepath.Join(dir, "data"), "--tls-cert", missing, "--tls-key", missing, "--check-config")
	require.NotEqual(t, exitOK, code, "check-config accepted a TLS certificate that does not exist: %s", errOut)
}

// TestPoll_SubMillisecondLeaseRefused: poll --lease 500us would go over
// the wire as 0 ms, "the queue's default lease" (30 s): it is refused, as
// in rpc.Consume, and nothing is leased.
func TestPoll_SubMillisecondLeaseRefused(t *testing.T) {
	addr, stop := startServeInProcess(t)
	defer stop()
	code, _, errOut := runCmd(t, "enqueue", "--addr", addr, "q", "x")
	require.Equal(t, exitOK, code, errOut)
	code, out, errOut := runCmd(t, "poll", "--addr", addr, "--lease", "500us", "q")
	require.NotEqual(t, exitOK, code, "poll --lease 500us succeeded with the queue's default lease instead: %s", out)
	require.Contains(t, errOut, "under 1ms")
	code, out, errOut = runCmd(t, "poll", "--addr", addr, "q")
	require.Equal(t, exitOK, code, errOut)
	require.NotEmpty(t, out, "the refused poll leased the item")
}

// TestConfig_NewQueueWithinNodeLimits: `config` of a queue not created
// yet starts from what the queue's first enqueue would have given it,
// the defaults brought within the node's limits: on a node with
// --max-lease 10s and --max-delay 1m, changing only --max-attempts
// creates the queue with a 10 s lease, a 1 m dedup window and the
// default 30 s backoff cap, instead of failing on the fixed 30 s lease.
// The same limits come back in rpc.NodeInfo.
func TestConfig_NewQueueWithinNodeLimits(t *testing.T) {
	addr, stop := startServeInProcess(t, "--min-lease", "1500us", "--max-lease", "10s", "--max-delay", "1m")
	defer stop()
	code, out, errOut := runCmd(t, "config", "--addr", addr, "fresh", "--max-attempts", "3")
	require.Equal(t, exitOK, code, "config of a new queue on a node with --max-lease 10s: %s", errOut)
	require.Contains(t, out, "max-attempts=3\n")
	require.Contains(t, out, "lease=10s\n")
	require.Contains(t, out, "dedup-window=1m0s\n")
	require.Contains(t, out, "backoff-max=30s\n")

	c, err := rpc.Dial(context.Background(), addr, rpc.ClientOptions{})
	require.NoError(t, err)
	defer c.Close()
	ni, err := c.NodeInfo(context.Background())
	require.NoError(t, err)
	require.Equal(t, 2*time.Millisecond, ni.MinLease, "the shortest lease in whole milliseconds, rounded up")
	require.Equal(t, 10*time.Second, ni.MaxLease)
	require.Equal(t, time.Minute, ni.MaxDelay)
}

// TestDLQ_AllIsCommandLineOnly: an exported LEASEQ_ALL does not turn
// `dlq purge QUEUE` (ids forgotten) into a purge of every dead item;
// only --all on the command line does.
func TestDLQ_AllIsCommandLineOnly(t *testing.T) {
	addr, stop := startServeInProcess(t)
	defer stop()
	code, _, errOut := runCmd(t, "enqueue", "--addr", addr, "--max-attempts", "1", "dq", "x")
	require.Equal(t, exitOK, code, errOut)
	code, out, errOut := runCmd(t, "poll", "--addr", addr, "dq")
	require.Equal(t, exitOK, code, errOut)
	var polled struct {
		Lease string `json:"lease"`
		ID    string `json:"id"`
	}
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &polled))
	code, _, errOut = runCmd(t, "nack", "--addr", addr, "dq", polled.Lease, polled.ID)
	require.Equal(t, exitOK, code, errOut)

	te := newTestEnv(map[string]string{"LEASEQ_ALL": "true", "LEASEQ_ADDR": addr})
	require.Equal(t, exitUsage, run(context.Background(), []string{"dlq", "purge", "dq"}, &te.env), "stdout: %s", te.out)
	code, out, errOut = runCmd(t, "dlq", "ls", "--addr", addr, "dq")
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, polled.ID, "the dead item is still there")
	code, out, errOut = runCmd(t, "dlq", "purge", "--addr", addr, "--all", "dq")
	require.Equal(t, exitOK, code, errOut)
	require.Equal(t, "purged 1\n", out)
}

// TestServe_LimitsFitInMaxMessage: serve refuses limits an item or a
// nack within them could not fit in --max-message with. Found by review
// (session 73): the check counted a dedup key of the default 1 KiB, so
// --max-message 1MiB, --max-payload 1MiB-4KiB and --max-dedup-key 64KiB
// started, and an enqueue within every limit came in a message over
// --max-message: the node ended the client's session. A nack of
// --max-batch ids with a --max-reason reason likewise. Limits that pass
// the check do fit: an item at both limits is taken.
func TestServe_LimitsFitInMaxMessage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--max-message", "1048576", "--max-payload", "1044480", "--max-dedup-key", "65536"},
			"--max-payload 1044480 plus --max-dedup-key 65536 must be at least 3072 bytes below --max-message 1048576"},
		{[]string{"--max-message", "64KiB", "--max-payload", "32KiB", "--max-reason", "40000", "--max-batch", "1000"},
			"--max-reason 40000 with --max-batch 1000 ids (24 bytes each) must be at least 4096 bytes below --max-message 65536"},
	} {
		te := newTestEnv(nil)
		code := run(context.Background(), append([]string{"serve", "--check-config", "--data", t.TempDir()}, tc.flags...), &te.env)
		require.Equal(t, exitUsage, code, "%v: %s", tc.flags, te.errOut)
		require.Contains(t, te.errOut.String(), tc.want)
	}

	// The largest payload the check allows with a 64 KiB key.
	const payload = 1048576 - 4096 - (65536 - 1024)
	addr, stop := startServeInProcess(t, "--max-message", "1048576", "--max-payload", "979968", "--max-dedup-key", "65536")
	defer stop()
	te := newTestEnv(nil)
	te.stdin = strings.NewReader(strings.Repeat("p", payload))
	code := run(context.Background(), []string{"enqueue", "--addr", addr, "--key", strings.Repeat("k", 65536), "big", "-"}, &te.env)
	require.Equal(t, exitOK, code, te.errOut.String())
}
