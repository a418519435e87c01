package rocksstore

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// Stats implements storage.Store. Counters come from memory (the persisted
// counters plus committed deltas); OldestReadyAge costs one seek per
// priority level in use, starting at the heads.
func (s *Store) Stats(ctx context.Context, p storage.StatsParams) ([]storage.QueueStats, error) {
	if err := s.enter("stats"); err != nil {
		return nil, err
	}
	defer s.exit()
	var names []string
	if p.Queue != "" {
		if err := s.limits.ValidateQueueName(p.Queue); err != nil {
			return nil, fmt.Errorf("rocksstore: stats %q: %w", p.Queue, err)
		}
		if s.queue(p.Queue) == nil {
			return nil, fmt.Errorf("rocksstore: stats %q: %w", p.Queue, storage.ErrNotFound)
		}
		names = []string{p.Queue}
	} else {
		names = s.queueNames()
	}
	out := make([]storage.QueueStats, 0, len(names))
	for _, name := range names {
		if err := checkCtx(ctx, "stats"); err != nil {
			return nil, err
		}
		q := s.queue(name)
		now := nanos(p.Now)
		q.mu.Lock()
		c, cfg := q.counters, q.cfg
		oldest, ok := q.ready.oldest(now)
		q.mu.Unlock()
		st := storage.QueueStats{
			Queue: name, Ready: c.Ready, Delayed: c.Delayed, Inflight: c.Inflight, Dead: c.Dead, Leases: c.Leases,
			Enqueued: uint64(c.Enqueued), Duplicates: uint64(c.Duplicates), Delivered: uint64(c.Delivered),
			Acked: uint64(c.Acked), Nacked: uint64(c.Nacked), Expired: uint64(c.Expired),
			DeadLettered: uint64(c.DeadLettered), Redriven: uint64(c.Redriven), Purged: uint64(c.Purged),
			Config: cfg,
		}
		if ok {
			st.OldestReadyAge = time.Duration(now - oldest)
		}
		out = append(out, st)
	}
	return out, nil
}

// Queues implements storage.Store.
func (s *Store) Queues(ctx context.Context) ([]string, error) {
	if err := s.enter("queues"); err != nil {
		return nil, err
	}
	defer s.exit()
	return s.queueNames(), nil
}

func (s *Store) validatePage(queue string, limit int) error {
	if err := s.limits.ValidateQueueName(queue); err != nil {
		return err
	}
	if limit < 1 || limit > s.limits.MaxBatch {
		return fmt.Errorf("%w: limit %d outside [1, %d]", storage.ErrInvalidArgument, limit, s.limits.MaxBatch)
	}
	return nil
}

// pageRecords visits up to limit records of namespace prefix after id
// after, in id order.
func (s *Store) pageRecords(prefix []byte, after storage.ItemID, limit int, fn func(id storage.ItemID, rec *dbkeys.ItemRecord) error) error {
	seek := append(bytes.Clone(prefix), after[:]...)
	n := 0
	return s.scan(prefix, dbkeys.PrefixEnd(prefix), seek, func(k, v []byte) (bool, error) {
		var id storage.ItemID
		copy(id[:], k[len(prefix):])
		if id == after {
			return true, nil
		}
		rec, err := dbkeys.DecodeItem(v)
		if err != nil {
			return false, corrupt("page", k, err)
		}
		if err := fn(id, &rec); err != nil {
			return false, err
		}
		n++
		return n < limit, nil
	})
}

func (s *Store) rawGetter(k []byte) ([]byte, bool, error) { return s.getRaw(k) }

// Peek implements storage.Store.
func (s *Store) Peek(ctx context.Context, p storage.PeekParams) ([]storage.Item, error) {
	if err := s.enter("peek"); err != nil {
		return nil, err
	}
	defer s.exit()
	if err := s.validatePage(p.Queue, p.Limit); err != nil {
		return nil, fmt.Errorf("rocksstore: peek %q: %w", p.Queue, err)
	}
	if s.queue(p.Queue) == nil {
		return nil, nil
	}
	prefix := dbkeys.AvailablePrefix(p.Queue)
	if p.Inflight {
		prefix = dbkeys.InProgressPrefix(p.Queue)
	}
	var out []storage.Item
	err := s.pageRecords(prefix, p.After, p.Limit, func(id storage.ItemID, rec *dbkeys.ItemRecord) error {
		payload, err := s.payloadOf(s.rawGetter, p.Queue, id, rec)
		if err != nil {
			return err
		}
		state := storage.StateInflight
		if !p.Inflight {
			state = availableState(rec, p.Now)
		}
		out = append(out, itemOut(p.Queue, id, rec, payload, state))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rocksstore: peek %q: %w", p.Queue, err)
	}
	return out, nil
}

// DeadList implements storage.Store.
func (s *Store) DeadList(ctx context.Context, p storage.DeadListParams) ([]storage.DeadItem, error) {
	if err := s.enter("dead list"); err != nil {
		return nil, err
	}
	defer s.exit()
	if err := s.validatePage(p.Queue, p.Limit); err != nil {
		return nil, fmt.Errorf("rocksstore: dead list %q: %w", p.Queue, err)
	}
	if s.queue(p.Queue) == nil {
		return nil, nil
	}
	var out []storage.DeadItem
	err := s.pageRecords(dbkeys.DLQPrefix(p.Queue), p.After, p.Limit, func(id storage.ItemID, rec *dbkeys.ItemRecord) error {
		payload, err := s.payloadOf(s.rawGetter, p.Queue, id, rec)
		if err != nil {
			return err
		}
		out = append(out, storage.DeadItem{
			Item:   itemOut(p.Queue, id, rec, payload, storage.StateDead),
			Reason: rec.Reason,
			DeadAt: instant(rec.DeadAt),
		})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("rocksstore: dead list %q: %w", p.Queue, err)
	}
	return out, nil
}

// purgeChunk is how many items one purge op deletes, so purging a big
// queue never builds one huge batch.
const purgeChunk = 256

// Purge implements storage.Store. It deletes in ops of purgeChunk items,
// inflight items (by lease) first, then available items (from the
// queue's serve order); items enqueued or claimed while it runs may
// survive it. It stops after as many items as the queue held when it
// began, so a busy queue cannot keep it running.
func (s *Store) Purge(ctx context.Context, p storage.PurgeParams) (int, error) {
	if err := s.enter("purge"); err != nil {
		return 0, err
	}
	defer s.exit()
	if err := s.limits.ValidateQueueName(p.Queue); err != nil {
		return 0, fmt.Errorf("rocksstore: purge %q: %w", p.Queue, err)
	}
	q := s.queue(p.Queue)
	if q == nil {
		return 0, nil
	}
	q.mu.Lock()
	budget := q.counters.Inflight + q.counters.Ready + q.counters.Delayed
	q.mu.Unlock()
	total := 0
	for _, inflight := range []bool{true, false} {
		for int64(total) < budget {
			if err := checkCtx(ctx, "purge"); err != nil {
				return total, err
			}
			n := 0
			_, err := s.submit(purgeChunk, func(o *opTx) error {
				var err error
				if inflight {
					n = s.purgeInflight(o, q, purgeChunk)
				} else {
					n, err = s.purgeAvailable(o, q, purgeChunk)
				}
				o.delta(q).Purged += int64(n)
				return err
			})
			if err != nil {
				return total, fmt.Errorf("rocksstore: purge %q: %w", p.Queue, err)
			}
			total += n
			if n == 0 {
				break
			}
		}
	}
	return total, nil
}

// purgeInflight deletes the items of q's leases, whole leases at a time,
// until at least max items are gone or no lease is left.
// REQUIRES: on the committer.
func (s *Store) purgeInflight(o *opTx, q *queueState, max int) int {
	n := 0
	d := o.delta(q)
	for _, l := range q.leases {
		if n >= max {
			break
		}
		for _, id := range l.ids {
			if s.inflight[id] != l {
				continue
			}
			s.release(o, l, id)
			o.del(dbkeys.InProgressKey(q.name, id))
			if l.ext[id] {
				o.del(dbkeys.PayloadKey(q.name, id))
			}
			d.Inflight--
			n++
		}
		s.finishLease(o, l)
	}
	return n
}

// purgeAvailable deletes up to max available items of q.
// REQUIRES: on the committer.
func (s *Store) purgeAvailable(o *opTx, q *queueState, max int) (int, error) {
	n := 0
	for n < max {
		q.mu.Lock()
		prio, e, ok := q.ready.popAny()
		q.mu.Unlock()
		if !ok {
			break
		}
		o.onUndo(func() {
			q.mu.Lock()
			q.ready.push(prio, e)
			q.mu.Unlock()
		})
		ak := dbkeys.AvailableKey(q.name, e.id)
		v, ok, err := o.getForUpdate(ak)
		if err != nil {
			return 0, err
		}
		if !ok {
			return 0, fmt.Errorf("%w: indexed item %s is not available", storage.ErrCorrupt, storage.ItemID(e.id))
		}
		rec, err := dbkeys.DecodeItem(v)
		if err != nil {
			return 0, corrupt("purge", ak, err)
		}
		s.takeAvailable(o, q, e.id, rec)
		if rec.PayloadExternal {
			o.del(dbkeys.PayloadKey(q.name, e.id))
		}
		n++
	}
	return n, nil
}

// Redrive implements storage.Store. An id listed twice is redriven once;
// the second gets CodeNotFound.
func (s *Store) Redrive(ctx context.Context, p storage.RedriveParams) (storage.RedriveResult, error) {
	return s.deadOp(ctx, "redrive", p, func(o *opTx, q *queueState, id storage.ItemID, rec dbkeys.ItemRecord, now int64) {
		rec.Attempts = 0
		rec.VisibleAt = now
		rec.Delayed = false
		s.putAvailable(o, q, id, rec, nil, false)
		d := o.delta(q)
		d.Dead--
		d.Redriven++
	})
}

// PurgeDead implements storage.Store.
func (s *Store) PurgeDead(ctx context.Context, p storage.RedriveParams) (storage.RedriveResult, error) {
	return s.deadOp(ctx, "purge dead", p, func(o *opTx, q *queueState, id storage.ItemID, rec dbkeys.ItemRecord, _ int64) {
		if rec.PayloadExternal {
			o.del(dbkeys.PayloadKey(q.name, id))
		}
		d := o.delta(q)
		d.Dead--
		d.Purged++
	})
}

func (s *Store) deadOp(ctx context.Context, op string, p storage.RedriveParams, apply func(o *opTx, q *queueState, id storage.ItemID, rec dbkeys.ItemRecord, now int64)) (storage.RedriveResult, error) {
	if err := s.enter(op); err != nil {
		return storage.RedriveResult{}, err
	}
	defer s.exit()
	fail := func(err error) (storage.RedriveResult, error) {
		return storage.RedriveResult{}, fmt.Errorf("rocksstore: %s %q: %w", op, p.Queue, err)
	}
	if err := s.limits.ValidateQueueName(p.Queue); err != nil {
		return fail(err)
	}
	byID := len(p.IDs) > 0
	if byID {
		if err := s.limits.ValidateBatch(len(p.IDs)); err != nil {
			return fail(err)
		}
	} else if p.Limit < 1 || p.Limit > s.limits.MaxBatch {
		return fail(fmt.Errorf("%w: limit %d outside [1, %d]", storage.ErrInvalidArgument, p.Limit, s.limits.MaxBatch))
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	q := s.queue(p.Queue)
	var res storage.RedriveResult
	ids := p.IDs
	if byID {
		res.Codes = make([]storage.Code, len(ids))
		if q == nil {
			for i := range res.Codes {
				res.Codes[i] = storage.CodeNotFound
			}
			return res, nil
		}
	} else {
		if q == nil {
			return res, nil
		}
		prefix := dbkeys.DLQPrefix(q.name)
		err := s.scanView(prefix, dbkeys.PrefixEnd(prefix), nil, func(k, _ []byte) (bool, error) {
			var id storage.ItemID
			copy(id[:], k[len(prefix):])
			ids = append(ids, id)
			return len(ids) < p.Limit, nil
		})
		if err != nil {
			return fail(err)
		}
	}
	now := nanos(p.Now)
	next, err := s.submit(len(ids), func(o *opTx) error {
		res.Moved = 0
		for i, id := range ids {
			k := dbkeys.DLQKey(q.name, id)
			v, ok, err := o.getForUpdate(k)
			if err != nil {
				return err
			}
			if !ok {
				if byID {
					res.Codes[i] = storage.CodeNotFound
				}
				continue
			}
			rec, err := dbkeys.DecodeItem(v)
			if err != nil {
				return corrupt(op, k, err)
			}
			o.del(k)
			apply(o, q, id, rec, now)
			if byID {
				res.Codes[i] = storage.CodeOK
			}
			res.Moved++
		}
		return nil
	})
	if err != nil {
		return fail(err)
	}
	if !next.IsZero() && s.onDeadline != nil {
		s.onDeadline(next)
	}
	return res, nil
}

// QueueConfig implements storage.Store.
func (s *Store) QueueConfig(ctx context.Context, queue string) (storage.QueueConfig, error) {
	if err := s.enter("queue config"); err != nil {
		return storage.QueueConfig{}, err
	}
	defer s.exit()
	if err := s.limits.ValidateQueueName(queue); err != nil {
		return storage.QueueConfig{}, fmt.Errorf("rocksstore: queue config %q: %w", queue, err)
	}
	q := s.queue(queue)
	if q == nil {
		return storage.QueueConfig{}, fmt.Errorf("rocksstore: queue config %q: %w", queue, storage.ErrNotFound)
	}
	return q.config(), nil
}

// SetQueueConfig implements storage.Store.
func (s *Store) SetQueueConfig(ctx context.Context, queue string, c storage.QueueConfig) error {
	if err := s.enter("set queue config"); err != nil {
		return err
	}
	defer s.exit()
	if err := s.limits.ValidateQueueName(queue); err != nil {
		return fmt.Errorf("rocksstore: set queue config %q: %w", queue, err)
	}
	if err := s.limits.ValidateQueueConfig(c); err != nil {
		return fmt.Errorf("rocksstore: set queue config %q: %w", queue, err)
	}
	_, err := s.submit(1, func(o *opTx) error {
		q, err := s.ensureQueue(o, queue, &c)
		if err != nil {
			return err
		}
		o.put(dbkeys.QueueConfigKey(queue), dbkeys.EncodeQueueConfig(recordFromConfig(c)))
		q.mu.Lock()
		old := q.cfg
		q.cfg = c
		q.mu.Unlock()
		o.onUndo(func() {
			q.mu.Lock()
			q.cfg = old
			q.mu.Unlock()
		})
		return nil
	})
	if err != nil {
		return fmt.Errorf("rocksstore: set queue config %q: %w", queue, err)
	}
	return nil
}
