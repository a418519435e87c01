package rocksstore

import (
	"bytes"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// Writes that outrun the flushes stall inside RocksDB (writes stopped
// while a family's memtables all wait for their flush); Metrics reports
// the time commits spent stalled. Flushes are paused here so that the
// memtables fill up and writes stop for certain.
func TestRocksStore_WriteStallMetric(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *Options) { o.memtable = 64 << 10 })
	require.Zero(t, b.s.Metrics().WriteStall, "nothing has stalled yet")

	b.s.db.pauseBackground(true)
	done := make(chan error, 1)
	go func() {
		items := make([]storage.EnqueueItem, 16)
		for i := range items {
			items[i] = storage.EnqueueItem{Payload: bytes.Repeat([]byte{byte('a' + i)}, 1024)}
		}
		for range 64 { // 1 MiB: far more than three 64 KiB memtables
			if _, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: items}); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()

	clk := clock.New()
	deadline := clk.Now().Add(30 * time.Second)
	for {
		v, ok := b.s.db.property(b.s.fams.def, "rocksdb.is-write-stopped")
		require.True(t, ok)
		if v == "1" {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the enqueues finished (%v) without writes being stopped", err)
		default:
		}
		require.True(t, clk.Now().Before(deadline), "writes never stopped with flushes paused")
		clk.Sleep(time.Millisecond)
	}
	clk.Sleep(20 * time.Millisecond) // stalled for at least this long
	b.s.db.pauseBackground(false)
	require.NoError(t, <-done, "the enqueues complete once flushes run again")

	m := b.s.Metrics()
	require.GreaterOrEqual(t, m.WriteStall, 20*time.Millisecond)
	require.Less(t, m.WriteStall, 30*time.Second)
	require.Equal(t, int64(64*16), b.stats("q", at(0)).Ready, "nothing lost to the stall")
}
