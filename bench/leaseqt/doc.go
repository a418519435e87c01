// Package leaseqt puts leaseq itself under the benchmark harness, in three
// ways:
//
//   - in process: the storage.Store driven directly (rocksstore with
//     sync=always or sync=none, and memstore as a no-persistence baseline),
//     with the node's own sweeper (package sweeper, as `leaseq serve` runs
//     it) and an in-process wake-up for waiting polls standing in for the
//     RPC dispatcher;
//   - over RPC: a real `leaseq serve` process started by the harness with
//     a fresh --data directory and --listen on a free loopback port, driven
//     through the rpc package's Go client;
//   - over HTTP: the same process started with --http, driven through its
//     HTTP/JSON API (package rpc/httpapi) by net/http, one keep-alive
//     connection per worker and payloads in base64; run only when named
//     (-systems leaseq-http), to compare HTTP enqueue with RPC enqueue.
//
// The RPC rows are the ones to compare with peers (every peer is a server
// reached over loopback TCP); the in-process rows show what the storage
// engine alone can do, and so how much the RPC layer costs.
package leaseqt
