package fdbsync_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync"
	"github.com/leaseq/leaseq/fdbsync/fdbmodel"
	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

// failWatchDB wraps the model so that watches on the keys fail chooses
// fail at once with too_many_watches, as a cluster's watches do past the
// handle's limit; other watches are the model's.
type failWatchDB struct {
	inner kv.DB
	fail  func(key []byte) bool
}

func (d *failWatchDB) CreateTransaction() (kv.Tx, error) {
	tx, err := d.inner.CreateTransaction()
	if err != nil {
		return nil, err
	}
	return &failWatchTx{Tx: tx, db: d}, nil
}

type failWatchTx struct {
	kv.Tx
	db *failWatchDB
}

func (t *failWatchTx) Watch(key []byte) (kv.Watch, error) {
	if t.db.fail(key) {
		done := make(chan struct{})
		close(done)
		return failedWatch{done: done}, nil
	}
	return t.Tx.Watch(key)
}

// failedWatch is a watch that failed as soon as it was set.
type failedWatch struct{ done chan struct{} }

func (w failedWatch) Done() <-chan struct{} { return w.done }
func (w failedWatch) Err() error            { return kv.Error{Code: kv.CodeTooManyWatches} }
func (w failedWatch) Cancel()               {}

// requireStaysParked requires ch not to close within a bounded wait. The
// failed watches' Done channels are closed before WatchReady returns, so
// a goroutine that takes a failure for a wake-up closes ch at once; one
// that does not never closes it, so the wait's length only bounds the
// test, it decides nothing when the code is right.
func requireStaysParked(t *testing.T, ch <-chan struct{}, msg string) {
	t.Helper()
	select {
	case <-ch:
		t.Fatal(msg)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestFDBWatchReady_FailedWatchDoesNotWake: found by review (session 72).
// WatchReady's goroutine closed its channel when either watch's Done
// closed, whether the watch fired or failed. Past FDB's 10,000 watches
// per database handle every new watch fails at once with
// too_many_watches, so the dispatcher, which takes a closed channel for a
// wake-up, polled, parked and watched again in a busy loop of
// transactions per parked poll. A failed watch is now dropped: the
// channel closes when the other watch fires, or ctx ends, or the store
// closes, and the poll otherwise waits for its own node's notices or its
// wait's end (doc.go).
func TestFDBWatchReady_FailedWatchDoesNotWake(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_900_000_000, 0)
	open := func(t *testing.T, fail func(key []byte) bool) (*fdbmodel.DB, *fdbsync.Store) {
		db := fdbmodel.New(fdbmodel.Options{Clock: clock.NewMock()})
		s, err := fdbsync.New(&failWatchDB{inner: db, fail: fail}, fdbsync.Options{Seed: 1})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return db, s
	}
	isWake := func(q string) func([]byte) bool {
		return func(key []byte) bool { return bytes.Equal(key, wakeKey(q)) }
	}

	t.Run("WakeFailsCtxEnds", func(t *testing.T) {
		t.Parallel()
		db, s := open(t, isWake("q"))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch, err := s.WatchReady(ctx, "q")
		require.NoError(t, err)
		requireStaysParked(t, ch, "a failed watch woke the parked poll")
		require.Equal(t, 1, db.Stats().Watches, "the config watch is not registered")
		cancel()
		requireFired(t, ch, "the channel did not close when ctx ended")
		require.Equal(t, 0, db.Stats().Watches, "a watch stayed registered after ctx ended")
	})

	t.Run("WakeFailsConfigFires", func(t *testing.T) {
		t.Parallel()
		db, s := open(t, isWake("q"))
		ctx := context.Background()
		_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("x")}}, Now: now})
		require.NoError(t, err)
		_, err = s.Purge(ctx, storage.PurgeParams{Queue: "q", Now: now})
		require.NoError(t, err)
		ch, err := s.WatchReady(ctx, "q")
		require.NoError(t, err)
		requireStaysParked(t, ch, "a failed watch woke the parked poll")
		// The removal clears the config key: the watch that did not fail
		// fires and still wakes the poll.
		_, err = s.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: "q", Now: now})
		require.NoError(t, err)
		requireFired(t, ch, "the config watch fired but the poll was not woken")
		require.Equal(t, 0, db.Stats().Watches)
	})

	t.Run("BothFailStoreCloses", func(t *testing.T) {
		t.Parallel()
		db, s := open(t, func([]byte) bool { return true })
		ch, err := s.WatchReady(context.Background(), "q")
		require.NoError(t, err)
		requireStaysParked(t, ch, "failed watches woke the parked poll")
		require.NoError(t, s.Close())
		requireFired(t, ch, "the channel did not close when the store closed")
		require.Equal(t, 0, db.Stats().Watches)
	})
}
