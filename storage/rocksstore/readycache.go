package rocksstore

import (
	"bytes"
	"slices"

	"github.com/leaseq/leaseq/storage"
)

// The ready-record cache. A claim needs the available record of every item
// it takes (to move it to in_progress and hand out its payload). Most items
// are claimed soon after they were enqueued, nacked or returned by the
// sweeper, and the committer wrote their record itself then: it keeps a
// copy, per queue, so the claim locks the record with GetForUpdate without
// reading it back (RocksDB's GetForUpdate with no value locks only). The
// read was a quarter of the serial batch path in e2e (docs/BENCHMARKS.md,
// "A cache of ready records").
//
// The cache holds exactly what the database holds (or the batch being
// built, whose overlay answers first): an entry is set when the committer
// writes an available record and dropped when it deletes one
// (putAvailable, takeAvailable), and a failed op undoes both. A failed
// commit fails the store, and Recover rebuilds every queue's state, the
// cache included, from the database: after open it is empty and fills
// with what is written from then on. It is bounded by
// Options.ReadyCacheBytes; a record that does not fit is read from the
// database when it is claimed, as before.

// DefaultReadyCacheBytes is the ready-record cache's budget when
// Options.ReadyCacheBytes is 0: about 90k ready items of 256 B.
const DefaultReadyCacheBytes = 32 << 20

// readyCacheQueueItems is how many records one queue caches at most. A
// record is worth keeping only when it will be claimed soon: past the
// first few thousand items of a backlog it would be claimed much later, if
// at all, and copying it would slow a backlog's growth (produce-b100) for
// nothing.
const readyCacheQueueItems = 4096

// readyEntryCost is what one cached record costs besides its bytes: the
// entry (id, slice header) in the run or map and the allocation's rounding.
const readyEntryCost = 64

// readyCache is the store-wide budget of the per-queue caches
// (queueState.recs, readyRecs). Committer only.
type readyCache struct {
	max   int64 // <= 0: off
	bytes int64
}

func readyCost(v []byte) int64 { return int64(len(v)) + readyEntryCost }

// cacheReady records that the batch wrote v as id's available record in
// q (v nil: deleted it). v may live in the batch's arena: the cache keeps
// a copy, unless owned says v is the cache's to keep (a record its
// enqueuer encoded, which nobody changes). fresh says id was allocated by
// this enqueue, so the cache cannot hold it yet and is not searched.
// REQUIRES: on the committer.
func (s *Store) cacheReady(o *opTx, q *queueState, id storage.ItemID, v []byte, fresh, owned bool) {
	var old []byte
	had := false
	if !fresh {
		old, had = s.uncache(q, id)
	}
	if v != nil && s.roomFor(q, v) {
		if !owned {
			v = bytes.Clone(v)
		}
		s.cache(q, id, v, fresh)
	} else if !had {
		return // nothing changed
	}
	o.undoFn = append(o.undoFn, undoStep{cache: q, id: id, old: old, had: had})
}

// roomFor reports whether q's cache takes v.
func (s *Store) roomFor(q *queueState, v []byte) bool { return s.roomForCost(q, readyCost(v)) }

// roomForCost reports whether q's cache takes a record that costs cost.
func (s *Store) roomForCost(q *queueState, cost int64) bool {
	return q.recs.len() < readyCacheQueueItems && s.rcache.bytes+cost <= s.rcache.max
}

// cacheFull reports, to an enqueuer on any goroutine, whether q's cache
// was full after the last record the committer cached or dropped: it
// encodes its items' records itself only when they are likely to be
// cached (enqueueOp).
func (q *queueState) cacheFull() bool { return q.recsFull.Load() }

// noteRoom updates q's cacheFull after a change of the cache: full when
// it has no room for one more record with a payload of defaultInlineMax.
func (s *Store) noteRoom(q *queueState) {
	full := !s.roomForCost(q, readyCost(nil)+defaultInlineMax)
	if full != q.recsFull.Load() {
		q.recsFull.Store(full)
	}
}

// undoCache puts id's cache entry in q back to old (had: it existed).
func (s *Store) undoCache(q *queueState, id storage.ItemID, old []byte, had bool) {
	s.uncache(q, id)
	if had {
		s.cache(q, id, old, false)
	}
}

// cache adds c as id's record in q (which has none) and counts it in the
// budget.
func (s *Store) cache(q *queueState, id storage.ItemID, c []byte, fresh bool) {
	q.recs.add(id, c, fresh)
	s.rcache.bytes += readyCost(c)
	s.noteRoom(q)
}

// uncache removes id's record from q and the budget, and returns it.
func (s *Store) uncache(q *queueState, id storage.ItemID) ([]byte, bool) {
	v, ok := q.recs.take(id)
	if ok {
		s.rcache.bytes -= readyCost(v)
		s.noteRoom(q)
	}
	return v, ok
}

// cachedReady returns id's cached available record in q, or nil. The
// caller must not change it. REQUIRES: on the committer.
func (q *queueState) cachedReady(id storage.ItemID) []byte {
	v, _ := q.recs.get(id)
	return v
}

// readyRecs is one queue's cached records. Most records are those of new
// items, written in id order and claimed in about that order: they go to
// run, a slice in id order whose head is taken first, so caching and
// taking such a record costs no hashing (a map cost 8 % of the serial
// batch path of e2e in process, docs/BENCHMARKS.md). The rest (nacked or
// returned items, and records that arrive out of id order) go to m.
type readyRecs struct {
	m    map[storage.ItemID][]byte
	peak int // the most records m held since it was made

	run     []runRec // run[head:] is in ascending id order; a nil rec was taken
	head    int
	runLive int
	last    int // the index find returned last
}

type runRec struct {
	id  storage.ItemID
	rec []byte
}

func (r *readyRecs) len() int { return len(r.m) + r.runLive }

// get returns id's record.
func (r *readyRecs) get(id storage.ItemID) ([]byte, bool) {
	if i := r.find(id); i >= 0 {
		return r.run[i].rec, true
	}
	v, ok := r.m[id]
	return v, ok
}

// find returns id's index in run, or -1.
func (r *readyRecs) find(id storage.ItemID) int {
	if r.runLive == 0 {
		return -1
	}
	// The usual lookups: the oldest new item, the item found last (a claim
	// looks its record up, then takes it) or the one after it (a claim
	// takes items in serve order, which is id order within an enqueue).
	for _, i := range [...]int{r.head, r.last, r.last + 1} {
		if i >= r.head && i < len(r.run) && r.run[i].id == id {
			if r.run[i].rec == nil {
				return -1
			}
			r.last = i
			return i
		}
	}
	rest := r.run[r.head:]
	i, ok := slices.BinarySearchFunc(rest, id, func(e runRec, id storage.ItemID) int { return bytes.Compare(e.id[:], id[:]) })
	if !ok || rest[i].rec == nil {
		return -1
	}
	r.last = r.head + i
	return r.last
}

// add caches c as id's record; id has none. fresh: id is a new item's,
// which goes to run if it sorts after every id there.
func (r *readyRecs) add(id storage.ItemID, c []byte, fresh bool) {
	if fresh {
		if n := len(r.run); n == r.head || bytes.Compare(r.run[n-1].id[:], id[:]) < 0 {
			r.compact()
			r.run = append(r.run, runRec{id: id, rec: c})
			r.runLive++
			return
		}
	}
	if r.m == nil {
		r.m = make(map[storage.ItemID][]byte)
	}
	r.m[id] = c
	r.peak = max(r.peak, len(r.m))
}

// take removes id's record and returns it.
func (r *readyRecs) take(id storage.ItemID) ([]byte, bool) {
	if i := r.find(id); i >= 0 {
		v := r.run[i].rec
		r.run[i].rec = nil
		r.runLive--
		for r.head < len(r.run) && r.run[r.head].rec == nil {
			r.head++
		}
		if r.runLive == 0 {
			r.clearRun()
		}
		return v, true
	}
	v, ok := r.m[id]
	if !ok {
		return nil, false
	}
	delete(r.m, id)
	// A Go map keeps the room of its largest size: once a map that held
	// many records is empty again it is dropped, so queues that each had
	// a burst once do not keep that room between them (RSS stays bounded
	// by the budget, not by the queue count).
	if len(r.m) == 0 && r.peak > readyMapKeep {
		r.m, r.peak = nil, 0
	}
	return v, true
}

// compact makes room before an append: it moves run's live records down
// once the taken ones before or among them outnumber them, so run stays
// within twice the records it holds (plus readyMapKeep).
func (r *readyRecs) compact() {
	if len(r.run) < cap(r.run) || len(r.run)-r.runLive <= r.runLive+readyMapKeep {
		return
	}
	n := 0
	for _, e := range r.run[r.head:] {
		if e.rec != nil {
			r.run[n] = e
			n++
		}
	}
	clear(r.run[n:])
	r.run, r.head, r.last = r.run[:n], 0, 0
}

// clearRun empties run, keeping its room unless it grew past
// readyMapKeep records.
func (r *readyRecs) clearRun() {
	if cap(r.run) > readyMapKeep {
		r.run = nil
	} else {
		clear(r.run)
		r.run = r.run[:0]
	}
	r.head, r.last = 0, 0
}

// readyMapKeep is the largest size a queue's empty cache map, or run, is
// kept at.
const readyMapKeep = 512
