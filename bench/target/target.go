// Package target defines what the benchmark harness drives: a System (one
// queue implementation in one durability mode), the Instance it starts (a
// server process or an in-process store with a fresh data directory), and
// the per-worker Client that enqueues, polls and acks.
//
// The harness (package bench) owns workloads and measurement; systems live
// in sub-packages (bench/peers for beanstalkd, Redis Streams and NATS
// JetStream, bench/leaseqt for leaseq itself) and only implement these
// interfaces, so a workload is written once and runs against every system
// the same way.
//
// Concurrency: an Instance is shared by all workers of one run and must be
// safe for concurrent Connect calls. A Client belongs to one worker
// goroutine at a time (beanstalkd binds reservations to a connection, Redis
// to a consumer name), so Clients need not be goroutine-safe.
package target

import (
	"context"
	"fmt"
	"time"

	"github.com/benbjohnson/clock"
)

// Class says when a system acknowledges a write relative to fsync. Rows are
// only compared within one class: leaseq sync=always against peers that
// fsync before they acknowledge, sync=none against peers that do not.
type Class string

const (
	// ClassDurable: the write is fsynced before the client sees the
	// acknowledgement (per operation or shared by a group commit).
	ClassDurable Class = "durable"
	// ClassRelaxed: the write is acknowledged before it is fsynced (no
	// fsync, or a periodic one such as Redis everysec).
	ClassRelaxed Class = "relaxed"
	// ClassMemory: nothing is persisted (leaseq's memstore baseline). Such
	// rows are shown for scale and never compared.
	ClassMemory Class = "memory"
)

// Durability describes a system's configured durability for the report.
type Durability struct {
	Class Class
	// Mode is the human description printed in every row, such as
	// "fsync per op", "group commit", "fsync every 1s", "no fsync".
	Mode string
}

// StartOptions configures one Instance.
type StartOptions struct {
	// Dir is a fresh, empty directory the instance owns for its data and
	// logs; the harness removes it after Close.
	Dir string
	// Queues the workload will use; systems that need queues declared up
	// front (Redis consumer groups, NATS consumers) create them in Start.
	Queues []string
	// Lease is how long a polled item stays invisible before it is handed
	// out again (leaseq lease, beanstalkd TTR, Redis XAUTOCLAIM min-idle,
	// NATS AckWait).
	Lease time.Duration
	// Clock is the harness's clock; systems use it for readiness back-off
	// and for periodic work such as Redis's reclaim scans.
	Clock clock.Clock
	// Trace: the harness will ask the instance for an execution trace of
	// its server (Tracer); a server that can record one is started ready
	// to.
	Trace bool
}

// System is one queue implementation in one durability mode, such as
// "redis" with appendfsync always.
type System interface {
	// Name is short and unique within a run, such as "redis-always".
	Name() string
	// Family groups modes of one product ("leaseq", "redis", ...); ratios
	// compare a leaseq row with each peer family's row of the same class.
	Family() string
	Durability() Durability
	// Available returns nil when the system can run here (its binary is
	// installed), else an error saying what is missing.
	Available() error
	// Start brings up a fresh instance. The caller must Close it.
	Start(ctx context.Context, o StartOptions) (Instance, error)
}

// Instance is a running system with its own data directory.
type Instance interface {
	// Connect opens a client for one worker.
	Connect(ctx context.Context) (Client, error)
	// PID is the process whose CPU time and peak RSS the report shows: the
	// server process, or os.Getpid() for in-process systems (whose numbers
	// then include the harness itself).
	PID() int
	// Close stops the instance (killing a server that does not exit in
	// time) and releases everything Start acquired. It is idempotent.
	Close() error
}

// Counters is implemented by an Instance that keeps counters of its own
// worth reporting: the harness reads them before and after a row and
// shows each one's increase in the row's notes (Result.Extra). Values
// only grow.
type Counters interface {
	Counters() map[string]float64
}

// Tracer is implemented by an Instance whose server process can record a
// Go execution trace (leaseq serve --pprof), when started with
// StartOptions.Trace.
type Tracer interface {
	// Trace starts recording d of the server's execution trace into a
	// new file at path; wait returns once the file is written.
	Trace(ctx context.Context, d time.Duration, path string) (wait func() error)
}

// Delivery is one item handed to a consumer by Poll. Handle is the
// system's own receipt (lease and id, stream entry id, job id, NATS
// message) and is only passed back to Ack of the same Client.
type Delivery struct {
	Payload []byte
	Handle  any
}

// Client is one worker's connection. Payload slices passed to Enqueue are
// not retained after it returns.
type Client interface {
	// Enqueue writes payloads to queue and returns once the system has
	// acknowledged every one of them under its durability mode.
	Enqueue(ctx context.Context, queue string, payloads [][]byte) error
	// Poll leases up to max ready items, waiting up to wait for the first
	// one (0: return at once). No items is not an error.
	Poll(ctx context.Context, queue string, max int, wait time.Duration) ([]Delivery, error)
	// Ack completes deliveries; it returns once the system has confirmed
	// them, so the harness counts acks seen by the client. When the
	// system answered that some of them were not this client's to
	// complete any more, it returns a *LostAcks (and only that).
	Ack(ctx context.Context, queue string, ds []Delivery) error
	// Close releases the connection. Deliveries not acked are left to
	// lease expiry (or, for beanstalkd, released by the server).
	Close() error
}

// LostAcks is what Client.Ack returns when the system took the ack but
// answered that some of its deliveries were not completed by it: the
// lease ran out and the item went to another consumer (leaseq
// LeaseExpired, LeaseMismatch), or the item is gone (leaseq NotFound, an
// XACK that Redis counted fewer ids for, beanstalkd NOT_FOUND on delete).
// An at-least-once consumer meets that when it is slow, so it does not
// fail the run; but those items were not completed by this ack, and a bug
// that turned acks into NotFound must not read as throughput: the harness
// counts them apart (the row's acks_lost), not as items done.
type LostAcks struct {
	// N is how many of the deliveries were not acked.
	N int
	// Index lists which, by their index in the slice passed to Ack; nil
	// when the system says only how many (Redis's XACK).
	Index []int
}

func (e *LostAcks) Error() string {
	return fmt.Sprintf("%d of the acked deliveries were no longer this consumer's (lease expired or item gone)", e.N)
}

// Lost reports whether delivery i of an ack is among the lost ones; when
// the system did not say which, every one may be.
func (e *LostAcks) Lost(i int) bool {
	if e == nil || e.N == 0 {
		return false
	}
	if e.Index == nil {
		return true
	}
	for _, j := range e.Index {
		if j == i {
			return true
		}
	}
	return false
}

// AckPoller is implemented by a Client that can ack one batch and poll for
// the next in a single round trip: the ack and the poll are sent together
// (pipelined) and, on a durable system, share one fsync. The harness uses
// it when run with -ack-poll. acked runs once the ack is confirmed, before
// AckPoll returns (it may run on another goroutine), with the acks the
// system answered were lost (as Client.Ack's *LostAcks; nil when none
// was); a poll that waits for items does not hold up the ack. No items is
// not an error.
type AckPoller interface {
	AckPoll(ctx context.Context, queue string, ack []Delivery, acked func(lost *LostAcks), max int, wait time.Duration) ([]Delivery, error)
}

// Pinger is implemented by a Client that can make a round trip to its
// server that does no queue work (leaseq's nodeInfo, Redis's PING, NATS's
// PING/PONG): the roundtrip row measures what the wire and the server's
// connection handling cost per call, with nothing behind them. Systems
// without such a command (beanstalkd) and in-process systems (no wire)
// do not implement it and are left out of that row.
type Pinger interface {
	Ping(ctx context.Context) error
}
