package dispatch

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeStore hands out queued items one poll at a time; hook runs inside
// every Poll (before it answers) to inject races.
type fakeStore struct {
	mu    sync.Mutex
	items map[string][]storage.Item
	polls int
	hook  func(n int)
	watch chan struct{}
}

func (f *fakeStore) Poll(_ context.Context, p storage.PollParams) (storage.PollResult, error) {
	f.mu.Lock()
	f.polls++
	n := f.polls
	hook := f.hook
	var res storage.PollResult
	if its := f.items[p.Queue]; len(its) > 0 {
		k := min(p.Max, len(its))
		res = storage.PollResult{Lease: storage.LeaseID{byte(n)}, ExpiresAt: p.Now.Add(time.Minute), Items: append([]storage.Item(nil), its[:k]...)}
		f.items[p.Queue] = its[k:]
	}
	f.mu.Unlock()
	if hook != nil {
		hook(n)
	}
	return res, nil
}

func (f *fakeStore) add(queue string, ids ...byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.items == nil {
		f.items = map[string][]storage.Item{}
	}
	for _, id := range ids {
		f.items[queue] = append(f.items[queue], storage.Item{ID: storage.ItemID{id}, Queue: queue})
	}
}

func (f *fakeStore) pollCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.polls
}

// watchingStore also implements storage.ReadyWatcher.
type watchingStore struct{ *fakeStore }

func (w watchingStore) WatchReady(ctx context.Context, queue string) (<-chan struct{}, error) {
	return w.watch, nil
}

func eventually(t *testing.T, fn func() bool) {
	t.Helper()
	rpctest.Eventually(t, 10*time.Second, fn)
}

type out struct {
	res storage.PollResult
	err error
}

func goPoll(d *Dispatcher, ctx context.Context, queue string, wait time.Duration) <-chan out {
	return rpctest.Go(func() out {
		r, err := d.Poll(ctx, storage.PollParams{Queue: queue, Max: 1}, wait)
		return out{r, err}
	})
}

// parkTwo parks two polls on queue "q" that wait up to wait, oldest
// first: one whose context cancel ends, and one whose context never ends.
func parkTwo(t *testing.T, d *Dispatcher, wait time.Duration) (cancel context.CancelFunc, first, second <-chan out) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	first = goPoll(d, ctx, "q", wait)
	eventually(t, func() bool { return d.Waiters() == 1 })
	second = goPoll(d, context.Background(), "q", wait)
	eventually(t, func() bool { return d.Waiters() == 2 })
	return cancel, first, second
}

func recv(t *testing.T, ch <-chan out) out {
	t.Helper()
	return rpctest.Recv(t, ch, 10*time.Second)
}

func setup(t *testing.T, store Poller, max int) (*Dispatcher, *clock.Mock) {
	t.Helper()
	mock := clock.NewMock()
	d, err := New(Config{Store: store, Clock: mock, MaxWaitersPerQueue: max})
	require.NoError(t, err)
	t.Cleanup(d.Close)
	return d, mock
}

func TestDispatcher_ZeroWaitPollsOnce(t *testing.T) {
	t.Parallel()
	fs := &fakeStore{}
	d, _ := setup(t, fs, 0)
	r, err := d.Poll(context.Background(), storage.PollParams{Queue: "q", Max: 1}, 0)
	require.NoError(t, err)
	require.Empty(t, r.Items)
	require.Equal(t, 1, fs.pollCount())
	require.Equal(t, 0, d.Waiters())
}

func TestDispatcher_TimeoutByClock(t *testing.T) {
	t.Parallel()
	fs := &fakeStore{}
	d, mock := setup(t, fs, 0)
	ch := goPoll(d, context.Background(), "q", 5*time.Second)
	eventually(t, func() bool { return d.Waiters() == 1 })
	mock.Add(4 * time.Second)
	select {
	case o := <-ch:
		t.Fatalf("returned before the wait ended: %+v", o)
	default:
	}
	mock.Add(time.Second)
	o := recv(t, ch)
	require.NoError(t, o.err)
	require.Empty(t, o.res.Items)
	require.Equal(t, 0, d.Waiters())
}

func TestDispatcher_FIFOWake(t *testing.T) {
	t.Parallel()
	fs := &fakeStore{}
	d, _ := setup(t, fs, 0)
	var chans []<-chan out
	for i := 1; i <= 3; i++ {
		chans = append(chans, goPoll(d, context.Background(), "q", time.Minute))
		eventually(t, func() bool { return d.QueueWaiters("q") == i })
	}
	for i := range chans {
		fs.add("q", byte(10+i))
		d.Notify("q")
		o := recv(t, chans[i]) // the oldest waiter gets it
		require.NoError(t, o.err)
		require.Equal(t, storage.ItemID{byte(10 + i)}, o.res.Items[0].ID)
		// The winner passed the wake on to the next, which found nothing
		// and went back to the head of the line. (A waiter that is polling
		// when a Notify comes is not in the line: FIFO holds between
		// waiters that are parked.)
		if i < len(chans)-1 {
			// 3 parking polls, then per round the winner's and the next's.
			eventually(t, func() bool { return fs.pollCount() == 3+2*(i+1) && d.Waiters() == len(chans)-i-1 })
		}
	}
}

func TestDispatcher_NotifyBetweenPollAndParkIsNotLost(t *testing.T) {
	t.Parallel()
	fs := &fakeStore{}
	d, _ := setup(t, fs, 0)
	// The first (empty) poll is overtaken by an enqueue and its notify
	// before the poller parks: it must poll again, not sleep.
	fs.hook = func(n int) {
		if n == 1 {
			fs.add("q", 7)
			d.Notify("q")
		}
	}
	o := recv(t, goPoll(d, context.Background(), "q", time.Hour))
	require.NoError(t, o.err)
	require.Len(t, o.res.Items, 1)
	require.Equal(t, 2, fs.pollCount())
}

func TestDispatcher_NoThunderingHerd(t *testing.T) {
	t.Parallel()
	fs := &fakeStore{}
	d, _ := setup(t, fs, 0)
	const n = 10
	var chans []<-chan out
	for range n {
		chans = append(chans, goPoll(d, context.Background(), "q", time.Minute))
	}
	eventually(t, func() bool { return d.Waiters() == n })
	before := fs.pollCount()
	fs.add("q", 1)
	d.Notify("q")
	eventually(t, func() bool { return d.Waiters() == n-1 && fs.pollCount() >= before+2 })
	// One poll that found the item, one by the next waiter that found
	// nothing; the other eight never touched the store.
	require.Equal(t, before+2, fs.pollCount())
	require.Equal(t, n-1, d.Waiters())
	d.Close()
	got := 0
	for _, ch := range chans {
		o := recv(t, ch)
		require.NoError(t, o.err)
		got += len(o.res.Items)
	}
	require.Equal(t, 1, got)
}

func TestDispatcher_CancelPassesWakeOn(t *testing.T) {
	t.Parallel()
	fs := &fakeStore{}
	d, _ := setup(t, fs, 0)
	cancel, first, second := parkTwo(t, d, time.Minute)
	cancel()
	o := recv(t, first)
	require.ErrorIs(t, o.err, context.Canceled)
	fs.add("q", 3)
	d.Notify("q")
	o = recv(t, second)
	require.NoError(t, o.err)
	require.Len(t, o.res.Items, 1)
}

func TestDispatcher_MaxWaiters(t *testing.T) {
	t.Parallel()
	fs := &fakeStore{}
	d, _ := setup(t, fs, 1)
	ch := goPoll(d, context.Background(), "q", time.Minute)
	eventually(t, func() bool { return d.Waiters() == 1 })
	_, err := d.Poll(context.Background(), storage.PollParams{Queue: "q", Max: 1}, time.Minute)
	require.ErrorIs(t, err, ErrTooManyWaiters)
	d.Close()
	o := recv(t, ch)
	require.NoError(t, o.err)
	// After Close nothing parks.
	r, err := d.Poll(context.Background(), storage.PollParams{Queue: "q", Max: 1}, time.Minute)
	require.NoError(t, err)
	require.Empty(t, r.Items)
}

func TestDispatcher_ReadyWatcher(t *testing.T) {
	t.Parallel()
	fs := &fakeStore{watch: make(chan struct{})}
	d, _ := setup(t, watchingStore{fs}, 0)
	ch := goPoll(d, context.Background(), "q", time.Minute)
	eventually(t, func() bool { return d.Waiters() == 1 })
	// Another node enqueued: no local Notify, only the store's watch.
	fs.add("q", 5)
	close(fs.watch)
	o := recv(t, ch)
	require.NoError(t, o.err)
	require.Len(t, o.res.Items, 1)
}

func TestDispatcher_NewNeedsStoreAndClock(t *testing.T) {
	t.Parallel()
	_, err := New(Config{})
	require.Error(t, err)
}

func TestDispatcher_MaxWaitersPerNode(t *testing.T) {
	t.Parallel()
	mock := clock.NewMock()
	var subs atomic.Int64
	d, err := New(Config{Store: &fakeStore{}, Clock: mock, MaxWaiters: 3, Extra: func() int { return int(subs.Load()) }})
	require.NoError(t, err)
	t.Cleanup(d.Close)
	a := goPoll(d, context.Background(), "a", time.Minute)
	b := goPoll(d, context.Background(), "b", time.Minute)
	eventually(t, func() bool { return d.Waiters() == 2 })
	subs.Store(1) // a subscription elsewhere on the node
	_, err = d.Poll(context.Background(), storage.PollParams{Queue: "c", Max: 1}, time.Minute)
	require.ErrorIs(t, err, ErrTooManyWaiters)
	require.ErrorContains(t, err, "node limit 3")
	subs.Store(0)
	c := goPoll(d, context.Background(), "c", time.Minute)
	eventually(t, func() bool { return d.Waiters() == 3 })
	d.Close()
	for _, ch := range []<-chan out{a, b, c} {
		require.NoError(t, recv(t, ch).err)
	}
}

// TestDispatcher_PollAsyncParksWithoutGoroutines: parked PollAsync calls
// hold no goroutine; each completes exactly once, by a Notify (with the
// item), its wait's end, its context's end, or Close.
func TestDispatcher_PollAsyncParksWithoutGoroutines(t *testing.T) {
	t.Parallel()
	fs := &fakeStore{}
	d, mock := setup(t, fs, 0)
	const n = 400
	var mu sync.Mutex
	results := make([][]out, n)
	done := func(i int) func(storage.PollResult, error) {
		return func(r storage.PollResult, err error) {
			mu.Lock()
			results[i] = append(results[i], out{r, err})
			mu.Unlock()
		}
	}
	before := runtime.NumGoroutine()
	cancels := make([]context.CancelFunc, n)
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		cancels[i] = cancel
		wait := time.Hour
		if i%4 == 1 {
			wait = time.Minute // ends by the clock
		}
		d.PollAsync(ctx, storage.PollParams{Queue: "q", Max: 1}, wait, done(i))
	}
	require.Equal(t, n, d.Waiters())
	// Other tests run in parallel and start goroutines of their own: the
	// bound only tells "none per poll" (n) from "a few".
	require.Less(t, runtime.NumGoroutine()-before, n/4, "parked polls must not hold goroutines")

	// n/4 items: one Notify, and the baton passes from winner to winner
	// down the line (FIFO), so polls 0..n/4-1 get one each.
	for i := range n / 4 {
		fs.add("q", byte(i))
	}
	d.Notify("q")
	eventually(t, func() bool { return d.Waiters() == n-n/4 })
	// Of the rest: i%4 == 1 ends by the clock, 2 is cancelled, the
	// others end with Close.
	for i := n / 4; i < n; i += 4 {
		cancels[i+2]()
	}
	mock.Add(time.Minute)
	eventually(t, func() bool { return d.Waiters() == (n-n/4)/2 })
	d.Close()
	eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range results {
			if len(r) == 0 {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	for i, r := range results {
		require.Len(t, r, 1, "poll %d completed %d times", i, len(r))
		switch {
		case i < n/4:
			require.NoError(t, r[0].err, "poll %d", i)
			require.Len(t, r[0].res.Items, 1, "poll %d", i)
			require.Equal(t, storage.ItemID{byte(i)}, r[0].res.Items[0].ID, "FIFO")
		case i%4 == 2:
			require.ErrorIs(t, r[0].err, context.Canceled, "poll %d", i)
		default:
			require.NoError(t, r[0].err, "poll %d", i)
			require.Empty(t, r[0].res.Items, "poll %d", i)
		}
	}
	for _, c := range cancels {
		c()
	}
}

// TestDispatcher_PollAsyncRaces: notifications, cancellations, timeouts
// and Close race with parking; every poll completes exactly once and no
// item is lost or given twice.
func TestDispatcher_PollAsyncRaces(t *testing.T) {
	t.Parallel()
	for round := range 20 {
		fs := &fakeStore{}
		d, err := New(Config{Store: fs, Clock: clock.New()})
		require.NoError(t, err)
		const n = 50
		var mu sync.Mutex
		count := make([]int, n)
		got := map[storage.ItemID]int{}
		var wg sync.WaitGroup
		wg.Add(n)
		for i := range n {
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%7)*time.Millisecond)
			d.PollAsync(ctx, storage.PollParams{Queue: "q", Max: 1}, time.Duration(i%5)*time.Millisecond, func(r storage.PollResult, err error) {
				mu.Lock()
				count[i]++
				for _, it := range r.Items {
					got[it.ID]++
				}
				mu.Unlock()
				cancel()
				wg.Done()
			})
			if i%3 == 0 {
				fs.add("q", byte(i))
				d.Notify("q")
			}
		}
		if round%2 == 0 {
			d.Close()
		}
		wg.Wait()
		d.Close()
		for i, c := range count {
			require.Equal(t, 1, c, "round %d: poll %d completed %d times", round, i, c)
		}
		for id, c := range got {
			require.Equal(t, 1, c, "round %d: item %v given %d times", round, id, c)
		}
		require.Zero(t, d.Waiters())
	}
}

// TakeWaiters hands parked polls to a taker (oldest first, until their Max
// cover the items): it completes them, or resumes them as woken polls, and
// neither their timers nor Close complete them meanwhile.
func TestDispatcher_TakeWaiters(t *testing.T) {
	t.Parallel()
	fs := &fakeStore{}
	d, mock := setup(t, fs, 0)
	_, a, b := parkTwo(t, d, 5*time.Second)
	c := goPoll(d, context.Background(), "q", 5*time.Second)
	eventually(t, func() bool { return d.Waiters() == 3 })
	require.Empty(t, d.TakeWaiters("other", 5))

	ws := d.TakeWaiters("q", 2) // Max 1 each: the two oldest
	require.Len(t, ws, 2)
	require.Equal(t, 1, d.Waiters())
	require.Equal(t, "q", ws[0].Params().Queue)
	require.Equal(t, 1, ws[0].Params().Max)

	mock.Add(5 * time.Second) // the wait ends: c completes, the taken two do not
	require.Empty(t, recv(t, c).res.Items)
	select {
	case o := <-a:
		t.Fatalf("a taken poll was completed by its timer: %+v", o)
	case o := <-b:
		t.Fatalf("a taken poll was completed by its timer: %+v", o)
	default:
	}
	polls := fs.pollCount()
	want := storage.PollResult{Lease: storage.LeaseID{9}, Items: []storage.Item{{ID: storage.ItemID{7}, Queue: "q"}}}
	ws[0].Complete(want)
	got := recv(t, a)
	require.NoError(t, got.err)
	require.Equal(t, want, got.res)
	require.Equal(t, polls, fs.pollCount(), "a completed poll does not poll the store")

	fs.add("q", 8)
	ws[1].Resume() // polls the store again, as a woken poll
	got = recv(t, b)
	require.NoError(t, got.err)
	require.Len(t, got.res.Items, 1)
	require.Equal(t, storage.ItemID{8}, got.res.Items[0].ID)
	require.Equal(t, 0, d.Waiters())
}

// Touch makes a running poll that found nothing poll again instead of
// parking, without waking a parked one.
func TestDispatcher_TouchBetweenPollAndPark(t *testing.T) {
	t.Parallel()
	fs := &fakeStore{}
	d, mock := setup(t, fs, 0)
	parked := goPoll(d, context.Background(), "q", time.Minute)
	eventually(t, func() bool { return d.Waiters() == 1 })
	var once sync.Once
	fs.mu.Lock()
	fs.hook = func(n int) {
		// Inside the second poll's store call: it has found nothing.
		once.Do(func() {
			fs.add("q", 5)
			d.Touch("q")
		})
	}
	fs.mu.Unlock()
	r, err := d.Poll(context.Background(), storage.PollParams{Queue: "q", Max: 1}, time.Minute)
	require.NoError(t, err)
	require.Len(t, r.Items, 1, "the touched poll polled again instead of parking")
	require.Equal(t, 1, d.Waiters(), "the parked poll was not woken")
	mock.Add(time.Minute)
	require.Empty(t, recv(t, parked).res.Items)
}

// claimingStore is a fakeStore that can also claim within an enqueue
// (storage.EnqueueClaimer); nonblocking makes it say its calls never wait.
type claimingStore struct {
	*fakeStore
	nonblocking bool
	enqueues    atomic.Int64
	claims      atomic.Int64
}

func (c *claimingStore) Nonblocking() bool { return c.nonblocking }

func (c *claimingStore) Enqueue(_ context.Context, p storage.EnqueueParams) ([]storage.EnqueueResult, error) {
	c.enqueues.Add(1)
	out := make([]storage.EnqueueResult, len(p.Items))
	for i := range p.Items {
		c.add(p.Queue, byte(10+i))
		out[i] = storage.EnqueueResult{Code: storage.CodeOK, ID: storage.ItemID{byte(10 + i)}}
	}
	return out, nil
}

func (c *claimingStore) EnqueueClaim(ctx context.Context, p storage.EnqueueParams, polls []storage.PollParams) ([]storage.EnqueueResult, []storage.PollResult, error) {
	c.claims.Add(1)
	out, _ := c.Enqueue(ctx, p)
	prs := make([]storage.PollResult, len(polls))
	for i, pp := range polls {
		prs[i], _ = c.fakeStore.Poll(ctx, pp)
	}
	return out, prs, nil
}

// Dispatcher.Enqueue serves parked polls inside the enqueue when the store
// claims there and waits for its commits; otherwise it enqueues and wakes.
func TestDispatcher_EnqueueClaimsForParkedPolls(t *testing.T) {
	t.Parallel()
	for _, nonblocking := range []bool{false, true} {
		cs := &claimingStore{fakeStore: &fakeStore{}, nonblocking: nonblocking}
		d, _ := setup(t, cs, 0)
		a := goPoll(d, context.Background(), "q", time.Minute)
		eventually(t, func() bool { return d.Waiters() == 1 })
		out, err := d.Enqueue(context.Background(), cs, storage.EnqueueParams{Queue: "q", Items: make([]storage.EnqueueItem, 1)})
		require.NoError(t, err)
		require.Len(t, out, 1)
		got := recv(t, a)
		require.NoError(t, got.err)
		require.Len(t, got.res.Items, 1)
		require.Equal(t, out[0].ID, got.res.Items[0].ID)
		if nonblocking {
			require.Zero(t, cs.claims.Load(), "a store that never waits is woken, not claimed for")
		} else {
			require.Equal(t, int64(1), cs.claims.Load())
			require.Equal(t, int64(1), cs.enqueues.Load(), "one enqueue, inside the claim")
		}
	}
}

// A parked poll whose caller gave up is never taken: nobody would receive
// what a store claimed for it. (Its context's AfterFunc, which takes it
// off its line, may not have run yet.)
func TestDispatcher_TakeWaitersPassesOverCancelled(t *testing.T) {
	t.Parallel()
	fs := &fakeStore{}
	d, _ := setup(t, fs, 0)
	cancel, gone, live := parkTwo(t, d, time.Minute)
	cancel()
	ws := d.TakeWaiters("q", 5)
	require.Len(t, ws, 1, "only the live poll")
	require.ErrorIs(t, recv(t, gone).err, context.Canceled)
	ws[0].Complete(storage.PollResult{})
	require.NoError(t, recv(t, live).err)
}
