package fdbsync

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

// candidate is a ready item seen in a snapshot read of the queue head.
type candidate struct {
	prio uint8
	vis  time.Time
	id   storage.ItemID
}

func (a candidate) less(b candidate) bool {
	if a.prio != b.prio {
		return a.prio < b.prio
	}
	if !a.vis.Equal(b.vis) {
		return a.vis.Before(b.vis)
	}
	return bytes.Compare(a.id[:], b.id[:]) < 0
}

type pollOut struct {
	lease   storage.LeaseID
	expires time.Time
	items   []storage.Item
}

func (s *Store) pollLock(q string) *sync.Mutex {
	if m, ok := s.pollLocks.Load(q); ok {
		return m.(*sync.Mutex)
	}
	m, _ := s.pollLocks.LoadOrStore(q, &sync.Mutex{})
	return m.(*sync.Mutex)
}

// Poll implements storage.Store. One transaction claims the whole batch:
// it snapshot-reads the ready head (no read conflict on the range, so
// enqueues and other claims elsewhere in the queue never abort it), picks
// the items to claim, and reads exactly those records without snapshot, so
// it conflicts only with a transaction that touched one of them. With one
// active poller it takes the head in serve order; with n pollers it takes
// its batch at a random offset among the first Max*n*spread ready items,
// which keeps concurrent claims on different nodes disjoint almost always.
// Polls on one node and queue are serialized (coalesced), so they never
// conflict with each other.
func (s *Store) Poll(ctx context.Context, p storage.PollParams) (storage.PollResult, error) {
	if err := s.checkOpen(); err != nil {
		return storage.PollResult{}, err
	}
	if err := s.limits.ValidateQueueName(p.Queue); err != nil {
		return storage.PollResult{}, err
	}
	if p.Max < 1 || p.Max > s.limits.MaxBatch {
		return storage.PollResult{}, fmt.Errorf("%w: poll max %d outside [1, %d]", storage.ErrInvalidArgument, p.Max, s.limits.MaxBatch)
	}
	if err := s.limits.ValidateLease(p.Lease); err != nil {
		return storage.PollResult{}, err
	}
	tok, err := randomToken()
	if err != nil {
		return storage.PollResult{}, fmt.Errorf("fdbsync: lease token: %w", err)
	}
	lease := storage.LeaseID(tok)
	mu := s.pollLock(p.Queue)
	mu.Lock()
	defer mu.Unlock()

	s.polls.Add(1)
	heartbeat := s.heartbeatDue(p.Queue, p.Now)
	v, _, rep, err := s.mutate(ctx, p.Now, func(tx kv.Tx, c *call) (any, error) {
		if c.prior != nil {
			return s.replayPoll(tx, p.Queue, lease, c)
		}
		return s.claim(tx, c, p, lease, heartbeat)
	})
	s.pollAttempts.Add(int64(rep.Attempts))
	s.pollRetries.Add(int64(rep.Retries))
	if err != nil {
		return storage.PollResult{}, fmt.Errorf("fdbsync: poll %q: %w", p.Queue, err)
	}
	out := v.(pollOut)
	if len(out.items) == 0 {
		return storage.PollResult{}, nil
	}
	if heartbeat {
		s.mu.Lock()
		s.mu.heartbeat[p.Queue] = p.Now
		s.mu.Unlock()
	}
	s.claimed.Add(int64(len(out.items)))
	s.nonEmpty.Add(1)
	s.deadline(out.expires)
	return storage.PollResult{Lease: out.lease, ExpiresAt: out.expires, Items: out.items}, nil
}

// heartbeatDue reports whether this node should (re)write its poller entry
// for q with the next claim.
func (s *Store) heartbeatDue(q string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	last, ok := s.mu.heartbeat[q]
	return !ok || now.Sub(last) >= heartbeatEvery || now.Before(last)
}

// activePollers counts nodes that claimed from q within pollerTTL of now
// (snapshot read: heartbeats never cause conflicts). This node counts
// itself.
func (s *Store) activePollers(tx kv.Tx, q string, now time.Time) (int, error) {
	pre := s.k.pollersPrefix(q)
	rows, err := tx.GetRange(pre, kv.PrefixEnd(pre), kv.RangeOptions{Snapshot: true, Limit: 1000})
	if err != nil {
		return 0, err
	}
	n, self := 0, false
	for _, r := range rows {
		t, _, err := readTime(r.Value)
		if err != nil || now.Sub(t) > pollerTTL {
			continue
		}
		n++
		if bytes.Equal(r.Key[len(pre):], s.node[:]) {
			self = true
		}
	}
	if !self {
		n++
	}
	return n, nil
}

// readyHead returns up to window ready candidates of q at now in serve
// order, from the ready index and from delayed items whose time has come
// but which the sweeper has not promoted yet. Snapshot reads only.
func (s *Store) readyHead(tx kv.Tx, q string, now time.Time, window int) ([]candidate, error) {
	rp := s.k.readyPrefix(q)
	rows, err := tx.GetRange(rp, kv.PrefixEnd(rp), kv.RangeOptions{Snapshot: true, Limit: window})
	if err != nil {
		return nil, err
	}
	var out []candidate
	for _, r := range rows {
		rest := r.Key[len(rp):]
		if len(rest) != 1+8+16 {
			return nil, errBadKey
		}
		vis, _, err := readTime(rest[1:])
		if err != nil {
			return nil, err
		}
		if vis.After(now) {
			continue // written by a node whose clock is ahead of ours
		}
		c := candidate{prio: rest[0], vis: vis}
		copy(c.id[:], rest[9:])
		out = append(out, c)
	}
	// Due delayed items are in visibility order, not serve order, so read
	// all of them (up to headCap): normally few, since the sweeper
	// promotes them within milliseconds.
	dp := s.k.delayedPrefix(q)
	due, err := tx.GetRange(dp, appendTime(append([]byte{}, dp...), now.Add(1)), kv.RangeOptions{Snapshot: true, Limit: headCap})
	if err != nil {
		return nil, err
	}
	if len(due) == 0 {
		return out, nil
	}
	for _, r := range due {
		rest := r.Key[len(dp):]
		if len(rest) != 8+16 || len(r.Value) != 1 {
			return nil, errBadKey
		}
		vis, _, err := readTime(rest)
		if err != nil {
			return nil, err
		}
		c := candidate{prio: r.Value[0], vis: vis}
		copy(c.id[:], rest[8:])
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].less(out[j]) })
	if len(out) > window {
		out = out[:window]
	}
	return out, nil
}

// claim is the body of a poll transaction.
func (s *Store) claim(tx kv.Tx, c *call, p storage.PollParams, lease storage.LeaseID, heartbeat bool) (any, error) {
	q := p.Queue
	cfg, ok, err := s.config(tx, q)
	if err != nil || !ok {
		return pollOut{}, err
	}
	dur := p.Lease
	if dur == 0 {
		dur = cfg.LeaseDuration
	}
	exp := p.Now.Add(dur)
	n, err := s.activePollers(tx, q, p.Now)
	if err != nil {
		return nil, err
	}
	window := p.Max
	if n > 1 {
		window = min(p.Max*n*spread, headCap)
	}
	cands, err := s.readyHead(tx, q, p.Now, window)
	if err != nil {
		return nil, err
	}
	if len(cands) == 0 {
		return pollOut{}, nil
	}
	start := 0
	if n > 1 && len(cands) > p.Max {
		start = s.intN(len(cands) - p.Max + 1)
	}
	pick := cands[start:min(start+p.Max, len(cands))]
	keys := make([][]byte, len(pick))
	for i, cd := range pick {
		keys[i] = s.k.available(q, cd.id)
	}
	// The only reads with conflicts: the records being claimed.
	vals, err := tx.GetMany(keys, false)
	if err != nil {
		return nil, err
	}
	var recs []*record
	var ids []storage.ItemID
	size, payload := 0, 0
	for i, v := range vals {
		if v == nil {
			continue
		}
		r, err := decodeRecord(v)
		if err != nil {
			return nil, fmt.Errorf("item %s: %w", pick[i].id, err)
		}
		sz := recordSize(&r, len(keys[i]))
		psz := len(r.inline) + int(r.size)
		if len(recs) > 0 && (size+sz > txnBudget || payload+psz > readBudget) {
			break
		}
		size += sz
		payload += psz
		id := pick[i].id
		s.clearAvailable(tx, q, id, &r)
		r.attempts++
		r.lease = lease
		r.delayed = false
		tx.Set(s.k.inflight(q, id), r.encode())
		recs = append(recs, &r)
		ids = append(ids, id)
	}
	if len(recs) == 0 {
		return pollOut{}, nil
	}
	s.add(tx, q, ctrInflight, int64(len(recs)))
	s.add(tx, q, ctrDelivered, int64(len(recs)))
	s.add(tx, q, ctrLeases, 1)
	lr := leaseRec{queue: q, expiry: exp, ids: ids}
	tx.Set(s.k.lease(lease), lr.encode())
	tx.Set(s.k.expiry(exp, lease), nil)
	if heartbeat {
		tx.Set(s.k.poller(q, s.node), appendTime(nil, p.Now))
	}
	c.set(tx, lr.encode())
	pay, err := s.payloads(tx, recs)
	if err != nil {
		return nil, err
	}
	items := make([]storage.Item, len(recs))
	for i, r := range recs {
		items[i] = toItem(q, ids[i], r, pay[i], storage.StateInflight)
	}
	return pollOut{lease: lease, expires: exp, items: items}, nil
}

// replayPoll rebuilds the result of a poll whose earlier attempt committed:
// the items its lease still holds.
func (s *Store) replayPoll(tx kv.Tx, q string, lease storage.LeaseID, c *call) (any, error) {
	b, err := c.result()
	if err != nil {
		return nil, err
	}
	lr, err := decodeLease(b)
	if err != nil {
		return nil, err
	}
	keys := make([][]byte, len(lr.ids))
	for i, id := range lr.ids {
		keys[i] = s.k.inflight(q, id)
	}
	vals, err := tx.GetMany(keys, false)
	if err != nil {
		return nil, err
	}
	var recs []*record
	var ids []storage.ItemID
	for i, v := range vals {
		if v == nil {
			continue
		}
		r, err := decodeRecord(v)
		if err != nil {
			return nil, err
		}
		if r.lease != lease {
			continue
		}
		recs = append(recs, &r)
		ids = append(ids, lr.ids[i])
	}
	pay, err := s.payloads(tx, recs)
	if err != nil {
		return nil, err
	}
	items := make([]storage.Item, len(recs))
	for i, r := range recs {
		items[i] = toItem(q, ids[i], r, pay[i], storage.StateInflight)
	}
	return pollOut{lease: lease, expires: lr.expiry, items: items}, nil
}
