package rocksstore

import (
	"context"
	"fmt"
	"time"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// Enqueue implements storage.Store. One transaction writes the whole batch.
func (s *Store) Enqueue(ctx context.Context, p storage.EnqueueParams) ([]storage.EnqueueResult, error) {
	if err := s.enter("enqueue"); err != nil {
		return nil, err
	}
	defer s.exit()
	res, err := s.enqueue(ctx, p)
	if err != nil {
		return nil, fmt.Errorf("rocksstore: enqueue %q: %w", p.Queue, err)
	}
	return res, nil
}

func (s *Store) enqueue(ctx context.Context, p storage.EnqueueParams) ([]storage.EnqueueResult, error) {
	if err := s.limits.ValidateQueueName(p.Queue); err != nil {
		return nil, err
	}
	if err := s.limits.ValidateBatch(len(p.Items)); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q, err := s.ensureQueue(p.Queue)
	if err != nil {
		return nil, err
	}
	now := nanos(p.Now)
	res := make([]storage.EnqueueResult, len(p.Items))
	valid := 0
	for i, in := range p.Items {
		if err := s.validateItem(in); err != nil {
			res[i] = storage.EnqueueResult{Code: storage.CodeInvalid, Err: err.Error()}
			continue
		}
		valid++
	}
	if valid == 0 {
		return res, nil
	}
	ids, err := s.allocIDs(valid, now)
	if err != nil {
		return nil, err
	}
	cfg := q.config()
	run := s.runBlind
	for _, in := range p.Items {
		if in.DedupKey != "" {
			// Dedup keys are read and must be locked: a transaction.
			run = s.runTxn
			break
		}
	}
	err = run("enqueue", func(tx *txn) error {
		d := tx.delta(q)
		next := 0
		for i, in := range p.Items {
			if res[i].Code == storage.CodeInvalid {
				continue
			}
			id := ids[next]
			next++
			var oldDedup *dbkeys.DedupRecord
			if in.DedupKey != "" {
				v, ok, err := tx.getForUpdate(dbkeys.DedupKey(q.name, in.DedupKey))
				if err != nil {
					return err
				}
				if ok {
					rec, err := dbkeys.DecodeDedup(v)
					if err != nil {
						return corrupt("enqueue", dbkeys.DedupKey(q.name, in.DedupKey), err)
					}
					if now < rec.ExpiresAt {
						res[i] = storage.EnqueueResult{Code: storage.CodeOK, ID: rec.ID, Duplicate: true}
						d.Duplicates++
						continue
					}
					oldDedup = &rec
				}
			}
			vis := now + int64(in.Delay)
			rec := dbkeys.ItemRecord{
				Priority:    in.Priority,
				MaxAttempts: in.MaxAttempts,
				EnqueuedAt:  now,
				VisibleAt:   vis,
				DedupKey:    in.DedupKey,
				Delayed:     vis > now,
			}
			if err := s.putAvailable(tx, q, id, rec, in.Payload, true); err != nil {
				return err
			}
			d.Enqueued++
			if in.DedupKey != "" && cfg.DedupWindow > 0 {
				if oldDedup != nil {
					if err := tx.del(dbkeys.DedupExpiryKey(oldDedup.ExpiresAt, q.name, in.DedupKey)); err != nil {
						return err
					}
				}
				exp := now + int64(cfg.DedupWindow)
				if err := tx.put(dbkeys.DedupKey(q.name, in.DedupKey), dbkeys.EncodeDedup(dbkeys.DedupRecord{ID: id, ExpiresAt: exp})); err != nil {
					return err
				}
				ek := dbkeys.DedupExpiryKey(exp, q.name, in.DedupKey)
				tx.note(&s.dedupCur, ek)
				if err := tx.put(ek, dbkeys.Marker()); err != nil {
					return err
				}
			}
			res[i] = storage.EnqueueResult{Code: storage.CodeOK, ID: id}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

func (s *Store) validateItem(in storage.EnqueueItem) error {
	if len(in.Payload) > s.limits.MaxPayload {
		return fmt.Errorf("%w: payload of %d bytes exceeds the limit of %d", storage.ErrInvalidArgument, len(in.Payload), s.limits.MaxPayload)
	}
	if err := s.limits.ValidateDelay(in.Delay); err != nil {
		return err
	}
	if len(in.DedupKey) > s.limits.MaxDedupKey {
		return fmt.Errorf("%w: dedup key of %d bytes exceeds the limit of %d", storage.ErrInvalidArgument, len(in.DedupKey), s.limits.MaxDedupKey)
	}
	return nil
}

// putAvailable writes an item into available with its visibility entry,
// and its delayed entry when rec.Delayed; it counts the item ready or
// delayed. With fresh set, payload is the item's payload and is written
// inline or externally; otherwise rec already says where the payload is
// (and carries it when inline).
func (s *Store) putAvailable(tx *txn, q *queueState, id storage.ItemID, rec dbkeys.ItemRecord, payload []byte, fresh bool) error {
	if fresh {
		if s.inlineMax >= 0 && len(payload) <= s.inlineMax {
			rec.Payload = payload
		} else {
			rec.PayloadExternal = true
			if err := tx.put(dbkeys.PayloadKey(q.name, id), dbkeys.EncodePayload(payload)); err != nil {
				return err
			}
		}
	}
	rec.HasLease, rec.Lease = false, [16]byte{}
	rec.Dead, rec.DeadAt, rec.Reason = false, 0, ""
	if err := tx.put(dbkeys.AvailableKey(q.name, id), dbkeys.EncodeItem(rec)); err != nil {
		return err
	}
	vk := dbkeys.VisibilityKey(q.name, rec.Priority, rec.VisibleAt, id)
	q.noteVisible(tx, rec.Priority, vk)
	if err := tx.put(vk, dbkeys.Marker()); err != nil {
		return err
	}
	d := tx.delta(q)
	if rec.Delayed {
		dk := dbkeys.DelayedKey(rec.VisibleAt, q.name, id)
		tx.note(&s.delayedCur, dk)
		if err := tx.put(dk, dbkeys.Marker()); err != nil {
			return err
		}
		d.Delayed++
		tx.deadline(instant(rec.VisibleAt))
	} else {
		d.Ready++
	}
	return nil
}

// takeAvailable removes an available item (record, visibility entry and
// delayed entry) and uncounts it. rec is its current record.
func (s *Store) takeAvailable(tx *txn, q *queueState, id storage.ItemID, rec dbkeys.ItemRecord) error {
	if err := tx.del(dbkeys.AvailableKey(q.name, id)); err != nil {
		return err
	}
	if err := tx.del(dbkeys.VisibilityKey(q.name, rec.Priority, rec.VisibleAt, id)); err != nil {
		return err
	}
	d := tx.delta(q)
	if rec.Delayed {
		// The item counts as delayed until the sweeper removes its
		// delayed entry; lock the entry so a concurrent promotion and this
		// take agree on which counter to decrement.
		dk := dbkeys.DelayedKey(rec.VisibleAt, q.name, id)
		_, ok, err := tx.getForUpdate(dk)
		if err != nil {
			return err
		}
		if ok {
			if err := tx.del(dk); err != nil {
				return err
			}
			d.Delayed--
			return nil
		}
	}
	d.Ready--
	return nil
}

// payloadOf returns an item's payload (never nil), reading it through tx
// when it is stored externally.
func (s *Store) payloadOf(get func([]byte) ([]byte, bool, error), q string, id storage.ItemID, rec *dbkeys.ItemRecord) ([]byte, error) {
	if !rec.PayloadExternal {
		if rec.Payload == nil {
			return []byte{}, nil
		}
		return rec.Payload, nil
	}
	k := dbkeys.PayloadKey(q, id)
	v, ok, err := get(k)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("rocksstore: item %s: %w: external payload missing", id, storage.ErrCorrupt)
	}
	p, err := dbkeys.DecodePayload(v)
	if err != nil {
		return nil, corrupt("payload", k, err)
	}
	return p, nil
}

// itemOut converts a record to the caller's Item.
func itemOut(q string, id storage.ItemID, rec *dbkeys.ItemRecord, payload []byte, state storage.State) storage.Item {
	return storage.Item{
		ID:          id,
		Queue:       q,
		Payload:     payload,
		Priority:    rec.Priority,
		Attempts:    rec.Attempts,
		MaxAttempts: rec.MaxAttempts,
		EnqueuedAt:  instant(rec.EnqueuedAt),
		VisibleAt:   instant(rec.VisibleAt),
		DedupKey:    rec.DedupKey,
		LastError:   rec.LastError,
		State:       state,
	}
}

// availableState is the state of an available item at now.
func availableState(rec *dbkeys.ItemRecord, now time.Time) storage.State {
	if rec.VisibleAt > nanos(now) {
		return storage.StateDelayed
	}
	return storage.StateReady
}
