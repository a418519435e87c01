package check

import (
	"testing"
	"time"

	"github.com/leaseq/leaseq/storage"
)

// DESIGN.md invariant 1: every item id is in exactly one of available,
// in_progress, dlq, and ids are unique per node (FoundationDB mode:
// across the cluster). One id that is ready in queue "a" and dead in
// queue "b" (a dead-letter record written under the wrong queue, say) is
// a duplicate, with every index and counter consistent.
func TestRun_ItemIDInTwoQueuesIsADuplicate(t *testing.T) {
	t.Parallel()
	now := time.Date(2031, 3, 4, 5, 6, 7, 0, time.UTC)
	id := storage.ItemID{15: 7}
	f := &Facts{
		Queues: []string{"a", "b"},
		Items: []Item{
			{Queue: "a", ID: id, State: storage.StateReady, VisibleAt: now, Attempts: 1},
			{Queue: "b", ID: id, State: storage.StateDead, VisibleAt: now, Attempts: 5, DeathRecord: true},
		},
		Serve:    []ServeEntry{{Queue: "a", Priority: 0, VisibleAt: now, ID: id}},
		Counters: []Counters{{Queue: "a", Ready: 1}, {Queue: "b", Dead: 1}},
	}
	rep := Run(Layout{ServeIndexHoldsDelayed: true, DelayedIndexes: []string{"delayed"}}, f)
	if rep.OK() {
		t.Fatalf("item %s is ready in queue a and dead in queue b, yet Check reports no violation (want %s)", id, KindItemDuplicate)
	}
}
