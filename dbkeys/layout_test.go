package dbkeys

// Properties of the layout as a whole: every queue's prefix range holds
// exactly its keys, whatever bytes its name has; the time-ordered indexes
// sort and split at the extreme instants; decoders refuse truncated and
// corrupt values with ErrMalformed and never over-allocate; values over
// 64 KiB round-trip.

import (
	"bytes"
	"cmp"
	"errors"
	"math"
	"math/rand"
	"strings"
	"testing"
)

var layoutQueues = []string{"", "a", "a\x00", "a\x00\x00", "a\x00\x01", "a\x01", "a\xff", "a\x00\xff", "ab", "a\x00b",
	"\x00", "\x00\x01", "\x00\xff", "\xff", "\xff\xff", "b", strings.Repeat("z", 300), "a\x01\x00"}

var layoutTimes = []int64{math.MinInt64, math.MinInt64 + 1, -1 << 40, -2, -1, 0, 1, 2, 1 << 40, math.MaxInt64 - 1, math.MaxInt64}

func layoutID(r *rand.Rand) [16]byte {
	var x [16]byte
	switch r.Intn(4) {
	case 0:
	case 1:
		for i := range x {
			x[i] = 0xFF
		}
	default:
		r.Read(x[:])
	}
	return x
}

// Prefix ranges: a key of queue q2 lies in [prefix(q1), PrefixEnd(prefix(q1))) iff q1 == q2.
func TestLayout_PrefixRangesAreExact(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	type pk struct {
		name   string
		prefix func(string) []byte
		key    func(string) []byte
	}
	kinds := []pk{
		{"available", AvailablePrefix, func(q string) []byte { return AvailableKey(q, layoutID(r)) }},
		{"in_progress", InProgressPrefix, func(q string) []byte { return InProgressKey(q, layoutID(r)) }},
		{"dlq", DLQPrefix, func(q string) []byte { return DLQKey(q, layoutID(r)) }},
		{"payload", PayloadPrefix, func(q string) []byte { return PayloadKey(q, layoutID(r)) }},
		{"visibility", VisibilityPrefix, func(q string) []byte {
			return VisibilityKey(q, uint8(r.Intn(256)), layoutTimes[r.Intn(len(layoutTimes))], layoutID(r))
		}},
		{"vis255", func(q string) []byte { return VisibilityPrioPrefix(q, 255) }, func(q string) []byte {
			return VisibilityKey(q, 255, layoutTimes[r.Intn(len(layoutTimes))], layoutID(r))
		}},
		{"dedup", DedupPrefix, func(q string) []byte {
			k := []string{"", "\x00", "\x00\x01", "\xff\xff", "x"}[r.Intn(5)]
			return DedupKey(q, k)
		}},
	}
	for _, kind := range kinds {
		for _, q1 := range layoutQueues {
			lo := kind.prefix(q1)
			hi := PrefixEnd(lo)
			for _, q2 := range layoutQueues {
				for i := 0; i < 20; i++ {
					k := kind.key(q2)
					in := bytes.Compare(k, lo) >= 0 && (hi == nil || bytes.Compare(k, hi) < 0)
					if in != (q1 == q2) {
						t.Fatalf("%s: key %x of %q in range of %q = %v", kind.name, k, q2, q1, in)
					}
				}
			}
		}
	}
}

func TestLayout_PrefixEnd(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	for i := 0; i < 20000; i++ {
		p := make([]byte, r.Intn(5))
		for j := range p {
			p[j] = []byte{0, 1, 0xFE, 0xFF, 0xFF}[r.Intn(5)]
		}
		end := PrefixEnd(p)
		for j := 0; j < 20; j++ {
			k := make([]byte, r.Intn(7))
			for x := range k {
				k[x] = []byte{0, 1, 0xFE, 0xFF, 0xFF}[r.Intn(5)]
			}
			has := bytes.HasPrefix(k, p)
			below := end == nil || bytes.Compare(k, end) < 0
			if has && !below {
				t.Fatalf("PrefixEnd(%x)=%x not above %x", p, end, k)
			}
			if !has && bytes.Compare(k, p) >= 0 && below {
				t.Fatalf("PrefixEnd(%x)=%x: %x without the prefix in range", p, end, k)
			}
		}
	}
}

func TestLayout_VisibilityOrderAndBound(t *testing.T) {
	r := rand.New(rand.NewSource(3))
	for i := 0; i < 50000; i++ {
		q := layoutQueues[r.Intn(len(layoutQueues))]
		p1, p2 := uint8(r.Intn(3)*127), uint8(r.Intn(3)*127)
		t1, t2 := layoutTimes[r.Intn(len(layoutTimes))], layoutTimes[r.Intn(len(layoutTimes))]
		a, b := layoutID(r), layoutID(r)
		want := cmp.Compare(p1, p2)
		if want == 0 {
			want = cmp.Compare(t1, t2)
		}
		if want == 0 {
			want = bytes.Compare(a[:], b[:])
		}
		k1, k2 := VisibilityKey(q, p1, t1, a), VisibilityKey(q, p2, t2, b)
		if got := bytes.Compare(k1, k2); got != want {
			t.Fatalf("order %d want %d", got, want)
		}
		bound := VisibilityPrioBound(q, p1, t2)
		if (bytes.Compare(k1, bound) < 0) != (t1 < t2) {
			t.Fatalf("bound: vis %d vs t %d", t1, t2)
		}
		tb := TimeBound(NsLeaseExpiry, t2)
		if (bytes.Compare(LeaseExpiryKey(t1, a), tb) < 0) != (t1 < t2) {
			t.Fatalf("lease bound")
		}
		if (bytes.Compare(DelayedKey(t1, q, a), TimeBound(NsDelayed, t2)) < 0) != (t1 < t2) {
			t.Fatalf("delayed bound")
		}
		if (bytes.Compare(DedupExpiryKey(t1, q, "k"), TimeBound(NsDedupExpiry, t2)) < 0) != (t1 < t2) {
			t.Fatalf("dedup bound")
		}
		pr, vt, gid, err := DecodeVisibilitySuffix(k1[len(VisibilityPrefix(q)):])
		if err != nil || pr != p1 || vt != t1 || gid != a {
			t.Fatalf("suffix")
		}
		if s1, s2 := IDSeq(NewID(uint64(t1), t2)), uint64(t1); s1 != s2 {
			t.Fatalf("seq")
		}
	}
}

// Every truncation and every single-byte corruption of valid values:
// decoders never panic and every error wraps ErrMalformed.
func TestLayout_DecodersTruncatedAndCorrupt(t *testing.T) {
	big := strings.Repeat("e", 70_000)
	var vals [][]byte
	for _, r := range itemCases() {
		vals = append(vals, EncodeItem(r))
	}
	vals = append(vals, EncodeItem(ItemRecord{DedupKey: big, LastError: big, Dead: true, Reason: big, HasLease: true, Payload: []byte(big)}))
	vals = append(vals, EncodeLease(LeaseRecord{Queue: "qq", ExpiresAt: -1, IDs: [][16]byte{id(1), id(2)}}))
	vals = append(vals, EncodeDedup(DedupRecord{ID: id(3), ExpiresAt: 9}))
	vals = append(vals, EncodeQueueConfig(QueueConfigRecord{MaxAttempts: 1, Lease: -1}))
	vals = append(vals, EncodeCounters(Counters{Ready: 1}), EncodeUint64(7), EncodePayload([]byte("p")), Marker())
	for _, c := range keyCases() {
		vals = append(vals, c.encode(c))
	}
	check := func(b []byte) {
		for name, dec := range decoders() {
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("%s(%x) panicked: %v", name, b, p)
					}
				}()
				if err := dec(b); err != nil && !errors.Is(err, ErrMalformed) {
					t.Fatalf("%s(%x): error %v does not wrap ErrMalformed", name, b, err)
				}
			}()
		}
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Fatalf("DecodeVisibilitySuffix(%x) panicked: %v", b, p)
				}
			}()
			if _, _, _, err := DecodeVisibilitySuffix(b); err != nil && !errors.Is(err, ErrMalformed) {
				t.Fatalf("suffix err")
			}
		}()
	}
	for _, v := range vals {
		step := 1
		if len(v) > 2000 {
			step = 97
		}
		for n := 0; n <= len(v); n += step {
			check(v[:n])
		}
		for i := 0; i < len(v) && i < 200; i++ {
			for _, x := range []byte{0, 1, 0x7F, 0x80, 0xFF} {
				c := bytes.Clone(v)
				c[i] = x
				check(c)
			}
		}
	}
}

func TestLayout_ValuesRoundTripLarge(t *testing.T) {
	big := strings.Repeat("\x00\xff", 40_000) // 80 KB
	r := ItemRecord{Priority: 9, Attempts: 1 << 31, MaxAttempts: math.MaxUint32, EnqueuedAt: math.MinInt64, VisibleAt: math.MaxInt64,
		DedupKey: big, LastError: big + "x", Delayed: true, HasLease: true, Lease: id(7), Dead: true, DeadAt: -3, Reason: big + "y",
		Payload: []byte(big + big)}
	got, err := DecodeItem(EncodeItem(r))
	if err != nil {
		t.Fatal(err)
	}
	if got.DedupKey != r.DedupKey || got.LastError != r.LastError || got.Reason != r.Reason || !bytes.Equal(got.Payload, r.Payload) ||
		got.Attempts != r.Attempts || got.MaxAttempts != r.MaxAttempts || got.EnqueuedAt != r.EnqueuedAt || got.VisibleAt != r.VisibleAt ||
		got.Lease != r.Lease || got.DeadAt != r.DeadAt || !got.Delayed || !got.HasLease || !got.Dead || got.Priority != 9 {
		t.Fatalf("item round trip lost data")
	}
	ids := make([][16]byte, 70_000)
	for i := range ids {
		ids[i] = NewID(uint64(i), int64(i))
	}
	lr := LeaseRecord{Queue: big, ExpiresAt: math.MinInt64, IDs: ids}
	gl, err := DecodeLease(EncodeLease(lr))
	if err != nil || gl.Queue != lr.Queue || gl.ExpiresAt != lr.ExpiresAt || len(gl.IDs) != len(ids) || gl.IDs[69_999] != ids[69_999] {
		t.Fatalf("lease round trip: %v", err)
	}
	qc := QueueConfigRecord{MaxAttempts: math.MaxUint32, Lease: math.MinInt64, DedupWindow: math.MaxInt64, BackoffBase: -1, BackoffMax: 0}
	if g, err := DecodeQueueConfig(EncodeQueueConfig(qc)); err != nil || g != qc {
		t.Fatalf("config")
	}
	c := Counters{Ready: math.MinInt64, Purged: math.MaxInt64, Acked: -1}
	if g, err := DecodeCounters(EncodeCounters(c)); err != nil || g != c {
		t.Fatalf("counters")
	}
	p := []byte(big)
	if g, err := DecodePayload(EncodePayload(p)); err != nil || !bytes.Equal(g, p) {
		t.Fatalf("payload")
	}
	// Keys with long / escape-heavy queue names and dedup keys.
	for _, q := range layoutQueues {
		qq := q + big
		if g, d, err := DecodeDedupKey(DedupKey(qq, big)); err != nil || g != qq || d != big {
			t.Fatalf("dedup key")
		}
		if e, g, d, err := DecodeDedupExpiryKey(DedupExpiryKey(-1, qq, big)); err != nil || e != -1 || g != qq || d != big {
			t.Fatalf("dedup expiry key")
		}
	}
}

// A lease record claiming 2^32-1 ids with few bytes must fail fast, not allocate.
func TestLayout_DecodeLeaseHugeCount(t *testing.T) {
	b := EncodeLease(LeaseRecord{Queue: "q"})
	b[len(b)-4], b[len(b)-3], b[len(b)-2], b[len(b)-1] = 0xFF, 0xFF, 0xFF, 0xFF
	if _, err := DecodeLease(b); !errors.Is(err, ErrMalformed) {
		t.Fatalf("%v", err)
	}
	s := EncodeItem(ItemRecord{})
	s[27], s[28], s[29], s[30] = 0xFF, 0xFF, 0xFF, 0xFF
	if _, err := DecodeItem(s); !errors.Is(err, ErrMalformed) {
		t.Fatalf("%v", err)
	}
}
