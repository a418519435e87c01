package storagetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leaseq/leaseq/storage"
)

// benchPayload is the payload size of every benchmark: a typical small job
// description, as in DESIGN.md's measurements.
const benchPayload = 256

// Bench runs the shared Store benchmarks. Sub-benchmarks are named
// key=value; each reports items/s. Every sub-benchmark gets a fresh store
// from h.New(b) and closes it when done. Numbers on a shared machine are
// noisy: compare with benchstat over several runs.
func Bench(b *testing.B, h Harness) {
	for _, batch := range []int{1, 100} {
		b.Run(fmt.Sprintf("op=enqueue,batch=%d", batch), func(b *testing.B) {
			benchEnqueue(b, h, batch)
		})
	}
	for _, c := range []struct{ batch, workers int }{{1, 1}, {32, 1}} {
		b.Run(fmt.Sprintf("op=cycle,batch=%d,workers=%d", c.batch, c.workers), func(b *testing.B) {
			benchCycle(b, h, c.batch, c.workers, false, 0)
		})
	}
	// Four workers on their own queues, then on one shared queue, where
	// concurrent claims compete for the same head items.
	b.Run("op=cycle,batch=32,workers=4,queues=4", func(b *testing.B) {
		benchCycle(b, h, 32, 4, false, 0)
	})
	b.Run("op=cycle,batch=32,workers=4,queues=1", func(b *testing.B) {
		benchCycle(b, h, 32, 4, true, 0)
	})
	// Poll cost must stay flat with a deep backlog (DESIGN.md: the LSM
	// tombstone trap, and the reference model's O(log n) claim).
	b.Run("op=cycle,batch=32,workers=1,backlog=20000", func(b *testing.B) {
		benchCycle(b, h, 32, 1, false, 20000)
	})
	b.Run("op=expire,batch=32", func(b *testing.B) {
		benchExpire(b, h, 32)
	})
}

// benchClock hands out strictly increasing instants; the benchmarks never
// read a real clock for the store.
type benchClock struct{ n atomic.Int64 }

func (c *benchClock) now() time.Time { return base.Add(time.Duration(c.n.Add(1)) * time.Microsecond) }

// newBenchStore makes a store for one benchmark and closes it at the end.
func newBenchStore(b *testing.B, h Harness) storage.Store {
	b.Helper()
	s := h.New(b)
	b.Cleanup(func() {
		if err := s.Close(); err != nil {
			b.Errorf("close: %v", err)
		}
	})
	return s
}

func benchItems(n int) []storage.EnqueueItem {
	items := make([]storage.EnqueueItem, n)
	p := make([]byte, benchPayload)
	for i := range p {
		p[i] = byte('a' + i%26)
	}
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: p}
	}
	return items
}

func reportItems(b *testing.B, items int, elapsed time.Duration) {
	if elapsed > 0 {
		b.ReportMetric(float64(items)/elapsed.Seconds(), "items/s")
	}
}

func benchEnqueue(b *testing.B, h Harness, batch int) {
	s := newBenchStore(b, h)
	ctx := context.Background()
	items := benchItems(batch)
	var clk benchClock
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "bench", Items: items, Now: clk.now()}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportItems(b, b.N*batch, b.Elapsed())
}

// benchCycle measures enqueue + poll + ack of batch items per iteration,
// split over workers goroutines, each on its own queue unless shared. A
// backlog of ready items sits behind the cycled ones (priority 1 against
// 0) so the cycle never drains it. items/s counts acked items.
func benchCycle(b *testing.B, h Harness, batch, workers int, shared bool, backlog int) {
	s := newBenchStore(b, h)
	ctx := context.Background()
	items := benchItems(batch)
	var clk benchClock
	queue := func(w int) string {
		if shared {
			return "bench"
		}
		return fmt.Sprintf("bench-%d", w)
	}
	for w := 0; w < workers && backlog > 0; w++ {
		fill := benchItems(min(backlog, 1000))
		for i := range fill {
			fill[i].Priority = 1
		}
		for n := 0; n < backlog; n += len(fill) {
			if _, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: queue(w), Items: fill[:min(len(fill), backlog-n)], Now: clk.now()}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	var wg sync.WaitGroup
	var acked atomic.Int64
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		n := b.N / workers
		if w < b.N%workers {
			n++
		}
		wg.Add(1)
		go func(q string, n int) {
			defer wg.Done()
			errs <- cycle(ctx, s, &clk, q, items, n, shared, &acked)
		}(queue(w), n)
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	reportItems(b, int(acked.Load()), b.Elapsed())
}

// cycle runs n enqueue-poll-ack rounds. On a shared queue a poll may get
// fewer items (or others' items) than it enqueued; it acks what it got.
func cycle(ctx context.Context, s storage.Store, clk *benchClock, q string, items []storage.EnqueueItem, n int, shared bool, acked *atomic.Int64) error {
	for i := 0; i < n; i++ {
		if _, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: items, Now: clk.now()}); err != nil {
			return err
		}
		p, err := s.Poll(ctx, storage.PollParams{Queue: q, Max: len(items), Lease: time.Minute, Now: clk.now()})
		if err != nil {
			return err
		}
		if len(p.Items) != len(items) && !shared {
			return fmt.Errorf("poll got %d items, want %d", len(p.Items), len(items))
		}
		if len(p.Items) == 0 {
			continue
		}
		codes, err := s.Ack(ctx, storage.AckParams{Queue: q, Lease: p.Lease, IDs: ids(p.Items), Now: clk.now()})
		if err != nil {
			return err
		}
		for _, c := range codes {
			if c != storage.CodeOK {
				return fmt.Errorf("ack: %v", c)
			}
		}
		acked.Add(int64(len(codes)))
	}
	return nil
}

// benchExpire measures the lease-expiry path: per iteration, batch items
// are enqueued and polled outside the timer, then one timed Sweep expires
// their lease and requeues them, and they are drained outside the timer.
func benchExpire(b *testing.B, h Harness, batch int) {
	s := newBenchStore(b, h)
	ctx := context.Background()
	items := benchItems(batch)
	var clk benchClock
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if _, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "bench", Items: items, Now: clk.now()}); err != nil {
			b.Fatal(err)
		}
		if _, err := s.Poll(ctx, storage.PollParams{Queue: "bench", Max: batch, Lease: 100 * time.Millisecond, Now: clk.now()}); err != nil {
			b.Fatal(err)
		}
		clk.n.Add(int64(time.Second / time.Microsecond))
		now := clk.now()
		b.StartTimer()
		res, err := s.Sweep(ctx, storage.SweepParams{Now: now, Limit: 1000})
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		if res.Requeued != batch {
			b.Fatalf("sweep requeued %d, want %d", res.Requeued, batch)
		}
		p, err := s.Poll(ctx, storage.PollParams{Queue: "bench", Max: batch, Lease: time.Minute, Now: clk.now()})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.Ack(ctx, storage.AckParams{Queue: "bench", Lease: p.Lease, IDs: ids(p.Items), Now: clk.now()}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	reportItems(b, b.N*batch, b.Elapsed())
}
