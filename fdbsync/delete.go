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

// removeQueue clears an empty queue's config, counters and dedup keys, in
// as many transactions as its dedup keys need (each clears a key, its
// expiry entry and their conflict ranges: a window's worth of keys can
// exceed one transaction's size). Each checks that the queue is still
// empty; the last one also removes the queue.
func (s *Store) removeQueue(ctx context.Context, q string, now time.Time) error {
	for {
		v, _, _, err := s.mutate(ctx, now, func(tx kv.Tx, call *call) (any, error) {
			if call.prior != nil {
				// An earlier attempt of this step committed: was it
				// the last?
				b, err := call.result()
				if err != nil {
					return nil, err
				}
				return len(b) == 1 && b[0] == 1, nil
			}
			return s.removeQueueStep(tx, call, q)
		})
		if err != nil {
			return err
		}
		if done, _ := v.(bool); done {
			return nil
		}
	}
}

// removeQueueStep is one transaction of removeQueue: true when the queue
// is gone, false when dedup keys remain for the next.
func (s *Store) removeQueueStep(tx kv.Tx, call *call, q string) (any, error) {
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
	drows, err := tx.GetRange(dpre, kv.PrefixEnd(dpre), kv.RangeOptions{Limit: dedupPerTxn + 1})
	if err != nil {
		return nil, err
	}
	size := 0
	for i, r := range drows {
		if i == dedupPerTxn || size > txnBudget {
			call.set(tx, []byte{0})
			return false, nil // more for the next transaction
		}
		key, _, err := readStr(r.Key[len(dpre):])
		if err != nil {
			return nil, err
		}
		d, err := decodeDedup(r.Value)
		if err != nil {
			return nil, err
		}
		exp := s.k.dedupExp(d.expires, q, key)
		tx.Clear(exp)
		tx.Clear(r.Key)
		size += 3*(len(exp)+len(r.Key)) + len(r.Value)
	}
	tx.ClearRange(dpre, kv.PrefixEnd(dpre))
	tx.ClearRange(pre, kv.PrefixEnd(pre)) // the counters
	tx.Clear(s.k.queue(q))
	call.set(tx, []byte{1})
	return true, nil
}

// dedupPerTxn is the most dedup keys one removeQueue transaction clears.
const dedupPerTxn = 1000
