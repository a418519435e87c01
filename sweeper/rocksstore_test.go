package sweeper

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

func openRocksstore(t *testing.T, onDeadline storage.DeadlineFunc) storage.Store {
	s, err := rocksstore.Open(t.TempDir(), rocksstore.Options{OnDeadline: onDeadline})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// TestSweeper_Rocksstore runs the store behaviour tests on real RocksDB
// (default options: --sync=always), wired as main wires it.
func TestSweeper_Rocksstore(t *testing.T) {
	t.Parallel()
	runStoreTests(t, openRocksstore)
}
