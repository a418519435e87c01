package bench

import (
	"context"
	"math/rand"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/bench/leaseqt"
	"github.com/leaseq/leaseq/bench/target"
)

// stallAfter wraps an instance so that, after `pass` enqueues in all,
// every enqueue blocks until its context ends: a system that stalls for
// the rest of the window.
type stallAfter struct {
	target.Instance
	pass int64
	n    *atomic.Int64
}

func (s stallAfter) Connect(ctx context.Context) (target.Client, error) {
	c, err := s.Instance.Connect(ctx)
	return stallClient{Client: c, s: s}, err
}

type stallClient struct {
	target.Client
	s stallAfter
}

func (c stallClient) Enqueue(ctx context.Context, q string, ps [][]byte) error {
	if c.s.n.Add(1) > c.s.pass {
		<-ctx.Done()
		return ctx.Err()
	}
	return c.Client.Enqueue(ctx, q, ps)
}

// TestFlow_RateRowChargesAStallAtTheWindowEnd (found by review, session
// 71): at a fixed offered
// rate, a system that stops answering for the last ~80 % of the window
// delayed ~300 scheduled sends by up to ~300 ms. The package doc says a
// stalled system is charged for the requests it delayed; but the call
// stuck at the deadline is cancelled and not recorded, and the sends
// scheduled behind it are never made nor recorded, so the enqueue
// latency shows only the fast calls before the stall.
func TestFlow_RateRowChargesAStallAtTheWindowEnd(t *testing.T) {
	t.Parallel()
	clk := clock.New()
	inst, err := leaseqt.InProcess{Backend: leaseqt.BackendMem}.Start(context.Background(),
		target.StartOptions{Dir: t.TempDir(), Queues: []string{"bench"}, Lease: defaultLease, Clock: clk})
	require.NoError(t, err)
	defer func() { require.NoError(t, inst.Close()) }()
	in := stallAfter{Instance: inst, pass: 50, n: new(atomic.Int64)}
	e := &env{clk: clk, base: clk.Now(), label: "stall", seed: 1, payload: 32}
	pick := func(*rand.Rand) string { return "bench" }
	s := flowSpec{row: "latency-rate", producers: 1, consumers: 1, enqBatch: 1, pollMax: 8, rate: 1000,
		duration: 400 * time.Millisecond, pickQueue: pick, pollQueue: pick, pollWait: 50 * time.Millisecond}
	out, err := runFlow(context.Background(), e, in, s)
	require.NoError(t, err)
	l := summarize(out.enq)
	require.NotNil(t, l)
	t.Logf("enqueue latency: count %d p50 %.0fµs p99 %.0fµs max %.0fµs", l.Count, l.P50, l.P99, l.Max)
	// ~400 sends were scheduled; ~350 of them fell behind the stall.
	require.GreaterOrEqual(t, l.Max, float64(200*time.Millisecond/time.Microsecond),
		"the stall at the end of the window is not charged to any request")
	require.GreaterOrEqual(t, l.Count, int64(300), "the sends the stall delayed are not counted")
}
