package rocksstore

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
)

// Review (session 74) of raiseLatest's binary search over the
// dedup_expiry index. Raw entries (no queue config: Open does not judge
// dedup keys), so no testBundle check.
func TestReviewS74_LatestFromDedupExpiryEdges(t *testing.T) {
	t.Parallel()
	base := at(0).UnixNano()
	id := func(enq int64) [16]byte { return dbkeys.NewID(1, enq) }
	type entry struct {
		exp      int64
		q, key   string
		enq      int64 // the record's id's enqueue instant
		noRecord bool  // an orphan expiry entry
		recExp   int64 // the record's expiry when not exp (a stale entry)
		gone     bool  // written, then deleted (a tombstone)
	}
	for _, c := range []struct {
		name string
		es   []entry
		want int64 // Latest, unix ns; 0: none
	}{
		{"Empty", nil, 0},
		{"OnlyTombstones", []entry{{exp: base + 10, q: "q", key: "a", enq: base, gone: true}, {exp: base + 20, q: "q", key: "b", enq: base, gone: true}}, 0},
		// The sign flip: an expiry before 1970 sorts below every later one.
		{"NegativeAndPositive", []entry{{exp: -int64(time.Hour), q: "q", key: "a", enq: base + 7}, {exp: base + int64(time.Hour), q: "q", key: "b", enq: base + 3}}, base + 3},
		{"AllNegative", []entry{{exp: -int64(2 * time.Hour), q: "q", key: "a", enq: -int64(3 * time.Hour)}, {exp: -int64(time.Hour), q: "q", key: "b", enq: 5}}, 5},
		{"MaxExpiry", []entry{{exp: base, q: "q", key: "a", enq: base + 9}, {exp: math.MaxInt64, q: "q", key: "b", enq: base + 4}}, base + 4},
		{"TombstonesAboveTheLast", []entry{{exp: base, q: "q", key: "a", enq: base + 2}, {exp: base + 50, q: "q", key: "b", enq: base + 8, gone: true}}, base + 2},
		// A last entry whose record is gone, or expires at another time:
		// open succeeds (Check reports them); the record's id counts.
		{"OrphanLast", []entry{{exp: base, q: "q", key: "a", enq: base + 2}, {exp: base + 50, q: "q", key: "b", noRecord: true}}, 0},
		{"StaleLast", []entry{{exp: base, q: "q", key: "a", enq: base + 2}, {exp: base + 50, q: "q", key: "b", enq: base + 6, recExp: base + 40}}, base + 6},
		{"SameExpiryTwoQueues", []entry{{exp: base + 50, q: "a", key: "k", enq: base + 1}, {exp: base + 50, q: "b", key: "k", enq: base + 1}}, base + 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			s, err := Open(dir, testOptions(t))
			require.NoError(t, err)
			var w writeBuf
			for _, e := range c.es {
				ek := dbkeys.DedupExpiryKey(e.exp, e.q, e.key)
				w.put(ek, dbkeys.Marker())
				if !e.noRecord {
					re := e.exp
					if e.recExp != 0 {
						re = e.recExp
					}
					w.put(dbkeys.DedupKey(e.q, e.key), dbkeys.EncodeDedup(dbkeys.DedupRecord{ID: id(e.enq), ExpiresAt: re}))
				}
			}
			require.NoError(t, s.db.write(&w, true))
			w.reset()
			for _, e := range c.es {
				if e.gone {
					w.del(dbkeys.DedupExpiryKey(e.exp, e.q, e.key))
					w.del(dbkeys.DedupKey(e.q, e.key))
				}
			}
			require.NoError(t, s.db.write(&w, true))
			require.NoError(t, s.Close())
			s, err = Open(dir, testOptions(t))
			require.NoError(t, err, "open refused")
			defer func() { require.NoError(t, s.Close()) }()
			var want time.Time
			if c.want > 0 {
				want = instant(c.want)
			}
			require.True(t, s.Latest().Equal(want), "Latest %v, want %v", s.Latest(), want)
		})
	}
}
