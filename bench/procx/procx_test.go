package procx

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
)

// TestMain doubles as a tiny server for the Start tests: with
// PROCX_HELPER_LISTEN set, the test binary listens there until SIGTERM
// (or forever, with PROCX_HELPER_IGNORE_TERM, to exercise the kill path).
func TestMain(m *testing.M) {
	if addr := os.Getenv("PROCX_HELPER_LISTEN"); addr != "" {
		if os.Getenv("PROCX_HELPER_IGNORE_TERM") != "" {
			signal.Ignore(syscall.SIGTERM)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			os.Exit(3)
		}
		for {
			c, err := l.Accept()
			if err != nil {
				os.Exit(4)
			}
			c.Close()
		}
	}
	if addr := os.Getenv("PROCX_HELPER_PARENT"); addr != "" {
		// A harness that starts a server, says its pid and waits to be
		// killed.
		os.Setenv("PROCX_HELPER_LISTEN", addr)
		exe, err := os.Executable()
		if err != nil {
			os.Exit(5)
		}
		p, err := Start(context.Background(), clock.New(), "orphan", os.Getenv("PROCX_HELPER_DIR"), addr, 20*time.Second, exe)
		if err != nil {
			os.Exit(6)
		}
		fmt.Println(p.PID())
		select {}
	}
	os.Exit(m.Run())
}

// helperBin is the test binary, run as the helper server.
func helperBin(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	return exe
}

func TestStart_WaitsForListenAndStops(t *testing.T) {
	// Not parallel with the other Start tests: it sets process-wide env
	// for the child.
	port, err := FreePort()
	require.NoError(t, err)
	addr := "127.0.0.1:" + itoa(port)
	t.Setenv("PROCX_HELPER_LISTEN", addr)
	p, err := Start(context.Background(), clock.New(), "helper", t.TempDir(), addr, 20*time.Second, helperBin(t))
	require.NoError(t, err)
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err, "Start returned only once the server listens")
	c.Close()
	u, err := ReadUsage(p.PID())
	require.NoError(t, err)
	require.Positive(t, u.PeakRSS)
	require.NoError(t, p.Stop())
	require.NoError(t, p.Stop(), "Stop is idempotent")
	_, err = net.Dial("tcp", addr)
	require.Error(t, err, "the server is gone after Stop")
}

func TestStart_ReportsAServerThatExitsWithItsLog(t *testing.T) {
	t.Parallel()
	f, err := exec.LookPath("false")
	require.NoError(t, err)
	port, err := FreePort()
	require.NoError(t, err)
	_, err = Start(context.Background(), clock.New(), "false", t.TempDir(), "127.0.0.1:"+itoa(port), 20*time.Second, f)
	require.ErrorContains(t, err, "exited before listening")
}

func TestStart_MissingBinary(t *testing.T) {
	t.Parallel()
	_, err := Start(context.Background(), clock.New(), "nope", t.TempDir(), "127.0.0.1:1", time.Second, "/nonexistent/leaseq-bench-nope")
	require.ErrorContains(t, err, "start")
}

func TestReadUsage_Self(t *testing.T) {
	t.Parallel()
	busy := 0
	for i := 0; i < 5_000_000; i++ {
		busy += i
	}
	require.Positive(t, busy)
	u, err := ReadUsage(os.Getpid())
	require.NoError(t, err)
	require.Positive(t, u.PeakRSS)
	require.GreaterOrEqual(t, u.CPU, time.Duration(0))
	require.NoError(t, ResetPeak(os.Getpid()))
	_, err = ReadUsage(1 << 30)
	require.Error(t, err)
}

func TestLookPath(t *testing.T) {
	t.Parallel()
	p, err := LookPath("sh")
	require.NoError(t, err)
	require.NotEmpty(t, p)
	dir := t.TempDir()
	bin := dir + "/leaseq-fake-server"
	require.NoError(t, os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755))
	p, err = LookPath("leaseq-fake-server", "", dir)
	require.NoError(t, err)
	require.Equal(t, bin, p)
	_, err = LookPath("leaseq-no-such-server", dir)
	require.ErrorIs(t, err, exec.ErrNotFound)
}

func itoa(i int) string { return strconv.Itoa(i) }

func TestStop_KillsAServerThatIgnoresSIGTERM(t *testing.T) {
	// Not parallel: t.Setenv configures the child. Takes StopGrace (5 s).
	port, err := FreePort()
	require.NoError(t, err)
	addr := "127.0.0.1:" + itoa(port)
	t.Setenv("PROCX_HELPER_LISTEN", addr)
	t.Setenv("PROCX_HELPER_IGNORE_TERM", "1")
	clk := clock.New()
	p, err := Start(context.Background(), clk, "stubborn", t.TempDir(), addr, 20*time.Second, helperBin(t))
	require.NoError(t, err)
	start := clk.Now()
	require.NoError(t, p.Stop())
	require.GreaterOrEqual(t, clk.Since(start), StopGrace, "SIGTERM was ignored, so Stop waited out the grace period")
	_, err = net.Dial("tcp", addr)
	require.Error(t, err, "the server was killed")
}

func TestCPUTimes(t *testing.T) {
	t0, err := parseCPUTimes([]byte("cpu  100 5 50 800 10 1 2 30 7 0\ncpu0 50 2 25 400 5 0 1 15 3 0\n"))
	require.NoError(t, err)
	require.Equal(t, CPUTimes{Total: 998, Steal: 30}, t0, "guest time is not counted again")
	t1, err := parseCPUTimes([]byte("cpu  150 5 70 900 10 1 2 55 7 0\n"))
	require.NoError(t, err)
	require.InDelta(t, 25.0/195, StealShare(t0, t1), 1e-12)
	require.Zero(t, StealShare(t1, t1))
	_, err = parseCPUTimes([]byte("intr 1 2 3\n"))
	require.Error(t, err)

	now, err := ReadCPUTimes()
	require.NoError(t, err)
	require.Positive(t, now.Total)
	require.GreaterOrEqual(t, now.Steal, int64(0))
}

func TestStart_ServerDiesWithItsHarness(t *testing.T) {
	// Not parallel: t.Setenv configures the child.
	port, err := FreePort()
	require.NoError(t, err)
	addr := "127.0.0.1:" + itoa(port)
	t.Setenv("PROCX_HELPER_PARENT", addr)
	t.Setenv("PROCX_HELPER_DIR", t.TempDir())
	harness := exec.Command(helperBin(t))
	out, err := harness.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, harness.Start())
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "the harness started its server")
	pid, err := strconv.Atoi(line[:len(line)-1])
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // if the test fails
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err, "the server listens")
	c.Close()

	require.NoError(t, harness.Process.Kill())
	_ = harness.Wait()
	clk := clock.New()
	deadline := clk.Now().Add(20 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return // the server died with its harness
		}
		c.Close()
		require.True(t, clk.Now().Before(deadline), "the server still listens 20 s after its harness was killed")
		clk.Sleep(10 * time.Millisecond)
	}
}
