package rpc

import (
	"sync/atomic"
	"time"
)

// Op names a Queue method in Metrics.
type Op int

// Ops, in schema order.
const (
	OpEnqueue Op = iota
	OpPoll
	OpAck
	OpNack
	OpExtend
	OpStats
	OpQueues
	OpPeek
	OpPurge
	OpDeadList
	OpRedrive
	OpPurgeDead
	OpGetConfig
	OpSetConfig
	OpSubscribe
	OpNodeInfo
	OpDeleteQueue
	numOps
)

var opNames = [numOps]string{
	"enqueue", "poll", "ack", "nack", "extend", "stats", "queues", "peek", "purge",
	"dead_list", "redrive", "purge_dead", "get_config", "set_config", "subscribe", "node_info",
	"delete_queue",
}

// String returns the snake_case name used as a metric label.
func (o Op) String() string {
	if o >= 0 && o < numOps {
		return opNames[o]
	}
	return "unknown"
}

// LatencyBounds are the upper bounds of the latency histogram buckets in
// OpMetrics.Buckets; the last bucket counts everything slower. They span a
// loopback round trip (tens of µs) to a full long-poll wait (60 s).
var LatencyBounds = []time.Duration{
	50 * time.Microsecond, 100 * time.Microsecond, 250 * time.Microsecond, 500 * time.Microsecond,
	time.Millisecond, 2500 * time.Microsecond, 5 * time.Millisecond, 10 * time.Millisecond,
	25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond, 250 * time.Millisecond,
	500 * time.Millisecond, time.Second, 2500 * time.Millisecond, 5 * time.Second, 10 * time.Second,
	30 * time.Second, 60 * time.Second,
}

// OpMetrics counts one operation.
type OpMetrics struct {
	Op      Op
	Count   uint64   // calls handled
	Errors  uint64   // calls answered with a non-none status (or an exception)
	Buckets []uint64 // len(LatencyBounds)+1, non-cumulative
	Sum     time.Duration
}

// Metrics is a snapshot of a Server. Counters only increase; gauges are
// the value at the snapshot.
type Metrics struct {
	Ops [numOps]OpMetrics

	ConnsOpen     int    // gauge
	ConnsAccepted uint64 // connections served
	ConnsRefused  uint64 // refused at MaxConns or failed TLS handshakes
	Waiters       int    // gauge: parked long polls and idle subscriptions
	Subscriptions int    // gauge
	ItemsPushed   uint64 // items delivered to subscriptions
	// ReplyBytesQueued is the bytes of answers built and not yet written
	// to their connections (gauge; each connection's share is bounded by
	// ServerConfig.ConnReplyLimitBytes).
	ReplyBytesQueued int64
}

// Sub returns the counter deltas m - prev; gauges keep m's values.
func (m Metrics) Sub(prev Metrics) Metrics {
	out := m
	for i := range out.Ops {
		o := m.Ops[i]
		p := prev.Ops[i]
		o.Count -= p.Count
		o.Errors -= p.Errors
		o.Sum -= p.Sum
		o.Buckets = append([]uint64(nil), o.Buckets...)
		for j := range o.Buckets {
			if j < len(p.Buckets) {
				o.Buckets[j] -= p.Buckets[j]
			}
		}
		out.Ops[i] = o
	}
	out.ConnsAccepted -= prev.ConnsAccepted
	out.ConnsRefused -= prev.ConnsRefused
	out.ItemsPushed -= prev.ItemsPushed
	return out
}

// opCounters counts one op's calls. A call's count is its latency
// bucket, so that a snapshot taken while calls finish is a valid
// histogram (the buckets add up to Count); its error is counted after
// its bucket and read before them, so Errors never exceeds Count.
type opCounters struct {
	errors  atomic.Uint64
	sum     atomic.Int64
	buckets [20]atomic.Uint64 // len(LatencyBounds)+1
}

func (c *opCounters) observe(d time.Duration, failed bool) {
	c.sum.Add(int64(d))
	i := 0
	for i < len(LatencyBounds) && d > LatencyBounds[i] {
		i++
	}
	c.buckets[i].Add(1)
	if failed {
		c.errors.Add(1)
	}
}

func (c *opCounters) snapshot(op Op) OpMetrics {
	m := OpMetrics{Op: op, Errors: c.errors.Load(), Sum: time.Duration(c.sum.Load()),
		Buckets: make([]uint64, len(LatencyBounds)+1)}
	for i := range m.Buckets {
		m.Buckets[i] = c.buckets[i].Load()
		m.Count += m.Buckets[i]
	}
	return m
}
