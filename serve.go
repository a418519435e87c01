// The serve command: flags, opening the backend, the node's startup and
// ordered shutdown, and the store recovery loop.

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/fdbsync"
	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/rpc/httpapi"
	"github.com/leaseq/leaseq/rpc/queueber"
	"github.com/leaseq/leaseq/rpc/webui"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
	"github.com/leaseq/leaseq/storage/steadyclock"
	"github.com/leaseq/leaseq/sweeper"
)

var serveCommand = &command{
	name:    "serve",
	summary: "run a queue node (embedded RocksDB, or FoundationDB)",
	help: `
Run a leaseq node: open (or create) the RocksDB database in --data, start
the sweeper that expires leases and wakes delayed items at their deadlines,
serve the Cap'n Proto RPC interface on --listen, and run until SIGINT or
SIGTERM. The first signal shuts down in order: stop accepting connections,
let running calls finish (parked long polls return empty over RPC, 503
unavailable over HTTP), stop the sweeper, close the store. A second signal
exits at once. A signal during startup (opening a large database can take a
while) stops it once the step under way ends, closes what was opened and
exits 0 without serving; there too a second signal exits at once.

--sync=always (the default) fsyncs the write-ahead log before any enqueue,
ack, nack or poll returns; --sync=none writes the log without fsync, which
survives a process crash but not a power loss. The startup log says which
is on, and the address it listens on. With --sync=always the node runs
one more Go scheduler thread than it has CPUs (GOMAXPROCS), since one of
them spends much of its time waiting for fsync; a GOMAXPROCS set in the
environment wins. The node re-executes itself once at start with
GODEBUG=schedtrace=2147483647, which keeps Go's sysmon from a deep sleep
that each call's RocksDB commit would have to wake it from (less CPU per
call when calls come one at a time; GODEBUG=schedtrace=0 turns it off).
It also has glibc's malloc keep the memory of flushed memtables for the
next ones (up to 32 MiB in each of at most two heaps), so that a new
memtable is not fresh memory to fault in; a GLIBC_TUNABLES that sets
glibc.malloc.trim_threshold, mmap_threshold or arena_max wins.

--listen takes host:port or unix:/path/to/socket. The default is loopback
only. With --tls-cert and --tls-key the node speaks TLS; adding
--tls-client-ca requires every client to present a certificate signed by
that CA (mutual TLS).

--http ADDR (host:port or unix:/path; off by default) also serves the
queue operations as an HTTP/JSON API (routes under /v1/, described by
GET /v1/openapi.json) over the same store, limits, long-poll waiters and
error codes, with the same TLS as --listen. --max-message bounds its
request bodies too.

--metrics ADDR serves Prometheus metrics on http://ADDR/metrics (queue
depth by state, oldest ready age, per-operation counts and latency
histograms, commit and fsync latency, sweeper lag), /healthz (the process
is up) and /readyz (200 once the store is open and the RPC listener
accepts; 503 before that, while shutting down, while the store has
stopped after a failed write, and once a call met corrupt data).

--pprof ADDR (host:port, off by default) serves Go's profiling endpoints
under http://ADDR/debug/pprof/: a CPU profile (/debug/pprof/profile?seconds=N),
an execution trace (/debug/pprof/trace?seconds=N), the heap and the
goroutines. They show the process's internals: keep ADDR on loopback.

--http, --metrics and --pprof answer only requests that name the node
(their Host) by an IP address, localhost, a name under .localhost or a
name given with --http-host; any other name gets 421, so a page of
another site cannot point its own name at the node (DNS rebinding) and
read it. A scraper or client that reaches the node by a DNS name needs
that name in --http-host.

The --max-* and --min-lease flags set the limits every request is checked
against; a request over a limit gets a clear error naming it.

--backend=fdb serves from a FoundationDB cluster (--fdb-cluster-file)
instead of RocksDB; it needs a binary built with 'make build-fdb'.

--queueber-listen ADDR --queueber-queue NAME (always together) also serve
Queueber's protocol (schema/queueber.capnp) on ADDR, host:port or
unix:/path, over the one leaseq queue NAME, so Queueber clients work
unchanged: add enqueues, poll leases (a long poll woken like any other),
remove acks one item, extend extends a lease. That listener shares the
node's TLS and connection limits; the README's "Queueber compatibility"
section has the details.`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		f := addServeFlags(fs)
		// A mode switch, not a setting a shell keeps: a
		// LEASEQ_CHECK_CONFIG left exported would make every later
		// serve a dry run that exits 0.
		cliOnly(fs, "check-config")
		return func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q", args[0])
			}
			if err := f.check(); err != nil {
				return err
			}
			c, err := f.config(e.stderr, e.clock.Now()) // reads the TLS files
			if err != nil {
				return err
			}
			if *f.checkConfig {
				fs.VisitAll(func(fl *flag.Flag) {
					if fl.Name != "check-config" {
						fmt.Fprintf(e.stdout, "%s=%s\n", fl.Name, fl.Value)
					}
				})
				return nil
			}
			return serve(ctx, e, c)
		}
	},
}

type serveConfig struct {
	tlsWarning    string // what is wrong with the certificate's validity period ("": nothing)
	data          string
	listen        string
	qbListen      string // --queueber-listen; "" when off
	qbQueue       string // --queueber-queue
	backend       string
	clusterFile   string
	subspace      string
	sync          rocksstore.SyncMode
	syncText      string
	pointInTime   bool // --recover=point-in-time
	minFreeDisk   int64
	prefetch      time.Duration // rocksstore.Options.PrefetchHold
	socketMode    fs.FileMode
	metrics       string
	pprof         string   // --pprof; "" when off
	http          string   // the HTTP API's address; "" when off
	httpHosts     []string // --http-host
	tls           *tls.Config
	mutualTLS     bool
	maxConns      int
	maxWaiters    int
	maxPerIP      int // 0: no per-address limit
	maxInflight   int64
	nodeWaiters   int
	metricsQs     int
	maxMessage    int64
	rpcEngine     string // rpc.EngineGoCapnp or rpc.EngineLean
	gcPercent     int    // debug.SetGCPercent's argument (-1: off)
	limits        storage.Limits
	sweepInterval time.Duration
	sweepBatch    int
	log           *slog.Logger
}

// syncProcs returns the GOMAXPROCS for the node when it should differ
// from Go's default (procs): rocksstore.SuggestedProcs (one more with
// RocksDB and --sync=always; its comment says why), unless env (the
// GOMAXPROCS variable) sets it. On the node, sysmon went from 9.5 % to
// 3.4 % of its CPU in e2e rpc-always (docs/BENCHMARKS.md).
func syncProcs(backend string, mode rocksstore.SyncMode, env string, procs int) (int, bool) {
	if backend == "fdb" || env != "" {
		return 0, false
	}
	if n := rocksstore.SuggestedProcs(mode, procs); n != procs {
		return n, true
	}
	return 0, false
}

// openBackend opens the configured store. rocks is the same store when it
// is RocksDB (for its write-path metrics), else nil.
func openBackend(c serveConfig, clk clock.Clock, onDeadline storage.DeadlineFunc) (store storage.Store, rocks *rocksstore.Store, err error) {
	if c.backend == "fdb" {
		fs, err := fdbsync.OpenCluster(c.clusterFile, fdbsync.Options{
			Prefix:     fdbPrefix(c.subspace),
			Limits:     c.limits,
			Logger:     c.log.With("svc", "fdbsync"),
			OnDeadline: onDeadline,
			Clock:      clk,
		})
		if err != nil {
			return nil, nil, fmt.Errorf("open FoundationDB cluster: %w", err)
		}
		return fs, nil, nil
	}
	rs, err := rocksstore.Open(c.data, rocksstore.Options{
		Sync:               c.sync,
		RecoverPointInTime: c.pointInTime,
		MinFreeDisk:        c.minFreeDisk,
		PrefetchHold:       c.prefetch,
		Limits:             c.limits,
		Logger:             c.log.With("svc", "rocksstore"),
		OnDeadline:         onDeadline,
		Now:                clk.Now,
	})
	if err != nil {
		// Another node holds the directory: name it, as check does. Not
		// when this process holds it (an embedding's other store):
		// lockHolder's look at the LOCK file would drop this process's
		// own lock on it.
		if errors.Is(err, rocksstore.ErrLocked) && !strings.Contains(err.Error(), "current process") {
			if pid, ok := lockHolder(c.data); ok {
				return nil, nil, fmt.Errorf("open store in %s: the database is in use by %s; stop it first: %w", c.data, lockHolderText(pid, "another 'leaseq serve'?"), err)
			}
		}
		return nil, nil, fmt.Errorf("open store in %s: %w", c.data, err)
	}
	return rs, rs, nil
}

// fdbPrefix is the key prefix of the FoundationDB subspace named name (a
// valid subspace name, see parseSubspace): fdbsync's default prefix for "",
// else the default prefix followed by the name as a tuple-layer string
// (0x02, the bytes, a 0x00 terminator). Names hold no 0x00, so the
// terminator makes the prefixes of two names disjoint even when one name
// starts with the other ("jobs" and "jobs2"), and 0x02 is none of
// fdbsync's namespace tags, so a named subspace never overlaps the
// default one either.
func fdbPrefix(name string) []byte {
	if name == "" {
		return nil // fdbsync.DefaultPrefix
	}
	p := append([]byte(fdbsync.DefaultPrefix), 0x02)
	p = append(p, name...)
	return append(p, 0x00)
}

func serve(ctx context.Context, e *env, c serveConfig) (err error) {
	log := c.log
	// The node's time never steps back with the wall clock: every instant
	// it writes comes from clk (storage/steadyclock).
	clk := steadyclock.New(e.clock)
	// Every file the node creates (the database, its logs) is the owner's
	// only: they hold payloads. The unix socket gets --socket-mode.
	syscall.Umask(0o077)
	debug.SetGCPercent(c.gcPercent)
	if n, ok := syncProcs(c.backend, c.sync, os.Getenv("GOMAXPROCS"), runtime.GOMAXPROCS(0)); ok {
		runtime.GOMAXPROCS(n)
		log.Info("one scheduler thread more than the CPUs for --sync=always", "gomaxprocs", n)
	}
	if c.backend != "fdb" && rocksstore.KeepFreedMemory() {
		log.Debug("malloc keeps freed memory for the next memtables (up to 32 MiB in each of at most 2 heaps)")
	}

	// Found by review (session 74): the signals were taken over only
	// once the store was open and the listeners up, so a SIGTERM while a
	// large WAL replayed killed the node with the default action. They
	// are taken first: a signal during startup stops it after the step
	// under way (a cgo Open cannot be cut short), undoing what started,
	// and a second one exits at once, as during the shutdown.
	sigs := make(chan os.Signal, 2)
	stopSignals := e.notifySignals(sigs)
	defer stopSignals()
	watch := watchStartup(e, sigs, log)
	defer watch.end() // after the undo below: a second signal still exits at once during it
	interrupted := func() error {
		if watch.signal() != nil {
			return errStartupSignal
		}
		return nil
	}

	// Undo whatever was started, in reverse order, if startup fails or
	// a signal stops it.
	var undo []func() error
	defer func() {
		if err == nil {
			return
		}
		if err == errStartupSignal && e.shutdownStarted != nil {
			e.shutdownStarted()
		}
		var undoErr error
		for i := len(undo) - 1; i >= 0; i-- {
			undoErr = errors.Join(undoErr, undo[i]())
		}
		if err == errStartupSignal && undoErr == nil {
			log.Info("leaseq stopped", "during", "startup")
			err = nil
			return
		}
		err = errors.Join(err, undoErr)
	}()

	// The metrics endpoint comes up first, so /readyz can say "not yet"
	// while a large database opens.
	var ready atomic.Bool
	collector := newNodeCollector()
	collector.maxQueues = c.metricsQs
	stopMetrics, err := startMetrics(&c, collector, &ready)
	if err != nil {
		return err
	}
	undo = append(undo, func() error { stopMetrics(false); return nil })
	stopPprof, err := startPprof(&c)
	if err != nil {
		return err
	}
	undo = append(undo, func() error { stopPprof(false); return nil })
	if err := interrupted(); err != nil {
		return err
	}

	// The store reports new deadlines from its first commit on, possibly
	// from other goroutines; the sweeper exists only after the store is
	// open. Notify is a no-op on a nil *Sweeper, so load it atomically.
	var sw atomic.Pointer[sweeper.Sweeper]
	store, rocks, err := openBackend(c, clk, func(t time.Time) { sw.Load().Notify(t) })
	if err != nil {
		return err
	}
	undo = append(undo, func() error { return closeStore(store) })
	if err := interrupted(); err != nil {
		return err
	}
	// Both backends report the latest instant their data shows
	// (rocksstore.Store.Latest, fdbsync.Store.Latest: found by review,
	// session 74, FoundationDB mode had none).
	if ls, ok := store.(interface{ Latest() time.Time }); ok {
		if latest := ls.Latest(); latest.After(clk.Now()) {
			log.Warn("the clock reads earlier than the data: the node's time goes on from the data's", "clock", clk.Now(), "data", latest)
			clk.AtLeast(latest)
		}
	}
	srv, err := rpc.NewServer(rpcConfig(c, store, clk))
	if err != nil {
		return fmt.Errorf("rpc server: %w", err)
	}
	s, err := sweeper.New(sweeper.Config{
		Store:         store,
		Clock:         clk,
		Logger:        log,
		BatchLimit:    c.sweepBatch,
		SweepInterval: c.sweepInterval,
		// Items the sweeper made ready (expired leases, delayed items
		// come due) wake parked long polls at once.
		OnReady: srv.Wake,
	})
	if err != nil {
		return fmt.Errorf("sweeper: %w", err)
	}
	sw.Store(s)
	ln, err := rpc.ListenMode(c.listen, c.socketMode)
	if err != nil {
		return err
	}
	undo = append(undo, func() error { _ = ln.Close(); return nil })
	var qbln net.Listener
	var qbBoot rpc.BootstrapFunc
	if c.qbListen != "" {
		if qbBoot, err = queueber.Bootstrap(srv, c.qbQueue); err != nil {
			return err
		}
		if qbln, err = rpc.ListenMode(c.qbListen, c.socketMode); err != nil {
			return fmt.Errorf("queueber listener: %w", err)
		}
		undo = append(undo, func() error { _ = qbln.Close(); return nil })
	}

	if err := interrupted(); err != nil {
		return err
	}
	if err := s.Start(ctx); err != nil {
		return fmt.Errorf("start sweeper: %w", err)
	}
	undo = append(undo, func() error { s.Stop(); return nil })
	if err := srv.Start(ctx, ln); err != nil {
		return fmt.Errorf("start rpc server: %w", err)
	}
	undo = append(undo, func() error { srv.Stop(); return nil })
	if qbln != nil {
		if err := srv.StartBootstrap(ctx, qbln, qbBoot); err != nil {
			return fmt.Errorf("start queueber listener: %w", err)
		}
	}
	api, closeUI, err := startHTTP(ctx, &c, store, clk, srv)
	if err != nil {
		return err
	}
	if api != nil {
		undo = append(undo, func() error { api.Stop(); closeUI(); return nil })
	}
	if err := interrupted(); err != nil {
		return err
	}
	collector.node.Store(&nodeParts{store: store, rocks: rocks, srv: srv, api: api, sw: s, clk: clk})
	ready.Store(true)
	stopRecover := func() {}
	if rocks != nil {
		stopRecover = recoverLoop(rocks, clk, log)
	}
	undo = nil // from here on, the shutdown below stops everything in order
	// A signal that came after the last look above starts the shutdown
	// (the watch logged it); later ones are awaitShutdown's.
	startupSig := watch.end()
	log.Info("leaseq serving", servingAttrs(c, ln, qbln)...)
	if c.tlsWarning != "" {
		log.Warn("--tls-cert: " + c.tlsWarning)
	}

	if startupSig == nil {
		awaitShutdown(ctx, sigs, log)
	}
	ready.Store(false)
	done := exitOnSecondSignal(e, sigs, log)
	defer done()
	if e.shutdownStarted != nil {
		e.shutdownStarted()
	}

	// Reverse order of start: no new connections or calls, running calls
	// finish (their writes are durable before they answer), then no more
	// sweeps, then the store. The HTTP API goes first: it shares the RPC
	// server's dispatcher.
	if api != nil {
		api.Stop()
		closeUI()
	}
	srv.Stop()
	s.Stop()
	stopRecover()
	collector.node.Store(nil)
	err = closeStore(store)
	stopMetrics(true)
	stopPprof(true)
	if err != nil {
		return err
	}
	log.Info("leaseq stopped")
	return nil
}

// startMetrics serves /metrics, /healthz and /readyz on c.metrics (if set;
// c.metrics becomes the real address when given :0). stop ends it,
// gracefully or at once.
func startMetrics(c *serveConfig, collector *nodeCollector, ready *atomic.Bool) (stop func(graceful bool), err error) {
	if c.metrics == "" {
		return func(bool) {}, nil
	}
	return listenAndServe(&c.metrics, "metrics", metricsServer(collector, ready, nodeHealth(collector), c.log), c.httpHosts, c.log)
}

// startPprof serves Go's profiling endpoints on c.pprof (if set; c.pprof
// becomes the real address when given :0). stop ends it.
func startPprof(c *serveConfig) (stop func(graceful bool), err error) {
	if c.pprof == "" {
		return func(bool) {}, nil
	}
	return listenAndServe(&c.pprof, "pprof", pprofServer(), c.httpHosts, c.log)
}

// listenAndServe serves srv on the TCP address *addr, which it replaces with
// the address it listens on. stop ends it, gracefully (requests get 2 s
// to finish) or at once.
//
// Requests must name the node by an IP address, localhost or one of
// hosts (--http-host), as on --http (httpapi.HostGuard; 421 otherwise):
// without that rule a page of another site that points its own name at
// the node's address (DNS rebinding) reads the listener as a same-origin
// page, /metrics with its queue names and counts, or --pprof's profiles
// and heap.
func listenAndServe(addr *string, what string, srv *http.Server, hosts []string, log *slog.Logger) (stop func(graceful bool), err error) {
	srv.Handler = httpapi.HostGuard(hosts, log.With("svc", what), srv.Handler)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return nil, fmt.Errorf("%s listener: %w", what, err)
	}
	*addr = ln.Addr().String()
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(what+" server failed", "err", err)
		}
	})
	return func(graceful bool) {
		if graceful {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if herr := srv.Shutdown(sctx); herr != nil {
				_ = srv.Close()
			}
			cancel()
		} else {
			_ = srv.Close()
		}
		wg.Wait()
	}, nil
}

// startHTTP serves the HTTP API on c.http (nothing, and a nil server,
// when --http is off) over the RPC server's store, limits, dispatcher,
// in-flight budget and TLS. c.http becomes the real address, as the log
// shows it.
func startHTTP(ctx context.Context, c *serveConfig, store storage.Store, clk clock.Clock, srv *rpc.Server) (*httpapi.Server, func(), error) {
	if c.http == "" {
		return nil, func() {}, nil
	}
	sem, size := srv.InflightBudget()
	api, err := httpapi.New(httpapi.Config{
		Store:         store,
		Clock:         clk,
		Logger:        c.log, // httpapi adds svc=http
		Limits:        c.limits,
		Dispatcher:    srv.Dispatcher(),
		Inflight:      sem,
		InflightLimit: size,
		Leases:        srv,
		Admit:         srv.Admit,
		MaxBodyBytes:  c.maxMessage,
		TLS:           c.tls,
		AllowedHosts:  c.httpHosts,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("http api: %w", err)
	}
	// The dashboard shares the listener, under /ui/.
	ui, err := webui.New(webui.Config{
		Store:             store,
		Clock:             clk,
		Logger:            c.log, // webui adds svc=webui
		Prefix:            "/ui",
		RequireClientCert: c.mutualTLS,
		Limits:            c.limits,
		OnReady:           srv.Wake,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("dashboard: %w", err)
	}
	if err := api.Mount("/ui/", ui.Handler()); err != nil {
		ui.Close()
		return nil, nil, err
	}
	ln, err := rpc.ListenMode(c.http, c.socketMode)
	if err != nil {
		ui.Close()
		return nil, nil, fmt.Errorf("http listener: %w", err)
	}
	c.http = listenAddr(ln)
	if err := api.Start(ctx, ln); err != nil { // closes ln on failure
		ui.Close()
		return nil, nil, fmt.Errorf("start http api: %w", err)
	}
	return api, ui.Close, nil
}

// nodeHealth is /readyz's check of a running node: a stopped store or
// corrupt data met makes it not ready.
func nodeHealth(collector *nodeCollector) func() error {
	return func() error {
		p := collector.node.Load()
		if p == nil || p.rocks == nil {
			return nil
		}
		if err := p.rocks.Failed(); err != nil {
			return err
		}
		if n, first := p.rocks.Corruption(); n > 0 {
			return fmt.Errorf("corrupt data met %d times since start (first: %v); see leaseq check", n, first)
		}
		return nil
	}
}

// rpcConfig is the RPC server's configuration from the serve flags.
func rpcConfig(c serveConfig, store storage.Store, clk clock.Clock) rpc.ServerConfig {
	return rpc.ServerConfig{
		Store:              store,
		Clock:              clk,
		Logger:             c.log, // rpc adds svc=rpc
		Limits:             c.limits,
		MaxConns:           c.maxConns,
		MaxWaitersPerQueue: c.maxWaiters,
		MaxConnsPerAddr:    perAddrLimit(c.maxPerIP),
		MaxInflightBytes:   c.maxInflight,
		MaxWaiters:         c.nodeWaiters,
		MaxMessageBytes:    c.maxMessage,
		Engine:             c.rpcEngine,
		TLS:                c.tls,
		Info:               nodeInfo(c),
	}
}

// servingAttrs are the fields of the "leaseq serving" log line; qbln is
// the Queueber listener (nil: none).
func servingAttrs(c serveConfig, ln, qbln net.Listener) []any {
	attrs := []any{
		"version", version(),
		"backend", c.backend,
		"listen", listenAddr(ln),
		"http", c.http,
	}
	if qbln != nil {
		attrs = append(attrs, "queueber_listen", listenAddr(qbln), "queueber_queue", c.qbQueue)
	}
	attrs = append(attrs,
		"tls", tlsMode(c),
		"metrics", c.metrics,
		"sweep_interval", c.sweepInterval,
		"pid", os.Getpid(),
	)
	if c.pprof != "" {
		attrs = append(attrs, "pprof", c.pprof)
	}
	if c.backend == "rocksdb" {
		dir, _ := filepath.Abs(c.data)
		return append(attrs, "data", dir, "sync", c.syncText)
	}
	return append(attrs, "fdb_cluster_file", c.clusterFile, "fdb_subspace", c.subspace)
}

// listenAddr is ln's address as --listen, --http and --queueber-listen
// take it.
func listenAddr(ln net.Listener) string {
	if ln.Addr().Network() == "unix" {
		return "unix:" + ln.Addr().String()
	}
	return ln.Addr().String()
}

// awaitShutdown waits for a signal or the end of ctx.
func awaitShutdown(ctx context.Context, sigs <-chan os.Signal, log *slog.Logger) {
	select {
	case sig := <-sigs:
		log.Info("shutting down", "signal", sig.String())
	case <-ctx.Done():
		log.Info("shutting down", "reason", context.Cause(ctx))
	}
}

// errStartupSignal stops serve's startup when a signal came during it.
var errStartupSignal = errors.New("stopped by a signal during startup")

// startupWatch takes SIGINT and SIGTERM while the node starts: the first
// asks startup to stop (signal reports it), a second exits the process at
// once.
type startupWatch struct {
	sig  atomic.Pointer[os.Signal]
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

func watchStartup(e *env, sigs <-chan os.Signal, log *slog.Logger) *startupWatch {
	w := &startupWatch{stop: make(chan struct{})}
	w.wg.Go(func() {
		select {
		case sig := <-sigs:
			log.Info("shutting down", "signal", sig.String(), "during", "startup")
			w.sig.Store(&sig)
		case <-w.stop:
			return
		}
		select {
		case sig := <-sigs:
			log.Warn("second signal: exiting without clean shutdown", "signal", sig.String())
			e.exit(exitFailure)
		case <-w.stop:
		}
	})
	return w
}

// signal is the signal received during startup, nil if none.
func (w *startupWatch) signal() os.Signal {
	if p := w.sig.Load(); p != nil {
		return *p
	}
	return nil
}

// end ends the watch (the signals after it are the caller's) and returns
// signal(). It may be called more than once.
func (w *startupWatch) end() os.Signal {
	w.once.Do(func() {
		close(w.stop)
		w.wg.Wait()
	})
	return w.signal()
}

// exitOnSecondSignal exits the process at once on a signal during the
// shutdown; done ends the watch.
func exitOnSecondSignal(e *env, sigs <-chan os.Signal, log *slog.Logger) (done func()) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case sig := <-sigs:
			log.Warn("second signal: exiting without clean shutdown", "signal", sig.String())
			e.exit(exitFailure)
		case <-stop:
		}
	})
	return func() {
		close(stop)
		wg.Wait()
	}
}

// nodeInfo is what the node tells clients about itself (stats shows it).
func nodeInfo(c serveConfig) rpc.NodeInfo {
	ni := rpc.NodeInfo{Version: version(), Backend: c.backend}
	if c.backend == "rocksdb" {
		ni.Sync = c.syncText
	}
	return ni
}

func tlsMode(c serveConfig) string {
	switch {
	case c.tls == nil:
		return "off"
	case c.mutualTLS:
		return "mutual"
	}
	return "on"
}

func closeStore(s storage.Store) error {
	if err := s.Close(); err != nil {
		return fmt.Errorf("close store: %w", err)
	}
	return nil
}

// perAddrLimit maps --max-conns-per-ip (0: none) to rpc's MaxConnsPerAddr
// (negative: none).
func perAddrLimit(n int) int {
	if n == 0 {
		return -1
	}
	return n
}

// recoverEvery is how often a node whose store stopped after a failed
// write (a full disk, say) tries to reopen it.
const recoverEvery = time.Second

// recoverLoop reopens rocks whenever it has failed and --min-free-disk is
// free again, until the returned stop is called.
func recoverLoop(rocks *rocksstore.Store, clk clock.Clock, log *slog.Logger) (stop func()) {
	t := clk.Ticker(recoverEvery)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			if rocks.Failed() == nil {
				continue
			}
			if ok, err := rocks.Recover(); err != nil {
				log.Warn("store recovery failed; retrying", "err", err)
			} else if ok {
				log.Info("store recovered: writes accepted again")
			}
		}
	})
	return func() {
		t.Stop()
		close(done)
		wg.Wait()
	}
}
