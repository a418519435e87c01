// Package checktest helps the break-the-data tests of every backend: a
// scenario with an item in every state, written through the Store API, and
// assertions on the kinds Check reports. Only _test.go files import it (it
// cannot live in storagetest, which imports memstore, whose own tests use
// it).
package checktest

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/check"
)

// Scenario is what Build wrote: in queue Queue (max_attempts 1), a ready
// item with a dedup key and a payload large enough to live outside its
// record in every backend, a delayed item, two inflight items under one
// lease, and a dead item.
type Scenario struct {
	Queue    string
	Now      time.Time
	Ready    storage.ItemID // Priority 0, VisibleAt Now, DedupKey, BigPayload
	DedupKey string
	Delayed  storage.ItemID // Priority 2, VisibleAt Now + 1h
	Held     [2]storage.ItemID
	Lease    storage.LeaseID // holds Held, expires Now + 1m
	Dead     storage.ItemID
}

// base is the scenario's Now.
var base = time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)

// BigPayload is the payload of Scenario.Ready: over rocksstore's 4 KiB
// inline limit and fdbsync's 16 KiB, and two fdbsync chunks.
var BigPayload = bytes.Repeat([]byte("payload "), 100_000/8)

// Build writes a Scenario into s through its API and requires Check to
// find it clean, with 5 items and 1 lease.
func Build(t testing.TB, s storage.Store) Scenario {
	t.Helper()
	ctx := context.Background()
	sc := Scenario{Queue: "q", Now: base, DedupKey: "once"}
	cfg := storage.DefaultQueueConfig()
	cfg.MaxAttempts = 1
	require.NoError(t, s.SetQueueConfig(ctx, sc.Queue, cfg))
	res, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: sc.Queue, Now: sc.Now, Items: []storage.EnqueueItem{
		{Payload: []byte("dies")}, {Payload: []byte("held 1")}, {Payload: []byte("held 2")},
		{Payload: BigPayload, DedupKey: sc.DedupKey}, {Payload: []byte("later"), Delay: time.Hour, Priority: 2},
	}})
	require.NoError(t, err)
	for _, r := range res {
		require.Equal(t, storage.CodeOK, r.Code, r.Err)
	}
	sc.Dead, sc.Held, sc.Ready, sc.Delayed = res[0].ID, [2]storage.ItemID{res[1].ID, res[2].ID}, res[3].ID, res[4].ID
	p, err := s.Poll(ctx, storage.PollParams{Queue: sc.Queue, Max: 1, Now: sc.Now})
	require.NoError(t, err)
	require.Equal(t, sc.Dead, p.Items[0].ID)
	codes, err := s.Nack(ctx, storage.NackParams{Queue: sc.Queue, Lease: p.Lease, IDs: []storage.ItemID{sc.Dead}, Reason: "no", Now: sc.Now})
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK}, codes)
	p, err = s.Poll(ctx, storage.PollParams{Queue: sc.Queue, Max: 2, Lease: time.Minute, Now: sc.Now})
	require.NoError(t, err)
	require.Len(t, p.Items, 2)
	require.ElementsMatch(t, sc.Held[:], []storage.ItemID{p.Items[0].ID, p.Items[1].ID})
	sc.Lease = p.Lease
	rep, err := s.Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK(), "before breaking anything: %v", rep.Violations)
	require.Equal(t, 5, rep.Items)
	require.Equal(t, 1, rep.Leases)
	return sc
}

// RequireKinds runs s.Check and requires the report to list exactly the
// kinds want (each at least once, no other), and returns it.
func RequireKinds(t testing.TB, s storage.Store, want ...storage.ViolationKind) storage.CheckReport {
	t.Helper()
	rep, err := s.Check(context.Background())
	require.NoError(t, err)
	want = slices.Clone(want)
	slices.Sort(want)
	want = slices.Compact(want)
	require.Equal(t, want, rep.Kinds(), "violations: %v", rep.Violations)
	require.Equal(t, len(rep.Violations), rep.Total)
	return rep
}

// requireEveryKind requires that each kind of storage/check is either
// tested (a break-the-data case of the backend reports it) or listed in
// cannot with the reason the backend's representation cannot hold that
// breakage; never both.
func requireEveryKind(t testing.TB, tested []storage.ViolationKind, cannot map[storage.ViolationKind]string) {
	t.Helper()
	for _, k := range check.Kinds {
		_, skip := cannot[k]
		has := slices.Contains(tested, k)
		require.True(t, has != skip, "kind %s: tested %v, listed as not representable %v (want exactly one)", k, has, skip)
	}
	for k := range cannot {
		require.Contains(t, check.Kinds, k)
	}
}

// Case is one way to break a backend's data, through the backend's own
// handle H (raw keys, or the model's structures).
type Case[H any] struct {
	Name string
	// Want are the kinds Check must then report, exactly: usually one;
	// more where the breakage cannot help breaking another rule too.
	Want  []storage.ViolationKind
	Break func(h H)
}

// Run runs each case as a parallel subtest on a fresh store from open:
// it builds the Scenario, breaks the data through handle's H, and requires
// exactly the case's kinds. Then it requires every kind of storage/check
// to be tested by some case or listed in cannot, with the reason the
// backend cannot hold that breakage.
func Run[H any](t *testing.T, cases []Case[H], cannot map[storage.ViolationKind]string,
	open func(t *testing.T) storage.Store, handle func(t *testing.T, s storage.Store, sc Scenario) H) {
	t.Helper()
	var tested []storage.ViolationKind
	for _, tc := range cases {
		tested = append(tested, tc.Want...)
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			s := open(t)
			tc.Break(handle(t, s, Build(t, s)))
			RequireKinds(t, s, tc.Want...)
		})
	}
	requireEveryKind(t, tested, cannot)
}
