package rocksstore

import (
	"context"
	"fmt"
	"time"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// live reports whether lease l is live at now: it exists, has not expired
// and still holds an item (a lease whose items were all acked or nacked is
// finished).
func (l *leaseState) live(now int64) bool {
	return l != nil && now < l.deadline() && l.held() > 0
}

// held counts the lease's items still inflight under it. ids is compacted
// at the end of every op that releases items, so this is len(ids) between
// ops; within an op, released items are marked in the inflight map.
func (l *leaseState) held() int { return len(l.ids) - l.released }

// checkItem applies the lease-token rules of package storage to one id
// of queue q under lease token (l: its state, nil if none).
// REQUIRES: on the committer.
func (s *Store) checkItem(o *opTx, q *queueState, token storage.LeaseID, l *leaseState, id storage.ItemID, now int64) (storage.Code, error) {
	if holder := s.inflight[id]; holder != nil && holder.q == q {
		if heldAhead(holder) {
			// Claimed ahead and not taken: available, as far as any
			// caller can tell (prefetch.go).
			return storage.LeaseCode(storage.NotInflight, l.live(now)), nil
		}
		if holder.token != token {
			return storage.LeaseCode(storage.HeldByOther, false), nil
		}
		return storage.LeaseCode(storage.HeldByLease, l.live(now)), nil
	}
	found, err := o.exists(o.availableKey(q.name, id))
	if err == nil && !found {
		found, err = o.exists(dbkeys.DLQKey(q.name, id))
	}
	switch {
	case err != nil:
		return 0, err
	case !found:
		return storage.LeaseCode(storage.Absent, false), nil
	}
	return storage.LeaseCode(storage.NotInflight, l.live(now)), nil
}

// release takes id out of lease l (its in_progress entry is the caller's
// to delete). REQUIRES: on the committer.
func (s *Store) release(o *opTx, l *leaseState, id storage.ItemID) {
	delete(s.inflight, id)
	l.released++
	o.undoRelease(l, id)
}

// finishLease writes lease l back after releases: without the released
// ids, or deleted (with its expiry entry) once it holds nothing.
// REQUIRES: on the committer.
func (s *Store) finishLease(o *opTx, l *leaseState) {
	if l.released == 0 {
		return
	}
	oldIDs, oldReleased := l.ids, l.released
	kept := make([]storage.ItemID, 0, len(l.ids)-l.released)
	for _, id := range l.ids {
		if s.inflight[id] == l {
			kept = append(kept, id)
		}
	}
	l.ids, l.released = kept, 0
	o.onUndo(func() { l.ids, l.released = oldIDs, oldReleased })
	if len(kept) > 0 {
		s.keepPromise(o, l)
		putLease(o, l, o.settleNew)
		return
	}
	s.dropLease(o, l)
}

// keepPromise makes the expiry a poll was promised for lease l (taken
// from a batch claimed ahead: leaseState.promised) its expiry in memory
// and in lease_expiry; the caller writes the lease record, which then
// carries it too. REQUIRES: on the committer.
func (s *Store) keepPromise(o *opTx, l *leaseState) {
	if p := l.promised.Load(); p > l.exp {
		s.moveExpiry(o, l, p, o.settleNew)
	}
}

// moveExpiry makes exp lease l's expiry, in memory (any promise made
// for it ends) and in lease_expiry (fresh: as putAs); the caller writes
// the lease record. REQUIRES: on the committer.
func (s *Store) moveExpiry(o *opTx, l *leaseState, exp int64, fresh bool) {
	o.delAs(fresh, dbkeys.LeaseExpiryKey(l.exp, l.token))
	o.putAs(fresh, dbkeys.LeaseExpiryKey(exp, l.token), dbkeys.Marker())
	old, promised := l.exp, l.promised.Load()
	l.exp = exp
	l.promised.Store(0)
	o.onUndo(func() { l.exp = old; l.promised.Store(promised) })
	s.expiry.push(timed{at: exp, token: l.token})
}

// keepPromises writes every promised expiry (keepPromise) not written
// yet, and the record of every lease a poll took from a batch claimed
// ahead that still carries the claimed-ahead mark (takenAhead), so that
// a clean close and reopen keeps what polls were told, and counts their
// deliveries. Close gives back the batches no poll took first.
func (s *Store) keepPromises() error {
	_, err := s.submit("", 0, func(o *opTx) error {
		for _, l := range s.leases {
			if l.promised.Load() > l.exp || takenAhead(l) {
				s.keepPromise(o, l)
				putLease(o, l, false)
			}
		}
		return nil
	})
	return err
}

// takenAhead reports whether lease l was claimed ahead and taken by a
// poll of this process, its record still marked claimed ahead.
func takenAhead(l *leaseState) bool {
	return l.aheadMark && !l.unconfirmed && !heldAhead(l)
}

// putLease writes lease l's record as memory has it (fresh: as putAs),
// without the claimed-ahead mark, which only the claim writes (grant): a
// lease a consumer acts on is confirmed delivered. REQUIRES: on the
// committer.
func putLease(o *opTx, l *leaseState, fresh bool) {
	o.putAs(fresh, dbkeys.LeaseKey(l.token), dbkeys.EncodeLease(leaseRecord(l)))
	if !l.aheadMark && !l.unconfirmed {
		return
	}
	mark, unconfirmed := l.aheadMark, l.unconfirmed
	l.aheadMark, l.unconfirmed = false, false
	o.onUndo(func() { l.aheadMark, l.unconfirmed = mark, unconfirmed })
}

// dropLease deletes lease l's record and expiry entry and forgets it.
// REQUIRES: on the committer.
func (s *Store) dropLease(o *opTx, l *leaseState) {
	if l.ahead != nil {
		s.unprefetch(o, l.ahead)
	}
	o.delAs(o.settleNew, dbkeys.LeaseKey(l.token))
	o.delAs(o.settleNew, dbkeys.LeaseExpiryKey(l.exp, l.token))
	o.delta(l.q).Leases--
	delete(s.leases, l.token)
	delete(l.q.leases, l.token)
	o.onUndo(func() {
		s.leases[l.token] = l
		l.q.leases[l.token] = l
	})
}

func leaseRecord(l *leaseState) dbkeys.LeaseRecord {
	r := dbkeys.LeaseRecord{Queue: l.q.name, ExpiresAt: l.exp, IDs: make([][16]byte, len(l.ids))}
	for i, id := range l.ids {
		r.IDs[i] = id
	}
	return r
}

// Ack implements storage.Store. An ack reads nothing from RocksDB when
// every id is held by the lease: the in-memory lease knows its items.
func (s *Store) Ack(ctx context.Context, p storage.AckParams) ([]storage.Code, error) {
	if err := s.enter("ack"); err != nil {
		return nil, err
	}
	defer s.exit()
	q, codes, fn, err := s.ackOp(ctx, p)
	if err != nil || fn == nil {
		return codes, err
	}
	if s.prefetchHold() > 0 {
		err = s.settledAhead(q, p.Lease, nanos(p.Now), len(p.IDs), fn)
	} else {
		err = s.settled(q, len(p.IDs), fn)
	}
	if err != nil {
		return nil, fmt.Errorf("rocksstore: ack %q: %w", p.Queue, err)
	}
	return codes, nil
}

// settledAhead runs an ack's op of n ids on q, with the op that may claim
// the next batch ahead after it (prefetch.go), and announces their
// earliest new deadline.
func (s *Store) settledAhead(q *queueState, token storage.LeaseID, now int64, n int, fn func(o *opTx) error) error {
	fn, aheadFn, plan := s.withPrefetch(q, token, now, fn)
	o, ahead := newOp(n, fn), newOp(0, aheadFn)
	if err := s.submitGroup(q.name, []*op{o, ahead}); err != nil {
		return err
	}
	s.prefetchDone(plan, o.err == nil && ahead.err == nil)
	if s.onDeadline != nil {
		for _, x := range []*op{o, ahead} {
			if x.err == nil && !x.next.IsZero() {
				s.onDeadline(x.next)
			}
		}
	}
	return o.err
}

// ackOp checks an ack and returns its codes (filled in when fn runs) and
// op; fn is nil when the queue does not exist (every id is not found).
func (s *Store) ackOp(ctx context.Context, p storage.AckParams) (*queueState, []storage.Code, func(o *opTx) error, error) {
	if err := p.Validate(s.limits); err != nil {
		return nil, nil, nil, fmt.Errorf("rocksstore: ack %q: %w", p.Queue, err)
	}
	if err := checkCtx(ctx, "ack"); err != nil {
		return nil, nil, nil, err
	}
	q := s.queue(p.Queue)
	codes, fn := s.settleOp(q, p.Lease, nanos(p.Now), p.IDs, s.ackItem(q))
	return q, codes, fn, nil
}

// ackItem returns what an ack does to each item of q it settles.
func (s *Store) ackItem(q *queueState) func(o *opTx, l *leaseState, id storage.ItemID) error {
	return func(o *opTx, l *leaseState, id storage.ItemID) error {
		o.delAs(o.settleNew, o.inProgressKey(q.name, id))
		if l.ext[id] {
			o.del(dbkeys.PayloadKey(q.name, id))
		}
		o.delta(q).Acked++
		return nil
	}
}

// Nack implements storage.Store.
func (s *Store) Nack(ctx context.Context, p storage.NackParams) ([]storage.Code, error) {
	if err := s.enter("nack"); err != nil {
		return nil, err
	}
	defer s.exit()
	q, codes, fn, err := s.nackOp(ctx, p)
	if err != nil || fn == nil {
		return codes, err
	}
	if err := s.settled(q, len(p.IDs), fn); err != nil {
		return nil, fmt.Errorf("rocksstore: nack %q: %w", p.Queue, err)
	}
	return codes, nil
}

// nackOp checks a nack and returns its codes (filled in when fn runs) and
// op; fn is nil when the queue does not exist (every id is not found).
func (s *Store) nackOp(ctx context.Context, p storage.NackParams) (*queueState, []storage.Code, func(o *opTx) error, error) {
	if err := p.Validate(s.limits); err != nil {
		return nil, nil, nil, fmt.Errorf("rocksstore: nack %q: %w", p.Queue, err)
	}
	if err := checkCtx(ctx, "nack"); err != nil {
		return nil, nil, nil, err
	}
	q := s.queue(p.Queue)
	now := nanos(p.Now)
	reason := s.limits.TruncateReason(p.Reason)
	codes, fn := s.settleOp(q, p.Lease, now, p.IDs, func(o *opTx, l *leaseState, id storage.ItemID) error {
		ik := dbkeys.InProgressKey(q.name, id)
		v, ok, err := o.getForUpdate(ik)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%w: inflight item %s has no in_progress record", storage.ErrCorrupt, id)
		}
		rec, err := dbkeys.DecodeItem(v)
		if err != nil {
			return corrupt("nack", ik, err)
		}
		o.del(ik)
		if p.Undelivered {
			// The claim taken back: its attempt. Delivered, a lifetime
			// counter (and a Prometheus one), keeps the claim.
			rec.Attempts = max(rec.Attempts, 1) - 1
			rec.Delayed = rec.VisibleAt > now
			s.putAvailable(o, q, id, rec, nil, false, nil)
			return nil
		}
		o.delta(q).Nacked++
		rec.LastError = reason
		if rec.Attempts >= q.maxAttempts(&rec) {
			s.putDead(o, q, id, rec, "nack: "+reason, now)
			return nil
		}
		var delay time.Duration
		if p.Delay != nil {
			delay = *p.Delay
		} else {
			delay = storage.Backoff(q.config(), rec.Attempts, s.jitter())
		}
		rec.VisibleAt = now + int64(delay)
		rec.Delayed = rec.VisibleAt > now
		s.putAvailable(o, q, id, rec, nil, false, nil)
		return nil
	})
	return q, codes, fn, nil
}

// settled runs a settle op of n ids on q and announces its earliest new
// deadline.
func (s *Store) settled(q *queueState, n int, fn func(o *opTx) error) error {
	next, err := s.submit(q.name, n, fn)
	if err == nil && !next.IsZero() && s.onDeadline != nil {
		s.onDeadline(next)
	}
	return err
}

// settleOp is the shared op of Ack and Nack: on the committer it applies
// the lease-token rules to every id and, for each CodeOK id, releases it
// from the lease, counts it out of inflight and hands it to done (which
// deletes or moves its in_progress record). It returns the codes (filled
// in when fn runs) and the op; fn is nil when q does not exist (every
// code is CodeNotFound, without a commit).
func (s *Store) settleOp(q *queueState, token storage.LeaseID, now int64, ids []storage.ItemID,
	done func(o *opTx, l *leaseState, id storage.ItemID) error) ([]storage.Code, func(o *opTx) error) {
	codes := make([]storage.Code, len(ids))
	if q == nil {
		for i := range codes {
			codes[i] = storage.CodeNotFound
		}
		return codes, nil
	}
	return codes, func(o *opTx) error {
		l := s.leases[token]
		// No key of a lease that no earlier op of the batch wrote, nor
		// its items' in_progress keys, is in the overlay while the
		// batch is untouched (opTx.untouched): this op writes them
		// without the overlay's index, each once.
		if l != nil && o.untouched() && l.wrote != o.b.seq {
			o.settleNew = true
			l.wrote = o.b.seq
		}
		for i, id := range ids {
			c, err := s.checkItem(o, q, token, l, id, now)
			if err != nil {
				return err
			}
			codes[i] = c
			if c != storage.CodeOK {
				continue
			}
			s.release(o, l, id)
			o.delta(q).Inflight--
			if err := done(o, l, id); err != nil {
				return err
			}
		}
		if l != nil {
			s.finishLease(o, l)
		}
		return nil
	}
}

// putDead writes an item that left inflight into the dead-letter namespace.
func (s *Store) putDead(o *opTx, q *queueState, id storage.ItemID, rec dbkeys.ItemRecord, reason string, now int64) {
	rec.HasLease, rec.Lease = false, [16]byte{}
	rec.Delayed = false
	rec.Dead, rec.DeadAt, rec.Reason = true, now, reason
	o.put(dbkeys.DLQKey(q.name, id), dbkeys.EncodeItem(rec))
	d := o.delta(q)
	d.Dead++
	d.DeadLettered++
}

// ExtendLease implements storage.Store. A Duration of 0 means the queue's
// default lease, as for Poll.
func (s *Store) ExtendLease(ctx context.Context, p storage.ExtendParams) (time.Time, error) {
	if err := s.enter("extend"); err != nil {
		return time.Time{}, err
	}
	defer s.exit()
	exp, err := s.extend(ctx, p)
	if err != nil {
		return time.Time{}, fmt.Errorf("rocksstore: extend %q lease %s: %w", p.Queue, p.Lease, err)
	}
	if s.onDeadline != nil {
		s.onDeadline(exp)
	}
	return exp, nil
}

func (s *Store) extend(ctx context.Context, p storage.ExtendParams) (time.Time, error) {
	if err := p.Validate(s.limits); err != nil {
		return time.Time{}, err
	}
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	now := nanos(p.Now)
	var exp int64
	_, err := s.submit(p.Queue, 1, func(o *opTx) error {
		l := s.leases[p.Lease]
		if l == nil || now >= l.deadline() {
			return storage.ErrLeaseExpired
		}
		if l.q.name != p.Queue {
			return storage.ErrLeaseMismatch
		}
		d := p.Duration
		if d == 0 {
			d = l.q.config().LeaseDuration
		}
		exp = now + int64(d)
		s.moveExpiry(o, l, exp, false)
		putLease(o, l, false)
		return nil
	})
	if err != nil {
		return time.Time{}, err
	}
	return instant(exp), nil
}
