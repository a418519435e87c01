// The HTTP endpoints of a node (/metrics, /healthz, /readyz; /debug/pprof/
// with --pprof) and the Prometheus collector.

package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/rpc/httpapi"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
	"github.com/leaseq/leaseq/sweeper"
)

// metricsServer serves /metrics from a private registry (the node's
// collector plus the Go runtime and process collectors), /healthz, and
// /readyz from ready.
// /readyz is 503 while health reports an error (a store that stopped
// after a failed write).
func metricsServer(c prometheus.Collector, ready *atomic.Bool, health func() error, log *slog.Logger) *http.Server {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(log.With("svc", "metrics").Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
	}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		if err := health(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	// Timeouts keep a stuck scraper from holding connections forever.
	return &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second}
}

// pprofServer serves Go's profiling endpoints under /debug/pprof/ on a mux
// of its own (net/http/pprof also registers them on http.DefaultServeMux,
// which the node never serves). A CPU profile or an execution trace runs
// for the seconds its request asks, so there is no write timeout.
func pprofServer() *http.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
}

// nodeParts are what the collector reads on each scrape; nil before the
// node is up and after it stopped.
type nodeParts struct {
	store storage.Store
	rocks *rocksstore.Store // nil for other backends
	srv   *rpc.Server
	api   *httpapi.Server // nil without --http
	sw    *sweeper.Sweeper
	clk   clock.Clock
}

// nodeCollector turns the components' snapshot structs (Store.Stats,
// rpc.Server.Metrics, rocksstore and sweeper Metrics) into Prometheus
// metrics at scrape time, so the libraries stay free of a metrics system
// and queue depth is never stale.
type nodeCollector struct {
	node atomic.Pointer[nodeParts]
	// maxQueues bounds the queues with series of their own; the others are
	// summed under the queue label otherQueues (0: defaultMetricsQueues).
	maxQueues int
	other     otherCounters

	depth, leases, oldest, itemsTotal, queues                                              *prometheus.Desc
	opCount, opErrors, opLatency                                                           *prometheus.Desc
	connsOpen, connsAccepted, connsRefused, waiters, subs                                  *prometheus.Desc
	pushed, replyBytes                                                                     *prometheus.Desc
	commits, syncCommits, inlineSyncs, earlySyncs, commitLatency, fsyncLatency, writeStall *prometheus.Desc
	calls, items, claimPasses, polls, claimed, prefetch                                    *prometheus.Desc
	storeFailed, diskFree, corrupt                                                         *prometheus.Desc
	sweeps, sweepFails, sweepItems, sweepLag, sweepMaxLag                                  *prometheus.Desc
	sweepDuration                                                                          *prometheus.Desc
	httpCount, httpErrors, httpLatency                                                     *prometheus.Desc
}

func newNodeCollector() *nodeCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("leaseq_"+name, help, labels, nil)
	}
	return &nodeCollector{
		depth:         d("queue_depth", "Items in a queue by state (ready, delayed, inflight, dead).", "queue", "state"),
		leases:        d("queue_leases_active", "Lease records of a queue not yet acked, nacked or swept.", "queue"),
		oldest:        d("queue_oldest_ready_age_seconds", "Age of the oldest ready item of a queue (0 when none is ready).", "queue"),
		itemsTotal:    d("queue_items_total", "Lifetime item events of a queue (enqueued, duplicate, delivered, acked, nacked, expired, dead_lettered, redriven, purged).", "queue", "event"),
		opCount:       d("rpc_requests_total", "RPC calls handled, by operation.", "op"),
		opErrors:      d("rpc_request_errors_total", "RPC calls answered with an error status or exception, by operation.", "op"),
		opLatency:     d("rpc_request_duration_seconds", "RPC call latency by operation (a long poll includes its wait).", "op"),
		connsOpen:     d("rpc_connections_open", "Open client connections."),
		connsAccepted: d("rpc_connections_accepted_total", "Client connections served."),
		connsRefused:  d("rpc_connections_refused_total", "Connections refused at --max-conns or failing the TLS handshake."),
		waiters:       d("rpc_waiters", "Parked long polls and idle subscriptions."),
		subs:          d("rpc_subscriptions", "Open subscriptions."),
		queues:        d("queues", "Queues on the node (per-queue series cover the --metrics-max-queues busiest; the rest are summed under queue=\"(other)\")."),
		pushed:        d("rpc_items_pushed_total", "Items delivered to subscriptions."),
		replyBytes:    d("rpc_reply_bytes_queued", "Bytes of answers built and not yet written to their connections (each connection's share is bounded)."),
		commits:       d("store_commits_total", "Batches the commit pipeline wrote, one WAL write each (RocksDB)."),
		syncCommits:   d("store_sync_commits_total", "Batches that waited for a WAL fsync (RocksDB)."),
		inlineSyncs:   d("store_wal_inline_fsyncs_total", "WAL fsyncs run by the goroutine of a lone caller instead of the syncer goroutine (RocksDB)."),
		earlySyncs:    d("store_wal_early_fsyncs_total", "WAL fsyncs begun as soon as a batch's record was in the WAL file, while its commit still inserted into the memtables (RocksDB)."),
		commitLatency: d("store_commit_seconds", "Time RocksDB spent writing batches, fsync excluded (count: batches)."),
		fsyncLatency:  d("store_wal_fsync_seconds", "WAL fsync latency (count: fsyncs; one fsync covers every batch written since the last)."),
		writeStall:    d("store_write_stall_seconds_total", "Time commits waited on RocksDB's write stalls (writes slowed or stopped until flushes and compactions caught up); should stay near zero."),
		calls:         d("store_calls_total", "Calls committed by the pipeline (RocksDB); calls_total/commits_total is calls per batch."),
		items:         d("store_items_total", "Items the committed calls touched (RocksDB); items_total/wal_fsync_seconds_count is items per fsync."),
		claimPasses:   d("store_claim_passes_total", "Batches holding at least one poll (RocksDB); polls_total/claim_passes_total > 1 shows polls sharing a commit."),
		polls:         d("store_polls_total", "Poll calls (RocksDB)."),
		claimed:       d("store_claimed_items_total", "Items handed out by polls (RocksDB)."),
		prefetch:      d("store_prefetch_batches_total", "Batches acks claimed ahead for their consumers' next polls (claimed), those a poll was answered with (taken) and those given back (RocksDB, --sync=always).", "outcome"),
		storeFailed:   d("store_failed", "1 while the store has stopped after a failed write (a full disk, say) and waits to reopen (RocksDB); /readyz is 503 meanwhile."),
		corrupt:       d("store_corrupt_errors_total", "Calls that met data they could not decode (a damaged record or SST block; RocksDB); /readyz is 503 once any did."),
		diskFree:      d("store_disk_free_bytes", "Free bytes on the data directory's filesystem (RocksDB); enqueues are refused below --min-free-disk."),
		sweeps:        d("sweeper_passes_total", "Sweeper passes."),
		sweepFails:    d("sweeper_failed_passes_total", "Sweeper passes that failed."),
		sweepItems:    d("sweeper_events_total", "Sweeper work (leases_expired, requeued, dead_lettered, promoted, dedup_dropped).", "event"),
		sweepLag:      d("sweeper_lag_seconds", "How late the last timer-driven sweep started after its deadline."),
		sweepMaxLag:   d("sweeper_max_lag_seconds", "Largest sweeper lag seen."),
		sweepDuration: d("sweeper_last_pass_seconds", "Duration of the last sweeper pass."),
		httpCount:     d("http_requests_total", "HTTP API requests answered, by route (--http).", "op"),
		httpErrors:    d("http_request_errors_total", "HTTP API requests answered with an error, by route (--http).", "op"),
		httpLatency:   d("http_request_duration_seconds", "HTTP API request latency by route (a long poll includes its wait; count: requests).", "op"),
	}
}

// Describe implements prometheus.Collector.
func (c *nodeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.depth, c.leases, c.oldest, c.itemsTotal, c.queues, c.opCount, c.opErrors, c.opLatency,
		c.connsOpen, c.connsAccepted, c.connsRefused, c.waiters, c.subs, c.pushed, c.replyBytes,
		c.commits, c.syncCommits, c.inlineSyncs, c.earlySyncs, c.commitLatency, c.fsyncLatency, c.writeStall, c.calls, c.items, c.claimPasses, c.polls, c.claimed, c.prefetch, c.storeFailed, c.diskFree, c.corrupt,
		c.sweeps, c.sweepFails, c.sweepItems, c.sweepLag, c.sweepMaxLag, c.sweepDuration,
		c.httpCount, c.httpErrors, c.httpLatency,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *nodeCollector) Collect(ch chan<- prometheus.Metric) {
	p := c.node.Load()
	if p == nil {
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}

	// A scrape must not hang on a stuck store.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stats, err := p.store.Stats(ctx, storage.StatsParams{Now: p.clk.Now()})
	if err != nil {
		ch <- prometheus.NewInvalidMetric(c.depth, fmt.Errorf("stats: %w", err))
	}
	gauge(c.queues, float64(len(stats)))
	bounded := boundQueues(stats, c.maxQueues)
	if n := len(bounded); n > 0 && bounded[n-1].Queue == otherQueues {
		c.other.keepUp(&bounded[len(bounded)-1], stats, bounded[:len(bounded)-1])
	}
	for _, q := range bounded {
		gauge(c.depth, float64(q.Ready), q.Queue, "ready")
		gauge(c.depth, float64(q.Delayed), q.Queue, "delayed")
		gauge(c.depth, float64(q.Inflight), q.Queue, "inflight")
		gauge(c.depth, float64(q.Dead), q.Queue, "dead")
		gauge(c.leases, float64(q.Leases), q.Queue)
		gauge(c.oldest, q.OldestReadyAge.Seconds(), q.Queue)
		for _, ev := range []struct {
			name string
			v    uint64
		}{
			{"enqueued", q.Enqueued}, {"duplicate", q.Duplicates}, {"delivered", q.Delivered},
			{"acked", q.Acked}, {"nacked", q.Nacked}, {"expired", q.Expired},
			{"dead_lettered", q.DeadLettered}, {"redriven", q.Redriven}, {"purged", q.Purged},
		} {
			counter(c.itemsTotal, ev.v, q.Queue, ev.name)
		}
	}

	m := p.srv.Metrics()
	for _, o := range m.Ops {
		name := o.Op.String()
		counter(c.opCount, o.Count, name)
		counter(c.opErrors, o.Errors, name)
		buckets := make(map[float64]uint64, len(rpc.LatencyBounds))
		var cum uint64
		for i, b := range rpc.LatencyBounds {
			if i < len(o.Buckets) {
				cum += o.Buckets[i]
			}
			buckets[b.Seconds()] = cum
		}
		ch <- prometheus.MustNewConstHistogram(c.opLatency, o.Count, o.Sum.Seconds(), buckets, name)
	}
	gauge(c.connsOpen, float64(m.ConnsOpen))
	counter(c.connsAccepted, m.ConnsAccepted)
	counter(c.connsRefused, m.ConnsRefused)
	gauge(c.waiters, float64(m.Waiters))
	gauge(c.subs, float64(m.Subscriptions))
	counter(c.pushed, m.ItemsPushed)
	gauge(c.replyBytes, float64(m.ReplyBytesQueued))
	if p.api != nil {
		for _, o := range p.api.Metrics().Ops {
			counter(c.httpCount, o.Count, o.Op)
			counter(c.httpErrors, o.Errors, o.Op)
			ch <- prometheus.MustNewConstSummary(c.httpLatency, o.Count, o.Sum.Seconds(), nil, o.Op)
		}
	}

	if p.rocks != nil {
		r := p.rocks.Metrics()
		counter(c.commits, r.Commits)
		counter(c.syncCommits, r.SyncCommits)
		counter(c.inlineSyncs, r.InlineSyncs)
		counter(c.earlySyncs, r.EarlySyncs)
		ch <- prometheus.MustNewConstSummary(c.commitLatency, r.Commits, r.CommitTime.Seconds(), nil)
		ch <- prometheus.MustNewConstSummary(c.fsyncLatency, r.WALSyncs, r.SyncTime.Seconds(), nil)
		ch <- prometheus.MustNewConstMetric(c.writeStall, prometheus.CounterValue, r.WriteStall.Seconds())
		counter(c.calls, r.Ops)
		counter(c.items, r.Items)
		failed := 0.0
		if p.rocks.Failed() != nil {
			failed = 1
		}
		gauge(c.storeFailed, failed)
		corruptN, _ := p.rocks.Corruption()
		counter(c.corrupt, corruptN)
		if free, err := p.rocks.FreeDisk(); err == nil {
			gauge(c.diskFree, float64(free))
		}
		counter(c.claimPasses, r.ClaimPasses)
		counter(c.polls, r.Polls)
		counter(c.claimed, r.Claimed)
		counter(c.prefetch, r.Prefetched, "claimed")
		counter(c.prefetch, r.PrefetchHits, "taken")
		counter(c.prefetch, r.PrefetchReleased, "given_back")
	}

	s := p.sw.Metrics()
	counter(c.sweeps, s.Passes)
	counter(c.sweepFails, s.FailedPasses)
	counter(c.sweepItems, s.LeasesExpired, "leases_expired")
	counter(c.sweepItems, s.Requeued, "requeued")
	counter(c.sweepItems, s.DeadLettered, "dead_lettered")
	counter(c.sweepItems, s.Promoted, "promoted")
	counter(c.sweepItems, s.DedupDropped, "dedup_dropped")
	gauge(c.sweepLag, s.LastLag.Seconds())
	gauge(c.sweepMaxLag, s.MaxLag.Seconds())
	gauge(c.sweepDuration, s.LastPassDuration.Seconds())
}

// defaultMetricsQueues is --metrics-max-queues' default: enough for most
// nodes, small enough that a scrape stays well under a megabyte however
// many queues exist.
const defaultMetricsQueues = 200

// otherQueues labels the sum of the queues without series of their own; it
// is not a valid queue name, so it cannot collide with one.
const otherQueues = "(other)"

// otherCounters keeps the otherQueues sum's lifetime counters from going
// down, as Prometheus counters must not: a queue leaves the sum when it is
// deleted (or deleted and made again) or ranks among those with series of
// their own, and the counters it had in the sum stay in base (found by
// review, session 69: the sum was taken afresh at every scrape).
type otherCounters struct {
	sync.Mutex
	last map[string]storage.QueueStats // the summed queues' counters at the last scrape
	base storage.QueueStats            // the counters of queues that left the sum
}

// keepUp adds to other, the sum of the queues in stats that are not in
// own, the counters of the queues that left the sum since the last scrape.
func (o *otherCounters) keepUp(other *storage.QueueStats, stats, own []storage.QueueStats) {
	o.Lock()
	defer o.Unlock()
	mine := make(map[string]bool, len(own))
	for _, q := range own {
		mine[q.Queue] = true
	}
	now := make(map[string]storage.QueueStats, len(stats)-len(own))
	for _, q := range stats {
		if !mine[q.Queue] {
			now[q.Queue] = q
		}
	}
	for name, was := range o.last {
		if q, ok := now[name]; !ok || q.Enqueued < was.Enqueued || q.Delivered < was.Delivered || q.Acked < was.Acked {
			addCounters(&o.base, was) // gone, ranked out, or made again from zero
		}
	}
	o.last = now
	addCounters(other, o.base)
}

// addCounters adds q's lifetime counters to sum.
func addCounters(sum *storage.QueueStats, q storage.QueueStats) {
	sum.Enqueued += q.Enqueued
	sum.Duplicates += q.Duplicates
	sum.Delivered += q.Delivered
	sum.Acked += q.Acked
	sum.Nacked += q.Nacked
	sum.Expired += q.Expired
	sum.DeadLettered += q.DeadLettered
	sum.Redriven += q.Redriven
	sum.Purged += q.Purged
}

// boundQueues keeps the limit queues with the most items ever enqueued (a
// ranking that rarely changes, so a queue's counters stay in one series)
// and sums the rest into one otherQueues entry. The oldest-ready age of
// the sum is the largest among them.
func boundQueues(stats []storage.QueueStats, limit int) []storage.QueueStats {
	if limit <= 0 {
		limit = defaultMetricsQueues
	}
	if len(stats) <= limit {
		return stats
	}
	ranked := slices.Clone(stats)
	slices.SortFunc(ranked, func(a, b storage.QueueStats) int {
		if a.Enqueued != b.Enqueued {
			return cmp.Compare(b.Enqueued, a.Enqueued)
		}
		return strings.Compare(a.Queue, b.Queue)
	})
	out := ranked[:limit:limit]
	other := storage.QueueStats{Queue: otherQueues}
	for _, q := range ranked[limit:] {
		other.Ready += q.Ready
		other.Delayed += q.Delayed
		other.Inflight += q.Inflight
		other.Dead += q.Dead
		other.Leases += q.Leases
		other.OldestReadyAge = max(other.OldestReadyAge, q.OldestReadyAge)
		addCounters(&other, q)
	}
	return append(out, other)
}
