package rocksstore

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// checkIndexes verifies, for every queue a batch touched, that the
// in-memory indexes agree with the queue's counters: the serve order holds
// every available item (ready and delayed), the delayed set the delayed
// ones, the leases the inflight ones. A disagreement is a bug in the
// engine, so it panics. Costly (it walks the queue's leases): only with
// -tags invariants. REQUIRES: the caller leads.
func checkIndexes(queues []*queueState) {
	for _, q := range queues {
		q.mu.Lock()
		c, ready := q.counters, q.ready.n
		q.mu.Unlock()
		held := 0
		for _, l := range q.leases {
			held += l.held()
		}
		switch {
		case int64(ready) != c.Ready+c.Delayed:
			panic(fmt.Sprintf("rocksstore invariant: queue %q: serve order holds %d items, counters say ready %d + delayed %d", q.name, ready, c.Ready, c.Delayed))
		case int64(len(q.delayed)) != c.Delayed:
			panic(fmt.Sprintf("rocksstore invariant: queue %q: %d delayed items indexed, counters say %d", q.name, len(q.delayed), c.Delayed))
		case int64(len(q.leases)) != c.Leases:
			panic(fmt.Sprintf("rocksstore invariant: queue %q: %d leases indexed, counters say %d", q.name, len(q.leases), c.Leases))
		case int64(held) != c.Inflight:
			panic(fmt.Sprintf("rocksstore invariant: queue %q: leases hold %d items, counters say %d inflight", q.name, held, c.Inflight))
		}
	}
}

// checkUniqueKeys verifies that a batch writes each key once: overlay.add
// appends without a lookup, trusting that its key is new to the batch.
// keys are sorted. A duplicate is a bug in the engine, so it panics.
func checkUniqueKeys(keys []overlayEnt) {
	for i := 1; i < len(keys); i++ {
		if keys[i].key == keys[i-1].key {
			panic(fmt.Sprintf("rocksstore invariant: key %x is written twice in one batch", keys[i].key))
		}
	}
}

// checkWriteOnce verifies the rule that lets the batch single-delete
// (dbkeys.SingleDeletable): a write of such a key that the batch did not
// delete first must find no value in the database, or a later single
// delete would uncover the older one. A violation is a bug in the engine,
// so it panics. One read per key: only with -tags invariants.
// REQUIRES: the caller leads, and b is not yet committed.
func (s *Store) checkWriteOnce(b *batch, keys []overlayEnt) {
	for _, e := range keys {
		kb := keyBytes(e.key)
		if e.val == nil || !dbkeys.SingleDeletable(kb) || slices.Contains(b.rewritten, e.key) {
			continue
		}
		_, found, err := s.getRaw(kb)
		if err != nil {
			panic(fmt.Sprintf("rocksstore invariant: read %x: %v", kb, err))
		}
		if found {
			panic(fmt.Sprintf("rocksstore invariant: key %x is written again without a delete before it", kb))
		}
	}
}

// checkReadyCache verifies the ready-record cache (readycache.go) where a
// claim relies on it: the record v it takes from the cache for key k,
// which is not in the batch's overlay, must be the one the database holds.
// A disagreement is a bug in the engine, so it panics. One read per cached
// record used: only with -tags invariants. REQUIRES: the caller leads.
func (s *Store) checkReadyCache(k, v []byte) {
	got, found, err := s.getRaw(k)
	if err != nil {
		panic(fmt.Sprintf("rocksstore invariant: read %x: %v", k, err))
	}
	if !found || !bytes.Equal(got, v) {
		panic(fmt.Sprintf("rocksstore invariant: cached ready record %x is not the database's (found %v)", k, found))
	}
}

// checkReadyWrites verifies the cache's other side: every available record
// a batch writes or deletes is in the cache as written, or not at all.
// REQUIRES: the caller leads, and b is not yet committed.
func (s *Store) checkReadyWrites(keys []overlayEnt) {
	for _, e := range keys {
		kb := keyBytes(e.key)
		if len(kb) == 0 || kb[0] != dbkeys.NsAvailable {
			continue
		}
		name, id, err := dbkeys.DecodeAvailableKey(kb)
		if err != nil {
			panic(fmt.Sprintf("rocksstore invariant: available key %x: %v", kb, err))
		}
		q := s.queue(name)
		if q == nil {
			continue
		}
		c, cached := q.recs.get(storage.ItemID(id))
		if cached && !bytes.Equal(c, e.val) {
			panic(fmt.Sprintf("rocksstore invariant: ready record %x written %x, cached %x", kb, e.val, c))
		}
	}
}
