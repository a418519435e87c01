// Package bench is the harness behind `leaseq bench`: workloads that drive
// leaseq and its peers (beanstalkd, Redis Streams, NATS JetStream) the same
// way, with matched durability, and a report people can read.
//
// Workloads (Config plus Run): round trips without queue work (leaseq's
// nodeInfo against Redis's and NATS's PING: the wire alone), produce-only
// (batch 1 and 100), end-to-end
// (P producers, C consumers, enqueue and poll batches, ack per item or per
// batch), latency (enqueue to ack at a fixed offered rate, and flat out
// from one producer), backlog drain, tombstone churn (a long run split
// into intervals; the last/first ratio shows whether throughput stays
// flat), lease-expiry storm (consumers lease everything and hang; how long
// until every item is redelivered and acked), and many queues (zipf-skewed
// load over 1,000 queues).
//
// Measurement: completions are counted end to end, as acks the client saw
// confirmed. Every payload carries its send time (ns since the run's base
// instant), so enqueue-to-ack latency needs no shared state; latencies go
// into per-goroutine HDR histograms merged at the end. At a fixed rate the
// send time is the scheduled one, so a stalled system is charged for the
// requests it delayed. CPU seconds and peak RSS come from /proc for the
// server process (for in-process systems, the harness's own process); for
// a server in a process of its own, the harness's own CPU over the row is
// reported too, as the client's (the system's client library and the load
// generator). A timed flow (produce, e2e, latency, churn, manyqueues)
// reads the CPU at the edges of the window its items are counted in, so
// that neither connecting nor the enqueues still unacked at the window's
// end are charged to its items; the other workloads are timed whole. The
// peak RSS of an in-process row starts from the harness's memory after a
// collection that hands the earlier rows' heap back (glibc may keep up to
// 64 MiB of RocksDB's freed memory: rocksstore.KeepFreedMemory).
//
// Within a round the systems run in turn, each round starting one system
// further on, so that no system always runs right after the same one.
//
// Each row runs on a fresh instance with a fresh data directory, bounded
// by Config.Timeout beyond its planned length, and is torn down after. A
// row that fails is reported, and the run goes on. Ratios leaseq/peer are
// computed only between rows of the same run and the same durability
// class; with several rounds, each goal also carries its ratio within
// every round (Goal.Rounds), beside the ratio of the medians it is
// judged on.
//
// Time comes from an injected clock.Clock (main.go's clock.New()); the
// package holds no mutable globals and is imported only by main.
package bench
