package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/schema"
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
// docs/cpp/queueber_client.c++ on the Queueber listener (add, poll, extend,
// remove, a malformed lease), then docs/cpp/client.c++ on the leaseq
// listener, which tours the whole protocol (enqueue, poll, extend, ack,
// nack, stats, peek, a pipelined subscribe+cancel, push delivery to a
// Consumer implemented in C++, and done when the node stops). It checks
// the clients' output, the node's state through the CLI and /metrics, and
// the leaseq client's messages on the wire.
func TestCpp_Interop(t *testing.T) {
	t.Parallel()
	requireCppToolchain(t)
	dir := t.TempDir()
	leaseqClient, queueberClient := buildCppClients(t, dir)

	// Every step on a node of each RPC engine (lean is the default); the
	// Queueber listener is go-capnp's on both.
	for _, engine := range []string{"lean", "go-capnp"} {
		t.Run("engine="+engine, func(t *testing.T) {
			qbAddr, metrics := freePort(t), freePort(t)
			n := startNode(t, filepath.Join(dir, "data-"+engine), "--rpc-engine", engine, "--sync", "none", "--metrics", metrics,
				"--queueber-listen", qbAddr, "--queueber-queue", "cpp-qb")
			require.Contains(t, n.logs.String(), "queueber_listen="+qbAddr)

			// The subtests share the node and run in order (no t.Parallel): the
			// leaseq client's last step stops the node.
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

			t.Run("LeaseqClient", func(t *testing.T) {
				tap := startWireTap(t, n.addr)
				c := startCpp(t, leaseqClient, tap.addr, "--wait-done")
				lines := c.linesUntil("push waiting for the node to end the subscription")

				// 1-2: enqueue, poll, extend, ack, nack, stats, peek.
				require.GreaterOrEqual(t, len(lines), 15, "%q", lines)
				var ids []string
				for _, l := range lines[:3] {
					id, ok := strings.CutPrefix(l, "enqueued ")
					require.True(t, ok, "%q", lines)
					require.Regexp(t, `^[0-9a-f]{32}$`, id)
					ids = append(ids, id)
				}
				require.Equal(t, []string{
					"polled " + ids[0] + ` attempts=1 payload="job 1"`,
					"polled " + ids[1] + ` attempts=1 payload="job 2"`,
					"polled " + ids[2] + ` attempts=1 payload="job 3"`,
					"extend status=none later=true",
					"ack " + ids[0] + " ok",
					"ack " + ids[1] + " ok",
					"nack " + ids[2] + " ok",
					"extend finished lease status=leaseExpired",
					"stats cpp-jobs enqueued=3 delivered=3 acked=2 nacked=1 ready=0 delayed=1 inflight=0",
					"peek " + ids[2] + ` state=delayed attempts=1 lastError="cpp: downstream busy"`,
					// 3: the pipelined cancel.
					"pipelined subscribe status=none; cancel on its promised subscription ok",
					"push enqueued 5",
				}, lines[3:15])

				// 4: push. Each delivery is acked before the next one arrives (the
				// C++ consumer holds the stream until its ack returns) and carries
				// at most prefetch (2) items, in queue order.
				var payloads []string
				deliveries, largest := 0, 0
				rest := lines[15 : len(lines)-1]
				for len(rest) >= 2 {
					var k int
					var items string
					_, err := fmt.Sscanf(rest[0], "deliver %d items:", &k)
					require.NoError(t, err, "%q", rest[0])
					_, items, _ = strings.Cut(rest[0], ":")
					for _, f := range regexp.MustCompile(`"([^"]*)"`).FindAllStringSubmatch(items, -1) {
						payloads = append(payloads, f[1])
					}
					require.Equal(t, fmt.Sprintf("acked %d of %d", k, k), rest[1])
					require.LessOrEqual(t, k, 2, "a delivery over the prefetch")
					deliveries, largest = deliveries+1, max(largest, k)
					rest = rest[2:]
				}
				require.Equal(t, []string{"push 1", "push 2", "push 3", "push 4", "push 5"}, payloads, "%q", lines)
				require.Equal(t, []string{fmt.Sprintf("push acked=5 deliveries=%d largest=%d in_progress_max=1", deliveries, largest)}, rest)

				// The node's state while the C++ consumer still holds its
				// subscription.
				jobs := n.stats("cpp-jobs")
				require.Equal(t, queueStats{Delayed: 1, Enqueued: 3, Delivered: 3, Acked: 2, Nacked: 1}, jobs)
				peeked := parsePolled(t, n.cli("peek", "cpp-jobs"))
				require.Len(t, peeked, 1)
				require.Equal(t, ids[2], peeked[0].ID)
				require.Equal(t, "delayed", peeked[0].State)
				require.Equal(t, 1, peeked[0].Attempts)
				require.Equal(t, "cpp: downstream busy", peeked[0].LastError)
				push := n.stats("cpp-push")
				require.Equal(t, queueStats{Enqueued: 5, Delivered: 5, Acked: 5}, push)
				// The pipelined subscription is gone (its pusher ends just after
				// the cancel returns); the push one is open.
				rpctest.Eventually(t, 30*time.Second, func() bool {
					_, page := httpGet(t, "http://"+metrics+"/metrics")
					return metricValue(page, "leaseq_rpc_subscriptions") == "1"
				}, "the pipelined subscription was not cancelled")
				_, page := httpGet(t, "http://"+metrics+"/metrics")
				require.Equal(t, "5", metricValue(page, "leaseq_rpc_items_pushed_total"))

				// On the wire, cancel went to the promised answer of the first
				// subscribe: a pipelined call, sent before subscribe's answer was
				// used.
				var subscribes []uint32
				var cancels []tappedCall
				for _, call := range tap.calledSoFar() {
					switch {
					case call.iface == schema.Queue_TypeID && call.method == 14:
						subscribes = append(subscribes, call.question)
					case call.iface == schema.Subscription_TypeID && call.method == 0:
						cancels = append(cancels, call)
					}
				}
				require.Len(t, subscribes, 2)
				require.Len(t, cancels, 1)
				require.True(t, cancels[0].pipelined, "cancel was not a pipelined call: %+v", cancels[0])
				require.Equal(t, subscribes[0], cancels[0].promised)

				// Stopping the node ends the subscription for a reason of the
				// node's: the C++ consumer receives done(unavailable) and exits.
				require.Zero(t, n.stop())
				last := c.wait()
				require.Len(t, last, 1, "%q", last)
				require.Regexp(t, `^done unavailable detail=".*shutting down"$`, last[0])
			})

			require.NotContains(t, n.logs.String(), "level=ERROR", "node logs:\n%s", n.logs)
		})
	}
}

// cppRun is a C++ client running in the background, its output read line
// by line.
type cppRun struct {
	t      *testing.T
	cmd    *exec.Cmd
	lines  chan string // closed at the end of its stdout
	stderr *syncBuffer
}

// startCpp starts bin with args; it is killed at the end of the test if
// still running.
func startCpp(t *testing.T, bin string, args ...string) *cppRun {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	c := &cppRun{t: t, cmd: exec.CommandContext(ctx, bin, args...), lines: make(chan string, 100), stderr: &syncBuffer{}}
	c.cmd.Stderr = c.stderr
	out, err := c.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, c.cmd.Start())
	go func() { // ends at EOF: when the client exits, or is killed at cleanup
		defer close(c.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		cancel()
		for range c.lines { // let the reader reach EOF before Wait
		}
		_ = c.cmd.Wait()
	})
	return c
}

// linesUntil returns the output lines up to and including marker.
func (c *cppRun) linesUntil(marker string) []string {
	c.t.Helper()
	var got []string
	timeout := time.NewTimer(time.Minute) // a failure bound only
	defer timeout.Stop()
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				c.t.Fatalf("C++ client ended before %q: %q\nstderr: %s", marker, got, c.stderr)
			}
			got = append(got, l)
			if l == marker {
				return got
			}
		case <-timeout.C:
			c.t.Fatalf("C++ client did not print %q within a minute: %q\nstderr: %s", marker, got, c.stderr)
		}
	}
}

// wait returns the rest of the output once the client has exited, which it
// must do successfully.
func (c *cppRun) wait() []string {
	c.t.Helper()
	var got []string
	for l := range c.lines { // ends at EOF; startCpp's context bounds it
		got = append(got, l)
	}
	require.NoError(c.t, c.cmd.Wait(), "C++ client: output %q\nstderr: %s", got, c.stderr)
	return got
}

// wireTap is a proxy between Cap'n Proto clients and a node that decodes
// the RPC messages the clients send on the way through, so a test can see
// what went on the wire (that a call was pipelined, for one).
type wireTap struct {
	addr string // for the clients: "unix:/path"
	mu   sync.Mutex
	// calls are the Call messages seen, in the order each client sent them.
	calls []tappedCall
}

// tappedCall is one Call message a client sent.
type tappedCall struct {
	question  uint32
	iface     uint64
	method    uint16
	pipelined bool   // the target is a promised answer, not an imported capability
	promised  uint32 // with pipelined: the question whose answer is the target
}

// startWireTap listens on a unix socket and forwards every connection to
// nodeAddr (a "unix:" address) until the end of the test.
func startWireTap(t *testing.T, nodeAddr string) *wireTap {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tap.sock")
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	tap := &wireTap{addr: "unix:" + path}
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
			down, err := ln.Accept()
			if err != nil {
				return // closed at cleanup
			}
			up, err := net.Dial("unix", strings.TrimPrefix(nodeAddr, "unix:"))
			if err != nil {
				t.Errorf("wire tap: dial node: %v", err)
				_ = down.Close()
				return
			}
			mu.Lock()
			conns = append(conns, down, up)
			mu.Unlock()
			wg.Go(func() { tap.forward(down, up) })
		}
	})
	return tap
}

// forward copies between a client (down) and the node (up) until either
// side closes, decoding what the client sends.
func (tap *wireTap) forward(down, up net.Conn) {
	closeBoth := func() { _ = down.Close(); _ = up.Close() }
	pr, pw := io.Pipe()
	var wg sync.WaitGroup
	wg.Go(func() { tap.decode(pr) })
	wg.Go(func() {
		_, _ = io.Copy(down, up)
		closeBoth()
	})
	_, err := io.Copy(up, io.TeeReader(down, pw))
	_ = pw.CloseWithError(err)
	closeBoth()
	wg.Wait()
}

// decode records the Call messages of a stream of RPC messages.
func (tap *wireTap) decode(r io.Reader) {
	defer func() { _, _ = io.Copy(io.Discard, r) }() // never stall the forwarding
	dec := capnp.NewDecoder(r)
	for {
		msg, err := dec.Decode()
		if err != nil {
			return
		}
		if call, ok := tappedCallOf(msg); ok {
			tap.mu.Lock()
			tap.calls = append(tap.calls, call)
			tap.mu.Unlock()
		}
		msg.Release()
	}
}

func tappedCallOf(msg *capnp.Message) (tappedCall, bool) {
	m, err := rpccp.ReadRootMessage(msg)
	if err != nil || m.Which() != rpccp.Message_Which_call {
		return tappedCall{}, false
	}
	c, err := m.Call()
	if err != nil {
		return tappedCall{}, false
	}
	call := tappedCall{question: c.QuestionId(), iface: c.InterfaceId(), method: c.MethodId()}
	if tgt, err := c.Target(); err == nil && tgt.Which() == rpccp.MessageTarget_Which_promisedAnswer {
		if pa, err := tgt.PromisedAnswer(); err == nil {
			call.pipelined, call.promised = true, pa.QuestionId()
		}
	}
	return call, true
}

// calledSoFar returns the calls seen until now.
func (tap *wireTap) calledSoFar() []tappedCall {
	tap.mu.Lock()
	defer tap.mu.Unlock()
	return slices.Clone(tap.calls)
}
