package rocksstore

import (
	"slices"
	"time"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// Claims ahead (SyncAlways only). A consumer that acks a whole lease
// usually polls again at once, with the same max and lease, and with
// SyncAlways that poll would wait for an fsync of its own after the ack
// waited for one. So an ack that ends its lease, on a queue with at least
// two such batches ready, also claims the next batch in the ack's own
// commit (and fsync): an ordinary claim under an ordinary lease, kept in
// the queue's prefetch list instead of being answered. A poll that
// matches one (same max and lease, within PrefetchHold after the claim,
// and nothing now ready, nor held in a batch that cannot answer it, that
// a claim would take first) is answered with
// it at once: its lease is already durable, so no batch and no fsync, and
// the lease is promised the expiry a claim at the poll would have had.
// Any other poll (and the claim an enqueue makes for a parked poll), and
// Peek, Purge, Check, a sweep (for stale batches) and Close, give the held
// batches back first, and a sweep's expiry step gives back a held batch it
// finds due (claimed by an ack at an earlier instant than the sweep's,
// after the sweep's first step): their items go back to available exactly
// as they were (attempts and visibility restored), so no caller can tell
// a batch was held (the model-based conformance suites run with claims
// ahead on). A sweep that gives batches back reports their queues as
// gained (the sweeper wakes their parked polls); an ack claims nothing
// ahead while its queue holds a stale batch, and leaves the batch to the
// sweep. A poll takes a queue as holding a batch from the moment an op
// begins to claim it ahead (claimingAhead) until its items are back in
// the ready index after a give-back (returning): between the two, the
// items are in neither, and a long poll that looked then parked with
// them ready (found by review, session 70).
//
// A batch held at a crash is a lease in the database like any other but
// for its record's claimed-ahead mark (dbkeys.LeaseRecord.Ahead, written
// by the claim; a poll that takes the batch writes nothing, so the mark
// stays until the lease is next written). Open rebuilds such a lease
// unconfirmed: a consumer may hold it (its ack, nack or extend works and
// confirms it), or nobody ever received it, so its expiry gives its
// items back with no attempt counted rather than counting one that may
// dead-letter items no consumer saw. What that costs is an attempt
// uncounted for a batch taken before the crash whose consumer then let
// the lease run out. A clean Close (keepPromises) and a Recover
// (restoreAside) write the record of every taken lease without the mark
// first. The other trace of a crash: the database keeps a taken lease's
// claim-time expiry, up to the hold before the one its poll was
// promised, until the lease is next written (a partial ack or nack, an
// extend, a clean Close: keepPromise, or a Recover). Recover
// reopens a failed store, which cannot write first as Close does, so it
// notes the held batches and the promises before it drops the in-memory
// state, and once reopened gives back those whose claim the database
// holds and writes the promises (setAside, restoreAside). What its notes
// miss is a write of a call in flight at the failure that the database
// lacks (its commit failed, not only its fsync): a batch that call's op
// gave back stays held, and a promise it wrote (a partial ack) stays
// unwritten, as after a crash. A poll answered in a failed batch with a
// held batch (its caller was told of the failure) leaves that lease
// nobody's until it expires, as a plain poll's claim there does.
// Measured: docs/BENCHMARKS.md, "Claims ahead".

// DefaultPrefetchHold is how long a batch claimed ahead waits for a poll
// when Options.PrefetchHold is 0: long enough for a consumer's next poll
// after its ack's answer, also over a network, and short against a lease.
const DefaultPrefetchHold = 20 * time.Millisecond

// maxPrefetched caps the batches claimed ahead a queue holds at once
// (about one per consumer).
const maxPrefetched = 16

// prefetchBackoff is how many ends of leases on a queue claim nothing
// ahead after an entry went stale (its consumer stopped polling).
const prefetchBackoff = 64

// prefetched is one batch claimed ahead. ready and released are guarded
// by the queue's mu; the rest does not change once it is in the list.
type prefetched struct {
	res      storage.PollResult
	l        *leaseState
	recs     []dbkeys.ItemRecord // the items' records before the claim, in claim order
	prios    []uint8             // the items' priorities, in claim order
	now      int64               // the claim's instant
	max      int
	dur      int64
	ready    bool // durable: the commit that claimed it has been fsynced
	released bool // taken out of the list by the committer (released, or its lease ended)
}

// prefetchHold returns the hold of claims ahead, 0 when they are off.
func (s *Store) prefetchHold() int64 {
	if s.opts.Sync != SyncAlways || s.opts.PrefetchHold < 0 {
		return 0
	}
	if s.opts.PrefetchHold == 0 {
		return int64(DefaultPrefetchHold)
	}
	return int64(s.opts.PrefetchHold)
}

// prefetchPlan carries what an ack's op learnt about its lease to the
// op that may claim ahead after it (same batch, next op).
type prefetchPlan struct {
	q     *queueState
	now   int64
	max   int
	dur   int64
	ended bool // the ack ended the lease, which a plain poll had claimed
	e     *prefetched
}

// withPrefetch wraps an ack's op so that it records in plan whether it
// ended lease token, and returns what the op after it applies to claim
// ahead. REQUIRES: prefetchHold() > 0.
func (s *Store) withPrefetch(q *queueState, token storage.LeaseID, now int64, ack func(o *opTx) error) (wrapped, ahead func(o *opTx) error, plan *prefetchPlan) {
	plan = &prefetchPlan{q: q, now: now}
	wrapped = func(o *opTx) error {
		l := s.leases[token]
		if err := ack(o); err != nil {
			return err
		}
		if l != nil && l.max > 0 && s.leases[token] == nil {
			plan.ended, plan.max, plan.dur = true, l.max, l.dur
		}
		return nil
	}
	return wrapped, func(o *opTx) error { return s.claimAhead(o, plan) }, plan
}

// claimAhead claims the next batch for the consumer whose ack ended a
// lease (plan), if the queue has two such batches ready and the lease is
// longer than twice the hold (a held batch is given back long before its
// lease could expire). REQUIRES: on the committer.
func (s *Store) claimAhead(o *opTx, plan *prefetchPlan) error {
	q := plan.q
	o.op.items = 0
	if !plan.ended || s.closing.Load() {
		return nil
	}
	hold := s.prefetchHold()
	if q.prefetchSkip > 0 {
		q.prefetchSkip--
		return nil
	}
	q.mu.Lock()
	// A stale batch (its consumer stopped polling) is left for the sweep
	// to give back, which announces its items to parked polls (an ack
	// cannot; found by review, session 70), and nothing more is claimed
	// ahead meanwhile.
	stale := slices.ContainsFunc(q.prefetch, func(e *prefetched) bool { return plan.now-e.now > hold })
	// Nor while a Peek reads the queue (found by review, session 74: a
	// batch claimed between its give-back and its scan was in neither
	// listing, ready items no consumer held hidden from it).
	enough := !stale && q.peeking == 0 && len(q.prefetch) < maxPrefetched && q.ready.n >= 2*plan.max && plan.dur > 2*hold
	if enough {
		q.claimingAhead++ // until the batch is held, or the claim undone (pollOp)
	}
	q.mu.Unlock()
	if !enough {
		return nil
	}
	var took []claimedItem
	o.keepClaimed, o.claimingAhead = &took, true
	res, err := s.claim(o, q, plan.now, plan.max, plan.dur)
	o.keepClaimed, o.claimingAhead = nil, false
	if err != nil || len(took) == 0 {
		q.mu.Lock()
		q.claimingAhead--
		q.mu.Unlock()
		return err
	}
	o.b.polls++
	o.op.items = len(took)
	e := &prefetched{res: res, l: s.leases[res.Lease], now: plan.now, max: plan.max, dur: plan.dur,
		recs: make([]dbkeys.ItemRecord, len(took)), prios: make([]uint8, len(took))}
	for i, c := range took {
		e.recs[i], e.prios[i] = c.rec, c.prio
	}
	e.l.ahead = e
	o.ahead = e // finish puts it in the queue's list, with the claim's counters, and ends claimingAhead
	o.onUndo(func() {
		q.mu.Lock()
		q.dropAheadLocked(e)
		q.claimingAhead--
		q.mu.Unlock()
	})
	plan.e = e
	s.m.prefetched.Add(1)
	return nil
}

// prefetchDone makes the batch plan claimed ahead takeable once the
// commit that claimed it is durable (ok), or drops it (the commit
// failed: the claim was undone).
func (s *Store) prefetchDone(plan *prefetchPlan, ok bool) {
	e := plan.e
	if e == nil {
		return
	}
	q := plan.q
	q.mu.Lock()
	if ok {
		e.ready = true
	} else {
		q.dropAheadLocked(e)
	}
	q.mu.Unlock()
}

// takePrefetched answers a poll of max items leased for lease ns at now
// with a batch claimed ahead, if one matches: claimed with the same max
// and lease within the hold of now, and holding what a claim at now would
// take: nothing ready now comes before its last item in serve order (an
// item ready since the claim may: one whose lease expired, ready again as
// of its expiry, or one enqueued at an earlier instant by a racing
// caller), nor an item of a held batch that cannot answer the poll
// (heldBefore), and it is full or nothing else is ready; of several, the
// one whose first item comes first. Off the committer
// (inOp false) only a durable batch answers, at once; a poll's op (inOp)
// takes any, since its own fsync covers the batch that claimed it. The answer's
// lease counts from now, as a claim's at now would: the lease is
// promised that expiry (leaseState.deadline), and the database keeps the
// claim's, up to the hold earlier, until the lease is next written (a
// crash before that ends it that much sooner). With no match, e is nil:
// the poll's op then gives every held batch back before it claims
// (claimHead), so that it takes what it would have without them.
func (s *Store) takePrefetched(q *queueState, max int, lease, now int64, inOp bool) (res storage.PollResult, e *prefetched) {
	hold := s.prefetchHold()
	if hold == 0 {
		return storage.PollResult{}, nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.prefetch) == 0 {
		return storage.PollResult{}, nil
	}
	prio, first, anyReady := q.ready.firstReady(now)
	best := -1
	for i, e := range q.prefetch {
		match := e.answers(max, lease, now, hold) &&
			!(anyReady && (len(e.recs) < e.max || e.sortsAfter(prio, first))) &&
			!q.heldBefore(e, max, lease, now, hold)
		if !match || !e.ready && !inOp {
			continue // off the committer, a batch whose commit is not durable yet is not taken
		}
		if best < 0 || e.firstBefore(q.prefetch[best]) {
			best = i
		}
	}
	if best < 0 {
		return storage.PollResult{}, nil
	}
	e = q.prefetch[best]
	q.prefetch = slices.Delete(q.prefetch, best, best+1)
	e.released = true
	s.m.prefetchHits.Add(1)
	res = e.res
	res.ExpiresAt = instant(now + lease)
	e.l.promised.Store(now + lease)
	return res, e
}

// answers reports whether e may answer a poll of max items leased for
// lease ns at now: claimed for the same max and lease, within the hold.
func (e *prefetched) answers(max int, lease, now, hold int64) bool {
	return e.max == max && e.dur == lease && now >= e.now && now-e.now <= hold
}

// heldBefore reports whether a batch q holds claimed ahead that cannot
// answer a poll of max items leased for lease ns at now (stale, or
// claimed for another max or lease) has an item that comes before e's
// last one in serve order. Held items count as available, so a poll
// answered with e would be served behind it: such a batch keeps the ones
// behind it back, and the poll's op gives every batch back and claims
// the head. Among batches that can answer, the one whose first item
// comes first does (takePrefetched): they are the next polls' batches,
// claimed for consumers polling alike at once, whose items may
// interleave when racing producers' instants do, and whose order among
// themselves is that of concurrent polls. A batch's items are in serve
// order, so its first is its earliest. REQUIRES: q.mu held.
func (q *queueState) heldBefore(e *prefetched, max int, lease, now, hold int64) bool {
	for _, f := range q.prefetch {
		if f != e && !f.answers(max, lease, now, hold) && e.sortsAfter(f.prios[0], f.firstEntry()) {
			return true
		}
	}
	return false
}

// firstEntry is e's first item as a serve-order entry.
func (e *prefetched) firstEntry() readyEntry {
	return readyEntry{vis: e.recs[0].VisibleAt, id: e.res.Items[0].ID}
}

// firstBefore reports whether e's first item comes before f's in serve
// order.
func (e *prefetched) firstBefore(f *prefetched) bool {
	if e.prios[0] != f.prios[0] {
		return e.prios[0] < f.prios[0]
	}
	return e.firstEntry().less(f.firstEntry())
}

// sortsAfter reports whether the ready entry first, of priority prio,
// comes before e's last item in serve order (priority, visible_at, id):
// a claim at this moment would take it instead.
func (e *prefetched) sortsAfter(prio uint8, first readyEntry) bool {
	i := len(e.recs) - 1
	if last := e.prios[i]; prio != last {
		return prio < last
	}
	return first.less(readyEntry{vis: e.recs[i].VisibleAt, id: e.res.Items[i].ID})
}

// heldAhead reports whether lease l is a batch claimed ahead that no
// poll has taken: its items count as available to every caller.
// REQUIRES: on the committer.
func heldAhead(l *leaseState) bool {
	if l.ahead == nil {
		return false
	}
	l.q.mu.Lock()
	defer l.q.mu.Unlock()
	return !l.ahead.released
}

// adjustStats makes st count q's batches claimed ahead as the available
// items they were: Stats shows no trace of them. A batch is in the list
// from the moment its claim's counters are (opTx.finish), durable or
// not, and in the list or returning until the counters of the op that
// gives it back or ends it are. REQUIRES: q.mu held.
func (q *queueState) adjustStats(st *storage.QueueStats, now int64, oldest int64, found bool) (int64, bool) {
	for _, e := range q.prefetch {
		oldest, found = e.adjustStats(st, now, oldest, found)
	}
	for _, e := range q.returning {
		oldest, found = e.adjustStats(st, now, oldest, found)
	}
	return oldest, found
}

// adjustStats is queueState.adjustStats for one batch.
func (e *prefetched) adjustStats(st *storage.QueueStats, now int64, oldest int64, found bool) (int64, bool) {
	n := int64(len(e.recs))
	st.Inflight -= n
	st.Leases--
	st.Delivered -= uint64(n)
	for _, r := range e.recs {
		if r.Delayed {
			st.Delayed++
		} else {
			st.Ready++
		}
		if r.VisibleAt <= now && (!found || r.VisibleAt < oldest) {
			oldest, found = r.VisibleAt, true
		}
	}
	return oldest, found
}

// giveBackAll gives back every batch the queues qs hold claimed ahead,
// in one op of its own, before a call that reads or changes a queue's
// items as a whole (Peek, Purge, Check, Close). A batch an earlier op is
// still claiming or giving back (claimingAhead, returning) counts: the op
// runs after it, picks the batches on the committer, and returns once
// that op's writes can be read. REQUIRES: s.life held shared (enter).
func (s *Store) giveBackAll(qs ...*queueState) error {
	held := false
	for _, q := range qs {
		q.mu.Lock()
		held = held || len(q.prefetch) > 0 || len(q.returning) > 0 || q.claimingAhead > 0
		q.mu.Unlock()
	}
	if !held {
		return nil
	}
	_, err := s.submit("", 0, func(o *opTx) error {
		for _, q := range qs {
			s.releaseAhead(o, q, func(*prefetched) bool { return true })
		}
		return nil
	})
	return err
}

// giveBackEvery gives back every batch claimed ahead, on every queue,
// the queues picked inside the op, on the committer: a batch that an op
// ahead of this one in the pipeline claimed is found even when its queue
// held none when giveBackEvery was called (Close: acks claim nothing
// ahead from the moment it begins, but one applied just before may not
// have listed its batch yet when Close looked).
func (s *Store) giveBackEvery() error {
	if s.prefetchHold() == 0 {
		return nil
	}
	_, err := s.submit("", 0, func(o *opTx) error {
		for _, q := range s.queuesWithPrefetch() {
			s.releaseAhead(o, q, func(*prefetched) bool { return true })
		}
		return nil
	})
	return err
}

// releaseAhead releases q's batches claimed ahead for which drop is true
// and returns how many. REQUIRES: on the committer.
func (s *Store) releaseAhead(o *opTx, q *queueState, drop func(e *prefetched) bool) int {
	q.mu.Lock()
	if len(q.prefetch) == 0 {
		q.mu.Unlock()
		return 0
	}
	var out []*prefetched
	for _, e := range q.prefetch {
		if drop(e) {
			out = append(out, e)
		}
	}
	for _, e := range out {
		q.leaveAheadLocked(o, e)
	}
	q.mu.Unlock()
	for _, e := range out {
		s.giveBack(o, q, e)
	}
	return len(out)
}

// giveBack undoes the claim of batch e: each item still under its lease
// goes back to available with its record as it was before the claim, and
// the lease ends. REQUIRES: on the committer; e out of the queue's list.
func (s *Store) giveBack(o *opTx, q *queueState, e *prefetched) {
	l := e.l
	if s.leases[l.token] != l {
		return // ended meanwhile (expired, or its queue purged)
	}
	o.onUndo(func() { q.holdAhead(e) })
	d := o.delta(q)
	for i, id := range e.res.Items {
		if s.inflight[id.ID] != l {
			continue
		}
		s.release(o, l, id.ID)
		o.del(dbkeys.InProgressKey(q.name, id.ID))
		d.Inflight--
		d.Delivered--
		s.putAvailable(o, q, id.ID, e.recs[i], nil, false, nil)
	}
	s.finishLease(o, l)
	s.m.prefetchReleased.Add(1)
}

// unprefetch forgets batch e claimed ahead whose lease ends some other
// way (expiry, purge). REQUIRES: on the committer.
func (s *Store) unprefetch(o *opTx, e *prefetched) {
	q := e.l.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if e.released {
		return
	}
	q.leaveAheadLocked(o, e)
	o.onUndo(func() { q.holdAhead(e) })
	// Nobody was given its items: the claim's deliveries are taken back,
	// as a give-back does.
	o.delta(q).Delivered -= int64(len(e.recs))
}

// leaveAheadLocked takes batch e out of q's list for op o, which gives
// it back or ends its lease: until o's counters land (finish), e waits
// in q.returning, where Stats still hides it, so that Stats never sees
// its items inflight under a lease nobody was given. If o fails, its undo
// holds e again (holdAheadLocked takes it out of returning) or, when
// nothing undoes the give-back, drops it from returning.
// REQUIRES: q.mu held; on the committer.
func (q *queueState) leaveAheadLocked(o *opTx, e *prefetched) {
	q.dropAheadLocked(e)
	e.released = true
	q.returning = append(q.returning, e)
	o.returned = append(o.returned, e)
	o.onUndo(func() {
		q.mu.Lock()
		q.landReturnedLocked([]*prefetched{e})
		q.mu.Unlock()
	})
}

// landReturnedLocked takes the batches es out of q's returning list.
// REQUIRES: q.mu held.
func (q *queueState) landReturnedLocked(es []*prefetched) {
	if len(q.returning) == 0 {
		return
	}
	q.returning = slices.DeleteFunc(q.returning, func(x *prefetched) bool { return slices.Contains(es, x) })
}

// holdAhead puts batch e (back) at the end of q's list of batches
// claimed ahead. REQUIRES: q.mu not held.
func (q *queueState) holdAhead(e *prefetched) {
	q.mu.Lock()
	q.holdAheadLocked(e)
	q.mu.Unlock()
}

// holdAheadLocked is holdAhead with q.mu held.
func (q *queueState) holdAheadLocked(e *prefetched) {
	e.released = false
	q.landReturnedLocked([]*prefetched{e})
	q.prefetch = append(q.prefetch, e)
}

// dropAheadLocked takes batch e out of q's list. REQUIRES: q.mu held.
func (q *queueState) dropAheadLocked(e *prefetched) {
	q.prefetch = slices.DeleteFunc(q.prefetch, func(x *prefetched) bool { return x == e })
}

// sweepAhead, at the start of a sweep, gives back the batches the queues
// qs hold claimed ahead that are stale at now (their consumer stopped
// polling: the sweeper is what notices, within its interval) and those
// holding an item not yet promoted from delayed, which the sweep would
// promote. REQUIRES: on the committer.
func (s *Store) sweepAhead(o *opTx, now int64, qs []*queueState, gained map[string]bool) {
	hold := s.prefetchHold()
	for _, q := range qs {
		n := 0
		if s.releaseAhead(o, q, func(e *prefetched) bool { return now-e.now > hold }) > 0 {
			q.prefetchSkip = prefetchBackoff
			n++
		}
		n += s.releaseAhead(o, q, func(e *prefetched) bool {
			return slices.ContainsFunc(e.recs, func(r dbkeys.ItemRecord) bool { return r.Delayed })
		})
		if n > 0 {
			// Their items are ready again: the queue's parked polls are
			// told (found by review, session 70: they were not).
			gained[q.name] = true
		}
	}
}

// queuesWithPrefetch returns the queues holding batches claimed ahead.
func (s *Store) queuesWithPrefetch() []*queueState {
	s.mu.Lock()
	defer s.mu.Unlock()
	var qs []*queueState
	for _, q := range s.mu.queues {
		q.mu.Lock()
		if len(q.prefetch) > 0 {
			qs = append(qs, q)
		}
		q.mu.Unlock()
	}
	return qs
}

// asideNotes is what setAside notes before Recover drops the in-memory
// state of a failed store, for restoreAside to give back and write once
// the database is reopened: what Close does first (giveBackAll,
// keepPromises), which a failed store cannot write.
type asideNotes struct {
	ahead    []heldAside               // batches claimed ahead that no poll took
	promised map[storage.LeaseID]int64 // expiries promised to polls answered with one
	taken    []storage.LeaseID         // leases polls took from one, still marked claimed ahead (takenAhead)
}

// heldAside is a batch claimed ahead as setAside found it: what giveBack
// needs, the items' records before the claim among it.
type heldAside struct {
	token storage.LeaseID
	ids   []storage.ItemID    // in claim order
	recs  []dbkeys.ItemRecord // as prefetched.recs
}

// setAside notes every batch claimed ahead that no poll took (heldAhead:
// held in its queue's list, or dropped from it by prefetchDone because
// the commit or fsync of the ack that claimed it failed, whose claim the
// database may hold all the same), every expiry promised to a poll
// answered with one that the database lacks, and every lease a poll took
// from one whose record is still marked claimed ahead. The notes of a Recover
// whose restoreAside failed stay, and these join them. REQUIRES:
// s.life held exclusively; the pipeline stopped, the database not yet
// closed.
func (s *Store) setAside() {
	a := &s.aside
	for token, l := range s.leases {
		if heldAhead(l) && !slices.ContainsFunc(a.ahead, func(h heldAside) bool { return h.token == token }) {
			e := l.ahead
			h := heldAside{token: token, ids: make([]storage.ItemID, len(e.res.Items)), recs: e.recs}
			for i, it := range e.res.Items {
				h.ids[i] = it.ID
			}
			a.ahead = append(a.ahead, h)
		}
		if p := l.promised.Load(); p > l.exp {
			if a.promised == nil {
				a.promised = make(map[storage.LeaseID]int64)
			}
			a.promised[token] = max(a.promised[token], p)
		}
		if takenAhead(l) && !slices.Contains(a.taken, token) {
			a.taken = append(a.taken, token)
		}
	}
}

// restoreAside gives back, in one op, each batch setAside noted whose
// lease the reopened database holds, writes each promised expiry later
// than its lease's there, and writes the record of each lease a poll
// took without the claimed-ahead mark (the reopened store rebuilt it
// unconfirmed); it returns how many batches and promises that was. The database is the truth: a claim that never
// reached it left the items available, and a give-back that did (a
// restoreAside whose fsync failed) ended the lease, so neither has
// anything to give back; a lease ended meanwhile needs no promise. The
// notes are dropped once the op is durable; if it fails (the store
// fails again), the next Recover restores from them. REQUIRES: s.life
// held exclusively; the database reopened.
func (s *Store) restoreAside() (given, kept int, err error) {
	a := &s.aside
	if len(a.ahead) == 0 && len(a.promised) == 0 && len(a.taken) == 0 {
		return 0, 0, nil
	}
	_, err = s.submit("", 0, func(o *opTx) error {
		for _, h := range a.ahead {
			l := s.leases[h.token]
			if l == nil {
				continue
			}
			e := &prefetched{res: storage.PollResult{Lease: h.token, Items: make([]storage.Item, len(h.ids))}, l: l, recs: h.recs, released: true}
			for i, id := range h.ids {
				e.res.Items[i].ID = id
			}
			s.giveBack(o, l.q, e)
			given++
		}
		for token, p := range a.promised {
			l := s.leases[token]
			if l == nil || p <= l.exp {
				continue
			}
			l.promised.Store(p)
			s.keepPromise(o, l)
			putLease(o, l, false)
			kept++
		}
		for _, token := range a.taken {
			// Reopened, the lease is unconfirmed (rebuilt from its
			// mark); a poll did take it.
			if l := s.leases[token]; l != nil && l.aheadMark {
				putLease(o, l, false)
			}
		}
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	*a = asideNotes{}
	return given, kept, nil
}
