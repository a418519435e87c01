package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// TestCLI_EnqueuePollAck walks one item through enqueue, poll and ack with
// the real binary, checking stats after each step.
func TestCLI_EnqueuePollAck(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"))

	id := strings.TrimSpace(n.cli("enqueue", "jobs", "hello").stdout)
	require.Len(t, id, 32)
	s := n.stats("jobs")
	require.Equal(t, queueStats{Ready: 1, Enqueued: 1}, s)

	// A payload from stdin, with flags after the arguments.
	r := runCLI(t, []string{"LEASEQ_ADDR=" + n.addr}, "from\nstdin", "enqueue", "jobs", "-", "--priority", "7")
	require.Equal(t, 0, r.code, r.stderr)
	id2 := strings.TrimSpace(r.stdout)

	// A repeated dedup key returns the first id and says so.
	first := strings.TrimSpace(n.cli("enqueue", "jobs", "x", "--key", "k").stdout)
	require.Equal(t, first+" duplicate", strings.TrimSpace(n.cli("enqueue", "jobs", "y", "--key", "k").stdout))
	require.Equal(t, []string{"jobs"}, n.cli("queues").lines())

	items := parsePolled(t, n.cli("poll", "jobs", "-n", "2"))
	require.Len(t, items, 2)
	require.Equal(t, id, items[0].ID, "priority 0 before the dedup item in id order")
	require.Equal(t, "hello", string(items[0].Payload))
	require.Equal(t, first, items[1].ID)
	for _, it := range items {
		require.Len(t, it.Lease, 32)
		require.Equal(t, items[0].Lease, it.Lease, "one lease per poll")
		require.Equal(t, 1, it.Attempts)
		_, err := time.Parse(time.RFC3339Nano, it.EnqueuedAt)
		require.NoError(t, err)
		exp, err := time.Parse(time.RFC3339Nano, it.ExpiresAt)
		require.NoError(t, err)
		require.WithinDuration(t, time.Now().Add(30*time.Second), exp, 10*time.Second, "default lease 30s")
	}
	// The raw line carries standard base64.
	require.Contains(t, n.cli("peek", "jobs", "--inflight").stdout, `"payload":"`+base64.StdEncoding.EncodeToString([]byte("hello"))+`"`)
	s = n.stats("jobs")
	require.Equal(t, queueStats{Ready: 1, Inflight: 2, Leases: 1, Enqueued: 3, Delivered: 2}, s)

	lease := items[0].Lease
	r = n.cli("ack", "jobs", lease, items[0].ID, items[1].ID)
	require.Equal(t, []string{items[0].ID + " ok", items[1].ID + " ok"}, r.lines())
	s = n.stats("jobs")
	require.Equal(t, queueStats{Ready: 1, Enqueued: 3, Delivered: 2, Acked: 2}, s)

	// Acking again: the items are gone.
	r = n.cliCode("ack", "jobs", lease, items[0].ID)
	require.Equal(t, 1, r.code)
	require.Equal(t, []string{items[0].ID + " not_found"}, r.lines())
	require.Equal(t, "leaseq ack: 1 of 1 ids not acked\n", r.stderr)

	// The stdin item is left, with its priority.
	items = parsePolled(t, n.cli("poll", "jobs", "-n", "10", "--lease", "1m"))
	require.Len(t, items, 1)
	require.Equal(t, id2, items[0].ID)
	require.Equal(t, "from\nstdin", string(items[0].Payload))
	require.Equal(t, 7, items[0].Priority)
	exp, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(n.cli("extend", "jobs", items[0].Lease, "--lease", "2m").stdout))
	require.NoError(t, err)
	require.WithinDuration(t, time.Now().Add(2*time.Minute), exp, 10*time.Second)
	// With ids, as ack and nack take them: one "ID RESULT EXPIRY" line each.
	f := strings.Fields(n.cli("extend", "jobs", items[0].Lease, id2, "--lease", "3m").stdout)
	require.Len(t, f, 3)
	require.Equal(t, []string{id2, "ok"}, f[:2])
	exp3, err := time.Parse(time.RFC3339Nano, f[2])
	require.NoError(t, err)
	require.Equal(t, time.Minute, exp3.Sub(exp).Round(time.Minute))
	n.cli("ack", "jobs", items[0].Lease, id2)
	require.Equal(t, queueStats{Enqueued: 3, Delivered: 3, Acked: 3}, n.stats("jobs"))

	// The table form names every column.
	table := n.cli("stats").lines()
	require.Len(t, table, 3)
	// The node line says which durability mode is on (DESIGN: stats and
	// the startup log say it).
	require.Regexp(t, `^node unix:.*: backend=rocksdb sync=always version=\S+$`, table[0])
	table = table[1:]
	require.Equal(t, []string{"QUEUE", "READY", "DELAYED", "INFLIGHT", "DEAD", "LEASES", "OLDEST", "ENQUEUED", "ACKED", "NACKED", "EXPIRED", "DEAD_LETTERED"}, strings.Fields(table[0]))
	require.Equal(t, []string{"jobs", "0", "0", "0", "0", "0", "0s", "3", "3", "0", "0", "0"}, strings.Fields(table[1]))
}

// TestCLI_LongPollWakeUp parks `poll --wait` and checks that an enqueue
// from another process releases it at once.
func TestCLI_LongPollWakeUp(t *testing.T) {
	t.Parallel()
	metrics := freePort(t)
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--metrics", metrics)

	type res struct {
		r       cliResult
		elapsed time.Duration
	}
	done := make(chan res, 1)
	start := time.Now()
	go func() {
		r := n.cliCode("poll", "jobs", "--wait", "20s")
		done <- res{r, time.Since(start)}
	}()
	// The poll is parked once the node counts a waiter.
	rpctest.Eventually(t, 30*time.Second, func() bool {
		_, page := httpGet(t, "http://"+metrics+"/metrics")
		return metricValue(page, "leaseq_rpc_waiters") == "1"
	}, "the long poll never parked")
	parked := time.Since(start)
	id := strings.TrimSpace(n.cli("enqueue", "jobs", "wake").stdout)
	got := <-done
	require.Equal(t, 0, got.r.code, got.r.stderr)
	items := parsePolled(t, got.r)
	require.Len(t, items, 1)
	require.Equal(t, id, items[0].ID)
	require.Less(t, got.elapsed, parked+10*time.Second, "woken by the enqueue, not by the 20s wait running out")

	// An empty long poll ends at its wait with no output and exit 0.
	start = time.Now()
	r := n.cliCode("poll", "jobs", "--wait", "300ms")
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, r.stdout)
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)
}

// TestCLI_ExpiredLeaseIsRedelivered lets a short lease run out: the item
// goes to the next poller with attempts 2, and the old lease is fenced off.
// Nothing assumes the first lease is still live at any wall-clock moment
// (a loaded CI machine may take longer than the lease between two CLI
// runs): the checks hold whether the sweeper has reclaimed it yet or not.
func TestCLI_ExpiredLeaseIsRedelivered(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"))
	id := strings.TrimSpace(n.cli("enqueue", "jobs", "p").stdout)
	first := parsePolled(t, n.cli("poll", "jobs", "--lease", "500ms"))
	require.Len(t, first, 1)
	require.Equal(t, 1, first[0].Attempts)
	s := n.stats("jobs")
	require.Equal(t, uint64(1), s.Delivered)
	require.Equal(t, int64(1), s.Inflight+s.Ready, "inflight, or ready again once swept")
	require.Equal(t, uint64(s.Ready), s.Expired)

	// A second consumer waits; the sweeper hands the item back at the
	// deadline and wakes it.
	second := parsePolled(t, n.cli("poll", "jobs", "--wait", "10s"))
	require.Len(t, second, 1)
	require.Equal(t, id, second[0].ID)
	require.Equal(t, 2, second[0].Attempts)
	require.NotEqual(t, first[0].Lease, second[0].Lease)
	require.Equal(t, queueStats{Inflight: 1, Leases: 1, Enqueued: 1, Delivered: 2, Expired: 1}, n.stats("jobs"))

	// The first consumer's late ack is refused and changes nothing.
	r := n.cliCode("ack", "jobs", first[0].Lease, id)
	require.Equal(t, 1, r.code)
	require.Equal(t, []string{id + " lease_mismatch"}, r.lines())
	r = n.cliCode("extend", "jobs", first[0].Lease)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "lease expired")
	r = n.cliCode("extend", "jobs", first[0].Lease, id)
	require.Equal(t, 1, r.code)
	require.Equal(t, []string{id + " lease_expired"}, r.lines())
	n.cli("ack", "jobs", second[0].Lease, id)
	require.Equal(t, queueStats{Enqueued: 1, Delivered: 2, Expired: 1, Acked: 1}, n.stats("jobs"))
}

// TestCLI_NackBackoffDeadLetterRedrive: nack with backoff, then explicit
// delays until max attempts sends the item to the DLQ; redrive brings it
// back with attempts reset.
func TestCLI_NackBackoffDeadLetterRedrive(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"))
	cfg := n.cli("config", "jobs", "--max-attempts", "3", "--backoff-base", "100ms", "--backoff-max", "200ms").lines()
	require.Contains(t, cfg, "max-attempts=3")
	require.Contains(t, cfg, "backoff-base=100ms")
	id := strings.TrimSpace(n.cli("enqueue", "jobs", "job").stdout)

	// Nack without --delay: the queue's backoff (at most 200ms here).
	it := parsePolled(t, n.cli("poll", "jobs"))
	require.Len(t, it, 1)
	require.Equal(t, []string{id + " ok"}, n.cli("nack", "jobs", it[0].Lease, id, "--reason", "first").lines())
	s := n.stats("jobs")
	require.Equal(t, int64(1), s.Ready+s.Delayed)
	require.Equal(t, uint64(1), s.Nacked)
	it = parsePolled(t, n.cli("poll", "jobs", "--wait", "10s"))
	require.Len(t, it, 1)
	require.Equal(t, 2, it[0].Attempts)
	require.Equal(t, "first", it[0].LastError)

	// Nack with --delay 0: ready again at once.
	n.cli("nack", "jobs", it[0].Lease, id, "--delay", "0", "--reason", "second")
	require.Equal(t, queueStats{Ready: 1, Enqueued: 1, Delivered: 2, Nacked: 2}, n.stats("jobs"))
	it = parsePolled(t, n.cli("poll", "jobs"))
	require.Len(t, it, 1)
	require.Equal(t, 3, it[0].Attempts)

	// The last attempt fails: dead, with the reason.
	n.cli("nack", "jobs", it[0].Lease, id, "--delay", "0", "--reason", "third")
	require.Equal(t, queueStats{Dead: 1, Enqueued: 1, Delivered: 3, Nacked: 3, DeadLettered: 1}, n.stats("jobs"))
	require.Empty(t, n.cli("poll", "jobs").stdout)
	dead := parsePolled(t, n.cli("dlq", "ls", "jobs"))
	require.Len(t, dead, 1)
	require.Equal(t, id, dead[0].ID)
	require.Equal(t, "dead", dead[0].State)
	require.Equal(t, "nack: third", dead[0].Reason)
	require.NotEmpty(t, dead[0].DeadAt)

	require.Equal(t, []string{id + " ok"}, n.cli("dlq", "redrive", "jobs", id).lines())
	require.Equal(t, queueStats{Ready: 1, Enqueued: 1, Delivered: 3, Nacked: 3, DeadLettered: 1, Redriven: 1}, n.stats("jobs"))
	it = parsePolled(t, n.cli("poll", "jobs"))
	require.Len(t, it, 1)
	require.Equal(t, id, it[0].ID)
	require.Equal(t, 1, it[0].Attempts, "redrive resets attempts")

	// A second item dies the same way; dlq purge --all removes it, and a
	// redrive of an id no longer dead says so.
	n.cli("ack", "jobs", it[0].Lease, id)
	n.cli("config", "jobs", "--max-attempts", "1")
	id2 := strings.TrimSpace(n.cli("enqueue", "jobs", "job2").stdout)
	it = parsePolled(t, n.cli("poll", "jobs"))
	n.cli("nack", "jobs", it[0].Lease, id2, "--delay", "0")
	require.Equal(t, int64(1), n.stats("jobs").Dead)
	require.Equal(t, "purged 1\n", n.cli("dlq", "purge", "jobs", "--all").stdout)
	require.Equal(t, int64(0), n.stats("jobs").Dead)
	r := n.cliCode("dlq", "redrive", "jobs", id2)
	require.Equal(t, 1, r.code)
	require.Equal(t, []string{id2 + " not_found"}, r.lines())

	// purge empties the live part of a queue.
	n.cli("enqueue", "jobs", "a")
	n.cli("enqueue", "jobs", "b")
	require.Equal(t, "purged 2\n", n.cli("purge", "jobs").stdout)
	require.Equal(t, int64(0), n.stats("jobs").Ready)

	// queue delete keeps a queue with items unless --force.
	n.cli("enqueue", "jobs", "c")
	r = n.cliCode("queue", "delete", "jobs")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "queue not empty")
	require.Contains(t, r.stderr, "--force")
	require.Equal(t, "deleted 1\n", n.cli("queue", "delete", "jobs", "--force").stdout)
	require.NotContains(t, n.cli("queues").stdout, "jobs")
	r = n.cliCode("queue", "delete", "jobs")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "not found")
}

// TestCLI_BadInput: every kind of bad invocation exits non-zero with one
// clear line on stderr.
func TestCLI_BadInput(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--max-payload", "1KiB")
	lease := "0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name  string
		args  []string
		stdin string
		code  int
		want  string
	}{
		{"UnknownCommand", []string{"frob"}, "", exitUsage, `unknown command "frob"`},
		{"UnknownFlag", []string{"poll", "jobs", "--frob"}, "", exitUsage, "flag provided but not defined: -frob"},
		{"MissingQueue", []string{"poll"}, "", exitUsage, "missing arguments: want QUEUE"},
		{"BadQueueName", []string{"enqueue", "no spaces", "x"}, "", exitFailure, `queue name "no spaces"`},
		{"LongQueueName", []string{"poll", strings.Repeat("q", 201)}, "", exitFailure, "queue name"},
		{"BadLeaseHex", []string{"ack", "jobs", "nothex", lease}, "", exitUsage, `bad lease "nothex"`},
		{"BadIDHex", []string{"ack", "jobs", lease, "xyz"}, "", exitUsage, `bad item id "xyz"`},
		{"AckWithoutIDs", []string{"ack", "jobs", lease}, "", exitUsage, "missing arguments"},
		{"UnknownLease", []string{"extend", "jobs", lease}, "", exitFailure, "lease expired"},
		{"BadDuration", []string{"poll", "jobs", "--wait", "soon"}, "", exitUsage, "want a duration"},
		{"WaitOverLimit", []string{"poll", "jobs", "--wait", "2m"}, "", exitFailure, "wait"},
		{"LeaseUnderLimit", []string{"poll", "jobs", "--lease", "1ms"}, "", exitFailure, "lease"},
		{"PayloadOverLimit", []string{"enqueue", "jobs", "-"}, strings.Repeat("x", 2000), exitFailure, "item rejected"},
		{"DelayOverLimit", []string{"enqueue", "jobs", "x", "--delay", "200h"}, "", exitFailure, "delay 200h0m0s outside [0, 168h0m0s]"},
		{"NackDelayOverLimit", []string{"nack", "jobs", lease, lease, "--delay", "200h"}, "", exitFailure, "delay 200h0m0s outside"},
		{"DedupKeyOverLimit", []string{"enqueue", "jobs", "x", "--key", strings.Repeat("k", 2000)}, "", exitFailure, "dedup key of 2000 bytes exceeds the limit of 1024"},
		{"BatchOverLimit", []string{"poll", "jobs", "-n", "2000"}, "", exitFailure, "max must be 1-1000, got 2000"},
		{"BadPriority", []string{"enqueue", "jobs", "x", "--priority", "300"}, "", exitUsage, "want an integer from 0 to 255"},
		{"NZero", []string{"poll", "jobs", "-n", "0"}, "", exitUsage, "-n must be positive"},
		{"DlqNoSub", []string{"dlq"}, "", exitUsage, "missing sub-command"},
		{"DlqIdsAndAll", []string{"dlq", "redrive", "jobs", "--all", lease}, "", exitUsage, "either ids or --all"},
		{"ConfigNoQueue", []string{"config", "nosuchqueue"}, "", exitFailure, `no queue "nosuchqueue"`},
		{"StatsNoQueue", []string{"stats", "nosuchqueue"}, "", exitFailure, "not found"},
		{"ExtendWithIDsUnknownLease", []string{"extend", "jobs", lease, lease}, "", exitFailure, "1 of 1 ids not extended"},
		{"ExtendBadID", []string{"extend", "jobs", lease, "xyz"}, "", exitUsage, `bad item id "xyz"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runCLI(t, []string{"LEASEQ_ADDR=" + n.addr}, tc.stdin, tc.args...)
			require.Equal(t, tc.code, r.code, "stdout %q stderr %q", r.stdout, r.stderr)
			require.Contains(t, r.stderr, tc.want)
			require.Equal(t, 1, strings.Count(r.stderr, "\n"), "one stderr line: %q", r.stderr)
			require.True(t, strings.HasPrefix(r.stderr, "leaseq"), "%q", r.stderr)
		})
	}

	t.Run("ConnectionRefused", func(t *testing.T) {
		t.Parallel()
		for _, addr := range []string{freePort(t), "unix:" + filepath.Join(t.TempDir(), "none.sock")} {
			r := runCLI(t, nil, "", "stats", "--addr", addr)
			require.Equal(t, exitFailure, r.code)
			require.Contains(t, r.stderr, "cannot connect to a leaseq node at "+addr)
			require.Equal(t, 1, strings.Count(r.stderr, "\n"), "%q", r.stderr)
		}
	})
	t.Run("BadAddrFromEnv", func(t *testing.T) {
		t.Parallel()
		r := runCLI(t, []string{"LEASEQ_ADDR=nonsense", "LEASEQ_TIMEOUT=2s"}, "", "queues")
		require.Equal(t, exitFailure, r.code)
		require.Contains(t, r.stderr, "nonsense")
		require.Equal(t, 1, strings.Count(r.stderr, "\n"), "%q", r.stderr)
	})
	t.Run("ServeBadLimit", func(t *testing.T) {
		t.Parallel()
		r := runCLI(t, nil, "", "serve", "--max-payload", "lots")
		require.Equal(t, exitUsage, r.code)
		require.Contains(t, r.stderr, "want a positive size")
		r = runCLI(t, nil, "", "serve", "--min-lease", "1h", "--max-lease", "1m")
		require.Equal(t, exitUsage, r.code)
		require.Contains(t, r.stderr, "--min-lease 1h0m0s is longer than --max-lease 1m0s")
	})
	t.Run("ServeFDBWithoutTag", func(t *testing.T) {
		t.Parallel()
		r := runCLI(t, nil, "", "serve", "--backend", "fdb", "--listen", "unix:"+filepath.Join(t.TempDir(), "s.sock"))
		require.Equal(t, exitFailure, r.code)
		require.Contains(t, r.stderr, "make build-fdb")
		require.Equal(t, 1, strings.Count(r.stderr, "\n"), "%q", r.stderr)
	})
	t.Run("CheckFDBWithoutTag", func(t *testing.T) {
		t.Parallel()
		r := runCLI(t, nil, "", "check", "--backend", "fdb", "--fdb-subspace", "prod")
		require.Equal(t, exitFailure, r.code)
		require.Contains(t, r.stderr, "make build-fdb")
		require.Equal(t, 1, strings.Count(r.stderr, "\n"), "%q", r.stderr)
	})
	t.Run("ServeAddressInUse", func(t *testing.T) {
		t.Parallel()
		r := runCLI(t, nil, "", "serve", "--data", filepath.Join(t.TempDir(), "d"), "--listen", n.addr, "--log-level", "error")
		require.Equal(t, exitFailure, r.code)
		require.Contains(t, r.stderr, "leaseq serve:")
	})
}

// TestCLI_Help: the command list and each command's flags with their
// environment variables.
func TestCLI_Help(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "", "--help")
	require.Equal(t, 0, r.code)
	for _, c := range commands {
		require.Contains(t, r.stdout, "\n  "+c.name+" ")
	}
	for _, tc := range []struct {
		cmd  string
		want []string
	}{
		{"serve", []string{"--listen address", "[LEASEQ_LISTEN]", "--metrics", "--tls-client-ca", "--max-payload", "--backend", "--fdb-cluster-file", "--fdb-subspace", "--max-conns", "--max-waiters"}},
		{"enqueue", []string{"QUEUE [PAYLOAD|-]", "--delay", "--priority", "--key", "--max-attempts", "--addr address", "[LEASEQ_ADDR]", "(default 127.0.0.1:7700)"}},
		{"poll", []string{"-n int", "--lease", "--wait", "--tls-ca", "--timeout", "base64"}},
		{"nack", []string{"--delay", "--reason"}},
		{"dlq", []string{"ls|redrive|purge", "--all"}},
		{"queue", []string{"delete QUEUE", "--force", "not_found"}},
	} {
		r := runCLI(t, nil, "", tc.cmd, "--help")
		require.Equal(t, 0, r.code, r.stderr)
		for _, w := range tc.want {
			require.Contains(t, r.stdout, w, "help for %s", tc.cmd)
		}
	}
	// bench passes its arguments to the harness, which prints its own
	// flags (on stderr, as the flag package does).
	r = runCLI(t, nil, "", "bench", "-h")
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stderr, "-systems")
	r = runCLI(t, nil, "", "bench", "--no-such-flag")
	require.NotEqual(t, 0, r.code)
}

// TestCLI_MetricsEndpoints: /metrics carries per-queue depth, operation
// counts and latency, store and sweeper metrics; /healthz and /readyz
// answer; SIGTERM shuts down cleanly and leaves a clean database.
func TestCLI_MetricsEndpoints(t *testing.T) {
	t.Parallel()
	metrics := freePort(t)
	data := filepath.Join(t.TempDir(), "data")
	n := startNode(t, data, "--metrics", metrics, "--log-format", "json")
	require.Contains(t, n.logs.String(), `"sync":"always"`)
	require.Contains(t, n.logs.String(), `"listen":"`+n.addr+`"`)

	n.cli("enqueue", "jobs", "a")
	n.cli("enqueue", "jobs", "b")
	n.cli("enqueue", "other", "c")
	parsePolled(t, n.cli("poll", "jobs"))

	code, body := httpGet(t, "http://"+metrics+"/healthz")
	require.Equal(t, 200, code)
	require.Equal(t, "ok\n", body)
	code, _ = httpGet(t, "http://"+metrics+"/readyz")
	require.Equal(t, 200, code)
	code, page := httpGet(t, "http://"+metrics+"/metrics")
	require.Equal(t, 200, code)
	for series, want := range map[string]string{
		`leaseq_queue_depth{queue="jobs",state="ready"}`:          "1",
		`leaseq_queue_depth{queue="jobs",state="inflight"}`:       "1",
		`leaseq_queue_depth{queue="jobs",state="dead"}`:           "0",
		`leaseq_queue_depth{queue="other",state="ready"}`:         "1",
		`leaseq_queue_items_total{event="enqueued",queue="jobs"}`: "2",
		`leaseq_queue_leases_active{queue="jobs"}`:                "1",
		`leaseq_rpc_requests_total{op="enqueue"}`:                 "3",
		`leaseq_rpc_request_duration_seconds_count{op="enqueue"}`: "3",
		`leaseq_rpc_request_duration_seconds_count{op="poll"}`:    "1",
	} {
		require.Equal(t, want, metricValue(page, series), "%s in:\n%s", series, page)
	}
	// Every leaseq series is documented in the README's metrics table.
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	for _, line := range strings.Split(page, "\n") {
		if !strings.HasPrefix(line, "leaseq_") {
			continue
		}
		name := strings.FieldsFunc(line, func(r rune) bool { return r == '{' || r == ' ' })[0]
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suf); ok && strings.Contains(string(readme), "`"+base+"`") {
				name = base
			}
		}
		require.Contains(t, string(readme), "| `"+name+"` |", "metric %s is not in the README's metrics table", name)
	}
	for _, name := range []string{
		`leaseq_queue_oldest_ready_age_seconds{queue="jobs"}`,
		`leaseq_rpc_request_duration_seconds_bucket{op="enqueue",le="0.001"}`,
		"leaseq_store_wal_fsync_seconds_count", "leaseq_store_commit_seconds_sum", "leaseq_store_write_stall_seconds_total",
		"leaseq_sweeper_lag_seconds", "leaseq_sweeper_passes_total", "leaseq_rpc_connections_open",
	} {
		require.NotEmpty(t, metricValue(page, name), "%s missing", name)
	}

	require.Equal(t, 0, n.stop())
	logs := n.logs.String()
	for _, msg := range []string{"shutting down", "rpc server stopped", "sweeper stopped", "leaseq stopped"} {
		require.Contains(t, logs, `"msg":"`+msg+`"`)
	}
	require.Less(t, strings.Index(logs, "rpc server stopped"), strings.Index(logs, "sweeper stopped"))
	r := runCLI(t, nil, "", "check", "--data", data)
	require.Equal(t, 0, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, "3 items")
}

// TestCLI_EnvAndLines: connection and request flags come from LEASEQ_*,
// flags stored in the node (item fields, queue config) only from the
// command line, and --lines enqueues a batch from stdin.
func TestCLI_EnvAndLines(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"))
	// Leftover item and config variables must change nothing.
	stored := []string{"LEASEQ_PRIORITY=9", "LEASEQ_KEY=k", "LEASEQ_DELAY=1h", "LEASEQ_MAX_ATTEMPTS=9",
		"LEASEQ_LEASE=1h", "LEASEQ_DEDUP_WINDOW=1s", "LEASEQ_BACKOFF_BASE=1s", "LEASEQ_BACKOFF_MAX=2s"}
	env := append([]string{"LEASEQ_ADDR=" + n.addr}, stored...)
	r := runCLI(t, env, "one\ntwo\nthree\n", "enqueue", "batch", "--lines", "--priority", "3")
	require.Equal(t, 0, r.code, r.stderr)
	require.Len(t, r.lines(), 3)
	r = runCLI(t, []string{"LEASEQ_ADDR=" + n.addr, "LEASEQ_N=10"}, "", "poll", "batch")
	require.Equal(t, 0, r.code, r.stderr)
	items := parsePolled(t, r)
	require.Len(t, items, 3)
	for i, w := range []string{"one", "two", "three"} {
		require.Equal(t, w, string(items[i].Payload))
		require.Equal(t, 3, items[i].Priority)
		require.Equal(t, 1, items[i].Attempts)
	}
	cr := runCLI(t, env, "", "config", "batch", "--json")
	require.Equal(t, 0, cr.code, cr.stderr)
	require.JSONEq(t, `{"max_attempts":5,"lease_ms":30000,"dedup_window_ms":300000,"backoff_base_ms":500,"backoff_max_ms":30000}`, cr.stdout)
	cr = runCLI(t, env, "", "config", "batch", "--max-attempts", "7")
	require.Equal(t, 0, cr.code, cr.stderr)
	require.Equal(t, []string{"max-attempts=7", "lease=30s", "dedup-window=5m0s", "backoff-base=500ms", "backoff-max=30s"}, cr.lines())
	cr = runCLI(t, env, "", "help", "config")
	require.Contains(t, cr.stdout, "--max-attempts n\n      set how many deliveries (n) an item gets before it is dead-lettered (new queues: 5) [command line only]")
	require.Contains(t, cr.stdout, "--addr address")
	require.Contains(t, cr.stdout, "[LEASEQ_ADDR]")

	// poll's output piped into ack settles the whole poll.
	r = runCLI(t, []string{"LEASEQ_ADDR=" + n.addr}, r.stdout, "ack", "batch", "-")
	require.Equal(t, 0, r.code, r.stderr)
	require.Equal(t, []string{items[0].ID + " ok", items[1].ID + " ok", items[2].ID + " ok"}, r.lines())
	require.Equal(t, queueStats{Enqueued: 3, Delivered: 3, Acked: 3}, n.stats("batch"))
	// An empty poll piped in settles nothing, and the pipeline succeeds.
	r = runCLI(t, []string{"LEASEQ_ADDR=" + n.addr}, "", "poll", "batch", "-n", "10")
	require.Equal(t, 0, r.code, r.stderr)
	require.Empty(t, r.stdout)
	for _, cmd := range []string{"ack", "nack"} {
		r = runCLI(t, []string{"LEASEQ_ADDR=" + n.addr}, "", cmd, "batch", "-")
		require.Equal(t, 0, r.code, "%s - of an empty poll: %s", cmd, r.stderr)
		require.Empty(t, r.stdout)
	}
	r = runCLI(t, []string{"LEASEQ_ADDR=" + n.addr}, "not json", "nack", "batch", "-")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "want poll's JSON lines")
}

// TestCLI_CheckAfterKill: after a SIGKILL the database passes check
// (every write is one atomic transaction).
func TestCLI_CheckAfterKill(t *testing.T) {
	t.Parallel()
	data := filepath.Join(t.TempDir(), "data")
	n := startNode(t, data)
	for i := range 5 {
		n.cli("enqueue", "jobs", fmt.Sprint(i))
	}
	parsePolled(t, n.cli("poll", "jobs", "-n", "2"))
	n.kill()
	r := runCLI(t, nil, "", "check", "--data", data)
	require.Equal(t, 0, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, "5 items, 1 leases")
	_, err := os.Stat(data)
	require.NoError(t, err)
}

// TestCLI_MaxConns: a node at --max-conns refuses one more client with a
// clear line.
func TestCLI_MaxConns(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--max-conns", "1")
	c := dialNode(t, n.addr)
	_, err := c.Queues(context.Background())
	require.NoError(t, err)
	r := n.cliCode("queues")
	require.Equal(t, exitFailure, r.code, r.stdout)
	require.Contains(t, r.stderr, "at its --max-conns limit")
	require.Equal(t, 1, strings.Count(r.stderr, "\n"), "%q", r.stderr)
	require.NoError(t, c.Close())
	rpctest.Eventually(t, 30*time.Second, func() bool { return n.cliCode("queues").code == 0 }, "the slot was not freed")
}

// TestCLI_StatsShowsSyncMode: stats says which durability mode the node
// runs with, as its startup log does.
func TestCLI_StatsShowsSyncMode(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--sync", "none")
	require.Contains(t, n.logs.String(), "sync=none")
	n.cli("enqueue", "jobs", "x")
	var line struct {
		Queue, Backend, Sync string
	}
	require.NoError(t, json.Unmarshal([]byte(n.cli("stats", "--json").stdout), &line))
	require.Equal(t, "jobs", line.Queue)
	require.Equal(t, "rocksdb", line.Backend)
	require.Equal(t, "none", line.Sync)
	require.Contains(t, n.cli("stats").lines()[0], "backend=rocksdb sync=none")
}

// TestCLI_SmallMaxBatch: the CLI sizes its batches and default pages by
// the node's --max-batch, so enqueue --lines, dlq --all, dlq ls and peek
// work on a node with a small limit.
func TestCLI_SmallMaxBatch(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--max-batch", "50")
	var in strings.Builder
	for i := range 250 {
		fmt.Fprintln(&in, i)
	}
	r := runCLI(t, []string{"LEASEQ_ADDR=" + n.addr}, in.String(), "enqueue", "many", "--lines")
	require.Equal(t, 0, r.code, r.stderr)
	require.Len(t, r.lines(), 250)
	require.Equal(t, uint64(250), n.stats("many").Enqueued)

	// 150 items dead-lettered, then redriven with --all in pages of 50.
	n.cli("config", "many", "--max-attempts", "1")
	for range 3 {
		items := parsePolled(t, n.cli("poll", "many", "-n", "50"))
		require.Len(t, items, 50)
		var stdin strings.Builder
		for _, it := range items {
			b, err := json.Marshal(it)
			require.NoError(t, err)
			fmt.Fprintln(&stdin, string(b))
		}
		r = runCLI(t, []string{"LEASEQ_ADDR=" + n.addr}, stdin.String(), "nack", "many", "-", "--delay", "0")
		require.Equal(t, 0, r.code, r.stderr)
	}
	require.Equal(t, int64(150), n.stats("many").Dead)
	// The default page size (100) is lowered to the node's limit; an
	// explicit -n is sent as given.
	require.Len(t, n.cli("dlq", "ls", "many").lines(), 50)
	require.Len(t, n.cli("peek", "many").lines(), 50)
	require.Len(t, n.cli("peek", "many", "-n", "30").lines(), 30)
	r = n.cliCode("peek", "many", "-n", "51")
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "51")
	require.Equal(t, "redriven 150\n", n.cli("dlq", "redrive", "many", "--all").stdout)
	require.Equal(t, queueStats{Ready: 250, Enqueued: 250, Delivered: 150, Nacked: 150, DeadLettered: 150, Redriven: 150}, n.stats("many"))
}

// TestCLI_CheckWhileServing: check on the database of a running node says
// to stop the node, naming its process.
func TestCLI_CheckWhileServing(t *testing.T) {
	t.Parallel()
	data := filepath.Join(t.TempDir(), "data")
	n := startNode(t, data)
	r := runCLI(t, nil, "", "check", "--data", data)
	require.Equal(t, exitFailure, r.code, r.stdout)
	require.Contains(t, r.stderr, fmt.Sprintf("is in use by process %d", n.cmd.Process.Pid))
	require.Contains(t, r.stderr, "stop it first")
	require.Equal(t, 1, strings.Count(r.stderr, "\n"), "%q", r.stderr)
	require.Equal(t, 0, n.stop())
	r = runCLI(t, nil, "", "check", "--data", data)
	require.Equal(t, 0, r.code, r.stdout+r.stderr)
}

// TestCLI_MaxMessage: a request over the node's --max-message costs the
// client its connection, with a line that says so; the node serves on.
func TestCLI_MaxMessage(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "", "serve", "--max-message", "64KiB", "--max-payload", "1MiB")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "--max-payload 1048576 must be at least 4096 bytes below --max-message 65536")
	// Found by review (session 70): a payload just under --max-message
	// came in a message over it, and the node ended the session.
	r = runCLI(t, nil, "", "serve", "--max-message", "64KiB", "--max-payload", "63KiB")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "must be at least 4096 bytes below --max-message")

	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--max-message", "64KiB", "--max-payload", "32KiB")
	r = runCLI(t, []string{"LEASEQ_ADDR=" + n.addr}, strings.Repeat("x", 100_000), "enqueue", "jobs", "-")
	require.Equal(t, exitFailure, r.code, r.stdout)
	require.Contains(t, r.stderr, "closed the connection during the call")
	require.Contains(t, r.stderr, "--max-message")
	require.Equal(t, 1, strings.Count(r.stderr, "\n"), "%q", r.stderr)
	require.Len(t, strings.TrimSpace(n.cli("enqueue", "jobs", "small").stdout), 32)
	require.NotContains(t, n.logs.String(), "level=ERROR")
}

// TestCLI_Format1Upgrade: a database written before column families
// (storage/rocksstore/testdata/format1, made by ac825a7) is checked as it
// is, moved to format 2 by the first leaseq serve, and serves the same
// queues after the move.
func TestCLI_Format1Upgrade(t *testing.T) {
	t.Parallel()
	data := filepath.Join(t.TempDir(), "data")
	require.NoError(t, os.CopyFS(data, os.DirFS(filepath.Join("storage", "rocksstore", "testdata", "format1", "db"))))
	r := runCLI(t, nil, "", "check", "--data", data)
	require.Equal(t, 0, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, "14 items, 1 leases")

	n := startNode(t, data)
	require.Contains(t, n.logs.String(), "moved the database from format 1")
	// The data was written at 2031 instants: the node's time goes on from
	// them (storage/steadyclock), so the item nacked with a backoff of at
	// most 2 s becomes ready within 2 s of the data's latest instant; the
	// item delayed by an hour stays delayed.
	require.Contains(t, n.logs.String(), "the clock reads earlier than the data")
	var jobs queueStats
	rpctest.Eventually(t, 30*time.Second, func() bool {
		jobs = n.stats("jobs")
		return jobs.Delayed == 1
	}, "the nacked item's backoff ends")
	require.Equal(t, queueStats{Ready: 9, Delayed: 1, Inflight: 2, Leases: 1, Enqueued: 13, Delivered: 4, Acked: 1, Nacked: 1}, jobs)
	dead := n.stats("dead")
	require.EqualValues(t, 2, dead.Dead)
	require.Len(t, n.cli("dlq", "ls", "dead").lines(), 2)
	require.Equal(t, 0, n.stop())

	r = runCLI(t, nil, "", "check", "--data", data)
	require.Equal(t, 0, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, "14 items, 1 leases")
	n = startNode(t, data)
	require.NotContains(t, n.logs.String(), "moved the database", "moved once only")
	require.Equal(t, jobs, n.stats("jobs"))
}

// TestCLI_EnqueueLinesBatchedByBytes: enqueue --lines sends at most about
// 1 MiB of payload per call as well as at most 500 items, so 500 lines of
// 140 KB (70 MB, over the client's 64 MiB message limit were they one
// call), each within --max-payload, are all enqueued, one id per line.
func TestCLI_EnqueueLinesBatchedByBytes(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--sync", "none")
	line := strings.Repeat("x", 140_000) + "\n"
	r := runCLI(t, []string{"LEASEQ_ADDR=" + n.addr}, strings.Repeat(line, 500), "enqueue", "bigl", "--lines")
	require.Equal(t, 0, r.code, "stderr: %s", r.stderr)
	require.Len(t, r.lines(), 500)
	require.Equal(t, uint64(500), n.stats("bigl").Enqueued)
}

// TestEnqueueLines_CallSizes: a call of enqueue --lines takes up to the
// item limit and the byte budget (64 bytes of framing counted per item),
// and always at least one item, however large.
func TestEnqueueLines_CallSizes(t *testing.T) {
	t.Parallel()
	lines := func(sizes ...int) string {
		var b strings.Builder
		for _, s := range sizes {
			b.WriteString(strings.Repeat("x", s) + "\n")
		}
		return b.String()
	}
	for _, tc := range []struct {
		name  string
		input string
		batch int
		want  []int
	}{
		{"ItemLimit", lines(1, 1, 1, 1), 3, []int{3, 1}},
		{"AllFit", lines(100, 100), 500, []int{2}},
		{"ByteBudget", lines(400, 400, 400), 500, []int{2, 1}}, // 2*464 <= 1000 < 3*464
		{"BigFirstAlone", lines(5000, 1), 500, []int{1, 1}},
		{"BigSecondWaits", lines(1, 5000), 500, []int{1, 1}},
		{"Empty", "", 500, nil},
		{"LastLineWithoutNewline", "a\nb", 500, []int{2}},
		{"CRLF", "a\r\nb\r\n", 500, []int{2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []int
			base := storage.EnqueueItem{Priority: 3}
			next := 1
			err := linesInCalls(strings.NewReader(tc.input), tc.batch, 1000, base, func(items []storage.EnqueueItem, first int) error {
				require.Equal(t, next, first, "the number of the call's first line")
				next += len(items)
				for _, it := range items {
					require.Equal(t, uint8(3), it.Priority, "base's settings")
				}
				got = append(got, len(items))
				return nil
			})
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// TestEnqueueLines_SendsBeforeStdinEnds: a call is sent as soon as stdin
// has filled it (a producer that keeps the pipe open gets its ids as it
// goes, and stdin is never held in memory whole).
func TestEnqueueLines_SendsBeforeStdinEnds(t *testing.T) {
	t.Parallel()
	pr, pw := io.Pipe()
	sent := make(chan int, 4)
	done := make(chan error, 1)
	go func() {
		done <- linesInCalls(pr, 2, 1<<20, storage.EnqueueItem{}, func(items []storage.EnqueueItem, _ int) error {
			sent <- len(items)
			return nil
		})
	}()
	_, err := io.WriteString(pw, "a\nb\nc\n")
	require.NoError(t, err)
	select {
	case n := <-sent:
		require.Equal(t, 2, n)
	case <-time.After(10 * time.Second):
		t.Fatal("a full call was not sent while stdin stayed open")
	}
	require.NoError(t, pw.Close())
	require.NoError(t, <-done)
	require.Equal(t, 1, <-sent, "the rest at stdin's end")
}

// TestCLI_ErrorPrefixOnce: an error that already starts with the command's
// "leaseq NAME: " (as rpc.Client's do) is printed with that prefix once.
func TestCLI_ErrorPrefixOnce(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("leaseq enqueue: %w: request of about 70000000 bytes exceeds the client's flow limit", storage.ErrInvalidArgument)
	require.Equal(t, "storage: invalid argument: request of about 70000000 bytes exceeds the client's flow limit", errorLine("enqueue", err))
	require.Equal(t, "leaseq poll: connection lost", errorLine("work", errors.New("leaseq poll: connection lost")), "another command's prefix is kept")

	// End to end: a payload over the client's 64 MiB limit is refused
	// before anything is sent, in one line with one prefix.
	te := newTestEnv(nil)
	te.env.stdin = bytes.NewReader(make([]byte, 65<<20))
	addr, stop := startServeInProcess(t)
	defer stop()
	require.Equal(t, exitFailure, run(context.Background(), []string{"enqueue", "--addr", addr, "q", "-"}, &te.env))
	require.True(t, strings.HasPrefix(te.errOut.String(), "leaseq enqueue: storage: invalid argument"), "%q", te.errOut)
	require.Equal(t, 1, strings.Count(te.errOut.String(), "leaseq enqueue:"), "%q", te.errOut)
}

// TestEnqueueLines_RejectedLineKeepsTheOthersIDs: with --lines, a line
// over the node's --max-payload in the middle of a call is refused, but
// the node enqueues the good lines after it in the same call (a partly bad
// batch does not fail the good items): their ids are printed too (the CLI
// used to stop at the refused one), and the refused line is named by its
// number.
func TestEnqueueLines_RejectedLineKeepsTheOthersIDs(t *testing.T) {
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--sync", "none", "--max-payload", "1KiB")
	in := "first\n" + strings.Repeat("x", 2000) + "\nthird\n"
	r := runCLI(t, []string{"LEASEQ_ADDR=" + n.addr}, in, "enqueue", "q", "--lines")
	t.Logf("exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	s := n.stats("q")
	// Every item the node enqueued must have its id printed.
	require.Equal(t, int(s.Enqueued), len(r.lines()),
		"node enqueued %d items, the CLI printed %d ids (%q)", s.Enqueued, len(r.lines()), r.stdout)
	require.EqualValues(t, 2, s.Enqueued)
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stderr, "line 2 rejected")
}

// TestEnqueueLines_TimeoutIsPerCall: --timeout bounds each call of
// enqueue --lines, not the whole run: lines that come slower than that (a
// producer piping in over time) are enqueued as they come (the CLI used to
// fail with "no answer from the node within ..." having enqueued none).
func TestEnqueueLines_TimeoutIsPerCall(t *testing.T) {
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--sync", "none")
	cmd := exec.Command("/bin/sh", "-c", `(echo a; sleep 3; echo b) | "$0" enqueue q --lines --timeout 2s`, leaseqBin)
	cmd.Env = cleanEnv("LEASEQ_ADDR=" + n.addr)
	out, err := cmd.CombinedOutput()
	t.Logf("output %q err %v", out, err)
	require.NoError(t, err, "enqueue --lines failed: %s", out)
	r := n.cli("stats", "q", "--json")
	var s queueStats
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &s))
	require.EqualValues(t, 2, s.Enqueued)
}

// TestDLQ_ActRefusesListFlags: -n is dlq ls's: `dlq purge q --all -n 1`
// used to accept it and purge every dead item, not one; it is refused
// (exit 2) and nothing is purged.
func TestDLQ_ActRefusesListFlags(t *testing.T) {
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--sync", "none")
	n.cli("config", "q", "--max-attempts", "1")
	for _, p := range []string{"a", "b", "c"} {
		n.cli("enqueue", "q", p)
	}
	items := parsePolled(t, n.cli("poll", "q", "-n", "3"))
	require.Len(t, items, 3)
	args := []string{"nack", "q", items[0].Lease, "--delay", "0"}
	for _, it := range items {
		args = append(args, it.ID)
	}
	n.cli(args...)
	require.Len(t, n.cli("dlq", "ls", "q").lines(), 3)
	r := n.cliCode("dlq", "purge", "q", "--all", "-n", "1")
	t.Logf("exit %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "not -n")
	require.Len(t, n.cli("dlq", "ls", "q").lines(), 3, "nothing purged")
	r = n.cliCode("dlq", "ls", "q", "--all")
	require.Equal(t, exitUsage, r.code, "--all is not ls's")
}

// TestEnqueue_LinesIsCommandLineOnly: --lines decides what is stored, so
// LEASEQ_LINES does not set it: with a leftover LEASEQ_LINES=1, `echo hi |
// leaseq enqueue q` (no PAYLOAD: an empty item) used to store "hi", and
// `leaseq enqueue q hello` failed.
func TestEnqueue_LinesIsCommandLineOnly(t *testing.T) {
	n := startNode(t, filepath.Join(t.TempDir(), "data"), "--sync", "none")
	env := []string{"LEASEQ_ADDR=" + n.addr, "LEASEQ_LINES=1"}
	r := runCLI(t, env, "", "enqueue", "q", "hello")
	require.Equal(t, 0, r.code, "enqueue q hello with LEASEQ_LINES=1 set: %q", r.stderr)
	r = runCLI(t, env, "hi\n", "enqueue", "q")
	require.Equal(t, 0, r.code, "%q", r.stderr)
	items := parsePolled(t, n.cli("peek", "q"))
	require.Len(t, items, 2)
	require.Empty(t, items[1].Payload, "enqueue without PAYLOAD stored stdin's line because of LEASEQ_LINES")
}

// TestServe_SecondNodeOnTheSameDataNamesTheFirst: a second `leaseq serve`
// on a running node's data directory is refused, naming the process that
// holds it, and changes nothing there (the first node goes on). Found by
// review (session 71): the refusal passed on RocksDB's lock error alone
// (and, before, had deleted the running node's spare WAL).
func TestServe_SecondNodeOnTheSameDataNamesTheFirst(t *testing.T) {
	t.Parallel()
	data := filepath.Join(t.TempDir(), "data")
	n := startNode(t, data)
	n.cli("enqueue", "jobs", "one")
	r := runCLI(t, nil, "", "serve", "--data", data, "--listen", "127.0.0.1:0")
	require.NotEqual(t, 0, r.code, r.stdout)
	require.Contains(t, r.stderr, fmt.Sprintf("in use by process %d", n.cmd.Process.Pid))
	require.Contains(t, r.stderr, "stop it first")
	require.Equal(t, int64(1), n.stats("jobs").Ready, "the first node goes on")
	require.Equal(t, 0, n.stop())
}
