package rpc

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// TestClient_ConcurrentCallsGetTheirOwnAnswers (written by review,
// session 73; it found nothing wrong): many goroutines on one lean
// Client, each with its own queue and payloads, some answers large (near
// the node's message limit): each caller gets its own answer (ids and
// payloads match what it enqueued), nothing mixes.
func TestClient_ConcurrentCallsGetTheirOwnAnswers(t *testing.T) {
	b := setup(t, bundleOpts{})
	c := b.dial()
	require.NotNil(t, c.lean)
	info, err := c.NodeInfo(ctxT(t))
	require.NoError(t, err)
	const workers = 16
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := ctxT(t)
			queue := fmt.Sprintf("q%d", w)
			size := 64
			if w%4 == 0 {
				size = info.MaxPayload // large answers
			}
			for round := 0; round < 4; round++ {
				items := make([]storage.EnqueueItem, 2)
				for i := range items {
					p := make([]byte, size)
					for j := range p {
						p[j] = byte(w*31 + round*7 + i + j)
					}
					items[i].Payload = p
				}
				res, err := c.Enqueue(ctx, queue, items)
				if err != nil {
					errs <- err
					return
				}
				pr, err := c.Poll(ctx, queue, 2, time.Hour, 0)
				if err != nil {
					errs <- err
					return
				}
				if len(pr.Items) != 2 {
					errs <- fmt.Errorf("worker %d: %d items", w, len(pr.Items))
					return
				}
				for i, it := range pr.Items {
					if it.ID != res[i].ID || it.Queue != queue || string(it.Payload) != string(items[i].Payload) {
						errs <- fmt.Errorf("worker %d round %d: item %d is not its own (queue %q)", w, round, i, it.Queue)
						return
					}
				}
				codes, err := c.Ack(ctx, queue, pr.Lease, itemIDs(pr.Items))
				if err != nil {
					errs <- err
					return
				}
				for _, code := range codes {
					if code != storage.CodeOK {
						errs <- fmt.Errorf("worker %d: ack %v", w, code)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}
