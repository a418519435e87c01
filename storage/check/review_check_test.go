package check

// Review (session 74): the rules keep queues apart by their whole name, so
// queues whose names are prefixes of each other check clean together, and
// a record filed under the wrong one of them is reported.

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

var reviewQueues = []string{"a", "a.b", "a.b.c", "a-", "ab", "b"}

// reviewFacts: every queue of reviewQueues holds a ready item at
// priority 255 with a dedup key, a delayed item, two inflight items under
// one lease, and a dead item; item i*10+k and lease 100+i belong to queue
// i. Instants include the zero time and ones before 1970.
func reviewFacts(l Layout) *Facts {
	f := &Facts{}
	for i, q := range reviewQueues {
		n := byte(i * 10)
		tok := token(byte(100 + i))
		vis := []time.Time{{}, time.Unix(0, -1).UTC(), t0}[i%3]
		f.Queues = append(f.Queues, q)
		f.Items = append(f.Items,
			Item{Queue: q, ID: id(n + 1), State: storage.StateReady, Priority: 255, VisibleAt: vis},
			Item{Queue: q, ID: id(n + 2), State: storage.StateDelayed, VisibleAt: t0.Add(time.Hour)},
			Item{Queue: q, ID: id(n + 3), State: storage.StateInflight, VisibleAt: vis, Attempts: 1, MaxAttempts: 1, Lease: tok},
			Item{Queue: q, ID: id(n + 4), State: storage.StateInflight, VisibleAt: vis, Attempts: 1, Lease: tok},
			Item{Queue: q, ID: id(n + 5), State: storage.StateDead, VisibleAt: vis, Attempts: 3, MaxAttempts: 1, DeathRecord: true},
		)
		f.Serve = append(f.Serve, ServeEntry{Queue: q, Priority: 255, VisibleAt: vis, ID: id(n + 1)})
		if l.ServeIndexHoldsDelayed {
			f.Serve = append(f.Serve, ServeEntry{Queue: q, VisibleAt: t0.Add(time.Hour), ID: id(n + 2)})
		}
		for _, idx := range l.DelayedIndexes {
			f.Delayed = append(f.Delayed, DelayedEntry{Index: idx, Queue: q, ID: id(n + 2), VisibleAt: t0.Add(time.Hour)})
		}
		exp := time.Unix(0, -int64(i)).UTC()
		f.Leases = append(f.Leases, Lease{Token: tok, Queue: q, ExpiresAt: exp, IDs: []storage.ItemID{id(n + 3), id(n + 4)}})
		f.LeaseExpiries = append(f.LeaseExpiries, LeaseExpiry{Token: tok, ExpiresAt: exp})
		// The same dedup key in every queue.
		f.Dedups = append(f.Dedups, Dedup{Queue: q, Key: "k", ID: id(n + 1), ExpiresAt: t0})
		f.DedupExpiries = append(f.DedupExpiries, DedupExpiry{Queue: q, Key: "k", ExpiresAt: t0})
		f.Counters = append(f.Counters, Counters{Queue: q, Ready: 1, Delayed: 1, Inflight: 2, Dead: 1, Leases: 1})
	}
	return f
}

func TestReviewCheck_PrefixQueuesCheckClean(t *testing.T) {
	t.Parallel()
	for name, l := range map[string]Layout{"rocks": rocksLayout, "fdb": fdbLayout} {
		rep := Run(l, reviewFacts(l))
		require.True(t, rep.OK(), "%s: %v", name, rep.Violations)
		require.Equal(t, 5*len(reviewQueues), rep.Items)
		require.Equal(t, len(reviewQueues), rep.Leases)
	}
}

// TestReviewCheck_RecordUnderAPrefixQueueIsReported: one record moved
// from queue "ab" (index 4) or "a.b" (index 1) to the queue whose name
// is its prefix, "a", is found.
func TestReviewCheck_RecordUnderAPrefixQueueIsReported(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		brk  func(f *Facts)
		want []storage.ViolationKind
	}{
		{"LeaseListsAnotherQueuesItem", func(f *Facts) {
			// Lease of "a" also lists item 43 of "ab".
			f.Leases[0].IDs = append(f.Leases[0].IDs, id(43))
		}, []storage.ViolationKind{KindLeaseItemMissing}},
		{"LeaseFiledUnderThePrefixQueue", func(f *Facts) {
			// Lease of "ab" says it is of "a": its items are not there,
			// and "ab"'s inflight items are listed by no lease.
			f.Leases[4].Queue = "a"
		}, []storage.ViolationKind{KindLeaseItemMissing, KindInflightListing, KindCounterMismatch}},
		{"ServeEntryUnderThePrefixQueue", func(f *Facts) {
			for i := range f.Serve {
				if f.Serve[i].ID == id(11) {
					f.Serve[i].Queue = "a"
				}
			}
		}, []storage.ViolationKind{KindServeEntryOrphan, KindServeEntryCount}},
		{"DelayedEntryUnderTheLongerQueue", func(f *Facts) {
			for i := range f.Delayed {
				if f.Delayed[i].ID == id(2) {
					f.Delayed[i].Queue = "a.b.c"
				}
			}
		}, []storage.ViolationKind{KindDelayedEntryOrphan, KindDelayedEntryCount}},
		{"ItemMovedToThePrefixQueue", func(f *Facts) {
			for i := range f.Items {
				if f.Items[i].ID == id(45) {
					f.Items[i].Queue = "a"
				}
			}
		}, []storage.ViolationKind{KindCounterMismatch}},
		{"DedupExpiryUnderThePrefixQueue", func(f *Facts) {
			f.DedupExpiries[4].Queue = "a"
		}, []storage.ViolationKind{KindDedupExpiryCount}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := reviewFacts(rocksLayout)
			tc.brk(f)
			rep := Run(rocksLayout, f)
			want := slices.Clone(tc.want)
			slices.Sort(want)
			require.Equal(t, want, rep.Kinds(), "%v", rep.Violations)
		})
	}
}
