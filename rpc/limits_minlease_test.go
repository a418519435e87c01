package rpc

import (
	"context"
	"testing"
	"time"

	"github.com/leaseq/leaseq/storage"
)

// TestLimits_ConsumerDefaultLeaseUnderNodeMinLease: Consume with Lease
// 0 (and leaseq work without --lease: NodeInfo.LeaseWithin) leases within
// the node's --min-lease too. Found by review (session 70): the default
// 30 s was lowered to --max-lease but not raised to --min-lease, and on a
// node with --min-lease 1m every poll was refused.
func TestLimits_ConsumerDefaultLeaseUnderNodeMinLease(t *testing.T) {
	lim := storage.Limits{MinLease: time.Minute, MaxLease: 10 * time.Minute}
	b := setup(t, bundleOpts{factory: rocksWithLimits(lim), mutate: func(c *ServerConfig) { c.Limits = lim }})
	c := b.dial()
	ctx := ctxT(t)
	_, err := c.Enqueue(ctx, "q", payloads(1, 8))
	if err != nil {
		t.Fatal(err)
	}
	handled := make(chan struct{})
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(cctx, ConsumerConfig{Queue: "q", Clock: b.clock, Handler: func(context.Context, storage.Item) error {
			close(handled)
			return nil
		}})
	}()
	select {
	case <-handled:
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	case err := <-done:
		t.Fatalf("Consume with the default lease on a node with --min-lease 1m: %v", err)
	case <-ctx.Done():
		t.Fatal("Consume neither handled the item nor returned")
	}
}
