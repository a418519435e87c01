package rpc

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// extraFactories lists the other backends the RPC tests run against: the
// real RocksDB store in a temp dir.
func extraFactories() []storeFactory {
	return []storeFactory{rocksFactory()}
}

var _ = extraFactories

func rocksFactory() storeFactory { return rocksWith(rocksstore.Options{}, nil) }

// rocksWith returns a factory of RocksDB stores opened with opts in a
// test's temporary directory; if keep is not nil, *keep is set to the
// store it opens (for its metrics).
func rocksWith(opts rocksstore.Options, keep **rocksstore.Store) storeFactory {
	return storeFactory{"rocks", func(t *testing.T) storage.Store {
		s, err := rocksstore.Open(t.TempDir(), opts)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		if keep != nil {
			*keep = s
		}
		return s
	}}
}
