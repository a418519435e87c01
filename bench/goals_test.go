package bench

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// An in-process row's enqueue is a call, not a round trip over the wire:
// it gets no latency goal against a peer reached over TCP.
func TestGoals_NoWireLatencyGoalForInProcessRows(t *testing.T) {
	t.Parallel()
	rs := []Result{
		inproc(row("latency-max", "leaseq-inproc-always", "leaseq", "durable", 3790, 212)),
		row("latency-max", "redis-always", "redis", "durable", 2250, 413),
	}
	_, goals := compare(rs)
	for _, g := range goals {
		require.NotEqual(t, "leaseq-inproc-always", g.System,
			"in-process enqueue latency judged against a peer over TCP: %+v", g)
	}
}

// A counter that did not move in a round (left out of its notes) counts
// 0 in the rounds' median: a write stall in one round of three is not the
// median.
func TestRounds_MedianCountsAStillCounterAsZero(t *testing.T) {
	t.Parallel()
	r := func(round int, rate, stall float64) Result {
		x := row("produce-b100", "leaseq-inproc-none", "leaseq", "relaxed", rate, 0)
		x.Round = round
		addCounters(&x, map[string]float64{"enqueued": 0, "write_stall_s": 1}, map[string]float64{"enqueued": 1, "write_stall_s": 1 + stall})
		return x
	}
	got := medianRows([]Result{r(1, 100, 0), r(2, 110, 0.5), r(3, 120, 0)})
	require.Len(t, got, 1)
	require.Zero(t, got[0].Extra["write_stall_s"], "median of 0, 0.5, 0 is 0")
}
