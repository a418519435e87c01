package rocksstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// Latest is the latest visible_at of the items ready or inflight at open
// (the node raises its clock to it: storage/steadyclock), not the
// visible_at of delayed ones, which is ahead of the clock that wrote
// them, but their enqueue instant (ids carry it); acked items leave no
// trace.
func TestLatest_ReadyAndInflightNotDelayed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	require.True(t, b.s.Latest().IsZero(), "an empty store")
	b.enqueueN("q", at(0), 2)
	b.enqueueN("r", at(5*time.Second), 1)
	b.enqueue("q", at(6*time.Second), storage.EnqueueItem{Payload: []byte("later"), Delay: time.Hour})
	b.enqueue("q", at(7*time.Second), storage.EnqueueItem{Payload: []byte("p9"), Priority: 9})
	res := b.poll("r", 1, 30*time.Second, at(8*time.Second))
	require.Len(t, res.Items, 1)
	b.reopen()
	require.True(t, b.s.Latest().Equal(at(7*time.Second)), "got %v", b.s.Latest())

	// Only the inflight item of r left beside the delayed one: r's
	// visible_at (5 s) from its in_progress record.
	q := b.poll("q", 10, 30*time.Second, at(9*time.Second))
	require.Len(t, q.Items, 3)
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK, storage.CodeOK},
		b.ack("q", q.Lease, at(9*time.Second), itemIDs(q.Items)...))
	b.reopen()
	// The delayed item's enqueue instant (6 s), beyond r's visible_at.
	require.True(t, b.s.Latest().Equal(at(6*time.Second)), "got %v", b.s.Latest())
}
