package rocksstore

import (
	"bytes"

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
// map entry (id, slice header) and the allocation's rounding.
const readyEntryCost = 64

// readyCache is the store-wide budget of the per-queue caches
// (queueState.recs). Committer only.
type readyCache struct {
	max   int64 // <= 0: off
	bytes int64
}

func readyCost(v []byte) int64 { return int64(len(v)) + readyEntryCost }

// cacheReady records that the batch wrote v as id's available record in
// q (v nil: deleted it). v may live in the batch's arena: the cache keeps
// a copy. fresh says id was allocated by this enqueue, so the cache cannot
// hold it yet and is not searched. REQUIRES: on the committer.
func (s *Store) cacheReady(o *opTx, q *queueState, id storage.ItemID, v []byte, fresh bool) {
	var old []byte
	had := false
	if !fresh {
		old, had = q.recs[id]
	}
	if had {
		s.uncache(q, id, old)
	}
	if v != nil && len(q.recs) < readyCacheQueueItems && s.rcache.bytes+readyCost(v) <= s.rcache.max {
		s.cache(q, id, bytes.Clone(v))
	} else if !had {
		return // nothing changed
	}
	o.undoFn = append(o.undoFn, undoStep{cache: q, id: id, old: old, had: had})
}

// cache adds id's record c to q's cache.
func (s *Store) cache(q *queueState, id storage.ItemID, c []byte) {
	if q.recs == nil {
		q.recs = make(map[storage.ItemID][]byte)
	}
	q.recs[id] = c
	q.recsPeak = max(q.recsPeak, len(q.recs))
	s.rcache.bytes += readyCost(c)
}

// uncache removes id's record old from q's cache. A Go map keeps the room
// of its largest size: once a map that held many records is empty again it
// is dropped, so queues that each had a burst once do not keep that room
// between them (RSS stays bounded by the budget, not by the queue count).
func (s *Store) uncache(q *queueState, id storage.ItemID, old []byte) {
	s.rcache.bytes -= readyCost(old)
	delete(q.recs, id)
	if len(q.recs) == 0 && q.recsPeak > readyMapKeep {
		q.recs, q.recsPeak = nil, 0
	}
}

// readyMapKeep is the largest size a queue's empty cache map is kept at.
const readyMapKeep = 512

// undoCache puts id's cache entry in q back to old (had: it existed).
func (s *Store) undoCache(q *queueState, id storage.ItemID, old []byte, had bool) {
	if cur, ok := q.recs[id]; ok {
		s.uncache(q, id, cur)
	}
	if had {
		s.cache(q, id, old)
	}
}

// cachedReady returns id's cached available record in q, or nil. The
// caller must not change it. REQUIRES: on the committer.
func (q *queueState) cachedReady(id storage.ItemID) []byte { return q.recs[id] }
