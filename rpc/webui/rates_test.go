package webui

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

func TestRates(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	st := func(enq, ack uint64) []storage.QueueStats {
		return []storage.QueueStats{{Queue: "q", Enqueued: enq, Acked: ack}}
	}

	t.Run("SteadyRateOverTheWindow", func(t *testing.T) {
		t.Parallel()
		r := newRates(time.Minute, 5*time.Second)
		// 10 enqueues and 4 acks per second, sampled every 5 s for 3 min.
		var got rate
		for s := 0; s <= 180; s += 5 {
			got = r.observe(t0.Add(time.Duration(s)*time.Second), st(uint64(10*s), uint64(4*s)), true)[0]
		}
		require.True(t, got.OK)
		require.InDelta(t, 10, got.Enqueue, 1e-9)
		require.InDelta(t, 4, got.Ack, 1e-9)
	})

	t.Run("OnlyTheLastMinuteCounts", func(t *testing.T) {
		t.Parallel()
		r := newRates(time.Minute, 5*time.Second)
		// A burst of 6,000 at the start, then nothing for two minutes.
		r.observe(t0, st(0, 0), true)
		r.observe(t0.Add(time.Second*5), st(6000, 0), true)
		var got rate
		for s := 10; s <= 125; s += 5 {
			got = r.observe(t0.Add(time.Duration(s)*time.Second), st(6000, 0), true)[0]
		}
		require.True(t, got.OK)
		require.Zero(t, got.Enqueue)
	})

	t.Run("RequestsFasterThanSpacingDoNotShortenTheWindow", func(t *testing.T) {
		t.Parallel()
		r := newRates(time.Minute, 5*time.Second)
		r.observe(t0, st(0, 0), true)
		// A page refreshed 10 times a second for 30 s: 1 item per 100 ms.
		var got rate
		for ms := 100; ms <= 30000; ms += 100 {
			got = r.observe(t0.Add(time.Duration(ms)*time.Millisecond), st(uint64(ms/100), 0), true)[0]
		}
		require.True(t, got.OK)
		require.InDelta(t, 10, got.Enqueue, 1e-9, "measured from t0, 30 s back")
	})

	t.Run("NoRateWithoutAnOldEnoughSample", func(t *testing.T) {
		t.Parallel()
		r := newRates(time.Minute, 5*time.Second)
		require.False(t, r.observe(t0, st(5, 0), true)[0].OK)
		require.False(t, r.observe(t0.Add(500*time.Millisecond), st(6, 0), true)[0].OK, "shorter than a second")
		require.True(t, r.observe(t0.Add(2*time.Second), st(7, 0), true)[0].OK)
		require.False(t, r.observe(t0.Add(5*time.Minute), st(9, 0), true)[0].OK, "the last sample is older than the window")
	})

	t.Run("CountersGoingBackGiveNoRate", func(t *testing.T) {
		t.Parallel()
		r := newRates(time.Minute, 5*time.Second)
		r.observe(t0, st(100, 100), true)
		require.False(t, r.observe(t0.Add(10*time.Second), st(3, 1), true)[0].OK)
	})

	t.Run("ClockGoingBackRestarts", func(t *testing.T) {
		t.Parallel()
		r := newRates(time.Minute, 5*time.Second)
		r.observe(t0, st(0, 0), true)
		require.False(t, r.observe(t0.Add(-time.Hour), st(10, 0), true)[0].OK)
		got := r.observe(t0.Add(-time.Hour+10*time.Second), st(20, 0), true)[0]
		require.True(t, got.OK)
		require.InDelta(t, 1, got.Enqueue, 1e-9)
	})

	t.Run("BoundedMemory", func(t *testing.T) {
		t.Parallel()
		r := newRates(time.Minute, time.Millisecond) // asks for 60,002 samples
		require.Equal(t, maxRingSize, r.size)
		many := make([]storage.QueueStats, 500)
		for i := range many {
			many[i].Queue = fmt.Sprintf("q%03d", i)
		}
		for s := range 200 {
			r.observe(t0.Add(time.Duration(s)*time.Second), many, true)
		}
		require.Equal(t, 500, r.tracked())
		// Queues that are gone lose their rings at the next full
		// observation, but not at a partial one.
		r.observe(t0.Add(time.Hour), many[:10], false)
		require.Equal(t, 500, r.tracked())
		r.observe(t0.Add(time.Hour), many[:10], true)
		require.Equal(t, 10, r.tracked())
	})
}
