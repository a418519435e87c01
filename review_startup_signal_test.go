package main

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// Review (session 74) of serve's startup under signals, and of check's
// look at the database's lock.
//
// A slow store open is made deterministic without a hook in the node:
// the database's CURRENT file is replaced by a FIFO, so RocksDB's open
// blocks reading it until the test writes the file's content. The test
// knows the node is inside its store open once its own non-blocking
// open of the FIFO's write end succeeds (that needs a reader).

// startupFIFO is a database whose CURRENT is a FIFO, and the content
// CURRENT had.
type startupFIFO struct {
	t       *testing.T
	data    string
	current string
	content []byte
}

func newStartupFIFO(t *testing.T) *startupFIFO {
	t.Helper()
	data := filepath.Join(t.TempDir(), "data")
	s, err := rocksstore.Open(data, rocksstore.Options{Sync: rocksstore.SyncNone})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	f := &startupFIFO{t: t, data: data, current: filepath.Join(data, "CURRENT")}
	f.content, err = os.ReadFile(f.current)
	require.NoError(t, err)
	require.NoError(t, os.Remove(f.current))
	require.NoError(t, syscall.Mkfifo(f.current, 0o600))
	return f
}

// openWriter opens the FIFO's write end without blocking, or returns
// ok=false when nothing reads it yet. A path that is no longer a FIFO
// (RocksDB wrote a new CURRENT over it) is never written.
func (f *startupFIFO) openWriter() (w *os.File, ok bool) {
	fd, err := syscall.Open(f.current, syscall.O_WRONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, false
	}
	w = os.NewFile(uintptr(fd), f.current)
	if fi, err := w.Stat(); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		_ = w.Close()
		return nil, false
	}
	return w, true
}

// waitReader returns the write end once n reads the FIFO: n is then in
// its store open, and stays there until the test writes and closes it.
func (f *startupFIFO) waitReader(n *node) *os.File {
	f.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if w, ok := f.openWriter(); ok {
			return w
		}
		select {
		case <-n.exited:
			f.t.Fatalf("leaseq serve exited before opening its store (%v):\n%s", n.err, n.logs)
		default:
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("leaseq serve never read CURRENT:\n%s", n.logs)
		}
		time.Sleep(time.Millisecond)
	}
}

// release lets the node held in its read of CURRENT go on: CURRENT
// becomes a regular file again (renamed over the FIFO, for RocksDB's
// later reads), then the held read gets the content and its end.
func (f *startupFIFO) release(w *os.File) {
	f.t.Helper()
	f.restore()
	_, err := w.Write(f.content)
	require.NoError(f.t, err)
	require.NoError(f.t, w.Close())
}

// restore makes CURRENT a regular file again, if it is still the FIFO.
func (f *startupFIFO) restore() {
	f.t.Helper()
	fi, err := os.Lstat(f.current)
	require.NoError(f.t, err)
	if fi.Mode()&os.ModeNamedPipe != 0 {
		tmp := f.current + ".test"
		require.NoError(f.t, os.WriteFile(tmp, f.content, 0o600))
		require.NoError(f.t, os.Rename(tmp, f.current))
	}
}

// startStartupNode starts `leaseq serve` on data without waiting for it
// to serve (startNode waits for its "leaseq serving").
func startStartupNode(t *testing.T, data string, extra ...string) *node {
	t.Helper()
	addr := "unix:" + filepath.Join(t.TempDir(), "s.sock")
	args := append([]string{"serve", "--data", data, "--listen", addr, "--sync", "none"}, extra...)
	n := &node{t: t, data: data, addr: addr, logs: &syncBuffer{}, exited: make(chan struct{})}
	n.cmd = exec.Command(leaseqBin, args...)
	n.cmd.Env = cleanEnv()
	n.cmd.Stdout = n.logs
	n.cmd.Stderr = n.logs
	require.NoError(t, n.cmd.Start())
	go func() {
		n.err = n.cmd.Wait()
		close(n.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-n.exited:
		default:
			_ = n.cmd.Process.Kill()
			<-n.exited
		}
		if t.Failed() {
			t.Logf("leaseq serve logs:\n%s", n.logs)
		}
	})
	return n
}

// awaitStartupSignalLog waits until n logged that a signal stops its
// startup; a node the signal killed (its default action) fails the test.
func awaitStartupSignalLog(t *testing.T, n *node) {
	t.Helper()
	rpctest.Eventually(t, time.Minute, func() bool {
		select {
		case <-n.exited:
			t.Fatalf("leaseq serve ended by %v while opening its store, with no orderly stop:\n%s", n.err, n.logs)
		default:
		}
		return strings.Contains(n.logs.String(), `msg="shutting down" signal=terminated during=startup`)
	}, "no startup-stop log line:\n%s", n.logs)
}

// requireCheckOK runs `leaseq check` on data and requires it to pass.
func requireCheckOK(t *testing.T, data string) {
	t.Helper()
	r := runCLI(t, nil, "", "check", "--data", data)
	require.Equal(t, exitOK, r.code, "check: %s%s", r.stdout, r.stderr)
	require.Contains(t, r.stdout, "all invariants hold")
}

// TestReviewStartup_SignalDuringStoreOpenStopsInOrder: SIGTERM while the
// store opens (the metrics listener already up) used to kill the node
// with the default action (exit by signal, 143 from a shell). Now the
// node says it is shutting down, lets the open finish, closes the store
// and the listener, and exits 0 without serving; the database checks
// clean.
func TestReviewStartup_SignalDuringStoreOpenStopsInOrder(t *testing.T) {
	t.Parallel()
	f := newStartupFIFO(t)
	n := startStartupNode(t, f.data, "--metrics", "127.0.0.1:0")
	w := f.waitReader(n)
	require.NoError(t, n.cmd.Process.Signal(syscall.SIGTERM))
	awaitStartupSignalLog(t, n)

	f.release(w)
	select {
	case <-n.exited:
	case <-time.After(time.Minute):
		t.Fatalf("leaseq serve did not stop after its store opened:\n%s", n.logs)
	}
	require.Equal(t, exitOK, n.cmd.ProcessState.ExitCode(), "%v:\n%s", n.err, n.logs)
	logs := n.logs.String()
	require.NotContains(t, logs, "leaseq serving")
	require.NotContains(t, logs, "level=ERROR")
	for _, want := range []string{`msg="shutting down"`, `msg="rocksstore opened"`, `msg="rocksstore closed"`, `msg="leaseq stopped" during=startup`} {
		require.Contains(t, logs, want)
	}
	require.Less(t, strings.Index(logs, `msg="shutting down"`), strings.Index(logs, `msg="rocksstore opened"`), "the signal came during the open")
	require.Less(t, strings.Index(logs, `msg="rocksstore closed"`), strings.Index(logs, `msg="leaseq stopped"`))

	requireCheckOK(t, f.data)
}

// TestReviewStartup_SecondSignalDuringStoreOpenExitsAtOnce: a second
// SIGTERM while the store open is still held up exits at once with 1, as
// a second signal does during the shutdown; the database is left as a
// crash would leave it, and checks clean.
func TestReviewStartup_SecondSignalDuringStoreOpenExitsAtOnce(t *testing.T) {
	t.Parallel()
	f := newStartupFIFO(t)
	n := startStartupNode(t, f.data)
	w := f.waitReader(n)
	require.NoError(t, n.cmd.Process.Signal(syscall.SIGTERM))
	awaitStartupSignalLog(t, n)
	require.NoError(t, n.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-n.exited:
	case <-time.After(time.Minute):
		t.Fatalf("a second signal during a held-up store open did not exit:\n%s", n.logs)
	}
	require.Equal(t, exitFailure, n.cmd.ProcessState.ExitCode(), "%v:\n%s", n.err, n.logs)
	logs := n.logs.String()
	require.Contains(t, logs, `msg="second signal: exiting without clean shutdown"`)
	require.NotContains(t, logs, "rocksstore opened")
	require.NotContains(t, logs, "leaseq stopped")

	require.NoError(t, w.Close())
	f.restore()
	requireCheckOK(t, f.data)
}

// TestReviewStartup_SignalsTakenBeforeStartup: in process, serve takes
// the signals before it opens anything (the metrics listener is the
// first thing it opens), and a SIGINT sent the moment it does stops the
// node in order, wherever startup then is, with exit 0 and the store
// closed.
func TestReviewStartup_SignalsTakenBeforeStartup(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	metrics := freePort(t)
	te := newTestEnv(map[string]string{"LEASEQ_SYNC": "none"})
	// Serve waits in its registration until the test has looked.
	proceed := make(chan struct{})
	te.notifySignals = func(c chan<- os.Signal, _ ...os.Signal) func() {
		te.sigs <- c
		<-proceed
		return func() {}
	}
	codes := make(chan int, 1)
	go func() {
		codes <- run(context.Background(), []string{"serve", "--data", data, "--log-format", "json",
			"--listen", "unix:" + filepath.Join(dir, "s.sock"), "--metrics", metrics}, &te.env)
	}()
	var sigc chan<- os.Signal
	select {
	case sigc = <-te.sigs:
	case code := <-codes:
		t.Fatalf("serve exited with %d before handling signals: %s", code, te.errOut)
	case <-time.After(time.Minute):
		t.Fatal("serve never registered for signals")
	}
	// Registered before the store exists and before the metrics
	// listener is up.
	_, err := os.Stat(data)
	require.True(t, errors.Is(err, os.ErrNotExist), "the store was opened before the signals were taken: %v", err)
	_, err = net.Dial("tcp", metrics)
	require.Error(t, err, "the metrics listener was up before the signals were taken")
	close(proceed)

	sigc <- syscall.SIGINT
	select {
	case code := <-codes:
		require.Equal(t, exitOK, code, te.errOut.String())
	case <-time.After(time.Minute):
		t.Fatalf("serve did not stop after SIGINT: %s", te.errOut)
	}
	logs := te.errOut.String()
	require.Contains(t, logs, `"msg":"shutting down"`)
	require.Contains(t, logs, `"msg":"leaseq stopped"`)
	require.NotContains(t, logs, `"level":"ERROR"`)
	if strings.Contains(logs, `"msg":"rocksstore opened"`) {
		require.Contains(t, logs, `"msg":"rocksstore closed"`)
	}
	select {
	case code := <-te.exits:
		t.Fatalf("exited at once (%d) after one signal", code)
	default:
	}
}

// TestReviewStartup_CheckSeesANodeStartedDuringTheScan: check asks who
// holds the database's lock before its read-only scan, which takes no
// lock; a node that started during the scan went unnoticed and the
// report said "all invariants hold" of a database being written. check
// asks again after the scan: the report may be inconsistent, exit 1.
func TestReviewStartup_CheckSeesANodeStartedDuringTheScan(t *testing.T) {
	t.Parallel()
	data := filepath.Join(t.TempDir(), "data")
	s, err := rocksstore.Open(data, rocksstore.Options{Sync: rocksstore.SyncNone})
	require.NoError(t, err)
	require.NoError(t, s.Close())

	te := newTestEnv(nil)
	var n *node
	te.checkScanned = func() { n = startNode(t, data, "--sync", "none") }
	code := run(context.Background(), []string{"check", "--data", data}, &te.env)
	require.NotNil(t, n, "the hook did not run")
	require.Equal(t, exitFailure, code, "stdout %q stderr %q", te.out, te.errOut)
	require.NotContains(t, te.out.String(), "all invariants hold")
	stderr := te.errOut.String()
	require.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
	require.Contains(t, stderr, "was opened by process "+strconv.Itoa(n.cmd.Process.Pid))
	require.Contains(t, stderr, "the report may be inconsistent")

	// With the node stopped, the same check passes.
	require.Equal(t, exitOK, n.stop(), n.logs.String())
	te = newTestEnv(nil)
	require.Equal(t, exitOK, run(context.Background(), []string{"check", "--data", data}, &te.env), te.errOut.String())
	require.Contains(t, te.out.String(), "all invariants hold")
}

// TestReviewStartup_LockHolderText: a lock holder in another PID
// namespace (F_GETLK's pid 0) is "another process", not "process 0".
func TestReviewStartup_LockHolderText(t *testing.T) {
	t.Parallel()
	require.Equal(t, "process 1234 (a running 'leaseq serve'?)", lockHolderText(1234, "a running 'leaseq serve'?"))
	for _, pid := range []int{0, -1} {
		got := lockHolderText(pid, "a running 'leaseq serve'?")
		require.Equal(t, "another process (a running 'leaseq serve' in another container?)", got)
		require.NotContains(t, got, "process 0")
	}
}
