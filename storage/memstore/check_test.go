package memstore

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/check"
	"github.com/leaseq/leaseq/storage/check/checktest"
)

// memHandle is what a memstore case breaks.
type memHandle struct {
	s  *Store
	sc checktest.Scenario
}

// locked runs a break with the store's mutex held.
func locked(brk func(s *Store, sc checktest.Scenario)) func(memHandle) {
	return func(h memHandle) {
		h.s.mu.Lock()
		defer h.s.mu.Unlock()
		brk(h.s, h.sc)
	}
}

// memBreaks are the break-the-data cases of memstore: each reaches into
// the model's structures and names the kinds Check must report, exactly.
var memBreaks = []checktest.Case[memHandle]{
	{Name: "HeapPositionWrong", Want: []storage.ViolationKind{check.KindCorrupt}, Break: locked(func(s *Store, sc checktest.Scenario) {
		s.mu.queues["q"].items[sc.Ready].availIdx = 7
	})},
	{Name: "ItemInNoLocation", Want: []storage.ViolationKind{check.KindItemNoState}, Break: locked(func(s *Store, sc checktest.Scenario) {
		q := s.mu.queues["q"]
		q.items[sc.Dead].loc = 0
		q.st.Dead--
	})},
	{Name: "ReadyItemPointsAtALease", Want: []storage.ViolationKind{check.KindItemRecordState}, Break: locked(func(s *Store, sc checktest.Scenario) {
		s.mu.queues["q"].items[sc.Ready].lease = s.mu.leases[sc.Lease]
	})},
	{Name: "ReadyItemMissingFromItsHeap", Want: []storage.ViolationKind{check.KindServeEntryCount}, Break: locked(func(s *Store, sc checktest.Scenario) {
		q := s.mu.queues["q"]
		e := q.items[sc.Ready]
		q.avail[e.item.Priority].remove(e.availIdx)
	})},
	{Name: "InflightItemInAServeHeap", Want: []storage.ViolationKind{check.KindServeEntryOrphan}, Break: locked(func(s *Store, sc checktest.Scenario) {
		q := s.mu.queues["q"]
		q.avail[0].push(q.items[sc.Held[0]])
	})},
	{Name: "ReadyItemInAnotherPrioritysHeap", Want: []storage.ViolationKind{check.KindServeEntryMismatch}, Break: locked(func(s *Store, sc checktest.Scenario) {
		q := s.mu.queues["q"]
		e := q.items[sc.Ready]
		q.avail[e.item.Priority].remove(e.availIdx)
		q.avail[9] = newHeap(lessVisible, func(e *entry, i int) { e.availIdx = i })
		q.avail[9].push(e)
	})},
	{Name: "DelayedItemMissingFromTheDelayedHeap", Want: []storage.ViolationKind{check.KindDelayedEntryCount}, Break: locked(func(s *Store, sc checktest.Scenario) {
		s.mu.delayed.remove(s.mu.queues["q"].items[sc.Delayed].delayIdx)
	})},
	{Name: "ReadyItemInTheDelayedHeap", Want: []storage.ViolationKind{check.KindDelayedEntryOrphan}, Break: locked(func(s *Store, sc checktest.Scenario) {
		s.mu.delayed.push(s.mu.queues["q"].items[sc.Ready])
	})},
	{Name: "InflightItemDroppedFromItsLease", Want: []storage.ViolationKind{check.KindInflightListing}, Break: locked(func(s *Store, sc checktest.Scenario) {
		delete(s.mu.leases[sc.Lease].items, sc.Held[1])
	})},
	{Name: "LeaseWithoutItems", Want: []storage.ViolationKind{check.KindLeaseEmpty}, Break: locked(func(s *Store, sc checktest.Scenario) {
		q := s.mu.queues["q"]
		l := &lease{id: storage.LeaseID{1}, q: q, expires: sc.Now.Add(time.Minute), items: map[storage.ItemID]*entry{}}
		s.mu.leases[l.id] = l
		s.mu.leaseHeap.push(l)
		q.st.Leases++
	})},
	{Name: "LeaseListsAReadyItem", Want: []storage.ViolationKind{check.KindLeaseItemMissing}, Break: locked(func(s *Store, sc checktest.Scenario) {
		s.mu.leases[sc.Lease].items[sc.Ready] = s.mu.queues["q"].items[sc.Ready]
	})},
	{Name: "LeaseListsAnotherLeasesItem", Want: []storage.ViolationKind{check.KindLeaseItemForeign}, Break: locked(func(s *Store, sc checktest.Scenario) {
		q := s.mu.queues["q"]
		e := q.items[sc.Held[1]]
		l := &lease{id: storage.LeaseID{1}, q: q, expires: sc.Now.Add(time.Minute), items: map[storage.ItemID]*entry{sc.Held[1]: e}}
		s.mu.leases[l.id] = l
		s.mu.leaseHeap.push(l)
		q.st.Leases++
		e.lease = l // the first lease still lists it
	})},
	{Name: "LeaseMissingFromTheExpiryHeap", Want: []storage.ViolationKind{check.KindLeaseExpiryCount}, Break: locked(func(s *Store, sc checktest.Scenario) {
		s.mu.leaseHeap.remove(s.mu.leases[sc.Lease].idx)
	})},
	{Name: "ExpiryHeapHoldsAnUnknownLease", Want: []storage.ViolationKind{check.KindLeaseExpiryOrphan}, Break: locked(func(s *Store, sc checktest.Scenario) {
		s.mu.leaseHeap.push(&lease{id: storage.LeaseID{1}, q: s.mu.queues["q"], expires: sc.Now})
	})},
	{Name: "ReadyCounter", Want: []storage.ViolationKind{check.KindCounterMismatch}, Break: locked(func(s *Store, _ checktest.Scenario) {
		s.mu.queues["q"].st.Ready++
	})},
	{Name: "LeasesCounter", Want: []storage.ViolationKind{check.KindCounterMismatch}, Break: locked(func(s *Store, _ checktest.Scenario) {
		s.mu.queues["q"].st.Leases--
	})},
	{Name: "AttemptsAboveTheItemsMax", Want: []storage.ViolationKind{check.KindAttemptsExceeded}, Break: locked(func(s *Store, sc checktest.Scenario) {
		e := s.mu.queues["q"].items[sc.Held[0]]
		e.item.MaxAttempts, e.item.Attempts = 1, 2
	})},
	{Name: "DedupKeyMissingFromTheExpiryHeap", Want: []storage.ViolationKind{check.KindDedupExpiryCount}, Break: locked(func(s *Store, sc checktest.Scenario) {
		s.mu.dedupHeap.remove(s.mu.queues["q"].dedup[sc.DedupKey].idx)
	})},
	{Name: "ExpiryHeapHoldsAnUnknownDedupKey", Want: []storage.ViolationKind{check.KindDedupExpiryOrphan}, Break: locked(func(s *Store, sc checktest.Scenario) {
		s.mu.dedupHeap.push(&dedupEntry{q: s.mu.queues["q"], key: "other", expires: sc.Now})
	})},
}

// memCannot are the kinds memstore's structures cannot hold.
var memCannot = map[storage.ViolationKind]string{
	check.KindUnknownQueue:         "items, leases' items, dedup keys and counters live inside their queue",
	check.KindItemDuplicate:        "an item is one entry of one map with one location",
	check.KindDelayedEntryMismatch: "the delayed heap holds the item's own entry, so it reads the item's VisibleAt",
	check.KindLeaseExpiryMismatch:  "the expiry heap holds the lease itself",
	check.KindDedupExpiryMismatch:  "the expiry heap holds the dedup entry itself",
	check.KindPayloadMissing:       "payloads live in the item",
	check.KindPayloadOrphan:        "payloads live in the item",
	check.KindPayloadPending:       "payloads live in the item",
}

// TestCheck_FindsBrokenInvariants breaks the model's structures by hand,
// one way per case, and requires Check to report exactly the kinds the
// case names, so a passing Check in the suites means something.
func TestCheck_FindsBrokenInvariants(t *testing.T) {
	t.Parallel()
	checktest.Run(t, memBreaks, memCannot,
		func(t *testing.T) storage.Store {
			s := New(Options{})
			t.Cleanup(func() { require.NoError(t, s.Close()) })
			return s
		},
		func(_ *testing.T, s storage.Store, sc checktest.Scenario) memHandle { return memHandle{s.(*Store), sc} })
}
