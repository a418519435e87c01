package storagetest

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// testCase is one behaviour of the conformance suite.
type testCase struct {
	name string
	fn   func(t *testing.T, f *fixture)
}

// Run runs the conformance suite: one parallel subtest per rule of the
// storage contract, each on its own store from h.New, each ending with a
// Check that must report no violation. Stores must enforce h.Limits
// (storage.DefaultLimits when zero). When h.Reopen is set it also checks
// that everything survives a close and reopen.
func Run(t *testing.T, h Harness) {
	cases := conformanceCases()
	if h.Reopen != nil {
		cases = append(cases, reopenCases()...)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, newFixture(t, h))
		})
	}
}

func conformanceCases() []testCase {
	return []testCase{
		{"EnqueuedItemIsPolledWithItsMetadata", testEnqueuedItemIsPolledWithItsMetadata},
		{"EnqueueKeepsNoPayloadBuffer", testEnqueueKeepsNoPayloadBuffer},
		{"IDsIncreaseInEnqueueOrder", testIDsIncreaseInEnqueueOrder},
		{"ServeOrderIsPriorityThenVisibleAtThenID", testServeOrder},
		{"PollHonoursMax", testPollHonoursMax},
		{"EmptyPollIsNotAnError", testEmptyPollIsNotAnError},
		{"DelayedItemIsServedExactlyAtVisibleAt", testDelayedItemIsServedExactlyAtVisibleAt},
		{"AckedItemIsNeverRedelivered", testAckedItemIsNeverRedelivered},
		{"AckJustBeforeLeaseDeadlineSucceeds", testAckJustBeforeDeadline},
		{"AckAtLeaseDeadlineIsLeaseExpiredAndChangesNothing", testAckAtDeadline},
		{"SweepExpiresLeaseAtItsDeadlineNotBefore", testSweepAtDeadline},
		{"ExpiredLeaseIsRedelivered", testExpiredLeaseIsRedelivered},
		{"PollWithZeroLeaseUsesQueueDefault", testPollDefaultLease},
		{"DelayedItemCountsAsDelayedUntilSweepPromotesIt", testDelayedCountsUntilSweepPromotes},
		{"PolledDelayedItemLeavesTheDelayedCount", testPolledDelayedItemLeavesDelayedCount},
		{"StaleLeaseOnRedeliveredItemIsLeaseMismatch", testStaleLeaseAfterRedeliveryIsMismatch},
		{"StaleLeaseOnRequeuedItemIsLeaseExpired", testStaleLeaseOnRequeuedItemIsExpired},
		{"ForeignLeaseIsLeaseMismatchAndChangesNothing", testForeignLeaseIsMismatch},
		{"ForgedOrZeroLeaseIsRejected", testForgedLeaseIsRejected},
		{"AckedUnknownAndOtherQueueIDsAreNotFound", testNotFound},
		{"PartiallyBadAckBatchAppliesTheGoodIDs", testPartialAckBatch},
		{"ExtendSetsNewExpiry", testExtend},
		{"ExtendCanShortenALease", testExtendCanShorten},
		{"ExtendRejectsExpiredWrongQueueAndBadDuration", testExtendRejections},
		{"ExtendWithZeroDurationUsesQueueDefault", testExtendWithZeroUsesQueueDefault},
		{"NackWithDelayMakesItemDelayed", testNackWithDelay},
		{"NackWithZeroDelayMakesItemReadyAtOnce", testNackWithZeroDelayIsReadyAtOnce},
		{"NackDelayOutOfRangeIsInvalidArgument", testNackDelayOutOfRange},
		{"NackBackoffStaysWithinBounds", testNackBackoffBounds},
		{"UndeliveredNackTakesTheClaimBack", testUndeliveredNack},
		{"ItemIsDeadLetteredByNackAtMaxAttempts", testDeadLetterByNack},
		{"ItemIsDeadLetteredByExpiryAtMaxAttempts", testDeadLetterByExpiry},
		{"PerItemMaxAttemptsOverridesQueueConfig", testPerItemMaxAttempts},
		{"RedriveByIDsResetsAttemptsAndMakesReady", testRedriveByIDs},
		{"RedriveAllTakesDeadItemsInIDOrder", testRedriveAll},
		{"PurgeDeadDeletesDeadItems", testPurgeDead},
		{"DedupKeyWithinWindowReturnsFirstID", testDedupWithinWindow},
		{"DedupKeyAfterWindowMakesNewItem", testDedupAfterWindow},
		{"SweepDropsExpiredDedupKeys", testDedupKeyDroppedBySweep},
		{"DedupKeyRepeatedWithinOneBatch", testDedupWithinOneBatch},
		{"DedupWindowZeroDisablesDedup", testDedupWindowZeroDisablesDedup},
		{"DedupWindowChangeAppliesToKeysAlreadySeen", testDedupWindowChangeAppliesToKeysSeen},
		{"PurgeDropsAvailableAndInflightButKeepsDead", testPurge},
		{"DeleteQueueRefusesItemsUnlessForced", testDeleteQueueRefusesItemsUnlessForced},
		{"DeleteEmptyQueue", testDeleteEmptyQueue},
		{"DeleteQueueWithManyItems", testDeleteManyItems},
		{"StatsAfterEveryKindOfOperation", testStatsAfterEveryOperation},
		{"OldestReadyAgeCountsFromVisibleAt", testOldestReadyAge},
		{"QueuesAreListedInByteOrder", testQueues},
		{"PeekPagesInIDOrderWithoutLeasing", testPeekPaging},
		{"DeadListPagesInIDOrder", testDeadListPaging},
		{"QueueConfigDefaultsValidationAndEffect", testQueueConfigDefaultsAndValidation},
		{"BadQueueNamesAreInvalidArgument", testBadQueueNames},
		{"BatchAndRangeLimitsAreInvalidArgument", testBatchAndRangeLimits},
		{"PerItemLimitsRejectOnlyThatItem", testPerItemLimits},
		{"LongNackReasonIsTruncated", testReasonIsTruncated},
		{"SweepReportsNextDeadlineAndReadyQueues", testSweepNextAndReadyQueues},
		{"SweepHonoursLimitAndReportsMore", testSweepLimit},
		{"SweepLimitAppliesToEachKindOfWork", testSweepLimitPerKind},
		{"DeadlinesWrittenWithAnEarlierNowAreStillSwept", testDeadlinesBehindSweep},
		{"CallsAfterCloseReturnErrClosed", testClosed},
		{"UnknownQueueReadsAreEmpty", testUnknownQueue},
		{"PayloadsAreCopied", testPayloadIsCopied},
	}
}

func reopenCases() []testCase {
	return []testCase{
		{"ReopenKeepsEverything", testReopenKeepsEverything},
		{"ReopenedLeaseExpiresOnTime", testReopenedLeaseExpires},
		{"DeletedQueueStaysDeletedAfterReopen", testDeletedQueueStaysDeletedAfterReopen},
	}
}

func testEnqueuedItemIsPolledWithItsMetadata(t *testing.T, f *fixture) {
	res := f.enqueue("jobs", at(0), storage.EnqueueItem{Payload: []byte("hello"), Priority: 3, DedupKey: "k1", MaxAttempts: 7})
	require.Equal(t, storage.CodeOK, res[0].Code)
	require.False(t, res[0].Duplicate)
	require.False(t, res[0].ID.IsZero())
	require.Empty(t, res[0].Err)

	p := f.poll("jobs", 10, 5*time.Second, at(time.Second))
	require.Len(t, p.Items, 1)
	requireTime(t, at(6*time.Second), p.ExpiresAt, "lease expiry is poll now + lease")
	it := p.Items[0]
	require.Equal(t, res[0].ID, it.ID)
	require.Equal(t, "jobs", it.Queue)
	require.Equal(t, []byte("hello"), it.Payload)
	require.Equal(t, uint8(3), it.Priority)
	require.Equal(t, uint32(1), it.Attempts, "attempts counts this delivery")
	require.Equal(t, uint32(7), it.MaxAttempts)
	requireTime(t, at(0), it.EnqueuedAt)
	requireTime(t, at(0), it.VisibleAt)
	require.Equal(t, "k1", it.DedupKey)
	require.Empty(t, it.LastError)
	require.Equal(t, storage.StateInflight, it.State)
}

// testEnqueueKeepsNoPayloadBuffer: the caller may reuse a payload's
// buffer once Enqueue returns (the RPC server hands the store payloads in
// the incoming message, which it releases). Small and large payloads
// alike: a store may keep large ones apart.
func testEnqueueKeepsNoPayloadBuffer(t *testing.T, f *fixture) {
	small := []byte("hello")
	large := bytes.Repeat([]byte("L"), 64<<10)
	ids := f.enqueueIDs("jobs", at(0), storage.EnqueueItem{Payload: small}, storage.EnqueueItem{Payload: large})
	for i := range small {
		small[i] = 'x'
	}
	for i := range large {
		large[i] = 'x'
	}
	p := f.poll("jobs", 10, 5*time.Second, at(time.Second))
	require.Len(t, p.Items, 2)
	require.Equal(t, ids[0], p.Items[0].ID)
	require.Equal(t, "hello", string(p.Items[0].Payload))
	require.Equal(t, bytes.Repeat([]byte("L"), 64<<10), p.Items[1].Payload)
}

func testIDsIncreaseInEnqueueOrder(t *testing.T, f *fixture) {
	var all []storage.ItemID
	all = append(all, f.enqueueN("a", at(0), 3)...)
	all = append(all, f.enqueueN("b", at(0), 2)...)
	all = append(all, f.enqueueN("a", at(time.Second), 1)...)
	for i := 1; i < len(all); i++ {
		require.Negative(t, bytes.Compare(all[i-1][:], all[i][:]), "id %d (%s) must be greater than id %d (%s)", i, all[i], i-1, all[i-1])
	}
}

func testServeOrder(t *testing.T, f *fixture) {
	// a: priority 1, visible at 0. c: priority 0, visible at 2s (smaller
	// id than d, e). d, e: priority 0, visible at 1s. f: priority 2. b:
	// priority 1, visible at 1s.
	first := f.enqueueIDs("q", at(0),
		storage.EnqueueItem{Payload: []byte("a"), Priority: 1},
		storage.EnqueueItem{Payload: []byte("c"), Priority: 0, Delay: 2 * time.Second},
	)
	second := f.enqueueIDs("q", at(time.Second),
		storage.EnqueueItem{Payload: []byte("d"), Priority: 0},
		storage.EnqueueItem{Payload: []byte("e"), Priority: 0},
		storage.EnqueueItem{Payload: []byte("f"), Priority: 2},
		storage.EnqueueItem{Payload: []byte("b"), Priority: 1},
	)
	a, c := first[0], first[1]
	d, e, ff, b := second[0], second[1], second[2], second[3]

	p1 := f.poll("q", 2, time.Minute, at(3*time.Second))
	require.Equal(t, []storage.ItemID{d, e}, ids(p1.Items))
	p2 := f.poll("q", 10, time.Minute, at(3*time.Second))
	require.Equal(t, []storage.ItemID{c, a, b, ff}, ids(p2.Items))
	require.NotEqual(t, p1.Lease, p2.Lease, "every poll gets a new lease token")
}

func testPollHonoursMax(t *testing.T, f *fixture) {
	all := f.enqueueN("q", at(0), 5)
	p := f.poll("q", 3, time.Minute, at(0))
	require.Equal(t, all[:3], ids(p.Items))
	p = f.poll("q", 3, time.Minute, at(0))
	require.Equal(t, all[3:], ids(p.Items))
	p = f.poll("q", 3, time.Minute, at(0))
	require.Empty(t, p.Items)
}

func testEmptyPollIsNotAnError(t *testing.T, f *fixture) {
	p := f.poll("never-created", 10, 0, at(0))
	require.Empty(t, p.Items)
	f.enqueueIDs("q", at(0), storage.EnqueueItem{Payload: []byte("x"), Delay: time.Second})
	p = f.poll("q", 10, 0, at(0))
	require.Empty(t, p.Items)
	require.True(t, p.ExpiresAt.IsZero() || p.Lease.IsZero())
}

func testDelayedItemIsServedExactlyAtVisibleAt(t *testing.T, f *fixture) {
	id := f.enqueueIDs("q", at(0), storage.EnqueueItem{Payload: []byte("x"), Delay: 10 * time.Second})[0]
	require.Empty(t, f.poll("q", 10, time.Minute, at(10*time.Second-1)).Items, "not served a nanosecond early")
	p := f.poll("q", 10, time.Minute, at(10*time.Second))
	require.Equal(t, []storage.ItemID{id}, ids(p.Items), "served exactly at visible_at, before any sweep")
	requireTime(t, at(10*time.Second), p.Items[0].VisibleAt)
}

func testAckedItemIsNeverRedelivered(t *testing.T, f *fixture) {
	id := f.enqueueN("q", at(0), 1)[0]
	p := f.poll("q", 1, time.Second, at(0))
	require.Equal(t, codes(storage.CodeOK), f.ack("q", p.Lease, at(0), id))
	f.sweep(at(time.Hour), 1000)
	require.Empty(t, f.poll("q", 10, time.Second, at(time.Hour)).Items)
	require.Empty(t, f.peek("q", false, storage.ItemID{}, 10, at(time.Hour)))
	require.Empty(t, f.peek("q", true, storage.ItemID{}, 10, at(time.Hour)))
	require.Equal(t, codes(storage.CodeNotFound), f.ack("q", p.Lease, at(0), id), "a second ack finds nothing")
	st := f.stats("q", at(time.Hour))
	require.Equal(t, counts{}, gauges(st))
	require.Equal(t, uint64(1), st.Acked)
}

func testAckJustBeforeDeadline(t *testing.T, f *fixture) {
	id := f.enqueueN("q", at(0), 1)[0]
	p := f.poll("q", 1, 10*time.Second, at(0))
	requireTime(t, at(10*time.Second), p.ExpiresAt)
	require.Equal(t, codes(storage.CodeOK), f.ack("q", p.Lease, at(10*time.Second-1), id))
}

func testAckAtDeadline(t *testing.T, f *fixture) {
	id := f.enqueueN("q", at(0), 1)[0]
	p := f.poll("q", 1, 10*time.Second, at(0))
	dl := at(10 * time.Second)
	require.Equal(t, codes(storage.CodeLeaseExpired), f.ack("q", p.Lease, dl, id))
	require.Equal(t, codes(storage.CodeLeaseExpired), f.nack("q", p.Lease, durp(0), "late", dl, id))
	_, err := f.extend("q", p.Lease, time.Minute, dl)
	requireIs(t, err, storage.ErrLeaseExpired)
	// Nothing changed: still inflight under the same lease until a sweep.
	st := f.stats("q", dl)
	require.Equal(t, counts{Inflight: 1, Leases: 1}, gauges(st))
	require.Equal(t, uint64(0), st.Acked)
	require.Equal(t, uint64(0), st.Nacked)
	in := f.peek("q", true, storage.ItemID{}, 10, dl)
	require.Len(t, in, 1)
	require.Equal(t, id, in[0].ID)
	require.Empty(t, in[0].LastError)
}

func testSweepAtDeadline(t *testing.T, f *fixture) {
	f.enqueueN("q", at(0), 2)
	p := f.poll("q", 2, 10*time.Second, at(0))
	res := f.sweep(at(10*time.Second-1), 100)
	require.Zero(t, res.LeasesExpired)
	require.Zero(t, res.Requeued)
	require.Empty(t, res.ReadyQueues)
	requireTime(t, p.ExpiresAt, res.Next, "Next is the pending lease expiry")
	require.False(t, res.More)

	res = f.sweep(at(10*time.Second), 100)
	require.Equal(t, 1, res.LeasesExpired)
	require.Equal(t, 2, res.Requeued)
	require.Zero(t, res.DeadLettered)
	require.Equal(t, []string{"q"}, res.ReadyQueues)
	require.True(t, res.Next.IsZero(), "nothing pending: %v", res.Next)
	require.False(t, res.More)
	st := f.stats("q", at(10*time.Second))
	require.Equal(t, counts{Ready: 2}, gauges(st))
	require.Equal(t, uint64(2), st.Expired)
}

func testExpiredLeaseIsRedelivered(t *testing.T, f *fixture) {
	id := f.enqueueN("q", at(0), 1)[0]
	p1 := f.poll("q", 1, 10*time.Second, at(0))
	f.sweep(at(10*time.Second), 100)
	p2 := f.poll("q", 1, 10*time.Second, at(11*time.Second))
	require.Equal(t, []storage.ItemID{id}, ids(p2.Items))
	require.NotEqual(t, p1.Lease, p2.Lease)
	require.Equal(t, uint32(2), p2.Items[0].Attempts)
	requireTime(t, at(10*time.Second), p2.Items[0].VisibleAt, "an expired item becomes visible at its lease's expiry")
	require.Equal(t, codes(storage.CodeOK), f.ack("q", p2.Lease, at(11*time.Second), id))
}

func testPollDefaultLease(t *testing.T, f *fixture) {
	f.enqueueN("q", at(0), 2)
	p := f.poll("q", 1, 0, at(0))
	requireTime(t, at(storage.DefaultLeaseDuration), p.ExpiresAt)
	c := storage.DefaultQueueConfig()
	c.LeaseDuration = 2 * time.Second
	f.setConfig("q", c)
	p = f.poll("q", 1, 0, at(time.Second))
	requireTime(t, at(3*time.Second), p.ExpiresAt)
}

func testDelayedCountsUntilSweepPromotes(t *testing.T, f *fixture) {
	f.enqueueIDs("q", at(0), storage.EnqueueItem{Payload: []byte("x"), Delay: 10 * time.Second})
	require.Equal(t, counts{Delayed: 1}, gauges(f.stats("q", at(0))))
	peek := f.peek("q", false, storage.ItemID{}, 10, at(10*time.Second-1))
	require.Len(t, peek, 1)
	require.Equal(t, storage.StateDelayed, peek[0].State)
	requireTime(t, at(10*time.Second), peek[0].VisibleAt)

	res := f.sweep(at(10*time.Second-1), 100)
	require.Zero(t, res.Promoted)
	require.Empty(t, res.ReadyQueues)
	requireTime(t, at(10*time.Second), res.Next, "Next is the delayed item's VisibleAt")
	// Stats documents Delayed as a counter: still delayed past VisibleAt
	// until a sweep promotes it.
	require.Equal(t, counts{Delayed: 1}, gauges(f.stats("q", at(10*time.Second))))
	peek = f.peek("q", false, storage.ItemID{}, 10, at(10*time.Second))
	require.Equal(t, storage.StateReady, peek[0].State, "Peek reports the state at Now")

	res = f.sweep(at(10*time.Second), 100)
	require.Equal(t, 1, res.Promoted)
	require.Equal(t, []string{"q"}, res.ReadyQueues)
	require.True(t, res.Next.IsZero())
	require.Equal(t, counts{Ready: 1}, gauges(f.stats("q", at(10*time.Second))))
}

func testPolledDelayedItemLeavesDelayedCount(t *testing.T, f *fixture) {
	f.enqueueIDs("q", at(0), storage.EnqueueItem{Payload: []byte("x"), Delay: time.Second})
	p := f.poll("q", 1, time.Minute, at(2*time.Second))
	require.Len(t, p.Items, 1, "poll serves a due item before any sweep")
	require.Equal(t, counts{Inflight: 1, Leases: 1}, gauges(f.stats("q", at(2*time.Second))))
	res := f.sweep(at(2*time.Second), 100)
	require.Zero(t, res.Promoted, "nothing left to promote")
	requireTime(t, p.ExpiresAt, res.Next)
}

func testStaleLeaseAfterRedeliveryIsMismatch(t *testing.T, f *fixture) {
	id := f.enqueueN("q", at(0), 1)[0]
	p1 := f.poll("q", 1, time.Second, at(0))
	f.sweep(at(time.Second), 100)
	p2 := f.poll("q", 1, time.Second, at(time.Second))
	require.Equal(t, []storage.ItemID{id}, ids(p2.Items))
	now := at(time.Second + time.Millisecond)
	// The item is inflight under another (live) lease.
	require.Equal(t, codes(storage.CodeLeaseMismatch), f.ack("q", p1.Lease, now, id))
	require.Equal(t, codes(storage.CodeLeaseMismatch), f.nack("q", p1.Lease, durp(0), "x", now, id))
	_, err := f.extend("q", p1.Lease, time.Minute, now)
	requireIs(t, err, storage.ErrLeaseExpired, "a swept lease is not live")
	// Nothing changed: the holder still acks.
	require.Equal(t, counts{Inflight: 1, Leases: 1}, gauges(f.stats("q", now)))
	require.Equal(t, codes(storage.CodeOK), f.ack("q", p2.Lease, now, id))
}

func testStaleLeaseOnRequeuedItemIsExpired(t *testing.T, f *fixture) {
	id := f.enqueueN("q", at(0), 1)[0]
	p := f.poll("q", 1, time.Second, at(0))
	f.sweep(at(time.Second), 100)
	// The item is ready again, and the presented lease is not live.
	require.Equal(t, codes(storage.CodeLeaseExpired), f.ack("q", p.Lease, at(time.Second), id))
	require.Equal(t, codes(storage.CodeLeaseExpired), f.nack("q", p.Lease, nil, "x", at(time.Second), id))
	st := f.stats("q", at(time.Second))
	require.Equal(t, counts{Ready: 1}, gauges(st))
	require.Zero(t, st.Acked)
	require.Zero(t, st.Nacked)
}

func testForeignLeaseIsMismatch(t *testing.T, f *fixture) {
	all := f.enqueueN("q", at(0), 3)
	a, b, c := all[0], all[1], all[2]
	p1 := f.poll("q", 1, time.Minute, at(0))
	p2 := f.poll("q", 1, time.Minute, at(0))
	require.Equal(t, []storage.ItemID{a}, ids(p1.Items))
	require.Equal(t, []storage.ItemID{b}, ids(p2.Items))
	// b is inflight under p2's lease; c is ready and p1's live lease does
	// not list it.
	require.Equal(t, codes(storage.CodeLeaseMismatch, storage.CodeLeaseMismatch), f.ack("q", p1.Lease, at(time.Second), b, c))
	require.Equal(t, codes(storage.CodeLeaseMismatch, storage.CodeLeaseMismatch), f.nack("q", p1.Lease, durp(0), "x", at(time.Second), b, c))
	st := f.stats("q", at(time.Second))
	require.Equal(t, counts{Ready: 1, Inflight: 2, Leases: 2}, gauges(st))
	require.Zero(t, st.Acked)
	require.Zero(t, st.Nacked)
	require.Equal(t, codes(storage.CodeOK), f.ack("q", p2.Lease, at(time.Second), b))
	require.Equal(t, codes(storage.CodeOK), f.ack("q", p1.Lease, at(time.Second), a))
}

func testForgedLeaseIsRejected(t *testing.T, f *fixture) {
	all := f.enqueueN("q", at(0), 2)
	p := f.poll("q", 1, time.Minute, at(0))
	inflight, ready := all[0], all[1]
	for _, forged := range []storage.LeaseID{{}, {1, 2, 3}, forgedLease} {
		got := f.ack("q", forged, at(time.Second), inflight, ready, bogusID)
		require.Equal(t, codes(storage.CodeLeaseMismatch, storage.CodeLeaseExpired, storage.CodeNotFound), got, "token %s", forged)
		got = f.nack("q", forged, durp(0), "x", at(time.Second), inflight, ready, bogusID)
		require.Equal(t, codes(storage.CodeLeaseMismatch, storage.CodeLeaseExpired, storage.CodeNotFound), got, "token %s", forged)
		_, err := f.extend("q", forged, time.Minute, at(time.Second))
		requireIs(t, err, storage.ErrLeaseExpired, "a never-issued token is not live")
	}
	require.Equal(t, counts{Ready: 1, Inflight: 1, Leases: 1}, gauges(f.stats("q", at(time.Second))))
	require.Equal(t, codes(storage.CodeOK), f.ack("q", p.Lease, at(time.Second), inflight))
}

func testNotFound(t *testing.T, f *fixture) {
	all := f.enqueueN("q", at(0), 2)
	other := f.enqueueN("other", at(0), 1)[0]
	p := f.poll("q", 2, time.Minute, at(0))
	require.Equal(t, codes(storage.CodeOK), f.ack("q", p.Lease, at(0), all[0]))
	got := f.ack("q", p.Lease, at(0), all[0], bogusID, other)
	require.Equal(t, codes(storage.CodeNotFound, storage.CodeNotFound, storage.CodeNotFound), got,
		"acked, never existed, and an id of another queue")
	got = f.nack("q", p.Lease, durp(0), "x", at(0), all[0], bogusID, other)
	require.Equal(t, codes(storage.CodeNotFound, storage.CodeNotFound, storage.CodeNotFound), got)
	require.Equal(t, codes(storage.CodeNotFound), f.ack("no-such-queue", p.Lease, at(0), all[1]))
	require.Equal(t, codes(storage.CodeOK), f.ack("q", p.Lease, at(0), all[1]))
}

func testPartialAckBatch(t *testing.T, f *fixture) {
	all := f.enqueueN("q", at(0), 4)
	p1 := f.poll("q", 2, time.Minute, at(0))
	p2 := f.poll("q", 2, time.Minute, at(0))
	got := f.ack("q", p1.Lease, at(time.Second), all[0], bogusID, all[1], all[2])
	require.Equal(t, codes(storage.CodeOK, storage.CodeNotFound, storage.CodeOK, storage.CodeLeaseMismatch), got)
	st := f.stats("q", at(time.Second))
	require.Equal(t, counts{Inflight: 2, Leases: 1}, gauges(st), "p1's lease is finished, p2's untouched")
	require.Equal(t, uint64(2), st.Acked)
	_, err := f.extend("q", p1.Lease, time.Minute, at(time.Second))
	requireIs(t, err, storage.ErrLeaseExpired, "a fully acked lease is no longer live")
	require.Equal(t, codes(storage.CodeOK, storage.CodeOK), f.ack("q", p2.Lease, at(time.Second), all[2], all[3]))
	// Duplicates within one batch: the second finds nothing.
	f.enqueueN("q", at(2*time.Second), 2)
	p3 := f.poll("q", 2, time.Minute, at(2*time.Second))
	x := p3.Items[0].ID
	require.Equal(t, codes(storage.CodeOK, storage.CodeNotFound), f.ack("q", p3.Lease, at(2*time.Second), x, x))
}

func testExtend(t *testing.T, f *fixture) {
	id := f.enqueueN("q", at(0), 1)[0]
	p := f.poll("q", 1, 10*time.Second, at(0))
	exp, err := f.extend("q", p.Lease, 20*time.Second, at(5*time.Second))
	require.NoError(t, err)
	requireTime(t, at(25*time.Second), exp, "the new expiry is now + duration")
	res := f.sweep(at(10*time.Second), 100)
	require.Zero(t, res.LeasesExpired, "the old expiry no longer applies")
	requireTime(t, at(25*time.Second), res.Next)
	in := f.peek("q", true, storage.ItemID{}, 10, at(10*time.Second))
	require.Equal(t, []storage.ItemID{id}, ids(in))
	require.Equal(t, codes(storage.CodeOK), f.ack("q", p.Lease, at(25*time.Second-1), id))
}

func testExtendCanShorten(t *testing.T, f *fixture) {
	id := f.enqueueN("q", at(0), 1)[0]
	p := f.poll("q", 1, time.Minute, at(0))
	exp, err := f.extend("q", p.Lease, time.Second, at(time.Second))
	require.NoError(t, err)
	requireTime(t, at(2*time.Second), exp)
	require.Equal(t, codes(storage.CodeLeaseExpired), f.ack("q", p.Lease, at(2*time.Second), id))
	res := f.sweep(at(2*time.Second), 100)
	require.Equal(t, 1, res.LeasesExpired)
	require.Equal(t, 1, res.Requeued)
	p2 := f.poll("q", 1, time.Minute, at(2*time.Second))
	requireTime(t, at(2*time.Second), p2.Items[0].VisibleAt, "requeued at the shortened expiry")
}

func testExtendRejections(t *testing.T, f *fixture) {
	f.enqueueN("q", at(0), 1)
	f.enqueueN("other", at(0), 1)
	p := f.poll("q", 1, 10*time.Second, at(0))
	_, err := f.extend("other", p.Lease, time.Minute, at(time.Second))
	requireIs(t, err, storage.ErrLeaseMismatch, "a live lease presented for another queue")
	_, err = f.extend("q", p.Lease, f.h.limits().MinLease-1, at(time.Second))
	requireIs(t, err, storage.ErrInvalidArgument, "duration below the minimum lease")
	_, err = f.extend("q", p.Lease, f.h.limits().MaxLease+1, at(time.Second))
	requireIs(t, err, storage.ErrInvalidArgument, "duration above the maximum lease")
	_, err = f.extend("q", p.Lease, time.Minute, at(10*time.Second))
	requireIs(t, err, storage.ErrLeaseExpired, "at its expiry the lease is no longer live")
	// None of these changed the expiry.
	requireTime(t, at(10*time.Second), f.sweep(at(time.Second), 100).Next)
}

func testExtendWithZeroUsesQueueDefault(t *testing.T, f *fixture) {
	c := storage.DefaultQueueConfig()
	c.LeaseDuration = 7 * time.Second
	f.setConfig("q", c)
	f.enqueueN("q", at(0), 1)
	p := f.poll("q", 1, time.Second, at(0))
	exp, err := f.extend("q", p.Lease, 0, at(500*time.Millisecond))
	require.NoError(t, err)
	requireTime(t, at(7500*time.Millisecond), exp)
}

func testNackWithDelay(t *testing.T, f *fixture) {
	id := f.enqueueN("q", at(0), 1)[0]
	p := f.poll("q", 1, time.Minute, at(0))
	require.Equal(t, codes(storage.CodeOK), f.nack("q", p.Lease, durp(5*time.Second), "try later", at(time.Second), id))
	st := f.stats("q", at(time.Second))
	require.Equal(t, counts{Delayed: 1}, gauges(st), "a nacked item with a delay is delayed; its lease is finished")
	require.Equal(t, uint64(1), st.Nacked)
	peek := f.peek("q", false, storage.ItemID{}, 10, at(time.Second))
	require.Len(t, peek, 1)
	require.Equal(t, storage.StateDelayed, peek[0].State)
	requireTime(t, at(6*time.Second), peek[0].VisibleAt)
	require.Equal(t, "try later", peek[0].LastError)
	require.Equal(t, uint32(1), peek[0].Attempts)
	_, err := f.extend("q", p.Lease, time.Minute, at(time.Second))
	requireIs(t, err, storage.ErrLeaseExpired, "a fully nacked lease is finished")

	require.Empty(t, f.poll("q", 1, time.Minute, at(6*time.Second-1)).Items)
	p2 := f.poll("q", 1, time.Minute, at(6*time.Second))
	require.Equal(t, []storage.ItemID{id}, ids(p2.Items))
	require.Equal(t, uint32(2), p2.Items[0].Attempts)
	require.Equal(t, "try later", p2.Items[0].LastError)
}

func testNackWithZeroDelayIsReadyAtOnce(t *testing.T, f *fixture) {
	id := f.enqueueN("q", at(0), 1)[0]
	p := f.poll("q", 1, time.Minute, at(0))
	require.Equal(t, codes(storage.CodeOK), f.nack("q", p.Lease, durp(0), "", at(time.Second), id))
	require.Equal(t, counts{Ready: 1}, gauges(f.stats("q", at(time.Second))))
	p2 := f.poll("q", 1, time.Minute, at(time.Second))
	require.Equal(t, []storage.ItemID{id}, ids(p2.Items))
	requireTime(t, at(time.Second), p2.Items[0].VisibleAt)
}

func testNackDelayOutOfRange(t *testing.T, f *fixture) {
	id := f.enqueueN("q", at(0), 1)[0]
	p := f.poll("q", 1, time.Minute, at(0))
	for _, d := range []time.Duration{-1, f.h.limits().MaxDelay + 1} {
		_, err := f.s.Nack(f.ctx, storage.NackParams{Queue: "q", Lease: p.Lease, IDs: []storage.ItemID{id}, Delay: &d, Now: at(0)})
		requireIs(t, err, storage.ErrInvalidArgument, "delay %v", d)
	}
	require.Equal(t, counts{Inflight: 1, Leases: 1}, gauges(f.stats("q", at(0))), "nothing changed")
	maxDelay := f.h.limits().MaxDelay
	require.Equal(t, codes(storage.CodeOK), f.nack("q", p.Lease, &maxDelay, "", at(0), id), "the maximum delay itself is fine")
}

func testUndeliveredNack(t *testing.T, f *fixture) {
	c := storage.DefaultQueueConfig()
	c.MaxAttempts = 2
	f.setConfig("q", c)
	a := f.enqueueN("q", at(0), 1)[0]
	// a's first delivery fails with a nack, so it has a last error and one
	// attempt when the claim below is taken back.
	p := f.poll("q", 1, time.Minute, at(0))
	require.Equal(t, codes(storage.CodeOK), f.nack("q", p.Lease, durp(0), "first try", at(0), a))
	b := f.enqueueN("q", at(time.Second), 1)[0]
	before := f.stats("q", at(2*time.Second))

	p = f.poll("q", 2, time.Minute, at(3*time.Second))
	require.Equal(t, []storage.ItemID{a, b}, ids(p.Items))
	require.Equal(t, uint32(2), p.Items[0].Attempts, "a's last attempt")
	undelivered := func(d *time.Duration, now time.Time, ids ...storage.ItemID) ([]storage.Code, error) {
		return f.s.Nack(f.ctx, storage.NackParams{Queue: "q", Lease: p.Lease, IDs: ids, Delay: d, Reason: "not recorded",
			Now: now, Undelivered: true})
	}
	_, err := undelivered(durp(time.Second), at(3*time.Second), a)
	requireIs(t, err, storage.ErrInvalidArgument, "undelivered items take no delay")
	got, err := undelivered(nil, at(4*time.Second), a, b)
	require.NoError(t, err)
	require.Equal(t, codes(storage.CodeOK, storage.CodeOK), got)

	st := f.stats("q", at(4*time.Second))
	require.Equal(t, counts{Ready: 2}, gauges(st), "both ready at once, not dead-lettered at max attempts; the lease is finished")
	require.Equal(t, before.Delivered+2, st.Delivered, "Delivered, a lifetime counter, keeps the claim (it never goes down: a Prometheus counter)")
	require.Equal(t, before.Nacked, st.Nacked, "not counted as nacked")
	require.Equal(t, before.DeadLettered, st.DeadLettered)
	peek := f.peek("q", false, storage.ItemID{}, 10, at(4*time.Second))
	require.Equal(t, []storage.ItemID{a, b}, ids(peek))
	require.Equal(t, uint32(1), peek[0].Attempts, "a: the attempt of its failed delivery stays, the claim's is gone")
	require.Equal(t, "first try", peek[0].LastError, "the reason is not recorded")
	require.Equal(t, uint32(0), peek[1].Attempts)
	requireTime(t, at(time.Second), peek[1].VisibleAt, "b keeps its place in the ready order")
	_, err = f.extend("q", p.Lease, time.Minute, at(4*time.Second))
	requireIs(t, err, storage.ErrLeaseExpired, "a fully given back lease is finished")
	require.Equal(t, codes(storage.CodeLeaseExpired), f.ack("q", p.Lease, at(4*time.Second), a), "the old lease no longer holds a")

	p = f.poll("q", 2, time.Minute, at(5*time.Second))
	require.Equal(t, []storage.ItemID{a, b}, ids(p.Items), "served in their old order")
	require.Equal(t, uint32(2), p.Items[0].Attempts)
	require.Equal(t, uint32(1), p.Items[1].Attempts)
	require.Equal(t, codes(storage.CodeOK), f.nack("q", p.Lease, durp(0), "second try", at(5*time.Second), a))
	require.Equal(t, uint64(1), f.stats("q", at(5*time.Second)).DeadLettered, "a's real second delivery still dead-letters it")
}

func testNackBackoffBounds(t *testing.T, f *fixture) {
	c := storage.DefaultQueueConfig()
	c.MaxAttempts = 100
	c.BackoffBase = 100 * time.Millisecond
	c.BackoffMax = time.Second
	f.setConfig("q", c)
	const n = 40
	f.enqueueN("q", at(0), n)
	now := at(0)
	for attempt := uint32(1); attempt <= 5; attempt++ {
		p := f.poll("q", n, time.Minute, now)
		require.Len(t, p.Items, n, "attempt %d", attempt)
		require.Equal(t, n, len(f.nack("q", p.Lease, nil, "backoff", now, ids(p.Items)...)))
		ceiling := min(c.BackoffBase<<attempt, c.BackoffMax)
		var waiting int
		var longest time.Duration
		for _, it := range f.peek("q", false, storage.ItemID{}, n, now) {
			require.Equal(t, attempt, it.Attempts)
			d := it.VisibleAt.Sub(now)
			require.GreaterOrEqual(t, d, time.Duration(0), "attempt %d", attempt)
			require.LessOrEqual(t, d, ceiling, "attempt %d: backoff within [0, min(base*2^attempts, max)]", attempt)
			if d > 0 {
				waiting++
			}
			longest = max(longest, d)
		}
		// The delays are drawn uniformly from the whole range: with 40
		// items, all of them at 0, or all in its lower half (a lower
		// ceiling than base*2^attempts), would be a 2^-40 chance.
		require.Greater(t, waiting, n/2, "attempt %d: a nack without a delay backs off", attempt)
		require.Greater(t, longest, ceiling/2, "attempt %d: backoff drawn up to min(base*2^attempts, max)", attempt)
		now = now.Add(c.BackoffMax)
	}
}

func testPurge(t *testing.T, f *fixture) {
	dead := killAll(t, f, "q", 1, at(0))
	f.enqueueN("q", at(0), 2)
	f.enqueueIDs("q", at(0), storage.EnqueueItem{Payload: []byte("later"), Delay: time.Hour, DedupKey: "k"})
	p := f.poll("q", 1, time.Minute, at(0))
	f.enqueueN("other", at(0), 1)

	n, err := f.s.Purge(f.ctx, storage.PurgeParams{Queue: "q", Now: at(time.Second)})
	require.NoError(t, err)
	require.Equal(t, 3, n, "ready, delayed and inflight items; not dead ones")
	st := f.stats("q", at(time.Second))
	require.Equal(t, counts{Dead: 1}, gauges(st))
	require.Equal(t, uint64(3), st.Purged)
	require.Equal(t, deadIDs(f.deadList("q", storage.ItemID{}, 10)), dead)
	require.Empty(t, f.peek("q", false, storage.ItemID{}, 10, at(time.Second)))
	require.Empty(t, f.peek("q", true, storage.ItemID{}, 10, at(time.Second)))
	require.Equal(t, codes(storage.CodeNotFound), f.ack("q", p.Lease, at(time.Second), p.Items[0].ID))
	_, err = f.extend("q", p.Lease, time.Minute, at(time.Second))
	requireIs(t, err, storage.ErrLeaseExpired, "the purged lease is gone")
	cfg, err := f.s.QueueConfig(f.ctx, "q")
	require.NoError(t, err)
	require.Equal(t, uint32(1), cfg.MaxAttempts, "the queue and its config remain")
	// Dedup keys survive a purge.
	again := f.enqueue("q", at(2*time.Second), storage.EnqueueItem{Payload: []byte("later"), DedupKey: "k"})
	require.True(t, again[0].Duplicate)
	res := f.sweep(at(2*time.Hour), 100)
	require.Zero(t, res.LeasesExpired, "the purged lease left no expiry behind")
	require.Zero(t, res.Promoted, "the purged delayed item left nothing to promote")
	require.Equal(t, counts{Ready: 1}, gauges(f.stats("other", at(time.Second))), "other queues untouched")
}

func testStatsAfterEveryOperation(t *testing.T, f *fixture) {
	c := storage.DefaultQueueConfig()
	c.MaxAttempts = 2
	f.setConfig("q", c)
	st := f.stats("q", at(0))
	require.Equal(t, counts{}, gauges(st))
	require.Equal(t, lifetime{}, counters(st))
	require.Equal(t, c, st.Config)
	require.Zero(t, st.OldestReadyAge)

	step := func(name string, now time.Time, g counts, l lifetime) {
		t.Helper()
		st := f.stats("q", now)
		require.Equal(t, g, gauges(st), "gauges after %s", name)
		require.Equal(t, l, counters(st), "counters after %s", name)
	}
	all := f.enqueueIDs("q", at(0),
		storage.EnqueueItem{Payload: []byte("a")},
		storage.EnqueueItem{Payload: []byte("b")},
		storage.EnqueueItem{Payload: []byte("c"), Delay: time.Second},
		storage.EnqueueItem{Payload: []byte("d"), DedupKey: "k"},
	)
	f.enqueue("q", at(0), storage.EnqueueItem{Payload: []byte("dup"), DedupKey: "k"})
	l := lifetime{Enqueued: 4, Duplicates: 1}
	step("enqueue", at(0), counts{Ready: 3, Delayed: 1}, l)

	p := f.poll("q", 2, time.Second, at(0))
	l.Delivered = 2
	step("poll", at(0), counts{Ready: 1, Delayed: 1, Inflight: 2, Leases: 1}, l)

	f.ack("q", p.Lease, at(0), all[0])
	l.Acked = 1
	step("ack", at(0), counts{Ready: 1, Delayed: 1, Inflight: 1, Leases: 1}, l)

	f.nack("q", p.Lease, durp(0), "x", at(0), all[1])
	l.Nacked = 1
	step("nack", at(0), counts{Ready: 2, Delayed: 1}, l)

	f.sweep(at(time.Second), 100)
	step("sweep promoting", at(time.Second), counts{Ready: 3}, l)

	p = f.poll("q", 3, time.Second, at(time.Second))
	require.Len(t, p.Items, 3)
	l.Delivered = 5
	step("poll", at(time.Second), counts{Inflight: 3, Leases: 1}, l)

	f.sweep(at(2*time.Second), 100)
	// b was on its 2nd attempt (max 2): dead; c and d requeued.
	l.Expired = 3
	l.DeadLettered = 1
	step("sweep expiring", at(2*time.Second), counts{Ready: 2, Dead: 1}, l)

	_, err := f.s.Redrive(f.ctx, storage.RedriveParams{Queue: "q", Limit: 10, Now: at(2 * time.Second)})
	require.NoError(t, err)
	l.Redriven = 1
	step("redrive", at(2*time.Second), counts{Ready: 3}, l)

	p = f.poll("q", 1, time.Second, at(2*time.Second))
	f.nack("q", p.Lease, durp(time.Minute), "later", at(2*time.Second), p.Items[0].ID)
	l.Delivered, l.Nacked = 6, 2
	step("nack with delay", at(2*time.Second), counts{Ready: 2, Delayed: 1}, l)

	n, err := f.s.Purge(f.ctx, storage.PurgeParams{Queue: "q", Now: at(2 * time.Second)})
	require.NoError(t, err)
	require.Equal(t, 3, n)
	l.Purged = 3
	step("purge", at(2*time.Second), counts{}, l)
}

func testOldestReadyAge(t *testing.T, f *fixture) {
	f.enqueueIDs("q", at(0), storage.EnqueueItem{Payload: []byte("late"), Delay: time.Hour})
	require.Zero(t, f.stats("q", at(time.Second)).OldestReadyAge, "a delayed item is not ready")
	require.Equal(t, 2*time.Second, f.stats("q", at(time.Hour+2*time.Second)).OldestReadyAge,
		"counted from VisibleAt, not EnqueuedAt, and before any sweep promoted it")
	f.enqueueIDs("q", at(time.Second), storage.EnqueueItem{Payload: []byte("low"), Priority: 9})
	f.enqueueIDs("q", at(3*time.Second), storage.EnqueueItem{Payload: []byte("high")})
	require.Equal(t, 4*time.Second, f.stats("q", at(5*time.Second)).OldestReadyAge, "across priorities")
	p := f.poll("q", 1, time.Minute, at(5*time.Second))
	require.Equal(t, []byte("high"), p.Items[0].Payload)
	require.Equal(t, 4*time.Second, f.stats("q", at(5*time.Second)).OldestReadyAge)
	f.poll("q", 1, time.Minute, at(5*time.Second))
	require.Zero(t, f.stats("q", at(5*time.Second)).OldestReadyAge, "inflight items are not ready")
}

func testQueues(t *testing.T, f *fixture) {
	qs, err := f.s.Queues(f.ctx)
	require.NoError(t, err)
	require.Empty(t, qs)
	for _, q := range []string{"b", "a", "B", "a.1", "a-2", "_z"} {
		f.enqueueN(q, at(0), 1)
	}
	f.setConfig("configured", storage.DefaultQueueConfig())
	f.poll("polled-only", 1, 0, at(0))
	qs, err = f.s.Queues(f.ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"B", "_z", "a", "a-2", "a.1", "b", "configured"}, qs,
		"byte order; enqueue and SetQueueConfig create queues, a poll does not")
	all, err := f.s.Stats(f.ctx, storage.StatsParams{Now: at(0)})
	require.NoError(t, err)
	require.Len(t, all, len(qs))
	for i, st := range all {
		require.Equal(t, qs[i], st.Queue, "Stats of all queues is sorted by name")
	}
}

func testPeekPaging(t *testing.T, f *fixture) {
	all := f.enqueueIDs("q", at(0),
		storage.EnqueueItem{Payload: []byte("0"), Priority: 5},
		storage.EnqueueItem{Payload: []byte("1"), Delay: time.Minute},
		storage.EnqueueItem{Payload: []byte("2")},
		storage.EnqueueItem{Payload: []byte("3")},
		storage.EnqueueItem{Payload: []byte("4")},
	)
	p := f.poll("q", 2, time.Minute, at(0)) // takes 2 and 3
	require.Equal(t, all[2:4], ids(p.Items))

	page := f.peek("q", false, storage.ItemID{}, 2, at(0))
	require.Equal(t, []storage.ItemID{all[0], all[1]}, ids(page), "id order, not serve order")
	require.Equal(t, storage.StateReady, page[0].State)
	require.Equal(t, storage.StateDelayed, page[1].State)
	require.Equal(t, []byte("1"), page[1].Payload)
	page = f.peek("q", false, page[1].ID, 2, at(0))
	require.Equal(t, []storage.ItemID{all[4]}, ids(page))
	require.Empty(t, f.peek("q", false, all[4], 2, at(0)))

	in := f.peek("q", true, storage.ItemID{}, 1, at(0))
	require.Equal(t, []storage.ItemID{all[2]}, ids(in))
	require.Equal(t, storage.StateInflight, in[0].State)
	require.Equal(t, uint32(1), in[0].Attempts)
	in = f.peek("q", true, in[0].ID, 10, at(0))
	require.Equal(t, []storage.ItemID{all[3]}, ids(in))

	// Peeking leased nothing.
	st := f.stats("q", at(0))
	require.Equal(t, counts{Ready: 2, Delayed: 1, Inflight: 2, Leases: 1}, gauges(st))
	require.Equal(t, uint64(2), st.Delivered)
	require.Empty(t, f.peek("never-created", false, storage.ItemID{}, 10, at(0)))
}

func testDeadListPaging(t *testing.T, f *fixture) {
	dead := killAll(t, f, "q", 5, at(0))
	var got []storage.ItemID
	var after storage.ItemID
	for i := 0; i < 10; i++ {
		page := f.deadList("q", after, 2)
		if len(page) == 0 {
			break
		}
		require.LessOrEqual(t, len(page), 2)
		for _, d := range page {
			require.Equal(t, "nack: fatal", d.Reason)
			require.Equal(t, storage.StateDead, d.State)
		}
		got = append(got, deadIDs(page)...)
		after = page[len(page)-1].ID
	}
	require.Equal(t, dead, got)
	require.Empty(t, f.deadList("never-created", storage.ItemID{}, 10))
}

func testSweepNextAndReadyQueues(t *testing.T, f *fixture) {
	require.True(t, f.sweep(at(0), 100).Next.IsZero(), "an empty store has no deadline")
	f.enqueueN("a", at(0), 1)
	f.enqueueN("b", at(0), 1)
	f.enqueueIDs("c", at(0), storage.EnqueueItem{Payload: []byte("x"), Delay: 3 * time.Second})
	f.enqueueIDs("d", at(0), storage.EnqueueItem{Payload: []byte("x"), DedupKey: "k"})
	f.poll("a", 1, 5*time.Second, at(0))
	f.poll("b", 1, 2*time.Second, at(0))
	requireTime(t, at(2*time.Second), f.sweep(at(0), 100).Next, "earliest of leases, delayed items and dedup keys")
	res := f.sweep(at(2*time.Second), 100)
	require.Equal(t, []string{"b"}, res.ReadyQueues)
	requireTime(t, at(3*time.Second), res.Next)
	res = f.sweep(at(5*time.Second), 100)
	require.Equal(t, []string{"a", "c"}, res.ReadyQueues, "sorted, lease expiry and promotion both count")
	require.Equal(t, 1, res.Requeued)
	require.Equal(t, 1, res.Promoted)
	requireTime(t, at(storage.DefaultDedupWindow), res.Next)
	require.False(t, res.More)
}

func testSweepLimit(t *testing.T, f *fixture) {
	for i := 0; i < 3; i++ {
		f.enqueueN("q", at(0), 1)
		f.poll("q", 1, time.Second, at(time.Duration(i)*time.Millisecond))
	}
	res := f.sweep(at(time.Minute), 2)
	require.Equal(t, 2, res.LeasesExpired)
	require.Equal(t, 2, res.Requeued)
	require.True(t, res.More, "a due lease is left")
	requireTime(t, at(time.Second+2*time.Millisecond), res.Next, "the due lease that is left")
	res = f.sweep(at(time.Minute), 2)
	require.Equal(t, 1, res.LeasesExpired)
	require.False(t, res.More)
	require.True(t, res.Next.IsZero())
	require.Equal(t, counts{Ready: 3}, gauges(f.stats("q", at(time.Minute))))
	// Leases expire in expiry order: the requeued items keep it.
	peek := f.peek("q", false, storage.ItemID{}, 10, at(time.Minute))
	for i, it := range peek {
		requireTime(t, at(time.Second+time.Duration(i)*time.Millisecond), it.VisibleAt)
	}
}

func testClosed(t *testing.T, f *fixture) {
	f.enqueueN("q", at(0), 1)
	require.NoError(t, f.s.Close())
	f.closed = true
	require.NoError(t, f.s.Close(), "Close is idempotent")
	ctx := f.ctx
	s := f.s
	_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("x")}}, Now: at(0)})
	requireIs(t, err, storage.ErrClosed, "enqueue")
	_, err = s.Poll(ctx, storage.PollParams{Queue: "q", Max: 1, Now: at(0)})
	requireIs(t, err, storage.ErrClosed, "poll")
	_, err = s.Ack(ctx, storage.AckParams{Queue: "q", IDs: []storage.ItemID{bogusID}, Now: at(0)})
	requireIs(t, err, storage.ErrClosed, "ack")
	_, err = s.Nack(ctx, storage.NackParams{Queue: "q", IDs: []storage.ItemID{bogusID}, Now: at(0)})
	requireIs(t, err, storage.ErrClosed, "nack")
	_, err = s.ExtendLease(ctx, storage.ExtendParams{Queue: "q", Lease: forgedLease, Duration: time.Second, Now: at(0)})
	requireIs(t, err, storage.ErrClosed, "extend")
	_, err = s.Sweep(ctx, storage.SweepParams{Now: at(0), Limit: 10})
	requireIs(t, err, storage.ErrClosed, "sweep")
	_, err = s.Stats(ctx, storage.StatsParams{Now: at(0)})
	requireIs(t, err, storage.ErrClosed, "stats")
	_, err = s.Queues(ctx)
	requireIs(t, err, storage.ErrClosed, "queues")
	_, err = s.Peek(ctx, storage.PeekParams{Queue: "q", Limit: 1, Now: at(0)})
	requireIs(t, err, storage.ErrClosed, "peek")
	_, err = s.Purge(ctx, storage.PurgeParams{Queue: "q", Now: at(0)})
	requireIs(t, err, storage.ErrClosed, "purge")
	_, err = s.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: "q", Force: true, Now: at(0)})
	requireIs(t, err, storage.ErrClosed, "delete queue")
	_, err = s.DeadList(ctx, storage.DeadListParams{Queue: "q", Limit: 1})
	requireIs(t, err, storage.ErrClosed, "dead list")
	_, err = s.Redrive(ctx, storage.RedriveParams{Queue: "q", Limit: 1, Now: at(0)})
	requireIs(t, err, storage.ErrClosed, "redrive")
	_, err = s.PurgeDead(ctx, storage.RedriveParams{Queue: "q", Limit: 1, Now: at(0)})
	requireIs(t, err, storage.ErrClosed, "purge dead")
	_, err = s.QueueConfig(ctx, "q")
	requireIs(t, err, storage.ErrClosed, "queue config")
	requireIs(t, s.SetQueueConfig(ctx, "q", storage.DefaultQueueConfig()), storage.ErrClosed, "set queue config")
	_, err = s.Check(ctx)
	requireIs(t, err, storage.ErrClosed, "check")
}

func testUnknownQueue(t *testing.T, f *fixture) {
	require.Empty(t, f.poll("ghost", 10, 0, at(0)).Items)
	require.Equal(t, codes(storage.CodeNotFound), f.ack("ghost", forgedLease, at(0), bogusID))
	require.Equal(t, codes(storage.CodeNotFound), f.nack("ghost", forgedLease, nil, "", at(0), bogusID))
	n, err := f.s.Purge(f.ctx, storage.PurgeParams{Queue: "ghost", Now: at(0)})
	require.NoError(t, err)
	require.Zero(t, n)
	res, err := f.s.Redrive(f.ctx, storage.RedriveParams{Queue: "ghost", Limit: 10, Now: at(0)})
	require.NoError(t, err)
	require.Zero(t, res.Moved)
	res, err = f.s.Redrive(f.ctx, storage.RedriveParams{Queue: "ghost", IDs: []storage.ItemID{bogusID}, Now: at(0)})
	require.NoError(t, err)
	require.Equal(t, codes(storage.CodeNotFound), res.Codes)
	_, err = f.s.Stats(f.ctx, storage.StatsParams{Queue: "ghost", Now: at(0)})
	requireIs(t, err, storage.ErrNotFound)
	_, err = f.s.QueueConfig(f.ctx, "ghost")
	requireIs(t, err, storage.ErrNotFound)
	qs, err := f.s.Queues(f.ctx)
	require.NoError(t, err)
	require.Empty(t, qs, "reads and rejected writes create no queue")
	all, err := f.s.Stats(f.ctx, storage.StatsParams{Now: at(0)})
	require.NoError(t, err)
	require.Empty(t, all)
}

func testPayloadIsCopied(t *testing.T, f *fixture) {
	buf := []byte("original")
	f.enqueueIDs("q", at(0), storage.EnqueueItem{Payload: buf})
	copy(buf, "XXXXXXXX")
	p := f.poll("q", 1, time.Minute, at(0))
	require.Equal(t, []byte("original"), p.Items[0].Payload, "the store keeps its own copy")
	p.Items[0].Payload[0] = 'Y'
	peek := f.peek("q", true, storage.ItemID{}, 1, at(0))
	require.Equal(t, []byte("original"), peek[0].Payload, "returned payloads are the caller's")
}

func testSweepLimitPerKind(t *testing.T, f *fixture) {
	c := storage.DefaultQueueConfig()
	c.DedupWindow = time.Second
	f.setConfig("q", c)
	for i := 0; i < 3; i++ {
		f.enqueueIDs("q", at(0), storage.EnqueueItem{Payload: []byte("later"), Delay: 500 * time.Millisecond, DedupKey: fmt.Sprint("k", i)})
	}
	f.enqueueN("q", at(0), 3)
	for i := 0; i < 3; i++ {
		p := f.poll("q", 1, f.h.limits().MinLease, at(0))
		require.Len(t, p.Items, 1)
	}
	res := f.sweep(at(time.Second), 2)
	require.Equal(t, 2, res.LeasesExpired)
	require.Equal(t, 2, res.Promoted)
	require.Equal(t, 2, res.DedupDropped)
	require.True(t, res.More)
	res = f.sweep(at(time.Second), 2)
	require.Equal(t, 1, res.LeasesExpired)
	require.Equal(t, 1, res.Promoted)
	require.Equal(t, 1, res.DedupDropped)
	require.False(t, res.More)
	require.Equal(t, counts{Ready: 6}, gauges(f.stats("q", at(time.Second))))
}

// testDeadlinesBehindSweep: concurrent callers read the clock before the
// store orders their calls, so a call may carry a Now earlier than a Sweep
// that already ran, and write a deadline that is already due. A store that
// resumes sweeping from a cursor must still find it (RunHistory found this
// with real concurrency; here it is exaggerated to seconds).
func testDeadlinesBehindSweep(t *testing.T, f *fixture) {
	c := storage.DefaultQueueConfig()
	c.DedupWindow = time.Second
	f.setConfig("q", c)
	f.enqueueIDs("q", at(0),
		storage.EnqueueItem{Payload: []byte("x")},
		storage.EnqueueItem{Payload: []byte("w"), Delay: 2 * time.Second, DedupKey: "k1"},
	)
	f.poll("q", 1, time.Second, at(0))
	res := f.sweep(at(5*time.Second), 100)
	require.Equal(t, 1, res.LeasesExpired)
	require.Equal(t, 1, res.Promoted)
	require.Equal(t, 1, res.DedupDropped)
	p := f.poll("q", 1, time.Minute, at(5*time.Second))
	f.ack("q", p.Lease, at(5*time.Second), ids(p.Items)...)
	p = f.poll("q", 1, time.Minute, at(5*time.Second))
	f.ack("q", p.Lease, at(5*time.Second), ids(p.Items)...)

	// Calls that read the clock before that sweep ran.
	f.enqueueIDs("q", at(0),
		storage.EnqueueItem{Payload: []byte("y")},
		storage.EnqueueItem{Payload: []byte("z"), Delay: 50 * time.Millisecond, DedupKey: "k2"},
	)
	late := f.poll("q", 1, f.h.limits().MinLease, at(0))
	require.Len(t, late.Items, 1)
	res = f.sweep(at(6*time.Second), 100)
	require.Equal(t, 1, res.LeasesExpired, "a lease that expired before the last sweep's instant")
	require.Equal(t, 1, res.Promoted, "a delayed item visible before the last sweep's instant")
	require.Equal(t, 1, res.DedupDropped, "a dedup key that expired before the last sweep's instant")
	require.False(t, res.More)
	require.True(t, res.Next.IsZero(), "nothing left: %v", res.Next)
	require.Equal(t, counts{Ready: 2}, gauges(f.stats("q", at(6*time.Second))))
}
