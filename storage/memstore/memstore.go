package memstore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	mrand "math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/leaseq/leaseq/storage"
)

// Options configures a Store.
type Options struct {
	// Limits bounds requests. Zero fields take the value of
	// storage.DefaultLimits.
	Limits storage.Limits
	// JitterFunc returns a uniform random number in [0, 1) for the nack
	// backoff. nil uses math/rand/v2. It is called with the store's mutex
	// held and must not call back into the store.
	JitterFunc func() float64
	// OnDeadline, if set, is called after a call that created a lease
	// expiry or a delayed VisibleAt, with the earliest such instant that
	// call created. It is called without the mutex held.
	OnDeadline storage.DeadlineFunc
}

// Store is an in-memory storage.Store. The zero value is not usable; call
// New. All methods are safe for concurrent use.
type Store struct {
	limits     storage.Limits
	jitter     func() float64
	onDeadline storage.DeadlineFunc

	mu struct {
		sync.Mutex
		closed bool
		lastID uint64
		queues map[string]*queue
		leases map[storage.LeaseID]*lease
		// leaseHeap holds every lease by (expires, token).
		leaseHeap *indexedHeap[*lease]
		// delayed holds every available item counted in some queue's
		// Delayed counter, by (VisibleAt, ID).
		delayed *indexedHeap[*entry]
		// dedupHeap holds every dedup key by (expires, queue, key).
		dedupHeap *indexedHeap[*dedupEntry]
	}
}

var _ storage.Store = (*Store)(nil)

type location uint8

const (
	locAvailable location = iota + 1
	locInflight
	locDead
)

type queue struct {
	name  string
	cfg   storage.QueueConfig
	items map[storage.ItemID]*entry // available, inflight and dead
	// avail holds the available items of each priority by (VisibleAt, ID);
	// nil until the priority is first used.
	avail [256]*indexedHeap[*entry]
	dedup map[string]*dedupEntry
	// st holds the counters; Queue, OldestReadyAge and Config are filled
	// in by Stats.
	st storage.QueueStats
}

type entry struct {
	item     storage.Item // State is not maintained here; see loc
	loc      location
	delayed  bool   // counted in st.Delayed (and in the delayed heap)
	lease    *lease // when inflight
	reason   string // when dead
	deadAt   time.Time
	availIdx int // position in its avail heap, -1 if not there
	delayIdx int // position in the delayed heap, -1 if not there
}

type lease struct {
	id      storage.LeaseID
	q       *queue
	expires time.Time
	items   map[storage.ItemID]*entry
	idx     int
}

type dedupEntry struct {
	q       *queue
	key     string
	id      storage.ItemID
	seen    time.Time // when id was enqueued: the key's window runs from here
	expires time.Time // the end of the window in force then
	idx     int
}

// holds: the key makes an enqueue at now a duplicate under the queue's
// current window. A window shortened since the key was seen (or 0: dedup
// off) applies at once, or producers' items would be dropped for up to
// the old window; a longer one does not stretch the key past its expiry.
func (d *dedupEntry) holds(now time.Time, window time.Duration) bool {
	return window > 0 && now.Before(d.expires) && now.Sub(d.seen) < window
}

// New returns an empty Store.
func New(opts Options) *Store {
	s := &Store{limits: opts.Limits.WithDefaults(), jitter: opts.JitterFunc, onDeadline: opts.OnDeadline}
	if s.jitter == nil {
		s.jitter = mrand.Float64
	}
	s.mu.queues = make(map[string]*queue)
	s.mu.leases = make(map[storage.LeaseID]*lease)
	s.mu.leaseHeap = newHeap(func(a, b *lease) bool {
		if !a.expires.Equal(b.expires) {
			return a.expires.Before(b.expires)
		}
		return bytes.Compare(a.id[:], b.id[:]) < 0
	}, func(l *lease, i int) { l.idx = i })
	s.mu.delayed = newHeap(lessVisible, func(e *entry, i int) { e.delayIdx = i })
	s.mu.dedupHeap = newHeap(func(a, b *dedupEntry) bool {
		if !a.expires.Equal(b.expires) {
			return a.expires.Before(b.expires)
		}
		if a.q.name != b.q.name {
			return a.q.name < b.q.name
		}
		return a.key < b.key
	}, func(d *dedupEntry, i int) { d.idx = i })
	return s
}

// Limits returns the limits the store enforces.
func (s *Store) Limits() storage.Limits { return s.limits }

func lessVisible(a, b *entry) bool {
	if !a.item.VisibleAt.Equal(b.item.VisibleAt) {
		return a.item.VisibleAt.Before(b.item.VisibleAt)
	}
	return bytes.Compare(a.item.ID[:], b.item.ID[:]) < 0
}

// norm drops the monotonic reading and the location, as a backend that
// persists unix nanoseconds would.
func norm(t time.Time) time.Time { return time.Unix(0, t.UnixNano()).UTC() }

// lockOpen takes the mutex, or returns ErrClosed without holding it.
func (s *Store) lockOpen(op string) error {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return fmt.Errorf("memstore: %s: %w", op, storage.ErrClosed)
	}
	return nil
}

func (s *Store) notify(t time.Time) {
	if s.onDeadline != nil && !t.IsZero() {
		s.onDeadline(t)
	}
}

// lockedNotify runs fn with the mutex held, wraps its error with op and
// queue, and reports the deadline fn returned only after the mutex is
// released, because storage.DeadlineFunc is called outside the store's locks.
func lockedNotify[T any](s *Store, op, queue string, fn func() (T, time.Time, error)) (T, error) {
	var zero T
	if err := s.lockOpen(op); err != nil {
		return zero, err
	}
	res, next, err := fn()
	s.mu.Unlock()
	if err != nil {
		return zero, fmt.Errorf("memstore: %s %q: %w", op, queue, err)
	}
	s.notify(next)
	return res, nil
}

// earliest returns the earlier of a and b, treating zero as "none".
func earliest(a, b time.Time) time.Time {
	if a.IsZero() || (!b.IsZero() && b.Before(a)) {
		return b
	}
	return a
}

// queueLocked returns the queue, creating it with the default config if
// create is set; nil if it does not exist and create is not set.
// REQUIRES: s.mu held.
func (s *Store) queueLocked(name string, create bool) *queue {
	q := s.mu.queues[name]
	if q == nil && create {
		q = &queue{
			name:  name,
			cfg:   s.limits.DefaultQueueConfig(),
			items: make(map[storage.ItemID]*entry),
			dedup: make(map[string]*dedupEntry),
		}
		s.mu.queues[name] = q
	}
	return q
}

// newIDLocked returns the next item id: a big-endian counter, so ids
// increase in enqueue order. REQUIRES: s.mu held.
func (s *Store) newIDLocked() storage.ItemID {
	s.mu.lastID++
	var id storage.ItemID
	binary.BigEndian.PutUint64(id[8:], s.mu.lastID)
	return id
}

// newTokenLocked returns a fresh random lease token. REQUIRES: s.mu held.
func (s *Store) newTokenLocked() storage.LeaseID {
	for {
		var l storage.LeaseID
		// crypto/rand.Read never returns an error (Go 1.24+); it panics
		// if the system source fails, which is a broken machine.
		_, _ = rand.Read(l[:])
		if !l.IsZero() && s.mu.leases[l] == nil {
			return l
		}
	}
}

// makeAvailableLocked puts e into its queue's available set; it is counted
// delayed when its VisibleAt is after now. It returns e's VisibleAt when
// that is a new deadline, else zero. REQUIRES: s.mu held.
func (s *Store) makeAvailableLocked(q *queue, e *entry, now time.Time) time.Time {
	e.loc = locAvailable
	e.lease = nil
	h := q.avail[e.item.Priority]
	if h == nil {
		h = newHeap(lessVisible, func(e *entry, i int) { e.availIdx = i })
		q.avail[e.item.Priority] = h
	}
	h.push(e)
	if e.item.VisibleAt.After(now) {
		e.delayed = true
		s.mu.delayed.push(e)
		q.st.Delayed++
		return e.item.VisibleAt
	}
	q.st.Ready++
	return time.Time{}
}

// takeAvailableLocked removes an available item from the available set and
// from the counters. REQUIRES: s.mu held.
func (s *Store) takeAvailableLocked(q *queue, e *entry) {
	q.avail[e.item.Priority].remove(e.availIdx)
	if e.delayed {
		s.mu.delayed.remove(e.delayIdx)
		e.delayed = false
		q.st.Delayed--
	} else {
		q.st.Ready--
	}
}

// releaseLocked detaches an inflight item from its lease, dropping the lease
// once it lists nothing. REQUIRES: s.mu held.
func (s *Store) releaseLocked(q *queue, e *entry) {
	l := e.lease
	delete(l.items, e.item.ID)
	e.lease = nil
	q.st.Inflight--
	if len(l.items) == 0 {
		s.dropLeaseLocked(l)
	}
}

// dropLeaseLocked forgets a lease record. REQUIRES: s.mu held.
func (s *Store) dropLeaseLocked(l *lease) {
	s.mu.leaseHeap.remove(l.idx)
	delete(s.mu.leases, l.id)
	l.q.st.Leases--
}

// killLocked moves an item that is no longer inflight to the dead-letter
// namespace. REQUIRES: s.mu held.
func (s *Store) killLocked(q *queue, e *entry, reason string, now time.Time) {
	e.loc = locDead
	e.reason = reason
	e.deadAt = now
	q.st.Dead++
	q.st.DeadLettered++
}

func maxAttempts(q *queue, e *entry) uint32 {
	if e.item.MaxAttempts > 0 {
		return e.item.MaxAttempts
	}
	return q.cfg.MaxAttempts
}

// out copies an item for a caller, with its state at now.
func (e *entry) out(q *queue, now time.Time) storage.Item {
	it := e.item
	it.Queue = q.name
	it.Payload = bytes.Clone(e.item.Payload)
	if it.Payload == nil {
		it.Payload = []byte{}
	}
	switch e.loc {
	case locInflight:
		it.State = storage.StateInflight
	case locDead:
		it.State = storage.StateDead
	default:
		if it.VisibleAt.After(now) {
			it.State = storage.StateDelayed
		} else {
			it.State = storage.StateReady
		}
	}
	return it
}

// Enqueue implements storage.Store.
func (s *Store) Enqueue(_ context.Context, p storage.EnqueueParams) ([]storage.EnqueueResult, error) {
	return lockedNotify(s, "enqueue", p.Queue, func() ([]storage.EnqueueResult, time.Time, error) {
		return s.enqueueLocked(p)
	})
}

// REQUIRES: s.mu held.
func (s *Store) enqueueLocked(p storage.EnqueueParams) ([]storage.EnqueueResult, time.Time, error) {
	if err := p.Validate(s.limits); err != nil {
		return nil, time.Time{}, err
	}
	now := norm(p.Now)
	if err := s.newQueueLocked(p.Queue); err != nil {
		return nil, time.Time{}, err
	}
	q := s.queueLocked(p.Queue, true)
	res := make([]storage.EnqueueResult, len(p.Items))
	var next time.Time
	for i, in := range p.Items {
		if err := s.limits.ValidateItem(in); err != nil {
			res[i] = storage.EnqueueResult{Code: storage.CodeInvalid, Err: storage.ItemReason(err)}
			continue
		}
		if in.DedupKey != "" {
			if d := q.dedup[in.DedupKey]; d != nil && d.holds(now, q.cfg.DedupWindow) {
				q.st.Duplicates++
				res[i] = storage.EnqueueResult{Code: storage.CodeOK, ID: d.id, Duplicate: true}
				continue
			}
		}
		e := &entry{
			item: storage.Item{
				ID:          s.newIDLocked(),
				Queue:       q.name,
				Payload:     bytes.Clone(in.Payload),
				Priority:    in.Priority,
				MaxAttempts: in.MaxAttempts,
				EnqueuedAt:  now,
				VisibleAt:   now.Add(in.Delay),
				DedupKey:    in.DedupKey,
			},
			availIdx: -1,
			delayIdx: -1,
		}
		q.items[e.item.ID] = e
		next = earliest(next, s.makeAvailableLocked(q, e, now))
		q.st.Enqueued++
		if in.DedupKey != "" && q.cfg.DedupWindow > 0 {
			s.setDedupLocked(q, in.DedupKey, e.item.ID, now, now.Add(q.cfg.DedupWindow))
		}
		res[i] = storage.EnqueueResult{Code: storage.CodeOK, ID: e.item.ID}
	}
	return res, next, nil
}

// setDedupLocked records (or replaces one that no longer holds) a dedup
// key seen at seen. REQUIRES: s.mu held.
func (s *Store) setDedupLocked(q *queue, key string, id storage.ItemID, seen, expires time.Time) {
	if d := q.dedup[key]; d != nil {
		d.id, d.seen, d.expires = id, seen, expires
		s.mu.dedupHeap.fix(d.idx)
		return
	}
	d := &dedupEntry{q: q, key: key, id: id, seen: seen, expires: expires}
	q.dedup[key] = d
	s.mu.dedupHeap.push(d)
}

// Poll implements storage.Store.
func (s *Store) Poll(_ context.Context, p storage.PollParams) (storage.PollResult, error) {
	if err := s.lockOpen("poll"); err != nil {
		return storage.PollResult{}, err
	}
	res, err := s.pollLocked(p)
	s.mu.Unlock()
	if err != nil {
		return storage.PollResult{}, fmt.Errorf("memstore: poll %q: %w", p.Queue, err)
	}
	if !res.Lease.IsZero() {
		s.notify(res.ExpiresAt)
	}
	return res, nil
}

// REQUIRES: s.mu held.
func (s *Store) pollLocked(p storage.PollParams) (storage.PollResult, error) {
	if err := p.Validate(s.limits); err != nil {
		return storage.PollResult{}, err
	}
	now := norm(p.Now)
	q := s.queueLocked(p.Queue, false)
	if q == nil {
		return storage.PollResult{}, nil
	}
	var got []*entry
	for prio := 0; prio < len(q.avail) && len(got) < p.Max; prio++ {
		h := q.avail[prio]
		if h == nil {
			continue
		}
		for len(got) < p.Max {
			e, ok := h.top()
			if !ok || e.item.VisibleAt.After(now) {
				break
			}
			s.takeAvailableLocked(q, e)
			got = append(got, e)
		}
	}
	if len(got) == 0 {
		return storage.PollResult{}, nil
	}
	dur := p.Lease
	if dur == 0 {
		dur = q.cfg.LeaseDuration
	}
	l := &lease{id: s.newTokenLocked(), q: q, expires: now.Add(dur), items: make(map[storage.ItemID]*entry, len(got))}
	s.mu.leases[l.id] = l
	s.mu.leaseHeap.push(l)
	q.st.Leases++
	res := storage.PollResult{Lease: l.id, ExpiresAt: l.expires, Items: make([]storage.Item, len(got))}
	for i, e := range got {
		e.loc = locInflight
		e.lease = l
		e.item.Attempts++
		l.items[e.item.ID] = e
		q.st.Inflight++
		q.st.Delivered++
		res.Items[i] = e.out(q, now)
	}
	return res, nil
}

// checkLeaseLocked applies the lease-token rules of the storage package
// documentation to one id. q may be nil (no such queue). REQUIRES: s.mu held.
func (s *Store) checkLeaseLocked(q *queue, token storage.LeaseID, id storage.ItemID, now time.Time) (storage.Code, *entry) {
	var e *entry
	if q != nil {
		e = q.items[id]
	}
	switch {
	case e == nil:
		return storage.LeaseCode(storage.Absent, false), nil
	case e.loc == locInflight && e.lease.id != token:
		return storage.LeaseCode(storage.HeldByOther, false), nil
	case e.loc == locInflight:
		c := storage.LeaseCode(storage.HeldByLease, now.Before(e.lease.expires))
		if c != storage.CodeOK {
			e = nil
		}
		return c, e
	}
	l := s.mu.leases[token]
	return storage.LeaseCode(storage.NotInflight, l != nil && now.Before(l.expires)), nil
}

// Ack implements storage.Store.
func (s *Store) Ack(_ context.Context, p storage.AckParams) ([]storage.Code, error) {
	if err := s.lockOpen("ack"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if err := p.Validate(s.limits); err != nil {
		return nil, fmt.Errorf("memstore: ack %q: %w", p.Queue, err)
	}
	now := norm(p.Now)
	q := s.queueLocked(p.Queue, false)
	codes := make([]storage.Code, len(p.IDs))
	for i, id := range p.IDs {
		c, e := s.checkLeaseLocked(q, p.Lease, id, now)
		codes[i] = c
		if c != storage.CodeOK {
			continue
		}
		s.releaseLocked(q, e)
		delete(q.items, id)
		q.st.Acked++
	}
	return codes, nil
}

// Nack implements storage.Store.
func (s *Store) Nack(_ context.Context, p storage.NackParams) ([]storage.Code, error) {
	return lockedNotify(s, "nack", p.Queue, func() ([]storage.Code, time.Time, error) {
		return s.nackLocked(p)
	})
}

// REQUIRES: s.mu held.
func (s *Store) nackLocked(p storage.NackParams) ([]storage.Code, time.Time, error) {
	if err := p.Validate(s.limits); err != nil {
		return nil, time.Time{}, err
	}
	now := norm(p.Now)
	reason := s.limits.TruncateReason(p.Reason)
	q := s.queueLocked(p.Queue, false)
	codes := make([]storage.Code, len(p.IDs))
	var next time.Time
	for i, id := range p.IDs {
		c, e := s.checkLeaseLocked(q, p.Lease, id, now)
		codes[i] = c
		if c != storage.CodeOK {
			continue
		}
		s.releaseLocked(q, e)
		if p.Undelivered {
			// The claim taken back: its attempt (Delivered, a lifetime
			// counter, keeps the claim).
			e.item.Attempts = max(e.item.Attempts, 1) - 1
			next = earliest(next, s.makeAvailableLocked(q, e, now))
			continue
		}
		q.st.Nacked++
		e.item.LastError = reason
		if e.item.Attempts >= maxAttempts(q, e) {
			s.killLocked(q, e, "nack: "+reason, now)
			continue
		}
		var d time.Duration
		if p.Delay != nil {
			d = *p.Delay
		} else {
			d = storage.Backoff(q.cfg, e.item.Attempts, s.jitter())
		}
		e.item.VisibleAt = now.Add(d)
		next = earliest(next, s.makeAvailableLocked(q, e, now))
	}
	return codes, next, nil
}

// ExtendLease implements storage.Store. A Duration of 0 means the queue's
// default lease, as for Poll.
func (s *Store) ExtendLease(_ context.Context, p storage.ExtendParams) (time.Time, error) {
	if err := s.lockOpen("extend"); err != nil {
		return time.Time{}, err
	}
	exp, err := s.extendLocked(p)
	s.mu.Unlock()
	if err != nil {
		return time.Time{}, fmt.Errorf("memstore: extend %q lease %s: %w", p.Queue, p.Lease, err)
	}
	s.notify(exp)
	return exp, nil
}

// REQUIRES: s.mu held.
func (s *Store) extendLocked(p storage.ExtendParams) (time.Time, error) {
	if err := p.Validate(s.limits); err != nil {
		return time.Time{}, err
	}
	now := norm(p.Now)
	l := s.mu.leases[p.Lease]
	if l == nil || !now.Before(l.expires) {
		return time.Time{}, storage.ErrLeaseExpired
	}
	if l.q.name != p.Queue {
		return time.Time{}, storage.ErrLeaseMismatch
	}
	d := p.Duration
	if d == 0 {
		d = l.q.cfg.LeaseDuration
	}
	l.expires = now.Add(d)
	s.mu.leaseHeap.fix(l.idx)
	return l.expires, nil
}

// Sweep implements storage.Store. A Limit <= 0 means Limits.MaxBatch.
// More is set when deadline work that is due at p.Now remains.
func (s *Store) Sweep(_ context.Context, p storage.SweepParams) (storage.SweepResult, error) {
	if err := s.lockOpen("sweep"); err != nil {
		return storage.SweepResult{}, err
	}
	defer s.mu.Unlock()
	now := norm(p.Now)
	limit := p.Limit
	if limit <= 0 {
		limit = s.limits.MaxBatch
	}
	var res storage.SweepResult
	gained := map[string]bool{}

	for n := 0; n < limit; n++ {
		l, ok := s.mu.leaseHeap.top()
		if !ok || l.expires.After(now) {
			break
		}
		s.dropLeaseLocked(l)
		res.LeasesExpired++
		q := l.q
		for _, e := range l.items {
			e.lease = nil
			q.st.Inflight--
			q.st.Expired++
			if e.item.Attempts >= maxAttempts(q, e) {
				s.killLocked(q, e, "lease expired", now)
				res.DeadLettered++
				continue
			}
			// The item became ready when the lease ran out, so it queues
			// behind items that were ready earlier.
			e.item.VisibleAt = l.expires
			s.makeAvailableLocked(q, e, now)
			res.Requeued++
			gained[q.name] = true
		}
	}
	for n := 0; n < limit; n++ {
		e, ok := s.mu.delayed.top()
		if !ok || e.item.VisibleAt.After(now) {
			break
		}
		s.mu.delayed.remove(0)
		e.delayed = false
		q := s.mu.queues[e.item.Queue]
		q.st.Delayed--
		q.st.Ready++
		res.Promoted++
		gained[q.name] = true
	}
	for n := 0; n < limit; n++ {
		d, ok := s.mu.dedupHeap.top()
		if !ok || d.expires.After(now) {
			break
		}
		s.mu.dedupHeap.remove(0)
		delete(d.q.dedup, d.key)
		res.DedupDropped++
	}

	if l, ok := s.mu.leaseHeap.top(); ok {
		res.Next = earliest(res.Next, l.expires)
	}
	if e, ok := s.mu.delayed.top(); ok {
		res.Next = earliest(res.Next, e.item.VisibleAt)
	}
	if d, ok := s.mu.dedupHeap.top(); ok {
		res.Next = earliest(res.Next, d.expires)
	}
	res.More = !res.Next.IsZero() && !res.Next.After(now)
	for name := range gained {
		res.ReadyQueues = append(res.ReadyQueues, name)
	}
	sort.Strings(res.ReadyQueues)
	return res, nil
}

// Stats implements storage.Store. OldestReadyAge is p.Now minus the
// earliest VisibleAt among available items with VisibleAt <= p.Now: how
// long the longest-waiting servable item has been servable.
func (s *Store) Stats(_ context.Context, p storage.StatsParams) ([]storage.QueueStats, error) {
	if err := s.lockOpen("stats"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if err := p.Validate(s.limits); err != nil {
		return nil, fmt.Errorf("memstore: stats %q: %w", p.Queue, err)
	}
	now := norm(p.Now)
	if p.Queue != "" {
		q := s.queueLocked(p.Queue, false)
		if q == nil {
			return nil, fmt.Errorf("memstore: stats %q: %w", p.Queue, storage.ErrNotFound)
		}
		return []storage.QueueStats{q.stats(now)}, nil
	}
	out := make([]storage.QueueStats, 0, len(s.mu.queues))
	for _, name := range s.queueNamesLocked() {
		out = append(out, s.mu.queues[name].stats(now))
	}
	return out, nil
}

func (q *queue) stats(now time.Time) storage.QueueStats {
	st := q.st
	st.Queue = q.name
	st.Config = q.cfg
	for _, h := range q.avail {
		if h == nil {
			continue
		}
		if e, ok := h.top(); ok && !e.item.VisibleAt.After(now) {
			if age := now.Sub(e.item.VisibleAt); age > st.OldestReadyAge {
				st.OldestReadyAge = age
			}
		}
	}
	return st
}

// REQUIRES: s.mu held.
func (s *Store) queueNamesLocked() []string {
	names := make([]string, 0, len(s.mu.queues))
	for name := range s.mu.queues {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// Queues implements storage.Store.
func (s *Store) Queues(_ context.Context) ([]string, error) {
	if err := s.lockOpen("queues"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	return s.queueNamesLocked(), nil
}

// selectLocked returns q's items at loc with id > after, in id order, at
// most limit (no limit when limit <= 0). REQUIRES: s.mu held.
func (q *queue) selectLocked(loc location, after storage.ItemID, limit int) []*entry {
	var sel []*entry
	for _, e := range q.items {
		if e.loc == loc && bytes.Compare(e.item.ID[:], after[:]) > 0 {
			sel = append(sel, e)
		}
	}
	sort.Slice(sel, func(i, j int) bool { return bytes.Compare(sel[i].item.ID[:], sel[j].item.ID[:]) < 0 })
	if limit > 0 && len(sel) > limit {
		sel = sel[:limit]
	}
	return sel
}

// Peek implements storage.Store. An unknown queue has no items.
func (s *Store) Peek(_ context.Context, p storage.PeekParams) ([]storage.Item, error) {
	if err := s.lockOpen("peek"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if err := p.Validate(s.limits); err != nil {
		return nil, fmt.Errorf("memstore: peek %q: %w", p.Queue, err)
	}
	q := s.queueLocked(p.Queue, false)
	if q == nil {
		return nil, nil
	}
	loc := locAvailable
	if p.Inflight {
		loc = locInflight
	}
	now := norm(p.Now)
	var out []storage.Item
	for _, e := range q.selectLocked(loc, p.After, p.Limit) {
		out = append(out, e.out(q, now))
	}
	return out, nil
}

// Purge implements storage.Store. Dedup keys are kept: a producer retrying
// an enqueue it already made is still suppressed.
func (s *Store) Purge(_ context.Context, p storage.PurgeParams) (int, error) {
	if err := s.lockOpen("purge"); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	if err := p.Validate(s.limits); err != nil {
		return 0, fmt.Errorf("memstore: purge %q: %w", p.Queue, err)
	}
	q := s.queueLocked(p.Queue, false)
	if q == nil {
		return 0, nil
	}
	n := 0
	for id, e := range q.items {
		switch e.loc {
		case locAvailable:
			s.takeAvailableLocked(q, e)
		case locInflight:
			s.releaseLocked(q, e)
		default:
			continue
		}
		delete(q.items, id)
		n++
	}
	q.st.Purged += uint64(n)
	return n, nil
}

// DeleteQueue implements storage.Store.
func (s *Store) DeleteQueue(_ context.Context, p storage.DeleteQueueParams) (int, error) {
	if err := s.lockOpen("delete queue"); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	if err := p.Validate(s.limits); err != nil {
		return 0, fmt.Errorf("memstore: delete queue %q: %w", p.Queue, err)
	}
	q := s.queueLocked(p.Queue, false)
	if q == nil {
		return 0, fmt.Errorf("memstore: delete queue %q: %w", p.Queue, storage.ErrNotFound)
	}
	if len(q.items) > 0 && !p.Force {
		return 0, fmt.Errorf("memstore: delete queue %q: %w: %d items (ready, delayed, inflight or dead)", p.Queue, storage.ErrNotEmpty, len(q.items))
	}
	n := len(q.items)
	for _, e := range q.items {
		switch e.loc {
		case locAvailable:
			s.takeAvailableLocked(q, e)
		case locInflight:
			s.releaseLocked(q, e)
		}
	}
	for _, d := range q.dedup {
		s.mu.dedupHeap.remove(d.idx)
	}
	delete(s.mu.queues, p.Queue)
	return n, nil
}

// DeadList implements storage.Store. An unknown queue has no dead items.
func (s *Store) DeadList(_ context.Context, p storage.DeadListParams) ([]storage.DeadItem, error) {
	if err := s.lockOpen("dead list"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if err := p.Validate(s.limits); err != nil {
		return nil, fmt.Errorf("memstore: dead list %q: %w", p.Queue, err)
	}
	q := s.queueLocked(p.Queue, false)
	if q == nil {
		return nil, nil
	}
	var out []storage.DeadItem
	for _, e := range q.selectLocked(locDead, p.After, p.Limit) {
		out = append(out, storage.DeadItem{Item: e.out(q, time.Time{}), Reason: e.reason, DeadAt: e.deadAt})
	}
	return out, nil
}

// deadSelectionLocked resolves the selection of Redrive and PurgeDead: per
// id (nil entry and CodeNotFound when not dead), or the first p.Limit dead
// items. REQUIRES: s.mu held.
func (s *Store) deadSelectionLocked(q *queue, p storage.RedriveParams) ([]*entry, []storage.Code, error) {
	if err := p.Validate(s.limits); err != nil {
		return nil, nil, err
	}
	if len(p.IDs) > 0 {
		sel := make([]*entry, len(p.IDs))
		codes := make([]storage.Code, len(p.IDs))
		for i, id := range p.IDs {
			var e *entry
			if q != nil {
				e = q.items[id]
			}
			if e == nil || e.loc != locDead {
				codes[i] = storage.CodeNotFound
				continue
			}
			sel[i] = e
		}
		return sel, codes, nil
	}
	if q == nil {
		return nil, nil, nil
	}
	return q.selectLocked(locDead, storage.ItemID{}, p.Limit), nil, nil
}

// Redrive implements storage.Store. An id listed twice is redriven once;
// the second gets CodeNotFound.
func (s *Store) Redrive(_ context.Context, p storage.RedriveParams) (storage.RedriveResult, error) {
	return s.deadOp("redrive", p, func(q *queue, e *entry, now time.Time) {
		q.st.Dead--
		q.st.Redriven++
		e.item.Attempts = 0
		e.item.VisibleAt = now
		s.makeAvailableLocked(q, e, now)
	})
}

// PurgeDead implements storage.Store.
func (s *Store) PurgeDead(_ context.Context, p storage.RedriveParams) (storage.RedriveResult, error) {
	return s.deadOp("purge dead", p, func(q *queue, e *entry, _ time.Time) {
		q.st.Dead--
		q.st.Purged++
		delete(q.items, e.item.ID)
		e.loc = 0
	})
}

func (s *Store) deadOp(op string, p storage.RedriveParams, apply func(q *queue, e *entry, now time.Time)) (storage.RedriveResult, error) {
	if err := s.lockOpen(op); err != nil {
		return storage.RedriveResult{}, err
	}
	defer s.mu.Unlock()
	q := s.queueLocked(p.Queue, false)
	sel, codes, err := s.deadSelectionLocked(q, p)
	if err != nil {
		return storage.RedriveResult{}, fmt.Errorf("memstore: %s %q: %w", op, p.Queue, err)
	}
	now := norm(p.Now)
	res := storage.RedriveResult{Codes: codes}
	for i, e := range sel {
		if e == nil {
			continue
		}
		if e.loc != locDead { // the same id earlier in this batch
			codes[i] = storage.CodeNotFound
			continue
		}
		apply(q, e, now)
		res.Moved++
	}
	return res, nil
}

// QueueConfig implements storage.Store.
func (s *Store) QueueConfig(_ context.Context, queue string) (storage.QueueConfig, error) {
	if err := s.lockOpen("queue config"); err != nil {
		return storage.QueueConfig{}, err
	}
	defer s.mu.Unlock()
	if err := s.limits.ValidateQueueName(queue); err != nil {
		return storage.QueueConfig{}, fmt.Errorf("memstore: queue config %q: %w", queue, err)
	}
	q := s.queueLocked(queue, false)
	if q == nil {
		return storage.QueueConfig{}, fmt.Errorf("memstore: queue config %q: %w", queue, storage.ErrNotFound)
	}
	return q.cfg, nil
}

// SetQueueConfig implements storage.Store.
func (s *Store) SetQueueConfig(_ context.Context, queue string, c storage.QueueConfig) error {
	if err := s.lockOpen("set queue config"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if err := s.limits.ValidateQueueName(queue); err != nil {
		return fmt.Errorf("memstore: set queue config %q: %w", queue, err)
	}
	if err := s.limits.ValidateQueueConfig(c); err != nil {
		return fmt.Errorf("memstore: set queue config %q: %w", queue, err)
	}
	if err := s.newQueueLocked(queue); err != nil {
		return fmt.Errorf("memstore: set queue config %q: %w", queue, err)
	}
	s.queueLocked(queue, true).cfg = c
	return nil
}

// newQueueLocked checks that queue exists or may be created
// (Limits.MaxQueues). REQUIRES: s.mu held.
func (s *Store) newQueueLocked(queue string) error {
	if s.mu.queues[queue] != nil {
		return nil
	}
	return s.limits.CheckNewQueue(len(s.mu.queues))
}

// Close implements storage.Store. It drops all data.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return nil
	}
	s.mu.closed = true
	s.mu.queues = nil
	s.mu.leases = nil
	return nil
}

// Nonblocking implements storage.Nonblocking: every call works in memory.
func (s *Store) Nonblocking() bool { return true }
