package rpc

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/memstore"
)

// testEngine is the engine setup gives servers: TestMain runs every test
// once per engine in testEngines (LEASEQ_TEST_ENGINES, comma-separated,
// overrides; benchmarks name their engines and run in the first pass only).
var testEngine = EngineGoCapnp

var testEngines = []string{EngineGoCapnp, EngineLean}

func TestMain(m *testing.M) {
	if spec := os.Getenv(benchProcEnv); spec != "" {
		os.Exit(serveBenchProc(spec)) // a benchmark's server process
	}
	if v := os.Getenv("LEASEQ_TEST_ENGINES"); v != "" {
		testEngines = strings.Split(v, ",")
	}
	flag.Parse()
	code := 0
	for i, e := range testEngines {
		testEngine = e
		if i > 0 {
			fmt.Printf("=== engine %s: every test again\n", e)
			_ = flag.Set("test.bench", "")
		}
		if code = m.Run(); code != 0 {
			break
		}
	}
	closeFuzzRocks()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// testStart is the mock clock's starting instant: a real-looking date, so
// no instant on the wire is the zero value (0 ms means "unset").
var testStart = time.Date(2026, 11, 22, 1, 0, 0, 0, time.UTC)

// storeFactory builds a fresh Store for a test.
type storeFactory struct {
	name string
	open func(t *testing.T) storage.Store
}

func memFactory() storeFactory {
	return storeFactory{"mem", func(t *testing.T) storage.Store {
		s := memstore.New(memstore.Options{})
		t.Cleanup(func() { _ = s.Close() })
		return s
	}}
}

// defaultFactory is the store of tests that name none: memstore, or
// RocksDB (sync=always, as a node runs by default) when
// LEASEQ_RPC_TEST_STORE=rocks; `make test` runs the package both ways.
func defaultFactory() storeFactory {
	if os.Getenv("LEASEQ_RPC_TEST_STORE") == "rocks" {
		return rocksFactory()
	}
	return memFactory()
}

// testBundle is one server and what a test needs around it.
type testBundle struct {
	t     *testing.T
	store storage.Store
	clock *clock.Mock
	srv   *Server
	addr  string // dial address ("" for pipe bundles)
}

type bundleOpts struct {
	factory   storeFactory
	transport string // "tcp", "unix", "pipe"
	mutate    func(*ServerConfig)
}

func setup(t *testing.T, o bundleOpts) *testBundle {
	t.Helper()
	if o.factory.open == nil {
		o.factory = defaultFactory()
	}
	if o.transport == "" {
		o.transport = "tcp"
	}
	mock := clock.NewMock()
	mock.Set(testStart)
	b := &testBundle{t: t, store: o.factory.open(t), clock: mock}
	cfg := ServerConfig{Store: b.store, Clock: mock, Logger: rpctest.Logger(t), Engine: testEngine}
	if o.mutate != nil {
		o.mutate(&cfg)
	}
	srv, err := NewServer(cfg)
	require.NoError(t, err)
	b.srv = srv
	t.Cleanup(srv.Stop)
	switch o.transport {
	case "tcp":
		ln, err := Listen("127.0.0.1:0")
		require.NoError(t, err)
		b.addr = ln.Addr().String()
		require.NoError(t, srv.Start(context.Background(), ln))
	case "unix":
		dir, err := shortTempDir(t)
		require.NoError(t, err)
		b.addr = "unix:" + filepath.Join(dir, "q.sock")
		ln, err := Listen(b.addr)
		require.NoError(t, err)
		require.NoError(t, srv.Start(context.Background(), ln))
	case "pipe":
	default:
		t.Fatalf("unknown transport %q", o.transport)
	}
	return b
}

// dial returns a client to b's server, closed at cleanup.
func (b *testBundle) dial() *Client {
	b.t.Helper()
	c, err := b.dialErr(ClientOptions{})
	require.NoError(b.t, err)
	return c
}

func (b *testBundle) dialErr(opts ClientOptions) (*Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if opts.Logger == nil {
		opts.Logger = rpctest.Logger(b.t)
	}
	var c *Client
	var err error
	if b.addr == "" {
		cs, ss := net.Pipe()
		b.srv.admit(ss, nil)
		c, err = NewClient(ctx, cs, opts)
	} else {
		c, err = Dial(ctx, b.addr, opts)
	}
	if err == nil {
		b.t.Cleanup(func() { _ = c.Close() })
	}
	return c, err
}

// shortTempDir returns a temp dir with a path short enough for a unix
// socket (t.TempDir() paths can exceed the 108-byte sun_path limit).
func shortTempDir(t *testing.T) (string, error) {
	dir := t.TempDir()
	if len(dir) < 90 {
		return dir, nil
	}
	d, err := osMkdirTemp("", "lq")
	if err != nil {
		return "", err
	}
	t.Cleanup(func() { _ = osRemoveAll(d) })
	return d, nil
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func payloads(n int, size int) []storage.EnqueueItem {
	items := make([]storage.EnqueueItem, n)
	for i := range items {
		p := make([]byte, size)
		for j := range p {
			p[j] = byte(i + j)
		}
		items[i] = storage.EnqueueItem{Payload: p}
	}
	return items
}
