// One run of work's command: process group, environment, output, timeout
// and kill, and what its end means for the item.

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/storage"
)

const (
	// stderrTailSize is how much of the end of CMD's stderr a nack
	// reason carries: enough for an error message and a short trace, well
	// under the node's --max-reason (4096 by default).
	stderrTailSize = 1 << 10
	// outputWaitDelay bounds the wait for CMD's output after it exited: a
	// process it left behind may hold the pipes open indefinitely.
	outputWaitDelay = 2 * time.Second
	// groupPollInterval is how often a killed process group is checked
	// for being gone during --kill-grace, so a command that exits on
	// SIGTERM is settled at once, not after the whole grace period.
	groupPollInterval = 20 * time.Millisecond
	// maxPrefixedLine bounds the line a linePrefixer holds back to
	// write it whole: a longer line is written in pieces of this size,
	// each with the prefix and a newline. Each run of CMD has two (stdout
	// and stderr), so --concurrency N holds at most 2N MiB this way.
	maxPrefixedLine = 1 << 20
)

// supervisor runs CMD for each item Consume hands it.
type supervisor struct {
	cfg         workConfig
	clk         clock.Clock
	log         *slog.Logger
	stdout      io.Writer     // given to CMD as is when it runs alone
	stdoutLines *lockedWriter // prefixed lines, with --concurrency > 1
	stderr      *lockedWriter // shared with the logger

	// interrupted stops running commands gently (SIGTERM, --kill-grace,
	// SIGKILL); killed SIGKILLs them at once.
	interrupted, killed *stopper

	// handled: items CMD ran for (or failed to start for); failed: those
	// whose run failed; stopKilled: those of failed that leaseq work
	// killed itself as it stopped (--drain-timeout, a second signal), not
	// a failure of CMD; unsettled: those whose ack or nack failed (they
	// come back once their lease runs out); backoffNacks: nacks made with
	// the queue's backoff because the node refused --retry-delay;
	// retryDelayRefused: that refusal was logged.
	running, handled, failed, stopKilled, unsettled, backoffNacks atomic.Int64
	retryDelayRefused                                             atomic.Bool
}

func newSupervisor(w workConfig, clk clock.Clock, stdout io.Writer, stderr *lockedWriter, log *slog.Logger) *supervisor {
	return &supervisor{
		cfg: w, clk: clk, log: log,
		stdout: stdout, stdoutLines: &lockedWriter{w: stdout}, stderr: stderr,
		interrupted: newStopper(), killed: newStopper(),
	}
}

// interrupt kills the running commands with SIGTERM, then SIGKILL after
// --kill-grace, and nacks their items with reason why.
func (s *supervisor) interrupt(why error) { s.interrupted.stop(why) }

// killNow SIGKILLs the running commands at once and nacks their items with
// reason why.
func (s *supervisor) killNow(why error) { s.killed.stop(why) }

// handle is the Consume handler: it runs CMD for it and returns nil (ack)
// or the nack reason (a RetryAfter error for a delay of its own). ctx is
// cancelled when the lease is lost.
func (s *supervisor) handle(ctx context.Context, it storage.Item) error {
	s.running.Add(1)
	defer s.running.Add(-1)
	hl, _ := rpc.HandlerLeaseFrom(ctx)
	s.log.Debug("item started", "job_id", it.ID.String(), "attempts", it.Attempts)
	o := s.runChild(ctx, it, hl)
	what, err := s.verdict(o)
	s.handled.Add(1)
	if err != nil {
		s.failed.Add(1)
		if stoppedByWork(o.killed) {
			s.stopKilled.Add(1)
		}
		s.log.Info("item failed", "job_id", it.ID.String(), "attempts", it.Attempts, "outcome", what)
		return err
	}
	s.log.Debug("item done", "job_id", it.ID.String())
	return nil
}

// childOutcome is how one run of CMD ended.
type childOutcome struct {
	startErr error            // CMD could not be started
	killed   error            // why it was killed; nil if it ended by itself
	state    *os.ProcessState // after it started
	stderr   string           // the last stderrTailSize bytes of its stderr
}

// runChild runs CMD for it in a process group of its own and waits for it
// to end, or kills the group on --timeout, a lost lease (ctx) or an
// interrupt.
func (s *supervisor) runChild(ctx context.Context, it storage.Item, hl rpc.HandlerLease) childOutcome {
	cmd := exec.Command(s.cfg.path, s.cfg.argv[1:]...)
	cmd.Args[0] = s.cfg.argv[0]
	cmd.Stdin = bytes.NewReader(it.Payload)
	cmd.Env = append(os.Environ(), childEnv(s.cfg.queue, it, hl)...)
	// Its own group: a terminal's Ctrl-C reaches leaseq work only (which
	// drains), and a kill reaches whatever CMD started. Should leaseq work
	// itself die (SIGKILL, a crash), the kernel SIGKILLs CMD (not the
	// processes CMD started), rather than leave it running beside its
	// item's redelivery.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	setParentDeathSignal(cmd.SysProcAttr)
	cmd.WaitDelay = outputWaitDelay
	tail := &tailBuffer{max: stderrTailSize}
	if s.cfg.concurrency == 1 {
		cmd.Stdout = s.stdout // an *os.File is handed to CMD directly
		cmd.Stderr = io.MultiWriter(tail, s.stderr)
	} else {
		prefix := "[" + it.ID.String() + "] "
		out := &linePrefixer{prefix: prefix, w: s.stdoutLines}
		errOut := &linePrefixer{prefix: prefix, w: s.stderr}
		defer out.flush()
		defer errOut.flush()
		cmd.Stdout = out
		cmd.Stderr = io.MultiWriter(tail, errOut)
	}
	exited := make(chan struct{})
	if err := startLocked(cmd, exited); err != nil {
		return childOutcome{startErr: err}
	}
	go func() {
		// Joined below: every path waits for exited. The error is
		// ProcessState's, or ErrWaitDelay (output held open by a
		// leftover process), which does not change the verdict.
		_ = cmd.Wait()
		close(exited)
	}()

	var timeoutC <-chan time.Time
	if s.cfg.timeout > 0 {
		t := s.clk.Timer(s.cfg.timeout)
		defer t.Stop()
		timeoutC = t.C
	}
	var killed error
	grace := s.cfg.killGrace
	select {
	case <-exited:
	case <-timeoutC:
		killed = fmt.Errorf("timed out after %v", s.cfg.timeout)
	case <-ctx.Done():
		killed = errors.New("lease lost (the item will be delivered again)")
	case <-s.interrupted.ch:
		killed = s.interrupted.err
	case <-s.killed.ch:
		killed, grace = s.killed.err, 0
	}
	if killed != nil {
		s.killGroup(cmd.Process.Pid, grace, exited)
		<-exited
	}
	return childOutcome{killed: killed, state: cmd.ProcessState, stderr: tail.String()}
}

// setParentDeathSignal has the kernel SIGKILL the child once its parent
// dies (Linux's PR_SET_PDEATHSIG). The parent, for the kernel, is the
// thread that forked the child: start it with startLocked.
func setParentDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }

// startLocked starts cmd from a goroutine locked to its OS thread until
// exited is closed (after cmd was waited for). The parent-death signal
// fires when the forking thread exits, not the process (golang/go#27505),
// and the Go runtime ends a thread whose locked goroutine exits, so the
// thread must not be handed back to the runtime while the child lives.
// The cost is one parked thread per running child.
func startLocked(cmd *exec.Cmd, exited <-chan struct{}) error {
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		err := cmd.Start()
		started <- err
		if err == nil {
			<-exited
		}
	}()
	return <-started
}

// killGroup sends SIGTERM to process group pgid, then SIGKILL once grace
// has passed (at once for grace 0, or on killNow) unless the group is gone
// by then.
func (s *supervisor) killGroup(pgid int, grace time.Duration, exited <-chan struct{}) {
	if grace > 0 {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		t := s.clk.Timer(grace)
		defer t.Stop()
		tick := s.clk.Ticker(groupPollInterval)
		defer tick.Stop()
	wait:
		for {
			select {
			case <-t.C:
				break wait
			case <-s.killed.ch:
				break wait
			case <-tick.C:
				if groupGone(pgid, exited) {
					return
				}
			}
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// groupGone reports whether the leader of process group pgid has been
// reaped and no other member is left.
func groupGone(pgid int, exited <-chan struct{}) bool {
	select {
	case <-exited:
	default:
		return false
	}
	return errors.Is(syscall.Kill(-pgid, 0), syscall.ESRCH)
}

// verdict turns an outcome into the handler's result: nil acks; an error
// nacks with its text as the reason, after the queue's backoff, or after
// a delay of its own when made by RetryAfter (s.cfg.retryDelay after exit
// 75, none after an interrupt). what is the outcome without the stderr
// tail, for the log.
func (s *supervisor) verdict(o childOutcome) (what string, err error) {
	var delay *time.Duration
	switch {
	case o.startErr != nil:
		what = "cannot start the command: " + unwrapExecError(o.startErr).Error()
	case o.killed != nil:
		what = o.killed.Error() + " (process group killed)"
		if stoppedByWork(o.killed) {
			now := time.Duration(0) // not the item's fault: up for another worker at once
			delay = &now
		}
	case o.state.Success():
		return "exit status 0", nil
	case o.state.ExitCode() == exTempFail:
		what = "exit status 75 (EX_TEMPFAIL)"
		delay = s.cfg.retryDelay
	default:
		what = o.state.String() // "exit status N" or "signal: killed"
	}
	err = errors.New(what)
	if o.stderr != "" {
		err = fmt.Errorf("%s: %s", what, o.stderr)
	}
	if delay != nil {
		err = rpc.RetryAfter(*delay, err)
	}
	return what, err
}

// stoppedByWork reports whether killed (a childOutcome's) says leaseq work
// killed CMD as it stopped, through no fault of the item.
func stoppedByWork(killed error) bool {
	return errors.Is(killed, errSecondSignal) || errors.Is(killed, errDrainTimeout)
}

// childEnv is the LEASEQ_* environment of CMD for one item. The formats
// are the CLI's: ids as 32 hex digits, times RFC 3339 UTC with
// milliseconds. None of the names is a flag's variable (TestWork_EnvNames).
func childEnv(queue string, it storage.Item, hl rpc.HandlerLease) []string {
	return []string{
		"LEASEQ_QUEUE=" + queue,
		"LEASEQ_ID=" + it.ID.String(),
		"LEASEQ_ATTEMPTS=" + strconv.FormatUint(uint64(it.Attempts), 10),
		"LEASEQ_ENQUEUED_AT=" + fmtTime(it.EnqueuedAt),
		// An environment string cannot hold NUL.
		"LEASEQ_LAST_ERROR=" + strings.ReplaceAll(it.LastError, "\x00", ""),
		"LEASEQ_LEASE_EXPIRES_AT=" + fmtTime(hl.ExpiresAt),
	}
}

// stopper is a channel closed once, with the reason.
type stopper struct {
	once sync.Once
	ch   chan struct{}
	err  error // set before ch is closed; read it after ch is
}

func newStopper() *stopper { return &stopper{ch: make(chan struct{})} }

func (st *stopper) stop(err error) {
	st.once.Do(func() {
		st.err = err
		close(st.ch)
	})
}

// lockedWriter serialises writes to w, so each Write lands whole.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// linePrefixer writes whole lines to w, each starting with prefix, in one
// Write each; a partial line waits for its end (or flush). A line longer
// than maxPrefixedLine is written in pieces of that size, each prefixed
// and ended with a newline, so that a child printing without newlines
// cannot make leaseq work hold unbounded memory. One per stream of one
// child, so exec's copying goroutine is its only writer.
type linePrefixer struct {
	prefix string
	w      io.Writer
	buf    []byte
}

func (p *linePrefixer) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	var out []byte
	start := 0
	for {
		i := bytes.IndexByte(p.buf[start:], '\n')
		if i < 0 {
			break
		}
		out = append(append(out, p.prefix...), p.buf[start:start+i+1]...)
		start += i + 1
	}
	for len(p.buf)-start > maxPrefixedLine {
		out = append(append(append(out, p.prefix...), p.buf[start:start+maxPrefixedLine]...), '\n')
		start += maxPrefixedLine
	}
	p.buf = p.buf[:copy(p.buf, p.buf[start:])]
	if len(out) == 0 {
		return len(b), nil
	}
	if _, err := p.w.Write(out); err != nil {
		return 0, err
	}
	return len(b), nil
}

// flush writes a last line that had no newline.
func (p *linePrefixer) flush() {
	if len(p.buf) > 0 {
		_, _ = p.w.Write(append(append([]byte(p.prefix), p.buf...), '\n'))
		p.buf = nil
	}
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	b   []byte
	cut bool // bytes were dropped from the front
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
		t.cut = true
	}
	return len(p), nil
}

// String is the tail as valid UTF-8 without surrounding white space (a
// rune cut at the front is dropped).
func (t *tailBuffer) String() string {
	b := t.b
	if t.cut {
		for len(b) > 0 && !utf8.RuneStart(b[0]) {
			b = b[1:]
		}
	}
	return strings.TrimSpace(strings.ToValidUTF8(string(b), "\uFFFD"))
}
