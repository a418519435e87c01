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

// pollLock serializes the polls of one queue on this node. users counts
// the polls holding or waiting on it, so that the entry is dropped when
// the last one is done: kept for good, the map grew by one entry per queue
// name ever polled, without bound where jobs come with queues of their own
// (found by review, session 72). A per-queue lock, not a fixed set of
// striped ones: a slow poll of one queue must not hold up the polls of
// another that hashes alike.
type pollLock struct {
	sync.Mutex
	users int // guarded by Store.pollLocks
}

// lockPoll takes q's poll lock; unlockPoll must release it.
func (s *Store) lockPoll(q string) *pollLock {
	s.pollLocks.Lock()
	l := s.pollLocks.m[q]
	if l == nil {
		l = &pollLock{}
		s.pollLocks.m[q] = l
	}
	// Counted before waiting: an entry is dropped only when no poll holds
	// it and none waits on it, so two polls of q never hold different
	// locks.
	l.users++
	s.pollLocks.Unlock()
	l.Lock()
	return l
}

func (s *Store) unlockPoll(q string, l *pollLock) {
	l.Unlock()
	s.pollLocks.Lock()
	if l.users--; l.users == 0 {
		delete(s.pollLocks.m, q)
	}
	s.pollLocks.Unlock()
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
	if err := p.Validate(s.limits); err != nil {
		return storage.PollResult{}, err
	}
	tok, err := randomToken()
	if err != nil {
		return storage.PollResult{}, fmt.Errorf("fdbsync: lease token: %w", err)
	}
	lease := storage.LeaseID(tok)
	l := s.lockPoll(p.Queue)
	defer s.unlockPoll(p.Queue, l)

	if err := s.heartbeat(ctx, p.Queue, p.Now); err != nil {
		return storage.PollResult{}, fmt.Errorf("fdbsync: poll %q: %w", p.Queue, err)
	}
	s.polls.Add(1)
	v, _, rep, err := s.mutate(ctx, func(tx kv.Tx, c *call) (any, error) {
		if c.prior != nil {
			return s.replayPoll(tx, p.Queue, lease, c)
		}
		return s.claim(tx, c, p, lease)
	})
	s.pollAttempts.Add(int64(rep.Attempts))
	s.pollRetries.Add(int64(rep.Retries))
	if err != nil {
		return storage.PollResult{}, fmt.Errorf("fdbsync: poll %q: %w", p.Queue, err)
	}
	out, err := as[pollOut](v)
	if err != nil {
		return storage.PollResult{}, fmt.Errorf("fdbsync: poll %q: %w", p.Queue, err)
	}
	if len(out.items) == 0 {
		return storage.PollResult{}, nil
	}
	s.claimed.Add(int64(len(out.items)))
	s.nonEmpty.Add(1)
	s.deadline(out.expires)
	return storage.PollResult{Lease: out.lease, ExpiresAt: out.expires, Items: out.items}, nil
}

// heartbeat (re)writes this node's poller entry for q when it is older than
// heartbeatEvery, in its own small transaction before the claim: a node
// must be visible to the others before its first claim, or nodes starting
// together disagree on who polls and collide (measured: a start-up storm of
// up to 11 attempts per poll when the entry rode on the first claim). A
// blind set of a key only this node writes: no conflicts, safe to apply
// twice.
func (s *Store) heartbeat(ctx context.Context, q string, now time.Time) error {
	s.mu.Lock()
	last, ok := s.mu.heartbeat[q]
	s.mu.Unlock()
	if ok && now.Sub(last) < heartbeatEvery && !now.Before(last) {
		return nil
	}
	err := s.blind(ctx, func(tx kv.Tx) {
		tx.Set(s.k.poller(q, s.node), appendTime(nil, now))
	})
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	s.heartbeats.Add(1)
	s.mu.Lock()
	s.mu.heartbeat[q] = now
	if len(s.mu.heartbeat) > s.mu.hbPruneAt || now.Sub(s.mu.hbPruned) >= hbPruneEvery {
		s.pruneHeartbeatsLocked(now)
	}
	s.mu.Unlock()
	return nil
}

// hbPruneEvery spaces the passes of pruneHeartbeatsLocked by the callers'
// time.
const hbPruneEvery = time.Minute

// pruneHeartbeatsLocked forgets the queues whose heartbeat this node last
// wrote more than heartbeatTTL before now: kept for good, the map grew by
// one entry per queue name ever polled (found by review, session 72).
// Their keys need no clearing by Close: the sweeper deletes heartbeats of
// that age, and they stopped counting long before. A pass runs at most
// every hbPruneEvery, or when the map has doubled since the last one (so
// that callers' time going back cannot stop it), which keeps its cost
// amortized constant per heartbeat. Called with s.mu held.
func (s *Store) pruneHeartbeatsLocked(now time.Time) {
	for q, t := range s.mu.heartbeat {
		if now.Sub(t) > heartbeatTTL {
			delete(s.mu.heartbeat, q)
		}
	}
	s.mu.hbPruned = now
	s.mu.hbPruneAt = 2*len(s.mu.heartbeat) + 1024
}

// activePollers counts nodes that claimed from q within pollerTTL of now
// (snapshot read: heartbeats never cause conflicts) and this node's rank
// among them by node id. This node counts itself.
func (s *Store) activePollers(tx kv.Tx, q string, now time.Time) (n, rank int, err error) {
	pre := s.k.pollersPrefix(q)
	rows, err := tx.GetRange(pre, kv.PrefixEnd(pre), kv.RangeOptions{Snapshot: true, Limit: 1000})
	if err != nil {
		return 0, 0, err
	}
	self := false
	for _, r := range rows {
		t, _, err := readTime(r.Value)
		if err != nil || now.Sub(t) > pollerTTL {
			continue
		}
		switch c := bytes.Compare(r.Key[len(pre):], s.node[:]); {
		case c < 0:
			rank++
		case c == 0:
			self = true
		}
		n++
	}
	if !self {
		n++
	}
	return n, rank, nil
}

// readyHead returns up to window ready candidates of q at now in serve
// order, from the ready index and from delayed items whose time has come
// but which the sweeper has not promoted yet. Snapshot reads only.
func (s *Store) readyHead(tx kv.Tx, q string, now time.Time, window int) ([]candidate, error) {
	rp := s.k.readyPrefix(q)
	var out []candidate
	// Entries not yet visible at now (written by a node whose clock is
	// ahead, or a caller whose now went back) are skipped; keep reading
	// until the window is full, within a bound.
	from, end := rp, kv.PrefixEnd(rp)
	for scanned := 0; len(out) < window && scanned < 4*headCap; {
		rows, err := tx.GetRange(from, end, kv.RangeOptions{Snapshot: true, Limit: window})
		if err != nil {
			return nil, err
		}
		scanned += len(rows)
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
				continue
			}
			c := candidate{prio: rest[0], vis: vis}
			copy(c.id[:], rest[9:])
			out = append(out, c)
		}
		if len(rows) < window {
			break
		}
		from = kv.KeyAfter(rows[len(rows)-1].Key)
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

// choose picks up to max candidates to claim. Alone, a node takes the
// head in serve order. With n active nodes, node rank k takes, in serve
// order, the candidates whose id hashes to k mod n: nodes claim disjoint
// items whatever read version each one has, so they do not conflict; each
// node still serves its share in order, so the queue stays FIFO within a
// window of about max*n items. If its share of the window is short (short
// queue, or a node just joined), it fills up at a random offset among the
// rest, accepting some conflicts. A node that stops polling drops out of n
// after pollerTTL, and its share passes to the others.
func (s *Store) choose(cands []candidate, max, n, rank int) []candidate {
	if n <= 1 || len(cands) <= max {
		return cands[:min(max, len(cands))]
	}
	pick := make([]candidate, 0, max)
	var rest []candidate
	for _, c := range cands {
		if len(pick) < max && share(c.id, n) == rank {
			pick = append(pick, c)
		} else {
			rest = append(rest, c)
		}
	}
	if need := max - len(pick); need > 0 && len(rest) > 0 {
		start := s.intN(len(rest) - min(need, len(rest)) + 1)
		pick = append(pick, rest[start:start+min(need, len(rest))]...)
		sort.Slice(pick, func(i, j int) bool { return pick[i].less(pick[j]) })
	}
	return pick
}

// share maps an item to one of n pollers (FNV-1a over the id).
func share(id storage.ItemID, n int) int {
	h := uint32(2166136261)
	for _, b := range id {
		h ^= uint32(b)
		h *= 16777619
	}
	return int(h % uint32(n))
}

// claim is the body of a poll transaction.
func (s *Store) claim(tx kv.Tx, c *call, p storage.PollParams, lease storage.LeaseID) (any, error) {
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
	n, rank, err := s.activePollers(tx, q, p.Now)
	if err != nil {
		return nil, err
	}
	if s.spread < 0 {
		n = 1 // measurement mode: always the strict head
	}
	window := p.Max
	if n > 1 {
		window = min(p.Max*n*s.spread, headCap)
	}
	cands, err := s.readyHead(tx, q, p.Now, window)
	if err != nil {
		return nil, err
	}
	if len(cands) == 0 {
		return pollOut{}, nil
	}
	pick := s.choose(cands, p.Max, n, rank)
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
