package bench

import (
	"github.com/leaseq/leaseq/bench/leaseqt"
	"github.com/leaseq/leaseq/bench/target"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// leaseqSystems lists leaseq's own systems: over RPC against a real
// `leaseq serve` (the rows to compare with peers), then in process, then
// the HTTP API of a real `leaseq serve --http` and the loopback
// diagnostics (these two run only when named).
func leaseqSystems(bin *leaseqt.Binary) []target.System {
	return []target.System{
		leaseqt.RPC{Sync: "always", Bin: bin},
		leaseqt.RPC{Sync: "none", Bin: bin},
		leaseqt.InProcess{Backend: leaseqt.BackendRocks, Sync: rocksstore.SyncAlways},
		leaseqt.InProcess{Backend: leaseqt.BackendRocks, Sync: rocksstore.SyncNone},
		leaseqt.InProcess{Backend: leaseqt.BackendMem},
		leaseqt.HTTP{Sync: "always", Bin: bin},
		leaseqt.HTTP{Sync: "none", Bin: bin},
		leaseqt.Loopback{Sync: rocksstore.SyncAlways},
		leaseqt.Loopback{Sync: rocksstore.SyncNone},
	}
}
