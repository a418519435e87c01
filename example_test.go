package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// clientExample is the Go client example of README.md ("Go client"):
// the lines between the README markers appear there verbatim, which
// TestREADME_GoClientExample checks, so the README's code compiles and
// runs. logf stands in for log.Printf.
func clientExample(ctx context.Context, addr string, logf func(format string, args ...any)) error {
	// README:begin
	c, err := rpc.Dial(ctx, addr, rpc.ClientOptions{})
	if err != nil {
		return err
	}
	defer c.Close()

	// Enqueue a batch; each item gets its own result.
	res, err := c.Enqueue(ctx, "jobs", []storage.EnqueueItem{
		{Payload: []byte("resize photo 1")},
		{Payload: []byte("resize photo 2"), Delay: time.Second, DedupKey: "photo-2"},
	})
	if err != nil {
		return err
	}
	for _, r := range res {
		logf("enqueued %s duplicate=%v", r.ID, r.Duplicate)
	}

	// Consume until ctx is cancelled: a nil error acks the item, an error
	// or a panic nacks it (retried with backoff, dead-lettered after max
	// attempts), and the lease is extended while the handler runs.
	return c.Consume(ctx, rpc.ConsumerConfig{
		Queue:   "jobs",
		Workers: 4,
		Batch:   16,
		Lease:   30 * time.Second,
		Clock:   clock.New(),
		Handler: func(ctx context.Context, it storage.Item) error {
			logf("working on %s (attempt %d): %s", it.ID, it.Attempts, it.Payload)
			return nil
		},
	})
	// README:end
}

// TestREADME_GoClientExample runs the README's Go client code against a
// real node, and checks that README.md shows exactly that code.
func TestREADME_GoClientExample(t *testing.T) {
	t.Parallel()
	n := startNode(t, filepath.Join(t.TempDir(), "data"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	worked := make(chan string, 10)
	errc := make(chan error, 1)
	go func() {
		errc <- clientExample(ctx, n.addr, func(format string, args ...any) {
			line := fmt.Sprintf(format, args...)
			t.Log(line)
			if strings.HasPrefix(line, "working on") {
				worked <- line
			}
		})
	}()
	for range 2 {
		select {
		case l := <-worked:
			require.Contains(t, l, "resize photo")
		case <-time.After(time.Minute):
			t.Fatal("the consumer never handled both items")
		}
	}
	// Acks are sent after the handler returns: wait for both.
	rpctest.Eventually(t, time.Minute, func() bool { return n.stats("jobs").Acked == 2 }, "items not acked")
	cancel()
	require.NoError(t, <-errc, "Consume drains and returns nil on cancel")
	require.Equal(t, queueStats{Enqueued: 2, Delivered: 2, Acked: 2}, n.stats("jobs"))

	src, err := os.ReadFile("example_test.go")
	require.NoError(t, err)
	readme, err := os.ReadFile("README.md")
	require.NoError(t, err)
	_, body, ok := strings.Cut(string(src), "// README:"+"begin\n")
	require.True(t, ok)
	body, _, ok = strings.Cut(body, "\t// README:"+"end")
	require.True(t, ok)
	var missing []string
	for _, line := range strings.Split(body, "\n") {
		line = strings.TrimSpace(line)
		if line != "" && !strings.Contains(string(readme), line) {
			missing = append(missing, line)
		}
	}
	require.Empty(t, missing, "README.md's Go client example is out of date with example_test.go")
}
