package httpapi

import (
	"sort"
	"sync/atomic"
	"time"
)

// OpMetrics counts the requests of one route.
type OpMetrics struct {
	Op     string        // the route's name, such as "enqueue"
	Count  uint64        // requests answered
	Errors uint64        // requests answered with an error
	Sum    time.Duration // time spent answering them (a long poll includes its wait)
}

// Metrics is a snapshot of a Server's counters, one entry per route,
// sorted by Op. Counters only increase.
type Metrics struct {
	Ops []OpMetrics
}

// Sub returns the counter deltas m - prev.
func (m Metrics) Sub(prev Metrics) Metrics {
	out := Metrics{Ops: make([]OpMetrics, len(m.Ops))}
	copy(out.Ops, m.Ops)
	for i := range out.Ops {
		for _, p := range prev.Ops {
			if p.Op == out.Ops[i].Op {
				out.Ops[i].Count -= p.Count
				out.Ops[i].Errors -= p.Errors
				out.Ops[i].Sum -= p.Sum
			}
		}
	}
	return out
}

// Metrics returns a snapshot of the server's counters.
func (s *Server) Metrics() Metrics {
	m := Metrics{Ops: make([]OpMetrics, 0, len(s.ops))}
	for op, c := range s.ops {
		m.Ops = append(m.Ops, OpMetrics{Op: op, Count: c.count.Load(), Errors: c.errors.Load(), Sum: time.Duration(c.sum.Load())})
	}
	sort.Slice(m.Ops, func(i, j int) bool { return m.Ops[i].Op < m.Ops[j].Op })
	return m
}

type opCounters struct {
	count, errors atomic.Uint64
	sum           atomic.Int64
}

func (c *opCounters) observe(d time.Duration, failed bool) {
	c.count.Add(1)
	if failed {
		c.errors.Add(1)
	}
	c.sum.Add(int64(d))
}
