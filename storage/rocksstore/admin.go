package rocksstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
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
	if err := p.Validate(s.limits); err != nil {
		return nil, fmt.Errorf("rocksstore: stats %q: %w", p.Queue, err)
	}
	var names []string
	if p.Queue != "" {
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
		if q == nil { // deleted since it was listed
			if p.Queue != "" {
				return nil, fmt.Errorf("rocksstore: stats %q: %w", p.Queue, storage.ErrNotFound)
			}
			continue
		}
		now := nanos(p.Now)
		q.mu.Lock()
		c, cfg := q.counters, q.cfg
		oldest, ok := q.ready.oldest(now)
		st := storage.QueueStats{
			Queue: name, Ready: c.Ready, Delayed: c.Delayed, Inflight: c.Inflight, Dead: c.Dead, Leases: c.Leases,
			Enqueued: uint64(c.Enqueued), Duplicates: uint64(c.Duplicates), Delivered: uint64(c.Delivered),
			Acked: uint64(c.Acked), Nacked: uint64(c.Nacked), Expired: uint64(c.Expired),
			DeadLettered: uint64(c.DeadLettered), Redriven: uint64(c.Redriven), Purged: uint64(c.Purged),
			Config: cfg,
		}
		oldest, ok = q.adjustStats(&st, now, oldest, ok)
		q.mu.Unlock()
		st.CorruptErrors = s.corruptErrors(name)
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

// pageRecords visits the records of namespace prefix after id after, in
// id order, until fn has kept limit of them. fn leaves out a record whose
// item went away since the page's snapshot (kept false), and the page
// reads on in its place, so a page is short only at the namespace's end.
func (s *Store) pageRecords(prefix []byte, after storage.ItemID, limit int, fn func(id storage.ItemID, rec *dbkeys.ItemRecord) (kept bool, err error)) error {
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
		kept, err := fn(id, &rec)
		if err != nil {
			return false, err
		}
		if kept {
			n++
		}
		return n < limit, nil
	})
}

func (s *Store) rawGetter(k []byte) ([]byte, bool, error) { return s.getRaw(k) }

// pagePayload returns the payload of item id, whose record a page read
// under key prefix+id, or ok false when the item is gone: a page reads
// records from its iterator's snapshot but external payloads from the
// latest state, so an item acked or purged in between has no payload
// left, and no record either. A record still there without its payload
// is damage.
func (s *Store) pagePayload(prefix []byte, q string, id storage.ItemID, rec *dbkeys.ItemRecord) (payload []byte, ok bool, err error) {
	payload, err = s.payloadOf(s.rawGetter, q, id, rec)
	if err == nil || !rec.PayloadExternal {
		return payload, err == nil, err
	}
	_, still, gerr := s.getRaw(append(bytes.Clone(prefix), id[:]...))
	if gerr != nil {
		return nil, false, gerr
	}
	if !still {
		return nil, false, nil
	}
	return nil, false, err
}

// Peek implements storage.Store.
func (s *Store) Peek(ctx context.Context, p storage.PeekParams) ([]storage.Item, error) {
	if err := s.enter("peek"); err != nil {
		return nil, err
	}
	defer s.exit()
	if err := p.Validate(s.limits); err != nil {
		return nil, fmt.Errorf("rocksstore: peek %q: %w", p.Queue, err)
	}
	q := s.queue(p.Queue)
	if q == nil {
		return nil, nil
	}
	// No claims ahead from here to the end of the scan (claimAhead), so
	// the batches given back now are all the queue holds while it reads.
	q.mu.Lock()
	q.peeking++
	q.mu.Unlock()
	defer func() {
		q.mu.Lock()
		q.peeking--
		q.mu.Unlock()
	}()
	if err := s.giveBackAll(q); err != nil {
		return nil, fmt.Errorf("rocksstore: peek %q: %w", p.Queue, err)
	}
	prefix := dbkeys.AvailablePrefix(p.Queue)
	if p.Inflight {
		prefix = dbkeys.InProgressPrefix(p.Queue)
	}
	var out []storage.Item
	err := s.pageRecords(prefix, p.After, p.Limit, func(id storage.ItemID, rec *dbkeys.ItemRecord) (bool, error) {
		payload, ok, err := s.pagePayload(prefix, p.Queue, id, rec)
		if !ok {
			return false, err // nil: acked or purged since the page's snapshot
		}
		state := storage.StateInflight
		if !p.Inflight {
			state = availableState(rec, p.Now)
		}
		out = append(out, itemOut(p.Queue, id, rec, payload, state))
		return true, nil
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
	if err := p.Validate(s.limits); err != nil {
		return nil, fmt.Errorf("rocksstore: dead list %q: %w", p.Queue, err)
	}
	if s.queue(p.Queue) == nil {
		return nil, nil
	}
	var out []storage.DeadItem
	prefix := dbkeys.DLQPrefix(p.Queue)
	err := s.pageRecords(prefix, p.After, p.Limit, func(id storage.ItemID, rec *dbkeys.ItemRecord) (bool, error) {
		payload, ok, err := s.pagePayload(prefix, p.Queue, id, rec)
		if !ok {
			return false, err // nil: redriven or purged since the page's snapshot
		}
		out = append(out, storage.DeadItem{
			Item:   itemOut(p.Queue, id, rec, payload, storage.StateDead),
			Reason: rec.Reason,
			DeadAt: instant(rec.DeadAt),
		})
		return true, nil
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
	if err := p.Validate(s.limits); err != nil {
		return 0, fmt.Errorf("rocksstore: purge %q: %w", p.Queue, err)
	}
	q := s.queue(p.Queue)
	if q == nil {
		return 0, nil
	}
	if err := s.giveBackAll(q); err != nil {
		return 0, fmt.Errorf("rocksstore: purge %q: %w", p.Queue, err)
	}
	n, err := s.purgeLive(ctx, q)
	if err != nil {
		return n, fmt.Errorf("rocksstore: purge %q: %w", p.Queue, err)
	}
	return n, nil
}

// purgeLive deletes q's inflight and available items in chunks of
// purgeChunk, each its own op, and returns how many it deleted. Items
// enqueued meanwhile may or may not be deleted.
func (s *Store) purgeLive(ctx context.Context, q *queueState) (int, error) {
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
			_, err := s.submit(q.name, purgeChunk, func(o *opTx) error {
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
				return total, err
			}
			total += n
			if n == 0 {
				break
			}
		}
	}
	return total, nil
}

// DeleteQueue implements storage.Store. With Force, the items go first in
// chunks (purgeLive, then the dead ones); the last op removes the queue
// only if it is empty at that point, so an enqueue racing with the delete
// either lands before it (and is deleted, or makes a delete without Force
// fail) or creates the queue anew after it.
func (s *Store) DeleteQueue(ctx context.Context, p storage.DeleteQueueParams) (int, error) {
	if err := s.enter("delete queue"); err != nil {
		return 0, err
	}
	defer s.exit()
	fail := func(n int, err error) (int, error) {
		return n, fmt.Errorf("rocksstore: delete queue %q: %w", p.Queue, err)
	}
	if err := p.Validate(s.limits); err != nil {
		return fail(0, err)
	}
	total := 0
	for attempt := 0; ; attempt++ {
		q := s.queue(p.Queue)
		if q == nil {
			return fail(total, storage.ErrNotFound)
		}
		if p.Force {
			n, err := s.purgeLive(ctx, q)
			total += n
			if err != nil {
				return fail(total, err)
			}
			n, err = s.purgeAllDead(ctx, q, nanos(p.Now))
			total += n
			if err != nil {
				return fail(total, err)
			}
		}
		if err := s.dropDedupChunks(ctx, q); err != nil {
			s.undelete(q)
			return fail(total, err)
		}
		var left int64
		_, err := s.submit(p.Queue, 1, func(o *opTx) error {
			var err error
			left, err = s.removeQueue(o, q)
			return err
		})
		if err != nil {
			s.undelete(q)
		}
		switch {
		case err == nil:
			s.corruptQ.Lock()
			delete(s.corruptQ.n, p.Queue)
			s.corruptQ.Unlock()
			s.log.Info("queue deleted", "queue", p.Queue, "items", total)
			return total, nil
		case errors.Is(err, storage.ErrNotEmpty) && p.Force && attempt < 3:
			continue // enqueued meanwhile: delete those too
		case errors.Is(err, storage.ErrNotEmpty):
			return fail(total, fmt.Errorf("%w: %d items (ready, delayed, inflight or dead); delete them first or force", err, left))
		default:
			return fail(total, err)
		}
	}
}

// purgeAllDead deletes q's dead items, a chunk per op.
func (s *Store) purgeAllDead(ctx context.Context, q *queueState, now int64) (int, error) {
	total := 0
	for {
		if err := checkCtx(ctx, "purge dead"); err != nil {
			return total, err
		}
		res, err := s.applyDead("purge dead", q, storage.RedriveParams{Queue: q.name, Limit: purgeChunk}, now, s.purgeDeadItem)
		if err != nil {
			return total, err
		}
		total += res.Moved
		if res.Moved == 0 {
			return total, nil
		}
	}
}

// dropDedupChunks deletes an empty queue's dedup keys in ops of up to
// purgeChunk keys each, before removeQueue deletes what is left with the
// queue: a queue's dedup keys are bounded only by its enqueue rate times
// its dedup window, and removeQueue read them all into memory and deleted
// them in one batch (found by review, session 70: 140 MiB allocated for
// 8,000 keys of 1 KiB). A queue that is not empty when the first chunk
// looks keeps its keys (removeQueue refuses the delete); one that is
// empty is marked deleting by that op, which drops nothing (the chunks
// follow in later ops), so that nothing enters it until
// removeQueue removes it (ensureQueue refuses enqueues), and once marked
// the chunks go on whatever ctx says: a delete refused or cut short
// after some of its keys went would leave a queue that takes an item it
// had seen within its dedup window as new (found by the review of this
// change).
func (s *Store) dropDedupChunks(ctx context.Context, q *queueState) error {
	prefix := dbkeys.DedupPrefix(q.name)
	var seek []byte // past the last chunk: its tombstones are not read again
	for marked := false; ; {
		if !marked {
			if err := checkCtx(ctx, "delete queue"); err != nil {
				return err
			}
		}
		n, marking := 0, false
		_, err := s.submit(q.name, purgeChunk, func(o *opTx) error {
			if !s.live(q) {
				return nil // removeQueue reports it
			}
			if !q.deleting {
				q.mu.Lock()
				c := q.counters
				q.mu.Unlock()
				if c.Ready+c.Delayed+c.Inflight+c.Dead != 0 || c.Leases != 0 {
					return nil // removeQueue refuses it
				}
				q.deleting = true
				o.onUndo(func() { q.deleting = false })
				// Durable, so that a crash before removeQueue does not
				// leave the queue with part of its keys (deletemark.go).
				o.put(dbkeys.DeletingKey(q.name), dbkeys.Marker())
				// The op that marks drops nothing: a dedup key an earlier
				// op of its batch wrote is not committed yet, so a scan
				// here would miss it, and removeQueue, finding the queue
				// marked, scans for none (found by review, session 71: a
				// deleted queue's key made the next queue of its name
				// take a new item as a duplicate). From the next op on
				// every key the queue will ever have is committed:
				// nothing enters a marked queue.
				marked, marking = true, true
				return nil
			}
			marked = true
			return s.scanView(prefix, dbkeys.PrefixEnd(prefix), seek, func(k, v []byte) (bool, error) {
				if ov, found := o.overlay(k); found {
					if ov == nil {
						return true, nil // deleted in this batch
					}
					v = ov
				}
				k = bytes.Clone(k)
				if err := delDedup(o, q, k, v); err != nil {
					return false, err
				}
				seek = append(k, 0) // the next key after k
				n++
				return n < purgeChunk, nil
			})
		})
		if s.afterDedupChunk != nil {
			s.afterDedupChunk()
		}
		if err != nil || n < purgeChunk && !marking {
			return err
		}
	}
}

// delDedup deletes q's dedup key k, whose record is v, and its expiry
// entry. REQUIRES: on the committer.
func delDedup(o *opTx, q *queueState, k, v []byte) error {
	_, key, err := dbkeys.DecodeDedupKey(k)
	if err != nil {
		return corrupt("delete queue", k, err)
	}
	rec, err := dbkeys.DecodeDedup(v)
	if err != nil {
		return corrupt("delete queue", k, err)
	}
	o.del(k)
	o.del(dbkeys.DedupExpiryKey(rec.ExpiresAt, q.name, key))
	return nil
}

// undelete lets a queue whose delete failed take items again (the mark
// dropDedupChunks set, in memory and on disk: a mark left on disk would
// have the next Open finish the delete of a queue that takes items).
// Found by review (session 70): a chunk that met a damaged dedup record
// left the queue refusing every enqueue until the node restarted. Its
// keys dropped so far stay dropped. If this op fails too (the store
// failed), the mark stays, and the reopen finishes the delete.
func (s *Store) undelete(q *queueState) {
	_, _ = s.submit(q.name, 0, func(o *opTx) error {
		if !q.deleting || !s.live(q) {
			return nil
		}
		q.deleting = false
		o.onUndo(func() { q.deleting = true })
		o.del(dbkeys.DeletingKey(q.name))
		return nil
	})
}

// removeQueue deletes an empty queue's config, counters and dedup keys
// and forgets its state; ErrNotEmpty (with the item count) if it holds
// items, ErrNotFound if it is gone already. REQUIRES: on the committer.
func (s *Store) removeQueue(o *opTx, q *queueState) (int64, error) {
	if !s.live(q) {
		return 0, storage.ErrNotFound
	}
	q.mu.Lock()
	c := q.counters
	q.mu.Unlock()
	if left := c.Ready + c.Delayed + c.Inflight + c.Dead; left != 0 || c.Leases != 0 {
		return left, storage.ErrNotEmpty // the caller undeletes it
	}
	// Dedup keys: the committed ones, and any this batch wrote; none
	// when the queue is marked deleting (dropDedupChunks dropped them all,
	// and nothing has entered it since), so its tombstones are not read
	// again.
	if !q.deleting {
		prefix := dbkeys.DedupPrefix(q.name)
		dedup := map[string][]byte{}
		err := s.scanView(prefix, dbkeys.PrefixEnd(prefix), nil, func(k, v []byte) (bool, error) {
			dedup[string(k)] = bytes.Clone(v)
			return true, nil
		})
		if err != nil {
			return 0, err
		}
		for _, e := range o.b.slot.ov.ents {
			if e.live && strings.HasPrefix(e.key, string(prefix)) {
				dedup[e.key] = e.val // nil: deleted in this batch
			}
		}
		for k, v := range dedup {
			if v == nil {
				continue
			}
			if err := delDedup(o, q, []byte(k), v); err != nil {
				return 0, err
			}
		}
	}
	if q.deleting {
		o.del(dbkeys.DeletingKey(q.name))
	}
	o.del(dbkeys.QueueConfigKey(q.name))
	o.del(dbkeys.CountersKey(q.name))
	// Counter deltas of earlier ops in this batch would be merged after
	// the delete and bring the counters key back.
	b := o.b
	kept := b.deltas[:0]
	for _, d := range b.deltas {
		if d.q != q {
			kept = append(kept, d)
		}
	}
	b.deltas = kept
	s.mu.Lock()
	delete(s.mu.queues, q.name)
	s.mu.Unlock()
	return 0, nil
}

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
		s.putAvailable(o, q, id, rec, nil, false, nil)
		d := o.delta(q)
		d.Dead--
		d.Redriven++
	})
}

// PurgeDead implements storage.Store.
func (s *Store) PurgeDead(ctx context.Context, p storage.RedriveParams) (storage.RedriveResult, error) {
	return s.deadOp(ctx, "purge dead", p, s.purgeDeadItem)
}

// purgeDeadItem deletes a dead item whose dlq record o already deleted.
func (s *Store) purgeDeadItem(o *opTx, q *queueState, id storage.ItemID, rec dbkeys.ItemRecord, _ int64) {
	if rec.PayloadExternal {
		o.del(dbkeys.PayloadKey(q.name, id))
	}
	d := o.delta(q)
	d.Dead--
	d.Purged++
}

func (s *Store) deadOp(ctx context.Context, op string, p storage.RedriveParams, apply func(o *opTx, q *queueState, id storage.ItemID, rec dbkeys.ItemRecord, now int64)) (storage.RedriveResult, error) {
	if err := s.enter(op); err != nil {
		return storage.RedriveResult{}, err
	}
	defer s.exit()
	fail := func(err error) (storage.RedriveResult, error) {
		return storage.RedriveResult{}, fmt.Errorf("rocksstore: %s %q: %w", op, p.Queue, err)
	}
	if err := p.Validate(s.limits); err != nil {
		return fail(err)
	}
	byID := len(p.IDs) > 0
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	q := s.queue(p.Queue)
	if q == nil {
		var res storage.RedriveResult
		if byID {
			res.Codes = make([]storage.Code, len(p.IDs))
			for i := range res.Codes {
				res.Codes[i] = storage.CodeNotFound
			}
		}
		return res, nil
	}
	res, err := s.applyDead(op, q, p, nanos(p.Now), apply)
	if err != nil {
		return fail(err)
	}
	return res, nil
}

// applyDead runs apply on q's dead items selected by p: its IDs, in one
// op, or up to p.Limit in id order. Those are listed by a scan before
// their op, so an item redriven or purged in between is gone by the op's
// turn; the op leaves it out, and the next op takes the items after the
// scan's last, until p.Limit items moved or the scan found the end (a
// concurrent purge does not make a redrive of n stop short while n dead
// items remain; each op is atomic, the call as a whole is not).
func (s *Store) applyDead(op string, q *queueState, p storage.RedriveParams, now int64, apply func(o *opTx, q *queueState, id storage.ItemID, rec dbkeys.ItemRecord, now int64)) (storage.RedriveResult, error) {
	if len(p.IDs) > 0 {
		return s.applyDeadOnce(op, q, p.IDs, true, now, apply)
	}
	var res storage.RedriveResult
	prefix := dbkeys.DLQPrefix(q.name)
	seek := prefix
	for res.Moved < p.Limit {
		want := p.Limit - res.Moved
		var ids []storage.ItemID
		err := s.scanView(prefix, dbkeys.PrefixEnd(prefix), seek, func(k, _ []byte) (bool, error) {
			if bytes.Equal(k, seek) {
				return true, nil // the previous op's last
			}
			var id storage.ItemID
			copy(id[:], k[len(prefix):])
			ids = append(ids, id)
			return len(ids) < want, nil
		})
		if err != nil {
			return res, err
		}
		r, err := s.applyDeadOnce(op, q, ids, false, now, apply)
		res.Moved += r.Moved
		if err != nil || len(ids) < want || !s.live(q) {
			return res, err
		}
		seek = dbkeys.DLQKey(q.name, ids[len(ids)-1])
	}
	return res, nil
}

// applyDeadOnce runs apply on q's dead items ids in one op; with byID,
// the result has a code per id.
func (s *Store) applyDeadOnce(op string, q *queueState, ids []storage.ItemID, byID bool, now int64, apply func(o *opTx, q *queueState, id storage.ItemID, rec dbkeys.ItemRecord, now int64)) (storage.RedriveResult, error) {
	var res storage.RedriveResult
	if byID {
		res.Codes = make([]storage.Code, len(ids))
	}
	if len(ids) == 0 {
		return res, nil
	}
	next, err := s.submit(q.name, len(ids), func(o *opTx) error {
		res.Moved = 0
		if !s.live(q) {
			// Deleted since: ids of a queue made anew under the same name
			// are not q's.
			for i := range res.Codes {
				res.Codes[i] = storage.CodeNotFound
			}
			return nil
		}
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
		return res, err
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
	_, err := s.submit(queue, 1, func(o *opTx) error {
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

// Latest returns the latest instant the data showed, as of the last open,
// that the clock of the node writing it had reached, zero when none: the
// latest visible_at of the items ready or inflight then (not of delayed
// ones, whose visible_at is ahead of the clock), and the enqueue instant
// (which ids carry) of the delayed and inflight items and of the dedup key
// that expires last. A node whose clock reads earlier at start (a device
// booted without a battery-backed clock) would hide those items and keep
// those keys until its clock caught up: main.go raises its clock to this
// first (storage/steadyclock).
func (s *Store) Latest() time.Time {
	if n := s.latest.Load(); n > 0 {
		return instant(n)
	}
	return time.Time{}
}

// raiseLatest raises latest, which rebuild set from visible_at, to the
// enqueue instants Latest names. Found by review (session 74): data of
// only delayed items or dedup keys gave no instant, and a node restarted
// behind it hid the items and kept the keys (dropping enqueues as
// duplicates) while its clock lagged: for good, from 1970. REQUIRES: at
// open, after rebuild.
func (s *Store) raiseLatest() error {
	latest := s.latest.Load()
	defer func() { s.latest.Store(latest) }()
	for _, q := range s.mu.queues {
		for id := range q.delayed {
			latest = max(latest, dbkeys.IDEnqueuedAt(id))
		}
	}
	for id := range s.inflight {
		latest = max(latest, dbkeys.IDEnqueuedAt(id))
	}
	// The dedup_expiry index can be large: a binary search by seeks for
	// its last expiry, in key order (AppendInt64 flips the sign bit), at
	// or after its first entry (below which lie the sweep's tombstones).
	lower := dbkeys.NamespacePrefix(dbkeys.NsDedupExpiry)
	first := func(at uint64) (k []byte, err error) {
		seek := dbkeys.TimeBound(dbkeys.NsDedupExpiry, int64(at^1<<63))
		err = s.scan(lower, dbkeys.PrefixEnd(lower), seek, func(key, _ []byte) (bool, error) {
			k = key
			return false, nil
		})
		return k, err
	}
	k, err := first(0)
	if err != nil || k == nil {
		return err
	}
	exp, _, _, err := dbkeys.DecodeDedupExpiryKey(k)
	if err != nil {
		return corrupt("open", k, err)
	}
	lo, hi := uint64(exp)^1<<63, uint64(math.MaxUint64) // an entry is at lo or after, none after hi
	for lo < hi {
		mid := lo + (hi-lo)/2 + 1
		if k, err = first(mid); err != nil {
			return err
		} else if k != nil {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	if k, err = first(lo); err != nil || k == nil {
		return err
	}
	_, qn, key, err := dbkeys.DecodeDedupExpiryKey(k)
	if err != nil {
		return corrupt("open", k, err)
	}
	v, ok, err := s.getRaw(dbkeys.DedupKey(qn, key))
	if err != nil || !ok {
		return err
	}
	rec, err := dbkeys.DecodeDedup(v)
	if err != nil {
		return corrupt("open", dbkeys.DedupKey(qn, key), err)
	}
	latest = max(latest, dbkeys.IDEnqueuedAt(rec.ID))
	return nil
}
