package main

import (
	"os"
	"strings"
	"syscall"
)

// Go's sysmon and the node's cgo calls.
//
// The Go runtime's monitor thread (sysmon) sleeps for good once every P is
// idle, and the next goroutine to enter a system call or cgo call wakes it
// with a futex. Woken that way, it polls every 20 µs for the next
// millisecond. A node serving calls one at a time goes idle between them,
// and every call enters cgo (its RocksDB commit): so each call paid a
// futex wake of sysmon and several sysmon wake-ups, 15-20 % of the node's
// CPU in BenchmarkRPC_EnqueueRoundTrip (docs/BENCHMARKS.md, "sysmon").
//
// The runtime has one switch that keeps sysmon from that deep sleep:
// GODEBUG=schedtrace=N, which also prints a scheduler summary to stderr
// every N ms. With N at its largest (about 24.8 days) sysmon never sleeps
// for good, finds nothing to do, and backs off to one wake-up every 10 ms;
// no cgo call has to wake it. The variable is read only when the process
// starts, so `leaseq serve` re-executes itself with it set.
//
// Side effects: on a host up for longer than N the runtime prints one
// "SCHED" line at start (and another every 24.8 days), and a fatal crash
// dumps the scheduler's state before the stack traces. A GODEBUG that
// already sets schedtrace (schedtrace=0 turns this off) is left alone.

// sysmonSchedtrace is the largest schedtrace the runtime accepts (an
// int32 of milliseconds).
const sysmonSchedtrace = "schedtrace=2147483647"

// sysmonEnv returns the environment to re-execute the node with, or false
// when GODEBUG already says what schedtrace is.
func sysmonEnv(environ []string) ([]string, bool) {
	out := make([]string, 0, len(environ)+1)
	found := false
	for _, kv := range environ {
		v, ok := strings.CutPrefix(kv, "GODEBUG=")
		if !ok {
			out = append(out, kv)
			continue
		}
		for _, f := range strings.Split(v, ",") {
			if strings.HasPrefix(f, "schedtrace=") {
				return nil, false
			}
		}
		found = true
		if v != "" {
			v += ","
		}
		out = append(out, "GODEBUG="+v+sysmonSchedtrace)
	}
	if !found {
		out = append(out, "GODEBUG="+sysmonSchedtrace)
	}
	return out, true
}

// reexecForSysmon replaces the process with itself, same arguments, with
// schedtrace set (see above). It returns only when no re-execution is
// needed or it failed; the node then runs as it is.
func reexecForSysmon() {
	env, ok := sysmonEnv(os.Environ())
	if !ok {
		return
	}
	exe, err := os.Executable()
	if err != nil {
		return
	}
	_ = syscall.Exec(exe, os.Args, env)
}
