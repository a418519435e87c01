package fdbsync_test

// Interleavings of several nodes, found by a review (session 69): several
// Store instances over one fdbmodel database act as several nodes, and
// hookDB, a thin wrapper over the model's kv.DB, runs a hook at a chosen
// commit of node A's transactions (the other nodes use the model
// directly). The model itself decides every conflict and every write.

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync"
	"github.com/leaseq/leaseq/fdbsync/fdbmodel"
	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

// rawNS returns DefaultPrefix + tag, the start of one namespace.
func rawNS(tag byte) []byte { return append([]byte(fdbsync.DefaultPrefix), tag) }

func rawStr(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		b = append(b, s[i])
		if s[i] == 0 {
			b = append(b, 0xff)
		}
	}
	return append(b, 0)
}

func rawTime(b []byte, t time.Time) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(t.UnixNano())^(1<<63))
}

// hookTxInfo is what one attempt of a node-A transaction did, as far as
// the hooks need to know.
type hookTxInfo struct {
	rangeReads [][]byte // begin keys of non-snapshot range reads
	sets       [][]byte
	vsKeys     [][]byte
	clears     [][]byte
}

func (i *hookTxInfo) readRangeAt(begin []byte) bool {
	for _, b := range i.rangeReads {
		if bytes.Equal(b, begin) {
			return true
		}
	}
	return false
}

func anyPrefix(keys [][]byte, pre []byte) bool {
	for _, k := range keys {
		if bytes.HasPrefix(k, pre) {
			return true
		}
	}
	return false
}

// hookDB wraps the model for one node. before runs just before a commit
// (other nodes' transactions committed there land between this attempt's
// read version and its commit); after runs after a commit and may replace
// its error (to report commit_unknown_result for an applied commit).
type hookDB struct {
	inner  kv.DB
	mu     sync.Mutex
	before func(info *hookTxInfo)
	after  func(info *hookTxInfo, err error) error
}

func (d *hookDB) CreateTransaction() (kv.Tx, error) {
	tx, err := d.inner.CreateTransaction()
	if err != nil {
		return nil, err
	}
	return &hookTx{Tx: tx, db: d}, nil
}

type hookTx struct {
	kv.Tx
	db   *hookDB
	info hookTxInfo
}

func (t *hookTx) GetRange(begin, end []byte, o kv.RangeOptions) ([]kv.KeyValue, error) {
	if !o.Snapshot {
		t.info.rangeReads = append(t.info.rangeReads, append([]byte{}, begin...))
	}
	return t.Tx.GetRange(begin, end, o)
}

func (t *hookTx) Set(k, v []byte) {
	t.info.sets = append(t.info.sets, append([]byte{}, k...))
	t.Tx.Set(k, v)
}

func (t *hookTx) Clear(k []byte) {
	t.info.clears = append(t.info.clears, append([]byte{}, k...))
	t.Tx.Clear(k)
}

func (t *hookTx) SetVersionstampedKey(k, v []byte) {
	t.info.vsKeys = append(t.info.vsKeys, append([]byte{}, k...))
	t.Tx.SetVersionstampedKey(k, v)
}

func (t *hookTx) Commit() error {
	t.db.mu.Lock()
	before, after := t.db.before, t.db.after
	t.db.mu.Unlock()
	if before != nil {
		before(&t.info)
	}
	err := t.Tx.Commit()
	if after != nil {
		err = after(&t.info, err)
	}
	return err
}

func (t *hookTx) OnError(err error) error {
	t.info = hookTxInfo{}
	return t.Tx.OnError(err)
}

func (t *hookTx) Cancel() {
	t.info = hookTxInfo{}
	t.Tx.Cancel()
}

// hookNodes returns node A (over a hookDB) and n other nodes over the
// same model database.
func hookNodes(t *testing.T, n int) (*fdbmodel.DB, *hookDB, *fdbsync.Store, []*fdbsync.Store) {
	t.Helper()
	db := fdbmodel.New(fdbmodel.Options{Clock: clock.NewMock()})
	rdb := &hookDB{inner: db}
	a, err := fdbsync.New(rdb, fdbsync.Options{Seed: 1})
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Close() })
	var others []*fdbsync.Store
	for i := 0; i < n; i++ {
		s, err := fdbsync.New(db, fdbsync.Options{Seed: uint64(i + 2)})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		others = append(others, s)
	}
	return db, rdb, a, others
}

// rawRange reads a range of the model directly.
func rawRange(t *testing.T, db kv.DB, begin, end []byte) []kv.KeyValue {
	t.Helper()
	tx, err := db.CreateTransaction()
	require.NoError(t, err)
	rows, err := tx.GetRange(begin, end, kv.RangeOptions{Snapshot: true})
	require.NoError(t, err)
	tx.Cancel()
	return rows
}

// TestFDBGarbage_FreshHeartbeatsDoNotAbortIt: the
// garbage pass read the whole heartbeat namespace without snapshot, so a
// heartbeat written by any node, for any queue, while it ran aborted it,
// even though it deleted nothing. With many nodes heartbeats land at
// (nodes x queues) per second; here one lands during every attempt, and
// node A's Sweep failed with the retry limit instead of completing. A
// fresh heartbeat it would never delete must not abort the pass.
func TestFDBGarbage_FreshHeartbeatsDoNotAbortIt(t *testing.T) {
	t.Parallel()
	db, rdb, a, others := hookNodes(t, 8)
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)
	hb := rawNS('n')
	var mu sync.Mutex
	beats := 0
	rdb.before = func(info *hookTxInfo) {
		if !info.readRangeAt(hb) {
			return
		}
		// Another node polls a queue (its regular heartbeat) while the
		// garbage pass is in flight.
		mu.Lock()
		beats++
		i := beats
		mu.Unlock()
		s := others[i%len(others)]
		_, err := s.Poll(ctx, storage.PollParams{Queue: fmt.Sprintf("busy-%d", i), Max: 1, Now: now})
		require.NoError(t, err)
	}
	_, err := a.Sweep(ctx, storage.SweepParams{Now: now})
	mu.Lock()
	n := beats
	mu.Unlock()
	st := db.Stats()
	require.NoError(t, err, "sweep failed after %d garbage attempts, each aborted by an unrelated fresh heartbeat (%d model conflicts)", n, st.Conflicts)
}

// TestFDBGarbage_StaleHeartbeatBehindLiveOnes: the garbage
// pass looked only at the first 10*Limit heartbeat rows. Once that many
// live heartbeats sort first (nodes x queues >= 1000 at the default
// limit; 5120 at the sweeper's 512), the heartbeat of a crashed node on a
// later queue was never deleted, however old: the namespace leaked one
// entry per crashed node per queue. Each pass now reads a page on from
// the last.
func TestFDBGarbage_StaleHeartbeatBehindLiveOnes(t *testing.T) {
	t.Parallel()
	db, _, a, _ := hookNodes(t, 0)
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)
	crashedAt := now.Add(-3 * time.Hour)
	// 1000 live heartbeats on queue "a" (written raw, as nodes' Polls
	// would: key n <queue> <node>, value its time), one stale on "z".
	tx, err := db.CreateTransaction()
	require.NoError(t, err)
	for i := 0; i < 1000; i++ {
		var node [16]byte
		binary.BigEndian.PutUint64(node[:], uint64(i+1))
		tx.Set(append(rawStr(rawNS('n'), "a"), node[:]...), rawTime(nil, now))
	}
	stale := append(rawStr(rawNS('n'), "z"), bytes.Repeat([]byte{0xee}, 16)...)
	tx.Set(stale, rawTime(nil, crashedAt))
	require.NoError(t, tx.Commit())

	for i := 0; i < 3; i++ {
		_, err := a.Sweep(ctx, storage.SweepParams{Now: now.Add(time.Duration(i) * time.Minute)})
		require.NoError(t, err)
	}
	rows := rawRange(t, db, stale, kv.KeyAfter(stale))
	require.Empty(t, rows, "a heartbeat 3 h old (heartbeatTTL 1 h) was never collected: the pass only reads the first 10*Limit rows, all live")
}

// TestFDBGarbage_MarkerOfANodeWhoseClockLags: markers
// were filed and expired by the callers' clocks (now by the cluster's
// versions). Node B, whose
// clock runs 11 minutes ahead, collects node A's marker while A's enqueue
// is between an applied commit reported as commit_unknown_result and its
// retry; the retry found no marker and enqueued the item a second time.
func TestFDBGarbage_MarkerOfANodeWhoseClockLags(t *testing.T) {
	t.Parallel()
	_, rdb, a, others := hookNodes(t, 1)
	b := others[0]
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)
	avail := rawNS('a')
	fired := false
	rdb.after = func(info *hookTxInfo, err error) error {
		if err != nil || fired || !anyPrefix(info.vsKeys, avail) {
			return err
		}
		fired = true
		// The commit was applied; before A's client learns it, B's
		// garbage pass runs at B's time.
		_, serr := b.Sweep(ctx, storage.SweepParams{Now: now.Add(11 * time.Minute)})
		require.NoError(t, serr)
		return kv.Error{Code: kv.CodeCommitUnknownResult}
	}
	res, err := a.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("once")}}, Now: now})
	require.NoError(t, err)
	require.True(t, fired)
	require.Len(t, res, 1)
	items, err := a.Peek(ctx, storage.PeekParams{Queue: "q", Limit: 10, Now: now})
	require.NoError(t, err)
	require.Len(t, items, 1, "one acknowledged enqueue of one item applied %d times", len(items))
}

// TestFDBGarbage_UploadOfANodeWhoseClockLags: a large
// payload's chunks are filed under the enqueuing
// node's clock. Node B, whose clock runs over an hour ahead, collects them
// as an orphan upload between A's chunk upload and A's item commit; the
// enqueue succeeded and the item's payload was gone (ErrCorrupt on poll).
// The enqueue now reads its uploads and, one gone, uploads again.
func TestFDBGarbage_UploadOfANodeWhoseClockLags(t *testing.T) {
	t.Parallel()
	_, rdb, a, others := hookNodes(t, 1)
	b := others[0]
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)
	up := rawNS('P')
	fired := false
	rdb.after = func(info *hookTxInfo, err error) error {
		if err != nil || fired || !anyPrefix(info.sets, up) {
			return err
		}
		fired = true
		_, serr := b.Sweep(ctx, storage.SweepParams{Now: now.Add(61 * time.Minute)})
		require.NoError(t, serr)
		return nil
	}
	payload := bytes.Repeat([]byte("x"), 40_000)
	_, err := a.Enqueue(ctx, storage.EnqueueParams{Queue: "big", Items: []storage.EnqueueItem{{Payload: payload}}, Now: now})
	require.NoError(t, err)
	require.True(t, fired)
	p, err := a.Poll(ctx, storage.PollParams{Queue: "big", Max: 1, Now: now.Add(time.Second)})
	require.NoError(t, err, "an acknowledged enqueue's payload must still be there")
	require.Len(t, p.Items, 1)
	require.Equal(t, payload, p.Items[0].Payload)
}

// TestFDBDeleteQueue_DedupKeysOfARemovedQueue (found by review, session
// 69): removeQueue cleared dedup keys 1000 per transaction before the one
// that removed the queue; an enqueue between them made the removal fail
// with ErrNotEmpty after it had dropped 1000 of the queue's dedup keys,
// so a refused DeleteQueue had changed something. Now the first
// transaction removes the queue and the rest clear its dedup keys: the
// enqueue that lands between them creates the queue anew, which ignores
// the old keys (they are older than it) while the removal clears them,
// and keeps its own.
func TestFDBDeleteQueue_DedupKeysOfARemovedQueue(t *testing.T) {
	t.Parallel()
	_, rdb, a, others := hookNodes(t, 1)
	b := others[0]
	ctx := context.Background()
	now := time.Unix(1_900_000_000, 0)
	const q = "dq"
	for start := 0; start < 2500; start += 500 {
		var in []storage.EnqueueItem
		for i := start; i < start+500; i++ {
			in = append(in, storage.EnqueueItem{Payload: []byte("p"), DedupKey: fmt.Sprintf("k%04d", i)})
		}
		_, err := a.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: in, Now: now})
		require.NoError(t, err)
	}
	// The work was taken and finished: the queue is empty, the dedup keys
	// stay for their window (5 min).
	n, err := a.Purge(ctx, storage.PurgeParams{Queue: q, Now: now})
	require.NoError(t, err)
	require.Equal(t, 2500, n)

	// A refused removal changes nothing.
	_, err = b.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{{Payload: []byte("live")}}, Now: now})
	require.NoError(t, err)
	_, err = a.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: q, Now: now})
	require.ErrorIs(t, err, storage.ErrNotEmpty)
	res, err := b.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{{Payload: []byte("p"), DedupKey: "k0000"}}, Now: now})
	require.NoError(t, err)
	require.True(t, res[0].Duplicate, "a refused DeleteQueue dropped a dedup key")
	_, err = a.Purge(ctx, storage.PurgeParams{Queue: q, Now: now})
	require.NoError(t, err)

	dedup := rawNS('u')
	fired := false
	rdb.after = func(info *hookTxInfo, err error) error {
		if err != nil || fired || !anyPrefix(info.clears, dedup) {
			return err
		}
		fired = true
		rep, cerr := b.Check(ctx)
		require.NoError(t, cerr)
		require.Empty(t, rep.Violations, "the removed queue's dedup keys, not yet cleared, are not violations")
		// Between the removal's transactions another node enqueues: the
		// queue comes to be again, and the old keys do not hold.
		res, eerr := b.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{
			{Payload: []byte("new"), DedupKey: "k1000"}, {Payload: []byte("new"), DedupKey: "fresh"},
		}, Now: now.Add(time.Second)})
		require.NoError(t, eerr)
		require.False(t, res[0].Duplicate, "a removed queue's dedup key held in the queue created anew")
		require.False(t, res[1].Duplicate)
		rep, cerr = b.Check(ctx)
		require.NoError(t, cerr)
		require.Empty(t, rep.Violations, "the removed queue's dedup keys, not yet cleared, are not violations")
		return nil
	}
	_, err = a.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: q, Now: now.Add(time.Second)})
	require.NoError(t, err, "the queue was removed before the enqueue created it again")
	require.True(t, fired)
	rdb.mu.Lock()
	rdb.after = nil
	rdb.mu.Unlock()

	res, err = b.Enqueue(ctx, storage.EnqueueParams{Queue: q, Items: []storage.EnqueueItem{
		{Payload: []byte("p"), DedupKey: "k0000"}, {Payload: []byte("again"), DedupKey: "fresh"}, {Payload: []byte("again"), DedupKey: "k1000"},
	}, Now: now.Add(time.Minute)})
	require.NoError(t, err)
	require.False(t, res[0].Duplicate, "k0000 belonged to the removed queue")
	require.True(t, res[1].Duplicate, "the new queue's own dedup key holds")
	require.True(t, res[2].Duplicate, "the new queue's own dedup key holds")
	rows := rawRange(t, rdb.inner, dedup, kv.PrefixEnd(dedup))
	require.Len(t, rows, 3, "only the new queue's dedup keys remain: k0000, k1000, fresh")
	rep, err := a.Check(ctx)
	require.NoError(t, err)
	require.Empty(t, rep.Violations)
}
