package rocksstore

import "fmt"

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
