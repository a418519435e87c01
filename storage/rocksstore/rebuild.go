package rocksstore

import (
	"fmt"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// rebuild fills the in-memory indexes from the database: each queue's
// serve order from its visibility entries, the delayed set from the
// delayed index, and the leases (with their expiry order and items) from
// the lease records and in_progress records. It reads every index entry
// once, so its time grows linearly with the available items (see
// BenchmarkOpenBacklog in doc.go); item records of available items are
// never read.
func (s *Store) rebuild() error {
	for _, q := range s.mu.queues {
		if err := s.rebuildReady(q); err != nil {
			return err
		}
	}
	lower := dbkeys.NamespacePrefix(dbkeys.NsDelayed)
	err := s.scanOnce(lower, dbkeys.PrefixEnd(lower), func(k, _ []byte) (bool, error) {
		vis, qn, id, err := dbkeys.DecodeDelayedKey(k)
		if err != nil {
			return false, corrupt("open", k, err)
		}
		q := s.mu.queues[qn]
		if q == nil {
			return false, fmt.Errorf("rocksstore: open: %w: delayed entry %x of unknown queue %q", storage.ErrCorrupt, k, qn)
		}
		q.delayed[id] = vis
		s.delayed.push(timed{at: vis, token: id, q: q})
		return true, nil
	})
	if err != nil {
		return err
	}
	lower = dbkeys.NamespacePrefix(dbkeys.NsLeases)
	err = s.scanOnce(lower, dbkeys.PrefixEnd(lower), func(k, v []byte) (bool, error) {
		token, err := dbkeys.DecodeLeaseKey(k)
		if err != nil {
			return false, corrupt("open", k, err)
		}
		rec, err := dbkeys.DecodeLease(v)
		if err != nil {
			return false, corrupt("open", k, err)
		}
		q := s.mu.queues[rec.Queue]
		if q == nil {
			return false, fmt.Errorf("rocksstore: open: %w: lease %x of unknown queue %q", storage.ErrCorrupt, token, rec.Queue)
		}
		l := &leaseState{token: token, q: q, exp: rec.ExpiresAt, ids: make([]storage.ItemID, len(rec.IDs)), aheadMark: rec.Ahead, unconfirmed: rec.Ahead}
		for i, id := range rec.IDs {
			l.ids[i] = id
			s.inflight[id] = l
			s.ids.seen = max(s.ids.seen, dbkeys.IDSeq(id)+1)
		}
		s.leases[token] = l
		q.leases[token] = l
		s.expiry.push(timed{at: l.exp, token: token})
		return true, nil
	})
	if err != nil {
		return err
	}
	// Inflight items: which payloads are external (ack deletes them).
	lower = dbkeys.NamespacePrefix(dbkeys.NsInProgress)
	var latest int64
	err = s.scanOnce(lower, dbkeys.PrefixEnd(lower), func(k, v []byte) (bool, error) {
		_, id, err := dbkeys.DecodeInProgressKey(k)
		if err != nil {
			return false, corrupt("open", k, err)
		}
		rec, err := dbkeys.DecodeItem(v)
		if err != nil {
			return false, corrupt("open", k, err)
		}
		if l := s.inflight[id]; l != nil && rec.PayloadExternal {
			if l.ext == nil {
				l.ext = make(map[storage.ItemID]bool)
			}
			l.ext[id] = true
		}
		if !rec.Delayed {
			latest = max(latest, rec.VisibleAt) // ready when claimed
		}
		return true, nil
	})
	if err != nil {
		return err
	}
	for _, q := range s.mu.queues {
		latest = max(latest, q.latestReady())
	}
	s.latest.Store(latest)
	return nil
}

// latestReady returns the latest visible_at of q's ready items (not
// delayed ones), 0 when it has none, as rebuild left q: each priority's
// entries in one sorted run, delayed items (q.delayed) among them.
func (q *queueState) latestReady() int64 {
	var latest int64
	for _, h := range q.ready.heaps {
		if h == nil {
			continue
		}
		for i := len(h.run) - 1; i >= h.off; i-- {
			if _, delayed := q.delayed[h.run[i].id]; !delayed {
				latest = max(latest, h.run[i].vis)
				break
			}
		}
	}
	return latest
}

// rebuildReady loads q's serve order from its visibility entries. They
// come in key order (priority, visible_at, id), so each priority's entries
// are its readyHeap's sorted run as they come.
func (s *Store) rebuildReady(q *queueState) error {
	prefix := dbkeys.VisibilityPrefix(q.name)
	n := len(prefix)
	// Entries arrive sorted (priority, visible_at, id). They go into one backing array sized from
	// the persisted counters (every available item has one entry), so a
	// large backlog is not copied by append's growth; each priority's
	// run is a capped window of it, so a later push reallocates that run
	// instead of overwriting the next one.
	all := make([]readyEntry, 0, max(0, q.counters.Ready+q.counters.Delayed))
	start, cur := 0, -1
	cut := func() {
		if cur >= 0 {
			q.ready.heaps[cur] = &readyHeap{run: all[start:len(all):len(all)]}
			q.ready.used[cur/64] |= 1 << (cur % 64)
		}
	}
	err := s.scanOnce(prefix, dbkeys.PrefixEnd(prefix), func(k, _ []byte) (bool, error) {
		prio, vis, id, err := dbkeys.DecodeVisibilitySuffix(k[n:])
		if err != nil {
			return false, corrupt("open", k, err)
		}
		if int(prio) != cur {
			cut()
			start, cur = len(all), int(prio)
		}
		all = append(all, readyEntry{vis: vis, id: id})
		q.ready.n++
		s.ids.seen = max(s.ids.seen, dbkeys.IDSeq(id)+1)
		return true, nil
	})
	cut()
	return err
}
