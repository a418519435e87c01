package rocksstore

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// sweepChunk is how many leases (or delayed items, or dedup keys) one
// sweep op handles: big enough to amortize a commit, small enough to keep
// a batch (a lease holds up to MaxBatch items) bounded.
const sweepChunk = 64

// Sweep implements storage.Store. A Limit <= 0 means Limits.MaxBatch.
// Sweeps are serialized. Lease expiries and delayed items come from the
// in-memory deadline heaps; dedup expiries from the dedup_expiry index.
func (s *Store) Sweep(ctx context.Context, p storage.SweepParams) (storage.SweepResult, error) {
	if err := s.enter("sweep"); err != nil {
		return storage.SweepResult{}, err
	}
	defer s.exit()
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()
	res, err := s.sweep(ctx, p)
	if err != nil {
		// The ops committed before the error stay: res says what they
		// did, so that the queues they made ready are woken.
		return res, fmt.Errorf("rocksstore: sweep: %w", err)
	}
	return res, nil
}

func (s *Store) sweep(ctx context.Context, p storage.SweepParams) (res storage.SweepResult, err error) {
	now := nanos(p.Now)
	limit := p.Limit
	if limit <= 0 {
		limit = s.limits.MaxBatch
	}
	gained := map[string]bool{}
	defer func() {
		for q := range gained {
			res.ReadyQueues = append(res.ReadyQueues, q)
		}
		sort.Strings(res.ReadyQueues)
		if err != nil {
			res.More, res.Next = false, time.Time{}
		}
	}()
	// First, before the op changes anything (so an undo cannot bring a
	// dropped entry back), the delayed heap against the live count.
	if _, err := s.submit("", 0, func(o *opTx) error {
		s.compactDelayed(s.liveDelayed())
		return nil
	}); err != nil {
		return res, err
	}
	if qs := s.queuesWithPrefetch(); len(qs) > 0 && s.prefetchHold() > 0 {
		g := map[string]bool{}
		if _, err := s.submit("", 0, func(o *opTx) error {
			s.sweepAhead(o, now, qs, g)
			return nil
		}); err != nil {
			return res, err
		}
		for q := range g {
			gained[q] = true
		}
	}
	if s.afterSweepAhead != nil {
		s.afterSweepAhead()
	}
	// Each phase runs ops of up to sweepChunk entries until nothing more is
	// due or limit entries were handled.
	phase := func(step func(o *opTx, max int, part *storage.SweepResult, g map[string]bool) int) error {
		for done := 0; done < limit; {
			if err := checkCtx(ctx, "sweep"); err != nil {
				return err
			}
			var part storage.SweepResult
			var g map[string]bool
			n := 0
			max := min(sweepChunk, limit-done)
			_, err := s.submit("", max, func(o *opTx) error {
				part, g = storage.SweepResult{}, map[string]bool{}
				n = step(o, max, &part, g)
				return nil
			})
			if err != nil {
				return err
			}
			addSweep(&res, part)
			for q := range g {
				gained[q] = true
			}
			done += n
			if n < max {
				return nil
			}
		}
		return nil
	}
	err = phase(func(o *opTx, max int, part *storage.SweepResult, g map[string]bool) int {
		return s.expireDue(o, now, max, part, g)
	})
	if err != nil {
		return res, err
	}
	err = phase(func(o *opTx, max int, part *storage.SweepResult, g map[string]bool) int {
		return s.promoteDue(o, now, max, part, g)
	})
	if err != nil {
		return res, err
	}
	if err := s.sweepDedup(ctx, &res, now, limit); err != nil {
		return res, err
	}

	var next int64
	_, err = s.submit("", 0, func(o *opTx) error {
		next = s.nextDeadline()
		return nil
	})
	if err != nil {
		return res, err
	}
	if next != 0 {
		res.Next = instant(next)
	}
	t, ok, err := s.firstDedupExpiry()
	if err != nil {
		return res, err
	}
	if ok && (res.Next.IsZero() || t.Before(res.Next)) {
		res.Next = t
	}
	res.More = !res.Next.IsZero() && !res.Next.After(instant(now))
	return res, nil
}

func addSweep(res *storage.SweepResult, part storage.SweepResult) {
	res.LeasesExpired += part.LeasesExpired
	res.Requeued += part.Requeued
	res.DeadLettered += part.DeadLettered
	res.Promoted += part.Promoted
	res.DedupDropped += part.DedupDropped
}

// compactSlack is how many entries a deadline heap may hold beyond twice
// its length after its last compaction before it is compacted again.
const compactSlack = 1024

// compactDeadlines drops the stale entries of the deadline heaps once a
// heap has grown past twice its live entries (plus compactSlack): an
// amortized O(1) a push. Found by review (session 70): an entry goes
// stale when its lease is acked, extended or expired, or its delayed item
// is purged or its queue deleted, and nextDeadline drops stale entries
// only from the head, so behind one live early deadline (a lease held for
// hours, an item delayed for days) every later one stayed, 40 bytes each,
// and kept deleted queues' state alive. The live leases are counted at no
// cost; the live delayed items only by a sweep (liveDelayed), so between
// sweeps the delayed heap is held to twice what its last compaction kept.
// REQUIRES: on the committer, between ops or before an op changes
// anything (no undo to come that could bring a dropped entry back).
func (s *Store) compactDeadlines() {
	if len(s.expiry) > 2*len(s.leases)+compactSlack {
		s.expiry = compactTimed(s.expiry, func(t timed) bool {
			l := s.leases[t.token]
			return l != nil && (l.exp == t.at || l.deadline() == t.at)
		})
	}
	s.compactDelayed(s.delayedKept)
}

// compactDelayed compacts the delayed heap when it holds more than twice
// live entries (plus compactSlack). REQUIRES: as compactDeadlines.
func (s *Store) compactDelayed(live int) {
	if len(s.delayed) > 2*live+compactSlack {
		s.delayed = compactTimed(s.delayed, func(t timed) bool {
			vis, ok := t.q.delayed[t.token]
			return ok && vis == t.at && s.live(t.q)
		})
		s.delayedKept = len(s.delayed)
	}
}

// liveDelayed counts the delayed items of every queue. REQUIRES: on the
// committer.
func (s *Store) liveDelayed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, q := range s.mu.queues {
		n += len(q.delayed)
	}
	return n
}

// compactTimed keeps the entries of h for which keep is true, as a heap.
func compactTimed(h timedHeap, keep func(timed) bool) timedHeap {
	n := len(h)
	kept := h[:0]
	for _, t := range h {
		if keep(t) {
			kept = append(kept, t)
		}
	}
	clear(h[len(kept):n])
	for i := len(kept)/2 - 1; i >= 0; i-- {
		kept.down(i)
	}
	if cap(kept) > 4*len(kept)+compactSlack {
		kept = slices.Clone(kept) // give back the room of what was dropped
	}
	return kept
}

// nextDeadline returns the earliest live lease expiry or delayed
// visible_at (0: none), dropping stale heap entries on the way.
// REQUIRES: on the committer.
func (s *Store) nextDeadline() int64 {
	var next int64
	var held []timed
	for {
		t, ok := s.expiry.peek()
		if !ok {
			break
		}
		l := s.leases[t.token]
		if l == nil || l.exp != t.at && l.deadline() != t.at {
			s.expiry.pop()
			continue
		}
		if d := l.deadline(); d > t.at {
			// A poll was promised a later expiry (prefetch.go).
			s.expiry.pop()
			s.expiry.push(timed{at: d, token: t.token})
			continue
		}
		if heldAhead(l) {
			// No caller knows of a held batch's lease: its expiry is
			// nobody's deadline (a sweep gives it back long before).
			s.expiry.pop()
			held = append(held, t)
			continue
		}
		next = t.at
		break
	}
	for _, t := range held {
		s.expiry.push(t)
	}
	for {
		t, ok := s.delayed.peek()
		if !ok {
			break
		}
		if vis, ok := t.q.delayed[t.token]; !ok || vis != t.at {
			s.delayed.pop()
			continue
		}
		if next == 0 || t.at < next {
			next = t.at
		}
		break
	}
	return next
}

// expireDue ends up to max leases whose expiry <= now. REQUIRES: on the
// committer.
func (s *Store) expireDue(o *opTx, now int64, max int, res *storage.SweepResult, gained map[string]bool) int {
	n := 0
	for n < max {
		t, ok := s.expiry.peek()
		if !ok || t.at > now {
			break
		}
		s.expiry.pop()
		l := s.leases[t.token]
		if l == nil || l.exp != t.at && l.deadline() != t.at {
			continue // acked, nacked or extended since
		}
		if l.ahead != nil && s.releaseAhead(o, l.q, func(e *prefetched) bool { return e == l.ahead }) > 0 {
			// A batch claimed ahead that no poll took: given back as if
			// never claimed, not expired. The sweep gave back the stale
			// ones first (sweepAhead), but an ack at an earlier instant
			// than the sweep's may have claimed this one since. Checked
			// and taken out of the queue's list in one step, before the
			// deadline below: a poll off the committer may take the
			// batch at any moment (takePrefetched), and then it is a
			// lease with a promised expiry, which must stay in the heap.
			o.onUndo(func() { s.expiry.push(t) })
			gained[l.q.name] = true
			n++
			continue
		}
		if d := l.deadline(); d > now {
			// A poll was promised a later expiry (prefetch.go).
			s.expiry.push(timed{at: d, token: t.token})
			o.onUndo(func() { s.expiry.push(t) })
			continue
		}
		o.onUndo(func() { s.expiry.push(t) })
		s.expireLease(o, l, now, res, gained)
		n++
	}
	return n
}

// expireLease ends lease l: each item goes back to ready (VisibleAt = the
// expiry, so it queues behind items ready earlier) or, out of attempts,
// to dead. An unconfirmed lease (a batch claimed ahead at a crash, which
// no consumer may ever have received) gives its items back instead, as a
// held batch's give-back does: its attempt and delivery uncounted, each
// item at its old place in the serve order, none dead-lettered. A record
// that cannot be read is left in place and reported by Check. REQUIRES:
// on the committer.
func (s *Store) expireLease(o *opTx, l *leaseState, now int64, res *storage.SweepResult, gained map[string]bool) {
	q := l.q
	d := o.delta(q)
	for _, id := range l.ids {
		if s.inflight[id] != l {
			continue
		}
		ik := dbkeys.InProgressKey(q.name, id)
		v, ok, err := o.getForUpdate(ik)
		if err != nil || !ok {
			s.log.Error("sweep: inflight item unreadable; left for check", "queue", q.name, "item_id", id.String(), "err", err)
			continue
		}
		rec, err := dbkeys.DecodeItem(v)
		if err != nil || rec.Lease != l.token {
			s.log.Error("sweep: inflight item record does not match its lease; left for check", "queue", q.name, "item_id", id.String(), "err", err)
			continue
		}
		s.release(o, l, id)
		o.del(ik)
		d.Inflight--
		if l.unconfirmed {
			rec.Attempts = max(rec.Attempts, 1) - 1
			rec.Delayed = rec.VisibleAt > now
			s.putAvailable(o, q, id, rec, nil, false, nil)
			res.Requeued++
			gained[q.name] = true
			continue
		}
		d.Expired++
		if rec.Attempts >= q.maxAttempts(&rec) {
			s.putDead(o, q, id, rec, "lease expired", now)
			res.DeadLettered++
			continue
		}
		rec.VisibleAt = l.deadline()
		rec.Delayed = rec.VisibleAt > now
		s.putAvailable(o, q, id, rec, nil, false, nil)
		res.Requeued++
		gained[q.name] = true
	}
	// The lease ends whatever its items' state.
	for _, id := range l.ids {
		if s.inflight[id] == l {
			s.release(o, l, id)
		}
	}
	s.finishLease(o, l)
	res.LeasesExpired++
}

// promoteDue moves up to max delayed items whose visible_at <= now into
// the ready count. REQUIRES: on the committer.
func (s *Store) promoteDue(o *opTx, now int64, max int, res *storage.SweepResult, gained map[string]bool) int {
	n := 0
	for n < max {
		t, ok := s.delayed.peek()
		if !ok || t.at > now {
			break
		}
		s.delayed.pop()
		q, id := t.q, storage.ItemID(t.token)
		if vis, ok := q.delayed[id]; !ok || vis != t.at {
			continue // claimed, purged or moved since
		}
		delete(q.delayed, id)
		o.onUndo(func() {
			q.delayed[id] = t.at
			s.delayed.push(t)
		})
		o.del(dbkeys.DelayedKey(t.at, q.name, id))
		d := o.delta(q)
		d.Delayed--
		d.Ready++
		res.Promoted++
		gained[q.name] = true
		n++
	}
	return n
}

// sweepDedup drops up to limit dedup keys due at now, found by scanning
// the dedup_expiry index from its cursor.
func (s *Store) sweepDedup(ctx context.Context, res *storage.SweepResult, now int64, limit int) error {
	cur := &s.dedupCur
	lower := dbkeys.NamespacePrefix(dbkeys.NsDedupExpiry)
	upper := dbkeys.TimeBound(dbkeys.NsDedupExpiry, now+1)
	if now == int64(^uint64(0)>>1) {
		upper = dbkeys.PrefixEnd(lower)
	}
	for done := 0; done < limit; {
		if err := checkCtx(ctx, "sweep"); err != nil {
			return err
		}
		start := cur.begin()
		var keys [][]byte
		err := s.scan(lower, upper, start, func(k, _ []byte) (bool, error) {
			keys = append(keys, k)
			return len(keys) < min(sweepChunk, limit-done), nil
		})
		if err != nil || len(keys) == 0 {
			cur.end(nil, false)
			return err
		}
		dropped := 0
		_, err = s.submit("", len(keys), func(o *opTx) error {
			dropped = 0
			for _, k := range keys {
				exp, qn, key, err := dbkeys.DecodeDedupExpiryKey(k)
				if err != nil {
					return corrupt("sweep", k, err)
				}
				o.del(k)
				dk := dbkeys.DedupKey(qn, key)
				v, ok, err := o.getForUpdate(dk)
				if err != nil {
					return err
				}
				if !ok {
					continue
				}
				rec, err := dbkeys.DecodeDedup(v)
				if err != nil {
					return corrupt("sweep", dk, err)
				}
				if rec.ExpiresAt == exp {
					o.del(dk)
					dropped++
				}
			}
			return nil
		})
		if err != nil {
			cur.end(nil, false)
			return err
		}
		res.DedupDropped += dropped
		cur.end(successor(keys[len(keys)-1]), true)
		done += len(keys)
		if len(keys) < sweepChunk {
			return nil
		}
	}
	return nil
}

// firstDedupExpiry returns the instant of the first live dedup_expiry
// entry.
func (s *Store) firstDedupExpiry() (time.Time, bool, error) {
	lower := dbkeys.NamespacePrefix(dbkeys.NsDedupExpiry)
	var t time.Time
	found := false
	err := s.scanView(lower, dbkeys.PrefixEnd(lower), s.dedupCur.get(), func(k, _ []byte) (bool, error) {
		n, _, _, err := dbkeys.DecodeDedupExpiryKey(k)
		if err != nil {
			return false, corrupt("sweep", k, err)
		}
		t, found = instant(n), true
		return false, nil
	})
	return t, found, err
}
