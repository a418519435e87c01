package rocksstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// prefetchSetup is prefetchStore with n items enqueued into "q" at at(0).
func prefetchSetup(t *testing.T, n int, mod ...func(*Options)) (*testBundle, *blockingSync, []storage.EnqueueResult) {
	t.Helper()
	b, h := prefetchStore(t, mod...)
	items := make([]storage.EnqueueItem, n)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: []byte{byte('a' + i)}}
	}
	res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: items, Now: at(0)})
	require.NoError(t, err)
	return b, h, res
}

// prefetchStore opens a SyncAlways store (claims ahead on, by default)
// whose fsyncs go through a blockingSync, starting free.
func prefetchStore(t *testing.T, mod ...func(*Options)) (*testBundle, *blockingSync) {
	t.Helper()
	h := newBlockingSync()
	h.free.Store(true)
	b := setup(t, append([]func(*Options){func(o *Options) {
		o.Sync = SyncAlways
		o.syncHook = h.hook
	}}, mod...)...)
	return b, h
}

// pollAck polls max items at now and acks them all at now.
func (b *testBundle) pollAck(max int, now time.Time) storage.PollResult {
	b.t.Helper()
	r, err := b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: max, Lease: time.Minute, Now: now})
	require.NoError(b.t, err)
	codes, err := b.s.Ack(b.ctx, storage.AckParams{Queue: "q", Lease: r.Lease, IDs: itemIDs(r.Items), Now: now})
	require.NoError(b.t, err)
	for _, c := range codes {
		require.Equal(b.t, storage.CodeOK, c)
	}
	return r
}

// The ack that ends a poll's lease claims the next batch in its own
// commit; the consumer's next poll is answered with it while every fsync
// is held: it needs none of its own. It gets the items a claim at its
// instant would have, under a lease counted from its instant.
func TestPrefetch_PollAnsweredWithoutItsOwnFsync(t *testing.T) {
	t.Parallel()
	b, h, res := prefetchSetup(t, 8)
	first := b.pollAck(2, at(time.Second))
	require.Equal(t, []storage.ItemID{res[0].ID, res[1].ID}, itemIDs(first.Items))
	require.EqualValues(t, 1, b.s.Metrics().Prefetched)

	h.free.Store(false) // from here every fsync waits for a release
	polled := make(chan storage.PollResult, 1)
	go func() {
		r, err := b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 2, Lease: time.Minute, Now: at(time.Second + time.Millisecond)})
		require.NoError(t, err)
		polled <- r
	}()
	// Every fsync blocks in the hook until released, so a poll that
	// returns did not wait for one.
	var r storage.PollResult
	select {
	case r = <-polled:
	case <-time.After(time.Minute): // a deadlock guard, not a timing
		t.Fatal("the poll did not return: it waited for an fsync")
	}
	require.Equal(t, []storage.ItemID{res[2].ID, res[3].ID}, itemIDs(r.Items))
	require.Equal(t, at(time.Second+time.Millisecond+time.Minute), r.ExpiresAt, "the lease counts from the poll")
	for _, it := range r.Items {
		require.EqualValues(t, 1, it.Attempts)
	}
	require.EqualValues(t, 1, b.s.Metrics().PrefetchHits)
	h.free.Store(true)
	// The database keeps the claim's expiry (1 ms earlier) until the
	// lease is next written; the store keeps the one it promised: a sweep
	// between the two leaves the lease alone, and the ack still counts.
	between := at(time.Second + time.Minute + 500*time.Microsecond)
	sw, err := b.s.Sweep(b.ctx, storage.SweepParams{Now: between})
	require.NoError(t, err)
	require.Zero(t, sw.LeasesExpired)
	codes, err := b.s.Ack(b.ctx, storage.AckParams{Queue: "q", Lease: r.Lease, IDs: itemIDs(r.Items), Now: between})
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK}, codes)
}

// A batch claimed ahead leaves no trace a caller can see: Stats, an ack
// naming one of its items and Peek answer as if it were still available,
// and Check finds no lease.
func TestPrefetch_Invisible(t *testing.T) {
	t.Parallel()
	b, _, res := prefetchSetup(t, 8)
	first := b.pollAck(2, at(time.Second))
	require.EqualValues(t, 1, b.s.Metrics().Prefetched)

	st, err := b.s.Stats(b.ctx, storage.StatsParams{Queue: "q", Now: at(time.Second)})
	require.NoError(t, err)
	require.Len(t, st, 1)
	require.EqualValues(t, 6, st[0].Ready)
	require.EqualValues(t, 0, st[0].Inflight)
	require.EqualValues(t, 0, st[0].Leases)
	require.EqualValues(t, 2, st[0].Delivered)
	require.Equal(t, time.Second, st[0].OldestReadyAge)

	// An ack of a held item under the finished lease: as for an item
	// that is available.
	codes, err := b.s.Ack(b.ctx, storage.AckParams{Queue: "q", Lease: first.Lease, IDs: []storage.ItemID{res[2].ID, res[7].ID}, Now: at(time.Second)})
	require.NoError(t, err)
	require.Equal(t, codes[1], codes[0])

	// Peek gives the held batch back first: every item is available.
	items, err := b.s.Peek(b.ctx, storage.PeekParams{Queue: "q", Limit: 10, Now: at(time.Second)})
	require.NoError(t, err)
	require.Len(t, items, 6)
	for _, it := range items {
		require.EqualValues(t, 0, it.Attempts)
		require.Equal(t, storage.StateReady, it.State)
	}
	require.EqualValues(t, 1, b.s.Metrics().PrefetchReleased)
	rep, err := b.s.Check(b.ctx)
	require.NoError(t, err)
	require.True(t, rep.OK(), "violations: %v", rep.Violations)
	require.EqualValues(t, 0, rep.Leases)
	require.EqualValues(t, 6, rep.Items)
}

// A batch nobody polls for goes back once its hold has passed, at the
// next sweep, exactly as it was: the next poll gets the same items, at
// their first attempt.
func TestPrefetch_GivenBackWhenStale(t *testing.T) {
	t.Parallel()
	b, _, res := prefetchSetup(t, 8)
	b.pollAck(2, at(time.Second))
	require.EqualValues(t, 1, b.s.Metrics().Prefetched)

	later := at(time.Second + DefaultPrefetchHold + time.Nanosecond)
	_, err := b.s.Sweep(b.ctx, storage.SweepParams{Now: later})
	require.NoError(t, err)
	require.EqualValues(t, 1, b.s.Metrics().PrefetchReleased)
	r, err := b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 2, Lease: time.Minute, Now: later})
	require.NoError(t, err)
	require.Equal(t, []storage.ItemID{res[2].ID, res[3].ID}, itemIDs(r.Items))
	for _, it := range r.Items {
		require.EqualValues(t, 1, it.Attempts)
	}
	require.Zero(t, b.s.Metrics().PrefetchHits)
	require.Equal(t, later.Add(time.Minute), r.ExpiresAt)
}

// A poll that asks for something else (here a different max) is not
// answered with the held batch: its op gives it back and claims, so it
// gets the queue's head.
func TestPrefetch_OtherPollGetsTheHead(t *testing.T) {
	t.Parallel()
	b, _, res := prefetchSetup(t, 8)
	b.pollAck(2, at(time.Second))
	r, err := b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 3, Lease: time.Minute, Now: at(time.Second)})
	require.NoError(t, err)
	require.Equal(t, []storage.ItemID{res[2].ID, res[3].ID, res[4].ID}, itemIDs(r.Items))
	require.EqualValues(t, 1, b.s.Metrics().PrefetchReleased)
	require.Zero(t, b.s.Metrics().PrefetchHits)
}

// A clean close gives held batches back: the reopened store has no lease.
func TestPrefetch_CloseGivesBack(t *testing.T) {
	t.Parallel()
	b, _, _ := prefetchSetup(t, 8)
	b.pollAck(2, at(time.Second))
	require.EqualValues(t, 1, b.s.Metrics().Prefetched)
	require.NoError(t, b.s.Close())
	s, err := Open(b.dir, b.opts)
	require.NoError(t, err)
	b.s = s
	st, err := b.s.Stats(b.ctx, storage.StatsParams{Queue: "q", Now: at(time.Second)})
	require.NoError(t, err)
	require.EqualValues(t, 6, st[0].Ready)
	require.EqualValues(t, 0, st[0].Leases)
}

// Off (PrefetchHold < 0), and with SyncNone, where a poll has no fsync to
// save, nothing is claimed ahead.
func TestPrefetch_Off(t *testing.T) {
	t.Parallel()
	for name, mod := range map[string]func(*Options){
		"hold<0":   func(o *Options) { o.PrefetchHold = -1 },
		"syncnone": func(o *Options) { o.Sync = SyncNone },
	} {
		t.Run(name, func(t *testing.T) {
			b, _, _ := prefetchSetup(t, 8, mod)
			b.pollAck(2, at(time.Second))
			require.Zero(t, b.s.Metrics().Prefetched)
		})
	}
}

// A batch claimed ahead whose lease is due when the expiry step of a
// sweep meets it is given back, not expired. A sweep gives back stale
// batches first (sweepAhead), but an ack that claims ahead at an earlier
// instant than the sweep's can commit between that step and the expiry
// step. The expiry step runs here without the first, as in that race: no lease expires, no attempt is counted that no consumer saw,
// and the items are available as they were.
func TestPrefetch_DueBatchGivenBackNotExpired(t *testing.T) {
	t.Parallel()
	b, _, res := prefetchSetup(t, 8)
	b.pollAck(2, at(time.Second))
	require.EqualValues(t, 1, b.s.Metrics().Prefetched)

	late := at(time.Second + 2*time.Minute) // past the held batch's lease
	require.NoError(t, b.s.enter("test"))
	var sw storage.SweepResult
	gained := map[string]bool{}
	_, err := b.s.submit("", sweepChunk, func(o *opTx) error {
		b.s.expireDue(o, nanos(late), sweepChunk, &sw, gained)
		return nil
	})
	b.s.exit()
	require.NoError(t, err)
	require.Zero(t, sw.LeasesExpired)
	require.Zero(t, sw.Requeued)
	require.True(t, gained["q"], "the given-back items are news for the queue's parked polls")
	require.EqualValues(t, 1, b.s.Metrics().PrefetchReleased)

	st, err := b.s.Stats(b.ctx, storage.StatsParams{Queue: "q", Now: late})
	require.NoError(t, err)
	require.EqualValues(t, 6, st[0].Ready)
	require.EqualValues(t, 0, st[0].Leases)
	require.EqualValues(t, 2, st[0].Delivered)
	require.EqualValues(t, 0, st[0].Expired)
	r, err := b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 2, Lease: time.Minute, Now: late})
	require.NoError(t, err)
	require.Equal(t, []storage.ItemID{res[2].ID, res[3].ID}, itemIDs(r.Items))
	for _, it := range r.Items {
		require.EqualValues(t, 1, it.Attempts, "no attempt counted for the batch held")
	}
	b.check()
}

// A sweep's expiry step and a poll off the committer race for a batch
// claimed ahead whose lease is due at the sweep's instant: the poll may
// take it (a lease with a promised expiry) while the step gives it back.
// Whichever wins, the lease must stay in the expiry heap or end: a later
// sweep past every deadline leaves no lease behind. The window is
// narrow: each round races four queues' polls against one expiry step,
// over many rounds.
func TestPrefetch_SweepRacesPollForDueBatch(t *testing.T) {
	t.Parallel()
	b, _ := prefetchStore(t)
	const rounds, queues = 500, 4
	items := make([]storage.EnqueueItem, 6)
	for j := range items {
		items[j] = storage.EnqueueItem{Payload: []byte{byte(j)}}
	}
	for i := range rounds {
		base := time.Duration(i) * time.Hour
		for qi := range queues {
			q := fmt.Sprint("q", qi)
			_, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: q, Items: items, Now: at(base)})
			require.NoError(t, err)
			// Poll 2 and ack them: the ack claims the next 2 ahead (lease 1 min).
			r, err := b.s.Poll(b.ctx, storage.PollParams{Queue: q, Max: 2, Lease: time.Minute, Now: at(base + time.Second)})
			require.NoError(t, err)
			_, err = b.s.Ack(b.ctx, storage.AckParams{Queue: q, Lease: r.Lease, IDs: itemIDs(r.Items), Now: at(base + time.Second)})
			require.NoError(t, err)
		}

		late := nanos(at(base + time.Second + 2*time.Minute)) // past the claim's expiry and a poll's promise
		start := make(chan struct{})
		polled := make(chan error, queues)
		for qi := range queues {
			go func() {
				<-start
				_, err := b.s.Poll(b.ctx, storage.PollParams{Queue: fmt.Sprint("q", qi), Max: 2, Lease: time.Minute, Now: at(base + time.Second + time.Millisecond)})
				polled <- err
			}()
		}
		require.NoError(t, b.s.enter("test"))
		close(start)
		var sw storage.SweepResult
		_, err := b.s.submit("", sweepChunk, func(o *opTx) error {
			b.s.expireDue(o, late, sweepChunk, &sw, map[string]bool{})
			return nil
		})
		b.s.exit()
		require.NoError(t, err)
		for range queues {
			require.NoError(t, <-polled)
		}

		// Past every deadline: nothing may stay leased.
		end := at(base + 30*time.Minute)
		_, err = b.s.Sweep(b.ctx, storage.SweepParams{Now: end})
		require.NoError(t, err)
		for qi := range queues {
			q := fmt.Sprint("q", qi)
			st, err := b.s.Stats(b.ctx, storage.StatsParams{Queue: q, Now: end})
			require.NoError(t, err)
			require.Zerof(t, st[0].Leases, "round %d, %s: a lease outlived every deadline", i, q)
			require.Zerof(t, st[0].Inflight, "round %d, %s", i, q)
			// Empty the queue for the next round.
			r, err := b.s.Poll(b.ctx, storage.PollParams{Queue: q, Max: 100, Lease: time.Minute, Now: end})
			require.NoError(t, err)
			require.Len(t, r.Items, 4, "round %d, %s", i, q)
			_, err = b.s.Ack(b.ctx, storage.AckParams{Queue: q, Lease: r.Lease, IDs: itemIDs(r.Items), Now: end})
			require.NoError(t, err)
		}
	}
	b.check()
}

// A poll whose call began before an ack claimed ahead, and whose op runs
// after it, still gets the queue's head: the held batch counts as
// available to it, as to every caller.
func TestPrefetch_PollBegunBeforeTheClaimAheadGetsTheHead(t *testing.T) {
	t.Parallel()
	for _, max := range []int{2, 3} { // the held batch's max, and another
		t.Run(fmt.Sprint("max=", max), func(t *testing.T) {
			b, _, res := prefetchSetup(t, 8)
			first, err := b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 2, Lease: time.Minute, Now: at(time.Second)})
			require.NoError(t, err)

			// The second consumer's call: checked and its op made now,
			// while nothing is held ...
			now := at(time.Second)
			require.NoError(t, b.s.enter("test"))
			r, fn, err := b.s.pollOp(b.ctx, storage.PollParams{Queue: "q", Max: max, Lease: time.Minute, Now: now})
			require.NoError(t, err)
			require.NotNil(t, fn)
			// ... the first consumer's ack claims the next batch ahead ...
			_, err = b.s.Ack(b.ctx, storage.AckParams{Queue: "q", Lease: first.Lease, IDs: itemIDs(first.Items), Now: now})
			require.NoError(t, err)
			require.EqualValues(t, 1, b.s.Metrics().Prefetched)
			// ... and then the second consumer's op runs.
			_, err = b.s.submit("q", max, fn)
			b.s.exit()
			require.NoError(t, err)
			want := []storage.ItemID{res[2].ID, res[3].ID, res[4].ID}[:max]
			require.Equal(t, want, itemIDs(r.Items), "the head of the queue")
			b.check()
		})
	}
}

// The claim an enqueue makes for a parked poll (EnqueueClaim) gets the
// queue's head too: the held batch if it matches the poll, else the head
// after the held batch is given back.
func TestPrefetch_EnqueueClaimGetsTheHead(t *testing.T) {
	t.Parallel()
	for _, max := range []int{2, 3} {
		t.Run(fmt.Sprint("max=", max), func(t *testing.T) {
			b, _, res := prefetchSetup(t, 8)
			b.pollAck(2, at(time.Second))
			require.EqualValues(t, 1, b.s.Metrics().Prefetched)
			now := at(time.Second + time.Millisecond)
			_, prs, err := b.s.EnqueueClaim(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("z")}}, Now: now},
				[]storage.PollParams{{Queue: "q", Max: max, Lease: time.Minute, Now: now}})
			require.NoError(t, err)
			want := []storage.ItemID{res[2].ID, res[3].ID, res[4].ID}[:max]
			require.Equal(t, want, itemIDs(prs[0].Items), "the head of the queue")
			require.Equal(t, now.Add(time.Minute), prs[0].ExpiresAt)
			for _, it := range prs[0].Items {
				require.EqualValues(t, 1, it.Attempts)
			}
			if max == 2 {
				require.EqualValues(t, 1, b.s.Metrics().PrefetchHits, "the held batch answered the poll")
			} else {
				require.EqualValues(t, 1, b.s.Metrics().PrefetchReleased, "the held batch was given back")
			}
			b.check()
		})
	}
}

// An item that became ready after a batch was claimed ahead, but sorts
// before the batch's last item (an expired lease's item, ready again as
// of its expiry), keeps a poll from taking the held batch: the poll gets
// the queue's head, that item first.
func TestPrefetch_EarlierReadyItemBeatsHeldBatch(t *testing.T) {
	t.Parallel()
	b, _ := prefetchStore(t)
	x, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("x")}}, Now: at(0)})
	require.NoError(t, err)
	held, err := b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 1, Lease: time.Minute, Now: at(time.Second)})
	require.NoError(t, err)
	require.Len(t, held.Items, 1) // x, until its lease expires at 61 s

	items := make([]storage.EnqueueItem, 8)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: []byte{byte('a' + i)}}
	}
	res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: items, Now: at(100 * time.Second)})
	require.NoError(t, err)
	b.pollAck(2, at(101*time.Second)) // a, b; claims c, d ahead
	require.EqualValues(t, 1, b.s.Metrics().Prefetched)

	// x's lease expires: x is ready again as of 61 s, before c and d.
	sw, err := b.s.Sweep(b.ctx, storage.SweepParams{Now: at(101*time.Second + 5*time.Millisecond)})
	require.NoError(t, err)
	require.EqualValues(t, 1, sw.LeasesExpired)

	r, err := b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 2, Lease: time.Minute, Now: at(101*time.Second + 6*time.Millisecond)})
	require.NoError(t, err)
	require.Equal(t, []storage.ItemID{x[0].ID, res[2].ID}, itemIDs(r.Items), "the head of the queue")
	b.check()
}

// While the fsync of an ack that claimed ahead is in flight, Stats
// already counts the held batch's items as available, as it does once the
// batch is durable: the claim shows at no moment.
func TestPrefetch_InvisibleBeforeDurable(t *testing.T) {
	t.Parallel()
	b, h, _ := prefetchSetup(t, 8)
	first, err := b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 2, Lease: time.Minute, Now: at(time.Second)})
	require.NoError(t, err)
	h.free.Store(false) // from here every fsync waits for a release
	acked := make(chan error, 1)
	go func() {
		_, err := b.s.Ack(b.ctx, storage.AckParams{Queue: "q", Lease: first.Lease, IDs: itemIDs(first.Items), Now: at(time.Second)})
		acked <- err
	}()
	<-h.entered // the ack's batch, with its claim ahead, is written; its fsync waits
	released := false
	defer func() { // lets Close end on a failed check
		if !released {
			h.free.Store(true)
			h.release <- nil
		}
	}()
	require.EqualValues(t, 1, b.s.Metrics().Prefetched)
	st, err := b.s.Stats(b.ctx, storage.StatsParams{Queue: "q", Now: at(time.Second)})
	require.NoError(t, err)
	require.EqualValues(t, 6, st[0].Ready)
	require.EqualValues(t, 0, st[0].Inflight)
	require.EqualValues(t, 0, st[0].Leases)
	require.EqualValues(t, 2, st[0].Delivered)
	h.free.Store(true)
	h.release <- nil
	released = true
	require.NoError(t, <-acked)
	st, err = b.s.Stats(b.ctx, storage.StatsParams{Queue: "q", Now: at(time.Second)})
	require.NoError(t, err)
	require.EqualValues(t, 6, st[0].Ready)
	require.EqualValues(t, 0, st[0].Leases)
	b.check()
}
