package rocksstore

import (
	"context"

	"github.com/leaseq/leaseq/dbkeys"
)

// A queue's delete mark (dbkeys.DeletingKey -> dbkeys.Marker()):
// DeleteQueue writes it in an op of its own before the first chunk of the
// queue's dedup keys and deletes it with the queue's config (found by
// review, session 70: the mark was in memory only, so a crash after some
// chunks left, after the restart, a queue that took again, as new, items
// it had seen within its dedup window, and a delete half done).

// loadDeleting marks the queues whose delete a crash (or a failed write)
// cut short, for finishDeletes; a mark whose queue has no config is
// noted to be dropped there, so that a queue made later under its name
// is not taken for one being deleted. REQUIRES: load read the configs.
func (s *Store) loadDeleting() error {
	s.orphanMarks = nil
	p := dbkeys.DeletingPrefix()
	return s.scan(p, dbkeys.PrefixEnd(p), nil, func(k, v []byte) (bool, error) {
		name, err := dbkeys.DecodeDeletingKey(k)
		if err != nil {
			return false, corrupt("open: delete mark", k, err)
		}
		if err := dbkeys.DecodeMarker(v); err != nil {
			return false, corrupt("open: delete mark", k, err)
		}
		if q := s.mu.queues[name]; q != nil {
			q.deleting = true
		} else {
			s.orphanMarks = append(s.orphanMarks, name)
		}
		return true, nil
	})
}

// finishDeletes finishes the deletes of the queues loadDeleting marked:
// the user asked for them, and until they are done the queues refuse
// enqueues (storage.Store.DeleteQueue allows that while a delete runs),
// and those left have lost some of their dedup keys. A delete that fails
// here leaves its queue marked, refusing enqueues; DeleteQueue finishes
// it. REQUIRES: s.life held shared (enter).
func (s *Store) finishDeletes() {
	var marked []*queueState
	for _, name := range s.queueNames() {
		if q := s.queue(name); q != nil && q.deleting {
			marked = append(marked, q)
		}
	}
	if orphans := s.orphanMarks; len(orphans) > 0 {
		_, err := s.submit("", 0, func(o *opTx) error {
			for _, name := range orphans {
				if s.queue(name) == nil {
					o.del(dbkeys.DeletingKey(name))
				}
			}
			return nil
		})
		if err == nil {
			s.orphanMarks = nil
		}
		s.log.Warn("dropped delete marks of queues that do not exist", "queues", orphans, "err", err)
	}
	for _, q := range marked {
		if err := s.finishDelete(q); err != nil {
			s.log.Error("finishing the delete of a queue cut short failed; it refuses enqueues until deleted", "queue", q.name, "err", err)
			continue
		}
		s.log.Info("queue deleted: finished a delete cut short", "queue", q.name)
	}
}

// finishDelete drops the rest of marked queue q's dedup keys and removes
// it. q is empty: the mark is set only on an empty queue, and nothing
// enters it after.
func (s *Store) finishDelete(q *queueState) error {
	if err := s.dropDedupChunks(context.Background(), q); err != nil {
		return err
	}
	_, err := s.submit(q.name, 1, func(o *opTx) error {
		_, err := s.removeQueue(o, q)
		return err
	})
	if err == nil {
		s.corruptQ.Lock()
		delete(s.corruptQ.n, q.name)
		s.corruptQ.Unlock()
	}
	return err
}
