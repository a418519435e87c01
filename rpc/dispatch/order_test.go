package dispatch

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// readyAtWatchStore is a store shared with other nodes (storage.ReadyWatcher)
// on which another node enqueues between a poll's empty Poll and its
// WatchReady: as fdbsync's WatchReady does when the queue already has ready
// items, it returns a channel that is already closed ("so a change between
// the empty Poll and the watch is not lost").
type readyAtWatchStore struct {
	*fakeStore
	mu      sync.Mutex
	watched map[string]bool
}

func (s *readyAtWatchStore) WatchReady(_ context.Context, queue string) (<-chan struct{}, error) {
	s.mu.Lock()
	first := !s.watched[queue]
	s.watched[queue] = true
	s.mu.Unlock()
	if first {
		s.add(queue, 5) // another node's enqueue, after the empty poll
	}
	ch := make(chan struct{})
	close(ch)
	return ch, nil
}

// TestDispatcher_WatchFiredBeforeParkPollsAgain: a poll's watch can fire
// before the poll has parked (here WatchReady finds the queue ready at
// once, as fdbsync's does after another node's enqueue); the poll must
// then poll again instead of parking with an item ready until its wait
// ends (a minute of a mock clock that never moves). Other traffic on the
// dispatcher's lock (Notify of other queues) widens the window between
// watch() and park().
func TestDispatcher_WatchFiredBeforeParkPollsAgain(t *testing.T) {
	fs := &fakeStore{}
	st := &readyAtWatchStore{fakeStore: fs, watched: map[string]bool{}}
	d, err := New(Config{Store: st, Clock: clock.NewMock()})
	require.NoError(t, err)
	defer d.Close()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				d.Notify("other")
				_ = d.Waiters()
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()

	for i := range 2000 {
		q := fmt.Sprintf("q%d", i)
		ch := make(chan out, 1)
		d.PollAsync(context.Background(), storage.PollParams{Queue: q, Max: 1}, time.Minute,
			func(r storage.PollResult, err error) { ch <- out{r, err} })
		select {
		case o := <-ch:
			require.NoError(t, o.err)
			require.Len(t, o.res.Items, 1, "iteration %d", i)
		case <-time.After(2 * time.Second):
			t.Fatalf("iteration %d: the watch fired before the poll parked and the wake was lost: "+
				"the poll is parked (%d parked) with an item ready, until its wait ends", i, d.QueueWaiters(q))
		}
	}
}

// TestDispatcher_ResumedPollsKeepTheirOrder: polls an enqueue took off
// their line and handed back (Taken.Resume: the claim failed, or claimed
// nothing for them) go back to their places in line, so the next Notify
// wakes the oldest.
func TestDispatcher_ResumedPollsKeepTheirOrder(t *testing.T) {
	fs := &fakeStore{}
	d, _ := setup(t, fs, 0)
	var chans []<-chan out
	for i := 1; i <= 3; i++ {
		chans = append(chans, goPoll(d, context.Background(), "q", time.Minute))
		eventually(t, func() bool { return d.QueueWaiters("q") == i })
	}
	ws := d.TakeWaiters("q", 2) // the two oldest
	require.Len(t, ws, 2)
	// As claimErr and completeClaims do: every taken poll handed back, in
	// order (here one at a time, so the outcome does not depend on timing).
	ws[0].Resume()
	eventually(t, func() bool { return d.QueueWaiters("q") == 2 })
	ws[1].Resume()
	eventually(t, func() bool { return d.QueueWaiters("q") == 3 })

	fs.add("q", 42)
	d.Notify("q")
	select {
	case o := <-chans[0]:
		require.NoError(t, o.err)
		require.Len(t, o.res.Items, 1)
	case o := <-chans[1]:
		t.Fatalf("the second-oldest poll got the item (%d items) before the oldest: FIFO broken by Resume", len(o.res.Items))
	case <-time.After(5 * time.Second):
		t.Fatal("nobody got the item")
	}
}
