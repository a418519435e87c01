package memstore

import (
	"bytes"
	"context"
	"slices"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/check"
)

// layout: one heap per priority holds every available item (ready and
// delayed) in serve order; one store-wide heap holds the delayed ones.
var layout = check.Layout{ServeIndexHoldsDelayed: true, DelayedIndexes: []string{"delayed"}}

// Check implements storage.Store: it turns the model's structures into
// check.Facts, under the mutex, and lets storage/check judge them. What
// only memstore can get wrong (an entry filed under another id, a heap out
// of order or holding a stale object) is reported as check.KindCorrupt.
func (s *Store) Check(_ context.Context) (storage.CheckReport, error) {
	if err := s.lockOpen("check"); err != nil {
		return storage.CheckReport{}, err
	}
	defer s.mu.Unlock()
	var f check.Facts
	for _, name := range s.queueNamesLocked() {
		s.queueFactsLocked(&f, name, s.mu.queues[name])
	}
	if !s.mu.delayed.valid(func(e *entry) int { return e.delayIdx }) {
		f.Corruptf("the delayed heap is out of order")
	}
	for _, e := range s.mu.delayed.s {
		if !s.ownEntryLocked(&f, "the delayed heap", e) {
			continue
		}
		f.Delayed = append(f.Delayed, check.DelayedEntry{Index: "delayed", Queue: e.item.Queue, ID: e.item.ID, VisibleAt: e.item.VisibleAt})
	}
	for token, l := range s.mu.leases {
		if l.id != token {
			f.Corruptf("lease %s is filed under %s", l.id, token)
		}
		if s.mu.queues[l.q.name] != l.q {
			f.Corruptf("lease %s points at a stale queue %q", token, l.q.name)
		}
		fl := check.Lease{Token: token, Queue: l.q.name, ExpiresAt: l.expires}
		for id, e := range l.items {
			if cur := l.q.items[id]; cur != nil && cur != e {
				f.Corruptf("lease %s lists a stale copy of item %s", token, id)
			}
			fl.IDs = append(fl.IDs, id)
		}
		slices.SortFunc(fl.IDs, func(a, b storage.ItemID) int { return bytes.Compare(a[:], b[:]) })
		f.Leases = append(f.Leases, fl)
	}
	if !s.mu.leaseHeap.valid(func(l *lease) int { return l.idx }) {
		f.Corruptf("the lease heap is out of order")
	}
	for _, l := range s.mu.leaseHeap.s {
		if cur := s.mu.leases[l.id]; cur != nil && cur != l {
			f.Corruptf("the lease heap holds a stale copy of lease %s", l.id)
			continue
		}
		f.LeaseExpiries = append(f.LeaseExpiries, check.LeaseExpiry{Token: l.id, ExpiresAt: l.expires})
	}
	if !s.mu.dedupHeap.valid(func(d *dedupEntry) int { return d.idx }) {
		f.Corruptf("the dedup heap is out of order")
	}
	for _, d := range s.mu.dedupHeap.s {
		if cur := d.q.dedup[d.key]; cur != nil && cur != d {
			f.Corruptf("the dedup heap holds a stale copy of key %q of %q", d.key, d.q.name)
			continue
		}
		f.DedupExpiries = append(f.DedupExpiries, check.DedupExpiry{Queue: d.q.name, Key: d.key, ExpiresAt: d.expires})
	}
	// The structures are maps: sort what was found in map order, so the
	// report is the same from run to run.
	slices.Sort(f.Corrupt)
	return check.Run(layout, &f), nil
}

// queueFactsLocked adds one queue's config, counters, items, serve-order
// heaps and dedup keys to f. REQUIRES: s.mu held.
func (s *Store) queueFactsLocked(f *check.Facts, name string, q *queue) {
	f.Queues = append(f.Queues, name)
	f.Counters = append(f.Counters, check.Counters{Queue: name, Ready: q.st.Ready, Delayed: q.st.Delayed,
		Inflight: q.st.Inflight, Dead: q.st.Dead, Leases: q.st.Leases})
	for id, e := range q.items {
		if e.item.ID != id || e.item.Queue != name {
			f.Corruptf("item %s of %q is filed under id %s of %q", e.item.ID, e.item.Queue, id, name)
		}
		it := check.Item{Queue: name, ID: id, Priority: e.item.Priority, VisibleAt: e.item.VisibleAt,
			Attempts: e.item.Attempts, MaxAttempts: e.item.MaxAttempts}
		if e.lease != nil {
			it.Lease = e.lease.id
		}
		switch e.loc {
		case locAvailable:
			it.State = storage.StateReady
			if e.delayed {
				it.State = storage.StateDelayed
			}
		case locInflight:
			it.State = storage.StateInflight
		case locDead:
			// The model keeps an item's reason after a redrive, so the
			// location is its death record.
			it.State, it.DeathRecord = storage.StateDead, true
		}
		if e.loc != locAvailable && e.delayed {
			f.Corruptf("%s item %s of %q is flagged delayed", it.State, id, name)
		}
		f.Items = append(f.Items, it)
	}
	for prio, h := range q.avail {
		if h == nil {
			continue
		}
		if !h.valid(func(e *entry) int { return e.availIdx }) {
			f.Corruptf("queue %q: the priority %d heap is out of order", name, prio)
		}
		for _, e := range h.s {
			if !s.ownEntryLocked(f, "a serve-order heap", e) {
				continue
			}
			f.Serve = append(f.Serve, check.ServeEntry{Queue: name, Priority: uint8(prio), VisibleAt: e.item.VisibleAt, ID: e.item.ID})
		}
	}
	for key, d := range q.dedup {
		if d.key != key || d.q != q {
			f.Corruptf("dedup key %q of %q is filed under %q of %q", d.key, d.q.name, key, name)
		}
		f.Dedups = append(f.Dedups, check.Dedup{Queue: name, Key: key, ID: d.id, ExpiresAt: d.expires})
	}
}

// ownEntryLocked reports whether e, found in the named heap, is the
// entry its queue files under its id (or no entry is filed there);
// otherwise it reports the stale object as corrupt. REQUIRES: s.mu held.
func (s *Store) ownEntryLocked(f *check.Facts, heap string, e *entry) bool {
	if q := s.mu.queues[e.item.Queue]; q != nil {
		if cur := q.items[e.item.ID]; cur != nil && cur != e {
			f.Corruptf("%s holds a stale copy of item %s of %q", heap, e.item.ID, e.item.Queue)
			return false
		}
	}
	return true
}
