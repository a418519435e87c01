package rocksstore

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/storagetest"
)

// harness opens rocksstores in t.TempDir() with options from opts.
func harness(opts func(t testing.TB) Options) storagetest.Harness {
	open := func(t testing.TB, dir string) storage.Store {
		s, err := Open(dir, opts(t))
		require.NoError(t, err)
		return s
	}
	return storagetest.Harness{
		New: func(t testing.TB) storage.Store { return open(t, t.TempDir()) },
		Reopen: func(t testing.TB, s storage.Store) storage.Store {
			dir := s.(*Store).dir
			require.NoError(t, s.Close())
			return open(t, dir)
		},
		DataDir: func(s storage.Store) string { return s.(*Store).dir },
	}
}

func conformanceOptions(sync SyncMode) func(t testing.TB) Options {
	return func(t testing.TB) Options {
		return Options{Sync: sync, CacheBytes: 8 << 20}
	}
}

func TestConformanceRocks(t *testing.T) {
	t.Parallel()
	for _, sync := range []SyncMode{SyncNone, SyncAlways} {
		t.Run("sync="+sync.String(), func(t *testing.T) {
			t.Parallel()
			storagetest.Run(t, harness(conformanceOptions(sync)))
		})
	}
}

func TestConformanceRocksExternalPayloads(t *testing.T) {
	t.Parallel()
	storagetest.Run(t, harness(func(t testing.TB) Options {
		o := conformanceOptions(SyncNone)(t)
		o.inlineMax = -1
		return o
	}))
}

func TestConformanceRocksModel(t *testing.T) {
	t.Parallel()
	storagetest.RunModel(t, harness(conformanceOptions(SyncNone)))
}

func TestConformanceRocksHistory(t *testing.T) {
	t.Parallel()
	storagetest.RunHistory(t, harness(conformanceOptions(SyncAlways)), storagetest.HistoryConfig{})
}
