package rpc

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// On a store that can claim within an enqueue's commit
// (storage.EnqueueClaimer), an enqueue serves the polls parked on its
// queue in the same commit and fsync, oldest first; a poll the items do
// not reach stays parked, and items left over wake the next in line.
func TestLongPoll_EnqueueClaimsForParkedPolls(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{factory: rocksFactory()})
	rs := b.store.(*rocksstore.Store)
	first, second, third, producer := b.dial(), b.dial(), b.dial(), b.dial()
	ch1 := goPoll(first, "q", 2, 30*time.Second)
	rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
	ch2 := goPoll(second, "q", 1, 30*time.Second)
	rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 2 })
	ch3 := goPoll(third, "q", 1, 30*time.Second)
	rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 3 })

	before := rs.Metrics()
	res, err := producer.Enqueue(ctxT(t), "q", payloads(3, 8))
	require.NoError(t, err)
	o1, o2 := recvPoll(t, ch1), recvPoll(t, ch2)
	require.NoError(t, o1.err)
	require.NoError(t, o2.err)
	require.Equal(t, []storage.ItemID{res[0].ID, res[1].ID}, []storage.ItemID{o1.pr.Items[0].ID, o1.pr.Items[1].ID})
	require.Len(t, o2.pr.Items, 1)
	require.Equal(t, res[2].ID, o2.pr.Items[0].ID)
	m := rs.Metrics().Sub(before)
	require.Equal(t, uint64(1), m.Commits, "the enqueue and both claims: one commit")
	require.Equal(t, uint64(1), m.WALSyncs, "and one fsync")
	require.Equal(t, uint64(3), m.Claimed)
	rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
	select {
	case o := <-ch3:
		t.Fatalf("the third poll returned though nothing was left: %+v", o)
	default:
	}

	// More items than the parked polls take: the rest wakes nobody else
	// here, and a later poll finds it.
	res, err = producer.Enqueue(ctxT(t), "q", payloads(3, 8))
	require.NoError(t, err)
	o3 := recvPoll(t, ch3)
	require.NoError(t, o3.err)
	require.Len(t, o3.pr.Items, 1)
	require.Equal(t, res[0].ID, o3.pr.Items[0].ID)
	pr, err := first.Poll(ctxT(t), "q", 10, time.Minute, 0)
	require.NoError(t, err)
	require.Len(t, pr.Items, 2)
	require.Equal(t, 0, b.srv.Metrics().Waiters)
}
