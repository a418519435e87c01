package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The C++ interop tests compile the reference clients in docs/cpp with g++
// against Debian's libcapnp-dev (the C++ reference implementation of Cap'n
// Proto) and run them against a real `leaseq serve`. `make deps` installs
// what they need; without it they fail and say so, since a test that
// silently skips proves nothing. LEASEQ_SKIP_CPP=1 skips them on purpose.

// cppSkipEnv opts out of the C++ interop tests.
const cppSkipEnv = "LEASEQ_SKIP_CPP"

// requireCppToolchain fails the test unless g++, pkg-config, the capnp
// compiler and libcapnp-dev are installed (or skips it with
// LEASEQ_SKIP_CPP=1).
func requireCppToolchain(t *testing.T) {
	t.Helper()
	if os.Getenv(cppSkipEnv) == "1" {
		t.Skipf("%s=1: C++ interop test skipped", cppSkipEnv)
	}
	var missing []string
	for _, tool := range []string{"g++", "pkg-config", "capnp"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if !slices.Contains(missing, "pkg-config") {
		if err := exec.Command("pkg-config", "--exists", "capnp-rpc").Run(); err != nil {
			missing = append(missing, "libcapnp-dev (pkg-config finds no capnp-rpc)")
		}
	}
	if len(missing) > 0 {
		t.Fatalf("C++ interop test: missing %s: run `make deps` (it installs libcapnp-dev, pkg-config, g++ and capnproto), or set %s=1 to skip this test",
			strings.Join(missing, ", "), cppSkipEnv)
	}
}

// buildCppClients compiles schema/queue.capnp and schema/queueber.capnp
// for C++ into dir, then docs/cpp/client.c++ and
// docs/cpp/queueber_client.c++ against them (in parallel). It returns the
// two binaries.
func buildCppClients(t *testing.T, dir string) (leaseqClient, queueberClient string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "capnproto.org/go/capnp/v3").Output()
	require.NoError(t, err, "go list capnp module")
	std := filepath.Join(strings.TrimSpace(string(out)), "std")
	gen := filepath.Join(dir, "gen")
	require.NoError(t, os.MkdirAll(gen, 0o755))
	// Inside schema/, as make generate does: the generated names carry the
	// file's path.
	cmd := exec.CommandContext(ctx, "capnp", "compile", "-I"+std, "-oc++:"+gen, "queue.capnp", "queueber.capnp")
	cmd.Dir = "schema"
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "capnp compile -oc++: %s", b)
	flags, err := exec.CommandContext(ctx, "pkg-config", "--cflags", "--libs", "capnp-rpc").Output()
	require.NoError(t, err, "pkg-config capnp-rpc")

	leaseqClient = filepath.Join(dir, "leaseq-cpp-client")
	queueberClient = filepath.Join(dir, "queueber-cpp-client")
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, c := range []struct{ src, gen, bin string }{
		{"docs/cpp/client.c++", "queue.capnp.c++", leaseqClient},
		{"docs/cpp/queueber_client.c++", "queueber.capnp.c++", queueberClient},
	} {
		wg.Go(func() {
			// -O0: compile time dominates; the clients make a handful of calls.
			args := append([]string{"-std=c++17", "-O0", "-I" + gen, c.src, filepath.Join(gen, c.gen)}, strings.Fields(string(flags))...)
			b, err := exec.CommandContext(ctx, "g++", append(args, "-o", c.bin)...).CombinedOutput()
			if err != nil {
				errs[i] = fmt.Errorf("g++ %s: %v\n%s", c.src, err, b)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	return leaseqClient, queueberClient
}

// runCpp runs a C++ client against addr and returns its output lines.
func runCpp(t *testing.T, bin, addr string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, addr).CombinedOutput()
	require.NoError(t, err, "%s %s:\n%s", filepath.Base(bin), addr, out)
	return strings.Split(strings.TrimRight(string(out), "\n"), "\n")
}

// TestCpp_Interop runs the C++ reference clients against one real node:
// docs/cpp/client.c++ on the leaseq listener (enqueue, long poll, ack) and
// docs/cpp/queueber_client.c++ on the Queueber listener (add, poll, extend,
// remove, a malformed lease), then checks with `leaseq stats` that each
// queue saw the items.
func TestCpp_Interop(t *testing.T) {
	t.Parallel()
	requireCppToolchain(t)
	dir := t.TempDir()
	leaseqClient, queueberClient := buildCppClients(t, dir)

	// The leaseq client runs on a node of each RPC engine (lean is the
	// default); the Queueber listener is go-capnp's on both.
	gc := startNode(t, filepath.Join(dir, "data-go-capnp"), "--sync", "none", "--rpc-engine", "go-capnp")
	t.Run("LeaseqClient/engine=go-capnp", func(t *testing.T) {
		lines := runCpp(t, leaseqClient, gc.addr)
		requireCppLeaseqClient(t, gc, lines)
	})
	require.Zero(t, gc.stop())
	require.NotContains(t, gc.logs.String(), "level=ERROR", "node logs:\n%s", gc.logs)

	qbAddr := freePort(t)
	n := startNode(t, filepath.Join(dir, "data"), "--sync", "none",
		"--queueber-listen", qbAddr, "--queueber-queue", "cpp-qb")
	require.Contains(t, n.logs.String(), "queueber_listen="+qbAddr)

	t.Run("LeaseqClient", func(t *testing.T) {
		lines := runCpp(t, leaseqClient, n.addr)
		requireCppLeaseqClient(t, n, lines)
	})

	t.Run("QueueberClient", func(t *testing.T) {
		lines := runCpp(t, queueberClient, qbAddr)
		require.Len(t, lines, 10, "%q", lines)
		hex := regexp.MustCompile(`^[0-9a-f]{32}$`)
		var ids []string
		for _, l := range lines[:2] {
			id, ok := strings.CutPrefix(l, "added ")
			require.True(t, ok, "%q", lines)
			require.Regexp(t, hex, id)
			ids = append(ids, id)
		}
		lease, ok := strings.CutPrefix(lines[2], "lease ")
		require.True(t, ok, "%q", lines)
		require.Regexp(t, hex, lease)
		require.Equal(t, []string{
			"polled " + ids[0] + " hello from C++ 1",
			"polled " + ids[1] + " hello from C++ 2",
			"extended true",
			"removed " + ids[0] + " true",
			"removed " + ids[1] + " true",
			"removed again false",
		}, lines[3:9])
		require.Contains(t, lines[9], "bad lease: exception: ")
		require.Contains(t, lines[9], "lease must be 16 bytes, got 3")

		st := n.stats("cpp-qb")
		require.Equal(t, uint64(2), st.Enqueued)
		require.Equal(t, uint64(2), st.Delivered)
		require.Equal(t, uint64(2), st.Acked)
		require.Zero(t, st.Ready+st.Inflight+st.Delayed)
		// The leaseq CLI sees the Queueber queue like any other.
		require.Contains(t, n.cli("queues").lines(), "cpp-qb")
	})

	require.Zero(t, n.stop())
	require.NotContains(t, n.logs.String(), "level=ERROR", "node logs:\n%s", n.logs)
}

// requireCppLeaseqClient checks the output of docs/cpp/client.c++ and the
// queue it used on node n.
func requireCppLeaseqClient(t *testing.T, n *node, lines []string) {
	t.Helper()
	require.Len(t, lines, 3, "%q", lines)
	id, ok := strings.CutPrefix(lines[0], "enqueued ")
	require.True(t, ok, "%q", lines)
	require.Regexp(t, `^[0-9a-f]{32}$`, id)
	require.Equal(t, "polled "+id+" attempts=1 payload=hello from C++", lines[1])
	require.Equal(t, "ack "+id+" ok", lines[2])
	st := n.stats("jobs")
	require.Equal(t, uint64(1), st.Enqueued)
	require.Equal(t, uint64(1), st.Acked)
	require.Zero(t, st.Ready+st.Inflight)
}
