package rocksstore

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// sweepChunk is how many index entries one sweep transaction handles: big
// enough to amortize the commit, small enough to keep a transaction (a
// lease lists up to MaxBatch items) well below memory and lock limits.
const sweepChunk = 64

// Sweep implements storage.Store. A Limit <= 0 means Limits.MaxBatch.
// Sweeps are serialized.
func (s *Store) Sweep(ctx context.Context, p storage.SweepParams) (storage.SweepResult, error) {
	if err := s.enter("sweep"); err != nil {
		return storage.SweepResult{}, err
	}
	defer s.exit()
	s.sweepMu.Lock()
	defer s.sweepMu.Unlock()
	res, err := s.sweep(ctx, p)
	if err != nil {
		return storage.SweepResult{}, fmt.Errorf("rocksstore: sweep: %w", err)
	}
	return res, nil
}

func (s *Store) sweep(ctx context.Context, p storage.SweepParams) (storage.SweepResult, error) {
	now := nanos(p.Now)
	limit := p.Limit
	if limit <= 0 {
		limit = s.limits.MaxBatch
	}
	var res storage.SweepResult
	gained := map[string]bool{}
	acc := &sweepAcc{res: &res, gained: gained}

	err := s.sweepIndex(ctx, acc, &s.expiryCur, dbkeys.NsLeaseExpiry, now, limit, func(tx *txn, k []byte, res *storage.SweepResult, gained map[string]bool) error {
		exp, token, err := dbkeys.DecodeLeaseExpiryKey(k)
		if err != nil {
			return corrupt("sweep", k, err)
		}
		return s.expireLease(tx, k, exp, token, now, res, gained)
	})
	if err != nil {
		return res, err
	}
	err = s.sweepIndex(ctx, acc, &s.delayedCur, dbkeys.NsDelayed, now, limit, func(tx *txn, k []byte, res *storage.SweepResult, gained map[string]bool) error {
		_, qn, _, err := dbkeys.DecodeDelayedKey(k)
		if err != nil {
			return corrupt("sweep", k, err)
		}
		// Lock the entry: a claim of the same item decides between the
		// delayed and ready counters by whether it still exists.
		_, ok, err := tx.getForUpdate(k)
		if err != nil || !ok {
			return err
		}
		if err := tx.del(k); err != nil {
			return err
		}
		q := s.queue(qn)
		if q == nil {
			return fmt.Errorf("%w: delayed entry %x of unknown queue", storage.ErrCorrupt, k)
		}
		d := tx.delta(q)
		d.Delayed--
		d.Ready++
		res.Promoted++
		gained[qn] = true
		return nil
	})
	if err != nil {
		return res, err
	}
	err = s.sweepIndex(ctx, acc, &s.dedupCur, dbkeys.NsDedupExpiry, now, limit, func(tx *txn, k []byte, res *storage.SweepResult, _ map[string]bool) error {
		exp, qn, key, err := dbkeys.DecodeDedupExpiryKey(k)
		if err != nil {
			return corrupt("sweep", k, err)
		}
		if err := tx.del(k); err != nil {
			return err
		}
		dk := dbkeys.DedupKey(qn, key)
		v, ok, err := tx.getForUpdate(dk)
		if err != nil || !ok {
			return err
		}
		rec, err := dbkeys.DecodeDedup(v)
		if err != nil {
			return corrupt("sweep", dk, err)
		}
		if rec.ExpiresAt == exp {
			res.DedupDropped++
			return tx.del(dk)
		}
		return nil
	})
	if err != nil {
		return res, err
	}

	for _, ns := range []struct {
		cur *cursor
		ns  byte
	}{{&s.expiryCur, dbkeys.NsLeaseExpiry}, {&s.delayedCur, dbkeys.NsDelayed}, {&s.dedupCur, dbkeys.NsDedupExpiry}} {
		t, ok, err := s.firstInstant(ns.cur, ns.ns)
		if err != nil {
			return res, err
		}
		if ok && (res.Next.IsZero() || t.Before(res.Next)) {
			res.Next = t
		}
	}
	res.More = !res.Next.IsZero() && !res.Next.After(instant(now))
	for q := range gained {
		res.ReadyQueues = append(res.ReadyQueues, q)
	}
	sort.Strings(res.ReadyQueues)
	return res, nil
}

// sweepAcc accumulates the outcome of committed sweep transactions.
type sweepAcc struct {
	res    *storage.SweepResult
	gained map[string]bool
}

// sweepFunc handles one due index entry inside tx, reporting into res and
// gained, which belong to the current attempt only (a retried transaction
// starts over).
type sweepFunc func(tx *txn, k []byte, res *storage.SweepResult, gained map[string]bool) error

// sweepIndex processes up to limit entries of global time index ns due at
// now, sweepChunk per transaction, from the index's cursor on.
func (s *Store) sweepIndex(ctx context.Context, acc *sweepAcc, cur *cursor, ns byte, now int64, limit int, fn sweepFunc) error {
	lower := dbkeys.NamespacePrefix(ns)
	upper := dbkeys.TimeBound(ns, now+1)
	if now == int64(^uint64(0)>>1) {
		upper = dbkeys.PrefixEnd(lower)
	}
	done := 0
	for done < limit {
		if err := checkCtx(ctx, "sweep"); err != nil {
			return err
		}
		start := cur.begin()
		var keys [][]byte
		err := s.scan(nil, lower, upper, start, func(k, _ []byte) (bool, error) {
			keys = append(keys, k)
			return len(keys) < min(sweepChunk, limit-done), nil
		})
		if err != nil {
			cur.end(nil, false)
			return err
		}
		if len(keys) == 0 {
			cur.end(nil, false)
			return nil
		}
		var part storage.SweepResult
		var partGained map[string]bool
		err = s.runTxn("sweep", func(tx *txn) error {
			part, partGained = storage.SweepResult{}, map[string]bool{}
			for _, k := range keys {
				if err := fn(tx, k, &part, partGained); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			cur.end(nil, false)
			return err
		}
		acc.res.LeasesExpired += part.LeasesExpired
		acc.res.Requeued += part.Requeued
		acc.res.DeadLettered += part.DeadLettered
		acc.res.Promoted += part.Promoted
		acc.res.DedupDropped += part.DedupDropped
		for q := range partGained {
			acc.gained[q] = true
		}
		cur.end(successor(keys[len(keys)-1]), true)
		done += len(keys)
		if len(keys) < sweepChunk {
			return nil
		}
	}
	return nil
}

// firstInstant returns the instant of the first live entry of time index
// ns.
func (s *Store) firstInstant(cur *cursor, ns byte) (time.Time, bool, error) {
	lower := dbkeys.NamespacePrefix(ns)
	var t time.Time
	found := false
	err := s.scan(nil, lower, dbkeys.PrefixEnd(lower), cur.get(), func(k, _ []byte) (bool, error) {
		if len(k) < 9 {
			return false, corrupt("sweep", k, dbkeys.ErrMalformed)
		}
		var n int64
		var err error
		switch ns {
		case dbkeys.NsLeaseExpiry:
			n, _, err = dbkeys.DecodeLeaseExpiryKey(k)
		case dbkeys.NsDelayed:
			n, _, _, err = dbkeys.DecodeDelayedKey(k)
		default:
			n, _, _, err = dbkeys.DecodeDedupExpiryKey(k)
		}
		if err != nil {
			return false, corrupt("sweep", k, err)
		}
		t, found = instant(n), true
		return false, nil
	})
	return t, found, err
}

// expireLease ends lease token whose expiry entry k is due: each item goes
// back to ready (VisibleAt = the expiry) or, out of attempts, to dead.
func (s *Store) expireLease(tx *txn, k []byte, exp int64, token storage.LeaseID, now int64, res *storage.SweepResult, gained map[string]bool) error {
	if err := tx.del(k); err != nil {
		return err
	}
	lk := dbkeys.LeaseKey(token)
	v, ok, err := tx.getForUpdate(lk)
	if err != nil || !ok {
		return err
	}
	lr, err := dbkeys.DecodeLease(v)
	if err != nil {
		return corrupt("sweep", lk, err)
	}
	if lr.ExpiresAt != exp {
		// Extended; this entry was stale (extend deletes the old one, so
		// this only cleans up after a bug).
		return nil
	}
	q := s.queue(lr.Queue)
	if q == nil {
		return fmt.Errorf("%w: lease %s of unknown queue %q", storage.ErrCorrupt, token, lr.Queue)
	}
	d := tx.delta(q)
	for _, id := range lr.IDs {
		ik := dbkeys.InProgressKey(q.name, id)
		v, ok, err := tx.getForUpdate(ik)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		rec, err := dbkeys.DecodeItem(v)
		if err != nil {
			return corrupt("sweep", ik, err)
		}
		if rec.Lease != token {
			continue
		}
		if err := tx.del(ik); err != nil {
			return err
		}
		d.Inflight--
		d.Expired++
		if rec.Attempts >= q.maxAttempts(&rec) {
			if err := s.putDead(tx, q, id, rec, "lease expired", now); err != nil {
				return err
			}
			res.DeadLettered++
			continue
		}
		// The item became ready when the lease ran out, so it queues
		// behind items that were ready earlier.
		rec.VisibleAt = exp
		rec.Delayed = exp > now
		if err := s.putAvailable(tx, q, id, rec, nil, false); err != nil {
			return err
		}
		res.Requeued++
		gained[q.name] = true
	}
	if err := tx.del(lk); err != nil {
		return err
	}
	d.Leases--
	res.LeasesExpired++
	return nil
}
