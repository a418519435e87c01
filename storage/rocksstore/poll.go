package rocksstore

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// Poll implements storage.Store. The claim runs on the committer: it pops
// ids from the queue's in-memory serve order, reads their records with
// GetForUpdate, and moves them to in_progress under a new lease, in the
// same batch (and fsync) as every other call pending at that moment, so
// concurrent polls never fight over the head and cost one commit together.
func (s *Store) Poll(ctx context.Context, p storage.PollParams) (storage.PollResult, error) {
	if err := s.enter("poll"); err != nil {
		return storage.PollResult{}, err
	}
	defer s.exit()
	res, fn, err := s.pollOp(ctx, p)
	if err == nil && fn != nil {
		_, err = s.submit(p.Queue, p.Max, fn)
	}
	if err != nil {
		return storage.PollResult{}, fmt.Errorf("rocksstore: poll %q: %w", p.Queue, err)
	}
	if fn == nil {
		if res != nil { // answered with a batch claimed ahead (prefetch.go)
			s.polled(*res)
			return *res, nil
		}
		return storage.PollResult{}, nil
	}
	s.polled(*res)
	return *res, nil
}

// polled counts what a poll's claim took and announces its lease's expiry.
func (s *Store) polled(res storage.PollResult) {
	s.m.claimed.Add(uint64(len(res.Items)))
	if !res.Lease.IsZero() && s.onDeadline != nil {
		s.onDeadline(res.ExpiresAt)
	}
}

// pollOp checks a poll and returns the op that claims for it, which fills
// in *res; fn is nil when there is nothing to claim (an empty answer, res
// nil) or when a batch claimed ahead answers the poll (res set).
func (s *Store) pollOp(ctx context.Context, p storage.PollParams) (res *storage.PollResult, fn func(o *opTx) error, err error) {
	if err := p.Validate(s.limits); err != nil {
		return nil, nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	q := s.queue(p.Queue)
	if q == nil {
		return nil, nil, nil
	}
	now := nanos(p.Now)
	q.mu.Lock()
	_, ready := q.ready.oldest(now)
	lease := p.Lease
	if lease == 0 {
		lease = q.cfg.LeaseDuration
	}
	// Held too: a batch an op is claiming ahead or giving back, whose
	// items are in neither the ready index nor the list for a moment.
	held := len(q.prefetch) > 0 || len(q.returning) > 0 || q.claimingAhead > 0
	q.mu.Unlock()
	s.m.polls.Add(1)
	if held {
		if r, e := s.takePrefetched(q, p.Max, int64(lease), now, false); e != nil {
			return &r, nil, nil
		}
		ready = true // the op takes a batch claimed meanwhile, or gives them back
	}
	if !ready {
		// Nothing is ready now: an empty answer needs no batch (and,
		// with SyncAlways, no wait for an fsync). Long polls come here
		// on every wake-up.
		return nil, nil, nil
	}
	// The op captures r and limit, not the named result res or p: either
	// would move to the heap (an allocation per call).
	r, limit := new(storage.PollResult), p.Max
	return r, func(o *opTx) error {
		var err error
		*r, err = s.claimHead(o, q, now, limit, int64(lease))
		return err
	}, nil
}

// claimHead answers a poll of max items leased for lease ns at now, in
// op o: with a batch claimed ahead that matches it (takePrefetched; any,
// durable or not, since the op's own fsync covers the claim), or else
// with a claim after every batch the queue holds claimed ahead is given
// back, so that the claim takes the queue's head, as if nothing had been
// claimed ahead. The queue's list is read here, in the op: a batch may
// have been claimed ahead since the poll's call began (by an ack in an
// earlier op). REQUIRES: on the committer.
func (s *Store) claimHead(o *opTx, q *queueState, now int64, max int, lease int64) (storage.PollResult, error) {
	if s.prefetchHold() > 0 {
		got, e := s.takePrefetched(q, max, lease, now, true)
		if e != nil {
			o.onUndo(func() {
				q.holdAhead(e)
				e.l.promised.Store(0)
			})
			o.op.items = len(got.Items)
			return got, nil
		}
		s.releaseAhead(o, q, func(*prefetched) bool { return true })
	}
	o.b.polls++
	r, err := s.claim(o, q, now, max, lease)
	o.op.items = len(r.Items) // what it touched, no longer what it may
	return r, err
}

// EnqueueClaim implements storage.EnqueueClaimer: the enqueue's op and
// one claim op per poll go into the pipeline together, so the claims run
// in the enqueue's batch (after it, seeing its items) and share its fsync.
func (s *Store) EnqueueClaim(ctx context.Context, p storage.EnqueueParams, polls []storage.PollParams) ([]storage.EnqueueResult, []storage.PollResult, error) {
	if err := s.enter("enqueue"); err != nil {
		return nil, nil, err
	}
	defer s.exit()
	c, err := s.enqueueClaimOps(ctx, p, polls)
	if err != nil || c.enq == nil {
		return c.res, c.prs, err
	}
	if err := s.submitGroup(p.Queue, c.ops); err != nil {
		return nil, nil, fmt.Errorf("rocksstore: enqueue %q: %w", p.Queue, err)
	}
	return s.enqueueClaimDone(p, polls, c)
}

// enqueueClaim is one EnqueueClaim call: its results, filled in when its
// ops run, and its ops, the enqueue's (enq) first, then one claim per
// poll (claims[i], nil for a poll of another queue or an invalid one).
type enqueueClaim struct {
	res    []storage.EnqueueResult
	prs    []storage.PollResult
	enq    *op
	ops    []*op
	claims []*op
}

// enqueueClaimOps returns EnqueueClaim's call. enq is nil when there is
// nothing to write, and so nothing to claim.
func (s *Store) enqueueClaimOps(ctx context.Context, p storage.EnqueueParams, polls []storage.PollParams) (c enqueueClaim, err error) {
	res, valid, fn, err := s.enqueueOp(ctx, p)
	if err != nil {
		return c, fmt.Errorf("rocksstore: enqueue %q: %w", p.Queue, err)
	}
	c.res = res
	c.prs = make([]storage.PollResult, len(polls))
	if fn == nil {
		return c, nil // nothing written, so nothing new to claim
	}
	enq := newOp(valid, fn)
	c.enq = enq
	c.ops = []*op{enq}
	c.claims = make([]*op, len(polls))
	prs := c.prs
	for i, pp := range polls {
		if pp.Queue != p.Queue || pp.Validate(s.limits) != nil {
			continue
		}
		now, max, lease := nanos(pp.Now), pp.Max, int64(pp.Lease)
		c.claims[i] = newOp(max, func(o *opTx) error {
			q := s.queue(p.Queue)
			o.op.items = 0 // what it touched, no longer what it may
			if enq.err != nil || q == nil {
				return nil // the enqueue failed: claim nothing
			}
			if lease == 0 {
				lease = int64(q.config().LeaseDuration)
			}
			r, err := s.claimHead(o, q, now, max, lease)
			if err != nil {
				return err // the claim is undone: prs[i] stays empty
			}
			prs[i] = r
			return nil
		})
		c.ops = append(c.ops, c.claims[i])
	}
	return c, nil
}

// enqueueClaimDone returns EnqueueClaim's answer once its ops completed.
// A claim whose batch failed to commit or to fsync (in a batch after the
// enqueue's, when the ops did not fit in one) answers its poll with
// nothing: its lease is not durable, and the failed store hands nothing
// out again until it is reopened.
func (s *Store) enqueueClaimDone(p storage.EnqueueParams, polls []storage.PollParams, c enqueueClaim) ([]storage.EnqueueResult, []storage.PollResult, error) {
	if c.enq.err != nil {
		return nil, nil, fmt.Errorf("rocksstore: enqueue %q: %w", p.Queue, c.enq.err)
	}
	prs := c.prs
	next := c.enq.next
	for i := range prs {
		if o := c.claims[i]; o != nil && o.err != nil {
			prs[i] = storage.PollResult{}
		}
		if prs[i].Lease.IsZero() {
			continue
		}
		s.m.claimed.Add(uint64(len(prs[i].Items)))
		if next.IsZero() || prs[i].ExpiresAt.Before(next) {
			next = prs[i].ExpiresAt
		}
	}
	s.m.polls.Add(uint64(len(polls)))
	if !next.IsZero() && s.onDeadline != nil {
		s.onDeadline(next)
	}
	return c.res, prs, nil
}

// claimedItem is one item taken by a claim.
type claimedItem struct {
	prio uint8
	e    readyEntry
	rec  dbkeys.ItemRecord
}

// claim takes up to max items ready at now from q and leases them for
// lease nanoseconds. REQUIRES: on the committer.
func (s *Store) claim(o *opTx, q *queueState, now int64, max int, lease int64) (storage.PollResult, error) {
	q.mu.Lock()
	took := o.claimBuf(min(max, q.ready.n))
	q.ready.prios(func(prio uint8) bool {
		for len(took) < max {
			e, ok := q.ready.popReady(prio, now)
			if !ok {
				break
			}
			took = append(took, claimedItem{prio: prio, e: e})
		}
		return len(took) < max
	})
	q.mu.Unlock()
	if len(took) == 0 {
		return storage.PollResult{}, nil
	}
	o.onUndo(func() {
		q.mu.Lock()
		for _, c := range took {
			q.ready.push(c.prio, c.e)
		}
		q.mu.Unlock()
	})
	keys := scratch(&o.b.slot.cs.keys, len(took))
	known := scratch(&o.b.slot.cs.known, len(took))
	for i, c := range took {
		keys[i] = o.availableKey(q.name, c.e.id)
		known[i] = q.cachedReady(c.e.id)
	}
	vals, reads, err := o.getManyForUpdate(keys, known, o.untouched())
	if err != nil {
		return storage.PollResult{}, err
	}
	s.m.claimReads.Add(uint64(reads))
	items := took[:0]
	for i, c := range took {
		ak, v := keys[i], vals[i]
		if v == nil {
			return storage.PollResult{}, fmt.Errorf("%w: indexed item %s is not available", storage.ErrCorrupt, storage.ItemID(c.e.id))
		}
		rec, err := dbkeys.DecodeItem(v)
		if err != nil {
			return storage.PollResult{}, corrupt("poll", ak, err)
		}
		if rec.Priority != c.prio || rec.VisibleAt != c.e.vis {
			return storage.PollResult{}, fmt.Errorf("%w: item %s: index says priority %d visible at %d, record %d at %d",
				storage.ErrCorrupt, storage.ItemID(c.e.id), c.prio, c.e.vis, rec.Priority, rec.VisibleAt)
		}
		c.rec = rec
		items = append(items, c)
	}
	if o.keepClaimed != nil {
		// Kept to be given back (prefetch.go): Delayed says whether the
		// item counted as delayed (not yet promoted), as takeAvailable
		// tells.
		for _, c := range items {
			_, c.rec.Delayed = q.delayed[storage.ItemID(c.e.id)]
			*o.keepClaimed = append(*o.keepClaimed, c)
		}
	}
	return s.grant(o, q, now, lease, max, items)
}

// newToken returns a token for a new lease, unlike every live one. A
// token is the key of its lease in leases and lease_expiry: its first 8
// bytes count up (leaseSeq, from a random start) and its last 8 are
// random, so a new lease's keys land at the end of their memtables,
// where RocksDB's skiplist finds an insert's place from the last one,
// and an ack deletes a key near that end. With tokens random in all 16
// bytes every lease write searched the skiplist from its top:
// BenchmarkSmallPolls with 4 consumers polling 1 item spent 13 % of its
// CPU recomputing skiplist splices, against 1 % with counted tokens
// (docs/BENCHMARKS.md, "Lease tokens that count up"). Tokens stay
// unguessable: 64 random bits. REQUIRES: on the committer.
func (s *Store) newToken() storage.LeaseID {
	var token storage.LeaseID
	for token.IsZero() || s.leases[token] != nil {
		// crypto/rand.Read never returns an error (Go 1.24+).
		_, _ = rand.Read(token[8:])
		if s.leaseSeq == 0 {
			_, _ = rand.Read(token[:8])
			s.leaseSeq = binary.BigEndian.Uint64(token[:8])
		}
		s.leaseSeq++
		binary.BigEndian.PutUint64(token[:8], s.leaseSeq)
	}
	return token
}

// grant moves claimed items to in_progress under a new lease, for a
// claim of up to max items. REQUIRES: on the committer.
func (s *Store) grant(o *opTx, q *queueState, now, lease int64, max int, items []claimedItem) (storage.PollResult, error) {
	token := s.newToken()
	exp := now + lease
	lr := dbkeys.LeaseRecord{Queue: q.name, ExpiresAt: exp, IDs: make([][16]byte, len(items)), Ahead: o.claimingAhead}
	l := &leaseState{token: token, q: q, exp: exp, ids: make([]storage.ItemID, len(items)), max: max, dur: lease, aheadMark: o.claimingAhead}
	out := make([]storage.Item, len(items))
	d := o.delta(q)
	// While the batch is untouched, a claimed item's in_progress key is
	// not in the overlay: only a claim writes it there, and the item is
	// available again only after a set (opTx.untouched). Nor are the new
	// lease's keys (a fresh token, newToken).
	notInBatch := o.untouched()
	for i, c := range items {
		id := storage.ItemID(c.e.id)
		s.takeAvailable(o, q, id, c.rec)
		rec := c.rec
		rec.Attempts++
		rec.Delayed = false
		rec.HasLease, rec.Lease = true, token
		o.putAs(notInBatch, o.inProgressKey(q.name, id), o.itemValue(rec))
		payload, err := s.payloadOf(o.get, q.name, id, &rec)
		if err != nil {
			return storage.PollResult{}, err
		}
		if rec.PayloadExternal {
			if l.ext == nil {
				l.ext = make(map[storage.ItemID]bool)
			}
			l.ext[id] = true
		}
		lr.IDs[i] = id
		l.ids[i] = id
		out[i] = itemOut(q.name, id, &rec, payload, storage.StateInflight)
	}
	o.putNew(dbkeys.LeaseKey(token), dbkeys.EncodeLease(lr))
	o.putNew(dbkeys.LeaseExpiryKey(exp, token), dbkeys.Marker())
	l.wrote = o.b.seq
	s.addLease(o, l)
	d.Inflight += int64(len(items))
	d.Delivered += int64(len(items))
	d.Leases++
	o.deadline(exp)
	return storage.PollResult{Lease: token, ExpiresAt: instant(exp), Items: out}, nil
}

// addLease registers a new lease in memory. REQUIRES: on the committer.
func (s *Store) addLease(o *opTx, l *leaseState) {
	s.leases[l.token] = l
	l.q.leases[l.token] = l
	for _, id := range l.ids {
		s.inflight[id] = l
	}
	s.expiry.push(timed{at: l.exp, token: l.token})
	o.onUndo(func() {
		delete(s.leases, l.token)
		delete(l.q.leases, l.token)
		for _, id := range l.ids {
			if s.inflight[id] == l {
				delete(s.inflight, id)
			}
		}
	})
}
