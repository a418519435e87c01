package rpc

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/memstore"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// benchBackends are the stores each benchmark runs on: rocks (sync=always)
// is the target; mem isolates the cost of the RPC layer.
var benchBackends = []string{"rocks", "mem"}

// benchEngines are the connection engines each benchmark compares.
var benchEngines = []string{EngineGoCapnp, EngineLean}

// openBenchStore opens a store for a benchmark: "rocks" (sync=always),
// "rocks-none" (sync=none) or "mem".
func openBenchStore(tb testing.TB, backend string) storage.Store {
	tb.Helper()
	st, err := openBenchStoreAt(tb.TempDir(), backend)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = st.Close() })
	return st
}

// openBenchStoreAt opens backend ("rocks", "rocks-none", else memstore)
// in dir.
func openBenchStoreAt(dir, backend string) (storage.Store, error) {
	switch backend {
	case "rocks":
		return rocksstore.Open(dir, rocksstore.Options{Sync: rocksstore.SyncAlways})
	case "rocks-none":
		return rocksstore.Open(dir, rocksstore.Options{Sync: rocksstore.SyncNone})
	}
	return memstore.New(memstore.Options{}), nil
}

// benchServer serves a store over real TCP loopback with the real clock,
// on engine.
func benchServer(b *testing.B, backend, engine string) (*Server, string) {
	b.Helper()
	st := openBenchStore(b, backend)
	srv, err := NewServer(ServerConfig{Store: st, Clock: clock.New(), Engine: engine})
	require.NoError(b, err)
	b.Cleanup(srv.Stop)
	ln, err := Listen("127.0.0.1:0")
	require.NoError(b, err)
	require.NoError(b, srv.Start(context.Background(), ln))
	return srv, ln.Addr().String()
}

func benchDial(b *testing.B, addr string) *Client {
	b.Helper()
	c, err := Dial(context.Background(), addr, ClientOptions{})
	require.NoError(b, err)
	b.Cleanup(func() { _ = c.Close() })
	return c
}

// reportPercentiles reports p50 and p99 of lat in milliseconds.
func reportPercentiles(b *testing.B, prefix string, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	at := func(q float64) float64 {
		return float64(lat[min(len(lat)-1, int(q*float64(len(lat))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(at(0.50), prefix+"p50-ms")
	b.ReportMetric(at(0.99), prefix+"p99-ms")
}

// BenchmarkRPC_EnqueueRoundTrip: one 256-byte item per call, one call at
// a time, to a server in a process of its own (benchProc), so that
// server-cpu-us/call is the server's CPU time (user+system) per call and
// client-cpu-us/call this process's. rocks fsyncs every call;
// rocks-none does not; mem isolates the RPC layer.
func BenchmarkRPC_EnqueueRoundTrip(b *testing.B) {
	items := []storage.EnqueueItem{{Payload: make([]byte, 256)}}
	for _, be := range []string{"rocks", "rocks-none", "mem"} {
		for _, e := range benchEngines {
			b.Run("backend="+be+",engine="+e, func(b *testing.B) {
				benchRoundTrip(b, be, e, func(ctx context.Context, c *Client) error {
					_, err := c.Enqueue(ctx, "rtt", items)
					return err
				})
			})
		}
	}
}

// BenchmarkRPC_NodeInfoRoundTrip: nodeInfo calls, one at a time: a round
// trip with no store work, the cost of the RPC layer alone (as
// BenchmarkRPC_EnqueueRoundTrip, the server in a process of its own).
func BenchmarkRPC_NodeInfoRoundTrip(b *testing.B) {
	for _, e := range benchEngines {
		b.Run("engine="+e, func(b *testing.B) {
			benchRoundTrip(b, "mem", e, func(ctx context.Context, c *Client) error {
				_, err := c.NodeInfo(ctx)
				return err
			})
		})
	}
}

// benchRoundTrip runs call b.N times, one at a time, against a server
// process and reports latency percentiles and CPU time per call on both
// sides.
func benchRoundTrip(b *testing.B, backend, engine string, call func(context.Context, *Client) error) {
	p := startBenchProc(b, backend, engine)
	c := benchDial(b, p.addr)
	ctx := context.Background()
	for range 100 { // warm up: connection, buffers, the store's first writes
		if err := call(ctx, c); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	serverStart, clientStart := p.cpu(b), processCPU()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if err := call(ctx, c); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	serverCPU, clientCPU := p.cpu(b)-serverStart, processCPU()-clientStart
	reportPercentiles(b, "", lat)
	b.ReportMetric(float64(serverCPU)/float64(time.Microsecond)/float64(b.N), "server-cpu-us/call")
	b.ReportMetric(float64(clientCPU)/float64(time.Microsecond)/float64(b.N), "client-cpu-us/call")
}

// BenchmarkRPC_WakeLatency: a consumer parked in a long poll; a producer
// enqueues one item; latency from the start of the enqueue call (fsync
// included) to the poll's answer arriving at the consumer.
func BenchmarkRPC_WakeLatency(b *testing.B) {
	for _, be := range benchBackends {
		for _, e := range benchEngines {
			b.Run("backend="+be+",engine="+e, func(b *testing.B) { benchmarkRPC_WakeLatency(b, be, e) })
		}
	}
}

func benchmarkRPC_WakeLatency(b *testing.B, backend, engine string) {
	srv, addr := benchServer(b, backend, engine)
	consumer, producer := benchDial(b, addr), benchDial(b, addr)
	ctx := context.Background()
	items := []storage.EnqueueItem{{Payload: make([]byte, 256)}}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		got := make(chan storage.PollResult, 1)
		go func() {
			pr, err := consumer.Poll(ctx, "wake", 1, time.Minute, 10*time.Second)
			if err != nil {
				b.Error(err)
			}
			got <- pr
		}()
		for srv.Metrics().Waiters == 0 {
			time.Sleep(20 * time.Microsecond) // benchmark setup: wait until parked
		}
		start := time.Now()
		if _, err := producer.Enqueue(ctx, "wake", items); err != nil {
			b.Fatal(err)
		}
		pr := <-got
		lat = append(lat, time.Since(start))
		if len(pr.Items) != 1 {
			b.Fatalf("poll returned %d items", len(pr.Items))
		}
		if _, err := consumer.Ack(ctx, "wake", pr.Lease, []storage.ItemID{pr.Items[0].ID}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportPercentiles(b, "", lat)
}

// BenchmarkRPC_4P4C: 4 producers (enqueue batch 32) and 4 consumers (poll
// batch 32, one ack per batch), each on its own connection; b.N items
// enqueued and fully acked.
func BenchmarkRPC_4P4C(b *testing.B) {
	for _, be := range benchBackends {
		for _, e := range benchEngines {
			b.Run("backend="+be+",engine="+e, func(b *testing.B) { benchmarkRPC_4P4C(b, be, e) })
		}
	}
}

func benchmarkRPC_4P4C(b *testing.B, backend, engine string) {
	_, addr := benchServer(b, backend, engine)
	const producers, consumers, batch = 4, 4, 32
	prod := make([]*Client, producers)
	cons := make([]*Client, consumers)
	for i := range prod {
		prod[i] = benchDial(b, addr)
	}
	for i := range cons {
		cons[i] = benchDial(b, addr)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	total := int64((b.N + batch - 1) / batch * batch)
	var enqueued, acked atomic.Int64
	payload := make([]byte, 256)
	items := make([]storage.EnqueueItem, batch)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: payload}
	}
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for _, c := range prod {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for enqueued.Add(batch) <= total {
				if _, err := c.Enqueue(ctx, "load", items); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	done := make(chan struct{})
	var once sync.Once
	for _, c := range cons {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				pr, err := c.Poll(ctx, "load", batch, time.Minute, time.Second)
				if err != nil {
					if ctx.Err() == nil {
						b.Error(err)
					}
					return
				}
				if len(pr.Items) == 0 {
					continue
				}
				ids := make([]storage.ItemID, len(pr.Items))
				for i, it := range pr.Items {
					ids[i] = it.ID
				}
				if _, err := c.Ack(context.Background(), "load", pr.Lease, ids); err != nil {
					b.Error(err)
					return
				}
				if acked.Add(int64(len(ids))) >= total {
					once.Do(func() { close(done) })
				}
			}
		}()
	}
	<-done
	elapsed := time.Since(start)
	b.StopTimer()
	cancel()
	wg.Wait()
	b.ReportMetric(float64(total)/elapsed.Seconds(), "items/s")
}

// BenchmarkRPC_Producer: 32 goroutines each enqueue single 256 B items,
// either one call per item (Client.Enqueue) or through a batching
// Producer. items/s and calls/item compare the two; one op is one item.
func BenchmarkRPC_Producer(b *testing.B) {
	for _, be := range benchBackends {
		for _, batching := range []bool{false, true} {
			b.Run(fmt.Sprintf("backend=%s,producer=%t", be, batching), func(b *testing.B) {
				_, addr := benchServer(b, be, EngineGoCapnp)
				c := benchDial(b, addr)
				ctx := context.Background()
				var calls atomic.Int64
				enqueue := func(it storage.EnqueueItem) error {
					calls.Add(1)
					_, err := c.Enqueue(ctx, "prod", []storage.EnqueueItem{it})
					return err
				}
				if batching {
					p, err := c.Producer("prod", ProducerOptions{})
					if err != nil {
						b.Fatal(err)
					}
					defer p.Close()
					calls.Store(0)
					p.onCall = func(int) { calls.Add(1) }
					enqueue = func(it storage.EnqueueItem) error {
						_, err := p.Enqueue(ctx, it)
						return err
					}
				}
				const workers = 32
				var next atomic.Int64
				var wg sync.WaitGroup
				start := time.Now()
				b.ResetTimer()
				for w := 0; w < workers; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						it := storage.EnqueueItem{Payload: make([]byte, 256)}
						for next.Add(1) <= int64(b.N) {
							if err := enqueue(it); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "items/s")
				b.ReportMetric(float64(calls.Load())/float64(b.N), "calls/item")
			})
		}
	}
}

// BenchmarkRPC_ParkedPollMemory measures what a parked long poll costs:
// one connection parks parkedPolls polls over 5 empty queues (sent as
// pipelined calls, no client goroutine per call), and the Go heap and
// stack in use grow by bytes/parked-poll (server and client side
// together, one process), and so does the number of goroutines (one on
// each side: the node's handler parked in the dispatcher, go-capnp's
// client-side cancel watcher). b.N only repeats the measurement.
func BenchmarkRPC_ParkedPollMemory(b *testing.B) {
	for _, e := range benchEngines {
		b.Run("engine="+e, func(b *testing.B) { benchmarkRPC_ParkedPollMemory(b, e) })
	}
}

func benchmarkRPC_ParkedPollMemory(b *testing.B, engine string) {
	const parkedPolls = 10_000
	srv, addr := benchServer(b, "mem", engine)
	var perPoll, goroutinesPerPoll float64
	for range b.N {
		c, err := Dial(context.Background(), addr, ClientOptions{})
		require.NoError(b, err)
		before := heapAndStacks()
		goroutinesBefore := runtime.NumGoroutine()
		ctx, cancel := context.WithCancel(context.Background())
		releases := make([]func(), 0, parkedPolls)
		for i := range parkedPolls {
			queue := fmt.Sprintf("q%d", i%5)
			_, release := c.Queue().Poll(ctx, func(p schema.Queue_poll_Params) error {
				p.SetMax(1)
				p.SetWaitMs(60_000)
				return p.SetQueue(queue)
			})
			releases = append(releases, release)
		}
		deadline := time.Now().Add(time.Minute)
		for srv.Metrics().Waiters < parkedPolls {
			require.True(b, time.Now().Before(deadline), "only %d polls parked", srv.Metrics().Waiters)
			time.Sleep(10 * time.Millisecond)
		}
		perPoll = float64(heapAndStacks()-before) / parkedPolls
		goroutinesPerPoll = float64(runtime.NumGoroutine()-goroutinesBefore) / parkedPolls
		cancel()
		for _, r := range releases {
			r()
		}
		require.NoError(b, c.Close())
		for srv.Metrics().Waiters > 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	b.ReportMetric(perPoll, "bytes/parked-poll")
	b.ReportMetric(goroutinesPerPoll, "goroutines/parked-poll")
}

// heapAndStacks returns the bytes of Go heap and goroutine stacks in use
// after a GC.
func heapAndStacks() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse + m.StackInuse
}

// benchPollItems is the poll answer of the encode and decode benchmarks:
// 32 items of 256 B.
func benchPollItems() []storage.Item {
	items := make([]storage.Item, 32)
	payload := make([]byte, 256)
	for i := range items {
		items[i] = storage.Item{Queue: "load", Payload: payload, Attempts: 1, MaxAttempts: 5}
		items[i].ID[15] = byte(i)
	}
	return items
}

// BenchmarkEncodeReplies: the server's encoding of its two hot answers,
// an enqueue of 100 items (ids) and a poll of 32 items of 256 B, into a
// reused buffer; ns/item is what the wire costs per item on the node.
func BenchmarkEncodeReplies(b *testing.B) {
	buf := make([]byte, 0, 64<<10)
	newSeg := func(b *testing.B) *capnp.Segment {
		_, seg, err := capnp.NewMessage(capnp.SingleSegment(buf[:0]))
		if err != nil {
			b.Fatal(err)
		}
		return seg
	}
	b.Run("enqueue=100", func(b *testing.B) {
		res := make([]storage.EnqueueResult, 100)
		for i := range res {
			res[i].ID[15] = byte(i)
		}
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			r, err := schema.NewRootQueue_enqueue_Results(newSeg(b))
			if err == nil {
				err = writeEnqueue(r, res)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(res)), "ns/item")
	})
	b.Run("poll=32", func(b *testing.B) {
		items := benchPollItems()
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			r, err := schema.NewRootQueue_poll_Results(newSeg(b))
			if err != nil {
				b.Fatal(err)
			}
			l, err := r.NewItems(int32(len(items)))
			if err == nil {
				err = writeItems(l, items)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(items)), "ns/item")
	})
}

// BenchmarkDecodeEnqueue: the node's reading of an enqueue call of 100
// items of 256 B (enqueueArgs: the items checked and listed for the
// store, the call's lists from enqueueCalls and back); ns/item is what
// the wire costs per item on the node before the store.
func BenchmarkDecodeEnqueue(b *testing.B) {
	_, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	require.NoError(b, err)
	args, err := schema.NewRootQueue_enqueue_Params(seg)
	require.NoError(b, err)
	require.NoError(b, args.SetQueue("load"))
	const n = 100
	l, err := args.NewItems(n)
	require.NoError(b, err)
	payload := make([]byte, 256)
	for i := range n {
		require.NoError(b, l.At(i).SetPayload(payload))
	}
	q := &queueServer{s: &Server{limits: storage.Limits{}.WithDefaults()}}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		seg.Message().ResetReadLimit(1 << 30)
		e, err := q.enqueueArgs(args)
		if err != nil || len(e.items) != n {
			b.Fatal(err)
		}
		e.release()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/item")
}

// BenchmarkDecodePoll: the client's decoding of a poll answer of 32 items
// of 256 B (readItems: every item copied out of the message, the payloads
// into one shared buffer); ns/item is what the wire costs per item in the
// client.
func BenchmarkDecodePoll(b *testing.B) {
	items := benchPollItems()
	_, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	require.NoError(b, err)
	r, err := schema.NewRootQueue_poll_Results(seg)
	require.NoError(b, err)
	l, err := r.NewItems(int32(len(items)))
	require.NoError(b, err)
	require.NoError(b, writeItems(l, items))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		seg.Message().ResetReadLimit(1 << 30)
		got, err := readItems(l)
		if err != nil || len(got) != len(items) {
			b.Fatal(len(got), err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(items)), "ns/item")
}

// BenchmarkRPC_Consume: Consume (4 workers, batches of 32) drains a
// backlog of b.N 256 B items over TCP loopback; items/s is the drain
// rate. Each batch's ack rides the poll for the next one.
func BenchmarkRPC_Consume(b *testing.B) {
	for _, be := range []string{"rocks", "rocks-none"} {
		b.Run("backend="+be, func(b *testing.B) {
			_, addr := benchServer(b, be, EngineLean)
			c := benchDial(b, addr)
			ctx := context.Background()
			items := make([]storage.EnqueueItem, 500)
			for i := range items {
				items[i] = storage.EnqueueItem{Payload: make([]byte, 256)}
			}
			for left := b.N; left > 0; left -= len(items) {
				if _, err := c.Enqueue(ctx, "drain", items[:min(left, len(items))]); err != nil {
					b.Fatal(err)
				}
			}
			var handled atomic.Int64
			cctx, cancel := context.WithCancel(ctx)
			defer cancel()
			clk := clock.New()
			b.ResetTimer()
			start := clk.Now()
			err := c.Consume(cctx, ConsumerConfig{Queue: "drain", Workers: 4, Batch: 32, Lease: time.Minute, Wait: 100 * time.Millisecond,
				Clock: clk, MaxItems: b.N,
				Handler: func(context.Context, storage.Item) error { handled.Add(1); return nil }})
			elapsed := clk.Since(start)
			b.StopTimer()
			require.NoError(b, err)
			require.EqualValues(b, b.N, handled.Load())
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "items/s")
		})
	}
}
