package fdbsync

import (
	"context"
	"fmt"
	"time"

	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

// settled is one id of an ack or nack that passed the token checks.
type settled struct {
	idx int
	id  storage.ItemID
	rec record
}

// checkTokens applies storage/doc.go's lease token rules to ids and returns
// the codes plus the items the call may settle. Every read is without
// snapshot: the decision depends on them, so any concurrent change to one
// of them aborts this transaction.
func (s *Store) checkTokens(tx kv.Tx, q string, lease storage.LeaseID, ids []storage.ItemID, now time.Time, ack bool) ([]storage.Code, []settled, *leaseRec, error) {
	lb, err := tx.Get(s.k.lease(lease), false)
	if err != nil {
		return nil, nil, nil, err
	}
	var lr *leaseRec
	remaining := 0
	if lb != nil {
		l, err := decodeLease(lb)
		if err != nil {
			return nil, nil, nil, err
		}
		lr = &l
		remaining = len(l.ids)
	}
	// The ids are judged in order, as if settled one by one: once the
	// lease's last item is settled the lease is gone and no longer live.
	live := func() bool { return lr != nil && remaining > 0 && now.Before(lr.expiry) }
	keys := make([][]byte, len(ids))
	for i, id := range ids {
		keys[i] = s.k.inflight(q, id)
	}
	vals, err := tx.GetMany(keys, false)
	if err != nil {
		return nil, nil, nil, err
	}
	codes := make([]storage.Code, len(ids))
	liveAt := make([]bool, len(ids))
	var ok []settled
	var missing []int
	done := map[storage.ItemID]bool{}
	for i, v := range vals {
		liveAt[i] = live()
		if done[ids[i]] {
			// Settled earlier in this call: an ack deleted it, a nack
			// left it available or dead.
			if ack {
				codes[i] = storage.LeaseCode(storage.Absent, false)
			} else {
				codes[i] = storage.LeaseCode(storage.NotInflight, liveAt[i])
			}
			continue
		}
		if v == nil {
			missing = append(missing, i)
			continue
		}
		r, err := decodeRecord(v)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("item %s: %w", ids[i], err)
		}
		if r.lease != lease {
			codes[i] = storage.LeaseCode(storage.HeldByOther, false)
			continue
		}
		codes[i] = storage.LeaseCode(storage.HeldByLease, liveAt[i] && lr.queue == q)
		if codes[i] == storage.CodeOK {
			ok = append(ok, settled{idx: i, id: ids[i], rec: r})
			done[ids[i]] = true
			remaining--
		}
	}
	if len(missing) > 0 {
		// Not inflight: does it exist at all (available or dead)?
		ek := make([][]byte, 0, 2*len(missing))
		for _, i := range missing {
			ek = append(ek, s.k.available(q, ids[i]), s.k.dead(q, ids[i]))
		}
		ev, err := tx.GetMany(ek, false)
		if err != nil {
			return nil, nil, nil, err
		}
		for j, i := range missing {
			if ev[2*j] == nil && ev[2*j+1] == nil {
				codes[i] = storage.LeaseCode(storage.Absent, false)
			} else {
				codes[i] = storage.LeaseCode(storage.NotInflight, liveAt[i])
			}
		}
	}
	return codes, ok, lr, nil
}

// releaseLease drops settled ids from the lease record, deleting the lease
// when it lists nothing more.
func (s *Store) releaseLease(tx kv.Tx, lease storage.LeaseID, lr *leaseRec, done []settled) {
	for _, st := range done {
		lr.remove(st.id)
	}
	if len(lr.ids) == 0 {
		tx.Clear(s.k.lease(lease))
		tx.Clear(s.k.expiry(lr.expiry, lease))
		s.add(tx, lr.queue, ctrLeases, -1)
		return
	}
	tx.Set(s.k.lease(lease), lr.encode())
}

func codesFromMarker(c *call, n int) ([]storage.Code, error) {
	b, err := c.result()
	if err != nil {
		return nil, err
	}
	if len(b) != n {
		return nil, errBadValue
	}
	codes := make([]storage.Code, n)
	for i := range b {
		codes[i] = storage.Code(b[i])
	}
	return codes, nil
}

func codesBytes(codes []storage.Code) []byte {
	b := make([]byte, len(codes))
	for i, c := range codes {
		b[i] = byte(c)
	}
	return b
}

// Ack implements storage.Store.
func (s *Store) Ack(ctx context.Context, p storage.AckParams) ([]storage.Code, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	if err := p.Validate(s.limits); err != nil {
		return nil, err
	}
	q := p.Queue
	v, _, _, err := s.mutate(ctx, func(tx kv.Tx, c *call) (any, error) {
		if c.prior != nil {
			return codesFromMarker(c, len(p.IDs))
		}
		codes, ok, lr, err := s.checkTokens(tx, q, p.Lease, p.IDs, p.Now, true)
		if err != nil || len(ok) == 0 {
			return codes, err
		}
		for _, st := range ok {
			tx.Clear(s.k.inflight(q, st.id))
			s.clearPayload(tx, &st.rec)
		}
		s.add(tx, q, ctrInflight, -int64(len(ok)))
		s.add(tx, q, ctrAcked, int64(len(ok)))
		s.releaseLease(tx, p.Lease, lr, ok)
		c.set(tx, codesBytes(codes))
		return codes, nil
	})
	if err != nil {
		return nil, fmt.Errorf("fdbsync: ack %q lease %s: %w", q, p.Lease, err)
	}
	return as[[]storage.Code](v)
}

// Nack implements storage.Store. The records a poll leased fit one
// transaction's budget, but a nack writes its reason into each (twice for
// an item it buries): the ids go in groups whose reasons add at most
// nackReasonBudget, one transaction each, as so many nacks of part of the
// lease would.
func (s *Store) Nack(ctx context.Context, p storage.NackParams) ([]storage.Code, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	if err := p.Validate(s.limits); err != nil {
		return nil, err
	}
	reason := s.limits.TruncateReason(p.Reason)
	if p.Undelivered {
		reason = "" // not recorded
	}
	// Backoff draws are made once per call, outside the retry loop, so a
	// retried attempt writes the same visibility times.
	draws := make([]float64, len(p.IDs))
	for i := range draws {
		draws[i] = s.float()
	}
	per := max(1, nackReasonBudget/(2*len(reason)+len("nack: ")+64))
	if per >= len(p.IDs) {
		return s.nackGroup(ctx, p, reason, draws)
	}
	codes := make([]storage.Code, 0, len(p.IDs))
	for i := 0; i < len(p.IDs); i += per {
		part := p
		part.IDs = p.IDs[i:min(i+per, len(p.IDs))]
		c, err := s.nackGroup(ctx, part, reason, draws[i:])
		if err != nil {
			return nil, err
		}
		codes = append(codes, c...)
	}
	return codes, nil
}

// nackReasonBudget bounds the reason bytes one nack transaction writes.
const nackReasonBudget = 2 * txnBudget

// nackGroup nacks p.IDs, whose backoff draws are draws, in one
// transaction.
func (s *Store) nackGroup(ctx context.Context, p storage.NackParams, reason string, draws []float64) ([]storage.Code, error) {
	q := p.Queue
	var earliest time.Time
	v, _, _, err := s.mutate(ctx, func(tx kv.Tx, c *call) (any, error) {
		earliest = time.Time{}
		if c.prior != nil {
			// The marker holds the codes and, when the nack delayed an
			// item, the earliest instant it set: found by review
			// (session 74), a replayed nack reported no deadline, so the
			// sweeper learned of it only at its next capped wake-up.
			b, err := c.result()
			if err != nil {
				return nil, err
			}
			if len(b) == len(p.IDs)+8 {
				if earliest, _, err = readTime(b[len(p.IDs):]); err != nil {
					return nil, err
				}
				c.prior = c.prior[:1+len(p.IDs)]
			}
			return codesFromMarker(c, len(p.IDs))
		}
		codes, ok, lr, err := s.checkTokens(tx, q, p.Lease, p.IDs, p.Now, false)
		if err != nil || len(ok) == 0 {
			return codes, err
		}
		cfg, _, err := s.config(tx, q)
		if err != nil {
			return nil, err
		}
		ready := false
		for _, st := range ok {
			r := st.rec
			tx.Clear(s.k.inflight(q, st.id))
			if p.Undelivered {
				// The claim taken back: its attempt, at its old
				// place in the ready order.
				r.attempts = max(r.attempts, 1) - 1
				if s.putAvailable(tx, q, st.id, &r, p.Now) == storage.StateReady {
					ready = true
				} else if earliest.IsZero() || r.visibleAt.Before(earliest) {
					earliest = r.visibleAt
				}
				continue
			}
			r.lastError = reason
			if r.attempts >= maxAttempts(&r, cfg) {
				s.bury(tx, q, st.id, &r, "nack: "+reason, p.Now)
				continue
			}
			d := storage.Backoff(cfg, r.attempts, draws[st.idx])
			if p.Delay != nil {
				d = *p.Delay
			}
			r.visibleAt = p.Now.Add(d)
			if s.putAvailable(tx, q, st.id, &r, p.Now) == storage.StateReady {
				ready = true
			} else if earliest.IsZero() || r.visibleAt.Before(earliest) {
				earliest = r.visibleAt
			}
		}
		s.add(tx, q, ctrInflight, -int64(len(ok)))
		if !p.Undelivered { // Delivered, a lifetime counter, keeps the claim
			s.add(tx, q, ctrNacked, int64(len(ok)))
		}
		if ready {
			s.wakeQueue(tx, q)
		}
		s.releaseLease(tx, p.Lease, lr, ok)
		m := codesBytes(codes)
		if !earliest.IsZero() {
			m = appendTime(m, earliest)
		}
		c.set(tx, m)
		return codes, nil
	})
	if err != nil {
		return nil, fmt.Errorf("fdbsync: nack %q lease %s: %w", q, p.Lease, err)
	}
	s.deadline(earliest)
	return as[[]storage.Code](v)
}

// bury writes r to the dead-letter namespace and counts it.
func (s *Store) bury(tx kv.Tx, q string, id storage.ItemID, r *record, reason string, now time.Time) {
	r.lease = storage.LeaseID{}
	r.delayed = false
	r.reason = reason
	r.deadAt = now
	tx.Set(s.k.dead(q, id), r.encode())
	s.add(tx, q, ctrDead, 1)
	s.add(tx, q, ctrDeadLettered, 1)
}

// ExtendLease implements storage.Store.
func (s *Store) ExtendLease(ctx context.Context, p storage.ExtendParams) (time.Time, error) {
	if err := s.checkOpen(); err != nil {
		return time.Time{}, err
	}
	if err := p.Validate(s.limits); err != nil {
		return time.Time{}, err
	}
	var exp time.Time
	v, _, _, err := s.mutate(ctx, func(tx kv.Tx, c *call) (any, error) {
		if c.prior != nil {
			b, err := c.result()
			if err != nil {
				return nil, err
			}
			t, _, err := readTime(b)
			exp = t
			return t, err
		}
		lb, err := tx.Get(s.k.lease(p.Lease), false)
		if err != nil {
			return nil, err
		}
		if lb == nil {
			return nil, storage.ErrLeaseExpired
		}
		lr, err := decodeLease(lb)
		if err != nil {
			return nil, err
		}
		if !p.Now.Before(lr.expiry) {
			return nil, storage.ErrLeaseExpired
		}
		if lr.queue != p.Queue {
			return nil, storage.ErrLeaseMismatch
		}
		d := p.Duration
		if d == 0 {
			cfg, _, err := s.config(tx, p.Queue)
			if err != nil {
				return nil, err
			}
			d = cfg.LeaseDuration
		}
		exp = p.Now.Add(d)
		tx.Clear(s.k.expiry(lr.expiry, p.Lease))
		lr.expiry = exp
		tx.Set(s.k.expiry(exp, p.Lease), nil)
		tx.Set(s.k.lease(p.Lease), lr.encode())
		c.set(tx, appendTime(nil, exp))
		return exp, nil
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("fdbsync: extend %q lease %s: %w", p.Queue, p.Lease, err)
	}
	s.deadline(exp)
	return as[time.Time](v)
}
