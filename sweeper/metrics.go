package sweeper

import (
	"time"

	"github.com/leaseq/leaseq/storage"
)

// Metrics is a snapshot of a Sweeper's counters and gauges. Counters only
// increase over the Sweeper's life; take interval deltas with Sub. main
// decides how to export them.
type Metrics struct {
	// Passes counts completed passes (successful or not).
	Passes uint64
	// FailedPasses counts passes that ended with an error.
	FailedPasses uint64
	// LeasesExpired, Requeued, DeadLettered, Promoted and DedupDropped sum
	// the storage.SweepResult fields over all passes.
	LeasesExpired uint64
	Requeued      uint64
	DeadLettered  uint64
	Promoted      uint64
	DedupDropped  uint64

	// LastPassDuration is how long the last pass took (gauge).
	LastPassDuration time.Duration
	// LastLag is how late the last timer-driven pass started after the
	// deadline its timer was armed for (gauge). With a real clock it is
	// timer and scheduling latency; a large value means the node is
	// overloaded and leases are reclaimed late.
	LastLag time.Duration
	// MaxLag is the largest LastLag seen (gauge).
	MaxLag time.Duration
}

// Sub returns the counters accumulated since prev (m minus prev); gauges
// are kept from m.
func (m Metrics) Sub(prev Metrics) Metrics {
	d := m
	d.Passes -= prev.Passes
	d.FailedPasses -= prev.FailedPasses
	d.LeasesExpired -= prev.LeasesExpired
	d.Requeued -= prev.Requeued
	d.DeadLettered -= prev.DeadLettered
	d.Promoted -= prev.Promoted
	d.DedupDropped -= prev.DedupDropped
	return d
}

func (s *Sweeper) recordPass(res storage.SweepResult, failed bool, took time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := &s.mu.metrics
	m.Passes++
	if failed {
		m.FailedPasses++
	}
	m.LeasesExpired += uint64(res.LeasesExpired)
	m.Requeued += uint64(res.Requeued)
	m.DeadLettered += uint64(res.DeadLettered)
	m.Promoted += uint64(res.Promoted)
	m.DedupDropped += uint64(res.DedupDropped)
	m.LastPassDuration = took
}

func (s *Sweeper) recordLag(lag time.Duration) {
	if lag < 0 {
		lag = 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.metrics.LastLag = lag
	if lag > s.mu.metrics.MaxLag {
		s.mu.metrics.MaxLag = lag
	}
}
