package storagetest

import (
	"testing"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/memstore"
)

// Run checks a store against the Limits its harness declares, not
// storage.DefaultLimits: memstore with MaxBatch 2000 passes when the
// harness says so.
func TestRun_HarnessLimits(t *testing.T) {
	lim := storage.DefaultLimits
	lim.MaxBatch = 2000
	h := Harness{
		New:    func(testing.TB) storage.Store { return memstore.New(memstore.Options{Limits: lim}) },
		Limits: lim,
	}
	Run(t, h)
}
