package leaseqt

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/bench/procx"
	"github.com/leaseq/leaseq/bench/target"
	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/storage"
)

// serveReadyWait bounds how long `leaseq serve` may take to listen on a
// fresh data directory (RocksDB open is tens of milliseconds; the slack is
// for a loaded machine).
const serveReadyWait = 30 * time.Second

// buildTimeout bounds `go build` of the leaseq binary (a cold cgo build
// against RocksDB takes 15-60 s on two cores).
const buildTimeout = 5 * time.Minute

// Binary finds or builds the leaseq binary once per run and removes a
// binary it built on Close. It is safe for concurrent use.
type Binary struct {
	// Path is the binary to use; "" means the running executable when it
	// is leaseq itself (`leaseq bench`), else `go build` of the module
	// into a temporary directory (under `go test`).
	Path string

	once sync.Once
	path string
	err  error
	tmp  string
}

// Resolve returns the binary's path, building it on first use.
func (b *Binary) Resolve() (string, error) {
	b.once.Do(func() {
		if b.Path != "" {
			b.path, b.err = filepath.Abs(b.Path)
			if b.err == nil {
				_, b.err = os.Stat(b.path)
			}
			return
		}
		if exe, err := os.Executable(); err == nil && filepath.Base(exe) == "leaseq" {
			b.path = exe
			return
		}
		b.tmp, b.err = os.MkdirTemp("", "leaseq-bench-bin-")
		if b.err != nil {
			return
		}
		out := filepath.Join(b.tmp, "leaseq")
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "github.com/leaseq/leaseq")
		if msg, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("leaseqt: go build github.com/leaseq/leaseq (run from inside the module, or pass -leaseq-bin): %w: %s", err, msg)
			return
		}
		b.path = out
	})
	return b.path, b.err
}

// Close removes a binary Resolve built.
func (b *Binary) Close() error {
	if b.tmp == "" {
		return nil
	}
	return os.RemoveAll(b.tmp)
}

// RPC is a `leaseq serve` process driven over its Cap'n Proto RPC.
type RPC struct {
	Sync string // "always" or "none"
	Bin  *Binary
}

// Name implements target.System.
func (r RPC) Name() string { return "leaseq-rpc-" + r.Sync }

// Family implements target.System.
func (RPC) Family() string { return "leaseq" }

// Durability implements target.System.
func (r RPC) Durability() target.Durability {
	if r.Sync == "always" {
		return target.Durability{Class: target.ClassDurable, Mode: "WAL fsync, group commit (--sync=always)"}
	}
	return target.Durability{Class: target.ClassRelaxed, Mode: "WAL, no fsync (--sync=none)"}
}

// Available implements target.System; it builds the binary if needed.
func (r RPC) Available() error {
	_, err := r.Bin.Resolve()
	return err
}

// Start implements target.System.
func (r RPC) Start(ctx context.Context, o target.StartOptions) (target.Instance, error) {
	bin, err := r.Bin.Resolve()
	if err != nil {
		return nil, err
	}
	port, err := procx.FreePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	mport, err := procx.FreePort()
	if err != nil {
		return nil, err
	}
	metrics := "127.0.0.1:" + strconv.Itoa(mport)
	args := []string{"serve", "--data", filepath.Join(o.Dir, "data"), "--listen", addr, "--sync", r.Sync, "--metrics", metrics}
	var pprof string
	if o.Trace {
		pport, err := procx.FreePort()
		if err != nil {
			return nil, err
		}
		pprof = "127.0.0.1:" + strconv.Itoa(pport)
		args = append(args, "--pprof", pprof)
	}
	p, err := procx.Start(ctx, o.Clock, r.Name(), o.Dir, addr, serveReadyWait, bin, args...)
	if err != nil {
		return nil, err
	}
	// The RPC listener accepts before the node has finished starting (its
	// HTTP API, its metrics' view of the store): a row begun then read
	// counters the node did not serve yet. /readyz says when it has.
	if err := waitReadyz(ctx, o.Clock, metrics); err != nil {
		return nil, errors.Join(err, p.Stop())
	}
	return &rpcInstance{proc: p, addr: addr, metrics: metrics, pprof: pprof, lease: o.Lease}, nil
}

// waitReadyz waits, up to serveReadyWait, until the node whose metrics
// listen on metrics answers /readyz with 200.
func waitReadyz(ctx context.Context, clk clock.Clock, metrics string) error {
	c := http.Client{Timeout: metricsTimeout}
	deadline := clk.Now().Add(serveReadyWait)
	for {
		resp, err := c.Get("http://" + metrics + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !clk.Now().Before(deadline) {
			return fmt.Errorf("leaseqt: node not ready (/readyz on %s) after %v: %v", metrics, serveReadyWait, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-clk.After(5 * time.Millisecond):
		}
	}
}

type rpcInstance struct {
	proc    *procx.Process
	addr    string
	metrics string // the node's --metrics address
	pprof   string // the node's --pprof address; "" when started without
	lease   time.Duration
	closed  atomic.Bool
}

// nodeCounters maps the node's Prometheus series to the names the
// in-process rows report (inproc.go's Counters).
var nodeCounters = map[string]string{
	"leaseq_store_wal_fsync_seconds_count":                 counterFsyncs,
	"leaseq_store_wal_fsync_seconds_sum":                   counterFsyncTime,
	"leaseq_store_commits_total":                           counterCommits,
	"leaseq_store_write_stall_seconds_total":               counterStall,
	`leaseq_store_prefetch_batches_total{outcome="taken"}`: counterTaken,
}

// metricsTimeout bounds one scrape of the node's /metrics.
const metricsTimeout = 5 * time.Second

// Counters implements target.Counters from the node's /metrics: its WAL
// fsyncs and their seconds, commits and write stalls. nil if the scrape fails (the row then
// notes none).
func (in *rpcInstance) Counters() map[string]float64 {
	c := http.Client{Timeout: metricsTimeout}
	resp, err := c.Get("http://" + in.metrics + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	out, err := scrapeCounters(resp.Body, nodeCounters)
	if err != nil {
		return nil
	}
	return out
}

// scrapeCounters reads the unlabelled series named in want out of a
// Prometheus text page, under want's names for them.
func scrapeCounters(page io.Reader, want map[string]string) (map[string]float64, error) {
	out := make(map[string]float64, len(want))
	sc := bufio.NewScanner(page)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		name, ok := want[f[0]]
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return nil, fmt.Errorf("leaseqt: metrics: %s: %w", f[0], err)
		}
		out[name] = v
	}
	return out, sc.Err()
}

func (in *rpcInstance) PID() int { return in.proc.PID() }

// Trace implements target.Tracer: it fetches d of the node's execution
// trace from its /debug/pprof/trace into path.
func (in *rpcInstance) Trace(ctx context.Context, d time.Duration, path string) (wait func() error) {
	if in.pprof == "" {
		return func() error { return errors.New("leaseqt: trace: the node was started without --pprof") }
	}
	url := "http://" + in.pprof + "/debug/pprof/trace?seconds=" + strconv.FormatFloat(d.Seconds(), 'f', 3, 64)
	done := make(chan error, 1)
	go func() { done <- fetchTrace(ctx, url, path) }()
	return func() error { return <-done }
}

// fetchTrace writes the body of a GET of url into a new file at path.
func fetchTrace(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("leaseqt: trace: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("leaseqt: trace: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("leaseqt: trace: %s: %s", resp.Status, strings.TrimSpace(string(msg)))
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("leaseqt: trace: %w", err)
	}
	_, err = io.Copy(f, resp.Body)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("leaseqt: trace: %w", err)
	}
	return nil
}

func (in *rpcInstance) Close() error {
	if in.closed.Swap(true) {
		return nil
	}
	return in.proc.Stop()
}

func (in *rpcInstance) Connect(ctx context.Context) (target.Client, error) {
	return dialRPC(ctx, in.addr, in.lease)
}

// dialRPC opens one rpc client connection for one worker.
func dialRPC(ctx context.Context, addr string, lease time.Duration) (target.Client, error) {
	c, err := rpc.Dial(ctx, addr, rpc.ClientOptions{})
	if err != nil {
		return nil, fmt.Errorf("leaseqt: dial %s: %w", addr, err)
	}
	return &rpcClient{c: c, lease: lease}, nil
}

type rpcClient struct {
	c     *rpc.Client
	lease time.Duration
	items []storage.EnqueueItem
}

func (c *rpcClient) Close() error { return c.c.Close() }

// Ping is a nodeInfo call: a round trip the node answers without touching
// its store (target.Pinger).
func (c *rpcClient) Ping(ctx context.Context) error {
	if _, err := c.c.NodeInfo(ctx); err != nil {
		return fmt.Errorf("leaseqt: rpc nodeInfo: %w", err)
	}
	return nil
}

func (c *rpcClient) Enqueue(ctx context.Context, queue string, payloads [][]byte) error {
	c.items = c.items[:0]
	for _, p := range payloads {
		c.items = append(c.items, storage.EnqueueItem{Payload: p})
	}
	res, err := c.c.Enqueue(ctx, queue, c.items)
	if err != nil {
		return fmt.Errorf("leaseqt: rpc enqueue: %w", err)
	}
	return enqueueCodes(res)
}

func (c *rpcClient) Poll(ctx context.Context, queue string, max int, wait time.Duration) ([]target.Delivery, error) {
	res, err := c.c.Poll(ctx, queue, max, c.lease, wait)
	if err != nil {
		return nil, fmt.Errorf("leaseqt: rpc poll: %w", err)
	}
	return deliveries(res), nil
}

func (c *rpcClient) Ack(ctx context.Context, queue string, ds []target.Delivery) error {
	order, m, at := byLease(ds)
	var errs []error
	var lost target.LostAcks
	for _, l := range order {
		codes, err := c.c.Ack(ctx, queue, l, m[l])
		if err != nil {
			errs = append(errs, fmt.Errorf("leaseqt: rpc ack: %w", err))
			continue
		}
		errs = append(errs, ackCodes(codes, at[l], &lost))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return lostOrNil(&lost)
}

// AckPoll implements target.AckPoller with Client.AckPoll: the ack and a
// poll that does not wait go out in one write; when that poll finds
// nothing, a plain Poll waits. So the ack is confirmed when the pair
// returns, as with the Redis peer's pipeline.
func (c *rpcClient) AckPoll(ctx context.Context, queue string, ack []target.Delivery, acked func(*target.LostAcks), max int, wait time.Duration) ([]target.Delivery, error) {
	order, m, at := byLease(ack)
	if len(order) != 1 {
		return ackThenPoll(ctx, c, queue, ack, acked, max, wait)
	}
	codes, res, err := c.c.AckPoll(ctx, queue, order[0], m[order[0]], max, c.lease, 0)
	var lost target.LostAcks
	if err == nil {
		err = ackCodes(codes, at[order[0]], &lost)
	}
	if err != nil {
		return deliveries(res), fmt.Errorf("leaseqt: rpc ack+poll: %w", err)
	}
	acked(lostOrNone(&lost))
	if len(res.Items) == 0 {
		return c.Poll(ctx, queue, max, wait)
	}
	return deliveries(res), nil
}
