package rocksstore

import (
	"bytes"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// eioSync is a syncHook that fails the fsyncs while fail is set.
type eioSync struct{ fail atomic.Bool }

func (h *eioSync) hook(sync func() error) error {
	if h.fail.Load() {
		return errors.New("injected: EIO")
	}
	return sync()
}

// waitWriterPending returns once a writer (Close or Recover) waits
// for s.life: a waiting writer makes TryRLock fail.
func waitWriterPending(s *Store) {
	for s.life.TryRLock() {
		s.life.RUnlock()
		runtime.Gosched()
	}
}

// waitBlockedIn returns once a goroutine whose stack holds fn is parked
// with wait reason reason (e.g. "sync.RWMutex.RLock").
func waitBlockedIn(t *testing.T, reason, fn string) {
	t.Helper()
	deadline := clock.New().After(30 * time.Second)
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		for _, g := range bytes.Split(buf[:n], []byte("\n\n")) {
			if bytes.Contains(g, []byte("["+reason)) && bytes.Contains(g, []byte(fn)) {
				return
			}
		}
		select {
		case <-deadline:
			t.Fatalf("no goroutine in %s blocked in %s", fn, reason)
		default:
			runtime.Gosched()
		}
	}
}

// enterLate is the start of an asynchronous call (EnqueueAsync's
// enter), run by a connection's reader that holds the fsyncs back.
func enterLate(s *Store, entered chan<- error) {
	entered <- s.enter("enqueue")
}

// TestRocksStore_RecoverDoesNotMendHoldsCloseBroke (found by review,
// session 69): a store failed by an fsync error; Recover runs, and Close begins while Recover holds the
// store (Close breaks the holds, then waits to enter). A connection's
// reader holds the fsyncs back (HoldSync) and hands over an asynchronous
// enqueue whose enter was let in when Recover let go of the store (the
// reader's goroutine was queued behind it, as Close's enter). Recover's
// deferred mendHolds turned the holds back on, so the enqueue's batch was
// written and its fsync kept back by the hold; Close waited for the
// enqueue (it holds the store); the reader's next call waited to enter
// behind Close and never released its hold. Close, the enqueue and the
// reader hung for ever. Close broke the holds for good: Recover must not
// mend them once Close has begun.
func TestRocksStore_RecoverDoesNotMendHoldsCloseBroke(t *testing.T) {
	h := &eioSync{}
	opts := testOptions(t)
	opts.Sync = SyncAlways
	opts.syncHook = h.hook
	opts.PrefetchHold = -1
	s, err := Open(t.TempDir(), opts)
	require.NoError(t, err)
	ctx := t.Context()
	enq := func(p string) error {
		_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte(p)}}, Now: at(0)})
		return err
	}
	require.NoError(t, enq("a"))
	h.fail.Store(true)
	require.ErrorIs(t, enq("b"), storage.ErrUnavailable)
	h.fail.Store(false)
	require.Error(t, s.Failed())

	// The reader holds the fsyncs back from here on, as a connection's
	// reader between HoldSync and ReleaseSync.
	s.HoldSync()
	released := atomic.Bool{}
	release := func() {
		if released.CompareAndSwap(false, true) {
			s.ReleaseSync()
		}
	}
	defer release()

	// A call in flight keeps Recover waiting for the store.
	require.NoError(t, s.enter("test"))
	type recovered struct {
		ok  bool
		err error
	}
	recDone := make(chan recovered, 1)
	go func() {
		ok, err := s.Recover()
		recDone <- recovered{ok, err}
	}()
	waitWriterPending(s) // Recover broke the holds and waits
	closeDone := make(chan error, 1)
	go func() { closeDone <- s.Close() }()
	for !s.closing.Load() { // Close broke the holds, and waits behind Recover
		runtime.Gosched()
	}
	entered := make(chan error, 1)
	go enterLate(s, entered)
	waitBlockedIn(t, "sync.RWMutex.RLock", "rocksstore.enterLate")
	s.exit() // Recover goes on

	r := <-recDone
	require.NoError(t, r.err)
	require.True(t, r.ok, "Recover reopened the store")
	require.NoError(t, <-entered, "the reader's call entered when Recover let go")

	// Close entered, gave back and kept its promises (a synchronous op
	// whose inline fsync would cover the enqueue's batch had it come
	// later), and waits for the reader's call.
	waitWriterPending(s)
	// The rest of EnqueueAsync, after its enter (what the reader's
	// goroutine does next).
	acked := make(chan error, 1)
	p := storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("c")}}, Now: at(1)}
	res, valid, fn, err := s.enqueueOp(ctx, p)
	require.NoError(t, err)
	require.NotNil(t, fn)
	o := &op{apply: fn, items: valid}
	s.submitAsync(p.Queue, []*op{o}, s.doneOne(o, func(err error) { acked <- err }, func() {
		_ = res
		acked <- nil
	}))

	// Close waits for the enqueue; the reader's next call of the same
	// read waits to enter behind Close, then the reader releases.
	next := make(chan error, 1)
	go func() {
		s.PollAsync(ctx, storage.PollParams{Queue: "q", Max: 1, Lease: time.Minute, Now: at(1)}, func(_ storage.PollResult, err error) { next <- err })
		release()
	}()

	select {
	case err := <-closeDone:
		require.NoError(t, err)
		require.NoError(t, <-acked, "the enqueue was made durable")
		require.ErrorIs(t, <-next, storage.ErrClosed)
	case <-clock.New().After(10 * time.Second):
		release() // unstick the test's goroutines
		<-closeDone
		t.Fatal("Close, the held asynchronous enqueue and the reader's next call deadlocked: Recover's mendHolds re-enabled the holds Close broke")
	}
}
