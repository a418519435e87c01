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
	res, valid, fn, err := s.enqueueOp(ctx, p)
	if err != nil || fn == nil {
		return res, err
	}
	next, err := s.submit(p.Queue, valid, fn)
	if err != nil {
		return nil, err
	}
	if !next.IsZero() && s.onDeadline != nil {
		s.onDeadline(next)
	}
	return res, nil
}

// enqueueOp checks an enqueue and returns its results (filled in when fn
// runs), the number of valid items and the op that writes them; fn is nil
// when there is nothing to write.
func (s *Store) enqueueOp(ctx context.Context, p storage.EnqueueParams) (res []storage.EnqueueResult, valid int, fn func(o *opTx) error, err error) {
	if err := p.Validate(s.limits); err != nil {
		return nil, 0, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, 0, nil, err
	}
	now := nanos(p.Now)
	if err := s.checkSpace(now); err != nil {
		return nil, 0, nil, err
	}
	res = make([]storage.EnqueueResult, len(p.Items))
	for i, in := range p.Items {
		if err := s.limits.ValidateItem(in); err != nil {
			res[i] = storage.EnqueueResult{Code: storage.CodeInvalid, Err: storage.ItemReason(err)}
			continue
		}
		valid++
	}
	eq := s.queue(p.Queue)
	if valid == 0 && eq != nil {
		return res, 0, nil, nil // nothing to write (the op below also creates a new queue)
	}
	// Records the ready-record cache will likely keep are encoded here, on
	// the caller's goroutine, into memory the cache then keeps: the
	// committer's serial path neither encodes nor copies them.
	var enc [][]byte
	if eq == nil || !eq.cacheFull() {
		enc = make([][]byte, len(p.Items))
		for i, in := range p.Items {
			if res[i].Code != storage.CodeInvalid && s.inlined(in.Payload) {
				rec := newRecord(in, now)
				rec.Payload = in.Payload
				enc[i] = dbkeys.AppendItem(make([]byte, 0, dbkeys.ItemLen(rec)), rec)
			}
		}
	}
	// The op captures copies of what it needs: a captured p, or a
	// captured named result, moves to the heap (an allocation per call).
	queue, items, out, count := p.Queue, p.Items, res, valid
	return res, valid, func(o *opTx) error {
		q, err := s.ensureQueue(o, queue, nil)
		if err != nil {
			return err
		}
		cfg := q.config()
		first := s.allocIDs(o, count)
		d := o.delta(q)
		n := 0
		for i, in := range items {
			if out[i].Code == storage.CodeInvalid {
				continue
			}
			id := dbkeys.NewID(first+uint64(n), now)
			n++
			var oldDedup *dbkeys.DedupRecord
			if in.DedupKey != "" {
				v, ok, err := o.getForUpdate(dbkeys.DedupKey(q.name, in.DedupKey))
				if err != nil {
					return err
				}
				if ok {
					rec, err := dbkeys.DecodeDedup(v)
					if err != nil {
						return corrupt("enqueue", dbkeys.DedupKey(q.name, in.DedupKey), err)
					}
					if dedupHolds(rec, now, cfg.DedupWindow) {
						out[i] = storage.EnqueueResult{Code: storage.CodeOK, ID: rec.ID, Duplicate: true}
						d.Duplicates++
						continue
					}
					oldDedup = &rec
				}
			}
			rec := newRecord(in, now)
			var e []byte
			if enc != nil {
				e = enc[i]
			}
			s.putAvailable(o, q, id, rec, in.Payload, true, e)
			d.Enqueued++
			if in.DedupKey != "" && cfg.DedupWindow > 0 {
				if oldDedup != nil {
					o.del(dbkeys.DedupExpiryKey(oldDedup.ExpiresAt, q.name, in.DedupKey))
				}
				exp := now + int64(cfg.DedupWindow)
				o.put(dbkeys.DedupKey(q.name, in.DedupKey), dbkeys.EncodeDedup(dbkeys.DedupRecord{ID: id, ExpiresAt: exp}))
				ek := dbkeys.DedupExpiryKey(exp, q.name, in.DedupKey)
				o.note(&s.dedupCur, ek)
				o.put(ek, dbkeys.Marker())
				o.deadline(exp)
			}
			out[i] = storage.EnqueueResult{Code: storage.CodeOK, ID: id}
		}
		return nil
	}, nil
}

// dedupHolds reports whether a recorded dedup key still makes an enqueue
// at now a duplicate under the queue's current window: the record's
// expiry was fixed by the window in force when the key was seen, and a
// window shortened since (or set to 0, which turns dedup off) must apply
// at once, or producers' items would be dropped as duplicates for up to
// the old window. A longer window does not stretch the record: the sweep
// drops it at its expiry either way. The key was seen when its item was
// enqueued, which the item's id carries.
func dedupHolds(rec dbkeys.DedupRecord, now int64, window time.Duration) bool {
	return window > 0 && now < rec.ExpiresAt && now-dbkeys.IDEnqueuedAt(rec.ID) < int64(window)
}

// newRecord is the available record of a new item enqueued at now,
// without its payload.
func newRecord(in storage.EnqueueItem, now int64) dbkeys.ItemRecord {
	vis := now + int64(in.Delay)
	return dbkeys.ItemRecord{
		Priority:    in.Priority,
		MaxAttempts: in.MaxAttempts,
		EnqueuedAt:  now,
		VisibleAt:   vis,
		DedupKey:    in.DedupKey,
		Delayed:     vis > now,
	}
}

// inlined reports whether a payload lives in its item's record.
func (s *Store) inlined(payload []byte) bool {
	return s.inlineMax >= 0 && len(payload) <= s.inlineMax
}

// putAvailable writes an item into available with its visibility entry,
// and its delayed entry when rec.Delayed; it adds the item to the queue's
// serve order (and delayed set) and counts it ready or delayed. With fresh
// set, payload is the item's payload and is written inline or externally,
// and enc, if not nil, is its record already encoded (enqueueOp);
// otherwise rec already says where the payload is (and carries it when
// inline). REQUIRES: on the committer.
func (s *Store) putAvailable(o *opTx, q *queueState, id storage.ItemID, rec dbkeys.ItemRecord, payload []byte, fresh bool, enc []byte) {
	// A fresh item's keys are new to the batch (its id was reserved by
	// this op): they skip the overlay's index (putAs).
	if fresh {
		if s.inlined(payload) {
			rec.Payload = payload
		} else {
			rec.PayloadExternal = true
			o.putNew(dbkeys.PayloadKey(q.name, id), dbkeys.EncodePayload(payload))
		}
	}
	v := enc
	if v == nil {
		rec.HasLease, rec.Lease = false, [16]byte{}
		rec.Dead, rec.DeadAt, rec.Reason = false, 0, ""
		v = o.itemValue(rec)
	}
	o.putAs(fresh, o.availableKey(q.name, id), v)
	s.cacheReady(o, q, id, v, fresh, enc != nil)
	o.putAs(fresh, o.visibilityKey(q.name, rec.Priority, rec.VisibleAt, id), dbkeys.Marker())
	q.mu.Lock()
	q.ready.push(rec.Priority, readyEntry{vis: rec.VisibleAt, id: id})
	q.mu.Unlock()
	d := o.delta(q)
	if rec.Delayed {
		o.putAs(fresh, dbkeys.DelayedKey(rec.VisibleAt, q.name, id), dbkeys.Marker())
		q.delayed[id] = rec.VisibleAt
		s.delayed.push(timed{at: rec.VisibleAt, token: id, q: q})
		d.Delayed++
		o.deadline(rec.VisibleAt)
	} else {
		d.Ready++
	}
	o.undoReady(q, rec.Priority, rec.VisibleAt, id, rec.Delayed)
}

// takeAvailable removes an available item (record, visibility entry and
// delayed entry) and uncounts it; rec is its current record. Its serve
// order entry was already popped by the caller. REQUIRES: on the
// committer.
func (s *Store) takeAvailable(o *opTx, q *queueState, id storage.ItemID, rec dbkeys.ItemRecord) {
	// An available item's keys are in the overlay only if the batch
	// enqueued it or made it available again (opTx.untouched).
	notInBatch := o.untouched() && o.oldItem(id)
	o.delAs(notInBatch, o.availableKey(q.name, id))
	s.cacheReady(o, q, id, nil, false, false)
	o.delAs(notInBatch, o.visibilityKey(q.name, rec.Priority, rec.VisibleAt, id))
	d := o.delta(q)
	// The item counts as delayed until the sweeper promotes it.
	if vis, ok := q.delayed[id]; ok {
		o.delAs(notInBatch, dbkeys.DelayedKey(vis, q.name, id))
		delete(q.delayed, id)
		o.onUndo(func() { q.delayed[id] = vis })
		d.Delayed--
		return
	}
	d.Ready--
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
