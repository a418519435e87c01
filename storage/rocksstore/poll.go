package rocksstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// pollReq is one Poll waiting in its queue's combiner.
type pollReq struct {
	p     storage.PollParams
	now   int64
	lease int64 // lease duration in nanoseconds, resolved
	res   storage.PollResult
	err   error
	// wake receives true when the request was served by another poller,
	// false when this poller must lead the next claim pass.
	wake chan bool
}

// Poll implements storage.Store. Concurrent polls on one queue coalesce:
// the first poller runs a claim pass for every request waiting when it
// starts (one transaction, one commit); the others wait for their share,
// each with its own lease. When the pass ends, the next waiter leads.
func (s *Store) Poll(ctx context.Context, p storage.PollParams) (storage.PollResult, error) {
	if err := s.enter("poll"); err != nil {
		return storage.PollResult{}, err
	}
	defer s.exit()
	res, err := s.poll(ctx, p)
	if err != nil {
		return storage.PollResult{}, fmt.Errorf("rocksstore: poll %q: %w", p.Queue, err)
	}
	if !res.Lease.IsZero() && s.onDeadline != nil {
		s.onDeadline(res.ExpiresAt)
	}
	return res, nil
}

func (s *Store) poll(ctx context.Context, p storage.PollParams) (storage.PollResult, error) {
	if err := s.limits.ValidateQueueName(p.Queue); err != nil {
		return storage.PollResult{}, err
	}
	if p.Max < 1 || p.Max > s.limits.MaxBatch {
		return storage.PollResult{}, fmt.Errorf("%w: max %d outside [1, %d]", storage.ErrInvalidArgument, p.Max, s.limits.MaxBatch)
	}
	if err := s.limits.ValidateLease(p.Lease); err != nil {
		return storage.PollResult{}, err
	}
	if err := ctx.Err(); err != nil {
		return storage.PollResult{}, err
	}
	q := s.queue(p.Queue)
	if q == nil {
		return storage.PollResult{}, nil
	}
	lease := p.Lease
	if lease == 0 {
		lease = q.config().LeaseDuration
	}
	r := &pollReq{p: p, now: nanos(p.Now), lease: int64(lease), wake: make(chan bool, 1)}
	s.m.polls.Add(1)

	q.claim.Lock()
	q.claim.pending = append(q.claim.pending, r)
	if q.claim.running {
		q.claim.Unlock()
		// Not cancellable: once queued, the leader may already be
		// claiming for this request, and its items must not be lost.
		if served := <-r.wake; served {
			return r.res, r.err
		}
	} else {
		q.claim.running = true
		q.claim.Unlock()
	}

	// This poller leads one pass over the pending requests, in arrival
	// order, up to maxPassItems items. A leader is always the first
	// pending request (the first poller on an idle queue, or the head of
	// the queue a finished leader hands over to), so its own request is
	// always in its pass.
	q.claim.Lock()
	n, items := 0, 0
	for n < len(q.claim.pending) && (n == 0 || items+q.claim.pending[n].p.Max <= maxPassItems) {
		items += q.claim.pending[n].p.Max
		n++
	}
	batch := q.claim.pending[:n:n]
	q.claim.pending = append([]*pollReq(nil), q.claim.pending[n:]...)
	q.claim.Unlock()

	s.claimPass(q, batch)

	q.claim.Lock()
	if len(q.claim.pending) > 0 {
		q.claim.pending[0].wake <- false
	} else {
		q.claim.running = false
	}
	q.claim.Unlock()
	for _, o := range batch {
		if o != r {
			o.wake <- true
		}
	}
	return r.res, r.err
}

// maxPassItems caps the items one claim pass may hand out, so a crowd of
// pollers does not build one huge transaction; the rest wait for the next
// pass, which starts as soon as this one commits.
const maxPassItems = 4 * 1000

// claimed is one item taken by a claim pass.
type claimed struct {
	id  storage.ItemID
	rec dbkeys.ItemRecord
	vk  []byte
}

// claimPass claims items for every request in batch in one transaction and
// fills in each request's result.
func (s *Store) claimPass(q *queueState, batch []*pollReq) {
	s.m.claimPasses.Add(1)
	var maxNow int64
	for i, r := range batch {
		if i == 0 || r.now > maxNow {
			maxNow = r.now
		}
	}

	var (
		got     [][]claimed
		stop    [256][]byte // first unclaimed entry seen, per priority
		last    [256][]byte // last claimed entry, per priority
		touched [256]bool
	)
	heads := q.beginScan()
	if s.opts.noHeads {
		heads = [256][]byte{}
	}
	err := s.runTxn("poll", func(tx *txn) error {
		got = make([][]claimed, len(batch))
		stop, last, touched = [256][]byte{}, [256][]byte{}, [256]bool{}
		need := 0
		for _, r := range batch {
			need += r.p.Max
		}
		prefix := dbkeys.VisibilityPrefix(q.name)
		it, ro := s.newIter(nil, prefix, dbkeys.PrefixEnd(prefix))
		defer func() {
			it.Close()
			ro.Destroy()
		}()
		p := 0
		it.Seek(seekHead(q.name, 0, heads[0]))
		for need > 0 && it.Valid() {
			k := copySlice(it.Key())
			_, prio, vis, id, err := dbkeys.DecodeVisibilityKey(k)
			if err != nil {
				return corrupt("poll", k, err)
			}
			if int(prio) != p {
				p = int(prio)
				if h := heads[p]; h != nil && bytes.Compare(h, k) > 0 {
					it.Seek(h)
					continue
				}
			}
			touched[p] = true
			// The first request (in arrival order) that still needs items
			// and for which this entry is ready takes it.
			taker := -1
			if vis <= maxNow {
				for i, r := range batch {
					if len(got[i]) < r.p.Max && vis <= r.now {
						taker = i
						break
					}
				}
			}
			if taker < 0 {
				// Later entries of this priority are no more ready:
				// move on to the next priority.
				stop[p] = k
				if p == 255 {
					break
				}
				p++
				it.Seek(seekHead(q.name, uint8(p), heads[p]))
				continue
			}
			ak := dbkeys.AvailableKey(q.name, id)
			v, ok, err := tx.getForUpdate(ak)
			if err != nil {
				return err
			}
			if ok {
				rec, err := dbkeys.DecodeItem(v)
				if err != nil {
					return corrupt("poll", ak, err)
				}
				if rec.Priority == prio && rec.VisibleAt == vis {
					got[taker] = append(got[taker], claimed{id: id, rec: rec, vk: k})
					need--
				}
			}
			// A missing or mismatched item was removed or moved by a
			// concurrent purge; its entry is gone or about to be.
			last[p] = k
			it.Next()
		}
		if err := it.Err(); err != nil {
			return translate("poll: iterate", err)
		}
		for i, r := range batch {
			if err := s.grant(tx, q, r, got[i]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		q.endScan(nil, false)
		for _, r := range batch {
			r.err = err
		}
		return
	}
	var newHeads [256][]byte
	for p := range touched {
		switch {
		case stop[p] != nil:
			newHeads[p] = stop[p]
		case last[p] != nil:
			newHeads[p] = successor(last[p])
		}
	}
	q.endScan(&newHeads, true)
	for i := range batch {
		s.m.claimed.Add(uint64(len(got[i])))
	}
}

// seekHead is where a claim scan of priority p starts: the priority's head
// if known, else its first possible key.
func seekHead(queue string, p uint8, head []byte) []byte {
	start := dbkeys.VisibilityPrioPrefix(queue, p)
	if head != nil && bytes.Compare(head, start) > 0 {
		return head
	}
	return start
}

// grant moves a request's claimed items to in_progress under a new lease
// and fills in its result.
func (s *Store) grant(tx *txn, q *queueState, r *pollReq, items []claimed) error {
	r.res = storage.PollResult{}
	if len(items) == 0 {
		return nil
	}
	var token storage.LeaseID
	for token.IsZero() {
		// crypto/rand.Read never returns an error (Go 1.24+).
		_, _ = rand.Read(token[:])
	}
	exp := r.now + r.lease
	lr := dbkeys.LeaseRecord{Queue: q.name, ExpiresAt: exp, IDs: make([][16]byte, len(items))}
	out := make([]storage.Item, len(items))
	d := tx.delta(q)
	for i, c := range items {
		if err := s.takeAvailable(tx, q, c.id, c.rec); err != nil {
			return err
		}
		rec := c.rec
		rec.Attempts++
		rec.Delayed = false
		rec.HasLease, rec.Lease = true, token
		if err := tx.put(dbkeys.InProgressKey(q.name, c.id), dbkeys.EncodeItem(rec)); err != nil {
			return err
		}
		payload, err := s.payloadOf(tx.get, q.name, c.id, &rec)
		if err != nil {
			return err
		}
		lr.IDs[i] = c.id
		out[i] = itemOut(q.name, c.id, &rec, payload, storage.StateInflight)
	}
	if err := tx.put(dbkeys.LeaseKey(token), dbkeys.EncodeLease(lr)); err != nil {
		return err
	}
	ek := dbkeys.LeaseExpiryKey(exp, token)
	tx.note(&s.expiryCur, ek)
	if err := tx.put(ek, dbkeys.Marker()); err != nil {
		return err
	}
	d.Inflight += int64(len(items))
	d.Delivered += int64(len(items))
	d.Leases++
	r.res = storage.PollResult{Lease: token, ExpiresAt: instant(exp), Items: out}
	return nil
}

// beginScan starts a claim pass: it snapshots the heads and starts
// recording visibility entries inserted while the pass runs.
func (q *queueState) beginScan() [256][]byte {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.scanning = true
	q.low = [256][]byte{}
	plen := len(dbkeys.VisibilityPrefix(q.name))
	for k := range q.pending {
		p := k[plen]
		if q.low[p] == nil || k < string(q.low[p]) {
			q.low[p] = []byte(k)
		}
	}
	return q.heads
}

// endScan finishes a claim pass. With advance, newHeads (nil entries:
// unchanged) become the heads, except where an entry below them was
// inserted during the pass.
func (q *queueState) endScan(newHeads *[256][]byte, advance bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if advance {
		for p, h := range newHeads {
			if h == nil {
				continue
			}
			if l := q.low[p]; l != nil && bytes.Compare(l, h) < 0 {
				h = l
			}
			q.heads[p] = h
		}
	}
	q.scanning = false
	q.low = [256][]byte{}
}
