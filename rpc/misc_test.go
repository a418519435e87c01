package rpc

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/memstore"
)

func TestListen_UnixSockets(t *testing.T) {
	t.Parallel()
	dir, err := shortTempDir(t)
	require.NoError(t, err)
	path := filepath.Join(dir, "s.sock")

	t.Run("StaleSocketIsReplaced", func(t *testing.T) {
		ln, err := net.Listen("unix", path)
		require.NoError(t, err)
		ln.(*net.UnixListener).SetUnlinkOnClose(false) // as if the process died
		require.NoError(t, ln.Close())
		_, err = os.Lstat(path)
		require.NoError(t, err)
		ln2, err := Listen("unix:" + path)
		require.NoError(t, err)
		defer ln2.Close()

		t.Run("LiveSocketIsKept", func(t *testing.T) {
			_, err := Listen("unix:" + path)
			require.ErrorContains(t, err, "live server")
		})
	})

	t.Run("NotASocket", func(t *testing.T) {
		f := filepath.Join(dir, "plain")
		require.NoError(t, os.WriteFile(f, []byte("x"), 0o600))
		_, err := Listen("unix:" + f)
		require.ErrorContains(t, err, "not a socket")
	})

	t.Run("BadAddresses", func(t *testing.T) {
		for _, a := range []string{"unix:", "nohostport", "tcp://x:1"} {
			_, err := Listen(a)
			require.Error(t, err, a)
			_, err = Dial(context.Background(), a, ClientOptions{})
			require.Error(t, err, a)
		}
	})
}

func TestLogFilter_DemotesDisconnects(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	base := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	l := capnpLogger(base)
	l.Error("rpc: receive: connection closed")
	l.Error("rpc: send message: write tcp 127.0.0.1:1: broken pipe")
	require.Empty(t, buf.String())
	l.Error("rpc: handle Call: something actually broke")
	require.Contains(t, buf.String(), "something actually broke")
	require.Contains(t, buf.String(), "level=ERROR")

	buf.Reset()
	l.Error("reader: transport: stream transport: receive: decode: message too large")
	require.Contains(t, buf.String(), "level=WARN")
	require.Contains(t, buf.String(), "message too large")

	buf.Reset()
	debug := capnpLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	debug.Error("rpc: connection closed", "k", "v")
	require.Contains(t, buf.String(), "level=DEBUG")
	require.Contains(t, buf.String(), "k=v")
}

func TestMetrics_CountsAndSub(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{transport: "pipe"})
	c := b.dial()
	ctx := ctxT(t)
	_, err := c.Enqueue(ctx, "m", payloads(3, 8))
	require.NoError(t, err)
	first := b.srv.Metrics()
	require.Equal(t, uint64(1), first.Ops[OpEnqueue].Count)
	require.Equal(t, uint64(0), first.Ops[OpEnqueue].Errors)
	require.Equal(t, 1, first.ConnsOpen)
	require.Equal(t, uint64(1), first.ConnsAccepted)
	_, err = c.Poll(ctx, "bad/name", 1, 0, 0)
	require.Error(t, err)
	_, err = c.Poll(ctx, "m", 3, 0, 0)
	require.NoError(t, err)
	m := b.srv.Metrics()
	d := m.Sub(first)
	require.Equal(t, uint64(0), d.Ops[OpEnqueue].Count)
	require.Equal(t, uint64(2), d.Ops[OpPoll].Count)
	require.Equal(t, uint64(1), d.Ops[OpPoll].Errors)
	var inBuckets uint64
	for _, n := range m.Ops[OpPoll].Buckets {
		inBuckets += n
	}
	require.Equal(t, uint64(2), inBuckets)
	require.Len(t, m.Ops[OpPoll].Buckets, len(LatencyBounds)+1)
	require.Equal(t, "dead_list", OpDeadList.String())
}

// TestServer_StartStopStress starts and stops servers with clients in
// flight; run under -race it checks Stop's ordering and goleak checks that
// nothing is left behind.
func TestServer_StartStopStress(t *testing.T) {
	t.Parallel()
	for i := 0; i < 15; i++ {
		st := memstore.New(memstore.Options{})
		srv, err := NewServer(ServerConfig{Store: st, Clock: clock.NewMock(), Logger: rpctest.Logger(t), Engine: testEngine})
		require.NoError(t, err)
		ln, err := Listen("127.0.0.1:0")
		require.NoError(t, err)
		require.NoError(t, srv.Start(context.Background(), ln))
		c, err := Dial(ctxT(t), ln.Addr().String(), ClientOptions{Logger: rpctest.Logger(t)})
		require.NoError(t, err)
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = c.Poll(context.Background(), "q", 1, 0, time.Minute)
		}()
		if i%2 == 0 {
			_, err = c.Enqueue(ctxT(t), "q", payloads(1, 8))
			require.NoError(t, err)
		}
		srv.Stop()
		srv.Stop()
		<-done
		require.NoError(t, c.Close())
		require.NoError(t, st.Close())
	}
	// Serve returns nil when its context ends.
	st := memstore.New(memstore.Options{})
	defer st.Close()
	srv, err := NewServer(ServerConfig{Store: st, Clock: clock.NewMock(), Engine: testEngine})
	require.NoError(t, err)
	ln, err := Listen("127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()
	cancel()
	require.NoError(t, <-served)
	srv.Stop()
}

func TestNewServer_Validates(t *testing.T) {
	t.Parallel()
	_, err := NewServer(ServerConfig{})
	require.Error(t, err)
	_, err = NewServer(ServerConfig{Store: memstore.New(memstore.Options{})})
	require.Error(t, err)
	_, err = NewServer(ServerConfig{Store: memstore.New(memstore.Options{}), Clock: clock.NewMock(), MaxConns: -1})
	require.Error(t, err)
}

// TestFlowTransport_StopsReadingWhenBudgetSpent: once the unreleased
// incoming messages of a connection reach the budget, the next message is
// not taken off the wire until one is released.
func TestFlowTransport_StopsReadingWhenBudgetSpent(t *testing.T) {
	t.Parallel()
	srvSide, cliSide := net.Pipe()
	defer cliSide.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Three Bootstrap messages of equal size; the budget fits two.
	send := transportNewStream(cliSide)
	sizes := make(chan uint64, 3)
	go func() {
		for i := 0; i < 3; i++ {
			m, err := send.NewMessage()
			if err != nil {
				return
			}
			if _, err := m.Message().NewBootstrap(); err != nil {
				return
			}
			n, _ := m.Message().Message().TotalSize()
			sizes <- n
			if err := m.Send(); err != nil {
				return
			}
			m.Release()
		}
	}()
	size := <-sizes
	ft := newServerTransport(ctx, srvSide, 1<<20, int64(2*size), nil)

	in1, err := ft.RecvMessage()
	require.NoError(t, err)
	in2, err := ft.RecvMessage()
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		in3, err := ft.RecvMessage()
		if err == nil {
			in3.Release()
		}
		got <- err
	}()
	// The budget is spent: nothing more can be admitted until a release.
	sem := ft.(*flowTransport).budget.sem
	require.False(t, sem.TryAcquire(1))
	select {
	case err := <-got:
		t.Fatalf("read past the budget: %v", err)
	default:
	}
	in1.Release()
	select {
	case err := <-got:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("a released message did not unblock reading")
	}
	in2.Release()
	require.NoError(t, ft.Close())
}

// flakyListener fails its first Accept calls with EMFILE.
type flakyListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

func TestServer_AcceptRetriesTemporaryErrors(t *testing.T) {
	t.Parallel()
	st := memstore.New(memstore.Options{})
	defer st.Close()
	// The real clock: the retry backoff is a few milliseconds.
	srv, err := NewServer(ServerConfig{Store: st, Clock: clock.New(), Logger: rpctest.Logger(t), Engine: testEngine})
	require.NoError(t, err)
	defer srv.Stop()
	ln, err := Listen("127.0.0.1:0")
	require.NoError(t, err)
	fl := &flakyListener{Listener: ln}
	fl.fails.Store(3)
	require.NoError(t, srv.Start(context.Background(), fl))
	c, err := Dial(ctxT(t), ln.Addr().String(), ClientOptions{Logger: rpctest.Logger(t)})
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Queues(ctxT(t))
	require.NoError(t, err)
	require.Less(t, fl.fails.Load(), int32(0))
}

func TestClient_NodeInfo(t *testing.T) {
	t.Parallel()
	want := NodeInfo{Version: "v1.2.3 abcdef012345", Backend: "rocksdb", Sync: "none"}
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) { c.Info = want }})
	got, err := b.dial().NodeInfo(ctxT(t))
	require.NoError(t, err)
	d := storage.DefaultLimits
	want.MaxBatch, want.MaxPayload = d.MaxBatch, d.MaxPayload
	want.MinLease, want.MaxLease, want.MaxDelay = d.MinLease, d.MaxLease, d.MaxDelay
	require.Equal(t, want, got)
	require.Equal(t, d, got.Limits())
	require.Equal(t, uint64(1), b.srv.Metrics().Ops[OpNodeInfo].Count)
	require.Equal(t, "node_info", OpNodeInfo.String())
}
