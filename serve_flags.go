package main

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
	"github.com/leaseq/leaseq/sweeper"
)

// serveFlags are `leaseq serve`'s flags (addServeFlags registers them);
// check and config turn them, once parsed, into the node's serveConfig.
type serveFlags struct {
	data           *string
	listen         *string
	backend        *choice[string]
	clusterFile    *string
	subspace       *choice[string]
	syncMode       *choice[rocksstore.SyncMode]
	minFreeDisk    *choice[int]
	recoverMode    *choice[string]
	prefetchHold   *choice[time.Duration]
	socketMode     *choice[fs.FileMode]
	metricsAddr    *string
	pprofAddr      *string
	httpAddr       *string
	httpHosts      *string
	tlsCert        *string
	tlsKey         *string
	tlsClientCA    *string
	maxConns       *int
	rpcEngine      *choice[string]
	gcPercent      *choice[int]
	maxInflight    *choice[int]
	metricsQueues  *int
	maxQueues      *int
	maxNodeWaiters *int
	maxConnsPerIP  *int
	maxWaiters     *int
	maxPayload     *choice[int]
	maxMessage     *choice[int]
	maxBatch       *choice[int]
	minLease       *choice[time.Duration]
	maxLease       *choice[time.Duration]
	maxWait        *choice[time.Duration]
	maxDelay       *choice[time.Duration]
	maxDedupKey    *choice[int]
	maxReason      *choice[int]
	sweepInterval  *time.Duration
	sweepBatch     *int
	qbListen       *string
	qbQueue        *string
	checkConfig    *bool
	lf             *logFlags
}

// addServeFlags registers serve's flags on fs.
func addServeFlags(fs *flag.FlagSet) *serveFlags {
	f := &serveFlags{}
	f.data = fs.String("data", "./data", "`dir`ectory of the RocksDB database (created if missing)")
	f.listen = fs.String("listen", defaultAddr, "RPC listen `address`: host:port or unix:/path")
	f.backend = newChoice("rocksdb", parseBackend)
	fs.Var(f.backend, "backend", "storage `backend`: rocksdb or fdb")
	f.clusterFile = fs.String("fdb-cluster-file", "", "FoundationDB cluster `file` for --backend=fdb (empty: the client library's default)")
	f.subspace = newChoice("", parseSubspace)
	fs.Var(f.subspace, "fdb-subspace", "`name` of this deployment's subspace for --backend=fdb: deployments sharing one cluster need distinct names (empty: the default subspace)")
	f.syncMode = newChoice("always", parseSyncMode)
	fs.Var(f.syncMode, "sync", "WAL durability `mode`: always or none")
	f.minFreeDisk = newChoice("256MiB", func(v string) (int, error) {
		if v == "0" {
			return 0, nil
		}
		return parseSize(v)
	})
	fs.Var(f.minFreeDisk, "min-free-disk", "free `bytes` kept in reserve on the data disk: below it enqueues are refused (unavailable) while acks and polls go on, and a node whose store stopped on a full disk reopens it once this much is free again (0: no reserve)")
	f.recoverMode = newChoice("", func(s string) (string, error) {
		if s != "" && s != "point-in-time" {
			return "", fmt.Errorf("want point-in-time, got %q", s)
		}
		return s, nil
	})
	f.socketMode = newChoice("0660", parseFileMode)
	fs.Var(f.socketMode, "socket-mode", "permission `bits` (octal) of the unix sockets of --listen, --http and --queueber-listen unix:/path; connecting needs write permission")
	fs.Var(f.recoverMode, "recover", "`point-in-time`: open a database whose write-ahead log is damaged, dropping every write after the damage (the node refuses to start on such a log otherwise; keep a copy of --data first)")
	f.prefetchHold = newChoice(rocksstore.DefaultPrefetchHold.String(), nonNegDuration)
	fs.Var(f.prefetchHold, "prefetch-hold", "with --sync=always, how long (a `duration`) the next batch an ack claims for its consumer waits for that consumer's next poll, which it then answers without an fsync of its own (0: off); see the README")
	f.metricsAddr = fs.String("metrics", "", "serve /metrics, /healthz and /readyz over HTTP on `host:port` (empty: off)")
	f.pprofAddr = fs.String("pprof", "", "serve Go's profiling endpoints under /debug/pprof/ (CPU profile, heap, goroutines, execution trace) over HTTP on `host:port` (empty: off); they show the process's internals, so keep them on loopback")
	f.httpAddr = fs.String("http", "", "serve the HTTP/JSON API on `address`, host:port or unix:/path, with the TLS of --tls-* (empty: off)")
	f.httpHosts = fs.String("http-host", "", "comma-separated host `names` by which clients may reach --http and its dashboard, --metrics and --pprof over TCP, besides IP addresses and localhost (a request naming another host gets 421: DNS rebinding)")
	f.tlsCert = fs.String("tls-cert", "", "server certificate `file` (PEM); enables TLS with --tls-key")
	f.tlsKey = fs.String("tls-key", "", "server private key `file` (PEM)")
	f.tlsClientCA = fs.String("tls-client-ca", "", "CA bundle `file` (PEM): require client certificates signed by it (mutual TLS)")
	f.maxConns = fs.Int("max-conns", rpc.DefaultMaxConns, "maximum open client connections")
	f.rpcEngine = newChoice(rpc.EngineLean, func(s string) (string, error) {
		if s != rpc.EngineGoCapnp && s != rpc.EngineLean {
			return "", fmt.Errorf("want %s or %s", rpc.EngineGoCapnp, rpc.EngineLean)
		}
		return s, nil
	})
	fs.Var(f.rpcEngine, "rpc-engine", "`engine` serving --listen: lean (one reader per connection, calls that cannot wait run on it) or go-capnp (go-capnp's rpc.Conn); see rpc/doc.go")
	f.gcPercent = newChoice(strconv.Itoa(defaultGCPercent), parseGCPercent)
	fs.Var(f.gcPercent, "gc-percent", "Go garbage collector target for the node process (`percent`, as GOGC, which it replaces; off: collect only near GOMEMLIMIT): how far the heap may grow beyond live data between collections")
	f.maxInflight = newChoice(strconv.Itoa(defaultInflightBytes()), parseSize)
	fs.Var(f.maxInflight, "max-inflight-bytes", "incoming `bytes` of unanswered calls over all connections; beyond it the node reads no more calls until some are answered; by default a quarter of the machine's memory, within 64MiB-4GiB; on this machine")
	f.metricsQueues = fs.Int("metrics-max-queues", defaultMetricsQueues, "queues with /metrics series of their own (those with the most items enqueued); the rest are summed under queue=\"(other)\"")
	f.maxQueues = fs.Int("max-queues", storage.DefaultLimits.MaxQueues, "most queues the node holds; creating one more (by enqueue or config) fails, existing queues keep working")
	f.maxNodeWaiters = fs.Int("max-node-waiters", defaultNodeWaiters(), "maximum parked long polls plus subscriptions on the node (per queue: --max-waiters); each costs about 16 KiB; by default what fits in an eighth of the machine's memory, within 1000-100000; on this machine")
	f.maxConnsPerIP = fs.Int("max-conns-per-ip", rpc.DefaultMaxConnsPerAddr, "maximum open TCP connections from one IP address (0: no per-address limit)")
	f.maxWaiters = fs.Int("max-waiters", rpc.DefaultMaxWaitersPerQueue, "maximum parked long polls per queue, a subscribe refused too at it (0 means the default)")
	d := storage.DefaultLimits
	f.maxPayload = newChoice(strconv.Itoa(d.MaxPayload), parseSize)
	fs.Var(f.maxPayload, "max-payload", "largest item payload, in `bytes` (KiB/MiB suffixes allowed)")
	f.maxMessage = newChoice(strconv.Itoa(rpc.DefaultMaxMessageBytes), parseSize)
	fs.Var(f.maxMessage, "max-message", "largest incoming RPC message or HTTP API request body, in `bytes`")
	f.maxBatch = newChoice(strconv.Itoa(d.MaxBatch), intRange(1, storage.MaxBatchCeiling))
	fs.Var(f.maxBatch, "max-batch", "most `items` or ids in one call")
	f.minLease = newChoice(d.MinLease.String(), positiveDuration)
	fs.Var(f.minLease, "min-lease", "shortest lease (a `duration`) a poll or extend may ask for")
	f.maxLease = newChoice(d.MaxLease.String(), limitDuration)
	fs.Var(f.maxLease, "max-lease", "longest lease (a `duration`, at most 100 years) a poll or extend may ask for")
	f.maxWait = newChoice(d.MaxWait.String(), positiveDuration)
	fs.Var(f.maxWait, "max-wait", "longest long-poll wait (a `duration`)")
	f.maxDelay = newChoice(d.MaxDelay.String(), limitDuration)
	fs.Var(f.maxDelay, "max-delay", "longest enqueue or nack delay (a `duration`, at most 100 years)")
	f.maxDedupKey = newChoice(strconv.Itoa(d.MaxDedupKey), parseSize)
	fs.Var(f.maxDedupKey, "max-dedup-key", "longest dedup key, in `bytes`")
	f.maxReason = newChoice(strconv.Itoa(d.MaxReason), parseSize)
	fs.Var(f.maxReason, "max-reason", "longest nack reason kept, in `bytes` (longer ones are truncated)")
	f.sweepInterval = fs.Duration("sweep-interval", sweeper.DefaultSweepInterval, "longest sleep of the sweeper when no deadline is known")
	f.sweepBatch = fs.Int("sweep-batch", sweeper.DefaultBatchLimit, "most leases expired, and separately most delayed items promoted and dedup keys dropped, per sweep call")
	f.qbListen = fs.String("queueber-listen", "", "also serve Queueber's protocol (schema/queueber.capnp) on this `address`: host:port or unix:/path (needs --queueber-queue)")
	f.qbQueue = fs.String("queueber-queue", "", "the leaseq queue `name` that Queueber clients on --queueber-listen add to and poll (needs --queueber-listen)")
	f.checkConfig = fs.Bool("check-config", false, "validate flags, environment and TLS files, print the effective settings, and exit")
	f.lf = addLogFlags(fs, "info")
	return f
}

// messageHeadroom is what a one-item enqueue's message holds besides the
// payload, at most: the frame, the RPC call, a queue name at its limit, a
// dedup key of the default limit, and the item's other fields (about 1.5
// KiB), rounded up. A longer --max-dedup-key adds what it is over the
// default.
const messageHeadroom = 4 << 10

// idWireBytes is what one id takes in a call's List(Data): its pointer
// and its 16 bytes.
const idWireBytes = 8 + 16

// check refuses flag values that are invalid together (a usage error).
func (f *serveFlags) check() error {
	if *f.sweepInterval <= 0 || *f.sweepBatch <= 0 {
		return usagef("--sweep-interval and --sweep-batch must be positive")
	}
	if *f.maxConns <= 0 {
		return usagef("--max-conns must be positive, got %d", *f.maxConns)
	}
	if *f.metricsQueues < 1 {
		return usagef("--metrics-max-queues must be positive, got %d", *f.metricsQueues)
	}
	if *f.maxQueues < 1 {
		return usagef("--max-queues must be positive, got %d", *f.maxQueues)
	}
	if *f.maxNodeWaiters < 1 {
		return usagef("--max-node-waiters must be positive, got %d", *f.maxNodeWaiters)
	}
	if *f.maxConnsPerIP < 0 {
		return usagef("--max-conns-per-ip must be >= 0, got %d", *f.maxConnsPerIP)
	}
	if *f.maxWaiters < 0 {
		return usagef("--max-waiters must be >= 0, got %d", *f.maxWaiters)
	}
	if f.maxPayload.val > f.maxMessage.val-messageHeadroom {
		// Found by review (session 70): with --max-payload just below
		// --max-message, an item within the limit came in a message over
		// it, and the node ended the client's whole session.
		return usagef("--max-payload %d must be at least %d bytes below --max-message %d (an item that size, with its queue name, dedup key and the call around it, must fit in one message)", f.maxPayload.val, messageHeadroom, f.maxMessage.val)
	}
	if over := f.maxDedupKey.val - storage.DefaultLimits.MaxDedupKey; over > 0 && f.maxPayload.val+over > f.maxMessage.val-messageHeadroom {
		// Found by review (session 73): the check above counts a dedup
		// key of the default size; a longer --max-dedup-key let an item
		// within both limits come in a message over --max-message, and
		// the node ended the client's whole session.
		return usagef("--max-payload %d plus --max-dedup-key %d must be at least %d bytes below --max-message %d (an item with both at their limits must fit in one message)", f.maxPayload.val, f.maxDedupKey.val, messageHeadroom-storage.DefaultLimits.MaxDedupKey, f.maxMessage.val)
	}
	if f.maxReason.val+f.maxBatch.val*idWireBytes > f.maxMessage.val-messageHeadroom {
		// Likewise a nack of --max-batch ids with a reason within
		// --max-reason (found by review, session 73).
		return usagef("--max-reason %d with --max-batch %d ids (%d bytes each) must be at least %d bytes below --max-message %d (a nack with both at their limits must fit in one message)", f.maxReason.val, f.maxBatch.val, idWireBytes, messageHeadroom, f.maxMessage.val)
	}
	if f.minLease.val > f.maxLease.val {
		return usagef("--min-lease %v is longer than --max-lease %v", f.minLease.val, f.maxLease.val)
	}
	if (*f.tlsCert == "") != (*f.tlsKey == "") {
		return usagef("--tls-cert and --tls-key go together")
	}
	if *f.tlsClientCA != "" && *f.tlsCert == "" {
		return usagef("--tls-client-ca needs --tls-cert and --tls-key (mutual TLS is TLS first)")
	}
	// Addresses are checked before anything is opened (found by review,
	// session 70: a malformed one passed --check-config and failed only
	// once the database was open, a bad --http with --listen serving).
	for _, a := range []struct{ flag, addr string }{{"--listen", *f.listen}, {"--http", *f.httpAddr}, {"--queueber-listen", *f.qbListen}, {"--metrics", *f.metricsAddr}} {
		if a.addr == "" {
			continue
		}
		if err := rpc.CheckAddr(a.addr); err != nil {
			return usagef("%s: %v", a.flag, strings.TrimPrefix(err.Error(), "rpc: "))
		}
	}
	if strings.HasPrefix(*f.metricsAddr, "unix:") {
		return usagef("--metrics takes host:port, not a unix socket")
	}
	if err := checkQueueberFlags(*f.listen, *f.qbListen, *f.qbQueue); err != nil {
		return err
	}
	if f.socketMode.set && !strings.HasPrefix(*f.listen, "unix:") && !strings.HasPrefix(*f.qbListen, "unix:") && !strings.HasPrefix(*f.httpAddr, "unix:") {
		return usagef("%s applies to a unix socket (--listen, --http or --queueber-listen unix:/path) only", f.socketMode.source("socket-mode"))
	}
	if *f.metricsAddr != "" && (*f.metricsAddr == *f.listen || *f.metricsAddr == *f.qbListen) {
		return usagef("--metrics %s is also the address of --listen or --queueber-listen", *f.metricsAddr)
	}
	if *f.httpAddr != "" && (*f.httpAddr == *f.listen || *f.httpAddr == *f.metricsAddr || *f.httpAddr == *f.qbListen) {
		return usagef("--http %s is also the address of --listen, --metrics or --queueber-listen", *f.httpAddr)
	}
	if *f.pprofAddr != "" {
		if strings.HasPrefix(*f.pprofAddr, "unix:") {
			return usagef("--pprof takes host:port, not a unix socket")
		}
		for _, other := range []string{*f.listen, *f.metricsAddr, *f.httpAddr, *f.qbListen} {
			if *f.pprofAddr == other {
				return usagef("--pprof %s is also the address of --listen, --metrics, --http or --queueber-listen", *f.pprofAddr)
			}
		}
	}
	if f.backend.val == "fdb" && f.recoverMode.set {
		return usagef("%s applies to --backend=rocksdb only", f.recoverMode.source("recover"))
	}
	if f.backend.val == "fdb" && f.prefetchHold.set {
		return usagef("%s applies to --backend=rocksdb only", f.prefetchHold.source("prefetch-hold"))
	}
	if f.backend.val == "fdb" && f.syncMode.set {
		return usagef("%s applies to --backend=rocksdb only (FoundationDB commits are always durable)", f.syncMode.source("sync"))
	}
	return nil
}

// config is the node's configuration from the checked flags; it reads
// the TLS files (judging the certificate's validity at now). Logs go to
// stderr.
func (f *serveFlags) config(stderr io.Writer, now time.Time) (serveConfig, error) {
	var tc *tls.Config
	var tlsWarning string
	if *f.tlsCert != "" {
		var err error
		if tc, err = serverTLS(*f.tlsCert, *f.tlsKey, *f.tlsClientCA); err != nil {
			return serveConfig{}, err
		}
		// Found by review (session 70): an expired certificate passed
		// --check-config, and the node started without a word while
		// every client failed its handshake.
		if tlsWarning = certValidity(tc.Certificates[0], now); tlsWarning != "" && *f.checkConfig {
			return serveConfig{}, fmt.Errorf("--tls-cert %s: %s", *f.tlsCert, tlsWarning)
		}
	}
	return serveConfig{
		data:        *f.data,
		listen:      *f.listen,
		qbListen:    *f.qbListen,
		qbQueue:     *f.qbQueue,
		backend:     f.backend.val,
		clusterFile: *f.clusterFile,
		subspace:    f.subspace.val,
		sync:        f.syncMode.val,
		syncText:    f.syncMode.text,
		pointInTime: f.recoverMode.val == "point-in-time",
		prefetch:    prefetchOption(f.prefetchHold.val),
		minFreeDisk: int64(f.minFreeDisk.val),
		socketMode:  f.socketMode.val,
		metrics:     *f.metricsAddr,
		pprof:       *f.pprofAddr,
		http:        *f.httpAddr,
		httpHosts:   splitList(*f.httpHosts),
		tls:         tc,
		mutualTLS:   *f.tlsClientCA != "",
		tlsWarning:  tlsWarning,
		maxConns:    *f.maxConns,
		maxWaiters:  *f.maxWaiters,
		maxPerIP:    *f.maxConnsPerIP,
		maxInflight: int64(f.maxInflight.val),
		nodeWaiters: *f.maxNodeWaiters,
		metricsQs:   *f.metricsQueues,
		maxMessage:  int64(f.maxMessage.val),
		rpcEngine:   f.rpcEngine.val,
		gcPercent:   f.gcPercent.val,
		limits: storage.Limits{
			MaxPayload:   f.maxPayload.val,
			MaxBatch:     f.maxBatch.val,
			MinLease:     f.minLease.val,
			MaxLease:     f.maxLease.val,
			MaxWait:      f.maxWait.val,
			MaxDelay:     f.maxDelay.val,
			MaxDedupKey:  f.maxDedupKey.val,
			MaxReason:    f.maxReason.val,
			MaxQueueName: storage.DefaultLimits.MaxQueueName,
			MaxQueues:    *f.maxQueues,
		},
		sweepInterval: *f.sweepInterval,
		sweepBatch:    *f.sweepBatch,
		log:           f.lf.logger(stderr),
	}, nil
}

// defaultGCPercent is --gc-percent's default. The node's live Go heap is
// small (payloads pass through it; RocksDB keeps its memory in C), so
// collecting at three times Go's default growth costs a few tens of MiB
// and saves about a seventh of the node's CPU per item
// (docs/BENCHMARKS.md, "The node's GC target").
const defaultGCPercent = 300

// parseGCPercent reads --gc-percent: 10 to 10000, or off (-1).
func parseGCPercent(s string) (int, error) {
	if s == "off" || s == "-1" {
		return -1, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 10 || n > 10000 {
		return 0, fmt.Errorf("want a percentage from 10 to 10000, or off, got %q", s)
	}
	return n, nil
}

// checkQueueberFlags checks --queueber-listen and --queueber-queue: both or
// neither, a valid queue name, an address other than --listen's.
func checkQueueberFlags(listen, addr, queue string) error {
	switch {
	case addr == "" && queue == "":
		return nil
	case addr == "":
		return usagef("--queueber-queue needs --queueber-listen (the address Queueber clients connect to)")
	case queue == "":
		return usagef("--queueber-listen needs --queueber-queue (the leaseq queue Queueber clients use)")
	case addr == listen:
		return usagef("--queueber-listen %s is --listen's address: give each protocol its own", addr)
	}
	if err := storage.DefaultLimits.ValidateQueueName(queue); err != nil {
		return usagef("--queueber-queue: %v", err)
	}
	return nil
}

// serverTLS builds the node's TLS config; with a client CA, clients must
// present a certificate it signed.
func serverTLS(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate %s and key %s: %w", certFile, keyFile, err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCAFile != "" {
		pool, err := loadCertPool(clientCAFile)
		if err != nil {
			return nil, err
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

// certValidity says what is wrong with cert's validity period at now
// ("" when nothing): clients refuse a certificate that has expired or is
// not valid yet.
func certValidity(cert tls.Certificate, now time.Time) string {
	leaf := cert.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return ""
		}
	}
	switch {
	case now.After(leaf.NotAfter):
		return fmt.Sprintf("the certificate expired at %s: clients will refuse it", leaf.NotAfter.UTC().Format(time.RFC3339))
	case now.Before(leaf.NotBefore):
		return fmt.Sprintf("the certificate is not valid before %s: clients will refuse it until then", leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	return ""
}

func loadCertPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA bundle %s: no PEM certificates in it", file)
	}
	return pool, nil
}

// parseSubspace accepts an FDB subspace name: empty (the default) or, like
// a queue name, 1-200 bytes of [A-Za-z0-9._-].
func parseSubspace(s string) (string, error) {
	if s == "" {
		return s, nil
	}
	if err := storage.DefaultLimits.ValidateQueueName(s); err != nil {
		return "", fmt.Errorf("want a subspace name of 1-200 bytes of [A-Za-z0-9._-], got %q", s)
	}
	return s, nil
}

// defaultInflightBytes is --max-inflight-bytes' default: a quarter of the
// machine's memory, within 64 MiB and 4 GiB.
func defaultInflightBytes() int {
	return int(min(max(machineMemory()/4, 64<<20), 4<<30))
}

// parkedPollCost is what one parked long poll or subscription may hold on
// the node, rounded up: the worst case, a goroutine and its buffers
// (go-capnp engine or HTTP; BenchmarkRPC_ParkedPollMemory measures 13-15 KB
// per poll there, client side included, and 6 KB on the lean engine).
const parkedPollCost = 16 << 10

// defaultNodeWaiters is --max-node-waiters' default: as many parked polls
// as fit in an eighth of the machine's memory, within 1,000 and
// rpc.DefaultMaxWaiters.
func defaultNodeWaiters() int {
	return int(min(max(machineMemory()/8/parkedPollCost, 1000), rpc.DefaultMaxWaiters))
}

// machineMemory returns the machine's RAM in bytes (4 GiB if unknown).
func machineMemory() int64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil {
		return 4 << 30
	}
	return int64(si.Totalram) * int64(si.Unit)
}

// prefetchOption is rocksstore.Options.PrefetchHold for --prefetch-hold d,
// whose 0 turns claims ahead off.
func prefetchOption(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// splitList splits a comma-separated flag value, dropping blanks.
func splitList(v string) []string {
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}
