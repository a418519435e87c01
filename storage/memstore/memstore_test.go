package memstore_test

import (
	"testing"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/memstore"
	"github.com/leaseq/leaseq/storage/storagetest"
)

func harness() storagetest.Harness {
	return storagetest.Harness{
		New: func(testing.TB) storage.Store { return memstore.New(memstore.Options{}) },
	}
}

func TestConformanceMemstore(t *testing.T) {
	t.Parallel()
	storagetest.Run(t, harness())
}

// TestConformanceMemstoreModel compares memstore with itself: it cannot find
// a memstore bug, but it exercises the RunModel driver (translation of ids
// and tokens, every op) so a broken driver shows up here first.
func TestConformanceMemstoreModel(t *testing.T) {
	t.Parallel()
	storagetest.RunModel(t, harness())
}

func TestConformanceMemstoreHistory(t *testing.T) {
	t.Parallel()
	storagetest.RunHistory(t, harness(), storagetest.HistoryConfig{})
}

func BenchmarkMemstore(b *testing.B) {
	storagetest.Bench(b, harness())
}

// TestConformanceMemstoreReopenShim runs the reopen cases with a Reopen
// that hands back the same store. memstore does not persist, so this cannot
// test persistence; it checks the reopen cases' own bookkeeping (snapshots,
// fixture swap) so that a backend failing them is failing on its own.
func TestConformanceMemstoreReopenShim(t *testing.T) {
	t.Parallel()
	h := harness()
	h.Reopen = func(_ testing.TB, s storage.Store) storage.Store { return s }
	storagetest.Run(t, h)
}

func TestMemstore_Limits(t *testing.T) {
	t.Parallel()
	open := func(t *testing.T, lim storage.Limits) storage.Store {
		s := memstore.New(memstore.Options{Limits: lim})
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	t.Run("MaxQueues", func(t *testing.T) { storagetest.RunMaxQueues(t, open) })
	t.Run("PartialLimits", func(t *testing.T) { storagetest.RunPartialLimits(t, open) })
	t.Run("NewQueueWithinLimits", func(t *testing.T) { storagetest.RunNewQueueWithinLimits(t, open) })
}
