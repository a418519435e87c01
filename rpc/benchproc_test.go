package rpc

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
)

// A benchmark server in a process of its own: the benchmark runs this test
// binary again with benchProcEnv set, which makes TestMain call
// serveBenchProc instead of running tests: it serves until its standard
// input closes. Over stdin and stdout it answers "cpu" with
// its CPU time so far (user+system, from getrusage), so a benchmark can
// tell the server's CPU time per call from the client's.
const benchProcEnv = "LEASEQ_BENCH_PROC" // "backend,engine"

// benchProcProfileEnv, set to a path prefix, makes each server process
// write a CPU profile to <prefix>-<backend>-<engine>.prof.
const benchProcProfileEnv = "LEASEQ_BENCH_PROC_CPUPROFILE"

// serveBenchProc is the server process: spec is "backend,engine". It
// returns the process's exit code.
func serveBenchProc(spec string) int {
	backend, engine, _ := strings.Cut(spec, ",")
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "benchmark server:", err)
		return 1
	}
	if prefix := os.Getenv(benchProcProfileEnv); prefix != "" {
		f, err := os.Create(prefix + "-" + backend + "-" + engine + ".prof")
		if err != nil {
			return fail(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fail(err)
		}
		defer pprof.StopCPUProfile()
	}
	dir, err := os.MkdirTemp("", "leaseq-benchproc-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	st, err := openBenchStoreAt(dir, backend)
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	srv, err := NewServer(ServerConfig{Store: st, Clock: clock.New(), Engine: engine})
	if err != nil {
		return fail(err)
	}
	defer srv.Stop()
	ln, err := Listen("127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	if err := srv.Start(context.Background(), ln); err != nil {
		return fail(err)
	}
	fmt.Printf("addr %s\n", ln.Addr())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "cpu" {
			fmt.Printf("cpu %d\n", processCPU())
		}
	}
	return 0
}

// processCPU is this process's CPU time so far, user plus system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchProc is a running server process.
type benchProc struct {
	addr string
	in   io.Writer
	out  *bufio.Scanner
}

func startBenchProc(b *testing.B, backend, engine string) *benchProc {
	b.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), benchProcEnv+"="+backend+","+engine, "LEASEQ_TEST_ENGINES="+EngineGoCapnp)
	if _, set := os.LookupEnv("GODEBUG"); !set {
		// As `leaseq serve` runs (sysmon.go at the repository root): Go's
		// sysmon kept from the deep sleep each cgo call would wake it from.
		cmd.Env = append(cmd.Env, "GODEBUG=schedtrace=2147483647")
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(b, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, cmd.Start())
	b.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	p := &benchProc{in: stdin, out: bufio.NewScanner(stdout)}
	p.addr = p.line(b, "addr ")
	return p
}

// line returns the rest of the next output line starting with prefix.
func (p *benchProc) line(b *testing.B, prefix string) string {
	b.Helper()
	for p.out.Scan() {
		if rest, ok := strings.CutPrefix(p.out.Text(), prefix); ok {
			return rest
		}
	}
	b.Fatalf("benchmark server: no %q line (%v)", prefix, p.out.Err())
	return ""
}

// cpu returns the server process's CPU time so far.
func (p *benchProc) cpu(b *testing.B) time.Duration {
	b.Helper()
	_, err := fmt.Fprintln(p.in, "cpu")
	require.NoError(b, err)
	ns, err := strconv.ParseInt(p.line(b, "cpu "), 10, 64)
	require.NoError(b, err)
	return time.Duration(ns)
}
