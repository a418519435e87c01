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
	"github.com/leaseq/leaseq/storage"
)

// modelStore opens a store on a fresh model of FDB (closed at the end
// of the test) and returns it with the model.
func modelStore(t *testing.T) (*fdbsync.Store, *fdbmodel.DB) {
	t.Helper()
	db := fdbmodel.New(fdbmodel.Options{Clock: clock.NewMock()})
	s, err := fdbsync.New(db, fdbsync.Options{Seed: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s, db
}

// makeDeadItems makes n dead items of payload bytes each in queue q
// (max attempts 1, one delivery, nacked).
func makeDeadItems(t *testing.T, s *fdbsync.Store, q string, n, payload int, now time.Time) {
	t.Helper()
	ctx := context.Background()
	items := make([]storage.EnqueueItem, n)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: bytes.Repeat([]byte{'x'}, payload), MaxAttempts: 1}
	}
	_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: items, Now: now})
	require.NoError(t, err)
	dead := 0
	for dead < n {
		p, err := s.Poll(ctx, storage.PollParams{Queue: q, Max: 100, Lease: time.Minute, Now: now})
		require.NoError(t, err)
		require.NotEmpty(t, p.Items)
		ids := make([]storage.ItemID, len(p.Items))
		for i, it := range p.Items {
			ids[i] = it.ID
		}
		zero := time.Duration(0)
		codes, err := s.Nack(ctx, storage.NackParams{Queue: q, Lease: p.Lease, IDs: ids, Delay: &zero, Reason: "boom", Now: now})
		require.NoError(t, err)
		for _, c := range codes {
			require.Equal(t, storage.CodeOK, c)
		}
		dead += len(ids)
	}
	st, err := s.Stats(ctx, storage.StatsParams{Queue: q, Now: now})
	require.NoError(t, err)
	require.EqualValues(t, n, st[0].Dead)
}

// A page of dead items whose records add up to more than one
// transaction's budget (80 items of 16 KiB) is purged in several
// transactions, all of it.
func TestPurgeDead_PageLargerThanOneTransaction(t *testing.T) {
	ctx := context.Background()
	s, _ := modelStore(t)
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	makeDeadItems(t, s, "dlq", 80, 16<<10, now)

	res, err := s.PurgeDead(ctx, storage.RedriveParams{Queue: "dlq", Limit: 100, Now: now})
	require.NoError(t, err, "purging a page of 100 dead items is a valid request")
	require.Equal(t, 80, res.Moved)
}

// DeleteQueue with Force purges such a dead-letter queue too.
func TestDeleteQueue_ForceWithLargeDeadItems(t *testing.T) {
	ctx := context.Background()
	s, _ := modelStore(t)
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	makeDeadItems(t, s, "dlq", 80, 16<<10, now)

	n, err := s.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: "dlq", Force: true, Now: now})
	require.NoError(t, err, "force-deleting a queue with dead items")
	require.Equal(t, 80, n)
}

// Redrive by ids over more than one transaction's budget: every id gets
// its code in order (a repeated id and an unknown one NotFound) and every
// dead item is ready again.
func TestRedrive_IDsLargerThanOneTransaction(t *testing.T) {
	ctx := context.Background()
	s, _ := modelStore(t)
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	makeDeadItems(t, s, "dlq", 80, 16<<10, now)
	dead, err := s.DeadList(ctx, storage.DeadListParams{Queue: "dlq", Limit: 100})
	require.NoError(t, err)
	require.Len(t, dead, 80)
	ids := make([]storage.ItemID, 0, 82)
	for _, d := range dead {
		ids = append(ids, d.ID)
	}
	ids = append(ids, dead[3].ID, storage.ItemID{0xff})
	res, err := s.Redrive(ctx, storage.RedriveParams{Queue: "dlq", IDs: ids, Now: now})
	require.NoError(t, err)
	require.Equal(t, 80, res.Moved)
	require.Len(t, res.Codes, 82)
	for i := range 80 {
		require.Equal(t, storage.CodeOK, res.Codes[i], "id %d", i)
	}
	require.Equal(t, []storage.Code{storage.CodeNotFound, storage.CodeNotFound}, res.Codes[80:])
	st, err := s.Stats(ctx, storage.StatsParams{Queue: "dlq", Now: now})
	require.NoError(t, err)
	require.EqualValues(t, 80, st[0].Ready)
	require.EqualValues(t, 0, st[0].Dead)
}

// Pages and id lists longer than one transaction reads (deadChunkKeys)
// go on in the next: every item is moved.
func TestDeadOps_MoreItemsThanOneTransactionReads(t *testing.T) {
	ctx := context.Background()
	s, _ := modelStore(t)
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	makeDeadItems(t, s, "a", 300, 8, now)
	res, err := s.PurgeDead(ctx, storage.RedriveParams{Queue: "a", Limit: 1000, Now: now})
	require.NoError(t, err)
	require.Equal(t, 300, res.Moved)

	makeDeadItems(t, s, "b", 300, 8, now)
	dead, err := s.DeadList(ctx, storage.DeadListParams{Queue: "b", Limit: 1000})
	require.NoError(t, err)
	ids := make([]storage.ItemID, len(dead))
	for i, d := range dead {
		ids[i] = d.ID
	}
	res, err = s.Redrive(ctx, storage.RedriveParams{Queue: "b", IDs: ids, Now: now})
	require.NoError(t, err)
	require.Equal(t, 300, res.Moved)
	require.Len(t, res.Codes, 300)
	st, err := s.Stats(ctx, storage.StatsParams{Now: now})
	require.NoError(t, err)
	for _, q := range st {
		require.EqualValues(t, 0, q.Dead, q.Queue)
	}
}
