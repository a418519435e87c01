package rocksstore

import (
	"runtime"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// pairOut is what an asynchronous ack and poll handed over back to back
// returned.
type pairOut struct {
	codes []storage.Code
	pr    storage.PollResult
	err   error
}

// ackThenPoll hands an ack of lease's ids and a poll to the pipeline
// without waiting, as a connection's reader does with a pipelined pair.
func ackThenPoll(b *testBundle, lease storage.LeaseID, ids []storage.ItemID) (acks chan pairOut, polls chan pairOut) {
	acks, polls = make(chan pairOut, 1), make(chan pairOut, 1)
	b.s.AckAsync(b.ctx, storage.AckParams{Queue: "q", Lease: lease, IDs: ids, Now: at(1)}, func(codes []storage.Code, err error) {
		acks <- pairOut{codes: codes, err: err}
	})
	b.s.PollAsync(b.ctx, storage.PollParams{Queue: "q", Max: 1, Lease: time.Minute, Now: at(1)}, func(pr storage.PollResult, err error) {
		polls <- pairOut{pr: pr, err: err}
	})
	return acks, polls
}

// TestRocksStore_HoldSyncSharesOneFsync: an ack and a poll handed over
// back to back take two fsyncs (the ack's starts before the poll is
// written); between HoldSync and ReleaseSync they take one, which no
// fsync starts before the release, and neither is answered before it.
func TestRocksStore_HoldSyncSharesOneFsync(t *testing.T) {
	t.Parallel()
	b, h := setupHeldSync(t)
	h.free.Store(true)
	res, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("a")}, {Payload: []byte("b")}, {Payload: []byte("c")}}, Now: at(0)})
	require.NoError(t, err)
	first, err := b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 1, Lease: time.Minute, Now: at(0)})
	require.NoError(t, err)
	require.Len(t, first.Items, 1)
	h.free.Store(false)

	// Without a hold: the ack's fsync starts as soon as its batch is
	// written (the hook holds it), so the poll's batch waits for another.
	acks := make(chan pairOut, 1)
	b.s.AckAsync(b.ctx, storage.AckParams{Queue: "q", Lease: first.Lease, IDs: []storage.ItemID{first.Items[0].ID}, Now: at(1)}, func(codes []storage.Code, err error) {
		acks <- pairOut{codes: codes, err: err}
	})
	<-h.entered
	polls := make(chan pairOut, 1)
	b.s.PollAsync(b.ctx, storage.PollParams{Queue: "q", Max: 1, Lease: time.Minute, Now: at(1)}, func(pr storage.PollResult, err error) {
		polls <- pairOut{pr: pr, err: err}
	})
	h.release <- nil
	a := <-acks
	require.NoError(t, a.err)
	require.Equal(t, []storage.Code{storage.CodeOK}, a.codes)
	<-h.entered // the poll's fsync: a second one
	h.release <- nil
	p := <-polls
	require.NoError(t, p.err)
	require.Len(t, p.pr.Items, 1)
	require.Equal(t, res[1].ID, p.pr.Items[0].ID)
	require.EqualValues(t, 2, h.synced.Load())

	// With a hold: both batches are written, no fsync starts, nobody is
	// answered; the release starts one fsync for both.
	b.s.HoldSync()
	acks, polls = ackThenPoll(b, p.pr.Lease, []storage.ItemID{p.pr.Items[0].ID})
	require.Len(t, h.entered, 0, "no fsync started while held")
	require.Len(t, acks, 0)
	require.Len(t, polls, 0)
	b.s.ReleaseSync()
	<-h.entered
	h.release <- nil
	a, p = <-acks, <-polls
	require.NoError(t, a.err)
	require.Equal(t, []storage.Code{storage.CodeOK}, a.codes)
	require.NoError(t, p.err)
	require.Len(t, p.pr.Items, 1)
	require.Equal(t, res[2].ID, p.pr.Items[0].ID)
	require.EqualValues(t, 3, h.synced.Load(), "one fsync covered the ack and the poll")
	require.Len(t, h.entered, 0)

	// Nested holds: only the last release starts the fsync.
	b.s.HoldSync()
	b.s.HoldSync()
	done := make(chan error, 1)
	b.s.AckAsync(b.ctx, storage.AckParams{Queue: "q", Lease: p.pr.Lease, IDs: []storage.ItemID{p.pr.Items[0].ID}, Now: at(1)}, func(_ []storage.Code, err error) { done <- err })
	b.s.ReleaseSync()
	require.Len(t, h.entered, 0, "still held once")
	b.s.ReleaseSync()
	<-h.entered
	h.release <- nil
	require.NoError(t, <-done)
	h.free.Store(true)
	require.PanicsWithValue(t, "rocksstore: ReleaseSync without HoldSync", b.s.ReleaseSync)
}

// TestRocksStore_HoldSyncAndASynchronousCaller: a synchronous caller that
// finds nobody fsyncing fsyncs inline, held or not, so a hold never makes
// it wait for the release.
func TestRocksStore_HoldSyncAndASynchronousCaller(t *testing.T) {
	t.Parallel()
	b := setup(t, func(o *Options) { o.Sync = SyncAlways })
	b.s.HoldSync()
	defer b.s.ReleaseSync()
	_, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("x")}}, Now: at(0)})
	require.NoError(t, err)
	pr, err := b.s.Poll(b.ctx, storage.PollParams{Queue: "q", Max: 1, Lease: time.Minute, Now: at(0)})
	require.NoError(t, err)
	require.Len(t, pr.Items, 1)
}

// TestRocksStore_CloseBreaksAHold: a holder's ack waits for an fsync its
// hold keeps back, Close waits for the ack, and the holder's next call
// waits to enter the store behind Close. Close breaks the hold, so the
// ack is made durable, Close returns, and the next call fails closed.
func TestRocksStore_CloseBreaksAHold(t *testing.T) {
	t.Parallel()
	opts := testOptions(t)
	opts.Sync = SyncAlways
	s, err := Open(t.TempDir(), opts)
	require.NoError(t, err)
	ctx := t.Context()
	_, err = s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("x")}}, Now: at(0)})
	require.NoError(t, err)
	pr, err := s.Poll(ctx, storage.PollParams{Queue: "q", Max: 1, Lease: time.Minute, Now: at(0)})
	require.NoError(t, err)
	require.Len(t, pr.Items, 1)

	type out struct{ ack, close, poll error }
	result := make(chan out, 1)
	go func() {
		var o out
		s.HoldSync()
		acked := make(chan error, 1)
		s.AckAsync(ctx, storage.AckParams{Queue: "q", Lease: pr.Lease, IDs: []storage.ItemID{pr.Items[0].ID}, Now: at(1)}, func(_ []storage.Code, err error) { acked <- err })
		closed := make(chan error, 1)
		go func() { closed <- s.Close() }()
		// Wait until Close waits for the store (a waiting writer makes
		// TryRLock fail), or has already closed it.
	wait:
		for s.life.TryRLock() {
			s.life.RUnlock()
			select {
			case err := <-closed:
				closed <- err
				break wait
			default:
				runtime.Gosched()
			}
		}
		polled := make(chan error, 1)
		s.PollAsync(ctx, storage.PollParams{Queue: "q", Max: 1, Lease: time.Minute, Now: at(1)}, func(_ storage.PollResult, err error) { polled <- err })
		s.ReleaseSync()
		o.ack, o.close, o.poll = <-acked, <-closed, <-polled
		result <- o
	}()
	select {
	case o := <-result:
		require.NoError(t, o.ack, "the held ack was made durable")
		require.NoError(t, o.close)
		require.ErrorIs(t, o.poll, storage.ErrClosed)
	case <-clock.New().After(30 * time.Second):
		t.Fatal("Close, the held ack and the next call deadlocked")
	}
}
