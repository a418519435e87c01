package fdbsync

import (
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync/fdbmodel"
	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/check"
	"github.com/leaseq/leaseq/storage/check/checktest"
)

// fdbRaw writes and reads keys behind the store's back, through the kv
// model's transactions, as damage (or a buggy node) would.
type fdbRaw struct {
	t  *testing.T
	s  *Store
	k  keys
	sc checktest.Scenario
}

func (r fdbRaw) tx(fn func(tx kv.Tx)) {
	tx, err := r.s.db.CreateTransaction()
	require.NoError(r.t, err)
	fn(tx)
	require.NoError(r.t, tx.Commit())
}

func (r fdbRaw) set(k, v []byte) { r.tx(func(tx kv.Tx) { tx.Set(k, v) }) }
func (r fdbRaw) clear(k []byte)  { r.tx(func(tx kv.Tx) { tx.Clear(k) }) }

func (r fdbRaw) get(k []byte) []byte {
	tx, err := r.s.db.CreateTransaction()
	require.NoError(r.t, err)
	v, err := tx.Get(k, true)
	require.NoError(r.t, err)
	require.NotNil(r.t, v, "no value at %x", k)
	return v
}

func (r fdbRaw) record(k []byte) record {
	rec, err := decodeRecord(r.get(k))
	require.NoError(r.t, err)
	return rec
}

// update rewrites the item record at k.
func (r fdbRaw) update(k []byte, fn func(*record)) {
	rec := r.record(k)
	fn(&rec)
	r.set(k, rec.encode())
}

func (r fdbRaw) lease() leaseRec {
	lr, err := decodeLease(r.get(r.k.lease(r.sc.Lease)))
	require.NoError(r.t, err)
	return lr
}

func (r fdbRaw) setLease(lr leaseRec) { r.set(r.k.lease(r.sc.Lease), lr.encode()) }

// newLease writes a lease record and its expiry entry, counted.
func (r fdbRaw) newLease(token storage.LeaseID, ids ...storage.ItemID) {
	exp := r.sc.Now.Add(time.Minute)
	lr := leaseRec{queue: r.sc.Queue, expiry: exp, ids: ids}
	r.tx(func(tx kv.Tx) {
		tx.Set(r.k.lease(token), lr.encode())
		tx.Set(r.k.expiry(exp, token), nil)
		tx.Add(r.k.counter(r.sc.Queue, ctrLeases), 1)
	})
}

func (r fdbRaw) dedupExpiry() time.Time {
	d, err := decodeDedup(r.get(r.k.dedup(r.sc.Queue, r.sc.DedupKey)))
	require.NoError(r.t, err)
	return d.expires
}

var otherLease = storage.LeaseID{0xee, 1}

// fdbBreaks are the break-the-data cases of fdbsync: each writes raw keys
// through a kv model transaction and names the kinds Check must report,
// exactly.
var fdbBreaks = []checktest.Case[fdbRaw]{
	{Name: "KeyThatDoesNotDecode", Want: []storage.ViolationKind{check.KindCorrupt}, Break: func(r fdbRaw) {
		r.set(append(r.k.ns(nsAvailable), 'q'), nil) // no terminator, no id
	}},
	{Name: "RecordThatDoesNotDecode", Want: []storage.ViolationKind{check.KindCorrupt}, Break: func(r fdbRaw) {
		r.set(r.k.lease(otherLease), []byte{0xff})
	}},
	// A copy of a dead item under a queue with no config; it keeps its
	// id, which is then in two queues.
	{Name: "DeadItemOfAQueueWithoutConfig", Want: []storage.ViolationKind{check.KindItemDuplicate, check.KindUnknownQueue}, Break: func(r fdbRaw) {
		r.set(r.k.dead("gone", r.sc.Dead), r.get(r.k.dead(r.sc.Queue, r.sc.Dead)))
	}},
	{Name: "ReadyItemAlsoDead", Want: []storage.ViolationKind{check.KindItemDuplicate}, Break: func(r fdbRaw) {
		rec := r.record(r.k.available(r.sc.Queue, r.sc.Ready))
		rec.reason, rec.deadAt = "x", r.sc.Now
		r.set(r.k.dead(r.sc.Queue, r.sc.Ready), rec.encode())
	}},
	{Name: "ReadyRecordWithALease", Want: []storage.ViolationKind{check.KindItemRecordState}, Break: func(r fdbRaw) {
		r.update(r.k.available(r.sc.Queue, r.sc.Ready), func(rec *record) { rec.lease = r.sc.Lease })
	}},
	{Name: "DeadRecordWithoutReason", Want: []storage.ViolationKind{check.KindItemRecordState}, Break: func(r fdbRaw) {
		r.update(r.k.dead(r.sc.Queue, r.sc.Dead), func(rec *record) { rec.reason, rec.deadAt = "", time.Time{} })
	}},
	{Name: "ReadyIndexEntryMissing", Want: []storage.ViolationKind{check.KindServeEntryCount}, Break: func(r fdbRaw) {
		r.clear(r.k.ready(r.sc.Queue, 0, r.sc.Now, r.sc.Ready))
	}},
	{Name: "ReadyIndexEntryOfAnInflightItem", Want: []storage.ViolationKind{check.KindServeEntryOrphan}, Break: func(r fdbRaw) {
		r.set(r.k.ready(r.sc.Queue, 0, r.sc.Now, r.sc.Held[0]), nil)
	}},
	{Name: "ReadyIndexEntryOfADelayedItem", Want: []storage.ViolationKind{check.KindServeEntryOrphan}, Break: func(r fdbRaw) {
		r.set(r.k.ready(r.sc.Queue, 2, r.sc.Now.Add(time.Hour), r.sc.Delayed), nil)
	}},
	{Name: "ReadyIndexEntryAtAnotherPriority", Want: []storage.ViolationKind{check.KindServeEntryMismatch}, Break: func(r fdbRaw) {
		r.clear(r.k.ready(r.sc.Queue, 0, r.sc.Now, r.sc.Ready))
		r.set(r.k.ready(r.sc.Queue, 7, r.sc.Now, r.sc.Ready), nil)
	}},
	{Name: "GlobalDelayedEntryMissing", Want: []storage.ViolationKind{check.KindDelayedEntryCount}, Break: func(r fdbRaw) {
		r.clear(r.k.delayAll(r.sc.Now.Add(time.Hour), r.sc.Queue, r.sc.Delayed))
	}},
	{Name: "DelayedEntryOfAReadyItem", Want: []storage.ViolationKind{check.KindDelayedEntryOrphan}, Break: func(r fdbRaw) {
		r.set(r.k.delayed(r.sc.Queue, r.sc.Now, r.sc.Ready), []byte{0})
	}},
	{Name: "DelayedEntryWithAnotherPriority", Want: []storage.ViolationKind{check.KindDelayedEntryMismatch}, Break: func(r fdbRaw) {
		r.set(r.k.delayed(r.sc.Queue, r.sc.Now.Add(time.Hour), r.sc.Delayed), []byte{9})
	}},
	{Name: "InflightItemDroppedFromItsLease", Want: []storage.ViolationKind{check.KindInflightListing}, Break: func(r fdbRaw) {
		lr := r.lease()
		lr.ids = []storage.ItemID{r.sc.Held[0]}
		r.setLease(lr)
	}},
	{Name: "LeaseWithoutItems", Want: []storage.ViolationKind{check.KindLeaseEmpty}, Break: func(r fdbRaw) { r.newLease(otherLease) }},
	{Name: "LeaseListsAReadyItem", Want: []storage.ViolationKind{check.KindLeaseItemMissing}, Break: func(r fdbRaw) {
		lr := r.lease()
		lr.ids = append(lr.ids, r.sc.Ready)
		r.setLease(lr)
	}},
	{Name: "LeaseListsAnotherLeasesItem", Want: []storage.ViolationKind{check.KindLeaseItemForeign}, Break: func(r fdbRaw) {
		r.update(r.k.inflight(r.sc.Queue, r.sc.Held[1]), func(rec *record) { rec.lease = otherLease })
		r.newLease(otherLease, r.sc.Held[1]) // and the first lease still lists it
	}},
	{Name: "LeaseExpiryEntryMissing", Want: []storage.ViolationKind{check.KindLeaseExpiryCount}, Break: func(r fdbRaw) {
		r.clear(r.k.expiry(r.sc.Now.Add(time.Minute), r.sc.Lease))
	}},
	{Name: "LeaseExpiryEntryOfNoLease", Want: []storage.ViolationKind{check.KindLeaseExpiryOrphan}, Break: func(r fdbRaw) {
		r.set(r.k.expiry(r.sc.Now, otherLease), nil)
	}},
	{Name: "LeaseExpiryEntryAtAnotherTime", Want: []storage.ViolationKind{check.KindLeaseExpiryMismatch}, Break: func(r fdbRaw) {
		r.clear(r.k.expiry(r.sc.Now.Add(time.Minute), r.sc.Lease))
		r.set(r.k.expiry(r.sc.Now, r.sc.Lease), nil)
	}},
	{Name: "CounterDrift", Want: []storage.ViolationKind{check.KindCounterMismatch}, Break: func(r fdbRaw) {
		r.tx(func(tx kv.Tx) { tx.Add(r.k.counter(r.sc.Queue, ctrReady), 1) })
	}},
	{Name: "TooManyAttempts", Want: []storage.ViolationKind{check.KindAttemptsExceeded}, Break: func(r fdbRaw) {
		r.update(r.k.inflight(r.sc.Queue, r.sc.Held[0]), func(rec *record) { rec.maxAttempts, rec.attempts = 1, 2 })
	}},
	{Name: "DedupExpiryEntryMissing", Want: []storage.ViolationKind{check.KindDedupExpiryCount}, Break: func(r fdbRaw) {
		r.clear(r.k.dedupExp(r.dedupExpiry(), r.sc.Queue, r.sc.DedupKey))
	}},
	{Name: "DedupExpiryEntryOfNoKey", Want: []storage.ViolationKind{check.KindDedupExpiryOrphan}, Break: func(r fdbRaw) {
		r.set(r.k.dedupExp(r.dedupExpiry(), r.sc.Queue, "other"), nil)
	}},
	{Name: "DedupExpiryEntryAtAnotherTime", Want: []storage.ViolationKind{check.KindDedupExpiryMismatch}, Break: func(r fdbRaw) {
		r.clear(r.k.dedupExp(r.dedupExpiry(), r.sc.Queue, r.sc.DedupKey))
		r.set(r.k.dedupExp(r.sc.Now, r.sc.Queue, r.sc.DedupKey), nil)
	}},
	{Name: "PayloadChunkMissing", Want: []storage.ViolationKind{check.KindPayloadMissing}, Break: func(r fdbRaw) {
		rec := r.record(r.k.available(r.sc.Queue, r.sc.Ready))
		require.True(r.t, rec.chunked)
		require.Equal(r.t, uint16(2), rec.nchunks)
		r.clear(r.k.chunk(rec.pid, 1))
	}},
	{Name: "ChunksOfNoItem", Want: []storage.ViolationKind{check.KindPayloadOrphan}, Break: func(r fdbRaw) {
		r.set(r.k.chunk([16]byte{1}, 0), []byte("x"))
	}},
	{Name: "ItemsChunksMarkedAsAPendingUpload", Want: []storage.ViolationKind{check.KindPayloadPending}, Break: func(r fdbRaw) {
		r.set(r.k.upload(r.sc.Now, r.record(r.k.available(r.sc.Queue, r.sc.Ready)).pid), nil)
	}},
}

// fdbCannot are the kinds fdbsync's layout cannot hold.
var fdbCannot = map[storage.ViolationKind]string{
	check.KindItemNoState: "an item's namespace (a, i, x) is its state",
}

// TestFDBCheck_FindsBrokenData breaks the data in the kv model behind the
// store's back, one way per case, and requires Check to report exactly the
// kinds the case names.
func TestFDBCheck_FindsBrokenData(t *testing.T) {
	t.Parallel()
	checktest.Run(t, fdbBreaks, fdbCannot, openModel,
		func(t *testing.T, s storage.Store, sc checktest.Scenario) fdbRaw {
			fs := s.(*Store)
			return fdbRaw{t: t, s: fs, k: fs.k, sc: sc}
		})
}

// TestFDBCheck_PendingUploadIsNotAnOrphan: chunks no item names are fine
// while their upload entry says an enqueue may still commit them.
func TestFDBCheck_PendingUploadIsNotAnOrphan(t *testing.T) {
	t.Parallel()
	s := openModel(t).(*Store)
	sc := checktest.Build(t, s)
	r := fdbRaw{t: t, s: s, k: s.k, sc: sc}
	r.set(r.k.chunk([16]byte{1}, 0), []byte("x"))
	r.set(r.k.upload(sc.Now, [16]byte{1}), nil)
	checktest.RequireKinds(t, s)
}

func openModel(t *testing.T) storage.Store {
	s, err := New(fdbmodel.New(fdbmodel.Options{Clock: clock.NewMock()}), Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}
