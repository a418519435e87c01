package check

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/leaseq/leaseq/storage"
)

// MaxViolations caps the violations a report lists, so a badly broken
// database does not produce gigabytes of text. CheckReport.Total still
// counts all of them.
const MaxViolations = 1000

// Layout says where a backend keeps what the rules look at. It is all a
// backend decides; the rules are the same for every layout.
type Layout struct {
	// ServeIndexHoldsDelayed: delayed items have a serve-order entry too
	// (rocksstore's visibility namespace and memstore's per-priority heaps
	// hold every available item). Otherwise only ready items do
	// (fdbsync's ready index).
	ServeIndexHoldsDelayed bool
	// DelayedIndexes names the indexes in which every delayed item has
	// exactly one entry (fdbsync keeps a per-queue and a global one).
	DelayedIndexes []string
}

// Facts are what a backend's scan found, normalized: one entry per record
// or index entry, in any order. An adapter fills them from one consistent
// view of its data and hands them to Run. Run sorts the slices in place.
type Facts struct {
	Queues        []string // queues with a config: the queues that exist
	Items         []Item
	Serve         []ServeEntry
	Delayed       []DelayedEntry
	Leases        []Lease
	LeaseExpiries []LeaseExpiry
	Dedups        []Dedup
	DedupExpiries []DedupExpiry
	Counters      []Counters // a queue without one counts as all zero
	Payloads      []Payload
	// Corrupt holds what the adapter could not read (see KindCorrupt), in
	// the order found.
	Corrupt []string
}

// Corruptf records data the adapter could not read.
func (f *Facts) Corruptf(format string, args ...any) {
	f.Corrupt = append(f.Corrupt, fmt.Sprintf(format, args...))
}

// Item is one item record (available, in_progress or dlq).
type Item struct {
	Queue string
	ID    storage.ItemID
	// State is where the backend placed it: ready, delayed, inflight or
	// dead; StateUnknown when it could not.
	State       storage.State
	Priority    uint8
	VisibleAt   time.Time
	Attempts    uint32
	MaxAttempts uint32          // the item's own; 0 for the queue's
	Lease       storage.LeaseID // the token the record carries; zero for none
	DeathRecord bool            // the record carries a reason and dead_at
	// Payload names the item's out-of-record payload ("" when the payload
	// is inline), PayloadParts how many parts it must have.
	Payload      string
	PayloadParts int
}

// ServeEntry is one entry of the serve-order (visibility) index.
type ServeEntry struct {
	Queue     string
	Priority  uint8
	VisibleAt time.Time
	ID        storage.ItemID
}

// DelayedEntry is one entry of a delayed index.
type DelayedEntry struct {
	Index     string // one of Layout.DelayedIndexes
	Queue     string
	ID        storage.ItemID
	VisibleAt time.Time
	// Priority is checked only when HasPriority (the index keeps it).
	Priority    uint8
	HasPriority bool
}

// Lease is one lease record.
type Lease struct {
	Token     storage.LeaseID
	Queue     string
	ExpiresAt time.Time
	IDs       []storage.ItemID
}

// LeaseExpiry is one entry of the lease_expiry index.
type LeaseExpiry struct {
	Token     storage.LeaseID
	ExpiresAt time.Time
}

// Dedup is one dedup key record.
type Dedup struct {
	Queue     string
	Key       string
	ID        storage.ItemID
	ExpiresAt time.Time
}

// DedupExpiry is one entry of the dedup_expiry index.
type DedupExpiry struct {
	Queue     string
	Key       string
	ExpiresAt time.Time
}

// Counters are one queue's persisted state counters.
type Counters struct {
	Queue                                  string
	Ready, Delayed, Inflight, Dead, Leases int64
}

// Payload is one out-of-record payload.
type Payload struct {
	Ref   string // what Item.Payload names
	Parts int
	// Pending: written ahead of an enqueue that has not committed; the
	// backend's collector drops it unless an item comes to refer to it.
	Pending bool
}

type ref struct {
	q  string
	id storage.ItemID
}

func (r ref) String() string { return fmt.Sprintf("item %s of %q", r.id, r.q) }

type dedupRef struct{ q, key string }

// reporter builds the report: every violation counts, the first
// MaxViolations are listed.
type reporter struct{ rep storage.CheckReport }

func (r *reporter) add(k storage.ViolationKind, format string, args ...any) {
	r.rep.Total++
	if len(r.rep.Violations) >= MaxViolations {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if n := Invariant(k); n > 0 {
		msg = fmt.Sprintf("invariant %d: %s", n, msg)
	}
	r.rep.Violations = append(r.rep.Violations, storage.Violation{Kind: k, Msg: msg})
}

// run holds the indexes the rules share.
type run struct {
	reporter
	l      Layout
	f      *Facts
	queues map[string]bool
	items  map[ref]*Item // the first record of each id; duplicates are reported
	leases map[storage.LeaseID]*Lease
}

// Run evaluates every rule (see the package documentation) over f and
// returns the report: Items and Leases count the records in f, Violations
// lists what is broken in a stable order (the adapter's Corrupt first,
// then by rule, each rule in key order), capped at MaxViolations.
func Run(l Layout, f *Facts) storage.CheckReport {
	r := &run{l: l, f: f, queues: map[string]bool{}}
	for _, c := range f.Corrupt {
		r.add(KindCorrupt, "%s", c)
	}
	for _, q := range f.Queues {
		r.queues[q] = true
	}
	r.checkItems()
	r.checkServe()
	r.checkDelayed()
	r.checkLeases()
	r.checkDedup()
	r.checkPayloads()
	r.checkCounters()
	r.rep.Items = len(f.Items)
	r.rep.Leases = len(f.Leases)
	return r.rep
}

// firsts sorts xs stably by order and maps each key to its first element;
// dup is called for every later element whose key was seen.
func firsts[T any, K comparable](xs []T, order func(a, b T) int, key func(*T) K, dup func(first, again *T)) map[K]*T {
	slices.SortStableFunc(xs, order)
	m := make(map[K]*T, len(xs))
	for i := range xs {
		x := &xs[i]
		k := key(x)
		if first := m[k]; first != nil {
			dup(first, x)
			continue
		}
		m[k] = x
	}
	return m
}

// eachItem calls fn for the first record of every item id, in key order.
func (r *run) eachItem(fn func(k ref, it *Item)) {
	for i := range r.f.Items {
		it := &r.f.Items[i]
		if k := (ref{it.Queue, it.ID}); r.items[k] == it {
			fn(k, it)
		}
	}
}

func cmpRef(a, b ref) int {
	return cmp.Or(cmp.Compare(a.q, b.q), bytes.Compare(a.id[:], b.id[:]))
}

// checkItems: invariant 1 (one state, a record that fits it), invariant 5,
// and that each item's queue exists.
func (r *run) checkItems() {
	r.items = firsts(r.f.Items,
		func(a, b Item) int { return cmpRef(ref{a.Queue, a.ID}, ref{b.Queue, b.ID}) },
		func(it *Item) ref { return ref{it.Queue, it.ID} },
		func(first, again *Item) {
			r.add(KindItemDuplicate, "%s is both %s and %s", ref{first.Queue, first.ID}, first.State, again.State)
		})
	// Ids are unique per node, not per queue (DESIGN.md): an id under two
	// queues is one item in two states.
	queueOf := make(map[storage.ItemID]string, len(r.items))
	r.eachItem(func(k ref, it *Item) {
		if q, ok := queueOf[it.ID]; ok {
			r.add(KindItemDuplicate, "item %s is in queue %s and in queue %s (%s)", it.ID, q, it.Queue, it.State)
		} else {
			queueOf[it.ID] = it.Queue
		}
		if !r.queues[it.Queue] {
			r.add(KindUnknownQueue, "%s: the queue has no config", k)
		}
		switch it.State {
		case storage.StateReady, storage.StateDelayed, storage.StateInflight, storage.StateDead:
		default:
			r.add(KindItemNoState, "%s is in no state", k)
			return
		}
		switch {
		case it.State == storage.StateInflight && it.Lease.IsZero():
			r.add(KindItemRecordState, "inflight %s carries no lease token", k)
		case it.State != storage.StateInflight && !it.Lease.IsZero():
			r.add(KindItemRecordState, "%s %s carries lease token %s", it.State, k, it.Lease)
		}
		switch {
		case it.State == storage.StateDead && !it.DeathRecord:
			r.add(KindItemRecordState, "dead %s has no death record", k)
		case it.State != storage.StateDead && it.DeathRecord:
			r.add(KindItemRecordState, "%s %s carries a death record", it.State, k)
		}
		if m := it.MaxAttempts; m > 0 && it.State != storage.StateDead && it.Attempts > m {
			r.add(KindAttemptsExceeded, "%s %s has %d attempts, max %d", it.State, k, it.Attempts, m)
		}
	})
}

// servable reports whether it belongs in the serve-order index.
func (r *run) servable(it *Item) bool {
	return it != nil && (it.State == storage.StateReady || (r.l.ServeIndexHoldsDelayed && it.State == storage.StateDelayed))
}

// checkServe: invariant 2 for the serve-order index. An entry of the right
// item with the wrong position counts as its entry (one mismatch, not also
// a missing entry).
func (r *run) checkServe() {
	slices.SortStableFunc(r.f.Serve, func(a, b ServeEntry) int {
		return cmp.Or(cmp.Compare(a.Queue, b.Queue), cmp.Compare(a.Priority, b.Priority), a.VisibleAt.Compare(b.VisibleAt), bytes.Compare(a.ID[:], b.ID[:]))
	})
	n := map[ref]int{}
	for _, e := range r.f.Serve {
		k := ref{e.Queue, e.ID}
		it := r.items[k]
		if !r.servable(it) {
			r.add(KindServeEntryOrphan, "serve-order entry (priority %d, visible_at %s) for %s, which is %s", e.Priority, ts(e.VisibleAt), k, stateOf(it))
			continue
		}
		n[k]++
		if e.Priority != it.Priority || !e.VisibleAt.Equal(it.VisibleAt) {
			r.add(KindServeEntryMismatch, "serve-order entry (priority %d, visible_at %s) for %s, whose record says (priority %d, visible_at %s)",
				e.Priority, ts(e.VisibleAt), k, it.Priority, ts(it.VisibleAt))
		}
	}
	r.eachItem(func(k ref, it *Item) {
		if r.servable(it) && n[k] != 1 {
			r.add(KindServeEntryCount, "%s %s has %d serve-order entries, want 1", it.State, k, n[k])
		}
	})
}

// checkDelayed: invariant 2 for every delayed index.
func (r *run) checkDelayed() {
	slices.SortStableFunc(r.f.Delayed, func(a, b DelayedEntry) int {
		return cmp.Or(cmp.Compare(a.Index, b.Index), cmpRef(ref{a.Queue, a.ID}, ref{b.Queue, b.ID}), a.VisibleAt.Compare(b.VisibleAt))
	})
	type key struct {
		index string
		ref
	}
	n := map[key]int{}
	for _, e := range r.f.Delayed {
		k := ref{e.Queue, e.ID}
		if !slices.Contains(r.l.DelayedIndexes, e.Index) {
			r.add(KindCorrupt, "entry for %s in delayed index %q, which the layout does not have", k, e.Index)
			continue
		}
		it := r.items[k]
		if it == nil || it.State != storage.StateDelayed {
			r.add(KindDelayedEntryOrphan, "%s entry (visible_at %s) for %s, which is %s", e.Index, ts(e.VisibleAt), k, stateOf(it))
			continue
		}
		n[key{e.Index, k}]++
		if !e.VisibleAt.Equal(it.VisibleAt) || (e.HasPriority && e.Priority != it.Priority) {
			r.add(KindDelayedEntryMismatch, "%s entry (visible_at %s, priority %s) for %s, whose record says (visible_at %s, priority %d)",
				e.Index, ts(e.VisibleAt), prio(e), k, ts(it.VisibleAt), it.Priority)
		}
	}
	r.eachItem(func(k ref, it *Item) {
		if it.State != storage.StateDelayed {
			return
		}
		for _, idx := range r.l.DelayedIndexes {
			if c := n[key{idx, k}]; c != 1 {
				r.add(KindDelayedEntryCount, "delayed %s has %d %s entries, want 1", k, c, idx)
			}
		}
	})
}

// checkLeases: invariant 3.
func (r *run) checkLeases() {
	r.leases = firsts(r.f.Leases,
		func(a, b Lease) int { return bytes.Compare(a.Token[:], b.Token[:]) },
		func(l *Lease) storage.LeaseID { return l.Token },
		func(first, _ *Lease) { r.add(KindCorrupt, "lease %s has two records", first.Token) })
	listed := map[ref]int{}
	for i := range r.f.Leases {
		l := &r.f.Leases[i]
		if r.leases[l.Token] != l {
			continue
		}
		if !r.queues[l.Queue] {
			r.add(KindUnknownQueue, "lease %s: queue %q has no config", l.Token, l.Queue)
		}
		if len(l.IDs) == 0 {
			r.add(KindLeaseEmpty, "lease %s of %q lists no items", l.Token, l.Queue)
		}
		for _, id := range l.IDs {
			k := ref{l.Queue, id}
			it := r.items[k]
			switch {
			case it == nil || it.State != storage.StateInflight:
				r.add(KindLeaseItemMissing, "lease %s lists %s, which is %s", l.Token, k, stateOf(it))
			case it.Lease != l.Token:
				r.add(KindLeaseItemForeign, "lease %s lists %s, whose record carries lease %s", l.Token, k, it.Lease)
			default:
				listed[k]++
			}
		}
	}
	r.eachItem(func(k ref, it *Item) {
		if it.State == storage.StateInflight && listed[k] != 1 {
			r.add(KindInflightListing, "inflight %s (lease %s) is listed %d times by lease records holding its token, want 1", k, it.Lease, listed[k])
		}
	})

	slices.SortStableFunc(r.f.LeaseExpiries, func(a, b LeaseExpiry) int {
		return cmp.Or(a.ExpiresAt.Compare(b.ExpiresAt), bytes.Compare(a.Token[:], b.Token[:]))
	})
	exp := map[storage.LeaseID]int{}
	for _, e := range r.f.LeaseExpiries {
		l := r.leases[e.Token]
		if l == nil {
			r.add(KindLeaseExpiryOrphan, "lease_expiry entry (%s) of lease %s, which does not exist", ts(e.ExpiresAt), e.Token)
			continue
		}
		exp[e.Token]++
		if !e.ExpiresAt.Equal(l.ExpiresAt) {
			r.add(KindLeaseExpiryMismatch, "lease_expiry entry (%s) of lease %s, which expires at %s", ts(e.ExpiresAt), e.Token, ts(l.ExpiresAt))
		}
	}
	for i := range r.f.Leases {
		l := &r.f.Leases[i]
		if r.leases[l.Token] == l && exp[l.Token] != 1 {
			r.add(KindLeaseExpiryCount, "lease %s of %q has %d lease_expiry entries, want 1", l.Token, l.Queue, exp[l.Token])
		}
	}
}

// checkDedup: every dedup key has exactly one expiry entry at its expiry,
// and every entry names a key.
func (r *run) checkDedup() {
	keys := firsts(r.f.Dedups,
		func(a, b Dedup) int { return cmp.Or(cmp.Compare(a.Queue, b.Queue), cmp.Compare(a.Key, b.Key)) },
		func(d *Dedup) dedupRef { return dedupRef{d.Queue, d.Key} },
		func(first, _ *Dedup) {
			r.add(KindCorrupt, "dedup key %q of %q has two records", first.Key, first.Queue)
		})
	slices.SortStableFunc(r.f.DedupExpiries, func(a, b DedupExpiry) int {
		return cmp.Or(a.ExpiresAt.Compare(b.ExpiresAt), cmp.Compare(a.Queue, b.Queue), cmp.Compare(a.Key, b.Key))
	})
	n := map[dedupRef]int{}
	for _, e := range r.f.DedupExpiries {
		k := dedupRef{e.Queue, e.Key}
		d := keys[k]
		if d == nil {
			r.add(KindDedupExpiryOrphan, "dedup_expiry entry (%s) of key %q of %q, which does not exist", ts(e.ExpiresAt), e.Key, e.Queue)
			continue
		}
		n[k]++
		if !e.ExpiresAt.Equal(d.ExpiresAt) {
			r.add(KindDedupExpiryMismatch, "dedup_expiry entry (%s) of key %q of %q, which expires at %s", ts(e.ExpiresAt), e.Key, e.Queue, ts(d.ExpiresAt))
		}
	}
	for i := range r.f.Dedups {
		d := &r.f.Dedups[i]
		k := dedupRef{d.Queue, d.Key}
		if keys[k] != d {
			continue
		}
		if !r.queues[d.Queue] {
			r.add(KindUnknownQueue, "dedup key %q: queue %q has no config", d.Key, d.Queue)
		}
		if n[k] != 1 {
			r.add(KindDedupExpiryCount, "dedup key %q of %q has %d dedup_expiry entries, want 1", d.Key, d.Queue, n[k])
		}
	}
}

// checkPayloads: out-of-record payloads and the items that refer to them
// match one to one.
func (r *run) checkPayloads() {
	payloads := firsts(r.f.Payloads,
		func(a, b Payload) int { return cmp.Compare(a.Ref, b.Ref) },
		func(p *Payload) string { return p.Ref },
		func(first, _ *Payload) { r.add(KindCorrupt, "payload %x is listed twice", first.Ref) })
	used := map[string]bool{}
	r.eachItem(func(k ref, it *Item) {
		if it.Payload == "" {
			return
		}
		used[it.Payload] = true
		p := payloads[it.Payload]
		switch {
		case p == nil:
			r.add(KindPayloadMissing, "%s %s: its payload %x is missing", it.State, k, it.Payload)
		case p.Parts != it.PayloadParts:
			r.add(KindPayloadMissing, "%s %s: its payload %x has %d parts, want %d", it.State, k, it.Payload, p.Parts, it.PayloadParts)
		case p.Pending:
			r.add(KindPayloadPending, "%s %s: its payload %x is still marked as a pending upload", it.State, k, it.Payload)
		}
	})
	for i := range r.f.Payloads {
		p := &r.f.Payloads[i]
		if payloads[p.Ref] == p && !used[p.Ref] && !p.Pending {
			r.add(KindPayloadOrphan, "payload %x belongs to no item", p.Ref)
		}
	}
}

// checkCounters: invariant 4, against the state of each (first) item
// record and the lease records.
func (r *run) checkCounters() {
	scan := map[string]*Counters{}
	get := func(q string) *Counters {
		c := scan[q]
		if c == nil {
			c = &Counters{Queue: q}
			scan[q] = c
		}
		return c
	}
	r.eachItem(func(k ref, it *Item) {
		c := get(k.q)
		switch it.State {
		case storage.StateReady:
			c.Ready++
		case storage.StateDelayed:
			c.Delayed++
		case storage.StateInflight:
			c.Inflight++
		case storage.StateDead:
			c.Dead++
		}
	})
	for i := range r.f.Leases {
		get(r.f.Leases[i].Queue).Leases++
	}
	persisted := firsts(r.f.Counters,
		func(a, b Counters) int { return cmp.Compare(a.Queue, b.Queue) },
		func(c *Counters) string { return c.Queue },
		func(first, _ *Counters) { r.add(KindCorrupt, "queue %q has two counters records", first.Queue) })
	for i := range r.f.Counters {
		if c := &r.f.Counters[i]; persisted[c.Queue] == c && !r.queues[c.Queue] {
			r.add(KindUnknownQueue, "counters of queue %q, which has no config", c.Queue)
		}
	}
	qs := slices.Clone(r.f.Queues)
	slices.Sort(qs)
	for _, q := range slices.Compact(qs) {
		var got Counters
		if p := persisted[q]; p != nil {
			got = *p
		}
		want := get(q)
		for _, c := range []struct {
			name      string
			got, want int64
		}{
			{"ready", got.Ready, want.Ready},
			{"delayed", got.Delayed, want.Delayed},
			{"inflight", got.Inflight, want.Inflight},
			{"dead", got.Dead, want.Dead},
			{"leases", got.Leases, want.Leases},
		} {
			if c.got != c.want {
				r.add(KindCounterMismatch, "queue %q: %s counter is %d, a scan counts %d", q, c.name, c.got, c.want)
			}
		}
	}
}

func stateOf(it *Item) string {
	if it == nil {
		return "not there"
	}
	return it.State.String()
}

func prio(e DelayedEntry) string {
	if !e.HasPriority {
		return "-"
	}
	return fmt.Sprint(e.Priority)
}

// ts formats an instant in UTC to the nanosecond, so two instants that
// differ only in the last digits read apart.
func ts(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }
