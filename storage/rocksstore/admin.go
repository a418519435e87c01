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
		q.mu.Lock()
		c, cfg, heads := q.counters, q.cfg, q.heads
		q.mu.Unlock()
		st := storage.QueueStats{
			Queue: name, Ready: c.Ready, Delayed: c.Delayed, Inflight: c.Inflight, Dead: c.Dead, Leases: c.Leases,
			Enqueued: uint64(c.Enqueued), Duplicates: uint64(c.Duplicates), Delivered: uint64(c.Delivered),
			Acked: uint64(c.Acked), Nacked: uint64(c.Nacked), Expired: uint64(c.Expired),
			DeadLettered: uint64(c.DeadLettered), Redriven: uint64(c.Redriven), Purged: uint64(c.Purged),
			Config: cfg,
		}
		if c.Ready > 0 || c.Delayed > 0 {
			oldest, ok, err := s.oldestVisible(name, &heads, nanos(p.Now))
			if err != nil {
				return nil, fmt.Errorf("rocksstore: stats %q: %w", name, err)
			}
			if ok {
				st.OldestReadyAge = time.Duration(nanos(p.Now) - oldest)
			}
		}
		out = append(out, st)
	}
	return out, nil
}

// oldestVisible returns the earliest VisibleAt <= now among the first
// visibility entries of each priority.
func (s *Store) oldestVisible(queue string, heads *[256][]byte, now int64) (int64, bool, error) {
	prefix := dbkeys.VisibilityPrefix(queue)
	it, ro := s.newIter(nil, prefix, dbkeys.PrefixEnd(prefix))
	defer func() {
		it.Close()
		ro.Destroy()
	}()
	var oldest int64
	found := false
	p := 0
	it.Seek(seekHead(queue, 0, heads[0]))
	for it.Valid() {
		k := copySlice(it.Key())
		_, prio, vis, _, err := dbkeys.DecodeVisibilityKey(k)
		if err != nil {
			return 0, false, corrupt("stats", k, err)
		}
		if int(prio) != p {
			p = int(prio)
			if h := heads[p]; h != nil && bytes.Compare(h, k) > 0 {
				it.Seek(h)
				continue
			}
		}
		if vis <= now && (!found || vis < oldest) {
			oldest, found = vis, true
		}
		if p == 255 {
			break
		}
		p++
		it.Seek(seekHead(queue, uint8(p), heads[p]))
	}
	if err := it.Err(); err != nil {
		return 0, false, translate("stats: iterate", err)
	}
	return oldest, found, nil
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
	return s.scan(nil, prefix, dbkeys.PrefixEnd(prefix), seek, func(k, v []byte) (bool, error) {
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

func (s *Store) rawGetter(k []byte) ([]byte, bool, error) { return s.getRaw(s.ro, k) }

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

// purgeChunk is how many items one purge transaction deletes, so purging a
// big queue never builds one huge transaction.
const purgeChunk = 256

// Purge implements storage.Store. It deletes in chunks of purgeChunk items
// per transaction; concurrent enqueues may survive it.
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
	total := 0
	for _, inflight := range []bool{true, false} {
		prefix := dbkeys.AvailablePrefix(q.name)
		if inflight {
			prefix = dbkeys.InProgressPrefix(q.name)
		}
		// Each chunk resumes after the last key of the previous one: a
		// rescan from the prefix would walk the tombstones the previous
		// chunks just wrote (quadratic in the queue length).
		var resume []byte
		for {
			if err := checkCtx(ctx, "purge"); err != nil {
				return total, err
			}
			var ids []storage.ItemID
			err := s.scan(nil, prefix, dbkeys.PrefixEnd(prefix), resume, func(k, _ []byte) (bool, error) {
				resume = successor(k)
				var id storage.ItemID
				copy(id[:], k[len(prefix):])
				ids = append(ids, id)
				return len(ids) < purgeChunk, nil
			})
			if err != nil {
				return total, fmt.Errorf("rocksstore: purge %q: %w", p.Queue, err)
			}
			if len(ids) == 0 {
				break
			}
			var n int
			err = s.runTxn("purge", func(tx *txn) error {
				n = 0
				leases := map[storage.LeaseID]*leaseView{}
				d := tx.delta(q)
				for _, id := range ids {
					k := append(bytes.Clone(prefix), id[:]...)
					v, ok, err := tx.getForUpdate(k)
					if err != nil {
						return err
					}
					if !ok {
						continue
					}
					rec, err := dbkeys.DecodeItem(v)
					if err != nil {
						return corrupt("purge", k, err)
					}
					if inflight {
						lv := leases[rec.Lease]
						if lv == nil {
							if lv, err = readLease(tx, rec.Lease, 0); err != nil {
								return err
							}
							leases[rec.Lease] = lv
						}
						if err := tx.del(k); err != nil {
							return err
						}
						if lv.exists {
							lv.release(id)
						}
						d.Inflight--
					} else if err := s.takeAvailable(tx, q, id, rec); err != nil {
						return err
					}
					if rec.PayloadExternal {
						if err := tx.del(dbkeys.PayloadKey(q.name, id)); err != nil {
							return err
						}
					}
					n++
				}
				for _, lv := range leases {
					if err := lv.finish(tx, q); err != nil {
						return err
					}
				}
				d.Purged += int64(n)
				return nil
			})
			if err != nil {
				return total, fmt.Errorf("rocksstore: purge %q: %w", p.Queue, err)
			}
			total += n
		}
	}
	return total, nil
}

// Redrive implements storage.Store. An id listed twice is redriven once;
// the second gets CodeNotFound.
func (s *Store) Redrive(ctx context.Context, p storage.RedriveParams) (storage.RedriveResult, error) {
	return s.deadOp(ctx, "redrive", p, func(tx *txn, q *queueState, id storage.ItemID, rec dbkeys.ItemRecord, now int64) error {
		rec.Attempts = 0
		rec.VisibleAt = now
		rec.Delayed = false
		if err := s.putAvailable(tx, q, id, rec, nil, false); err != nil {
			return err
		}
		d := tx.delta(q)
		d.Dead--
		d.Redriven++
		return nil
	})
}

// PurgeDead implements storage.Store.
func (s *Store) PurgeDead(ctx context.Context, p storage.RedriveParams) (storage.RedriveResult, error) {
	return s.deadOp(ctx, "purge dead", p, func(tx *txn, q *queueState, id storage.ItemID, rec dbkeys.ItemRecord, _ int64) error {
		if rec.PayloadExternal {
			if err := tx.del(dbkeys.PayloadKey(q.name, id)); err != nil {
				return err
			}
		}
		d := tx.delta(q)
		d.Dead--
		d.Purged++
		return nil
	})
}

func (s *Store) deadOp(ctx context.Context, op string, p storage.RedriveParams, apply func(tx *txn, q *queueState, id storage.ItemID, rec dbkeys.ItemRecord, now int64) error) (storage.RedriveResult, error) {
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
		err := s.scan(nil, prefix, dbkeys.PrefixEnd(prefix), nil, func(k, _ []byte) (bool, error) {
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
	err := s.runTxn(op, func(tx *txn) error {
		res.Moved = 0
		for i, id := range ids {
			k := dbkeys.DLQKey(q.name, id)
			v, ok, err := tx.getForUpdate(k)
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
			if err := tx.del(k); err != nil {
				return err
			}
			if err := apply(tx, q, id, rec, now); err != nil {
				return err
			}
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
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.putRaw("set queue config "+queue, dbkeys.QueueConfigKey(queue), dbkeys.EncodeQueueConfig(recordFromConfig(c))); err != nil {
		return err
	}
	q := s.mu.queues[queue]
	if q == nil {
		q = newQueueState(queue, c)
		s.mu.queues[queue] = q
		return nil
	}
	q.mu.Lock()
	q.cfg = c
	q.mu.Unlock()
	return nil
}
