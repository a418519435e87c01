// Package storage defines the contract of a leaseq backend: the Store
// interface, its domain types (Item, ItemID, LeaseID, State, Code,
// QueueConfig), one Params struct per method, the Limits every layer
// enforces, and the sentinel errors.
//
// Semantics (DESIGN.md is the source): at-least-once delivery under leases.
// An item is in exactly one State. A poll moves ready items to inflight
// under one new lease token; ack deletes them, nack or lease expiry returns
// them (or dead-letters them once Attempts reaches max attempts). A lease is
// live while now < ExpiresAt, judged by the caller's Now, whether or not the
// sweeper has run.
//
// Lease token checks, per id, in this order:
//   - the item is not in the queue at all (acked, purged, never existed):
//     CodeNotFound;
//   - the item is inflight under the presented lease: CodeOK if the lease is
//     live, else CodeLeaseExpired;
//   - the item is inflight under another lease: CodeLeaseMismatch;
//   - the item exists but is not inflight (available or dead): if the
//     presented lease is live, CodeLeaseMismatch (it does not list the item),
//     otherwise CodeLeaseExpired (a stale token whose items were returned).
//
// Optional capabilities a store may add: Nonblocking (its calls never wait
// for I/O), ReadyWatcher (tells other nodes' pollers when a shared queue
// gains ready items), EnqueueClaimer (claims for waiting polls in the
// commit, and fsync, of the enqueue that feeds them; rocksstore) and
// Async (enqueue, poll and ack report through a callback run by whoever
// makes them durable, so a server's network reader need not wait or hand
// the call to a goroutine; rocksstore) and SyncHolder (an Async store's
// fsyncs wait while a caller hands over calls that came together, so they
// share one; rocksstore).
//
// Subpackages: rocksstore (embedded RocksDB, the default), memstore (the
// reference model used by tests and benchmark baselines), storagetest (the
// conformance suite every Store passes), check (the invariants of
// DESIGN.md that Store.Check verifies, written once: each backend's Check
// only scans its own representation into check.Facts and lets check.Run
// judge them and build the CheckReport). The package never reads a clock:
// callers pass instants in the Params.
package storage
