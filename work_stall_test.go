package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// stallProxy forwards connections on a unix socket to a node until the
// node has answered once per connection (the dial's bootstrap); from then
// on it drops what the client sends, so every later call goes unanswered:
// a node that stalled (SIGSTOP, a VM pause, a partition without RST).
func stallProxy(t *testing.T, nodeAddr string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "p.sock")
	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)
	var wg sync.WaitGroup
	var conns sync.Map
	t.Cleanup(func() {
		_ = ln.Close()
		conns.Range(func(k, _ any) bool { _ = k.(net.Conn).Close(); return true })
		wg.Wait()
	})
	wg.Go(func() {
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("unix", strings.TrimPrefix(nodeAddr, "unix:"))
			if err != nil {
				_ = down.Close()
				continue
			}
			conns.Store(down, true)
			conns.Store(up, true)
			var answered atomic.Bool
			wg.Go(func() { // node -> client, whole
				buf := make([]byte, 64<<10)
				for {
					n, err := up.Read(buf)
					if n > 0 {
						answered.Store(true)
						if _, err := down.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
			wg.Go(func() { // client -> node, until the node answered once
				buf := make([]byte, 64<<10)
				for {
					n, err := down.Read(buf)
					if n > 0 && !answered.Load() {
						if _, err := up.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
		}
	})
	return "unix:" + sock
}

// TestWork_StalledNodeAtStartStopsOnSIGTERM: a node that accepted the
// connection and then stalled (SIGSTOP, a paused VM, a partition without
// a reset). leaseq work without --lease asks the node for its limits;
// that call ran on the process's ctx, with no deadline, after the signals
// were set up, and SIGTERM (which only stops taking items) did not end
// it: leaseq work, holding no item, hung until a third signal. Found by
// review (session 73). It is now asked with the dial, within the
// client's call timeout.
// With --lease (no such call) SIGTERM stopped it at once before too.
func TestWork_StalledNodeAtStartStopsOnSIGTERM(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		flags []string
	}{{"default lease", nil}, {"lease given", []string{"--lease", "30s"}}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := startNode(t, filepath.Join(t.TempDir(), "data"), "--sync", "none")
			addr := stallProxy(t, n.addr)
			te := newTestEnv(nil)
			codes := make(chan int, 1)
			args := append([]string{"work", "stalled", "--addr", addr}, tc.flags...)
			go func() { codes <- run(context.Background(), append(args, "--", "true"), &te.env) }()
			var sigc chan<- os.Signal
			select {
			case sigc = <-te.sigs:
			case code := <-codes:
				t.Fatalf("work exited with %d before handling signals: %s", code, te.errOut)
			case <-time.After(time.Minute):
				t.Fatal("work never registered for signals")
			}
			sigc <- syscall.SIGTERM
			select {
			case code := <-codes:
				require.Equal(t, exitOK, code, te.errOut.String())
			case <-time.After(30 * time.Second):
				t.Fatalf("leaseq work holding no item did not stop within 30 s of SIGTERM: %s", te.errOut)
			}
		})
	}
}
