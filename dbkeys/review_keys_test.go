package dbkeys

// Review (session 74) of the key layout: the byte order of every key is
// the order the engine relies on (priority, then visible_at, then id; the
// global time indexes by instant first), at the extreme instants and
// priorities; no queue's prefix range holds another queue's keys, whatever
// bytes the names have (0x00, 0xFF, the escape bytes) or when one name is
// a prefix of another; decoders refuse truncated and garbled keys with
// ErrMalformed instead of panicking; every key round-trips.

import (
	"bytes"
	"cmp"
	"errors"
	"math"
	"testing"
)

var reviewQueues = []string{"", "a", "ab", "a.b", "a-", "a\x00", "a\x00\x00", "a\x00\x01", "a\x00\xff", "a\x01", "a\xff",
	"a\xff\xff", "\x00", "\x01", "\xff", "b"}

var reviewTimes = []int64{math.MinInt64, math.MinInt64 + 1, -1_000_000_000, -1, 0, 1, 1_700_000_000_000_000_000, math.MaxInt64 - 1, math.MaxInt64}

func reviewID(b []byte) [16]byte {
	var x [16]byte
	copy(x[:], b)
	return x
}

// inRange reports whether k lies in the scan range of prefix p.
func inRange(k, p []byte) bool {
	end := PrefixEnd(p)
	return bytes.Compare(k, p) >= 0 && (end == nil || bytes.Compare(k, end) < 0)
}

// reviewKeyProps checks every property of one pair of inputs.
func reviewKeyProps(t *testing.T, q1, q2 string, p1, p2 uint8, t1, t2 int64, x1, x2 [16]byte, d1, d2 string) {
	t.Helper()
	// Round trips.
	for _, kind := range []struct {
		name string
		enc  func(string, [16]byte) []byte
		dec  func([]byte) (string, [16]byte, error)
		pre  func(string) []byte
	}{
		{"available", AvailableKey, DecodeAvailableKey, AvailablePrefix},
		{"in_progress", InProgressKey, DecodeInProgressKey, InProgressPrefix},
		{"dlq", DLQKey, DecodeDLQKey, DLQPrefix},
		{"payload", PayloadKey, DecodePayloadKey, PayloadPrefix},
	} {
		k1, k2 := kind.enc(q1, x1), kind.enc(q2, x2)
		if q, x, err := kind.dec(k1); err != nil || q != q1 || x != x1 {
			t.Fatalf("%s round trip %q %x: %q %x %v", kind.name, q1, x1, q, x, err)
		}
		if in := inRange(k2, kind.pre(q1)); in != (q1 == q2) {
			t.Fatalf("%s: key of %q in the range of %q: %v", kind.name, q2, q1, in)
		}
		if !bytes.HasPrefix(k1, kind.pre(q1)) {
			t.Fatalf("%s: key of %q lacks its own prefix", kind.name, q1)
		}
		if got, want := bytes.Compare(k1, k2), cmp.Or(cmp.Compare(q1, q2), bytes.Compare(x1[:], x2[:])); got != want {
			t.Fatalf("%s order (%q,%x) vs (%q,%x): %d want %d", kind.name, q1, x1, q2, x2, got, want)
		}
	}

	// Serve order: queue, priority ascending, visible_at, id.
	v1, v2 := VisibilityKey(q1, p1, t1, x1), VisibilityKey(q2, p2, t2, x2)
	if q, p, vt, x, err := DecodeVisibilityKey(v1); err != nil || q != q1 || p != p1 || vt != t1 || x != x1 {
		t.Fatalf("visibility round trip: %v", err)
	}
	if p, vt, x, err := DecodeVisibilitySuffix(v1[len(VisibilityPrefix(q1)):]); err != nil || p != p1 || vt != t1 || x != x1 {
		t.Fatalf("visibility suffix round trip: %v", err)
	}
	want := cmp.Or(cmp.Compare(q1, q2), cmp.Compare(p1, p2), cmp.Compare(t1, t2), bytes.Compare(x1[:], x2[:]))
	if got := bytes.Compare(v1, v2); got != want {
		t.Fatalf("visibility order (%q,%d,%d) vs (%q,%d,%d): %d want %d", q1, p1, t1, q2, p2, t2, got, want)
	}
	if in := inRange(v2, VisibilityPrefix(q1)); in != (q1 == q2) {
		t.Fatalf("visibility: key of %q in the range of %q: %v", q2, q1, in)
	}
	if in := inRange(v2, VisibilityPrioPrefix(q1, p1)); in != (q1 == q2 && p1 == p2) {
		t.Fatalf("visibility: key (%q,%d) in the range of (%q,%d): %v", q2, p2, q1, p1, in)
	}
	// A scan of [VisibilityPrioPrefix(q, p), VisibilityPrioBound(q, p, t))
	// finds exactly q's entries at p with visible_at < t.
	if q1 == q2 && p1 == p2 {
		lo, hi := VisibilityPrioPrefix(q1, p1), VisibilityPrioBound(q1, p1, t2)
		if in := bytes.Compare(v1, lo) >= 0 && bytes.Compare(v1, hi) < 0; in != (t1 < t2) {
			t.Fatalf("visibility bound: entry at %d under bound %d: %v", t1, t2, in)
		}
	}

	// Global time indexes: instant first, whatever the queue.
	if vt, q, x, err := DecodeDelayedKey(DelayedKey(t1, q1, x1)); err != nil || vt != t1 || q != q1 || x != x1 {
		t.Fatalf("delayed round trip: %v", err)
	}
	if got, want := bytes.Compare(DelayedKey(t1, q1, x1), DelayedKey(t2, q2, x2)),
		cmp.Or(cmp.Compare(t1, t2), cmp.Compare(q1, q2), bytes.Compare(x1[:], x2[:])); got != want {
		t.Fatalf("delayed order: %d want %d", got, want)
	}
	if et, l, err := DecodeLeaseExpiryKey(LeaseExpiryKey(t1, x1)); err != nil || et != t1 || l != x1 {
		t.Fatalf("lease_expiry round trip: %v", err)
	}
	if got, want := bytes.Compare(LeaseExpiryKey(t1, x1), LeaseExpiryKey(t2, x2)), cmp.Or(cmp.Compare(t1, t2), bytes.Compare(x1[:], x2[:])); got != want {
		t.Fatalf("lease_expiry order: %d want %d", got, want)
	}
	if et, q, d, err := DecodeDedupExpiryKey(DedupExpiryKey(t1, q1, d1)); err != nil || et != t1 || q != q1 || d != d1 {
		t.Fatalf("dedup_expiry round trip: %v", err)
	}
	if got, want := bytes.Compare(DedupExpiryKey(t1, q1, d1), DedupExpiryKey(t2, q2, d2)),
		cmp.Or(cmp.Compare(t1, t2), cmp.Compare(q1, q2), cmp.Compare(d1, d2)); got != want {
		t.Fatalf("dedup_expiry order: %d want %d", got, want)
	}
	for _, ns := range []struct {
		b   byte
		key []byte
	}{{NsLeaseExpiry, LeaseExpiryKey(t1, x1)}, {NsDelayed, DelayedKey(t1, q1, x1)}, {NsDedupExpiry, DedupExpiryKey(t1, q1, d1)}} {
		if below := bytes.Compare(ns.key, TimeBound(ns.b, t2)) < 0; below != (t1 < t2) {
			t.Fatalf("namespace %#x: entry at %d below TimeBound(%d): %v", ns.b, t1, t2, below)
		}
		if !inRange(ns.key, NamespacePrefix(ns.b)) {
			t.Fatalf("namespace %#x: entry outside its namespace", ns.b)
		}
	}

	// Dedup keys: the raw key last, after the terminated queue.
	dk1, dk2 := DedupKey(q1, d1), DedupKey(q2, d2)
	if q, d, err := DecodeDedupKey(dk1); err != nil || q != q1 || d != d1 {
		t.Fatalf("dedup round trip: %v", err)
	}
	if in := inRange(dk2, DedupPrefix(q1)); in != (q1 == q2) {
		t.Fatalf("dedup: key of %q in the range of %q: %v", q2, q1, in)
	}
	if got, want := bytes.Compare(dk1, dk2), cmp.Or(cmp.Compare(q1, q2), cmp.Compare(d1, d2)); got != want {
		t.Fatalf("dedup order: %d want %d", got, want)
	}

	// Meta keys: one kind's prefix never holds another kind's keys.
	for _, kind := range []struct {
		enc func(string) []byte
		dec func([]byte) (string, error)
		pre []byte
	}{
		{QueueConfigKey, DecodeQueueConfigKey, QueueConfigPrefix()},
		{CountersKey, DecodeCountersKey, CountersPrefix()},
		{DeletingKey, DecodeDeletingKey, DeletingPrefix()},
	} {
		k := kind.enc(q1)
		if q, err := kind.dec(k); err != nil || q != q1 {
			t.Fatalf("meta round trip %q: %v", q1, err)
		}
		if !inRange(k, kind.pre) {
			t.Fatalf("meta key %x outside its prefix %x", k, kind.pre)
		}
		for _, other := range [][]byte{MetaFormatKey(), MetaIDSeqKey()} {
			if inRange(other, kind.pre) {
				t.Fatalf("meta key %x inside the prefix %x", other, kind.pre)
			}
		}
		if got, want := bytes.Compare(k, kind.enc(q2)), cmp.Compare(q1, q2); got != want {
			t.Fatalf("meta order %q vs %q: %d want %d", q1, q2, got, want)
		}
	}

	// Ids: sequence first, then the enqueue instant.
	s1, s2 := uint64(t1)^uint64(p1), uint64(t2)^uint64(p2)
	n1, n2 := NewID(s1, t1), NewID(s2, t2)
	if IDSeq(n1) != s1 || IDEnqueuedAt(n1) != t1 {
		t.Fatalf("id round trip")
	}
	if got, want := bytes.Compare(n1[:], n2[:]), cmp.Or(cmp.Compare(s1, s2), cmp.Compare(t1, t2)); got != want {
		t.Fatalf("id order: %d want %d", got, want)
	}
}

// FuzzReviewKeys: every property above for arbitrary inputs; as a normal
// test it runs the seed corpus (the extreme instants and priorities,
// names with escape bytes and names that are prefixes of each other).
func FuzzReviewKeys(f *testing.F) {
	ids := [][]byte{nil, bytes.Repeat([]byte{0xFF}, 16), {0, 0, 0, 0, 0, 0, 0, 1}}
	for i, q1 := range reviewQueues {
		for j, q2 := range reviewQueues {
			t1, t2 := reviewTimes[(i+j)%len(reviewTimes)], reviewTimes[(i*3+j)%len(reviewTimes)]
			p1, p2 := []uint8{0, 1, 254, 255}[i%4], []uint8{0, 255}[j%2]
			f.Add(q1, q2, p1, p2, t1, t2, ids[i%3], ids[j%3], q2, q1+"\x00")
		}
	}
	f.Add("a", "a", uint8(255), uint8(255), int64(math.MaxInt64), int64(math.MinInt64), []byte{1}, []byte{1}, "", "\x00")
	f.Add("a", "a", uint8(7), uint8(7), int64(-1), int64(0), []byte{1}, []byte{1}, "\xff", "\xff\x00")
	f.Fuzz(func(t *testing.T, q1, q2 string, p1, p2 uint8, t1, t2 int64, id1, id2 []byte, d1, d2 string) {
		reviewKeyProps(t, q1, q2, p1, p2, t1, t2, reviewID(id1), reviewID(id2), d1, d2)
	})
}

// TestReviewKeys_AllPairs: the properties over every pair of the edge
// queue names and every pair of edge instants, at the edge priorities.
func TestReviewKeys_AllPairs(t *testing.T) {
	t.Parallel()
	ids := [][16]byte{{}, reviewID(bytes.Repeat([]byte{0xFF}, 16)), reviewID([]byte{0x80})}
	for _, q1 := range reviewQueues {
		for _, q2 := range reviewQueues {
			for ti, t1 := range reviewTimes {
				for _, t2 := range reviewTimes {
					for _, p := range [][2]uint8{{0, 0}, {255, 255}, {0, 255}, {255, 254}} {
						reviewKeyProps(t, q1, q2, p[0], p[1], t1, t2, ids[ti%3], ids[(ti+1)%3], q2, q1)
					}
				}
			}
		}
	}
}

// TestReviewKeys_ShortAndGarbledKeysAreRefused: every strict truncation
// of a fixed-shape key, and each key with a byte appended, fails with
// ErrMalformed (never a panic, never a wrong decode); so do the escape
// sequences no encoder writes. (A dedup key cut inside its raw last
// component is another valid dedup key, so dedup keys are cut only inside
// the queue name.)
func TestReviewKeys_ShortAndGarbledKeysAreRefused(t *testing.T) {
	t.Parallel()
	type kind struct {
		name  string
		key   []byte
		minOK int // the shortest prefix of key that still decodes (len(key) for fixed-shape keys)
		dec   func([]byte) error
	}
	x := reviewID([]byte{0, 0xFF, 1})
	for _, q := range reviewQueues {
		qlen := len(AppendQueue(nil, q))
		e1 := func(f func([]byte) (string, [16]byte, error)) func([]byte) error {
			return func(b []byte) error { _, _, err := f(b); return err }
		}
		kinds := []kind{
			{"available", AvailableKey(q, x), 0, e1(DecodeAvailableKey)},
			{"in_progress", InProgressKey(q, x), 0, e1(DecodeInProgressKey)},
			{"dlq", DLQKey(q, x), 0, e1(DecodeDLQKey)},
			{"payload", PayloadKey(q, x), 0, e1(DecodePayloadKey)},
			{"visibility", VisibilityKey(q, 255, math.MaxInt64, x), 0, func(b []byte) error { _, _, _, _, err := DecodeVisibilityKey(b); return err }},
			{"lease", LeaseKey(x), 0, func(b []byte) error { _, err := DecodeLeaseKey(b); return err }},
			{"lease_expiry", LeaseExpiryKey(math.MinInt64, x), 0, func(b []byte) error { _, _, err := DecodeLeaseExpiryKey(b); return err }},
			{"delayed", DelayedKey(-1, q, x), 0, func(b []byte) error { _, _, _, err := DecodeDelayedKey(b); return err }},
			{"config", QueueConfigKey(q), 0, func(b []byte) error { _, err := DecodeQueueConfigKey(b); return err }},
			{"counters", CountersKey(q), 0, func(b []byte) error { _, err := DecodeCountersKey(b); return err }},
			{"deleting", DeletingKey(q), 0, func(b []byte) error { _, err := DecodeDeletingKey(b); return err }},
			{"dedup", DedupKey(q, "k\x00\x01"), 1 + qlen, func(b []byte) error { _, _, err := DecodeDedupKey(b); return err }},
			{"dedup_expiry", DedupExpiryKey(0, q, "k"), 9 + qlen, func(b []byte) error { _, _, _, err := DecodeDedupExpiryKey(b); return err }},
		}
		for _, k := range kinds {
			if k.minOK == 0 {
				k.minOK = len(k.key)
			}
			if err := k.dec(k.key); err != nil {
				t.Fatalf("%s of %q: %v", k.name, q, err)
			}
			for n := 0; n < k.minOK; n++ {
				if err := k.dec(k.key[:n]); !errors.Is(err, ErrMalformed) {
					t.Fatalf("%s of %q cut to %d bytes: %v, want ErrMalformed", k.name, q, n, err)
				}
			}
			if k.minOK == len(k.key) {
				for _, extra := range []byte{0, 1, 0xFF} {
					if err := k.dec(append(bytes.Clone(k.key), extra)); !errors.Is(err, ErrMalformed) {
						t.Fatalf("%s of %q with a byte %#x appended: %v, want ErrMalformed", k.name, q, extra, err)
					}
				}
			}
			// Another namespace byte.
			g := bytes.Clone(k.key)
			g[0] ^= 0x40
			if err := k.dec(g); !errors.Is(err, ErrMalformed) {
				t.Fatalf("%s of %q in another namespace: %v", k.name, q, err)
			}
		}
	}
	// Escapes no encoder writes: 0x00 followed by anything but 0xFF or
	// 0x01, or at the end, or no terminator at all.
	y := reviewID(bytes.Repeat([]byte{0x11}, 16))
	for _, name := range [][]byte{{0x00}, {'a', 0x00}, {'a', 0x00, 0x00, 0x01}, {'a', 0x00, 0x02}, {'a', 0x00, 0xFE, 0x00, 0x01}, {'a'}} {
		k := append([]byte{NsAvailable}, name...)
		k = append(k, y[:]...)
		if q, id, err := DecodeAvailableKey(k); !errors.Is(err, ErrMalformed) {
			t.Fatalf("garbled queue %x: %q %x %v, want ErrMalformed", name, q, id, err)
		}
	}
}
