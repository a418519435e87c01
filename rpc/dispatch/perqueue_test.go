package dispatch

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

func reviewQueues(d *Dispatcher) (int, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.mu.queues), d.mu.waiters
}

// Polls parked on many short-lived queues, each ended a different way (the
// wait runs out on the clock, the caller cancels, an enqueue wakes it, a
// taker completes or resumes it, Close): the dispatcher keeps no state of
// a queue once its polls are done.
func TestPerQueue_DispatcherQueueChurn(t *testing.T) {
	t.Parallel()
	st, err := rocksstore.Open(t.TempDir(), rocksstore.Options{})
	require.NoError(t, err)
	defer st.Close()
	mock := clock.NewMock()
	mock.Set(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	d, err := New(Config{Store: st, Clock: mock})
	require.NoError(t, err)
	ctx := context.Background()
	const n = 1000
	type pending struct {
		q      string
		cancel context.CancelFunc
		done   chan struct{}
	}
	var ps []pending
	for i := 0; i < n; i++ {
		q := fmt.Sprintf("job-%05d", i)
		_, err := st.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{{Payload: []byte("x")}}, Now: mock.Now()})
		require.NoError(t, err)
		r, err := st.Poll(ctx, storage.PollParams{Queue: q, Max: 1, Lease: time.Minute, Now: mock.Now()})
		require.NoError(t, err)
		_, err = st.Ack(ctx, storage.AckParams{Queue: q, Lease: r.Lease, IDs: []storage.ItemID{r.Items[0].ID}, Now: mock.Now()})
		require.NoError(t, err)
		pctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		d.PollAsync(pctx, storage.PollParams{Queue: q, Max: 1, Lease: time.Minute}, 30*time.Second, func(storage.PollResult, error) { close(done) })
		ps = append(ps, pending{q, cancel, done})
	}
	eventually(t, func() bool { _, w := reviewQueues(d); return w == n })
	for i, p := range ps {
		switch i % 4 {
		case 0:
			p.cancel()
		case 1:
			_, err := st.Enqueue(ctx, storage.EnqueueParams{Queue: p.q, Items: []storage.EnqueueItem{{Payload: []byte("y")}}, Now: mock.Now()})
			require.NoError(t, err)
			d.Notify(p.q)
		case 2:
			for _, tk := range d.TakeWaiters(p.q, 1) {
				tk.Complete(storage.PollResult{})
			}
		}
	}
	for i, p := range ps {
		if i%4 < 3 {
			<-p.done
		}
	}
	mock.Add(31 * time.Second) // the rest run out of wait
	for _, p := range ps {
		<-p.done
		p.cancel()
	}
	eventually(t, func() bool { q, w := reviewQueues(d); return q == 0 && w == 0 })
	d.Close()
}
