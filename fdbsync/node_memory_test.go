package fdbsync

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync/fdbmodel"
	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

// memNode is one Store on a fresh model database whose clock is a mock:
// the tests age heartbeats by moving it and passing its time in Params.
func memNode(t *testing.T) (*Store, *fdbmodel.DB, *clock.Mock) {
	t.Helper()
	clk := clock.NewMock()
	clk.Set(time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC))
	db := fdbmodel.New(fdbmodel.Options{Clock: clk})
	s, err := New(db, Options{Clock: clk})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s, db, clk
}

// nodeMemory is the size of the store's per-queue bookkeeping.
func (s *Store) nodeMemory() (heartbeats, pollLocks int) {
	s.mu.Lock()
	heartbeats = len(s.mu.heartbeat)
	s.mu.Unlock()
	s.pollLocks.Lock()
	pollLocks = len(s.pollLocks.m)
	s.pollLocks.Unlock()
	return heartbeats, pollLocks
}

// pollerKeys counts the heartbeat keys in the database.
func pollerKeys(t *testing.T, s *Store) int {
	t.Helper()
	v, err := s.view(context.Background(), func(tx kv.Tx) (any, error) {
		pre := s.k.ns(nsPoller)
		rows, err := tx.GetRange(pre, kv.PrefixEnd(pre), kv.RangeOptions{Snapshot: true})
		return len(rows), err
	})
	require.NoError(t, err)
	return v.(int)
}

// Found by review (session 72): a node kept a heartbeat time and a poll
// lock for every queue name it had ever polled, never pruned, so a
// deployment with short-lived per-job queues grew without bound. Poll locks
// must go as soon as no poll holds them, heartbeat times once they are
// older than heartbeatTTL.
func TestNodeMemory_PerQueueBookkeepingIsPruned(t *testing.T) {
	t.Parallel()
	s, _, clk := memNode(t)
	ctx := context.Background()
	const n = 1500
	pollAll := func(prefix string) {
		for i := 0; i < n; i++ {
			_, err := s.Poll(ctx, storage.PollParams{Queue: fmt.Sprintf("%s-%05d", prefix, i), Max: 1, Now: clk.Now()})
			require.NoError(t, err)
		}
	}
	pollAll("job")
	hb, locks := s.nodeMemory()
	require.Equal(t, n, hb, "every queue polled within heartbeatTTL keeps its heartbeat time")
	require.Zero(t, locks, "poll locks of %d queues no poll holds are kept", locks)

	// An hour on, the first jobs' queues are long gone; new ones come.
	clk.Add(heartbeatTTL + time.Minute)
	pollAll("later")
	hb, locks = s.nodeMemory()
	require.Equal(t, n, hb, "heartbeat times older than heartbeatTTL are kept: %d for %d live queues", hb, n)
	require.Zero(t, locks)

	// Within heartbeatEvery a queue still polled keeps its time, so it
	// writes no second heartbeat.
	before := s.Metrics().Heartbeats
	_, err := s.Poll(ctx, storage.PollParams{Queue: "later-00000", Max: 1, Now: clk.Now()})
	require.NoError(t, err)
	require.Equal(t, before, s.Metrics().Heartbeats)
}

// Found by review (session 72): Close cleared the heartbeat key of every
// queue polled in one transaction. With thousands of queues it grew past
// 1 MB (past FDB's 10 MB with tens of thousands): it must clear them in
// transactions within the usual budget, and clear them all.
func TestNodeMemory_CloseClearsHeartbeatsInBoundedTransactions(t *testing.T) {
	t.Parallel()
	s, db, clk := memNode(t)
	ctx := context.Background()
	const n = 2000
	long := strings.Repeat("x", 180)
	for i := 0; i < n; i++ {
		_, err := s.Poll(ctx, storage.PollParams{Queue: fmt.Sprintf("%s-%05d", long, i), Max: 1, Now: clk.Now()})
		require.NoError(t, err)
	}
	require.Equal(t, n, pollerKeys(t, s))
	require.NoError(t, s.Close())
	st := db.Stats()
	require.Zero(t, st.TxnsOver1MB, "Close's transaction was %d bytes", st.MaxTxnSize)
	require.Less(t, st.MaxTxnSize, 300_000, "Close's transactions are planned within txnBudget (256 KiB)")
	require.Zero(t, pollerKeys(t, s), "Close leaves none of this node's heartbeats")
}

// Polls of one queue on one node are serialized by its poll lock, so they
// never conflict with each other; the lock is dropped once they are done.
// Checks that counting the lock's users keeps that under concurrency (run
// with -race).
func TestNodeMemory_PollLockStillSerializesOneQueue(t *testing.T) {
	t.Parallel()
	s, db, clk := memNode(t)
	ctx := context.Background()
	now := clk.Now()
	items := make([]storage.EnqueueItem, 64)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: []byte{byte(i)}}
	}
	_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "hot", Items: items, Now: now})
	require.NoError(t, err)
	conflicts := db.Stats().Conflicts

	var wg sync.WaitGroup
	var mu sync.Mutex
	claimed := 0
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				q := "hot"
				if i%2 == 1 {
					q = fmt.Sprintf("cold-%d", w) // other queues come and go meanwhile
				}
				res, err := s.Poll(ctx, storage.PollParams{Queue: q, Max: 1, Now: now})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				claimed += len(res.Items)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 40, claimed)
	require.Equal(t, conflicts, db.Stats().Conflicts, "polls of one queue on one node conflicted with each other")
	require.Zero(t, s.Metrics().PollRetries)
	_, locks := s.nodeMemory()
	require.Zero(t, locks)
}
