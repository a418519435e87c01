package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Found by review (session 72): extend without --lease asked for a fixed
// 30 s. README "--min-lease, --max-lease": a queue gets the default 30 s lease
// brought into the node's range, so `leaseq poll q` works on a node with
// --max-lease 10s. `leaseq extend q LEASE` without --lease must work
// there too (the queue's lease, as poll and the store's Extend with 0 do),
// and must not shorten a lease of a queue configured with a longer one.
func TestCLI_ExtendDefaultLeaseFollowsQueue(t *testing.T) {
	t.Parallel()
	n := startNode(t, t.TempDir(), "--max-lease", "10s")
	n.cli("enqueue", "q", "x")
	items := parsePolled(t, n.cli("poll", "q"))
	require.Len(t, items, 1)
	r := n.cliCode("extend", "q", items[0].Lease)
	require.Equal(t, 0, r.code, "extend without --lease on a node with --max-lease 10s: %q", r.stderr)
}

func TestCLI_ExtendDefaultDoesNotShortenQueueLease(t *testing.T) {
	t.Parallel()
	n := startNode(t, t.TempDir())
	n.cli("config", "q", "--lease", "10m")
	n.cli("enqueue", "q", "x")
	items := parsePolled(t, n.cli("poll", "q"))
	require.Len(t, items, 1)
	polledExp, err := time.Parse(time.RFC3339Nano, items[0].ExpiresAt)
	require.NoError(t, err)
	r := n.cli("extend", "q", items[0].Lease)
	exp, err := time.Parse(time.RFC3339Nano, r.lines()[0])
	require.NoError(t, err)
	require.False(t, exp.Before(polledExp), "extend without --lease shortened the queue's 10m lease to %v (poll gave %v)", exp, polledExp)
}

// A queue whose lease is over the --max-lease of the node now serving it
// (the node was restarted with a narrower range): extend without --lease
// gives the longest lease the node allows rather than being refused (the
// node reads the queue's lease into its range).
func TestCLI_ExtendDefaultWithinTheNodesRange(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	n := startNode(t, data)
	n.cli("config", "q", "--lease", "50m")
	n.cli("enqueue", "q", "x")
	require.Zero(t, n.stop())
	n = startNode(t, data, "--max-lease", "10m")
	items := parsePolled(t, n.cli("poll", "q", "--lease", "1m"))
	require.Len(t, items, 1)
	r := n.cli("extend", "q", items[0].Lease)
	exp, err := time.Parse(time.RFC3339Nano, r.lines()[0])
	require.NoError(t, err)
	left := time.Until(exp)
	require.True(t, left > 9*time.Minute && left <= 10*time.Minute, "extend without --lease on a node with --max-lease 10m: %v left", left)
}
