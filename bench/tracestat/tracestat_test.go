package tracestat

import (
	"bytes"
	"context"
	"fmt"
	"runtime/trace"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// A trace of a real store under concurrent durable calls: every call is
// in one batch region, every fsync the store counted is a region, and the
// shares add up.
func TestRead_RocksStoreUnderLoad(t *testing.T) {
	// Claims ahead off: every poll below is then a call of its own
	// (with them an ack adds an op and a poll may need none).
	s, err := rocksstore.Open(t.TempDir(), rocksstore.Options{Sync: rocksstore.SyncAlways, PrefetchHold: -1})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	ctx := context.Background()
	now := time.Unix(1_000_000, 0)
	const workers, cycles, batch = 4, 40, 8

	before := s.Metrics()
	var buf bytes.Buffer
	require.NoError(t, trace.Start(&buf))
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			items := make([]storage.EnqueueItem, batch)
			for i := range items {
				items[i].Payload = fmt.Appendf(nil, "w%d-%d", w, i)
			}
			for range cycles {
				// Each worker enqueues before it polls, so every poll
				// finds a full batch.
				if _, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: items, Now: now}); err != nil {
					errs <- err
					return
				}
				pr, err := s.Poll(ctx, storage.PollParams{Queue: "q", Max: batch, Lease: time.Minute, Now: now})
				if err != nil {
					errs <- err
					return
				}
				ids := make([]storage.ItemID, len(pr.Items))
				for i, it := range pr.Items {
					ids[i] = it.ID
				}
				if _, err := s.Ack(ctx, storage.AckParams{Queue: "q", Lease: pr.Lease, IDs: ids, Now: now}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	trace.Stop()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	m := s.Metrics().Sub(before)

	sum, err := Read(&buf)
	require.NoError(t, err)
	require.Equal(t, int(m.WALSyncs), sum.Fsyncs, "one region per fsync the store counted")
	require.Equal(t, workers*cycles*3, sum.Calls, "every call in one batch")
	require.Equal(t, int(m.Ops), sum.Calls, "every batch wrote")
	require.GreaterOrEqual(t, sum.Batches, int(m.Commits))
	require.Positive(t, sum.FsyncTime)
	require.Positive(t, sum.BatchTime)
	require.LessOrEqual(t, sum.FsyncTime, sum.Span)
	require.LessOrEqual(t, sum.BatchTime, sum.Span)
	require.LessOrEqual(t, sum.Overlap, min(sum.BatchTime, sum.FsyncTime))
	require.LessOrEqual(t, len(sum.Gaps), sum.Fsyncs-1)
	require.True(t, isSorted(sum.Gaps) && isSorted(sum.Waits))
	require.NotEmpty(t, sum.Waits, "callers parked for their fsyncs and were woken")

	var out strings.Builder
	require.NoError(t, sum.Write(&out))
	require.Contains(t, out.String(), fmt.Sprintf("WAL fsyncs      %d,", sum.Fsyncs))
	require.Contains(t, out.String(), fmt.Sprintf("%.1f calls each", float64(sum.Calls)/float64(sum.Batches)))
}

func isSorted(d []time.Duration) bool {
	for i := 1; i < len(d); i++ {
		if d[i] < d[i-1] {
			return false
		}
	}
	return true
}

func TestRead_NotATrace(t *testing.T) {
	_, err := Read(strings.NewReader("not a trace"))
	require.ErrorContains(t, err, "tracestat")
}

func TestOverlapAndGaps(t *testing.T) {
	// Batches 0-10, 20-30, 40-50; fsyncs 5-25, 45-60.
	batches := []span{{0, 10}, {20, 30}, {40, 50}}
	fsyncs := []span{{5, 25}, {45, 60}}
	require.Equal(t, time.Duration(5+5+5), overlap(batches, fsyncs))
	require.Equal(t, time.Duration(5+5+5), overlap(fsyncs, batches), "overlap is symmetric")
	require.Equal(t, []time.Duration{20}, gaps(fsyncs))
	require.Zero(t, overlap(batches, nil))
	require.Empty(t, gaps(fsyncs[:1]))
	require.Equal(t, time.Duration(10+10+10), total(batches))
}

func TestQuantile(t *testing.T) {
	d := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	require.Equal(t, time.Duration(1), Quantile(d, 0))
	require.Equal(t, time.Duration(5), Quantile(d, 0.5))
	require.Equal(t, time.Duration(9), Quantile(d, 0.9))
	require.Equal(t, time.Duration(10), Quantile(d, 1))
	require.Zero(t, Quantile(nil, 0.5))
}
