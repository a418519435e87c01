package fdbsync

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

// purgeBatch is how many items one purge transaction deletes: each costs a
// few hundred bytes of clears, so 200 stays far below the size budget.
const purgeBatch = 200

// statsPerTxn is how many queues' stats one read transaction gathers:
// each costs four or five reads, so that a node with many queues stays
// far inside FoundationDB's five seconds per transaction.
const statsPerTxn = 100

// Stats implements storage.Store: counters by one range read per queue,
// plus one seek per priority level in use for the oldest ready age. Every
// queue's stats are gathered in transactions of statsPerTxn queues each
// (a queue deleted meanwhile is left out), so they are not one snapshot.
func (s *Store) Stats(ctx context.Context, p storage.StatsParams) ([]storage.QueueStats, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	if err := p.Validate(s.limits); err != nil {
		return nil, err
	}
	if p.Queue != "" {
		v, err := s.view(ctx, func(tx kv.Tx) (any, error) {
			if _, ok, err := s.config(tx, p.Queue); err != nil {
				return nil, err
			} else if !ok {
				return nil, fmt.Errorf("fdbsync: stats %q: %w", p.Queue, storage.ErrNotFound)
			}
			st, err := s.queueStats(tx, p.Queue, p.Now)
			if err != nil {
				return nil, err
			}
			return []storage.QueueStats{st}, nil
		})
		if err != nil {
			return nil, err
		}
		return as[[]storage.QueueStats](v)
	}
	v, err := s.view(ctx, func(tx kv.Tx) (any, error) { return s.queueNames(tx) })
	if err != nil {
		return nil, err
	}
	queues, err := as[[]string](v)
	if err != nil {
		return nil, err
	}
	out := make([]storage.QueueStats, 0, len(queues))
	for len(queues) > 0 {
		part := queues[:min(statsPerTxn, len(queues))]
		queues = queues[len(part):]
		v, err := s.view(ctx, func(tx kv.Tx) (any, error) {
			sts := make([]storage.QueueStats, 0, len(part))
			for _, q := range part {
				if _, ok, err := s.config(tx, q); err != nil {
					return nil, err
				} else if !ok {
					continue // deleted since the names were read
				}
				st, err := s.queueStats(tx, q, p.Now)
				if err != nil {
					return nil, err
				}
				sts = append(sts, st)
			}
			return sts, nil
		})
		if err != nil {
			return nil, err
		}
		sts, err := as[[]storage.QueueStats](v)
		if err != nil {
			return nil, err
		}
		out = append(out, sts...)
	}
	return out, nil
}

func (s *Store) counters(tx kv.Tx, q string) ([ctrCount]int64, error) {
	var c [ctrCount]int64
	pre := s.k.counters(q)
	rows, err := tx.GetRange(pre, kv.PrefixEnd(pre), kv.RangeOptions{Snapshot: true})
	if err != nil {
		return c, err
	}
	for _, r := range rows {
		if len(r.Key) == len(pre)+1 && r.Key[len(pre)] < ctrCount {
			c[r.Key[len(pre)]] = counterValue(r.Value)
		}
	}
	return c, nil
}

func (s *Store) queueStats(tx kv.Tx, q string, now time.Time) (storage.QueueStats, error) {
	cfg, _, err := s.config(tx, q)
	if err != nil {
		return storage.QueueStats{}, err
	}
	c, err := s.counters(tx, q)
	if err != nil {
		return storage.QueueStats{}, err
	}
	st := storage.QueueStats{
		Queue: q, Ready: c[ctrReady], Delayed: c[ctrDelayed], Inflight: c[ctrInflight], Dead: c[ctrDead],
		Leases: c[ctrLeases], Enqueued: uint64(c[ctrEnqueued]), Duplicates: uint64(c[ctrDuplicates]),
		Delivered: uint64(c[ctrDelivered]), Acked: uint64(c[ctrAcked]), Nacked: uint64(c[ctrNacked]),
		Expired: uint64(c[ctrExpired]), DeadLettered: uint64(c[ctrDeadLettered]), Redriven: uint64(c[ctrRedriven]),
		Purged: uint64(c[ctrPurged]), Config: cfg,
	}
	// Oldest ready: the first entry of each priority level in use.
	rp := s.k.readyPrefix(q)
	end := kv.PrefixEnd(rp)
	from := rp
	var oldest time.Time
	for {
		rows, err := tx.GetRange(from, end, kv.RangeOptions{Snapshot: true, Limit: 1})
		if err != nil {
			return st, err
		}
		if len(rows) == 0 {
			break
		}
		rest := rows[0].Key[len(rp):]
		if len(rest) < 9 {
			return st, errBadKey
		}
		vis, _, err := readTime(rest[1:])
		if err != nil {
			return st, err
		}
		if !vis.After(now) && (oldest.IsZero() || vis.Before(oldest)) {
			oldest = vis
		}
		if rest[0] == 0xff {
			break
		}
		from = append(append([]byte{}, rp...), rest[0]+1)
	}
	// Delayed items whose time has come are ready too, promoted or not.
	dp := s.k.delayedPrefix(q)
	rows, err := tx.GetRange(dp, kv.PrefixEnd(dp), kv.RangeOptions{Snapshot: true, Limit: 1})
	if err != nil {
		return st, err
	}
	if len(rows) == 1 {
		vis, _, err := readTime(rows[0].Key[len(dp):])
		if err != nil {
			return st, err
		}
		if !vis.After(now) && (oldest.IsZero() || vis.Before(oldest)) {
			oldest = vis
		}
	}
	if !oldest.IsZero() {
		st.OldestReadyAge = now.Sub(oldest)
	}
	return st, nil
}

func (s *Store) queueNames(tx kv.Tx) ([]string, error) {
	pre := s.k.ns(nsQueue)
	rows, err := tx.GetRange(pre, kv.PrefixEnd(pre), kv.RangeOptions{Snapshot: true})
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(rows))
	for _, r := range rows {
		q, _, err := readStr(r.Key[len(pre):])
		if err != nil {
			return nil, err
		}
		out = append(out, q)
	}
	return out, nil
}

// checkNewQueue applies Limits.MaxQueues before a queue is created: it
// counts the queues (a snapshot read, so two nodes creating queues at
// once may overshoot by a few).
func (s *Store) checkNewQueue(tx kv.Tx) error {
	pre := s.k.ns(nsQueue)
	rows, err := tx.GetRange(pre, kv.PrefixEnd(pre), kv.RangeOptions{Snapshot: true, Limit: s.limits.MaxQueues})
	if err != nil {
		return err
	}
	return s.limits.CheckNewQueue(len(rows))
}

// Queues implements storage.Store.
func (s *Store) Queues(ctx context.Context) ([]string, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	v, err := s.view(ctx, func(tx kv.Tx) (any, error) { return s.queueNames(tx) })
	if err != nil {
		return nil, err
	}
	return as[[]string](v)
}

// Peek implements storage.Store.
func (s *Store) Peek(ctx context.Context, p storage.PeekParams) ([]storage.Item, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	if err := p.Validate(s.limits); err != nil {
		return nil, err
	}
	v, err := s.view(ctx, func(tx kv.Tx) (any, error) {
		pre := s.k.availablePrefix(p.Queue)
		if p.Inflight {
			pre = s.k.inflightPrefix(p.Queue)
		}
		rows, err := tx.GetRange(after(pre, p.After), kv.PrefixEnd(pre), kv.RangeOptions{Snapshot: true, Limit: p.Limit})
		if err != nil {
			return nil, err
		}
		return s.rowsToItems(tx, p.Queue, rows, func(r *record) storage.State {
			switch {
			case p.Inflight:
				return storage.StateInflight
			case r.visibleAt.After(p.Now):
				return storage.StateDelayed
			}
			return storage.StateReady
		})
	})
	if err != nil {
		return nil, err
	}
	return as[[]storage.Item](v)
}

func (s *Store) rowsToItems(tx kv.Tx, q string, rows []kv.KeyValue, state func(*record) storage.State) ([]storage.Item, error) {
	recs := make([]*record, len(rows))
	for i, row := range rows {
		r, err := decodeRecord(row.Value)
		if err != nil {
			return nil, err
		}
		recs[i] = &r
	}
	pay, err := s.payloads(tx, recs)
	if err != nil {
		return nil, err
	}
	items := make([]storage.Item, len(rows))
	for i, row := range rows {
		id, err := idFromTail(row.Key)
		if err != nil {
			return nil, err
		}
		items[i] = toItem(q, id, recs[i], pay[i], state(recs[i]))
	}
	return items, nil
}

// Purge implements storage.Store, in bounded transactions: available items
// first, then inflight items lease by lease (a lease lists items of one
// queue only, so the whole lease goes). Each transaction reads what it
// deletes without snapshot, so it is safe to apply twice and to race with
// claims and sweeps.
func (s *Store) Purge(ctx context.Context, p storage.PurgeParams) (int, error) {
	if err := s.checkOpen(); err != nil {
		return 0, err
	}
	if err := p.Validate(s.limits); err != nil {
		return 0, err
	}
	return s.purgeLive(ctx, p.Queue, p.Now)
}

// purgeLive deletes q's available and inflight items, a chunk per
// transaction, and returns how many it deleted.
func (s *Store) purgeLive(ctx context.Context, q string, now time.Time) (int, error) {
	total := 0
	for {
		n, err := s.countStep(ctx, now, func(tx kv.Tx) (int, error) {
			pre := s.k.availablePrefix(q)
			rows, err := tx.GetRange(pre, kv.PrefixEnd(pre), kv.RangeOptions{Limit: purgeBatch})
			if err != nil {
				return 0, err
			}
			for _, row := range rows {
				r, err := decodeRecord(row.Value)
				if err != nil {
					return 0, err
				}
				id, _ := idFromTail(row.Key)
				s.clearAvailable(tx, q, id, &r)
				s.clearPayload(tx, &r)
			}
			s.add(tx, q, ctrPurged, int64(len(rows)))
			return len(rows), nil
		})
		if err != nil {
			return total, fmt.Errorf("fdbsync: purge %q: %w", q, err)
		}
		total += n
		if n < purgeBatch {
			break
		}
	}
	for {
		n, err := s.countStep(ctx, now, func(tx kv.Tx) (int, error) {
			pre := s.k.inflightPrefix(q)
			rows, err := tx.GetRange(pre, kv.PrefixEnd(pre), kv.RangeOptions{Limit: 1})
			if err != nil || len(rows) == 0 {
				return 0, err
			}
			r, err := decodeRecord(rows[0].Value)
			if err != nil {
				return 0, err
			}
			lb, err := tx.Get(s.k.lease(r.lease), false)
			if err != nil {
				return 0, err
			}
			var ids []storage.ItemID
			if lb != nil {
				lr, err := decodeLease(lb)
				if err != nil {
					return 0, err
				}
				ids = lr.ids
				tx.Clear(s.k.lease(r.lease))
				tx.Clear(s.k.expiry(lr.expiry, r.lease))
				s.add(tx, q, ctrLeases, -1)
			} else {
				id, _ := idFromTail(rows[0].Key)
				ids = []storage.ItemID{id} // an orphan; Check reports how it came about
			}
			keys := make([][]byte, len(ids))
			for i, id := range ids {
				keys[i] = s.k.inflight(q, id)
			}
			vals, err := tx.GetMany(keys, false)
			if err != nil {
				return 0, err
			}
			n := 0
			for i, val := range vals {
				if val == nil {
					continue
				}
				ir, err := decodeRecord(val)
				if err != nil {
					return 0, err
				}
				tx.Clear(keys[i])
				s.clearPayload(tx, &ir)
				n++
			}
			s.add(tx, q, ctrInflight, -int64(n))
			s.add(tx, q, ctrPurged, int64(n))
			return n, nil
		})
		if err != nil {
			return total, fmt.Errorf("fdbsync: purge %q inflight: %w", q, err)
		}
		if n == 0 {
			break
		}
		total += n
	}
	return total, nil
}

// countStep runs one idempotent transaction that reports a count (see
// mutate): a retry after commit_unknown_result reports the count of the
// attempt that committed.
func (s *Store) countStep(ctx context.Context, now time.Time, fn func(tx kv.Tx) (int, error)) (int, error) {
	v, _, _, err := s.mutate(ctx, func(tx kv.Tx, c *call) (any, error) {
		if c.prior != nil {
			b, err := c.result()
			if err != nil || len(b) != 4 {
				return nil, errBadValue
			}
			return int(binary.BigEndian.Uint32(b)), nil
		}
		n, err := fn(tx)
		if err != nil {
			return nil, err
		}
		if n > 0 {
			c.set(tx, binary.BigEndian.AppendUint32(nil, uint32(n)))
		}
		return n, nil
	})
	if err != nil {
		return 0, err
	}
	return as[int](v)
}

// DeadList implements storage.Store.
func (s *Store) DeadList(ctx context.Context, p storage.DeadListParams) ([]storage.DeadItem, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	if err := p.Validate(s.limits); err != nil {
		return nil, err
	}
	v, err := s.view(ctx, func(tx kv.Tx) (any, error) {
		pre := s.k.deadPrefix(p.Queue)
		rows, err := tx.GetRange(after(pre, p.After), kv.PrefixEnd(pre), kv.RangeOptions{Snapshot: true, Limit: p.Limit})
		if err != nil {
			return nil, err
		}
		reasons := make([]string, len(rows))
		deadAt := make([]time.Time, len(rows))
		i := 0
		items, err := s.rowsToItems(tx, p.Queue, rows, func(r *record) storage.State {
			reasons[i], deadAt[i] = r.reason, r.deadAt
			i++
			return storage.StateDead
		})
		if err != nil {
			return nil, err
		}
		out := make([]storage.DeadItem, len(items))
		for j := range items {
			out[j] = storage.DeadItem{Item: items[j], Reason: reasons[j], DeadAt: deadAt[j]}
		}
		return out, nil
	})
	if err != nil {
		return nil, err
	}
	return as[[]storage.DeadItem](v)
}

// Redrive implements storage.Store.
func (s *Store) Redrive(ctx context.Context, p storage.RedriveParams) (storage.RedriveResult, error) {
	return s.deadOp(ctx, p, true)
}

// PurgeDead implements storage.Store.
func (s *Store) PurgeDead(ctx context.Context, p storage.RedriveParams) (storage.RedriveResult, error) {
	return s.deadOp(ctx, p, false)
}

// deadOp redrives or purges p's dead items in as many transactions as
// their records need: each one (deadChunk) takes items until its estimated
// size would pass its budget, and the next goes on from there.
func (s *Store) deadOp(ctx context.Context, p storage.RedriveParams, redrive bool) (storage.RedriveResult, error) {
	if err := s.checkOpen(); err != nil {
		return storage.RedriveResult{}, err
	}
	if err := p.Validate(s.limits); err != nil {
		return storage.RedriveResult{}, err
	}
	var out storage.RedriveResult
	part := p
	for {
		res, used, more, err := s.deadChunk(ctx, part, redrive)
		if err != nil {
			return storage.RedriveResult{}, fmt.Errorf("fdbsync: dead-letter %q: %w", p.Queue, err)
		}
		out.Moved += res.Moved
		if len(p.IDs) > 0 {
			out.Codes = append(out.Codes, res.Codes...)
			part.IDs = part.IDs[used:]
			if len(part.IDs) == 0 {
				return out, nil
			}
		} else {
			part.Limit -= used
			if !more || part.Limit == 0 {
				return out, nil
			}
		}
	}
}

// deadBudget caps one deadOp transaction's estimated size: a purge only
// clears keys, so its records' estimates (payloads included) overstate it.
// deadChunkKeys caps the dead items one reads, so that the ids or rows a
// transaction leaves to the next are not read by both.
const (
	deadBudget    = 4 * txnBudget
	deadChunkKeys = 256
)

// deadChunk is one transaction of deadOp: it takes p.IDs from the first,
// or the first dead items up to p.Limit, until the next record would pass
// deadBudget (always at least one). used counts the ids (or items) it
// took; more reports, for a page, that it stopped at the budget.
func (s *Store) deadChunk(ctx context.Context, p storage.RedriveParams, redrive bool) (res storage.RedriveResult, used int, more bool, err error) {
	q := p.Queue
	type chunk struct {
		res  storage.RedriveResult
		used int
		more bool
	}
	v, _, _, err := s.mutate(ctx, func(tx kv.Tx, c *call) (any, error) {
		var out chunk
		if c.prior != nil {
			b, err := c.result()
			if err != nil || len(b) < 9 {
				return nil, errBadValue
			}
			out.res.Moved = int(binary.BigEndian.Uint32(b))
			out.used = int(binary.BigEndian.Uint32(b[4:]))
			out.more = b[8] == 1
			if len(p.IDs) > 0 {
				if len(b[9:]) != out.used {
					return nil, errBadValue
				}
				out.res.Codes = make([]storage.Code, out.used)
				for i, x := range b[9:] {
					out.res.Codes[i] = storage.Code(x)
				}
			}
			return out, nil
		}
		var ids []storage.ItemID
		var vals [][]byte
		if len(p.IDs) > 0 {
			ids = p.IDs[:min(len(p.IDs), deadChunkKeys)]
			keys := make([][]byte, len(ids))
			for i, id := range ids {
				keys[i] = s.k.dead(q, id)
			}
			var err error
			if vals, err = tx.GetMany(keys, false); err != nil {
				return nil, err
			}
		} else {
			pre := s.k.deadPrefix(q)
			limit := min(p.Limit, deadChunkKeys)
			rows, err := tx.GetRange(pre, kv.PrefixEnd(pre), kv.RangeOptions{Limit: limit})
			if err != nil {
				return nil, err
			}
			// A full read short of the page: more may follow.
			out.more = len(rows) == limit && limit < p.Limit
			for _, row := range rows {
				id, _ := idFromTail(row.Key)
				ids = append(ids, id)
				vals = append(vals, row.Value)
			}
		}
		seen := map[storage.ItemID]bool{}
		size := 0
		for i, val := range vals {
			if val == nil || seen[ids[i]] {
				out.res.Codes = append(out.res.Codes, storage.CodeNotFound)
				out.used++
				continue
			}
			r, err := decodeRecord(val)
			if err != nil {
				return nil, err
			}
			if sz := recordSize(&r, 64); out.used > 0 && size+sz > deadBudget {
				out.more = true
				break
			} else {
				size += sz
			}
			seen[ids[i]] = true
			out.res.Codes = append(out.res.Codes, storage.CodeOK)
			out.used++
			tx.Clear(s.k.dead(q, ids[i]))
			s.add(tx, q, ctrDead, -1)
			if redrive {
				r.attempts, r.reason, r.deadAt = 0, "", time.Time{}
				r.visibleAt = p.Now
				s.putAvailable(tx, q, ids[i], &r, p.Now)
				s.add(tx, q, ctrRedriven, 1)
			} else {
				s.clearPayload(tx, &r)
				s.add(tx, q, ctrPurged, 1)
			}
			out.res.Moved++
		}
		if len(p.IDs) == 0 {
			out.res.Codes = nil
		}
		if out.res.Moved > 0 {
			if redrive {
				s.wakeQueue(tx, q)
			}
			b := binary.BigEndian.AppendUint32(nil, uint32(out.res.Moved))
			b = binary.BigEndian.AppendUint32(b, uint32(out.used))
			more := byte(0)
			if out.more {
				more = 1
			}
			b = append(b, more)
			c.set(tx, append(b, codesBytes(out.res.Codes)...))
		}
		return out, nil
	})
	if err != nil {
		return res, 0, false, err
	}
	out := v.(chunk)
	return out.res, out.used, out.more, nil
}

// QueueConfig implements storage.Store.
func (s *Store) QueueConfig(ctx context.Context, queue string) (storage.QueueConfig, error) {
	if err := s.checkOpen(); err != nil {
		return storage.QueueConfig{}, err
	}
	if err := s.limits.ValidateQueueName(queue); err != nil {
		return storage.QueueConfig{}, err
	}
	v, err := s.view(ctx, func(tx kv.Tx) (any, error) {
		c, ok, err := s.config(tx, queue)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("fdbsync: queue %q: %w", queue, storage.ErrNotFound)
		}
		return c, nil
	})
	if err != nil {
		return storage.QueueConfig{}, err
	}
	return as[storage.QueueConfig](v)
}

// SetQueueConfig implements storage.Store. A plain set of a fixed value
// (the queue's incarnation kept, or filled in when the set creates it):
// safe to apply twice.
func (s *Store) SetQueueConfig(ctx context.Context, queue string, c storage.QueueConfig) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	if err := s.limits.ValidateQueueName(queue); err != nil {
		return err
	}
	if err := s.limits.ValidateQueueConfig(c); err != nil {
		return err
	}
	_, _, _, err := s.mutate(ctx, func(tx kv.Tx, call *call) (any, error) {
		if call.prior != nil {
			return nil, nil
		}
		if _, created, ok, err := s.queueConfig(tx, queue); err != nil {
			return nil, err
		} else if !ok {
			if err := s.checkNewQueue(tx); err != nil {
				return nil, err
			}
			createConfig(tx, s.k.queue(queue), c)
		} else {
			tx.Set(s.k.queue(queue), encodeConfig(c, created))
		}
		call.set(tx, nil)
		return nil, nil
	})
	if err != nil {
		return fmt.Errorf("fdbsync: set config %q: %w", queue, err)
	}
	return nil
}
