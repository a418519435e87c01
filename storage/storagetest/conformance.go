package storagetest

import (
	"bytes"
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
	}
}

func reopenCases() []testCase {
	return nil
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
