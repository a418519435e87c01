package rocksstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// dedupKeysLeft counts queue q's dedup keys in b's database.
func dedupKeysLeft(t *testing.T, b *testBundle, q string) int {
	t.Helper()
	n := 0
	p := dbkeys.DedupPrefix(q)
	require.NoError(t, b.s.scan(p, dbkeys.PrefixEnd(p), nil, func(_, _ []byte) (bool, error) {
		n++
		return true, nil
	}))
	return n
}

// Found by review (session 70): DeleteQueue drops a queue's dedup keys
// in chunks and removes its config last, and its "deleting" mark was in
// memory only. A crash after the first chunk left, after the restart, the
// queue in place with part of its dedup keys gone: re-enqueues within the
// dedup window were taken as new, and the delete asked for was half done.
// The mark is now on disk: leaseq check accepts it, and Open finishes the
// delete.
func TestDeleteMark_CrashMidDeleteFinishesAtOpen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = 2*purgeChunk + 10
	dedupQueue(b, "q", n)
	var crashed string
	chunks := 0
	b.s.afterDedupChunk = func() {
		if chunks++; chunks == 1 { // the first chunk is committed
			crashed = copyDir(t, b.dir)
		}
	}
	_, err := b.s.DeleteQueue(b.ctx, storage.DeleteQueueParams{Queue: "q", Now: at(time.Second)})
	require.NoError(t, err)
	require.NotEmpty(t, crashed)

	// Read-only, as `leaseq check` reads it: the mark is no damage.
	rep, err := CheckDir(b.ctx, crashed)
	require.NoError(t, err)
	require.True(t, rep.OK(), "violations: %v", rep.Violations)

	c := setupDir(t, crashed, func(o *Options) { o.Sync = SyncAlways })
	_, err = c.s.Stats(c.ctx, storage.StatsParams{Queue: "q", Now: at(2 * time.Second)})
	require.ErrorIs(t, err, storage.ErrNotFound, "the delete cut short by the crash is finished at open")
	require.Zero(t, dedupKeysLeft(t, c, "q"), "dedup keys of the deleted queue")
	c.check()
	res, err := c.s.Enqueue(c.ctx, storage.EnqueueParams{Queue: "q", Now: at(2 * time.Second),
		Items: []storage.EnqueueItem{{Payload: []byte("new"), DedupKey: "k0"}}})
	require.NoError(t, err)
	require.False(t, res[0].Duplicate, "the queue created anew has no dedup keys")
	c.reopen()
	require.Equal(t, int64(1), c.stats("q", at(2*time.Second)).Ready, "the new queue is not taken for one being deleted")
}

// A delete that failed after its mark and was undone (undelete) leaves no
// mark on disk: the next Open does not delete the queue, which took an
// item since (found by the review of the durable mark).
func TestDeleteMark_FailedDeleteKeepsQueueAcrossReopen(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const n = purgeChunk + 10
	dedupQueue(b, "q", n)
	r := raw{t: t, s: b.s}
	k := dbkeys.DedupKey("q", "k99") // in the second chunk
	orig, ok, err := b.s.getRaw(k)
	require.NoError(t, err)
	require.True(t, ok)
	r.put(k, []byte{0xff})
	_, err = b.s.DeleteQueue(b.ctx, storage.DeleteQueueParams{Queue: "q", Now: at(time.Second)})
	require.ErrorIs(t, err, storage.ErrCorrupt)
	r.put(k, orig)
	b.enqueue("q", at(2*time.Second), storage.EnqueueItem{Payload: []byte("after")})
	b.reopen()
	require.Equal(t, int64(1), b.stats("q", at(2*time.Second)).Ready)
	b.enqueue("q", at(3*time.Second), storage.EnqueueItem{Payload: []byte("later")})
}
