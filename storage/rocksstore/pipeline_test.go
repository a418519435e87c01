package rocksstore

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/trace"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// blockingSync is a syncHook that holds every WAL fsync until released and
// records whether the real fsync has run.
type blockingSync struct {
	entered chan struct{} // one send per fsync reaching the hook
	release chan error    // what the held fsync returns (nil: run the real one)
	synced  atomic.Int64  // real fsyncs completed
	free    atomic.Bool   // stop holding: later fsyncs run at once
}

// setupHeldSync opens a SyncAlways store whose fsyncs go through a
// blockingSync.
func setupHeldSync(t *testing.T) (*testBundle, *blockingSync) {
	t.Helper()
	h := newBlockingSync()
	b := setup(t, func(o *Options) {
		o.Sync = SyncAlways
		o.syncHook = h.hook
		// These tests count the fsyncs of plain calls; a poll answered
		// from a batch its ack claimed ahead (prefetch.go) needs none of
		// its own. prefetch_test.go counts those.
		o.PrefetchHold = -1
	})
	return b, h
}

func newBlockingSync() *blockingSync {
	return &blockingSync{entered: make(chan struct{}, 16), release: make(chan error)}
}

func (h *blockingSync) hook(sync func() error) error {
	if h.free.Load() {
		return sync()
	}
	h.entered <- struct{}{}
	if err := <-h.release; err != nil {
		return err
	}
	err := sync()
	h.synced.Add(1)
	return err
}

// TestRocksStore_SyncAlwaysWaitsForFsync: with SyncAlways no caller is
// answered before the fsync of its batch has completed, while its writes
// are already visible to other calls (the window storage/doc.go
// describes).
func TestRocksStore_SyncAlwaysWaitsForFsync(t *testing.T) {
	t.Parallel()
	b, h := setupHeldSync(t)
	type result struct {
		ids    []storage.ItemID
		synced int64
		err    error
	}
	done := make(chan result, 1)
	go func() {
		res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("x")}}, Now: at(0)})
		r := result{synced: h.synced.Load(), err: err}
		if err == nil {
			r.ids = []storage.ItemID{res[0].ID}
		}
		done <- r
	}()
	<-h.entered
	// The batch is written and its fsync is held: the item is visible
	// (Stats counts it), and the enqueue has not been answered.
	require.Equal(t, int64(1), b.stats("q", at(0)).Ready)
	select {
	case r := <-done:
		t.Fatalf("enqueue answered before its fsync: %+v", r)
	default:
	}
	h.release <- nil
	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, int64(1), r.synced, "answered only after the real fsync ran")

	// A poll that claims the item is likewise held until its own fsync.
	polled := make(chan storage.PollResult, 1)
	go func() {
		res, err := b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 1, Lease: time.Minute, Now: at(time.Second)})
		if err != nil {
			t.Error(err)
		}
		polled <- res
	}()
	<-h.entered
	select {
	case <-polled:
		t.Fatal("poll answered before its fsync")
	default:
	}
	h.release <- nil
	require.Equal(t, r.ids, itemIDs((<-polled).Items))
	require.Equal(t, int64(2), h.synced.Load())
	h.free.Store(true)
}

// TestRocksStore_FsyncFailureInWindow is the crash window of the pipeline:
// an enqueue is written, a poll claims the item in the next batch, and the
// fsync covering both fails (as a crash before it would leave them
// unsynced). Neither caller is told it succeeded, the store refuses every
// later call, and after a reopen the database is consistent and the item
// is delivered again: at-least-once holds whichever writes survived.
func TestRocksStore_FsyncFailureInWindow(t *testing.T) {
	t.Parallel()
	b, h := setupHeldSync(t)
	var wg sync.WaitGroup
	var enqErr, pollErr error
	var polled storage.PollResult
	wg.Go(func() {
		_, enqErr = b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("x")}}, Now: at(0)})
	})
	<-h.entered // the enqueue's batch is written; its fsync is held
	wg.Go(func() {
		polled, pollErr = b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 1, Lease: time.Minute, Now: at(time.Second)})
	})
	// The poll's batch is written behind the held fsync: it claims the
	// item the unsynced enqueue wrote.
	require.Eventually(t, func() bool { return b.stats("q", at(time.Second)).Inflight == 1 }, 30*time.Second, time.Millisecond)
	h.release <- errors.New("injected: disk gone")
	// The poll's batch fails too, with no fsync of its own: after a failed
	// fsync a later one proves nothing (syncFor).
	wg.Wait()
	select {
	case <-h.entered:
		t.Fatal("an fsync after the store failed")
	default:
	}
	require.Error(t, enqErr)
	require.Error(t, pollErr)
	require.Empty(t, polled.Items)
	_, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{}}, Now: at(2 * time.Second)})
	require.ErrorIs(t, err, storage.ErrUnavailable)
	require.Error(t, b.s.Failed())

	// Reopen without the failing hook: the database decides.
	b.reopenWithoutSyncHook()
	b.check()
	st := b.stats("q", at(time.Second))
	require.Equal(t, int64(1), st.Ready+st.Inflight, "the item survives the process (its writes reached the WAL)")
	b.sweep(at(2 * time.Minute))
	res := b.poll("q", 1, time.Minute, at(2*time.Minute))
	require.Len(t, res.Items, 1, "the unanswered enqueue's item is delivered")
	require.Equal(t, []byte("x"), res.Items[0].Payload)
}

// TestRocksStore_RecoverAfterFailedWrite: after a failed fsync every call
// fails with ErrUnavailable; Recover reopens the store from its database
// in place, and what was acknowledged before the failure is there.
func TestRocksStore_RecoverAfterFailedWrite(t *testing.T) {
	t.Parallel()
	b, failing := setupFailingSync(t)
	ok, err := b.s.Recover()
	require.NoError(t, err)
	require.False(t, ok, "nothing to recover")
	acked := b.enqueue("q", at(0), storage.EnqueueItem{Payload: []byte("acked")})

	failing.Store(true)
	_, err = b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("failed")}}, Now: at(time.Second)})
	require.ErrorIs(t, err, storage.ErrUnavailable)
	require.ErrorContains(t, b.s.Failed(), "the disk is full")
	_, err = b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 1, Lease: time.Minute, Now: at(time.Second)})
	require.ErrorIs(t, err, storage.ErrUnavailable, "every call fails until recovered")

	failing.Store(false)
	ok, err = b.s.Recover()
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, b.s.Failed())
	b.check()
	st := b.stats("q", at(2*time.Second))
	require.Contains(t, []int64{1, 2}, st.Ready, "the acknowledged item, and the failed one if its write reached the WAL")
	res := b.poll("q", 2, time.Minute, at(2*time.Second))
	require.Equal(t, acked[0], res.Items[0].ID)
	b.enqueue("q", at(3*time.Second), storage.EnqueueItem{Payload: []byte("after")})
}

// TestCheckIndexes: the invariant check (on after every batch with -tags
// invariants) catches an index that disagrees with the counters.
func TestCheckIndexes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueueN("q", at(0), 3)
	res := b.poll("q", 1, time.Minute, at(0))
	q := b.s.queue("q")
	require.NotPanics(t, func() { checkIndexes([]*queueState{q}) })

	q.mu.Lock()
	q.ready.n++ // an item the counters do not know
	q.mu.Unlock()
	require.PanicsWithValue(t, `rocksstore invariant: queue "q": serve order holds 3 items, counters say ready 2 + delayed 0`,
		func() { checkIndexes([]*queueState{q}) })
	q.mu.Lock()
	q.ready.n--
	q.mu.Unlock()

	q.leases[res.Lease].released++ // an inflight item that vanished
	require.Panics(t, func() { checkIndexes([]*queueState{q}) })
	q.leases[res.Lease].released--
}

// TestRocksStore_CorruptionIsReported: a damaged record met by a call is
// counted (Corruption), so the node can say so (/readyz, metrics) instead
// of failing one queue's polls silently forever.
func TestRocksStore_CorruptionIsReported(t *testing.T) {
	t.Parallel()
	// Without the ready-record cache: a claim must read the damaged
	// record (with it, the claim would use the copy the enqueue left).
	b := setup(t, func(o *Options) { o.ReadyCacheBytes = -1 })
	ids := b.enqueueN("q", at(0), 3)
	n, first := b.s.Corruption()
	require.Zero(t, n)
	require.NoError(t, first)

	k := dbkeys.AvailableKey("q", ids[0])
	good, ok, err := b.s.getRaw(k)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, b.s.db.put(k, []byte{0xff, 0x01}, true)) // a damaged record at the head
	for range 2 {
		_, err = b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 1, Lease: time.Minute, Now: at(time.Second)})
		require.ErrorIs(t, err, storage.ErrCorrupt)
	}
	n, first = b.s.Corruption()
	require.Equal(t, uint64(2), n)
	require.ErrorIs(t, first, storage.ErrCorrupt)
	require.Equal(t, uint64(2), b.stats("q", at(time.Second)).CorruptErrors, "the queue's stats say so")
	b.enqueueN("other", at(0), 1)
	require.Zero(t, b.stats("other", at(time.Second)).CorruptErrors)

	require.NoError(t, b.s.db.put(k, good, true)) // repaired, for the cleanup's Check
	res := b.poll("q", 3, time.Minute, at(2*time.Second))
	require.Len(t, res.Items, 3)
}

// TestRocksStore_LoneCallerSyncsInline: with SyncAlways a call with
// nobody behind it fsyncs its own batch (no goroutine hand-off); a batch
// written while that fsync runs goes to the syncer goroutine and is not
// answered before a second fsync.
func TestRocksStore_LoneCallerSyncsInline(t *testing.T) {
	t.Parallel()
	b, h := setupHeldSync(t)
	before := b.s.Metrics()
	first := make(chan error, 1)
	go func() {
		_, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("a")}}, Now: at(0)})
		first <- err
	}()
	<-h.entered // the first enqueue's own goroutine holds the fsync
	second := make(chan error, 1)
	go func() {
		_, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("b")}}, Now: at(0)})
		second <- err
	}()
	// The second batch is written behind the held fsync and waits for the
	// next. (Its item counts as ready a little earlier, before the batch
	// is handed to the fsync: waiting for that instead let the first
	// fsync end first, now and then, under load.)
	require.Eventually(t, func() bool { return b.s.unsyncedBatches() == 1 }, 30*time.Second, time.Millisecond)
	h.release <- nil
	require.NoError(t, <-first)
	m := b.s.Metrics().Sub(before)
	require.Equal(t, uint64(1), m.InlineSyncs, "the lone caller ran its own fsync")
	<-h.entered // the syncer goroutine's fsync for the second batch
	select {
	case err := <-second:
		t.Fatalf("second enqueue answered before its fsync (err %v)", err)
	default:
	}
	h.release <- nil
	require.NoError(t, <-second)
	m = b.s.Metrics().Sub(before)
	require.Equal(t, uint64(2), m.WALSyncs)
	require.Equal(t, uint64(1), m.InlineSyncs, "the second fsync ran on the syncer goroutine")
	require.Equal(t, int64(2), h.synced.Load())
	h.free.Store(true)
}

// TestRocksStore_EarlyFsyncAnswersAfterIt: with SyncAlways a batch of 32
// items or more of asynchronous calls (as the lean RPC engine hands them
// over) has its fsync begun by a syncer as soon as its record is in the
// WAL file, while the commit still inserts into the memtables, and its
// calls, enqueue, poll and ack alike, are still answered only once that
// fsync has run. A lone synchronous call of as many items keeps its
// inline fsync (fsyncEarlyLocked says why).
func TestRocksStore_EarlyFsyncAnswersAfterIt(t *testing.T) {
	t.Parallel()
	b, h := setupHeldSync(t)
	require.True(t, b.s.pipe.logged)
	before := b.s.Metrics()
	items := make([]storage.EnqueueItem, earlyFsyncItems)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: []byte{byte(i)}}
	}
	held := func(what string, call func(done chan<- error)) {
		t.Helper()
		// The syncer that answered the last call may still be ending
		// its turn: a call that came before it ends waits for the next
		// fsync instead (no early fsync).
		require.Eventually(t, func() bool {
			b.s.pipe.mu.Lock()
			defer b.s.pipe.mu.Unlock()
			return !b.s.pipe.syncing
		}, 30*time.Second, time.Millisecond)
		done := make(chan error, 1)
		synced := h.synced.Load()
		call(done)
		<-h.entered
		select {
		case err := <-done:
			t.Fatalf("%s answered before its fsync (err %v)", what, err)
		default:
		}
		h.release <- nil
		require.NoError(t, <-done)
		require.Equal(t, synced+1, h.synced.Load(), "%s: answered after the real fsync", what)
	}
	var ids []storage.ItemID
	held("enqueue", func(done chan<- error) {
		b.s.EnqueueAsync(b.ctx, storage.EnqueueParams{Queue: "q", Items: items, Now: at(0)},
			func(res []storage.EnqueueResult, err error) {
				for _, r := range res {
					ids = append(ids, r.ID)
				}
				done <- err
			})
	})
	var res storage.PollResult
	held("poll", func(done chan<- error) {
		b.s.PollAsync(b.ctx, storage.PollParams{Queue: "q", Max: earlyFsyncItems, Lease: time.Minute, Now: at(time.Second)},
			func(r storage.PollResult, err error) { res = r; done <- err })
	})
	require.Equal(t, ids, itemIDs(res.Items))
	held("ack", func(done chan<- error) {
		b.s.AckAsync(b.ctx, storage.AckParams{Queue: "q", Lease: res.Lease, IDs: ids, Now: at(2 * time.Second)},
			func(codes []storage.Code, err error) {
				for _, c := range codes {
					if c != storage.CodeOK {
						err = fmt.Errorf("ack code %v", c)
					}
				}
				done <- err
			})
	})
	m := b.s.Metrics().Sub(before)
	require.Equal(t, uint64(3), m.WALSyncs)
	require.Equal(t, uint64(3), m.EarlySyncs, "each fsync begun early, by a syncer")
	require.Equal(t, uint64(0), m.InlineSyncs)

	held("synchronous enqueue", func(done chan<- error) {
		go func() {
			_, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: items, Now: at(3 * time.Second)})
			done <- err
		}()
	})
	m = b.s.Metrics().Sub(before)
	require.Equal(t, uint64(3), m.EarlySyncs)
	require.Equal(t, uint64(1), m.InlineSyncs, "a lone synchronous call fsyncs inline")
	require.Equal(t, int64(earlyFsyncItems), b.stats("q", at(3*time.Second)).Ready)
	h.free.Store(true)
}

// TestRocksStore_WaitingCallersShareTheFsync: with SyncAlways and nobody
// fsyncing, a leader that finds callers waiting once its batch is written
// builds their batch too and then fsyncs once for both, instead of
// handing its own batch to the syncer goroutine and leaving theirs to the
// fsync after.
func TestRocksStore_WaitingCallersShareTheFsync(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *Options) { o.Sync = SyncAlways })
	s := b.s
	params := func(payload string) storage.EnqueueParams {
		return storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte(payload)}}, Now: at(0)}
	}
	b.enqueueN("q", at(0), 1) // the queue exists: no config write below
	before := s.Metrics()

	// The leader's op waits inside its batch until a second caller waits
	// behind it.
	// (The leader yields before it takes its first batch, submitGroup:
	// the second caller starts only once the batch holds the first op.)
	gate, inBatch := make(chan struct{}), make(chan struct{})
	_, valid, fn, err := s.enqueueOp(b.ctx, params("first"))
	require.NoError(t, err)
	led := make(chan error, 1)
	go func() {
		if err := s.enter("test"); err != nil {
			led <- err
			return
		}
		defer s.exit()
		_, err := s.submit("q", valid, func(o *opTx) error {
			close(inBatch)
			<-gate
			return fn(o)
		})
		led <- err
	}()
	second := make(chan error, 1)
	select {
	case <-inBatch:
	case err := <-led:
		t.Fatalf("the first call ended before its batch began: %v", err)
	}
	go func() {
		_, err := s.Enqueue(b.ctx, params("second"))
		second <- err
	}()
	require.Eventually(t, func() bool {
		s.pipe.mu.Lock()
		defer s.pipe.mu.Unlock()
		return len(s.pipe.pending) == 1
	}, 30*time.Second, time.Millisecond)
	close(gate)
	require.NoError(t, <-led)
	require.NoError(t, <-second)

	m := s.Metrics().Sub(before)
	require.Equal(t, uint64(2), m.Commits, "two batches")
	require.Equal(t, uint64(1), m.WALSyncs, "one fsync for both")
	require.Equal(t, uint64(1), m.InlineSyncs, "run by the leader")
	require.Equal(t, int64(3), b.stats("q", at(0)).Ready)
}

// TestRocksStore_PayloadsOutliveBatches: the records a batch encodes live
// in an arena that the next batch reuses, so nothing a caller receives
// may point into it. Producers and consumers race (some polls take items
// enqueued in their own batch, read back from the overlay), every polled
// payload is kept, and at the end each must still be the one enqueued.
func TestRocksStore_PayloadsOutliveBatches(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *Options) { o.Sync = SyncNone })
	const producers, perProducer = 4, 400
	payloadOf := func(p, i int) []byte {
		return []byte(fmt.Sprintf("producer %d item %d %s", p, i, strings.Repeat("x", (p*perProducer+i)%300)))
	}
	var wg sync.WaitGroup
	want := make(map[storage.ItemID]string)
	var mu sync.Mutex
	for p := range producers {
		wg.Go(func() {
			for i := 0; i < perProducer; i += 2 {
				items := []storage.EnqueueItem{{Payload: payloadOf(p, i)}, {Payload: payloadOf(p, i+1)}}
				res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: items, Now: time.Unix(1000, 0)})
				require.NoError(t, err)
				mu.Lock()
				for j, r := range res {
					want[r.ID] = string(items[j].Payload)
				}
				mu.Unlock()
			}
		})
	}
	var got []storage.Item
	var gotMu sync.Mutex
	var taken atomic.Int64
	for range 4 {
		wg.Go(func() {
			for taken.Load() < producers*perProducer {
				pr, err := b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 3, Lease: time.Minute, Now: time.Unix(1000, 0)})
				require.NoError(t, err)
				taken.Add(int64(len(pr.Items)))
				gotMu.Lock()
				got = append(got, pr.Items...)
				gotMu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Len(t, got, producers*perProducer)
	for _, it := range got {
		require.Equal(t, want[it.ID], string(it.Payload), "item %s", it.ID)
	}
}

// TestRocksStore_FailedNackLeavesNothing: a nack that fails on its third
// item (a damaged record) undoes what it did for the first two, in
// memory too: they stay inflight under their lease, nothing is ready, and
// the lease still acks all three once the record is repaired.
func TestRocksStore_FailedNackLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pr := b.leased("q", 3)
	ids := []storage.ItemID{pr.Items[0].ID, pr.Items[1].ID, pr.Items[2].ID}

	k := dbkeys.InProgressKey("q", ids[2])
	good, ok, err := b.s.getRaw(k)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, b.s.db.put(k, []byte{0xff, 0x01}, true))
	zero := time.Duration(0)
	_, err = b.s.Nack(b.ctx, storage.NackParams{Queue: "q", Lease: pr.Lease, IDs: ids, Delay: &zero, Now: at(2 * time.Second)})
	require.ErrorIs(t, err, storage.ErrCorrupt)

	st := b.stats("q", at(2*time.Second))
	require.Zero(t, st.Ready, "the first two nacks were undone")
	require.Zero(t, b.cacheState(), "their ready-record cache entries too")
	require.Equal(t, int64(3), st.Inflight)
	require.Empty(t, b.poll("q", 3, time.Minute, at(2*time.Second)).Items)

	require.NoError(t, b.s.db.put(k, good, true))
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK, storage.CodeOK}, b.ack("q", pr.Lease, at(3*time.Second), ids...))
	require.Zero(t, b.stats("q", at(3*time.Second)).Inflight)
}

// A Go execution trace shows each batch of the pipeline, with how many
// calls it held, and each WAL fsync (traceBatch).
func TestRocksStore_TraceRegions(t *testing.T) {
	b := setup(t, func(o *Options) { o.Sync = SyncAlways })
	var buf bytes.Buffer
	require.NoError(t, trace.Start(&buf))
	_, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("a")}, {Payload: []byte("b")}}, Now: at(0)})
	require.NoError(t, err)
	pr, err := b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 2, Lease: time.Minute, Now: at(time.Second)})
	trace.Stop()
	require.NoError(t, err)
	require.Len(t, pr.Items, 2)
	for _, want := range []string{"rocksstore.batch", "calls=1", "rocksstore.fsync"} {
		require.True(t, bytes.Contains(buf.Bytes(), []byte(want)), "the trace has no %q", want)
	}
}

// unsyncedBatches is how many written batches wait for an fsync.
func (s *Store) unsyncedBatches() int {
	s.pipe.mu.Lock()
	defer s.pipe.mu.Unlock()
	return len(s.pipe.unsynced)
}

// A batch that reads nothing through its transaction (enqueues without
// dedup keys, acks) is written without one; a claim's GetForUpdate and a
// dedup key's lookup begin one. Either way the writes are what a reopen
// finds.
func TestPipeline_BatchesThatReadNothingCommitWithoutTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	plain := func() uint64 { return b.s.m.plainCommits.Load() }
	commits := func() uint64 { return b.s.m.commits.Load() }
	p, c := plain(), commits()
	step := func(what string, wantPlain bool) {
		t.Helper()
		require.Equal(t, c+1, commits(), "%s: one commit", what)
		want := p
		if wantPlain {
			want++
		}
		require.Equal(t, want, plain(), "%s: without a transaction %v", what, wantPlain)
		p, c = plain(), commits()
	}

	b.enqueueN("q", at(0), 3)
	step("enqueue", true)
	res := b.poll("q", 2, time.Minute, at(time.Second))
	require.Len(t, res.Items, 2)
	step("poll", false)
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK}, b.ack("q", res.Lease, at(2*time.Second), res.Items[0].ID, res.Items[1].ID))
	step("ack", true)
	first := b.enqueue("q", at(3*time.Second), storage.EnqueueItem{Payload: []byte("d"), DedupKey: "k"})
	step("dedup enqueue", false)
	again := b.enqueue("q", at(4*time.Second), storage.EnqueueItem{Payload: []byte("d"), DedupKey: "k"})
	require.Equal(t, first, again, "the dedup record was written")

	b.reopen()
	st := b.stats("q", at(5*time.Second))
	require.Equal(t, int64(2), st.Ready)
	require.Equal(t, int64(0), st.Inflight)
	require.Equal(t, uint64(2), st.Acked)
	require.Len(t, b.poll("q", 10, time.Minute, at(6*time.Second)).Items, 2)
}

// oneBatch runs fns as ops of one batch, in this order, and requires each
// to succeed.
func (b *testBundle) oneBatch(fns ...func(o *opTx) error) {
	b.t.Helper()
	require.NoError(b.t, b.s.enter("test"))
	defer b.s.exit()
	ops := make([]*op, len(fns))
	for i, fn := range fns {
		require.NotNil(b.t, fn)
		ops[i] = newOp(1, fn)
	}
	batches := b.s.pipe.batches
	require.NoError(b.t, b.s.submitGroup("", ops))
	for i, o := range ops {
		require.NoError(b.t, o.err, "op %d", i)
	}
	require.Equal(b.t, batches+1, b.s.pipe.batches, "one batch")
}

// claimOp is a poll's claim as an op, whatever is ready when it is
// built (pollOp builds none when nothing is).
func (b *testBundle) claimOp(queue string, max int, lease time.Duration, now time.Time) (*storage.PollResult, func(o *opTx) error) {
	r := new(storage.PollResult)
	return r, func(o *opTx) error {
		q := b.s.queue(queue)
		if q == nil {
			return nil // no queue yet: nothing to claim
		}
		var err error
		*r, err = b.s.claim(o, q, nanos(now), max, int64(lease))
		return err
	}
}

func (b *testBundle) enqueueOp(queue string, now time.Time, payload string) ([]storage.EnqueueResult, func(o *opTx) error) {
	res, _, fn, err := b.s.enqueueOp(b.ctx, storage.EnqueueParams{Queue: queue, Items: []storage.EnqueueItem{{Payload: []byte(payload)}}, Now: now})
	require.NoError(b.t, err)
	return res, fn
}

func (b *testBundle) ackOp(queue string, l storage.LeaseID, now time.Time, ids ...storage.ItemID) ([]storage.Code, func(o *opTx) error) {
	_, codes, fn, err := b.s.ackOp(b.ctx, storage.AckParams{Queue: queue, Lease: l, IDs: ids, Now: now})
	require.NoError(b.t, err)
	return codes, fn
}

func (b *testBundle) nackOp(queue string, l storage.LeaseID, now time.Time, ids ...storage.ItemID) ([]storage.Code, func(o *opTx) error) {
	zero := time.Duration(0)
	_, codes, fn, err := b.s.nackOp(b.ctx, storage.NackParams{Queue: queue, Lease: l, IDs: ids, Delay: &zero, Now: now})
	require.NoError(b.t, err)
	return codes, fn
}

// leased enqueues n items into q at 0 and claims them all at 1 s under
// a lease of a minute.
func (b *testBundle) leased(q string, n int) storage.PollResult {
	b.t.Helper()
	b.enqueueN(q, at(0), n)
	pr := b.poll(q, n, time.Minute, at(time.Second))
	require.Len(b.t, pr.Items, n)
	return pr
}

// indexedKeys is how many keys the last batch put into its overlay's
// index (the overlay is reset when the next batch starts).
// reopenWithoutSyncHook closes the store and opens it again without its
// sync hook (one that failed fsyncs), so that the database decides.
func (b *testBundle) reopenWithoutSyncHook() {
	require.NoError(b.t, b.s.Close())
	b.opts.syncHook = nil
	s, err := Open(b.dir, b.opts)
	require.NoError(b.t, err)
	b.s = s
}

func (b *testBundle) indexedKeys() int { return len(b.s.pipe.slot.ov.idx) }

// Claims of items that an earlier batch enqueued, and acks under leases an
// earlier batch made, write their keys without the overlay's index
// (opTx.untouched); a nack, which makes an item available again, uses it.
func TestPipeline_UntouchedBatchesBuildNoOverlayIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pr := b.leased("q", 4)
	require.Zero(t, b.indexedKeys(), "poll")
	ok := []storage.Code{storage.CodeOK, storage.CodeOK}
	require.Equal(t, ok, b.ack("q", pr.Lease, at(2*time.Second), pr.Items[0].ID, pr.Items[1].ID))
	require.Zero(t, b.indexedKeys(), "ack of part of a lease")
	zero := time.Duration(0)
	codes, err := b.s.Nack(b.ctx, storage.NackParams{Queue: "q", Lease: pr.Lease, IDs: []storage.ItemID{pr.Items[2].ID}, Delay: &zero, Now: at(3 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, ok[:1], codes)
	require.NotZero(t, b.indexedKeys(), "nack")
	require.Equal(t, ok[:1], b.ack("q", pr.Lease, at(4*time.Second), pr.Items[3].ID))
	require.Zero(t, b.indexedKeys(), "ack of the rest of a lease")

	st := b.stats("q", at(5*time.Second))
	require.Equal(t, int64(1), st.Ready)
	require.Zero(t, st.Inflight)
	require.Zero(t, st.Leases)
}

// Within one batch, a claim or ack that follows a write of the same keys
// finds that write: an item nacked and claimed again, two acks under one
// lease, an ack and a nack under one lease, a claim of an old and a new
// item. The bundle's cleanup checks the database's invariants, and the
// invariants build checks that no key is written twice in a batch.
func TestPipeline_TouchedBatchesFindTheirKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ok := []storage.Code{storage.CodeOK}

	// Nacked, then claimed again in the same batch.
	first := b.leased("a", 1)
	nacked, nack := b.nackOp("a", first.Lease, at(2*time.Second), first.Items[0].ID)
	again, claim := b.claimOp("a", 1, time.Minute, at(2*time.Second))
	b.oneBatch(nack, claim)
	require.Equal(t, ok, nacked)
	require.Len(t, again.Items, 1)
	require.Equal(t, first.Items[0].ID, again.Items[0].ID)
	require.Equal(t, 2, int(again.Items[0].Attempts))

	// Two acks under one lease, then an ack and a nack under another.
	b.enqueueN("b", at(0), 4)
	pr := b.poll("b", 2, time.Minute, at(time.Second))
	require.Len(t, pr.Items, 2)
	a1, ack1 := b.ackOp("b", pr.Lease, at(2*time.Second), pr.Items[0].ID)
	a2, ack2 := b.ackOp("b", pr.Lease, at(2*time.Second), pr.Items[1].ID)
	b.oneBatch(ack1, ack2)
	require.Equal(t, ok, a1)
	require.Equal(t, ok, a2)
	pr = b.poll("b", 2, time.Minute, at(3*time.Second))
	require.Len(t, pr.Items, 2)
	a3, ack3 := b.ackOp("b", pr.Lease, at(4*time.Second), pr.Items[0].ID)
	n4, nack4 := b.nackOp("b", pr.Lease, at(4*time.Second), pr.Items[1].ID)
	last, claim4 := b.claimOp("b", 2, time.Minute, at(4*time.Second))
	b.oneBatch(ack3, nack4, claim4)
	require.Equal(t, ok, a3)
	require.Equal(t, ok, n4)
	require.Len(t, last.Items, 1)
	require.Equal(t, pr.Items[1].ID, last.Items[0].ID)

	// A claim of an item an earlier batch enqueued and one this batch did.
	old := b.enqueueN("c", at(0), 1)
	added, enq := b.enqueueOp("c", at(time.Second), "new")
	both, claim5 := b.claimOp("c", 2, time.Minute, at(2*time.Second))
	b.oneBatch(enq, claim5)
	require.Len(t, both.Items, 2)
	require.Equal(t, old[0], both.Items[0].ID)
	require.Equal(t, added[0].ID, both.Items[1].ID)

	b.reopen()
	for q, want := range map[string]storage.QueueStats{
		"a": {Inflight: 1, Leases: 1},
		"b": {Inflight: 1, Leases: 1},
		"c": {Inflight: 2, Leases: 1},
	} {
		st := b.stats(q, at(5*time.Second))
		require.Equal(t, want.Inflight, st.Inflight, q)
		require.Equal(t, want.Leases, st.Leases, q)
		require.Zero(t, st.Ready, q)
	}
}

// Random groups of enqueues, claims, acks, nacks and lease expiries, each
// group applied as one batch, so that the overlay's fast paths (opTx.untouched) and its
// index meet in every order: an item nacked and claimed again, two acks
// or an ack and a nack under one lease, claims of items the same batch
// enqueued. After every batch the queue's counts must be what the ops'
// own results say; the invariants build checks each batch's keys and
// indexes, and the bundle's cleanup checks the database.
func TestPipeline_RandomBatches(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rng := rand.New(rand.NewPCG(1, 2))
	type lease struct {
		id   storage.LeaseID
		exp  time.Duration
		held []storage.ItemID
	}
	var leases []*lease
	attempts := map[storage.ItemID]uint32{}
	b.enqueueN("q", at(0), 1) // the queue exists from here on
	var ready, inflight, dead, expired int64 = 1, 0, 0, 0
	now := time.Duration(0)
	// pick returns a few ids of a random lease (some already settled, so
	// their codes say so), or nil.
	pick := func() (*lease, []storage.ItemID) {
		if len(leases) == 0 {
			return nil, nil
		}
		l := leases[rng.IntN(len(leases))]
		var ids []storage.ItemID
		for _, id := range l.held {
			if rng.IntN(3) > 0 {
				ids = append(ids, id)
			}
		}
		return l, ids
	}
	for range 300 {
		now += time.Second
		var fns []func(o *opTx) error
		var after []func()
		for range 1 + rng.IntN(6) {
			switch rng.IntN(5) {
			case 0:
				res, fn := b.enqueueOp("q", at(now), "p")
				fns = append(fns, fn)
				after = append(after, func() {
					require.Equal(t, storage.CodeOK, res[0].Code)
					ready++
				})
			case 1:
				d := time.Hour
				if rng.IntN(4) == 0 {
					d = 2 * time.Second // expires two groups later
				}
				pr, fn := b.claimOp("q", 1+rng.IntN(4), d, at(now))
				fns = append(fns, fn)
				exp := now + d
				after = append(after, func() {
					if len(pr.Items) == 0 {
						return
					}
					l := &lease{id: pr.Lease, exp: exp}
					for _, it := range pr.Items {
						l.held = append(l.held, it.ID)
						attempts[it.ID] = it.Attempts
					}
					leases = append(leases, l)
					ready -= int64(len(pr.Items))
					inflight += int64(len(pr.Items))
				})
			case 2:
				// The sweeper's expiry, in the same batch as the rest.
				var res storage.SweepResult
				when := now
				fns = append(fns, func(o *opTx) error {
					b.s.expireDue(o, nanos(at(when)), 1000, &res, map[string]bool{})
					return nil
				})
				after = append(after, func() {
					n := int64(0)
					for _, l := range leases {
						if l.exp <= when {
							n += int64(len(l.held))
							l.held = nil
						}
					}
					require.Equal(t, n, int64(res.Requeued+res.DeadLettered))
					inflight -= n
					expired += n
					ready += int64(res.Requeued)
					dead += int64(res.DeadLettered)
				})
			case 3, 4:
				l, ids := pick()
				if len(ids) == 0 {
					continue
				}
				nack := rng.IntN(2) == 0
				var codes []storage.Code
				var fn func(o *opTx) error
				if nack {
					codes, fn = b.nackOp("q", l.id, at(now), ids...)
				} else {
					codes, fn = b.ackOp("q", l.id, at(now), ids...)
				}
				fns = append(fns, fn)
				after = append(after, func() {
					for i, c := range codes {
						if c != storage.CodeOK {
							continue
						}
						l.held = slices.DeleteFunc(l.held, func(id storage.ItemID) bool { return id == ids[i] })
						inflight--
						switch {
						case !nack:
						case attempts[ids[i]] >= storage.DefaultMaxAttempts:
							dead++
						default:
							ready++
						}
					}
				})
			}
		}
		if len(fns) == 0 {
			continue
		}
		b.oneBatch(fns...)
		for _, f := range after {
			f()
		}
		leases = slices.DeleteFunc(leases, func(l *lease) bool { return len(l.held) == 0 })
		st := b.stats("q", at(now))
		require.Equal(t, [4]int64{ready, inflight, dead, int64(len(leases))}, [4]int64{st.Ready, st.Inflight, st.Dead, st.Leases})
	}
	require.Positive(t, dead, "some items went to the dead letters")
	require.Positive(t, expired, "some leases expired")
	b.reopen()
	st := b.stats("q", at(now))
	require.Equal(t, [4]int64{ready, inflight, dead, int64(len(leases))}, [4]int64{st.Ready, st.Inflight, st.Dead, st.Leases})
}

// An op that fails after changing entries an earlier op of its batch
// wrote gets them back as they were, and its own entries end: here a
// claim of the item the batch enqueued fails after taking it, and the
// next op of the batch claims the same item.
func TestPipeline_FailedOpKeepsEarlierWrites(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueueN("q", at(0), 1) // the queue exists
	b.poll("q", 1, time.Minute, at(0))
	added, enq := b.enqueueOp("q", at(time.Second), "x")
	fail := errors.New("fails after its claim")
	failed, claim := b.claimOp("q", 1, time.Minute, at(time.Second))
	failing := func(o *opTx) error {
		if err := claim(o); err != nil {
			return err
		}
		require.Len(t, failed.Items, 1)
		return fail
	}
	got, claim2 := b.claimOp("q", 1, time.Minute, at(time.Second))
	require.NoError(t, b.s.enter("test"))
	ops := []*op{newOp(1, enq), newOp(1, failing), newOp(1, claim2)}
	require.NoError(t, b.s.submitGroup("", ops))
	b.s.exit()
	require.NoError(t, ops[0].err)
	require.ErrorIs(t, ops[1].err, fail)
	require.NoError(t, ops[2].err)
	require.Len(t, got.Items, 1)
	require.Equal(t, added[0].ID, got.Items[0].ID)
	require.Equal(t, "x", string(got.Items[0].Payload))

	b.reopen()
	st := b.stats("q", at(2*time.Second))
	require.Equal(t, int64(2), st.Inflight)
	require.Equal(t, int64(2), st.Leases)
	require.Zero(t, st.Ready)
}

// setupFailingSync opens a store with SyncAlways whose WAL fsyncs fail
// (as on a full disk) while the returned flag is set.
func setupFailingSync(t *testing.T) (*testBundle, *atomic.Bool) {
	t.Helper()
	failing := new(atomic.Bool)
	b := setup(t, func(o *Options) {
		o.Sync = SyncAlways
		o.syncHook = func(sync func() error) error {
			if failing.Load() {
				return errors.New("injected: No space left on device")
			}
			return sync()
		}
	})
	return b, failing
}
