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

func rocksFactory() storeFactory {
	return storeFactory{"rocks", func(t *testing.T) storage.Store {
		s, err := rocksstore.Open(t.TempDir(), rocksstore.Options{})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}}
}
