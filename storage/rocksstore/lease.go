package rocksstore

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// leaseView is a lease record read (and locked) inside a transaction, with
// the ids released by the current call.
type leaseView struct {
	token    storage.LeaseID
	rec      dbkeys.LeaseRecord
	exists   bool
	live     bool // exists and not expired at the call's now
	released map[storage.ItemID]bool
}

// isLive reports whether the lease is live now: it exists, has not expired
// and still lists an item (a lease whose items were all acked or nacked
// earlier in this call is finished).
func (lv *leaseView) isLive() bool {
	return lv.live && len(lv.released) < len(lv.rec.IDs)
}

func readLease(tx *txn, token storage.LeaseID, now int64) (*leaseView, error) {
	lv := &leaseView{token: token}
	k := dbkeys.LeaseKey(token)
	v, ok, err := tx.getForUpdate(k)
	if err != nil || !ok {
		return lv, err
	}
	rec, err := dbkeys.DecodeLease(v)
	if err != nil {
		return nil, corrupt("lease", k, err)
	}
	lv.rec, lv.exists, lv.live = rec, true, now < rec.ExpiresAt
	return lv, nil
}

// release drops id from the lease (written back by finish).
func (lv *leaseView) release(id storage.ItemID) {
	if lv.released == nil {
		lv.released = make(map[storage.ItemID]bool)
	}
	lv.released[id] = true
}

// finish writes the lease back without the released ids, deleting it (and
// its expiry entry) once it lists nothing.
func (lv *leaseView) finish(tx *txn, q *queueState) error {
	if len(lv.released) == 0 {
		return nil
	}
	kept := lv.rec.IDs[:0:0]
	for _, id := range lv.rec.IDs {
		if !lv.released[id] {
			kept = append(kept, id)
		}
	}
	if len(kept) > 0 {
		lv.rec.IDs = kept
		return tx.put(dbkeys.LeaseKey(lv.token), dbkeys.EncodeLease(lv.rec))
	}
	if err := tx.del(dbkeys.LeaseKey(lv.token)); err != nil {
		return err
	}
	if err := tx.del(dbkeys.LeaseExpiryKey(lv.rec.ExpiresAt, lv.token)); err != nil {
		return err
	}
	tx.delta(q).Leases--
	return nil
}

// checkItem applies the lease-token rules of package storage to one id and
// returns its code and, for CodeOK, its in_progress record. q must not be
// nil (settle answers a missing queue itself).
func checkItem(tx *txn, q *queueState, lv *leaseView, id storage.ItemID) (storage.Code, *dbkeys.ItemRecord, error) {
	k := dbkeys.InProgressKey(q.name, id)
	v, ok, err := tx.getForUpdate(k)
	if err != nil {
		return 0, nil, err
	}
	if ok {
		rec, err := dbkeys.DecodeItem(v)
		if err != nil {
			return 0, nil, corrupt("lease check", k, err)
		}
		switch {
		case rec.Lease != lv.token:
			return storage.CodeLeaseMismatch, nil, nil
		case !lv.isLive():
			return storage.CodeLeaseExpired, nil, nil
		}
		return storage.CodeOK, &rec, nil
	}
	found, err := tx.exists(dbkeys.AvailableKey(q.name, id))
	if err == nil && !found {
		found, err = tx.exists(dbkeys.DLQKey(q.name, id))
	}
	switch {
	case err != nil:
		return 0, nil, err
	case !found:
		return storage.CodeNotFound, nil, nil
	case lv.isLive():
		return storage.CodeLeaseMismatch, nil, nil
	}
	return storage.CodeLeaseExpired, nil, nil
}

func (s *Store) validateIDs(queue string, n int) error {
	if err := s.limits.ValidateQueueName(queue); err != nil {
		return err
	}
	return s.limits.ValidateBatch(n)
}

// Ack implements storage.Store.
func (s *Store) Ack(ctx context.Context, p storage.AckParams) ([]storage.Code, error) {
	if err := s.enter("ack"); err != nil {
		return nil, err
	}
	defer s.exit()
	if err := s.validateIDs(p.Queue, len(p.IDs)); err != nil {
		return nil, fmt.Errorf("rocksstore: ack %q: %w", p.Queue, err)
	}
	if err := checkCtx(ctx, "ack"); err != nil {
		return nil, err
	}
	q := s.queue(p.Queue)
	now := nanos(p.Now)
	codes, err := s.settle("ack", q, p.Lease, now, p.IDs, func(tx *txn, d *dbkeys.Counters, id storage.ItemID, rec *dbkeys.ItemRecord) error {
		if rec.PayloadExternal {
			if err := tx.del(dbkeys.PayloadKey(q.name, id)); err != nil {
				return err
			}
		}
		d.Acked++
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rocksstore: ack %q: %w", p.Queue, err)
	}
	return codes, nil
}

// Nack implements storage.Store.
func (s *Store) Nack(ctx context.Context, p storage.NackParams) ([]storage.Code, error) {
	if err := s.enter("nack"); err != nil {
		return nil, err
	}
	defer s.exit()
	if err := s.validateIDs(p.Queue, len(p.IDs)); err != nil {
		return nil, fmt.Errorf("rocksstore: nack %q: %w", p.Queue, err)
	}
	if p.Delay != nil {
		if err := s.limits.ValidateDelay(*p.Delay); err != nil {
			return nil, fmt.Errorf("rocksstore: nack %q: %w", p.Queue, err)
		}
	}
	if err := checkCtx(ctx, "nack"); err != nil {
		return nil, err
	}
	q := s.queue(p.Queue)
	now := nanos(p.Now)
	reason := truncateReason(p.Reason, s.limits.MaxReason)
	var cfg storage.QueueConfig
	if q != nil {
		cfg = q.config()
	}
	codes, err := s.settle("nack", q, p.Lease, now, p.IDs, func(tx *txn, d *dbkeys.Counters, id storage.ItemID, rec *dbkeys.ItemRecord) error {
		d.Nacked++
		rec.LastError = reason
		if rec.Attempts >= q.maxAttempts(rec) {
			return s.putDead(tx, q, id, *rec, "nack: "+reason, now)
		}
		var delay time.Duration
		if p.Delay != nil {
			delay = *p.Delay
		} else {
			delay = storage.Backoff(cfg, rec.Attempts, s.jitter())
		}
		rec.VisibleAt = now + int64(delay)
		rec.Delayed = rec.VisibleAt > now
		return s.putAvailable(tx, q, id, *rec, nil, false)
	})
	if err != nil {
		return nil, fmt.Errorf("rocksstore: nack %q: %w", p.Queue, err)
	}
	return codes, nil
}

// settle is the shared body of Ack and Nack: in one transaction it applies
// the lease-token rules to every id and, for each CodeOK id, removes its
// in_progress entry, releases it from the lease, counts it out of inflight
// and hands its record to done. A missing queue makes every code
// CodeNotFound without opening a transaction.
func (s *Store) settle(op string, q *queueState, token storage.LeaseID, now int64, ids []storage.ItemID,
	done func(tx *txn, d *dbkeys.Counters, id storage.ItemID, rec *dbkeys.ItemRecord) error) ([]storage.Code, error) {
	codes := make([]storage.Code, len(ids))
	if q == nil {
		for i := range codes {
			codes[i] = storage.CodeNotFound
		}
		return codes, nil
	}
	err := s.runTxn(op, func(tx *txn) error {
		lv, err := readLease(tx, token, now)
		if err != nil {
			return err
		}
		d := tx.delta(q)
		for i, id := range ids {
			c, rec, err := checkItem(tx, q, lv, id)
			if err != nil {
				return err
			}
			codes[i] = c
			if c != storage.CodeOK {
				continue
			}
			if err := tx.del(dbkeys.InProgressKey(q.name, id)); err != nil {
				return err
			}
			lv.release(id)
			d.Inflight--
			if err := done(tx, d, id, rec); err != nil {
				return err
			}
		}
		return lv.finish(tx, q)
	})
	return codes, err
}

// putDead writes an item that left inflight into the dead-letter namespace.
func (s *Store) putDead(tx *txn, q *queueState, id storage.ItemID, rec dbkeys.ItemRecord, reason string, now int64) error {
	rec.HasLease, rec.Lease = false, [16]byte{}
	rec.Delayed = false
	rec.Dead, rec.DeadAt, rec.Reason = true, now, reason
	if err := tx.put(dbkeys.DLQKey(q.name, id), dbkeys.EncodeItem(rec)); err != nil {
		return err
	}
	d := tx.delta(q)
	d.Dead++
	d.DeadLettered++
	return nil
}

func truncateReason(r string, max int) string {
	if len(r) <= max {
		return r
	}
	// Cut on a rune boundary so the stored reason stays valid UTF-8.
	cut := max
	for cut > 0 && !utf8.RuneStart(r[cut]) {
		cut--
	}
	return r[:cut]
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
	if err := s.limits.ValidateQueueName(p.Queue); err != nil {
		return time.Time{}, err
	}
	if err := s.limits.ValidateLease(p.Duration); err != nil {
		return time.Time{}, err
	}
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	now := nanos(p.Now)
	var exp int64
	err := s.runTxn("extend", func(tx *txn) error {
		lv, err := readLease(tx, p.Lease, now)
		if err != nil {
			return err
		}
		if !lv.live {
			return storage.ErrLeaseExpired
		}
		if lv.rec.Queue != p.Queue {
			return storage.ErrLeaseMismatch
		}
		d := p.Duration
		if d == 0 {
			q := s.queue(p.Queue)
			if q == nil {
				return fmt.Errorf("%w: queue of a live lease is missing", storage.ErrCorrupt)
			}
			d = q.config().LeaseDuration
		}
		exp = now + int64(d)
		if err := tx.del(dbkeys.LeaseExpiryKey(lv.rec.ExpiresAt, p.Lease)); err != nil {
			return err
		}
		lv.rec.ExpiresAt = exp
		ek := dbkeys.LeaseExpiryKey(exp, p.Lease)
		tx.note(&s.expiryCur, ek)
		if err := tx.put(ek, dbkeys.Marker()); err != nil {
			return err
		}
		return tx.put(dbkeys.LeaseKey(p.Lease), dbkeys.EncodeLease(lv.rec))
	})
	if err != nil {
		return time.Time{}, err
	}
	return instant(exp), nil
}
