package rocksstore

import (
	"encoding/binary"
	"math/bits"
	"slices"
	"sync/atomic"

	"github.com/leaseq/leaseq/storage"
)

// The in-memory indexes of the store: each queue's serve order, the
// delayed items and the leases with their expiry order. They mirror what
// the database holds (visibility, delayed, in_progress, leases,
// lease_expiry) and are rebuilt from it by Open, so a claim pass pops ids
// instead of iterating RocksDB. Only the committer goroutine changes them;
// a queue's ready index is also read by Stats under queueState.mu.

// readyEntry is one available item in its queue's serve order at one
// priority: visible_at, then id.
type readyEntry struct {
	vis int64
	id  storage.ItemID
}

func (a readyEntry) less(b readyEntry) bool {
	if a.vis != b.vis {
		return a.vis < b.vis
	}
	if x, y := binary.BigEndian.Uint64(a.id[:8]), binary.BigEndian.Uint64(b.id[:8]); x != y {
		return x < y
	}
	return binary.BigEndian.Uint64(a.id[8:]) < binary.BigEndian.Uint64(b.id[8:])
}

// heapItem orders the entries of a minHeap.
type heapItem[T any] interface{ less(T) bool }

// minHeap is a binary min-heap: the serve order of one priority
// (readyHeap) and the global deadline heaps (timedHeap).
type minHeap[T heapItem[T]] []T

// readyHeap holds one priority's available items in serve order. They
// mostly arrive in order (new ids at the enqueue instant), so it keeps
// them as a sorted run, a FIFO whose push appends and whose pop takes the
// head, and only the entries that arrive out of order (a delayed item, a
// nack with a delay, an expired lease's items) go into a min-heap. Pop
// takes the smaller of the two heads.
//
// The run is an array read from off that append grows up to runArray
// entries, followed by chunks of runChunk entries once it is full. A
// backlog that grows to millions of entries is thus never copied to a
// larger array (append's growth did that in the leader: 6 % of the batch
// path of produce-b100 in process), while a short backlog stays in one
// array that pop slides down in place. Open's rebuild hands the run one
// large array.
type readyHeap struct {
	run   []readyEntry // sorted; the run starts at off
	off   int
	more  [][]readyEntry // the rest of the run, in chunks; the first is next when run drains
	spare []readyEntry   // a drained chunk, for the next chunk a push needs
	rest  minHeap[readyEntry]
}

const (
	runArray = 1 << 16 // entries (1.5 MiB) beyond which a run grows by chunks
	runChunk = 1 << 12 // entries in each chunk (96 KiB)
)

// empty reports whether h holds no entry. (A run whose array is drained
// has no chunks left: pop and remove move the next chunk in.)
func (h *readyHeap) empty() bool { return h.off == len(h.run) && len(h.rest) == 0 }

func (h *readyHeap) push(e readyEntry) {
	if k := len(h.more); k > 0 {
		c := h.more[k-1]
		if e.less(c[len(c)-1]) {
			h.rest.push(e)
			return
		}
		if len(c) == cap(c) {
			h.more = append(h.more, h.newChunk())
			c = h.more[k]
			k++
		}
		h.more[k-1] = append(c, e)
		return
	}
	if n := len(h.run); n > h.off && e.less(h.run[n-1]) {
		h.rest.push(e)
		return
	}
	if len(h.run) == cap(h.run) && cap(h.run) >= runArray {
		h.more = append(h.more, append(h.newChunk(), e))
		return
	}
	h.run = append(h.run, e)
}

// newChunk returns an empty chunk: the spare one if there is one.
func (h *readyHeap) newChunk() []readyEntry {
	if c := h.spare; c != nil {
		h.spare = nil
		return c
	}
	return make([]readyEntry, 0, runChunk)
}

// fromRun reports whether the first entry is the run's.
func (h *readyHeap) fromRun() bool {
	if h.off == len(h.run) {
		return false
	}
	return len(h.rest) == 0 || !h.rest[0].less(h.run[h.off])
}

func (h *readyHeap) peek() (readyEntry, bool) {
	if h.fromRun() {
		return h.run[h.off], true
	}
	return h.rest.peek()
}

// pop removes the first entry. REQUIRES: !empty().
func (h *readyHeap) pop() readyEntry {
	if !h.fromRun() {
		return h.rest.pop()
	}
	e := h.run[h.off]
	h.off++
	switch {
	case h.off == len(h.run):
		h.nextRun()
	case h.off >= 1024 && h.off > len(h.run)/2 && len(h.more) == 0:
		// Slide the run down in place instead of growing forever; each
		// entry is moved at most once per halving.
		h.run = h.run[:copy(h.run, h.run[h.off:])]
		h.off = 0
	}
	return e
}

// nextRun replaces the drained array of the run with its next chunk.
func (h *readyHeap) nextRun() {
	h.off = 0
	if len(h.more) > 0 {
		if cap(h.run) == runChunk {
			h.spare = h.run[:0]
		}
		h.run = h.more[0]
		h.more[0] = nil
		if h.more = h.more[1:]; len(h.more) == 0 {
			h.more = nil
		}
		return
	}
	h.run = h.run[:0]
	if cap(h.run) > runArray {
		h.run = nil // give a drained backlog's array back
	}
}

// remove deletes entry e (undo of a push; linear).
func (h *readyHeap) remove(e readyEntry) bool {
	if i := slices.Index(h.run[h.off:], e); i >= 0 {
		h.run = slices.Delete(h.run, h.off+i, h.off+i+1)
		if h.off == len(h.run) {
			h.nextRun()
		}
		return true
	}
	for k, c := range h.more {
		if i := slices.Index(c, e); i >= 0 {
			if h.more[k] = slices.Delete(c, i, i+1); len(h.more[k]) == 0 {
				h.more = slices.Delete(h.more, k, k+1)
			}
			return true
		}
	}
	for i := range h.rest {
		if h.rest[i] != e {
			continue
		}
		last := len(h.rest) - 1
		h.rest[i] = h.rest[last]
		h.rest = h.rest[:last]
		h.rest.fix(i)
		return true
	}
	return false
}

func (h *minHeap[T]) push(e T) {
	*h = append(*h, e)
	h.up(len(*h) - 1)
}

func (h minHeap[T]) peek() (T, bool) {
	if len(h) == 0 {
		var zero T
		return zero, false
	}
	return h[0], true
}

func (h *minHeap[T]) pop() T {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	var zero T
	s[n] = zero // drop what it points to
	s = s[:n]
	s.down(0)
	*h = s
	// Give memory back after a drain: a heap that held a large backlog
	// keeps its array otherwise.
	if cap(s) > 1024 && n < cap(s)/4 {
		*h = append(minHeap[T](nil), s...)
	}
	return top
}

func (h minHeap[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].less(h[p]) {
			return
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func (h minHeap[T]) down(i int) {
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && h[r].less(h[l]) {
			m = r
		}
		if !h[m].less(h[i]) {
			return
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
}

// fix restores the heap order around i after h[i] changed.
func (h minHeap[T]) fix(i int) {
	if i < len(h) {
		h.up(i)
		h.down(i)
	}
}

// readyIndex is a queue's serve order: one heap per priority in use.
type readyIndex struct {
	heaps [256]*readyHeap
	used  [4]uint64 // bit p: heaps[p] is non-empty (an empty heap may stay, see emptied)
	n     int
}

func (x *readyIndex) push(prio uint8, e readyEntry) {
	h := x.heaps[prio]
	if h == nil {
		h = new(readyHeap)
		x.heaps[prio] = h
	}
	h.push(e)
	x.used[prio/64] |= 1 << (prio % 64)
	x.n++
}

// popReady removes and returns the first entry of priority prio if it is
// visible at now.
func (x *readyIndex) popReady(prio uint8, now int64) (readyEntry, bool) {
	h := x.heaps[prio]
	if h == nil {
		return readyEntry{}, false
	}
	e, ok := h.peek()
	if !ok || e.vis > now {
		return readyEntry{}, false
	}
	h.pop()
	x.n--
	if h.empty() {
		x.emptied(prio)
	}
	return e, true
}

// popAny removes and returns any entry (for purge).
func (x *readyIndex) popAny() (uint8, readyEntry, bool) {
	for w, b := range x.used {
		if b == 0 {
			continue
		}
		prio := uint8(w*64 + bits.TrailingZeros64(b))
		h := x.heaps[prio]
		e := h.pop()
		x.n--
		if h.empty() {
			x.emptied(prio)
		}
		return prio, e, true
	}
	return 0, readyEntry{}, false
}

// prios calls fn for each priority in use, ascending, until fn returns
// false.
func (x *readyIndex) prios(fn func(prio uint8) bool) {
	for w, b := range x.used {
		for b != 0 {
			p := uint8(w*64 + bits.TrailingZeros64(b))
			b &= b - 1
			if !fn(p) {
				return
			}
		}
	}
}

// firstReady returns the entry a claim at now would take first, and its
// priority, if any.
func (x *readyIndex) firstReady(now int64) (uint8, readyEntry, bool) {
	var prio uint8
	var first readyEntry
	found := false
	x.prios(func(p uint8) bool {
		if e, ok := x.heaps[p].peek(); ok && e.vis <= now {
			prio, first, found = p, e, true
			return false
		}
		return true
	})
	return prio, first, found
}

// oldest returns the earliest visible_at <= now among the priorities'
// first entries.
func (x *readyIndex) oldest(now int64) (int64, bool) {
	var best int64
	found := false
	x.prios(func(p uint8) bool {
		if e, ok := x.heaps[p].peek(); ok && e.vis <= now && (!found || e.vis < best) {
			best, found = e.vis, true
		}
		return true
	})
	return best, found
}

// timed is an entry of a global deadline heap (lease expiries, delayed
// items). Entries are removed lazily: the owner checks an entry against
// its current state when it comes due.
type timed struct {
	at    int64
	token [16]byte // lease token, or item id
	q     *queueState
}

// timedHeap is a deadline heap ordered by at.
type timedHeap = minHeap[timed]

func (a timed) less(b timed) bool { return a.at < b.at }

// leaseState is a live lease as the committer knows it: the database's
// lease record plus, per item, whether its payload is stored externally.
type leaseState struct {
	token    storage.LeaseID
	q        *queueState
	exp      int64
	ids      []storage.ItemID // items held at the start of the current op, in claim order
	released int              // ids released by the current op (see held)
	ext      map[storage.ItemID]bool
	wrote    uint64      // the last batch (batch.seq) that wrote its keys or its items' in_progress keys without the overlay's index
	max      int         // the claim's max (0: not from a claim)
	dur      int64       // the claim's lease, ns
	ahead    *prefetched // set when claimed ahead (prefetch.go)
	// aheadMark: the lease record in the database carries the
	// claimed-ahead mark (written by claimAhead, cleared by the lease's
	// next write: putLease).
	aheadMark bool
	// unconfirmed: rebuilt by Open from a record with the mark, so
	// nobody can tell whether a consumer ever received its items (a
	// crash while the batch was held). Until a consumer acts on the lease,
	// its expiry gives its items back with no attempt counted
	// (expireLease).
	unconfirmed bool
	// promised, when not 0, is the expiry a poll answered with this
	// lease (claimed ahead) was told, later than exp, which the database
	// keeps (see deadline). Set by that poll, off the committer.
	promised atomic.Int64
}

// deadline is when lease l expires: exp, or the later expiry a poll
// answered with it was promised (prefetch.go). The database keeps exp
// until the lease is next written.
func (l *leaseState) deadline() int64 {
	if p := l.promised.Load(); p > l.exp {
		return p
	}
	return l.exp
}

// remove deletes entry e of priority prio (undo of a push; linear).
func (x *readyIndex) remove(prio uint8, e readyEntry) {
	h := x.heaps[prio]
	if h == nil || !h.remove(e) {
		return
	}
	x.n--
	if h.empty() {
		x.emptied(prio)
	}
}

// keepHeapEntries is the most entries an emptied heap may have room for
// and still be kept for the next push (6 KiB).
const keepHeapEntries = 256

// emptied marks priority prio's heap empty. A heap with little room stays
// for the next push: a queue that its consumers keep empty would
// otherwise build its heap anew, array growth and all, at every refill
// (seven allocations per cycle of BenchmarkCycle). A larger one goes, so
// that an idle queue does not hold a backlog's arrays.
func (x *readyIndex) emptied(prio uint8) {
	x.used[prio/64] &^= 1 << (prio % 64)
	h := x.heaps[prio]
	if cap(h.run) > keepHeapEntries || cap(h.rest) > keepHeapEntries || h.spare != nil {
		x.heaps[prio] = nil
	}
}
