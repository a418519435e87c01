// The work command: run a program once per item of a queue, as a
// supervised worker on top of rpc.Client.Consume. workchild.go runs one
// child process.

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/storage"
)

// exTempFail is EX_TEMPFAIL of sysexits.h: the command asks to be retried
// later, after --retry-delay when given.
const exTempFail = 75

var workCommand = &command{
	name:     "work",
	args:     "QUEUE -- CMD [ARGS...]",
	summary:  "run a program once per item of a queue (a supervised worker)",
	dashArgs: true,
	help: `
Take items from QUEUE and run CMD with ARGS once per item, until stopped.
"--" is required: everything after it is the command, never leaseq flags.

Each run of CMD gets the item's payload on stdin and these variables
(on top of leaseq work's own environment):

  LEASEQ_QUEUE             the queue
  LEASEQ_ID                the item id, 32 hex digits as the CLI prints it
  LEASEQ_ATTEMPTS          deliveries so far, counting this one (1, 2, ...)
  LEASEQ_ENQUEUED_AT       when the item was enqueued
  LEASEQ_LAST_ERROR        the reason of the previous failed attempt ("" if none)
  LEASEQ_LEASE_EXPIRES_AT  the lease's expiry when the item was handed over

Times are RFC 3339 in UTC with milliseconds (2026-01-02T15:04:05.123Z), as
poll prints them. The lease is extended every --lease/3 while CMD runs,
so a long job keeps its item however long it takes.

Exit 0 acks the item. Any other exit nacks it, with "exit status N: " and
the last 1 KiB of CMD's stderr as the reason, so 'leaseq peek' (last_error)
and 'leaseq dlq ls' (reason) show why; it is retried after the queue's
backoff, or dead-lettered after its max attempts. Exit 75 (EX_TEMPFAIL)
nacks it with --retry-delay when given (a --retry-delay over the node's
--max-delay is refused at the start; a node too old to tell its limits
refuses it at the nack, and then the queue's backoff is used). After
--timeout, CMD's process group gets SIGTERM, then SIGKILL after
--kill-grace, and the item is nacked with "timed out after D". If the
lease is lost (an extend finds it gone, or none went through for a whole
lease: the node unreachable), CMD is killed the same way: the item will
be delivered again. A poll the node refuses for now (too many waiters, the
node stopping) is made again after a pause.

CMD runs in a process group of its own, with its stdout and stderr passed
through; if leaseq work itself dies (SIGKILL), CMD gets SIGKILL (the
processes CMD started do not). With --concurrency above 1, up to that many
run at once and each line they print is prefixed with "[ID] " and written
whole, so lines of different items never mix (a line over 1 MiB is
written in pieces of 1 MiB, each prefixed and ended with a newline).

SIGINT, SIGTERM or SIGHUP stops taking items and lets the running ones
finish (at most --drain-timeout, then they are killed as on --timeout and
nacked for immediate redelivery); a second signal SIGKILLs their process
groups at once and nacks their items the same way (a third signal exits
without waiting for the node).

Exit codes: 0 after a signal, or with --max-items once that many items
were handled and all succeeded, provided every ack and nack reached the
node; 3 with --max-items if any item's command failed, a signal or not
(an item killed by the stop, after --drain-timeout, is not counted as
failed); 1 if leaseq work failed (lost the node, a bad queue name or
lease), an item's ack or nack failed (the item comes back once its lease
runs out), or a second signal stopped it; 2 for a bad command line.

Example:
  leaseq work thumbnails --concurrency 4 --timeout 5m -- ./make-thumbnail.sh`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		cf := addConnFlags(fs, e)
		lf := addLogFlags(fs, "info")
		conc := newChoice("1", intRange(1, 1000))
		fs.Var(conc, "concurrency", "most `items` handled at once, each by its own run of CMD")
		lease := newChoice(storage.DefaultLeaseDuration.String(), positiveDuration)
		fs.Var(lease, "lease", "lease `duration` of each item, extended every third of it while CMD runs (not given: the default 30s, within the node's --min-lease and --max-lease)")
		timeout := newChoice("0s", nonNegDuration)
		fs.Var(timeout, "timeout", "kill CMD and nack its item after this `duration` (0: no limit)")
		retryDelay := &optDuration{}
		fs.Var(retryDelay, "retry-delay", "redeliver an item whose CMD exits 75 (EX_TEMPFAIL) after this `duration`, at most the node's --max-delay (default: the queue's backoff)")
		grace := newChoice("10s", positiveDuration)
		fs.Var(grace, "kill-grace", "`duration` between SIGTERM and SIGKILL when CMD is killed")
		drain := newChoice("0s", nonNegDuration)
		fs.Var(drain, "drain-timeout", "after SIGINT/SIGTERM/SIGHUP, kill running commands after this `duration` (0: wait for them)")
		maxItems := newChoice("0", intRange(0, 1<<31-1))
		fs.Var(maxItems, "max-items", "exit after handling this many `items` (0: run until stopped)")
		// --timeout and --max-items change what happens to every item,
		// and --retry-delay ends up stored in the node: an exported
		// LEASEQ_TIMEOUT meant for the other client commands (where it
		// bounds a call) must not kill every job after 10 s.
		cliOnly(fs, "timeout", "retry-delay", "max-items")
		return func(ctx context.Context, args []string) error {
			w, err := parseWorkArgs(args)
			if err != nil {
				return err
			}
			w.concurrency, w.lease, w.timeout = conc.val, lease.val, timeout.val
			if !lease.set {
				w.lease = 0 // the default, or the node's --max-lease when shorter (fromNode)
			}
			w.killGrace, w.drainTimeout, w.maxItems = grace.val, drain.val, maxItems.val
			if retryDelay.set {
				// One over the most any node takes is refused here, one
				// over the node's --max-delay once connected (a node too
				// old to tell its --max-delay refuses it at the first
				// nack, which then uses the queue's backoff).
				if retryDelay.d > longestLimit {
					return usagef("--retry-delay %v is over %v (100 years), the longest --max-delay a node takes", retryDelay.d, longestLimit)
				}
				w.retryDelay = &retryDelay.d
			}
			stderr := &lockedWriter{w: e.stderr}
			log := lf.logger(stderr)
			dctx, cancel := context.WithTimeout(ctx, *cf.timeout)
			c, err := cf.dial(dctx)
			if err == nil {
				err = w.fromNode(dctx, c)
				if err != nil {
					c.Close()
				}
			}
			cancel()
			if err != nil {
				return err
			}
			defer c.Close()
			return runWork(ctx, e, c, w, stderr, log)
		}
	},
}

// fromNode completes w with what the node says, on the dial's bounded
// ctx: a --retry-delay over the node's --max-delay, which the node would
// refuse at every nack, is refused (a node too old to report its
// --max-delay, 0, passes); without --lease the lease is the default,
// within the node's --max-lease (as Consume would; found by review,
// session 70: a node with --max-lease under 30 s refused every poll).
// Asked after the signals were set up, with no deadline, a node that
// stalled held leaseq work there, deaf to SIGTERM (found by review,
// session 73).
func (w *workConfig) fromNode(ctx context.Context, c *rpc.Client) error {
	if w.retryDelay == nil && w.lease != 0 {
		return nil
	}
	ni, err := c.NodeInfo(ctx)
	if w.retryDelay != nil {
		if err != nil {
			return err
		}
		if ni.MaxDelay > 0 && *w.retryDelay > ni.MaxDelay {
			return usagef("--retry-delay %v is over the node's --max-delay %v", *w.retryDelay, ni.MaxDelay)
		}
	}
	if w.lease == 0 {
		w.lease = storage.DefaultLeaseDuration
		if err == nil {
			w.lease = ni.LeaseWithin(w.lease)
		}
	}
	return nil
}

// workConfig is a work command line, parsed.
type workConfig struct {
	queue        string
	path         string   // CMD resolved through PATH
	argv         []string // CMD and ARGS as given
	concurrency  int
	lease        time.Duration
	timeout      time.Duration // per item; 0: none
	killGrace    time.Duration
	drainTimeout time.Duration // 0: none
	retryDelay   *time.Duration
	maxItems     int
}

// parseWorkArgs splits "QUEUE -- CMD [ARGS...]" and finds CMD.
func parseWorkArgs(args []string) (workConfig, error) {
	i := slices.Index(args, "--")
	if i < 0 {
		return workConfig{}, usagef(`missing "--" before the command: want QUEUE -- CMD [ARGS...]`)
	}
	if err := argsBetween(args[:i], 1, 1, "QUEUE -- CMD [ARGS...]"); err != nil {
		return workConfig{}, err
	}
	argv := args[i+1:]
	if len(argv) == 0 || argv[0] == "" {
		return workConfig{}, usagef(`missing the command after "--": want QUEUE -- CMD [ARGS...]`)
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return workConfig{}, usagef("cannot run %q: %v", argv[0], unwrapExecError(err))
	}
	return workConfig{queue: args[0], path: path, argv: argv}, nil
}

// unwrapExecError drops exec.Error's own `exec: "name":` prefix, which the
// caller already says.
func unwrapExecError(err error) error {
	var ee *exec.Error
	if errors.As(err, &ee) {
		return ee.Err
	}
	return err
}

// Why running commands are killed before they finish.
var (
	errSecondSignal = errors.New("interrupted: leaseq work got a second signal")
	errDrainTimeout = errors.New("interrupted: leaseq work stopped and its --drain-timeout ran out")
)

// runWork consumes w.queue until a signal (or --max-items) and reports the
// outcome as work's exit code.
func runWork(ctx context.Context, e *env, c *rpc.Client, w workConfig, stderr *lockedWriter, logger *slog.Logger) error {
	clk := e.clock
	log := logger.With("svc", "work", "queue", w.queue)
	s := newSupervisor(w, clk, e.stdout, stderr, log)

	sigs := make(chan os.Signal, 3)
	// SIGHUP (the terminal closed) drains like SIGTERM: left to its
	// default action it would end leaseq work at once, while CMD, in a
	// process group of its own, never gets it and runs on beside its
	// item's redelivery.
	stopSignals := e.notifySignals(sigs, syscall.SIGHUP)
	defer stopSignals()
	takeCtx, stopTaking := context.WithCancel(ctx)
	defer stopTaking()
	done := make(chan struct{})
	var second atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() { s.watchSignals(e, sigs, done, stopTaking, &second) })

	log.Info("leaseq work started", "command", w.argv[0], "concurrency", w.concurrency, "lease", w.lease, "timeout", w.timeout)
	err := c.Consume(takeCtx, rpc.ConsumerConfig{
		Queue:    w.queue,
		Workers:  w.concurrency,
		Batch:    1, // one item per run of CMD; a batch would hold its later items unstarted
		Lease:    w.lease,
		Clock:    clk,
		Logger:   logger, // Consume adds its own svc and queue
		MaxItems: w.maxItems,
		Handler:  s.handle,
		// A failed ack or nack is counted and makes the run exit 1: the
		// item comes back although it was handled.
		OnSettleFailed: s.settleFailed,
		OnBackoffNack:  s.backoffNack,
	})
	close(done)
	wg.Wait()
	handled, failed, interrupted, unsettled := s.handled.Load(), s.failed.Load(), s.stopKilled.Load(), s.unsettled.Load()
	log.Info("leaseq work stopped", "handled", handled, "failed", failed, "not_settled", unsettled)
	switch {
	case err != nil:
		return err
	case second.Load():
		return exitError{exitFailure, fmt.Errorf("stopped by a second signal (%d items handled, %d failed)", handled, failed)}
	case unsettled > 0:
		return exitError{exitFailure, fmt.Errorf("%d of %d items could not be acked or nacked (see the log): they will be delivered again once their lease runs out", unsettled, handled)}
	case w.maxItems > 0 && failed > interrupted:
		// Found by review (session 74): an item killed by the stop
		// (--drain-timeout) counted as failed, so a drain that ran out
		// exited 3 with --max-items and 0 without it.
		msg := fmt.Sprintf("%d of %d items failed (nacked)", failed-interrupted, handled)
		if n := s.backoffNacks.Load(); n > 0 {
			msg += fmt.Sprintf("; %d of them with the queue's backoff, as the node refused --retry-delay %v", n, *w.retryDelay)
		}
		if interrupted > 0 {
			msg += fmt.Sprintf("; %d more %s interrupted by the stop and nacked for redelivery", interrupted, plural(interrupted, "was", "were"))
		}
		return exitError{exitItemsFailed, errors.New(msg)}
	}
	return nil
}

// plural is one when n is 1, else many.
func plural(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// settleFailed counts an item whose ack or nack failed (Consume's
// OnSettleFailed): the node delivers it again once its lease runs out, so
// the run must not say all went well.
func (s *supervisor) settleFailed(id storage.ItemID, ack bool, err error) {
	s.unsettled.Add(1)
	if ack {
		s.log.Warn("ack failed: the item will be delivered again", "job_id", id.String(), "err", err)
		return
	}
	s.log.Warn("nack failed: the item will be delivered again once its lease runs out", "job_id", id.String(), "err", err)
}

// backoffNack counts an item nacked with the queue's backoff because the
// node refused its delay (Consume's OnBackoffNack): only --retry-delay can
// be over the node's --max-delay, which the client cannot learn. The
// first one is said in the log in terms of the flag.
func (s *supervisor) backoffNack(_ storage.ItemID, delay time.Duration, err error) {
	s.backoffNacks.Add(1)
	if !s.retryDelayRefused.Swap(true) {
		s.log.Warn("the node refused --retry-delay (over its --max-delay): items are nacked with the queue's backoff instead",
			"retry_delay", delay, "err", err)
	}
}

// watchSignals turns the first signal into a drain (stopTaking), and the
// drain timeout or a second signal into killing the running commands. A
// third signal exits at once, should settling their items hang.
func (s *supervisor) watchSignals(e *env, sigs <-chan os.Signal, done <-chan struct{}, stopTaking func(), second *atomic.Bool) {
	select {
	case sig := <-sigs:
		s.log.Info("stopping: no new items, waiting for the running ones", "signal", sig.String(),
			"running", s.running.Load(), "drain_timeout", s.cfg.drainTimeout)
		stopTaking()
	case <-done:
		return
	}
	var drainC <-chan time.Time
	if s.cfg.drainTimeout > 0 {
		t := s.clk.Timer(s.cfg.drainTimeout)
		defer t.Stop()
		drainC = t.C
	}
	for killed := false; !killed; {
		select {
		case <-drainC:
			drainC = nil
			s.log.Warn("drain timeout: killing the running commands", "running", s.running.Load())
			s.interrupt(errDrainTimeout)
		case sig := <-sigs:
			s.log.Warn("second signal: killing the running commands", "signal", sig.String(), "running", s.running.Load())
			second.Store(true)
			s.killNow(errSecondSignal)
			killed = true
		case <-done:
			return
		}
	}
	select {
	case sig := <-sigs:
		s.log.Warn("third signal: exiting without settling the running items", "signal", sig.String())
		e.exit(exitFailure)
	case <-done:
	}
}
