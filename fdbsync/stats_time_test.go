package fdbsync_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync"
	"github.com/leaseq/leaseq/fdbsync/fdbmodel"
	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

// stepClock is a clock whose Now moves on by 1 ms per database read (a
// cluster's read latency), so the model's 5 s read-version limit applies
// to long transactions.
type stepClock struct {
	clock.Clock
	base  time.Time
	steps atomic.Int64
}

func (c *stepClock) Now() time.Time {
	return c.base.Add(time.Duration(c.steps.Load()) * time.Millisecond)
}

type stepDB struct {
	kv.DB
	c *stepClock
}

func (d stepDB) CreateTransaction() (kv.Tx, error) {
	tx, err := d.DB.CreateTransaction()
	if err != nil {
		return nil, err
	}
	return stepTx{Tx: tx, c: d.c}, nil
}

type stepTx struct {
	kv.Tx
	c *stepClock
}

func (t stepTx) Get(key []byte, snapshot bool) ([]byte, error) {
	t.c.steps.Add(1)
	return t.Tx.Get(key, snapshot)
}

func (t stepTx) GetMany(keys [][]byte, snapshot bool) ([][]byte, error) {
	t.c.steps.Add(1)
	return t.Tx.GetMany(keys, snapshot)
}

func (t stepTx) GetRange(begin, end []byte, o kv.RangeOptions) ([]kv.KeyValue, error) {
	t.c.steps.Add(1)
	return t.Tx.GetRange(begin, end, o)
}

// TestTime_StatsOfAllQueuesWithin5s: Stats of every queue reads the
// queues' counters and heads in transactions of statsPerTxn queues, so
// with 1,500 queues (MaxQueues is 10,000 by default) at 1 ms per read each
// stays inside FDB's 5 s (found by review: one transaction for all, which
// timed out on every retry).
func TestTime_StatsOfAllQueuesWithin5s(t *testing.T) {
	ctx := context.Background()
	c := &stepClock{Clock: clock.NewMock(), base: time.Unix(1_700_000_000, 0)}
	db := fdbmodel.New(fdbmodel.Options{Clock: c})
	s, err := fdbsync.New(stepDB{DB: db, c: c}, fdbsync.Options{MaxAttempts: 3})
	require.NoError(t, err)
	defer s.Close()
	now := time.Date(2031, 1, 2, 3, 4, 5, 0, time.UTC)
	for i := 0; i < 1500; i++ {
		_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: fmt.Sprintf("q%04d", i), Items: []storage.EnqueueItem{{Payload: []byte("p")}}, Now: now})
		require.NoError(t, err)
	}
	st, err := s.Stats(ctx, storage.StatsParams{Now: now})
	require.NoError(t, err)
	require.Len(t, st, 1500)
}
