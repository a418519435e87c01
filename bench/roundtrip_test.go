package bench

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/bench/leaseqt"
	"github.com/leaseq/leaseq/bench/target"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// startLoopback starts a leaseq RPC server in this process, over a real
// socket, for runRoundTrip to call.
func startLoopback(t *testing.T) target.Instance {
	t.Helper()
	in, err := leaseqt.Loopback{Sync: rocksstore.SyncNone}.Start(context.Background(),
		target.StartOptions{Dir: t.TempDir(), Queues: []string{"bench"}, Lease: time.Second, Clock: clock.New()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, in.Close()) })
	return in
}

func TestRunRoundTrip_TimesNodeInfoCalls(t *testing.T) {
	t.Parallel()
	in := startLoopback(t)
	e := &env{clk: clock.New(), drain: make(chan struct{})}
	out, err := runRoundTrip(context.Background(), e, in, 200*time.Millisecond)
	require.NoError(t, err)
	require.False(t, out.interrupted)
	require.Positive(t, out.calls)
	require.EqualValues(t, out.calls, out.lat.TotalCount(), "every call timed")
	require.GreaterOrEqual(t, out.window, 200*time.Millisecond)
}

// A drain request ends the window at once, however long it was planned,
// and the row says it was cut short.
func TestRunRoundTrip_DrainEndsTheWindow(t *testing.T) {
	t.Parallel()
	in := startLoopback(t)
	drain := make(chan struct{})
	close(drain)
	e := &env{clk: clock.New(), drain: drain}
	out, err := runRoundTrip(context.Background(), e, in, time.Hour)
	require.NoError(t, err)
	require.True(t, out.interrupted)
	require.Less(t, out.window, time.Minute)
}
