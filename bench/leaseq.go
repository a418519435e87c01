package bench

import "github.com/leaseq/leaseq/bench/target"

// leaseqSystems lists leaseq's own systems (in-process stores and the RPC
// server).
func leaseqSystems(Config) []target.System { return nil }
