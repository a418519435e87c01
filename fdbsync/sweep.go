package fdbsync

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

// Sweep implements storage.Store. Every node may run it at the same time:
// each step snapshot-reads a due index (lease expiry, global delayed index,
// dedup expiry) and then reads without snapshot the record it will change,
// writing only if that record still says the work is due. Two sweepers on
// one lease therefore conflict on that record; the loser's retry re-reads
// it, finds the work done and writes nothing. The same conditional writes
// make a sweep transaction safe to apply twice after commit_unknown_result
// without a marker. Each step is one transaction bounded by Limit and the
// size budget.
func (s *Store) Sweep(ctx context.Context, p storage.SweepParams) (storage.SweepResult, error) {
	if err := s.checkOpen(); err != nil {
		return storage.SweepResult{}, err
	}
	limit := p.Limit
	if limit <= 0 {
		limit = defaultSweepLimit
	}
	var res storage.SweepResult
	readyQ := map[string]bool{}
	readyQueues := func() {
		for q := range readyQ {
			res.ReadyQueues = append(res.ReadyQueues, q)
		}
		sort.Strings(res.ReadyQueues)
	}
	// A step that fails leaves the steps before it applied: the result
	// says what they did, their ready queues included (storage.Store).
	if err := s.expireLeases(ctx, p.Now, limit, &res, readyQ); err != nil {
		readyQueues()
		return res, fmt.Errorf("fdbsync: sweep leases: %w", err)
	}
	if err := s.promote(ctx, p.Now, limit, &res, readyQ); err != nil {
		readyQueues()
		return res, fmt.Errorf("fdbsync: sweep delayed: %w", err)
	}
	readyQueues()
	if err := s.dropDedup(ctx, p.Now, limit, &res); err != nil {
		return res, fmt.Errorf("fdbsync: sweep dedup: %w", err)
	}
	if err := s.maybeCollectGarbage(ctx, p.Now, limit); err != nil {
		return res, fmt.Errorf("fdbsync: sweep garbage: %w", err)
	}
	next, err := s.nextDeadline(ctx)
	if err != nil {
		return res, fmt.Errorf("fdbsync: sweep next: %w", err)
	}
	res.Next = next
	return res, nil
}

// stepOut is what one sweep transaction did; it is also the marker value,
// so a step retried after commit_unknown_result reports what it did.
type stepOut struct {
	a, b, c int // expire: leases, requeued, dead; promote, dedup: count
	queues  []string
	more    bool
	wrote   bool // the step wrote something, even if it counts nothing
}

func (o stepOut) encode() []byte {
	e := enc{}
	e.u32(uint32(o.a))
	e.u32(uint32(o.b))
	e.u32(uint32(o.c))
	if o.more {
		e.u8(1)
	} else {
		e.u8(0)
	}
	e.u32(uint32(len(o.queues)))
	for _, q := range o.queues {
		e.str(q)
	}
	return e.b
}

func decodeStepOut(c *call) (any, error) {
	b, err := c.result()
	if err != nil {
		return nil, err
	}
	d := dec{b: b}
	o := stepOut{a: int(d.u32()), b: int(d.u32()), c: int(d.u32()), more: d.u8() == 1}
	n := int(d.u32())
	if d.err == nil && n > len(d.b) {
		return nil, errBadValue
	}
	for i := 0; i < n; i++ {
		o.queues = append(o.queues, d.str())
	}
	return o, d.err
}

// sweepStep runs one sweep transaction idempotently (see mutate).
func (s *Store) sweepStep(ctx context.Context, now time.Time, fn func(tx kv.Tx) (stepOut, error)) (stepOut, error) {
	v, _, _, err := s.mutate(ctx, func(tx kv.Tx, c *call) (any, error) {
		if c.prior != nil {
			return decodeStepOut(c)
		}
		out, err := fn(tx)
		if err != nil {
			return nil, err
		}
		if out.wrote || out.a > 0 || out.b > 0 || out.c > 0 {
			c.set(tx, out.encode())
		}
		return out, nil
	})
	if err != nil {
		return stepOut{}, err
	}
	return as[stepOut](v)
}

func (s *Store) expireLeases(ctx context.Context, now time.Time, limit int, res *storage.SweepResult, readyQ map[string]bool) error {
	out, err := s.sweepStep(ctx, now, func(tx kv.Tx) (stepOut, error) {
		var out stepOut
		begin := s.k.ns(nsExpiry)
		due, err := tx.GetRange(begin, s.k.timeBound(nsExpiry, now.Add(1)), kv.RangeOptions{Snapshot: true, Limit: limit + 1})
		if err != nil {
			return stepOut{}, err
		}
		if len(due) > limit {
			out.more = true
			due = due[:limit]
		}
		cfgs := map[string]storage.QueueConfig{}
		size := 0
		for i, row := range due {
			if size > txnBudget {
				out.more = out.more || i < len(due)
				break
			}
			var lease storage.LeaseID
			copy(lease[:], row.Key[len(row.Key)-16:])
			lb, err := tx.Get(s.k.lease(lease), false)
			if err != nil {
				return stepOut{}, err
			}
			if lb == nil {
				continue // another sweeper, an ack or a purge got there first
			}
			lr, err := decodeLease(lb)
			if err != nil {
				return stepOut{}, err
			}
			if lr.expiry.After(now) {
				continue // extended since our snapshot
			}
			q := lr.queue
			cfg, ok := cfgs[q]
			if !ok {
				c, _, err := s.config(tx, q)
				if err != nil {
					return stepOut{}, err
				}
				cfgs[q], cfg = c, c
			}
			keys := make([][]byte, len(lr.ids))
			for j, id := range lr.ids {
				keys[j] = s.k.inflight(q, id)
			}
			vals, err := tx.GetMany(keys, false)
			if err != nil {
				return stepOut{}, err
			}
			n, requeued := 0, false
			for j, val := range vals {
				if val == nil {
					continue
				}
				r, err := decodeRecord(val)
				if err != nil {
					return stepOut{}, err
				}
				if r.lease != lease {
					continue
				}
				n++
				size += recordSize(&r, len(keys[j]))
				tx.Clear(keys[j])
				if r.attempts >= maxAttempts(&r, cfg) {
					s.bury(tx, q, lr.ids[j], &r, "lease expired", now)
					out.c++
					continue
				}
				r.visibleAt = lr.expiry
				s.putAvailable(tx, q, lr.ids[j], &r, now)
				out.b++
				requeued = true
			}
			size += 512 // counters, lease and expiry entry
			s.add(tx, q, ctrInflight, -int64(n))
			s.add(tx, q, ctrExpired, int64(n))
			s.add(tx, q, ctrLeases, -1)
			tx.Clear(s.k.lease(lease))
			tx.Clear(row.Key)
			out.a++
			if requeued {
				s.wakeQueue(tx, q)
				out.queues = append(out.queues, q)
			}
		}
		return out, nil
	})
	if err != nil {
		return err
	}
	res.LeasesExpired += out.a
	res.Requeued += out.b
	res.DeadLettered += out.c
	res.More = res.More || out.more
	for _, q := range out.queues {
		readyQ[q] = true
	}
	return nil
}

func (s *Store) promote(ctx context.Context, now time.Time, limit int, res *storage.SweepResult, readyQ map[string]bool) error {
	out, err := s.sweepStep(ctx, now, func(tx kv.Tx) (stepOut, error) {
		var out stepOut
		due, err := tx.GetRange(s.k.ns(nsDelayAll), s.k.timeBound(nsDelayAll, now.Add(1)), kv.RangeOptions{Snapshot: true, Limit: limit + 1})
		if err != nil {
			return stepOut{}, err
		}
		if len(due) > limit {
			out.more = true
			due = due[:limit]
		}
		type ref struct {
			q  string
			id storage.ItemID
		}
		refs := make([]ref, 0, len(due))
		keys := make([][]byte, 0, len(due))
		pre := len(s.k.ns(nsDelayAll))
		for _, row := range due {
			rest := row.Key[pre:]
			if len(rest) < 8 {
				return stepOut{}, errBadKey
			}
			q, tail, err := readStr(rest[8:])
			if err != nil || len(tail) != 16 {
				return stepOut{}, errBadKey
			}
			var id storage.ItemID
			copy(id[:], tail)
			refs = append(refs, ref{q, id})
			keys = append(keys, s.k.available(q, id))
		}
		vals, err := tx.GetMany(keys, false)
		if err != nil {
			return stepOut{}, err
		}
		woke := map[string]bool{}
		size := 0
		for i, val := range vals {
			if val == nil {
				continue
			}
			r, err := decodeRecord(val)
			if err != nil {
				return stepOut{}, err
			}
			if !r.delayed || r.visibleAt.After(now) {
				continue
			}
			if size > txnBudget {
				out.more = true
				break
			}
			size += recordSize(&r, len(keys[i]))
			q, id := refs[i].q, refs[i].id
			s.clearAvailable(tx, q, id, &r)
			s.putAvailable(tx, q, id, &r, now)
			out.a++
			if !woke[q] {
				woke[q] = true
				s.wakeQueue(tx, q)
				out.queues = append(out.queues, q)
			}
		}
		return out, nil
	})
	if err != nil {
		return err
	}
	res.Promoted += out.a
	res.More = res.More || out.more
	for _, q := range out.queues {
		readyQ[q] = true
	}
	return nil
}

func (s *Store) dropDedup(ctx context.Context, now time.Time, limit int, res *storage.SweepResult) error {
	out, err := s.sweepStep(ctx, now, func(tx kv.Tx) (stepOut, error) {
		due, err := tx.GetRange(s.k.ns(nsDedupExp), s.k.timeBound(nsDedupExp, now.Add(1)), kv.RangeOptions{Snapshot: true, Limit: limit + 1})
		if err != nil {
			return stepOut{}, err
		}
		more := len(due) > limit
		if more {
			due = due[:limit]
		}
		pre := len(s.k.ns(nsDedupExp))
		keys := make([][]byte, 0, len(due))
		for _, row := range due {
			rest := row.Key[pre:]
			if len(rest) < 8 {
				return stepOut{}, errBadKey
			}
			q, tail, err := readStr(rest[8:])
			if err != nil {
				return stepOut{}, errBadKey
			}
			key, _, err := readStr(tail)
			if err != nil {
				return stepOut{}, errBadKey
			}
			keys = append(keys, s.k.dedup(q, key))
		}
		vals, err := tx.GetMany(keys, false)
		if err != nil {
			return stepOut{}, err
		}
		n := 0
		for i, val := range vals {
			tx.Clear(due[i].Key)
			if val == nil {
				continue
			}
			d, err := decodeDedup(val)
			if err != nil {
				return stepOut{}, err
			}
			// Only the index entry that matches the key's current expiry
			// drops it: older entries are left over from a key re-set
			// after it expired.
			at, _, _ := readTime(due[i].Key[pre:])
			if at.Equal(d.expires) && !d.expires.After(now) {
				tx.Clear(keys[i])
				n++
			}
		}
		return stepOut{a: n, more: more, wrote: len(due) > 0}, nil
	})
	if err != nil {
		return err
	}
	res.DedupDropped += out.a
	res.More = res.More || out.more
	return nil
}

// maybeCollectGarbage runs collectGarbage at most once per gcEvery of
// caller time on this node, so an idle sweeper does not write.
func (s *Store) maybeCollectGarbage(ctx context.Context, now time.Time, limit int) error {
	s.mu.Lock()
	due := s.mu.lastGC.IsZero() || now.Sub(s.mu.lastGC) >= gcEvery || now.Before(s.mu.lastGC)
	s.mu.Unlock()
	if !due {
		return nil
	}
	if err := s.collectGarbage(ctx, now, limit); err != nil {
		return err
	}
	s.mu.Lock()
	s.mu.lastGC = now
	s.mu.Unlock()
	return nil
}

// collectGarbage drops idempotency markers older than markerTTL and chunk
// uploads whose enqueue never committed. Range clears of keys nobody reads
// any more: safe to apply twice and on every node (its own marker only
// ends the retry loop after commit_unknown_result).
func (s *Store) collectGarbage(ctx context.Context, now time.Time, limit int) error {
	s.mu.Lock()
	from := s.mu.hbCursor
	s.mu.Unlock()
	var next []byte // the cursor after this pass
	_, _, _, err := s.mutate(ctx, func(tx kv.Tx, c *call) (any, error) {
		if c.prior != nil {
			return nil, nil
		}
		c.set(tx, nil)
		rv, err := tx.ReadVersion()
		if err != nil {
			return nil, err
		}
		tx.ClearRange(s.k.ns(nsMarker), s.k.markerBound(rv-int64(markerTTL/time.Second)*versionsPerSecond))
		tx.ClearRange(s.k.timeBound(nsMarker, time.Unix(0, 0)), s.k.timeBound(nsMarker, now.Add(-legacyMarkerTTL)))
		old, err := tx.GetRange(s.k.ns(nsUpload), s.k.timeBound(nsUpload, now.Add(-uploadTTL)), kv.RangeOptions{Snapshot: true, Limit: limit})
		if err != nil {
			return nil, err
		}
		for _, row := range old {
			var pid [16]byte
			copy(pid[:], row.Key[len(row.Key)-16:])
			p := s.k.chunkPrefix(pid)
			tx.ClearRange(p, kv.PrefixEnd(p))
			tx.Clear(row.Key)
		}
		// Heartbeats of nodes that crashed, or of polls on queue names that
		// never existed: a page of them per pass, from where the last pass
		// stopped (with many nodes and queues the live ones alone fill a
		// page, and stale ones behind them must come up too). Read by
		// snapshot, so that the fresh heartbeats other nodes write all the
		// time do not abort the pass; each entry cleared gets a read
		// conflict of its own, so a node that refreshes it meanwhile aborts
		// this clear instead of losing the entry.
		hb := s.k.ns(nsPoller)
		begin := hb
		if from != nil {
			begin = from
		}
		page := 10 * limit
		rows, err := tx.GetRange(begin, kv.PrefixEnd(hb), kv.RangeOptions{Snapshot: true, Limit: page})
		if err != nil {
			return nil, err
		}
		for _, row := range rows {
			if t, _, err := readTime(row.Value); err != nil || now.Sub(t) > heartbeatTTL {
				if err := tx.AddReadConflictRange(row.Key, kv.KeyAfter(row.Key)); err != nil {
					return nil, err
				}
				tx.Clear(row.Key)
			}
		}
		next = nil
		if len(rows) == page {
			next = kv.KeyAfter(rows[len(rows)-1].Key)
		}
		return nil, nil
	})
	if err == nil {
		s.mu.Lock()
		s.mu.hbCursor = next
		s.mu.Unlock()
	}
	return err
}

// nextDeadline is the earliest pending lease expiry, delayed item or dedup
// expiry.
func (s *Store) nextDeadline(ctx context.Context) (time.Time, error) {
	v, err := s.view(ctx, func(tx kv.Tx) (any, error) {
		var next time.Time
		for _, tag := range []byte{nsExpiry, nsDelayAll, nsDedupExp} {
			b := s.k.ns(tag)
			rows, err := tx.GetRange(b, kv.PrefixEnd(b), kv.RangeOptions{Snapshot: true, Limit: 1})
			if err != nil {
				return nil, err
			}
			if len(rows) == 0 {
				continue
			}
			t, _, err := readTime(rows[0].Key[len(b):])
			if err != nil {
				return nil, err
			}
			if next.IsZero() || t.Before(next) {
				next = t
			}
		}
		return next, nil
	})
	if err != nil {
		return time.Time{}, err
	}
	return as[time.Time](v)
}
