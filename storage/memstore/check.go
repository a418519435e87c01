package memstore

import (
	"context"
	"fmt"

	"github.com/leaseq/leaseq/storage"
)

// Check implements storage.Store: it verifies the invariants of DESIGN.md
// against the model's own structures, with a full scan.
func (s *Store) Check(_ context.Context) (storage.CheckReport, error) {
	if err := s.lockOpen("check"); err != nil {
		return storage.CheckReport{}, err
	}
	defer s.mu.Unlock()
	var rep storage.CheckReport
	bad := func(format string, args ...any) {
		rep.Violations = append(rep.Violations, fmt.Sprintf(format, args...))
	}

	delayedSeen := 0
	for _, name := range s.queueNamesLocked() {
		q := s.mu.queues[name]
		var ready, delayed, inflight, dead, availInHeaps int64
		for id, e := range q.items {
			rep.Items++
			if e.item.ID != id || e.item.Queue != name {
				bad("queue %q: item %s is filed under id %s / queue %q", name, e.item.ID, id, e.item.Queue)
			}
			// Invariant 1: exactly one location.
			switch e.loc {
			case locAvailable:
				// Invariant 2: exactly one index entry.
				h := q.avail[e.item.Priority]
				if h == nil || e.availIdx < 0 || e.availIdx >= len(h.s) || h.s[e.availIdx] != e {
					bad("queue %q: available item %s is not in its priority index", name, id)
				}
				if e.lease != nil {
					bad("queue %q: available item %s still points at a lease", name, id)
				}
				if e.delayed {
					delayed++
					delayedSeen++
					if e.delayIdx < 0 || e.delayIdx >= len(s.mu.delayed.s) || s.mu.delayed.s[e.delayIdx] != e {
						bad("queue %q: delayed item %s is not in the delayed index", name, id)
					}
				} else {
					ready++
					if e.delayIdx != -1 {
						bad("queue %q: ready item %s is in the delayed index", name, id)
					}
				}
			case locInflight:
				inflight++
				// Invariant 3: listed by exactly one (its) lease.
				if e.lease == nil || e.lease.items[id] != e || s.mu.leases[e.lease.id] != e.lease || e.lease.q != q {
					bad("queue %q: inflight item %s is not listed by a live lease record of its queue", name, id)
				}
				if e.availIdx != -1 || e.delayIdx != -1 || e.delayed {
					bad("queue %q: inflight item %s is still indexed as available", name, id)
				}
			case locDead:
				dead++
				if e.availIdx != -1 || e.delayIdx != -1 || e.lease != nil {
					bad("queue %q: dead item %s is still indexed elsewhere", name, id)
				}
			default:
				bad("queue %q: item %s has no location (%d)", name, id, e.loc)
			}
			// Invariant 5, for items whose limit cannot move under them
			// (a queue's max_attempts may be lowered by SetQueueConfig).
			if m := e.item.MaxAttempts; m > 0 && e.loc != locDead && e.item.Attempts > m {
				bad("queue %q: item %s has %d attempts, max %d", name, id, e.item.Attempts, m)
			}
		}
		for prio, h := range q.avail {
			if h == nil {
				continue
			}
			availInHeaps += int64(len(h.s))
			if !h.valid(func(e *entry) int { return e.availIdx }) {
				bad("queue %q: priority %d index is not a valid heap", name, prio)
			}
			for _, e := range h.s {
				if q.items[e.item.ID] != e || e.loc != locAvailable || int(e.item.Priority) != prio {
					bad("queue %q: priority %d index lists %s, which is not an available item of that priority", name, prio, e.item.ID)
				}
			}
		}
		if availInHeaps != ready+delayed {
			bad("queue %q: %d index entries for %d available items", name, availInHeaps, ready+delayed)
		}
		var leases int64
		for _, l := range s.mu.leases {
			if l.q == q {
				leases++
			}
		}
		// Invariant 4: counters equal the scan.
		for _, c := range []struct {
			what      string
			got, want int64
		}{
			{"ready", q.st.Ready, ready},
			{"delayed", q.st.Delayed, delayed},
			{"inflight", q.st.Inflight, inflight},
			{"dead", q.st.Dead, dead},
			{"leases", q.st.Leases, leases},
		} {
			if c.got != c.want {
				bad("queue %q: %s counter is %d, a scan counts %d", name, c.what, c.got, c.want)
			}
		}
		for key, d := range q.dedup {
			if d.key != key || d.q != q || d.idx < 0 || d.idx >= len(s.mu.dedupHeap.s) || s.mu.dedupHeap.s[d.idx] != d {
				bad("queue %q: dedup key %q is not indexed", name, key)
			}
		}
	}
	if delayedSeen != len(s.mu.delayed.s) || !s.mu.delayed.valid(func(e *entry) int { return e.delayIdx }) {
		bad("delayed index has %d entries for %d delayed items, or is not a heap", len(s.mu.delayed.s), delayedSeen)
	}

	for id, l := range s.mu.leases {
		rep.Leases++
		if l.id != id {
			bad("lease %s is filed under %s", l.id, id)
		}
		if len(l.items) == 0 {
			bad("lease %s lists no items", id)
		}
		if l.idx < 0 || l.idx >= len(s.mu.leaseHeap.s) || s.mu.leaseHeap.s[l.idx] != l {
			bad("lease %s has no expiry index entry", id)
		}
		for iid, e := range l.items {
			if l.q.items[iid] != e || e.loc != locInflight || e.lease != l {
				bad("lease %s lists item %s, which is not inflight under it", id, iid)
			}
		}
	}
	if len(s.mu.leaseHeap.s) != len(s.mu.leases) || !s.mu.leaseHeap.valid(func(l *lease) int { return l.idx }) {
		bad("lease expiry index has %d entries for %d leases, or is not a heap", len(s.mu.leaseHeap.s), len(s.mu.leases))
	}
	nDedup := 0
	for _, q := range s.mu.queues {
		nDedup += len(q.dedup)
	}
	if nDedup != len(s.mu.dedupHeap.s) || !s.mu.dedupHeap.valid(func(d *dedupEntry) int { return d.idx }) {
		bad("dedup expiry index has %d entries for %d keys, or is not a heap", len(s.mu.dedupHeap.s), nDedup)
	}
	return rep, nil
}
