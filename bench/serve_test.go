package bench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/bench/leaseqt"
	"github.com/leaseq/leaseq/bench/target"
)

// TestRun_LeaseqServeOverRPC drives real `leaseq serve` processes (built
// from this module by go build, once) through the steady, backlog and
// lease-storm workloads. Rows that need the sweeper and the long-poll
// dispatcher of the real server are the point: the storm only completes if
// the server expires the hung consumers' leases and wakes the waiters.
func TestRun_LeaseqServeOverRPC(t *testing.T) {
	t.Parallel()
	c := tinyConfig(t)
	c.Workloads = []string{WorkloadRoundTrip, WorkloadE2E, WorkloadDrain, WorkloadStorm}
	c.AckPoll = true // the steady rows' consumers ack with their next poll (Client.AckPoll)
	bin := &leaseqt.Binary{}
	t.Cleanup(func() { require.NoError(t, bin.Close()) })
	sys := []target.System{leaseqt.RPC{Sync: "always", Bin: bin}, leaseqt.RPC{Sync: "none", Bin: bin}}
	rep, err := Run(context.Background(), c, sys)
	require.NoError(t, err)
	require.Empty(t, rep.Skipped)
	require.Len(t, rep.Results, 4*len(sys))
	for _, r := range rep.Results {
		require.Empty(t, r.Err, "%s/%s", r.Row, r.System)
		require.Positive(t, r.Items, "%s/%s", r.Row, r.System)
		require.False(t, r.InProcess, "CPU and RSS are the server process's")
		require.Positive(t, r.PeakRSS, "%s/%s", r.Row, r.System)
		require.InDelta(t, r.ClientCPUSeconds*1e6/float64(r.Items), r.ClientCPUPerItem, 1e-6, "%s/%s", r.Row, r.System)
		if r.Row == "roundtrip" {
			// nodeInfo calls, one at a time: timed, and not one of them
			// reached the store.
			require.Positive(t, r.Extra["rtt_p50_us"], "%s", r.System)
			require.LessOrEqual(t, r.Extra["rtt_p50_us"], r.Extra["rtt_p99_us"], "%s", r.System)
			require.NotContains(t, r.Extra, "commits", "%s: a nodeInfo call commits nothing", r.System)
			require.Nil(t, r.E2E)
			continue
		}
		if r.Row == "e2e" {
			// /proc counts CPU in 10 ms ticks: the short drain and
			// storm rows may not reach one.
			require.Positive(t, r.ClientCPUSeconds, "%s/%s: the harness drove the client", r.Row, r.System)
		}
		require.NotNil(t, r.E2E)
		require.Positive(t, r.Extra["commits"], "%s/%s: the node's commits, from its /metrics", r.Row, r.System)
		if r.System == "leaseq-rpc-always" {
			require.Positive(t, r.Extra["wal_fsyncs"], "%s: and its fsyncs", r.Row)
			require.InDelta(t, float64(r.Items)/r.Extra["wal_fsyncs"], r.Extra["items_per_fsync"], 1e-6, "%s: items per fsync, derived", r.Row)
		} else {
			require.NotContains(t, r.Extra, "wal_fsyncs", "%s: --sync=none fsyncs nothing", r.Row)
			require.NotContains(t, r.Extra, "items_per_fsync", "%s", r.Row)
		}
	}
	storm := rep.Results[6]
	require.Equal(t, "storm", storm.Row)
	require.EqualValues(t, c.StormItems, storm.Items)
	require.Less(t, storm.Extra["after_last_expiry_s"], (30 * time.Second).Seconds())
}

// With -trace, a row on a real node also traces the node and notes what
// the trace says of its commit pipeline; the trace stays beside -trace's.
func TestRun_LeaseqServeTracesTheNode(t *testing.T) {
	t.Parallel()
	c := tinyConfig(t)
	c.Workloads = []string{WorkloadE2E}
	c.Trace = filepath.Join(t.TempDir(), "run.trace")
	bin := &leaseqt.Binary{}
	t.Cleanup(func() { require.NoError(t, bin.Close()) })
	rep, err := Run(context.Background(), c, []target.System{leaseqt.RPC{Sync: "always", Bin: bin}})
	require.NoError(t, err)
	require.Len(t, rep.Results, 1)
	r := rep.Results[0]
	require.Empty(t, r.Err)
	for _, k := range []string{"node_fsync_busy", "node_batch_busy"} {
		require.Positive(t, r.Extra[k], k)
		require.LessOrEqual(t, r.Extra[k], 1.0, k)
	}
	require.GreaterOrEqual(t, r.Extra["node_calls_per_batch"], 1.0)
	require.Positive(t, r.Extra["node_wait_p50_us"])
	require.LessOrEqual(t, r.Extra["node_wait_p50_us"], r.Extra["node_wait_p99_us"])
	b, err := os.ReadFile(c.Trace + ".e2e.leaseq-rpc-always")
	require.NoError(t, err)
	require.True(t, bytes.HasPrefix(b, []byte("go 1.")), "the node's execution trace")
}

// TestRun_LeaseqServeOverHTTP drives real `leaseq serve --http` processes
// through their HTTP API: produce, steady and lease-storm rows. The storm
// completes only if the sweeper's wake-ups reach polls parked over HTTP.
func TestRun_LeaseqServeOverHTTP(t *testing.T) {
	t.Parallel()
	c := tinyConfig(t)
	c.Workloads = []string{WorkloadProduce, WorkloadE2E, WorkloadStorm}
	c.Systems = []string{"leaseq-http"}
	// A second, not tinyConfig's 300 ms: under `make test`'s parallel
	// packages a durable node's first HTTP calls took longer than that
	// once (e2e leaseq-http-always completed nothing in its window).
	c.Duration = time.Second
	bin := &leaseqt.Binary{}
	t.Cleanup(func() { require.NoError(t, bin.Close()) })
	rep, err := Run(context.Background(), c, leaseqSystems(bin))
	require.NoError(t, err)
	require.Empty(t, rep.Skipped)
	require.Equal(t, []string{"leaseq-http-always", "leaseq-http-none"}, rep.Config.Systems, "-systems leaseq-http names both")
	require.Len(t, rep.Results, 4*2) // produce-b1, produce-b100, e2e, storm
	for _, r := range rep.Results {
		require.Empty(t, r.Err, "%s/%s", r.Row, r.System)
		require.Empty(t, r.Incomplete, "%s/%s", r.Row, r.System)
		require.Positive(t, r.Items, "%s/%s", r.Row, r.System)
		require.False(t, r.InProcess, "CPU and RSS are the server process's")
		require.Equal(t, "leaseq", r.Family)
		if r.Row == "storm" {
			require.EqualValues(t, c.StormItems, r.Items)
		}
	}
	// Not in a default run.
	for _, s := range selectSystems(leaseqSystems(bin), nil) {
		require.NotContains(t, s.Name(), "leaseq-http")
	}
}
