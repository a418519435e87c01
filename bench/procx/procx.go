// Package procx runs the server processes the benchmark compares (peers and
// `leaseq serve`) and reads their resource use from /proc.
//
// Every process lives until Stop, which asks politely (SIGTERM) and kills
// after a grace period; the caller always calls it, a cancelled run
// included, and a harness that dies without it takes its servers along
// (Pdeathsig). Output goes to a log file in the process's
// own data directory so a failed start can be explained.
package procx

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/benbjohnson/clock"
)

// clockTicks is USER_HZ, the unit of utime/stime in /proc/<pid>/stat. It is
// 100 on every Linux architecture the project builds for (the kernel fixes
// it for the ABI regardless of CONFIG_HZ).
const clockTicks = 100

// StopGrace is how long Stop waits after SIGTERM before SIGKILL: long enough
// for Redis or NATS to flush on a clean exit, short enough that a wedged
// server does not stall the run.
const StopGrace = 5 * time.Second

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago. A
// race with another process taking it is possible; Start then fails with
// a clear error from the server's log.
func FreePort() (int, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// FreePorts returns n distinct TCP ports on 127.0.0.1 that were free a
// moment ago: it holds each listener open until it has them all, so two
// calls in a row cannot hand out the same port twice.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("procx: free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Process is a started server.
type Process struct {
	Name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	waitErr error
	stopMu  sync.Mutex
	stopped bool
	clk     clock.Clock
}

// Start runs bin with args, its output appended to dir/<name>.log, and
// waits (up to ready) until addr accepts TCP connections.
func Start(ctx context.Context, clk clock.Clock, name, dir, addr string, ready time.Duration, bin string, args ...string) (*Process, error) {
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("procx: %s: log file: %w", name, err)
	}
	// The process lives until Stop, not until ctx ends: the caller bounds
	// the run and always calls Stop; killing on ctx would lose the chance
	// of a clean shutdown. Cancellation still kills it via Stop.
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.Dir = dir
	// Own process group, so a terminal's SIGINT reaches the harness (which
	// drains) and not the servers directly. Killed when the harness dies
	// without stopping it (SIGKILL, a closed pipe on its output), so no
	// server outlives its run; Go's threads do not exit while the process
	// lives, which is what Pdeathsig is bound to.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("procx: %s: start %s: %w", name, bin, err)
	}
	p := &Process{Name: name, cmd: cmd, logPath: logPath, done: make(chan struct{}), clk: clk}
	go func() {
		p.waitErr = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	if err := p.waitReady(ctx, addr, ready); err != nil {
		stopErr := p.Stop()
		return nil, errors.Join(err, stopErr)
	}
	return p, nil
}

// PID is the server's process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

func (p *Process) waitReady(ctx context.Context, addr string, ready time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, ready)
	defer cancel()
	backoff := 2 * time.Millisecond
	var d net.Dialer
	for {
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("procx: %s exited before listening on %s (%v): %s", p.Name, addr, p.waitErr, p.tail())
		case <-ctx.Done():
			return fmt.Errorf("procx: %s not listening on %s after %v: %w: %s", p.Name, addr, ready, ctx.Err(), p.tail())
		case <-p.clk.After(backoff):
		}
		if backoff < 100*time.Millisecond {
			backoff *= 2
		}
	}
}

// tail returns the last lines of the log for error messages.
func (p *Process) tail() string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	return "log tail: " + strings.TrimSpace(string(b))
}

// Stop sends SIGTERM, waits up to StopGrace, then SIGKILLs. It is
// idempotent. An exit caused by our own signal is not an error.
func (p *Process) Stop() error {
	p.stopMu.Lock()
	defer p.stopMu.Unlock()
	if p.stopped {
		return nil
	}
	p.stopped = true
	select {
	case <-p.done:
		return fmt.Errorf("procx: %s exited on its own during the run (%v): %s", p.Name, p.waitErr, p.tail())
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("procx: %s: sigterm: %w", p.Name, err)
	}
	select {
	case <-p.done:
		return nil
	case <-p.clk.After(StopGrace):
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("procx: %s: kill: %w", p.Name, err)
	}
	<-p.done
	return nil
}

// Usage is a process's resource use at one moment.
type Usage struct {
	CPU     time.Duration // user + system CPU time so far
	PeakRSS int64         // VmHWM in bytes: the high-water mark of resident memory
}

// ReadUsage reads /proc/<pid>/stat and /proc/<pid>/status.
func ReadUsage(pid int) (Usage, error) {
	var u Usage
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, fmt.Errorf("procx: usage of %d: %w", pid, err)
	}
	// The command name (field 2) may contain spaces and parentheses; the
	// fields we want are counted from the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return u, fmt.Errorf("procx: usage of %d: malformed stat", pid)
	}
	f := strings.Fields(string(stat[i+1:]))
	// After ')': state is field 3, so utime (14) and stime (15) are at
	// offsets 11 and 12.
	if len(f) < 13 {
		return u, fmt.Errorf("procx: usage of %d: short stat", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return u, fmt.Errorf("procx: usage of %d: %w", pid, err)
	}
	u.CPU = time.Duration(ut+st) * time.Second / clockTicks
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, fmt.Errorf("procx: usage of %d: %w", pid, err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				return u, fmt.Errorf("procx: usage of %d: VmHWM: %w", pid, err)
			}
			u.PeakRSS = kb * 1024
		}
	}
	return u, nil
}

// CPUTimes is the machine's CPU time so far, from the "cpu" line of
// /proc/stat, in USER_HZ ticks: Total counts every state but the guest
// ones (already counted in user), Steal the time the hypervisor ran
// something else while our virtual CPUs wanted to run.
type CPUTimes struct {
	Total, Steal int64
}

// StealShare is the share of the machine's CPU time between t0 and t1
// that was stolen (0 when nothing was counted).
func StealShare(t0, t1 CPUTimes) float64 {
	d := t1.Total - t0.Total
	if d <= 0 {
		return 0
	}
	return float64(t1.Steal-t0.Steal) / float64(d)
}

// ReadCPUTimes reads /proc/stat.
func ReadCPUTimes() (CPUTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return CPUTimes{}, fmt.Errorf("procx: cpu times: %w", err)
	}
	return parseCPUTimes(b)
}

// parseCPUTimes reads the first line of /proc/stat: "cpu" and then user,
// nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice (the
// kernel has had the steal field since 2.6.11; guest ones may be missing).
func parseCPUTimes(stat []byte) (CPUTimes, error) {
	line, _, _ := bytes.Cut(stat, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return CPUTimes{}, fmt.Errorf("procx: cpu times: unexpected /proc/stat line %q", line)
	}
	var t CPUTimes
	for i, v := range f[1:min(len(f), 9)] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return CPUTimes{}, fmt.Errorf("procx: cpu times: %w", err)
		}
		t.Total += n
		if i == 7 {
			t.Steal = n
		}
	}
	return t, nil
}

// ResetPeak resets a process's VmHWM to its current RSS (Linux clear_refs
// value 5), so the peak reported for a workload is that workload's. It
// needs ptrace-level permission; failure is reported and harmless (the
// peak then covers the process's whole life).
func ResetPeak(pid int) error {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		return fmt.Errorf("procx: reset peak rss of %d: %w", pid, err)
	}
	return nil
}

// LookPath finds a server binary in PATH or in extra directories (such as
// $(go env GOPATH)/bin, where `go install` puts nats-server).
func LookPath(name string, extra ...string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range extra {
		if d == "" {
			continue
		}
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("procx: %s not found in PATH or %v: %w", name, extra, exec.ErrNotFound)
}

// GoBinDirs returns the directories `go install` writes to: $GOBIN,
// $GOPATH/bin and $HOME/go/bin, without running the go tool.
func GoBinDirs() []string {
	var ds []string
	if d := os.Getenv("GOBIN"); d != "" {
		ds = append(ds, d)
	}
	if gp := os.Getenv("GOPATH"); gp != "" {
		for _, p := range filepath.SplitList(gp) {
			ds = append(ds, filepath.Join(p, "bin"))
		}
	}
	if h, err := os.UserHomeDir(); err == nil {
		ds = append(ds, filepath.Join(h, "go", "bin"))
	}
	return ds
}
