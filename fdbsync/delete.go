package fdbsync

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

// DeleteQueue implements storage.Store. With Force the items go first, a
// chunk per transaction; the last transaction removes the queue only if
// its item counters read zero. It reads them without snapshot, so an
// enqueue or any other change to the queue committing meanwhile makes it
// retry (and then see the items); an enqueue after it finds no config
// (also read without snapshot) and creates the queue anew.
func (s *Store) DeleteQueue(ctx context.Context, p storage.DeleteQueueParams) (int, error) {
	if err := s.checkOpen(); err != nil {
		return 0, err
	}
	if err := p.Validate(s.limits); err != nil {
		return 0, err
	}
	total := 0
	for attempt := 0; ; attempt++ {
		if p.Force {
			n, err := s.purgeLive(ctx, p.Queue, p.Now)
			total += n
			if err != nil {
				return total, fmt.Errorf("fdbsync: delete queue %q: %w", p.Queue, err)
			}
			for {
				res, err := s.deadOp(ctx, storage.RedriveParams{Queue: p.Queue, Limit: min(purgeBatch, s.limits.MaxBatch), Now: p.Now}, false)
				total += res.Moved
				if err != nil {
					return total, fmt.Errorf("fdbsync: delete queue %q: %w", p.Queue, err)
				}
				if res.Moved == 0 {
					break
				}
			}
		}
		err := s.removeQueue(ctx, p.Queue, p.Now)
		if errors.Is(err, storage.ErrNotEmpty) && p.Force && attempt < 3 {
			continue // enqueued meanwhile: delete those too
		}
		if err != nil {
			return total, fmt.Errorf("fdbsync: delete queue %q: %w", p.Queue, err)
		}
		return total, nil
	}
}

// removeQueue clears an empty queue's config, counters and dedup keys.
func (s *Store) removeQueue(ctx context.Context, q string, now time.Time) error {
	_, _, _, err := s.mutate(ctx, now, func(tx kv.Tx, call *call) (any, error) {
		if call.prior != nil {
			return nil, nil
		}
		if _, ok, err := s.config(tx, q); err != nil {
			return nil, err
		} else if !ok {
			return nil, storage.ErrNotFound
		}
		pre := s.k.counters(q)
		rows, err := tx.GetRange(pre, kv.PrefixEnd(pre), kv.RangeOptions{})
		if err != nil {
			return nil, err
		}
		var items, leases int64
		for _, r := range rows {
			if len(r.Key) != len(pre)+1 {
				continue
			}
			switch r.Key[len(pre)] {
			case ctrReady, ctrDelayed, ctrInflight, ctrDead:
				items += counterValue(r.Value)
			case ctrLeases:
				leases += counterValue(r.Value)
			}
		}
		if items != 0 || leases != 0 {
			return nil, fmt.Errorf("%w: %d items (ready, delayed, inflight or dead); delete them first or force", storage.ErrNotEmpty, items)
		}
		dpre := s.k.dedupPrefix(q)
		drows, err := tx.GetRange(dpre, kv.PrefixEnd(dpre), kv.RangeOptions{})
		if err != nil {
			return nil, err
		}
		for _, r := range drows {
			key, _, err := readStr(r.Key[len(dpre):])
			if err != nil {
				return nil, err
			}
			d, err := decodeDedup(r.Value)
			if err != nil {
				return nil, err
			}
			tx.Clear(s.k.dedupExp(d.expires, q, key))
		}
		tx.ClearRange(dpre, kv.PrefixEnd(dpre))
		tx.ClearRange(pre, kv.PrefixEnd(pre))
		tx.Clear(s.k.queue(q))
		call.set(tx, nil)
		return nil, nil
	})
	return err
}
