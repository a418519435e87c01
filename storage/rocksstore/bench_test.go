package rocksstore

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/storagetest"
)

// benchConfig selects the store variant a benchmark runs on.
type benchConfig struct {
	sync       SyncMode
	inlineMax  int
	noDelComp  bool
	memtable   int
	readyCache int64
}

func (c benchConfig) options() Options {
	return Options{Sync: c.sync, Now: time.Now, inlineMax: c.inlineMax, noDelCompact: c.noDelComp, memtable: c.memtable, ReadyCacheBytes: c.readyCache}
}

func openBench(b *testing.B, dir string, c benchConfig) *Store {
	b.Helper()
	s, err := Open(dir, c.options())
	require.NoError(b, err)
	return s
}

// benchPayloadItems returns n items with payloads of size random bytes,
// each its own, so that RocksDB's table compression gains nothing it
// would not on incompressible application data (until 2026-11-30 every
// item carried the same run of letters; see bench/measure.go).
func benchPayloadItems(n, size int) []storage.EnqueueItem {
	r := rand.New(rand.NewPCG(uint64(n), uint64(size)))
	items := make([]storage.EnqueueItem, n)
	for i := range items {
		p := make([]byte, size)
		for j := range p {
			p[j] = byte(r.Uint32())
		}
		items[i] = storage.EnqueueItem{Payload: p}
	}
	return items
}

// benchNow hands out increasing instants without reading a clock.
type benchNow struct{ n atomic.Int64 }

func (c *benchNow) now() time.Time { return t0.Add(time.Duration(c.n.Add(1)) * time.Microsecond) }

func reportItems(b *testing.B, items int, d time.Duration) {
	b.ReportMetric(float64(items)/d.Seconds(), "items/s")
}

// cpuTime is the process's user+system CPU time: on a shared, loaded
// machine CPU per item is a steadier comparison than items/s.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func reportCPU(b *testing.B, start time.Duration, items int) {
	if items > 0 {
		b.ReportMetric(float64((cpuTime()-start).Microseconds())/float64(items), "cpu-µs/item")
	}
}

func reportMetrics(b *testing.B, m Metrics) {
	if m.Commits > 0 {
		b.ReportMetric(float64(m.WALSyncs)/float64(m.Commits), "fsyncs/batch")
		b.ReportMetric(float64(m.Ops)/float64(m.Commits), "calls/batch")
	}
	if m.WALSyncs > 0 {
		b.ReportMetric(float64(m.Items)/float64(m.WALSyncs), "items/fsync")
		b.ReportMetric(float64(m.SyncTime.Microseconds())/float64(m.WALSyncs), "µs/fsync")
		b.ReportMetric(float64(m.InlineSyncs)/float64(m.WALSyncs), "inline/fsync")
	}
	if m.ClaimPasses > 0 {
		b.ReportMetric(float64(m.Polls)/float64(m.ClaimPasses), "polls/pass")
	}
	if m.Claimed > 0 {
		b.ReportMetric(float64(m.ClaimReads)/float64(m.Claimed), "reads/claimed")
	}
	if m.WriteStall > 0 {
		b.ReportMetric(float64(m.WriteStall.Microseconds())/1000, "stall-ms")
	}
	if m.Prefetched > 0 {
		b.ReportMetric(float64(m.PrefetchHits)/float64(m.Prefetched), "hits/prefetch")
	}
}

// BenchmarkEnqueue: batches of 100 x 256 B, and single items (sync=none).
func BenchmarkEnqueue(b *testing.B) {
	for _, c := range []struct {
		benchConfig
		batch int
	}{
		{benchConfig{sync: SyncAlways}, 100},
		{benchConfig{sync: SyncNone}, 100},
		{benchConfig{sync: SyncNone}, 1},
	} {
		b.Run(fmt.Sprintf("sync=%s,batch=%d", c.sync, c.batch), func(b *testing.B) {
			s := openBench(b, b.TempDir(), c.benchConfig)
			defer s.Close()
			items := benchPayloadItems(c.batch, 256)
			var clk benchNow
			ctx := context.Background()
			before := s.Metrics()
			cpu := cpuTime()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: items, Now: clk.now()}); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			reportCPU(b, cpu, b.N*c.batch)
			reportItems(b, b.N*c.batch, b.Elapsed())
			reportMetrics(b, s.Metrics().Sub(before))
		})
	}
}

// cycle runs one enqueue -> poll -> ack round of batch items.
func cycle(ctx context.Context, s *Store, clk *benchNow, q string, items []storage.EnqueueItem) (int, error) {
	if _, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: items, Now: clk.now()}); err != nil {
		return 0, err
	}
	r, err := s.Poll(ctx, storage.PollParams{Queue: q, Max: len(items), Lease: time.Minute, Now: clk.now()})
	if err != nil || len(r.Items) == 0 {
		return 0, err
	}
	ids := make([]storage.ItemID, len(r.Items))
	for i, it := range r.Items {
		ids[i] = it.ID
	}
	_, err = s.Ack(ctx, storage.AckParams{Queue: q, Lease: r.Lease, IDs: ids, Now: clk.now()})
	return len(ids), err
}

// runCycle runs b.N cycles of batch items split over workers goroutines
// on one shared queue and reports completed items/s.
func runCycle(b *testing.B, s *Store, batch, workers int) {
	items := benchPayloadItems(batch, 256)
	var clk benchNow
	ctx := context.Background()
	var next, done atomic.Int64
	before := s.Metrics()
	cpu := cpuTime()
	b.ResetTimer()
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				n, err := cycle(ctx, s, &clk, "q", items)
				if err != nil {
					b.Error(err)
					return
				}
				done.Add(int64(n))
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	reportCPU(b, cpu, int(done.Load()))
	reportItems(b, int(done.Load()), b.Elapsed())
	reportMetrics(b, s.Metrics().Sub(before))
}

// BenchmarkCycle: enqueue -> poll -> ack, batches of 32 x 256 B, 4 workers
// on one queue.
func BenchmarkCycle(b *testing.B) {
	for _, c := range []benchConfig{
		{sync: SyncAlways},
		{sync: SyncNone},
	} {
		for _, workers := range []int{1, 4} {
			name := fmt.Sprintf("sync=%s,batch=32,workers=%d", c.sync, workers)
			b.Run(name, func(b *testing.B) {
				s := openBench(b, b.TempDir(), c)
				defer s.Close()
				runCycle(b, s, 32, workers)
			})
		}
	}
}

// BenchmarkReadyCache: the cycle (sync=none, 4 workers) with the
// ready-record cache (readycache.go) on and off.
func BenchmarkReadyCache(b *testing.B) {
	for _, off := range []bool{false, true} {
		b.Run(fmt.Sprintf("cache=%t", !off), func(b *testing.B) {
			c := benchConfig{sync: SyncNone}
			if off {
				c.readyCache = -1
			}
			s := openBench(b, b.TempDir(), c)
			defer s.Close()
			runCycle(b, s, 32, 4)
		})
	}
}

// BenchmarkMemtableSize: the cycle with sync=none on memtables of several
// sizes (skiplist height and cache misses against flush frequency).
func BenchmarkMemtableSize(b *testing.B) {
	for _, mb := range []int{4, 8, 32, 64} {
		b.Run(fmt.Sprintf("memtable=%dMiB", mb), func(b *testing.B) {
			s := openBench(b, b.TempDir(), benchConfig{sync: SyncNone, memtable: mb << 20})
			defer s.Close()
			runCycle(b, s, 32, 1)
		})
	}
}

// BenchmarkStatisticsCost: the cycle with and without RocksDB statistics
// (which Metrics uses for fsync and write latency).
func BenchmarkStatisticsCost(b *testing.B) {
	for _, off := range []bool{false, true} {
		b.Run(fmt.Sprintf("stats=%t", !off), func(b *testing.B) {
			o := benchConfig{sync: SyncNone}.options()
			o.noStats = off
			s, err := Open(b.TempDir(), o)
			require.NoError(b, err)
			defer s.Close()
			runCycle(b, s, 32, 1)
		})
	}
}

// BenchmarkPayloadLayout compares inline and external payloads over a
// full cycle with one nack (poll, nack, poll, ack): the state changes that
// rewrite an inline payload.
func BenchmarkPayloadLayout(b *testing.B) {
	for _, size := range []int{256, 64 << 10} {
		for _, inline := range []int{1 << 20, -1} {
			layout := "inline"
			if inline < 0 {
				layout = "external"
			}
			b.Run(fmt.Sprintf("payload=%d,layout=%s,sync=none", size, layout), func(b *testing.B) {
				s := openBench(b, b.TempDir(), benchConfig{sync: SyncNone, inlineMax: inline})
				defer s.Close()
				items := benchPayloadItems(32, size)
				var clk benchNow
				ctx := context.Background()
				zero := time.Duration(0)
				cpu := cpuTime()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if _, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: items, Now: clk.now()}); err != nil {
						b.Fatal(err)
					}
					for round := 0; round < 2; round++ {
						r, err := s.Poll(ctx, storage.PollParams{Queue: "q", Max: 32, Lease: time.Minute, Now: clk.now()})
						if err != nil {
							b.Fatal(err)
						}
						ids := itemIDs(r.Items)
						if round == 0 {
							_, err = s.Nack(ctx, storage.NackParams{Queue: "q", Lease: r.Lease, IDs: ids, Delay: &zero, Now: clk.now()})
						} else {
							_, err = s.Ack(ctx, storage.AckParams{Queue: "q", Lease: r.Lease, IDs: ids, Now: clk.now()})
						}
						if err != nil {
							b.Fatal(err)
						}
					}
				}
				b.StopTimer()
				reportCPU(b, cpu, b.N*32)
				reportItems(b, b.N*32, b.Elapsed())
				b.ReportMetric(float64(size*32*b.N)/b.Elapsed().Seconds()/(1<<20), "payloadMiB/s")
			})
		}
	}
}

// churned is a database built once per configuration and reused by every
// run of BenchmarkPollAckAfterChurn (building it takes many seconds).
var churned sync.Map // string -> *churnedDB

type churnedDB struct {
	once  sync.Once
	fresh *Store
	churn *Store
	clk   benchNow
	build time.Duration
}

// churnBacklog is the number of ready items when measuring.
const churnBacklog = 200_000

// fill enqueues n ready items in batches of 1000.
func fill(b *testing.B, s *Store, clk *benchNow, n int) {
	items := benchPayloadItems(1000, 256)
	for i := 0; i < n; i += 1000 {
		if _, err := s.Enqueue(context.Background(), storage.EnqueueParams{Queue: "q", Items: items, Now: clk.now()}); err != nil {
			b.Fatal(err)
		}
	}
}

// pollAck polls and acks batches of 32 until n batches are done.
func pollAck(b *testing.B, s *Store, clk *benchNow, n int) {
	ctx := context.Background()
	for i := 0; i < n; i++ {
		r, err := s.Poll(ctx, storage.PollParams{Queue: "q", Max: 32, Lease: time.Minute, Now: clk.now()})
		if err != nil {
			b.Fatal(err)
		}
		if len(r.Items) == 0 {
			b.Fatal("backlog exhausted: use a smaller -benchtime")
		}
		if _, err := s.Ack(ctx, storage.AckParams{Queue: "q", Lease: r.Lease, IDs: itemIDs(r.Items), Now: clk.now()}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPollAckAfterChurn measures poll+ack (batches of 32, sync=none,
// so the LSM and not the fsync is measured) on a queue that has completed
// churn items, against a fresh database with the same backlog, and reports
// the ratio. Run with a fixed count, e.g. -benchtime=2000x. The variants
// without the head cursor (and without deletion-triggered compaction) show
// the tombstone trap, at a smaller churn because they slow down
// quadratically.
func BenchmarkPollAckAfterChurn(b *testing.B) {
	for _, v := range []struct {
		c     benchConfig
		churn int
	}{
		{benchConfig{sync: SyncNone}, 1_000_000},
		{benchConfig{sync: SyncNone}, 200_000},
		{benchConfig{sync: SyncNone, noDelComp: true}, 200_000},
	} {
		c, churnItems := v.c, v.churn
		name := fmt.Sprintf("churn=%d,delcompact=%t", churnItems, !c.noDelComp)
		b.Run(name, func(b *testing.B) {
			v, _ := churned.LoadOrStore(name, &churnedDB{})
			db := v.(*churnedDB)
			db.once.Do(func() {
				start := time.Now()
				dir := benchDir(b, "rocksstore-churn-")
				db.fresh = keepStore(openBench(b, dir+"/fresh", c))
				fill(b, db.fresh, &db.clk, churnBacklog)
				db.churn = keepStore(openBench(b, dir+"/churn", c))
				for done := 0; done < churnItems; done += 100_000 {
					fill(b, db.churn, &db.clk, 100_000)
					pollAck(b, db.churn, &db.clk, 100_000/32)
				}
				fill(b, db.churn, &db.clk, churnBacklog)
				db.build = time.Since(start)
				b.Logf("built churned database in %v (%s)", db.build, dir)
			})
			cpu := cpuTime()
			b.ResetTimer()
			pollAck(b, db.churn, &db.clk, b.N)
			b.StopTimer()
			churnCPU := cpuTime() - cpu
			churnRate := float64(b.N*32) / b.Elapsed().Seconds()
			start, cpu := time.Now(), cpuTime()
			pollAck(b, db.fresh, &db.clk, b.N)
			freshRate := float64(b.N*32) / time.Since(start).Seconds()
			freshCPU := cpuTime() - cpu
			b.ReportMetric(float64(churnCPU.Microseconds())/float64(b.N*32), "cpu-µs/item")
			b.ReportMetric(float64(freshCPU.Microseconds())/float64(b.N*32), "fresh-cpu-µs/item")
			b.ReportMetric(float64(freshCPU)/float64(churnCPU), "cpu-ratio")
			b.ReportMetric(churnRate, "items/s")
			b.ReportMetric(freshRate, "fresh-items/s")
			b.ReportMetric(churnRate/freshRate, "ratio")
		})
	}
}

// readRSS reads the process's resident set size in KiB.
func readRSS() (int, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/self/status")
}

func storagePoll() storage.PollParams {
	return storage.PollParams{Queue: "q", Max: 32, Lease: time.Minute, Now: t0.Add(time.Hour)}
}

var backlogDirs sync.Map // string -> directory

// BenchmarkOpenBacklog measures Open of a database holding a backlog of
// ready items, closed cleanly or with its memtables unflushed (as after a
// crash: Open replays the WAL), in a fresh process per open (see
// openProbe), and that process's RSS after one poll: memory is bounded by
// the block cache and memtables, not by the backlog. Each open of the
// probe also flushes on close, so only the first unflushed open replays.
func BenchmarkOpenBacklog(b *testing.B) {
	for _, c := range []struct {
		n     int
		crash bool
	}{{100_000, false}, {1_000_000, false}, {1_000_000, true}} {
		n := c.n
		how := "clean"
		if c.crash {
			how = "unflushed"
		}
		b.Run(fmt.Sprintf("backlog=%d,close=%s", n, how), func(b *testing.B) {
			key := fmt.Sprint(n, how)
			v, loaded := backlogDirs.Load(key)
			if !loaded {
				dir := benchDir(b, "rocksstore-backlog-")
				o := benchConfig{sync: SyncNone}.options()
				o.noCloseFlush = c.crash
				s, err := Open(dir, o)
				require.NoError(b, err)
				var clk benchNow
				fill(b, s, &clk, n)
				require.NoError(b, s.Close())
				backlogDirs.Store(key, dir)
				v = dir
			}
			dir := v.(string)
			var openNs, rss float64
			for i := 0; i < b.N; i++ {
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), openProbeEnv+"="+dir)
				out, err := cmd.Output()
				require.NoError(b, err, "probe: %s", out)
				var o, r float64
				_, err = fmt.Sscan(string(out), &o, &r)
				require.NoError(b, err, "probe output %q", out)
				openNs += o
				rss = max(rss, r)
			}
			b.ReportMetric(openNs/float64(b.N)/1e6, "open-ms")
			b.ReportMetric(rss/1024, "rss-MiB")
		})
	}
}

// BenchmarkGroupCommit: 16 goroutines each enqueue one item per commit with
// sync=always; fsyncs/commit < 1 shows RocksDB write groups sharing fsyncs.
func BenchmarkGroupCommit(b *testing.B) {
	for _, workers := range []int{1, 16} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			s := openBench(b, b.TempDir(), benchConfig{sync: SyncAlways})
			defer s.Close()
			items := benchPayloadItems(1, 256)
			var clk benchNow
			ctx := context.Background()
			_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: items, Now: clk.now()})
			require.NoError(b, err)
			var next atomic.Int64
			before := s.Metrics()
			b.ResetTimer()
			var wg sync.WaitGroup
			for w := 0; w < workers; w++ {
				wg.Go(func() {
					for next.Add(1) <= int64(b.N) {
						if _, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: items, Now: clk.now()}); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			reportItems(b, b.N, b.Elapsed())
			m := s.Metrics().Sub(before)
			reportMetrics(b, m)
			if m.WALSyncs > 0 {
				b.ReportMetric(float64(m.SyncTime.Microseconds())/float64(m.WALSyncs), "fsync-µs")
			}
		})
	}
}

// BenchmarkStoragetest runs the shared Store benchmarks on rocksstore.
func BenchmarkStoragetest(b *testing.B) {
	storagetest.Bench(b, harness(conformanceOptions(SyncAlways)))
}

// BenchmarkRawRocksDB calibrates the machine: a plain RocksDB WriteBatch of
// 100 x 256 B values (one key per item), outside any transaction, with the
// same options as the store. Compare the store's numbers with this floor.
func BenchmarkRawRocksDB(b *testing.B) {
	for _, sync := range []SyncMode{SyncAlways, SyncNone} {
		b.Run(fmt.Sprintf("sync=%s,batch=100", sync), func(b *testing.B) {
			s := openBench(b, b.TempDir(), benchConfig{sync: sync})
			defer s.Close()
			db := s.db
			val := benchPayloadItems(1, 256)[0].Payload
			cpu := cpuTime()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var wb writeBuf
				for j := 0; j < 100; j++ {
					wb.put([]byte(fmt.Sprintf("\x00raw/%012d/%03d", i, j)), val)
				}
				if err := db.write(&wb, sync == SyncAlways); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			reportCPU(b, cpu, b.N*100)
			reportItems(b, b.N*100, b.Elapsed())
		})
	}
}

// BenchmarkSmallPolls is the batch-1 pathology: consumers that poll one
// item at a time (and ack it) against one consumer polling four. With the
// commit pipeline, concurrent small polls share batches (and fsyncs), so
// 4 consumers polling 1 should cost about what 1 consumer polling 4 does.
// b.N is the number of items consumed from a backlog filled beforehand.
func BenchmarkSmallPolls(b *testing.B) {
	for _, mode := range []SyncMode{SyncAlways, SyncNone} {
		for _, v := range []struct{ consumers, max int }{{4, 1}, {1, 4}, {1, 1}} {
			b.Run(fmt.Sprintf("sync=%s,consumers=%d,poll=%d", mode, v.consumers, v.max), func(b *testing.B) {
				s := openBench(b, b.TempDir(), benchConfig{sync: mode})
				defer s.Close()
				var clk benchNow
				fill(b, s, &clk, b.N+1000)
				ctx := context.Background()
				var next, done atomic.Int64
				before := s.Metrics()
				cpu := cpuTime()
				b.ResetTimer()
				var wg sync.WaitGroup
				for range v.consumers {
					wg.Go(func() {
						for next.Add(int64(v.max)) <= int64(b.N)+int64(v.max)-1 {
							r, err := s.Poll(ctx, storage.PollParams{Queue: "q", Max: v.max, Lease: time.Minute, Now: clk.now()})
							if err != nil || len(r.Items) == 0 {
								b.Error("poll:", err, len(r.Items))
								return
							}
							if _, err := s.Ack(ctx, storage.AckParams{Queue: "q", Lease: r.Lease, IDs: itemIDs(r.Items), Now: clk.now()}); err != nil {
								b.Error(err)
								return
							}
							done.Add(int64(len(r.Items)))
						}
					})
				}
				wg.Wait()
				b.StopTimer()
				reportCPU(b, cpu, int(done.Load()))
				reportItems(b, int(done.Load()), b.Elapsed())
				reportMetrics(b, s.Metrics().Sub(before))
			})
		}
	}
}
