package webui

import (
	"sync"
	"time"

	"github.com/leaseq/leaseq/storage"
)

// maxRingSize bounds the samples kept per queue (24 bytes each). A ring
// holds window/spacing+2 samples, at most one per spacing, so it always
// reaches back past the start of the window; a spacing so short that this
// would exceed maxRingSize is stretched instead.
const maxRingSize = 64

// sample is one reading of a queue's lifetime counters.
type sample struct {
	at              time.Time
	enqueued, acked uint64
}

// ring is a fixed-size circular buffer of samples, oldest first from
// start.
type ring struct {
	buf   []sample
	start int // index of the oldest sample
	n     int // samples held
	gen   uint64
}

func (r *ring) at(i int) *sample { return &r.buf[(r.start+i)%len(r.buf)] }

func (r *ring) last() *sample {
	if r.n == 0 {
		return nil
	}
	return r.at(r.n - 1)
}

func (r *ring) push(s sample) {
	if r.n < len(r.buf) {
		*r.at(r.n) = s
		r.n++
		return
	}
	r.buf[r.start] = s
	r.start = (r.start + 1) % len(r.buf)
}

// rate is a queue's enqueue and ack rate over (about) the last window. OK
// is false when there is not yet a sample old enough to measure against.
type rate struct {
	Enqueue, Ack float64 // per second
	OK           bool
}

// rates keeps a ring of samples per queue. Memory is one ring of size
// entries per queue that exists; rings of queues missing from a full
// observation are dropped.
type rates struct {
	window  time.Duration
	spacing time.Duration // minimum time between two recorded samples
	minSpan time.Duration // shortest span a rate is computed over
	size    int

	mu struct {
		sync.Mutex
		queues map[string]*ring
		gen    uint64 // full observations so far
	}
}

func newRates(window, spacing time.Duration) *rates {
	size := int(window/spacing) + 2
	if size > maxRingSize {
		// A very short spacing: keep the ring small and record a sample
		// only as often as it can hold a window.
		size = maxRingSize
		spacing = window / time.Duration(size-2)
	}
	r := &rates{window: window, spacing: spacing, size: size, minSpan: min(spacing, time.Second)}
	r.mu.queues = make(map[string]*ring)
	return r
}

// observe records the counters in st as read at now (a sample per queue at
// most every spacing) and returns each queue's rate, in st's order: the
// counter increase since the oldest sample within the window, per second.
// With all set, st holds every queue, and the rings of queues not in it are
// dropped.
func (r *rates) observe(now time.Time, st []storage.QueueStats, all bool) []rate {
	out := make([]rate, len(st))
	r.mu.Lock()
	defer r.mu.Unlock()
	gen := r.mu.gen
	if all {
		r.mu.gen++
		gen = r.mu.gen
	}
	for i := range st {
		q := &st[i]
		rg := r.mu.queues[q.Queue]
		if rg == nil {
			rg = &ring{buf: make([]sample, r.size)}
			r.mu.queues[q.Queue] = rg
		}
		if all {
			rg.gen = gen
		}
		out[i] = r.rateLocked(rg, now, q)
		if l := rg.last(); l == nil || now.Sub(l.at) >= r.spacing {
			rg.push(sample{at: now, enqueued: q.Enqueued, acked: q.Acked})
		} else if now.Before(l.at.Add(-r.window)) {
			// The clock went back (a mock clock set by a test, or a
			// wall-clock step): start over rather than divide by a
			// negative span.
			rg.n, rg.start = 0, 0
			rg.push(sample{at: now, enqueued: q.Enqueued, acked: q.Acked})
		}
		// A reading a little older than the last sample (the sampler and
		// a page read the clock, then the slow Stats, and finished out of
		// order) is not recorded: the window stays.
	}
	if all {
		for name, rg := range r.mu.queues {
			if rg.gen != gen {
				delete(r.mu.queues, name)
			}
		}
	}
	return out
}

// rateLocked computes q's rate against the oldest sample of rg within the
// window. REQUIRES: r.mu held.
func (r *rates) rateLocked(rg *ring, now time.Time, q *storage.QueueStats) rate {
	for i := 0; i < rg.n; i++ {
		s := rg.at(i)
		age := now.Sub(s.at)
		if age > r.window {
			continue
		}
		if age < r.minSpan || q.Enqueued < s.enqueued || q.Acked < s.acked {
			// Too short to mean anything, or counters that went back (a
			// different store behind the same name): no rate yet.
			return rate{}
		}
		secs := age.Seconds()
		return rate{
			Enqueue: float64(q.Enqueued-s.enqueued) / secs,
			Ack:     float64(q.Acked-s.acked) / secs,
			OK:      true,
		}
	}
	return rate{}
}

// tracked returns the number of queues with a ring (for tests).
func (r *rates) tracked() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.mu.queues)
}
