package check

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

var t0 = time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)

func id(n byte) storage.ItemID     { return storage.ItemID{15: n} }
func token(n byte) storage.LeaseID { return storage.LeaseID{0: 0xee, 15: n} }

// Item ids of the clean fact set.
var (
	idReady    = id(1) // ready, payload out of record
	idDelayed  = id(2)
	idInflight = id(3) // held by lease 1 with idHeld
	idHeld     = id(4)
	idDead     = id(5)
	lease1     = token(1)
)

// rocksLayout is the layout of rocksstore and memstore; fdbLayout that of
// fdbsync.
var (
	rocksLayout = Layout{ServeIndexHoldsDelayed: true, DelayedIndexes: []string{"delayed"}}
	fdbLayout   = Layout{DelayedIndexes: []string{"d", "D"}}
)

// clean returns a consistent fact set for l: one queue with an item in
// every state, a lease, a dedup key and an out-of-record payload, plus an
// empty queue without a counters record.
func clean(l Layout) *Facts {
	f := &Facts{
		Queues: []string{"q", "empty"},
		Items: []Item{
			{Queue: "q", ID: idReady, State: storage.StateReady, Priority: 1, VisibleAt: t0, Payload: "P1", PayloadParts: 2},
			{Queue: "q", ID: idDelayed, State: storage.StateDelayed, Priority: 2, VisibleAt: t0.Add(time.Hour), Attempts: 1},
			{Queue: "q", ID: idInflight, State: storage.StateInflight, VisibleAt: t0, Attempts: 1, MaxAttempts: 3, Lease: lease1},
			{Queue: "q", ID: idHeld, State: storage.StateInflight, VisibleAt: t0, Attempts: 2, Lease: lease1},
			{Queue: "q", ID: idDead, State: storage.StateDead, VisibleAt: t0, Attempts: 5, MaxAttempts: 2, DeathRecord: true},
		},
		Serve:         []ServeEntry{{Queue: "q", Priority: 1, VisibleAt: t0, ID: idReady}},
		Leases:        []Lease{{Token: lease1, Queue: "q", ExpiresAt: t0.Add(time.Minute), IDs: []storage.ItemID{idInflight, idHeld}}},
		LeaseExpiries: []LeaseExpiry{{Token: lease1, ExpiresAt: t0.Add(time.Minute)}},
		Dedups:        []Dedup{{Queue: "q", Key: "k", ID: idReady, ExpiresAt: t0.Add(5 * time.Minute)}},
		DedupExpiries: []DedupExpiry{{Queue: "q", Key: "k", ExpiresAt: t0.Add(5 * time.Minute)}},
		Counters:      []Counters{{Queue: "q", Ready: 1, Delayed: 1, Inflight: 2, Dead: 1, Leases: 1}},
		Payloads:      []Payload{{Ref: "P1", Parts: 2}, {Ref: "P2", Parts: 1, Pending: true}},
	}
	if l.ServeIndexHoldsDelayed {
		f.Serve = append(f.Serve, ServeEntry{Queue: "q", Priority: 2, VisibleAt: t0.Add(time.Hour), ID: idDelayed})
	}
	for _, idx := range l.DelayedIndexes {
		f.Delayed = append(f.Delayed, DelayedEntry{Index: idx, Queue: "q", ID: idDelayed, VisibleAt: t0.Add(time.Hour), Priority: 2, HasPriority: idx == "d"})
	}
	return f
}

func item(f *Facts, id storage.ItemID) *Item {
	for i := range f.Items {
		if f.Items[i].ID == id {
			return &f.Items[i]
		}
	}
	panic("no such item")
}

func TestRun_Clean(t *testing.T) {
	t.Parallel()
	for name, l := range map[string]Layout{"rocks": rocksLayout, "fdb": fdbLayout} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rep := Run(l, clean(l))
			require.True(t, rep.OK(), "%v", rep.Violations)
			require.Zero(t, rep.Total)
			require.Equal(t, 5, rep.Items)
			require.Equal(t, 1, rep.Leases)
		})
	}
	rep := Run(Layout{}, &Facts{})
	require.True(t, rep.OK())
	require.Zero(t, rep.Items)
}

// ruleCase breaks the clean fact set of its layout one way.
type ruleCase struct {
	name   string
	layout Layout // zero: rocksLayout
	brk    func(f *Facts)
	want   []storage.ViolationKind // exactly these kinds; nil: still clean
}

var other = token(2)

var ruleCases = []ruleCase{
	{"Corrupt", Layout{}, func(f *Facts) { f.Corruptf("available: bad key %x", []byte{1}) }, []storage.ViolationKind{KindCorrupt}},
	{"UnknownQueueOfItem", Layout{}, func(f *Facts) {
		f.Items = append(f.Items, Item{Queue: "gone", ID: id(9), State: storage.StateDead, DeathRecord: true})
	}, []storage.ViolationKind{KindUnknownQueue}},
	{"UnknownQueueOfLease", Layout{}, func(f *Facts) {
		f.Items = append(f.Items, Item{Queue: "gone", ID: id(9), State: storage.StateInflight, Lease: other})
		f.Leases = append(f.Leases, Lease{Token: other, Queue: "gone", ExpiresAt: t0, IDs: []storage.ItemID{id(9)}})
		f.LeaseExpiries = append(f.LeaseExpiries, LeaseExpiry{Token: other, ExpiresAt: t0})
	}, []storage.ViolationKind{KindUnknownQueue}},
	{"UnknownQueueOfDedupKey", Layout{}, func(f *Facts) {
		f.Dedups = append(f.Dedups, Dedup{Queue: "gone", Key: "k", ExpiresAt: t0})
		f.DedupExpiries = append(f.DedupExpiries, DedupExpiry{Queue: "gone", Key: "k", ExpiresAt: t0})
	}, []storage.ViolationKind{KindUnknownQueue}},
	{"UnknownQueueOfCounters", Layout{}, func(f *Facts) {
		f.Counters = append(f.Counters, Counters{Queue: "gone", Ready: 3})
	}, []storage.ViolationKind{KindUnknownQueue}},
	{"TwoCountersRecords", Layout{}, func(f *Facts) { f.Counters = append(f.Counters, f.Counters[0]) }, []storage.ViolationKind{KindCorrupt}},

	{"ItemInTwoStates", Layout{}, func(f *Facts) {
		f.Items = append(f.Items, Item{Queue: "q", ID: idReady, State: storage.StateDead, DeathRecord: true})
	}, []storage.ViolationKind{KindItemDuplicate}},
	{"ItemInNoState", Layout{}, func(f *Facts) {
		item(f, idDead).State = storage.StateUnknown
		f.Counters[0].Dead = 0
	}, []storage.ViolationKind{KindItemNoState}},
	{"ReadyItemWithLeaseToken", Layout{}, func(f *Facts) { item(f, idReady).Lease = other }, []storage.ViolationKind{KindItemRecordState}},
	{"DeadItemWithoutDeathRecord", Layout{}, func(f *Facts) { item(f, idDead).DeathRecord = false }, []storage.ViolationKind{KindItemRecordState}},
	{"DelayedItemWithDeathRecord", Layout{}, func(f *Facts) { item(f, idDelayed).DeathRecord = true }, []storage.ViolationKind{KindItemRecordState}},
	{"InflightItemWithoutToken", Layout{}, func(f *Facts) { item(f, idHeld).Lease = storage.LeaseID{} },
		// The lease still lists it, so it is also foreign to the lease
		// and listed by no lease holding its (zero) token.
		[]storage.ViolationKind{KindItemRecordState, KindLeaseItemForeign, KindInflightListing}},

	{"ServeEntryMissing", Layout{}, func(f *Facts) { f.Serve = f.Serve[1:] }, []storage.ViolationKind{KindServeEntryCount}},
	{"ServeEntryTwice", Layout{}, func(f *Facts) { f.Serve = append(f.Serve, f.Serve[1]) }, []storage.ViolationKind{KindServeEntryCount}},
	{"ServeEntryOfInflightItem", Layout{}, func(f *Facts) {
		f.Serve = append(f.Serve, ServeEntry{Queue: "q", VisibleAt: t0, ID: idInflight})
	}, []storage.ViolationKind{KindServeEntryOrphan}},
	{"ServeEntryOfNoItem", Layout{}, func(f *Facts) {
		f.Serve = append(f.Serve, ServeEntry{Queue: "q", VisibleAt: t0, ID: id(99)})
	}, []storage.ViolationKind{KindServeEntryOrphan}},
	{"ServeEntryOfDelayedItemWhereOnlyReadyAreServed", fdbLayout, func(f *Facts) {
		f.Serve = append(f.Serve, ServeEntry{Queue: "q", Priority: 2, VisibleAt: t0.Add(time.Hour), ID: idDelayed})
	}, []storage.ViolationKind{KindServeEntryOrphan}},
	{"ServeEntryWrongPriority", Layout{}, func(f *Facts) { f.Serve[0].Priority = 7 }, []storage.ViolationKind{KindServeEntryMismatch}},
	{"ServeEntryWrongVisibleAt", fdbLayout, func(f *Facts) { f.Serve[0].VisibleAt = t0.Add(1) }, []storage.ViolationKind{KindServeEntryMismatch}},

	{"DelayedEntryMissing", Layout{}, func(f *Facts) { f.Delayed = nil }, []storage.ViolationKind{KindDelayedEntryCount}},
	{"DelayedEntryMissingFromOneIndex", fdbLayout, func(f *Facts) { f.Delayed = f.Delayed[:1] }, []storage.ViolationKind{KindDelayedEntryCount}},
	{"DelayedEntryTwice", fdbLayout, func(f *Facts) { f.Delayed = append(f.Delayed, f.Delayed[1]) }, []storage.ViolationKind{KindDelayedEntryCount}},
	{"DelayedEntryOfReadyItem", Layout{}, func(f *Facts) {
		f.Delayed = append(f.Delayed, DelayedEntry{Index: "delayed", Queue: "q", ID: idReady, VisibleAt: t0})
	}, []storage.ViolationKind{KindDelayedEntryOrphan}},
	{"DelayedEntryWrongVisibleAt", Layout{}, func(f *Facts) { f.Delayed[0].VisibleAt = t0 }, []storage.ViolationKind{KindDelayedEntryMismatch}},
	{"DelayedEntryWrongPriority", fdbLayout, func(f *Facts) {
		for i := range f.Delayed {
			f.Delayed[i].Priority = 9 // only index d keeps it
		}
	}, []storage.ViolationKind{KindDelayedEntryMismatch}},
	{"DelayedEntryInAnIndexTheLayoutLacks", Layout{}, func(f *Facts) {
		f.Delayed = append(f.Delayed, DelayedEntry{Index: "nope", Queue: "q", ID: idDelayed, VisibleAt: t0.Add(time.Hour)})
	}, []storage.ViolationKind{KindCorrupt}},

	{"InflightItemListedTwice", Layout{}, func(f *Facts) {
		f.Leases[0].IDs = append(f.Leases[0].IDs, idHeld)
	}, []storage.ViolationKind{KindInflightListing}},
	{"InflightItemNotListed", Layout{}, func(f *Facts) { f.Leases[0].IDs = f.Leases[0].IDs[:1] }, []storage.ViolationKind{KindInflightListing}},
	{"LeaseWithoutItems", Layout{}, func(f *Facts) {
		f.Leases = append(f.Leases, Lease{Token: other, Queue: "q", ExpiresAt: t0})
		f.LeaseExpiries = append(f.LeaseExpiries, LeaseExpiry{Token: other, ExpiresAt: t0})
		f.Counters[0].Leases++
	}, []storage.ViolationKind{KindLeaseEmpty}},
	{"LeaseListsReadyItem", Layout{}, func(f *Facts) { f.Leases[0].IDs = append(f.Leases[0].IDs, idReady) }, []storage.ViolationKind{KindLeaseItemMissing}},
	{"LeaseListsNoItem", Layout{}, func(f *Facts) { f.Leases[0].IDs = append(f.Leases[0].IDs, id(99)) }, []storage.ViolationKind{KindLeaseItemMissing}},
	{"LeaseListsItemOfAnotherLease", Layout{}, func(f *Facts) {
		f.Items = append(f.Items, Item{Queue: "q", ID: id(9), State: storage.StateInflight, Lease: other})
		f.Leases = append(f.Leases, Lease{Token: other, Queue: "q", ExpiresAt: t0, IDs: []storage.ItemID{id(9)}})
		f.LeaseExpiries = append(f.LeaseExpiries, LeaseExpiry{Token: other, ExpiresAt: t0})
		f.Counters[0].Inflight++
		f.Counters[0].Leases++
		f.Leases[0].IDs = append(f.Leases[0].IDs, id(9))
	}, []storage.ViolationKind{KindLeaseItemForeign}},
	{"LeaseWithoutExpiryEntry", Layout{}, func(f *Facts) { f.LeaseExpiries = nil }, []storage.ViolationKind{KindLeaseExpiryCount}},
	{"LeaseWithTwoExpiryEntries", Layout{}, func(f *Facts) {
		f.LeaseExpiries = append(f.LeaseExpiries, LeaseExpiry{Token: lease1, ExpiresAt: t0})
	}, []storage.ViolationKind{KindLeaseExpiryCount, KindLeaseExpiryMismatch}},
	{"ExpiryEntryOfNoLease", Layout{}, func(f *Facts) {
		f.LeaseExpiries = append(f.LeaseExpiries, LeaseExpiry{Token: other, ExpiresAt: t0})
	}, []storage.ViolationKind{KindLeaseExpiryOrphan}},
	{"ExpiryEntryAtTheWrongTime", Layout{}, func(f *Facts) { f.LeaseExpiries[0].ExpiresAt = t0 }, []storage.ViolationKind{KindLeaseExpiryMismatch}},
	{"TwoLeaseRecords", Layout{}, func(f *Facts) { f.Leases = append(f.Leases, f.Leases[0]) },
		// The second record is not used, but the leases counter counts
		// records as the backends do.
		[]storage.ViolationKind{KindCorrupt, KindCounterMismatch}},

	{"ReadyCounter", Layout{}, func(f *Facts) { f.Counters[0].Ready++ }, []storage.ViolationKind{KindCounterMismatch}},
	{"LeasesCounter", Layout{}, func(f *Facts) { f.Counters[0].Leases = 0 }, []storage.ViolationKind{KindCounterMismatch}},
	{"MissingCountersRecord", Layout{}, func(f *Facts) { f.Counters = nil }, []storage.ViolationKind{KindCounterMismatch}},
	{"CountersOfAnEmptyQueue", Layout{}, func(f *Facts) {
		f.Counters = append(f.Counters, Counters{Queue: "empty", Dead: 1})
	}, []storage.ViolationKind{KindCounterMismatch}},

	{"TooManyAttempts", Layout{}, func(f *Facts) { item(f, idInflight).Attempts = 4 }, []storage.ViolationKind{KindAttemptsExceeded}},
	{"AttemptsOverTheQueueMaxAreNotChecked", Layout{}, func(f *Facts) { item(f, idHeld).Attempts = 1000 }, nil},
	{"DeadItemOverItsMax", Layout{}, func(f *Facts) { item(f, idDead).Attempts = 1000 }, nil},

	{"DedupKeyWithoutExpiryEntry", Layout{}, func(f *Facts) { f.DedupExpiries = nil }, []storage.ViolationKind{KindDedupExpiryCount}},
	{"DedupExpiryEntryOfNoKey", Layout{}, func(f *Facts) { f.Dedups = nil }, []storage.ViolationKind{KindDedupExpiryOrphan}},
	{"DedupExpiryEntryAtTheWrongTime", Layout{}, func(f *Facts) { f.DedupExpiries[0].ExpiresAt = t0 }, []storage.ViolationKind{KindDedupExpiryMismatch}},
	{"StaleDedupExpiryEntry", Layout{}, func(f *Facts) {
		f.DedupExpiries = append(f.DedupExpiries, DedupExpiry{Queue: "q", Key: "k", ExpiresAt: t0})
	}, []storage.ViolationKind{KindDedupExpiryCount, KindDedupExpiryMismatch}},
	{"TwoDedupRecords", Layout{}, func(f *Facts) { f.Dedups = append(f.Dedups, f.Dedups[0]) }, []storage.ViolationKind{KindCorrupt}},

	{"PayloadMissing", Layout{}, func(f *Facts) { f.Payloads = f.Payloads[1:] }, []storage.ViolationKind{KindPayloadMissing}},
	{"PayloadPartMissing", Layout{}, func(f *Facts) { f.Payloads[0].Parts = 1 }, []storage.ViolationKind{KindPayloadMissing}},
	{"PayloadOfNoItem", Layout{}, func(f *Facts) { f.Payloads[1].Pending = false }, []storage.ViolationKind{KindPayloadOrphan}},
	{"PayloadStillPending", Layout{}, func(f *Facts) { f.Payloads[0].Pending = true }, []storage.ViolationKind{KindPayloadPending}},
	{"PayloadListedTwice", Layout{}, func(f *Facts) { f.Payloads = append(f.Payloads, f.Payloads[0]) }, []storage.ViolationKind{KindCorrupt}},
}

// TestRun_Rules runs every ruleCase and requires exactly its kinds.
func TestRun_Rules(t *testing.T) {
	t.Parallel()
	for _, tc := range ruleCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := tc.layout
			if l.DelayedIndexes == nil {
				l = rocksLayout
			}
			f := clean(l)
			tc.brk(f)
			rep := Run(l, f)
			got := rep.Kinds()
			want := slices.Clone(tc.want)
			slices.Sort(want)
			require.Equal(t, want, got, "%v", rep.Violations)
			require.Equal(t, len(rep.Violations), rep.Total)
			for _, v := range rep.Violations {
				if n := Invariant(v.Kind); n > 0 {
					require.True(t, strings.HasPrefix(v.Msg, fmt.Sprintf("invariant %d: ", n)), v.Msg)
				}
				require.True(t, strings.HasSuffix(v.String(), "["+string(v.Kind)+"]"), v.String())
			}
		})
	}
}

// TestRun_EveryKindIsTested: some ruleCase produces each kind.
func TestRun_EveryKindIsTested(t *testing.T) {
	t.Parallel()
	covered := map[storage.ViolationKind]bool{}
	for _, tc := range ruleCases {
		for _, k := range tc.want {
			covered[k] = true
		}
	}
	for _, k := range Kinds {
		require.True(t, covered[k], "no ruleCase produces %s", k)
	}
	require.Len(t, covered, len(Kinds), "a ruleCase wants a kind missing from Kinds")
	require.Len(t, Kinds, len(slices.Compact(slices.Sorted(slices.Values(Kinds)))), "Kinds has duplicates")
}

func TestRun_CapKeepsTheTotal(t *testing.T) {
	t.Parallel()
	f := clean(rocksLayout)
	for i := range MaxViolations + 500 {
		f.Corruptf("bad key %d", i)
	}
	f.Counters[0].Ready++ // one more, of another kind, past the cap
	rep := Run(rocksLayout, f)
	require.False(t, rep.OK())
	require.Equal(t, MaxViolations+501, rep.Total)
	require.Len(t, rep.Violations, MaxViolations)
	require.Equal(t, "bad key 0", rep.Violations[0].Msg, "the adapter's violations come first, in order")
	require.Equal(t, []storage.ViolationKind{KindCorrupt}, rep.Kinds())
}

// TestRun_StableOrder: the report does not depend on the order of the
// facts, so two backends (or two runs) can be compared line by line.
func TestRun_StableOrder(t *testing.T) {
	t.Parallel()
	broken := func() *Facts {
		f := clean(rocksLayout)
		f.Serve = nil
		f.Delayed = nil
		f.LeaseExpiries = nil
		f.DedupExpiries = nil
		f.Counters[0].Dead = 9
		f.Items = append(f.Items, Item{Queue: "q", ID: id(40), State: storage.StateReady}, Item{Queue: "q", ID: id(41), State: storage.StateReady})
		return f
	}
	want := Run(rocksLayout, broken())
	require.Greater(t, want.Total, 5)
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		f := broken()
		rng.Shuffle(len(f.Items), func(i, j int) { f.Items[i], f.Items[j] = f.Items[j], f.Items[i] })
		require.Equal(t, want, Run(rocksLayout, f))
	}
}
