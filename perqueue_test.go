package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// queueSeries counts the /metrics lines that carry a queue label, and
// reports any naming one of the deleted queues.
func queueSeries(page, deletedPrefix string) (n int, dead []string) {
	for _, l := range strings.Split(page, "\n") {
		if strings.HasPrefix(l, "#") || !strings.Contains(l, `queue="`) {
			continue
		}
		n++
		if strings.Contains(l, `queue="`+deletedPrefix) {
			dead = append(dead, l)
		}
	}
	return n, dead
}

// Short-lived per-job queues: a node's /metrics names no queue once it is
// deleted, with the queues both under and over --metrics-max-queues.
func TestPerQueue_MetricsForgetDeletedQueues(t *testing.T) {
	clk := newMock()
	n := startMetricsNode(t, t.TempDir(), clk, "--metrics-max-queues", "5")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := 0; i < 3; i++ {
		_, err := n.c.Enqueue(ctx, fmt.Sprintf("keep-%d", i), []storage.EnqueueItem{{Payload: []byte("x")}})
		require.NoError(t, err)
	}
	base, _ := queueSeries(n.page(), "job-")
	for round := 0; round < 20; round++ {
		// 10 live job queues at once: over the limit, so some are in (other).
		var names []string
		for k := 0; k < 10; k++ {
			q := fmt.Sprintf("job-%d-%d", round, k)
			names = append(names, q)
			_, err := n.c.Enqueue(ctx, q, []storage.EnqueueItem{{Payload: []byte("y")}})
			require.NoError(t, err)
		}
		n.page() // scrape while they exist
		for _, q := range names {
			_, err := n.c.DeleteQueue(ctx, q, true)
			require.NoError(t, err)
		}
	}
	got, dead := queueSeries(n.page(), "job-")
	require.Empty(t, dead, "series of deleted queues")
	require.Equal(t, base, got, "queue-labelled series back to the baseline")
}
