package rocksstore

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// endsAfter is a context whose Err is nil for its first n calls and
// Canceled after: it ends between the steps of a sweep.
type endsAfter struct {
	context.Context
	n atomic.Int64
}

func (c *endsAfter) Err() error {
	if c.n.Add(-1) < 0 {
		return context.Canceled
	}
	return nil
}

// TestRocksStore_SweepEndedMidwayReportsWhatItDid: a sweep commits its
// pass a step (sweepChunk entries) at a time; one whose context ends after
// its first step returned an empty result with its error, so the queue
// whose items that step made ready was never woken though the items were
// ready (found by review). It returns what the steps did.
func TestRocksStore_SweepEndedMidwayReportsWhatItDid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 2 * sweepChunk {
		b.enqueueN("q", at(0), 1)
		b.poll("q", 1, time.Second, at(0)) // a lease each
	}
	ctx := &endsAfter{Context: context.Background()}
	ctx.n.Store(1) // the first step's check passes
	res, err := b.s.Sweep(ctx, storage.SweepParams{Now: at(time.Minute)})
	require.ErrorIs(t, err, context.Canceled)
	require.EqualValues(t, sweepChunk, res.LeasesExpired, "the first step expired a chunk of leases")
	require.EqualValues(t, sweepChunk, res.Requeued)
	require.Equal(t, []string{"q"}, res.ReadyQueues)
	require.False(t, res.More)
	st := b.stats("q", at(time.Minute))
	require.EqualValues(t, sweepChunk, st.Ready)
	require.EqualValues(t, sweepChunk, st.Inflight)
}
