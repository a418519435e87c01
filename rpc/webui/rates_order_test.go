package webui

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// TestRates_StaleReadingKeepsTheWindow: the sampler and every queue-list
// request read the clock, then Stats (slow on a big node), then observe;
// two finishing out of order must not look like the clock going back and
// throw the minute's window away.
func TestRates_StaleReadingKeepsTheWindow(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	st := func(enq uint64) []storage.QueueStats { return []storage.QueueStats{{Queue: "q", Enqueued: enq}} }
	r := newRates(time.Minute, 5*time.Second)
	for s := 0; s <= 60; s += 5 {
		enq := uint64(0)
		if s >= 35 {
			enq = 600 // a burst between 30 s and 35 s
		}
		r.observe(t0.Add(time.Duration(s)*time.Second), st(enq), true)
	}
	r.observe(t0.Add(65*time.Second), st(600), true) // the sampler
	r.observe(t0.Add(64*time.Second), st(600), true) // a page whose Stats began 1 s earlier
	got := r.observe(t0.Add(66*time.Second), st(600), true)[0]
	require.True(t, got.OK)
	// Oldest sample within the minute is t0+10s: 600 items in 56 s.
	require.InDelta(t, 600.0/56, got.Enqueue, 0.01, "the burst 31-36 s ago is inside the one-minute window")
}
