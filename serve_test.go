package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// TestMetricsServer_Readiness: /readyz follows the ready flag (503 while
// the store opens and during shutdown), /healthz is always up, and
// /metrics serves without a running node (no leaseq_ series then).
func TestMetricsServer_Readiness(t *testing.T) {
	t.Parallel()
	var ready atomic.Bool
	var health atomic.Pointer[error]
	h := metricsServer(newNodeCollector(), &ready, func() error {
		if e := health.Load(); e != nil {
			return *e
		}
		return nil
	}, slog.New(slog.NewTextHandler(io.Discard, nil))).Handler
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code, rec.Body.String()
	}
	code, _ := get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	code, _ = get("/healthz")
	require.Equal(t, http.StatusOK, code)
	code, page := get("/metrics")
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, page, "leaseq_")
	require.Contains(t, page, "go_goroutines")

	ready.Store(true)
	code, body := get("/readyz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ready", strings.TrimSpace(body))
	failed := errors.New("store stopped: the disk is full")
	health.Store(&failed) // a failed store is not ready
	code, body = get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "the disk is full")
	health.Store(nil)
	code, _ = get("/readyz")
	require.Equal(t, http.StatusOK, code)
	ready.Store(false) // shutting down
	code, _ = get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
}

// TestServe_FileModes: under umask 000 the node still keeps its database
// to its owner (directory 0700, files 0600) and gives the unix socket
// --socket-mode (default 0660).
func TestServe_FileModes(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		extra []string
		sock  os.FileMode
	}{{nil, 0o660}, {[]string{"--socket-mode", "0600"}, 0o600}} {
		data := filepath.Join(t.TempDir(), "data")
		n := startNodeUmask(t, data, "000", c.extra...)
		// Write something so the WAL has data.
		r := runCLI(t, nil, "", "enqueue", "--addr", n.addr, "q", "secret payload")
		require.Equal(t, 0, r.code, "%s%s", r.stdout, r.stderr)

		fi, err := os.Stat(data)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), "data directory")
		entries, err := os.ReadDir(data)
		require.NoError(t, err)
		require.NotEmpty(t, entries)
		for _, e := range entries {
			fi, err := e.Info()
			require.NoError(t, err)
			require.Zero(t, fi.Mode().Perm()&0o077, "%s is %#o: readable by others", e.Name(), fi.Mode().Perm())
		}
		sock := strings.TrimPrefix(n.addr, "unix:")
		fi, err = os.Stat(sock)
		require.NoError(t, err)
		require.Equal(t, c.sock, fi.Mode().Perm(), "socket mode with %v", c.extra)
		require.Zero(t, n.stop())
	}
}

func TestServe_SocketModeNeedsUnix(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "", "serve", "--data", filepath.Join(t.TempDir(), "d"), "--listen", "127.0.0.1:0", "--socket-mode", "0600")
	require.Equal(t, 2, r.code, "%s%s", r.stdout, r.stderr)
	require.Contains(t, r.stderr, "--socket-mode applies to a unix socket")
	r = runCLI(t, nil, "", "serve", "--socket-mode", "999")
	require.Equal(t, 2, r.code, "%s%s", r.stdout, r.stderr)
	require.Contains(t, r.stderr, "octal")
}

// TestServe_DiskFull: a real node on a small tmpfs. Below --min-free-disk
// enqueues are refused while polls and acks go on. When the disk fills
// anyway (here: no reserve, another file takes the space) the store stops:
// /readyz is 503 and leaseq_store_failed is 1; once space is back the node
// reopens the store by itself, and every acknowledged enqueue is there.
func TestServe_DiskFull(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	fsDir := t.TempDir()
	require.NoError(t, syscall.Mount("tmpfs", fsDir, "tmpfs", 0, "size=64m,mode=0700"))
	t.Cleanup(func() { _ = syscall.Unmount(fsDir, syscall.MNT_DETACH) })
	data := filepath.Join(fsDir, "data")

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	metrics := ln.Addr().String()
	require.NoError(t, ln.Close())
	n := startNode(t, data, "--metrics", metrics, "--min-free-disk", "0")
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + metrics + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	code, _ := get("/readyz")
	require.Equal(t, http.StatusOK, code)

	c := dialNode(t, n.addr)
	ctx := context.Background()
	payload := make([]byte, 32<<10)
	acked := map[storage.ItemID]bool{}
	enqueue := func() error {
		_, _ = rand.Read(payload)
		res, err := c.Enqueue(ctx, "q", []storage.EnqueueItem{{Payload: bytes.Clone(payload)}})
		if err == nil {
			acked[res[0].ID] = true
		}
		return err
	}
	for range 50 {
		require.NoError(t, enqueue())
	}

	// Another file takes the rest of the disk; writes start failing.
	filler := filepath.Join(fsDir, "filler")
	f, err := os.Create(filler)
	require.NoError(t, err)
	for {
		if _, err := f.Write(make([]byte, 1<<20)); err != nil {
			break
		}
	}
	require.NoError(t, f.Close())
	for i := 0; i < 10000 && enqueue() == nil; i++ {
	}
	require.Error(t, enqueue())
	rpctest.Eventually(t, 30*time.Second, func() bool { code, _ := get("/readyz"); return code == http.StatusServiceUnavailable },
		"/readyz stayed 200 with the store stopped")
	_, page := get("/metrics")
	require.Contains(t, page, "leaseq_store_failed 1")

	// Space comes back: the node reopens the store by itself.
	require.NoError(t, os.Remove(filler))
	rpctest.Eventually(t, 30*time.Second, func() bool { code, _ := get("/readyz"); return code == http.StatusOK },
		"the node did not recover after space came back")
	_, page = get("/metrics")
	require.Contains(t, page, "leaseq_store_failed 0")
	require.NoError(t, enqueue(), "writes work again")

	// Nothing acknowledged was lost, across the failure and a restart.
	n.kill()
	n = startNode(t, data)
	c = dialNode(t, n.addr)
	seen := map[storage.ItemID]bool{}
	var after storage.ItemID
	for {
		items, err := c.Peek(ctx, storage.PeekParams{Queue: "q", After: after, Limit: 1000})
		require.NoError(t, err)
		for _, it := range items {
			seen[it.ID] = true
		}
		if len(items) < 1000 {
			break
		}
		after = items[len(items)-1].ID
	}
	for id := range acked {
		require.True(t, seen[id], "acknowledged enqueue %s lost", id)
	}
	require.Zero(t, n.stop())
	r := runCLI(t, nil, "", "check", "--data", data)
	require.Equal(t, 0, r.code, "%s%s", r.stdout, r.stderr)
}

// TestServe_GCPercent: the node runs with --gc-percent's target (300 by
// default, whatever GOGC says), as Go's own metric reports it.
func TestServe_GCPercent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "go_gc_gogc_percent 300\n"},
		{[]string{"--gc-percent", "150"}, "go_gc_gogc_percent 150\n"},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		metrics := ln.Addr().String()
		require.NoError(t, ln.Close())
		n := startNode(t, t.TempDir(), append([]string{"--metrics", metrics}, tc.args...)...)
		resp, err := http.Get("http://" + metrics + "/metrics")
		require.NoError(t, err)
		page, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Contains(t, string(page), tc.want, "args %v", tc.args)
		n.kill()
	}
}

// With --sync=always the node runs one more P than Go's default (what
// --sync=none runs), unless GOMAXPROCS is set in its environment.
func TestServe_GOMAXPROCS(t *testing.T) {
	t.Parallel()
	procs := func(args ...string) int {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		metrics := ln.Addr().String()
		require.NoError(t, ln.Close())
		n := startNode(t, t.TempDir(), append([]string{"--metrics", metrics}, args...)...)
		defer n.kill()
		resp, err := http.Get("http://" + metrics + "/metrics")
		require.NoError(t, err)
		page, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		m := regexp.MustCompile(`(?m)^go_sched_gomaxprocs_threads (\d+)$`).FindStringSubmatch(string(page))
		require.NotNil(t, m, "no GOMAXPROCS gauge in /metrics")
		v, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		return v
	}
	none, always := procs("--sync", "none"), procs("--sync", "always")
	if os.Getenv("GOMAXPROCS") != "" { // inherited by the node: it wins
		require.Equal(t, none, always)
		return
	}
	require.Equal(t, none+1, always)
}

func TestSyncProcs(t *testing.T) {
	n, ok := syncProcs("rocksdb", rocksstore.SyncAlways, "", 2)
	require.True(t, ok)
	require.Equal(t, 3, n)
	for _, tc := range []struct {
		backend string
		mode    rocksstore.SyncMode
		env     string
	}{
		{"rocksdb", rocksstore.SyncNone, ""},
		{"rocksdb", rocksstore.SyncAlways, "4"},
		{"fdb", rocksstore.SyncAlways, ""},
	} {
		_, ok := syncProcs(tc.backend, tc.mode, tc.env, 2)
		require.False(t, ok, "%+v", tc)
	}
}

// TestBoundQueues: /metrics keeps series for the busiest queues only and
// sums the rest, so a node with thousands of queues has a bounded scrape.
func TestBoundQueues(t *testing.T) {
	t.Parallel()
	var stats []storage.QueueStats
	for i := range 10 {
		stats = append(stats, storage.QueueStats{Queue: fmt.Sprintf("q%d", i), Enqueued: uint64(i * 10), Ready: 1, OldestReadyAge: time.Duration(i) * time.Second})
	}
	require.Equal(t, stats, boundQueues(stats, 10), "within the bound: every queue")
	got := boundQueues(stats, 3)
	require.Len(t, got, 4)
	require.Equal(t, []string{"q9", "q8", "q7", otherQueues}, []string{got[0].Queue, got[1].Queue, got[2].Queue, got[3].Queue})
	o := got[3]
	require.Equal(t, int64(7), o.Ready)
	require.Equal(t, uint64(0+10+20+30+40+50+60), o.Enqueued)
	require.Equal(t, 6*time.Second, o.OldestReadyAge)
	require.Error(t, storage.DefaultLimits.ValidateQueueName(otherQueues), "the sum's label is no queue name")
}

// TestDefaultNodeWaiters: the default cap on parked polls keeps their
// memory within an eighth of the machine's.
func TestDefaultNodeWaiters(t *testing.T) {
	t.Parallel()
	n := defaultNodeWaiters()
	require.GreaterOrEqual(t, n, 1000)
	require.LessOrEqual(t, n, rpc.DefaultMaxWaiters)
	if n > 1000 {
		require.LessOrEqual(t, int64(n)*parkedPollCost, machineMemory()/8)
	}
}

// TestServe_Pprof: --pprof serves a CPU profile, an execution trace and
// the index of a real node, and the startup log names the address.
func TestServe_Pprof(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	n := startNode(t, t.TempDir(), "--pprof", addr)
	require.Contains(t, n.logs.String(), "pprof="+addr)
	get := func(path string) []byte {
		resp, err := http.Get("http://" + addr + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s: %s", path, body)
		return body
	}
	require.Contains(t, string(get("/debug/pprof/")), "goroutine")
	prof := get("/debug/pprof/profile?seconds=1")
	require.True(t, bytes.HasPrefix(prof, []byte{0x1f, 0x8b}), "a CPU profile is gzipped protobuf, got %q", prof[:min(len(prof), 16)])
	tr := get("/debug/pprof/trace?seconds=1")
	require.True(t, bytes.HasPrefix(tr, []byte("go 1.")), "an execution trace starts with its version, got %q", tr[:min(len(tr), 16)])
	require.Zero(t, n.stop())
}

// --pprof takes a TCP address of its own.
func TestServe_PprofFlagChecks(t *testing.T) {
	t.Parallel()
	data := filepath.Join(t.TempDir(), "d")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--pprof", "unix:/tmp/p.sock"}, "--pprof takes host:port"},
		{[]string{"--listen", "127.0.0.1:7799", "--pprof", "127.0.0.1:7799"}, "--pprof 127.0.0.1:7799 is also the address of"},
		{[]string{"--metrics", "127.0.0.1:7798", "--pprof", "127.0.0.1:7798"}, "--pprof 127.0.0.1:7798 is also the address of"},
	} {
		r := runCLI(t, nil, "", append([]string{"serve", "--data", data}, tc.args...)...)
		require.Equal(t, 2, r.code, "%v: %s%s", tc.args, r.stdout, r.stderr)
		require.Contains(t, r.stderr, tc.want, "%v", tc.args)
	}
}
