package fdbsync

import (
	"context"
	"errors"
	"fmt"

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
		err := s.removeQueue(ctx, p.Queue)
		if errors.Is(err, storage.ErrNotEmpty) && p.Force && attempt < 3 {
			continue // enqueued meanwhile: delete those too
		}
		if err != nil {
			return total, fmt.Errorf("fdbsync: delete queue %q: %w", p.Queue, err)
		}
		return total, nil
	}
}

// removeQueue removes an empty queue: one transaction checks that it is
// empty and clears its config, counters and as many of its dedup keys as
// fit (each clears a key, its expiry entry and their conflict ranges: a
// window's worth of keys can exceed one transaction's size). The queue is
// gone from that commit on, whatever follows, so a refused removal has
// changed nothing. Dedup keys left over are cleared by the transactions
// after it; meanwhile they are older than any queue of that name created
// again (dedupBefore), which ignores them.
func (s *Store) removeQueue(ctx context.Context, q string) error {
	removed := false // the queue is gone; its dedup keys from cursor on remain
	var cursor []byte
	for {
		v, _, _, err := s.mutate(ctx, func(tx kv.Tx, call *call) (any, error) {
			if call.prior != nil {
				// An earlier attempt of this step committed: its
				// result says where it stopped.
				b, err := call.result()
				if err != nil {
					return nil, err
				}
				return decodeRemoveStep(b)
			}
			if !removed {
				return s.removeQueueStep(tx, call, q)
			}
			return s.clearRemovedDedup(tx, call, q, cursor)
		})
		if err != nil {
			return err
		}
		st, err := as[removeStep](v)
		if err != nil {
			return err
		}
		if st.done {
			return nil
		}
		removed, cursor = true, st.cursor
	}
}

// removeStep is the outcome of one transaction of removeQueue, kept in its
// marker: done, or the dedup key to go on from.
type removeStep struct {
	done   bool
	cursor []byte
}

func (st removeStep) encode() []byte {
	if st.done {
		return []byte{1}
	}
	return append([]byte{0}, st.cursor...)
}

func decodeRemoveStep(b []byte) (removeStep, error) {
	if len(b) == 0 || b[0] > 1 || (b[0] == 1 && len(b) != 1) {
		return removeStep{}, errBadValue
	}
	return removeStep{done: b[0] == 1, cursor: b[1:]}, nil
}

// removeQueueStep is the first transaction of removeQueue: the queue is
// gone when it commits.
func (s *Store) removeQueueStep(tx kv.Tx, call *call, q string) (any, error) {
	if _, ok, err := s.config(tx, q); err != nil {
		return nil, err
	} else if !ok {
		return nil, storage.ErrNotFound
	}
	// Only the counters that say whether the queue is empty are read (with
	// conflicts): the lifetime ones change with every duplicate enqueue,
	// and a producer retrying with dedup keys kept an empty queue from
	// being removed (found by review, session 69).
	vals, err := tx.GetMany([][]byte{s.k.counter(q, ctrReady), s.k.counter(q, ctrDelayed),
		s.k.counter(q, ctrInflight), s.k.counter(q, ctrDead), s.k.counter(q, ctrLeases)}, false)
	if err != nil {
		return nil, err
	}
	var items int64
	for _, v := range vals[:4] {
		items += counterValue(v)
	}
	leases := counterValue(vals[4])
	if items != 0 || leases != 0 {
		return nil, fmt.Errorf("%w: %d items (ready, delayed, inflight or dead); delete them first or force", storage.ErrNotEmpty, items)
	}
	pre := s.k.counters(q)
	tx.ClearRange(pre, kv.PrefixEnd(pre)) // the counters
	tx.Clear(s.k.queue(q))
	return s.clearDedup(tx, call, q, nil, func(dedupRec) bool { return true })
}

// clearRemovedDedup is a later transaction of removeQueue: it clears the
// removed queue's dedup keys from cursor on, skipping those of a queue of
// the same name created since.
func (s *Store) clearRemovedDedup(tx kv.Tx, call *call, q string, cursor []byte) (any, error) {
	_, created, ok, err := s.queueConfig(tx, q)
	if err != nil {
		return nil, err
	}
	return s.clearDedup(tx, call, q, cursor, func(d dedupRec) bool { return !ok || dedupBefore(d, created) })
}

// clearDedup clears the dedup keys of q from cursor on (nil: the first)
// for which old holds, with their expiry entries, as many as fit in tx,
// and records in call's marker where it stopped.
func (s *Store) clearDedup(tx kv.Tx, call *call, q string, cursor []byte, old func(dedupRec) bool) (any, error) {
	dpre := s.k.dedupPrefix(q)
	begin := dpre
	if cursor != nil {
		begin = cursor
	}
	// By snapshot, with a conflict on each key cleared: an enqueue that
	// writes one of them aborts this step, while the keys a queue of the
	// same name created since writes among them do not (they aborted every
	// step, found by review, session 69).
	drows, err := tx.GetRange(begin, kv.PrefixEnd(dpre), kv.RangeOptions{Limit: dedupPerTxn + 1, Snapshot: true})
	if err != nil {
		return nil, err
	}
	size := 0
	for i, r := range drows {
		if i == dedupPerTxn || size > txnBudget {
			st := removeStep{cursor: r.Key} // more for the next transaction
			call.set(tx, st.encode())
			return st, nil
		}
		key, _, err := readStr(r.Key[len(dpre):])
		if err != nil {
			return nil, err
		}
		d, err := decodeDedup(r.Value)
		if err != nil {
			return nil, err
		}
		if !old(d) {
			continue
		}
		if err := tx.AddReadConflictRange(r.Key, kv.KeyAfter(r.Key)); err != nil {
			return nil, err
		}
		exp := s.k.dedupExp(d.expires, q, key)
		tx.Clear(exp)
		tx.Clear(r.Key)
		size += 3*(len(exp)+len(r.Key)) + len(r.Value)
	}
	st := removeStep{done: true}
	call.set(tx, st.encode())
	return st, nil
}

// dedupPerTxn is the most dedup keys one removeQueue transaction clears.
const dedupPerTxn = 1000
