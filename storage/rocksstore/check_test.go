package rocksstore

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/check"
	"github.com/leaseq/leaseq/storage/check/checktest"
)

// raw writes and reads keys behind the store's back, as damage would.
type raw struct {
	t  *testing.T
	s  *Store
	sc checktest.Scenario
}

func (r raw) put(k, v []byte) { require.NoError(r.t, r.s.db.put(k, v, true)) }
func (r raw) del(k []byte) {
	var w writeBuf
	w.del(k)
	require.NoError(r.t, r.s.db.write(&w, true))
}
func (r raw) addCounters(c dbkeys.Counters) {
	var w writeBuf
	w.merge(dbkeys.CountersKey(r.sc.Queue), dbkeys.EncodeCounters(c))
	require.NoError(r.t, r.s.db.write(&w, true))
}

func (r raw) item(k []byte) dbkeys.ItemRecord {
	v, ok, err := r.s.getRaw(k)
	require.NoError(r.t, err)
	require.True(r.t, ok, "no record at %x", k)
	rec, err := dbkeys.DecodeItem(v)
	require.NoError(r.t, err)
	return rec
}

// update rewrites the item record at k.
func (r raw) update(k []byte, fn func(*dbkeys.ItemRecord)) {
	rec := r.item(k)
	fn(&rec)
	r.put(k, dbkeys.EncodeItem(rec))
}

func (r raw) lease() dbkeys.LeaseRecord {
	v, ok, err := r.s.getRaw(dbkeys.LeaseKey(r.sc.Lease))
	require.NoError(r.t, err)
	require.True(r.t, ok)
	lr, err := dbkeys.DecodeLease(v)
	require.NoError(r.t, err)
	return lr
}

func (r raw) dedupExpiry() int64 {
	v, ok, err := r.s.getRaw(dbkeys.DedupKey(r.sc.Queue, r.sc.DedupKey))
	require.NoError(r.t, err)
	require.True(r.t, ok)
	rec, err := dbkeys.DecodeDedup(v)
	require.NoError(r.t, err)
	return rec.ExpiresAt
}

// newLease writes a lease record and its expiry entry, counted.
func (r raw) newLease(token storage.LeaseID, ids ...[16]byte) {
	exp := r.sc.Now.Add(time.Minute).UnixNano()
	r.put(dbkeys.LeaseKey(token), dbkeys.EncodeLease(dbkeys.LeaseRecord{Queue: r.sc.Queue, ExpiresAt: exp, IDs: ids}))
	r.put(dbkeys.LeaseExpiryKey(exp, token), dbkeys.Marker())
	r.addCounters(dbkeys.Counters{Leases: 1})
}

var other = storage.LeaseID{0xee, 1}

// rocksBreaks are the break-the-data cases of rocksstore: each writes or
// deletes raw keys with the DB handle and names the kinds Check must
// report, exactly.
var rocksBreaks = []checktest.Case[raw]{
	{Name: "KeyThatDoesNotDecode", Want: []storage.ViolationKind{check.KindCorrupt}, Break: func(r raw) {
		r.put([]byte{dbkeys.NsAvailable, 'q'}, []byte{1}) // no queue terminator, no id
	}},
	{Name: "RecordThatDoesNotDecode", Want: []storage.ViolationKind{check.KindCorrupt}, Break: func(r raw) {
		r.put(dbkeys.LeaseKey(other), []byte{0xff})
	}},
	// A copy of a dead item under a queue with no config; it keeps its
	// id, which is then in two queues.
	{Name: "DeadItemOfAQueueWithoutConfig", Want: []storage.ViolationKind{check.KindItemDuplicate, check.KindUnknownQueue}, Break: func(r raw) {
		rec := r.item(dbkeys.DLQKey(r.sc.Queue, r.sc.Dead))
		r.put(dbkeys.DLQKey("gone", r.sc.Dead), dbkeys.EncodeItem(rec))
	}},
	{Name: "ReadyItemAlsoInTheDLQ", Want: []storage.ViolationKind{check.KindItemDuplicate}, Break: func(r raw) {
		rec := r.item(dbkeys.AvailableKey(r.sc.Queue, r.sc.Ready))
		rec.Dead, rec.Reason = true, "x"
		r.put(dbkeys.DLQKey(r.sc.Queue, r.sc.Ready), dbkeys.EncodeItem(rec))
	}},
	{Name: "ReadyRecordWithALease", Want: []storage.ViolationKind{check.KindItemRecordState}, Break: func(r raw) {
		r.update(dbkeys.AvailableKey(r.sc.Queue, r.sc.Ready), func(rec *dbkeys.ItemRecord) { rec.HasLease, rec.Lease = true, r.sc.Lease })
	}},
	{Name: "DeadRecordWithoutDeathRecord", Want: []storage.ViolationKind{check.KindItemRecordState}, Break: func(r raw) {
		r.update(dbkeys.DLQKey(r.sc.Queue, r.sc.Dead), func(rec *dbkeys.ItemRecord) { rec.Dead = false })
	}},
	{Name: "VisibilityEntryMissing", Want: []storage.ViolationKind{check.KindServeEntryCount}, Break: func(r raw) {
		r.del(dbkeys.VisibilityKey(r.sc.Queue, 0, r.sc.Now.UnixNano(), r.sc.Ready))
	}},
	{Name: "VisibilityEntryOfAnInflightItem", Want: []storage.ViolationKind{check.KindServeEntryOrphan}, Break: func(r raw) {
		r.put(dbkeys.VisibilityKey(r.sc.Queue, 0, r.sc.Now.UnixNano(), r.sc.Held[0]), nil)
	}},
	{Name: "VisibilityEntryAtAnotherPriority", Want: []storage.ViolationKind{check.KindServeEntryMismatch}, Break: func(r raw) {
		r.del(dbkeys.VisibilityKey(r.sc.Queue, 0, r.sc.Now.UnixNano(), r.sc.Ready))
		r.put(dbkeys.VisibilityKey(r.sc.Queue, 7, r.sc.Now.UnixNano(), r.sc.Ready), nil)
	}},
	// A delayed item without its delayed entry reads as promoted (the
	// sweeper deletes only the entry), so what breaks is the counters;
	// two entries necessarily disagree on visible_at.
	{Name: "DelayedEntryMissing", Want: []storage.ViolationKind{check.KindCounterMismatch}, Break: func(r raw) {
		r.del(dbkeys.DelayedKey(r.sc.Now.Add(time.Hour).UnixNano(), r.sc.Queue, r.sc.Delayed))
	}},
	{Name: "TwoDelayedEntries", Want: []storage.ViolationKind{check.KindDelayedEntryCount, check.KindDelayedEntryMismatch}, Break: func(r raw) {
		r.put(dbkeys.DelayedKey(r.sc.Now.UnixNano(), r.sc.Queue, r.sc.Delayed), dbkeys.Marker())
	}},
	{Name: "DelayedEntryOfAReadyItem", Want: []storage.ViolationKind{check.KindDelayedEntryOrphan}, Break: func(r raw) {
		r.put(dbkeys.DelayedKey(r.sc.Now.UnixNano(), r.sc.Queue, r.sc.Ready), dbkeys.Marker())
	}},
	{Name: "DelayedEntryAtAnotherTime", Want: []storage.ViolationKind{check.KindDelayedEntryMismatch}, Break: func(r raw) {
		r.del(dbkeys.DelayedKey(r.sc.Now.Add(time.Hour).UnixNano(), r.sc.Queue, r.sc.Delayed))
		r.put(dbkeys.DelayedKey(r.sc.Now.Add(2*time.Hour).UnixNano(), r.sc.Queue, r.sc.Delayed), dbkeys.Marker())
	}},
	{Name: "InflightItemDroppedFromItsLease", Want: []storage.ViolationKind{check.KindInflightListing}, Break: func(r raw) {
		lr := r.lease()
		lr.IDs = [][16]byte{r.sc.Held[0]}
		r.put(dbkeys.LeaseKey(r.sc.Lease), dbkeys.EncodeLease(lr))
	}},
	{Name: "LeaseWithoutItems", Want: []storage.ViolationKind{check.KindLeaseEmpty}, Break: func(r raw) { r.newLease(other) }},
	{Name: "LeaseListsAReadyItem", Want: []storage.ViolationKind{check.KindLeaseItemMissing}, Break: func(r raw) {
		lr := r.lease()
		lr.IDs = append(lr.IDs, r.sc.Ready)
		r.put(dbkeys.LeaseKey(r.sc.Lease), dbkeys.EncodeLease(lr))
	}},
	{Name: "LeaseListsAnotherLeasesItem", Want: []storage.ViolationKind{check.KindLeaseItemForeign}, Break: func(r raw) {
		r.update(dbkeys.InProgressKey(r.sc.Queue, r.sc.Held[1]), func(rec *dbkeys.ItemRecord) { rec.Lease = other })
		r.newLease(other, r.sc.Held[1]) // and the first lease still lists it
	}},
	{Name: "LeaseExpiryEntryMissing", Want: []storage.ViolationKind{check.KindLeaseExpiryCount}, Break: func(r raw) {
		r.del(dbkeys.LeaseExpiryKey(r.sc.Now.Add(time.Minute).UnixNano(), r.sc.Lease))
	}},
	{Name: "LeaseExpiryEntryOfNoLease", Want: []storage.ViolationKind{check.KindLeaseExpiryOrphan}, Break: func(r raw) {
		r.put(dbkeys.LeaseExpiryKey(r.sc.Now.UnixNano(), other), dbkeys.Marker())
	}},
	{Name: "LeaseExpiryEntryAtAnotherTime", Want: []storage.ViolationKind{check.KindLeaseExpiryMismatch}, Break: func(r raw) {
		r.del(dbkeys.LeaseExpiryKey(r.sc.Now.Add(time.Minute).UnixNano(), r.sc.Lease))
		r.put(dbkeys.LeaseExpiryKey(r.sc.Now.UnixNano(), r.sc.Lease), dbkeys.Marker())
	}},
	{Name: "CounterDrift", Want: []storage.ViolationKind{check.KindCounterMismatch}, Break: func(r raw) { r.addCounters(dbkeys.Counters{Ready: 1}) }},
	{Name: "TooManyAttempts", Want: []storage.ViolationKind{check.KindAttemptsExceeded}, Break: func(r raw) {
		r.update(dbkeys.InProgressKey(r.sc.Queue, r.sc.Held[0]), func(rec *dbkeys.ItemRecord) { rec.MaxAttempts, rec.Attempts = 1, 2 })
	}},
	{Name: "DedupExpiryEntryMissing", Want: []storage.ViolationKind{check.KindDedupExpiryCount}, Break: func(r raw) {
		r.del(dbkeys.DedupExpiryKey(r.dedupExpiry(), r.sc.Queue, r.sc.DedupKey))
	}},
	{Name: "DedupExpiryEntryOfNoKey", Want: []storage.ViolationKind{check.KindDedupExpiryOrphan}, Break: func(r raw) {
		r.put(dbkeys.DedupExpiryKey(r.dedupExpiry(), r.sc.Queue, "other"), dbkeys.Marker())
	}},
	{Name: "DedupExpiryEntryAtAnotherTime", Want: []storage.ViolationKind{check.KindDedupExpiryMismatch}, Break: func(r raw) {
		r.del(dbkeys.DedupExpiryKey(r.dedupExpiry(), r.sc.Queue, r.sc.DedupKey))
		r.put(dbkeys.DedupExpiryKey(r.sc.Now.UnixNano(), r.sc.Queue, r.sc.DedupKey), dbkeys.Marker())
	}},
	{Name: "ExternalPayloadMissing", Want: []storage.ViolationKind{check.KindPayloadMissing}, Break: func(r raw) {
		r.del(dbkeys.PayloadKey(r.sc.Queue, r.sc.Ready))
	}},
	{Name: "PayloadOfNoItem", Want: []storage.ViolationKind{check.KindPayloadOrphan}, Break: func(r raw) {
		r.put(dbkeys.PayloadKey(r.sc.Queue, storage.ItemID{1}), dbkeys.EncodePayload([]byte("x")))
	}},
}

// rocksCannot are the kinds rocksstore's layout cannot hold.
var rocksCannot = map[storage.ViolationKind]string{
	check.KindItemNoState: "an item's namespace is its state",
	check.KindPayloadPending: "a payload is written in the enqueue's own batch; " +
		"nothing marks it pending",
}

// TestRocksStore_CheckFindsBrokenData breaks the database behind the
// store's back, one way per case, and requires Check to report exactly the
// kinds the case names, and CheckDir (on the same directory, read-only,
// after Close) the same report.
func TestRocksStore_CheckFindsBrokenData(t *testing.T) {
	t.Parallel()
	checktest.Run(t, rocksBreaks, rocksCannot,
		func(t *testing.T) storage.Store {
			dir := t.TempDir()
			s, err := Open(dir, testOptions(t))
			require.NoError(t, err)
			t.Cleanup(func() {
				rep, err := s.Check(context.Background())
				require.NoError(t, err)
				// The store's memory no longer matches its data: close it
				// without the usual Check.
				require.NoError(t, s.Close())
				dirRep, err := CheckDir(context.Background(), dir)
				require.NoError(t, err)
				require.Equal(t, rep, dirRep, "CheckDir reads the same data")
			})
			return s
		},
		func(t *testing.T, s storage.Store, sc checktest.Scenario) raw {
			return raw{t: t, s: s.(*Store), sc: sc}
		})
}
