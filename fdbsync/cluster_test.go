//go:build fdb

package fdbsync_test

import (
	"context"
	"crypto/rand"
	"os"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync"
	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/storagetest"
)

// clusterHarness runs each Store in its own random subspace of the cluster
// named by FDB_CLUSTER_FILE and clears that subspace afterwards.
func clusterHarness(t *testing.T) storagetest.Harness {
	file := os.Getenv("FDB_CLUSTER_FILE")
	require.NotEmpty(t, file, "make test-fdb needs FDB_CLUSTER_FILE naming a test cluster")
	open := func(t testing.TB, prefix []byte) storage.Store {
		s, err := fdbsync.OpenCluster(file, fdbsync.Options{Prefix: prefix})
		require.NoError(t, err)
		return s
	}
	var mu sync.Mutex // the suite's subtests run in parallel
	prefixes := map[storage.Store][]byte{}
	return storagetest.Harness{
		New: func(t testing.TB) storage.Store {
			p := make([]byte, 12)
			_, err := rand.Read(p)
			require.NoError(t, err)
			p = append([]byte("leaseq-test-"), p...)
			s := open(t, p)
			t.Cleanup(func() {
				_, err := kv.NewRetrier(s.(*fdbsync.Store).DB(), kv.RetrierOptions{}).Transact(context.Background(), func(tx kv.Tx) (any, error) {
					tx.ClearRange(p, kv.PrefixEnd(p))
					return nil, nil
				})
				require.NoError(t, err)
			})
			mu.Lock()
			prefixes[s] = p
			mu.Unlock()
			return s
		},
		Reopen: func(t testing.TB, s storage.Store) storage.Store {
			mu.Lock()
			p := prefixes[s]
			mu.Unlock()
			require.NoError(t, s.Close())
			n := open(t, p)
			mu.Lock()
			prefixes[n] = p
			mu.Unlock()
			return n
		},
	}
}

// TestConformanceFDBCluster runs the conformance suite on a real cluster
// (make test-fdb).
func TestConformanceFDBCluster(t *testing.T) {
	t.Parallel()
	storagetest.Run(t, clusterHarness(t))
}
