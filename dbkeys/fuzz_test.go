package dbkeys

import (
	"bytes"
	"cmp"
	"testing"
)

func FuzzVisibilityKeyRoundTripAndOrder(f *testing.F) {
	for _, c := range keyCases() {
		f.Add(c.q, c.prio, c.t, c.id[:], c.q+"z", c.prio, -c.t, c.id[1:])
	}
	f.Fuzz(func(t *testing.T, q1 string, p1 uint8, t1 int64, id1 []byte, q2 string, p2 uint8, t2 int64, id2 []byte) {
		var a, b [16]byte
		copy(a[:], id1)
		copy(b[:], id2)
		k1 := VisibilityKey(q1, p1, t1, a)
		k2 := VisibilityKey(q2, p2, t2, b)
		gq, gp, gt, gid, err := DecodeVisibilityKey(k1)
		if err != nil || gq != q1 || gp != p1 || gt != t1 || gid != a {
			t.Fatalf("round trip: %q %d %d %x -> %q %d %d %x %v", q1, p1, t1, a, gq, gp, gt, gid, err)
		}
		want := cmp.Compare(q1, q2)
		if want == 0 {
			want = cmp.Compare(p1, p2)
		}
		if want == 0 {
			want = cmp.Compare(t1, t2)
		}
		if want == 0 {
			want = bytes.Compare(a[:], b[:])
		}
		if got := bytes.Compare(k1, k2); got != want {
			t.Fatalf("order: compare=%d want %d for (%q,%d,%d) vs (%q,%d,%d)", got, want, q1, p1, t1, q2, p2, t2)
		}
	})
}

func FuzzTimeKeysRoundTripAndOrder(f *testing.F) {
	for _, c := range keyCases() {
		f.Add(c.t, c.q, c.id[:], c.dedup, -c.t)
	}
	f.Fuzz(func(t *testing.T, t1 int64, q string, idb []byte, dedup string, t2 int64) {
		var x [16]byte
		copy(x[:], idb)
		gt, gq, gid, err := DecodeDelayedKey(DelayedKey(t1, q, x))
		if err != nil || gt != t1 || gq != q || gid != x {
			t.Fatalf("delayed round trip: %v", err)
		}
		et, el, err := DecodeLeaseExpiryKey(LeaseExpiryKey(t1, x))
		if err != nil || et != t1 || el != x {
			t.Fatalf("lease_expiry round trip: %v", err)
		}
		dt, dq, dk, err := DecodeDedupExpiryKey(DedupExpiryKey(t1, q, dedup))
		if err != nil || dt != t1 || dq != q || dk != dedup {
			t.Fatalf("dedup_expiry round trip: %v", err)
		}
		dq, dk, err = DecodeDedupKey(DedupKey(q, dedup))
		if err != nil || dq != q || dk != dedup {
			t.Fatalf("dedup round trip: %v", err)
		}
		// Time first: the order of two entries follows the instants.
		if c := cmp.Compare(t1, t2); c != 0 {
			if got := bytes.Compare(DelayedKey(t1, q, x), DelayedKey(t2, "", [16]byte{})); got != c {
				t.Fatalf("delayed order %d want %d", got, c)
			}
			if got := bytes.Compare(LeaseExpiryKey(t1, x), TimeBound(NsLeaseExpiry, t2)); got != c {
				t.Fatalf("lease_expiry vs bound order %d want %d", got, c)
			}
		}
	})
}

func FuzzQueueIDKeysRoundTripAndOrder(f *testing.F) {
	for _, c := range keyCases() {
		f.Add(c.q, c.id[:], c.dedup)
	}
	f.Fuzz(func(t *testing.T, q1 string, idb []byte, q2 string) {
		var x [16]byte
		copy(x[:], idb)
		for _, kind := range []struct {
			enc func(string, [16]byte) []byte
			dec func([]byte) (string, [16]byte, error)
		}{
			{AvailableKey, DecodeAvailableKey}, {InProgressKey, DecodeInProgressKey},
			{DLQKey, DecodeDLQKey}, {PayloadKey, DecodePayloadKey},
		} {
			q, gid, err := kind.dec(kind.enc(q1, x))
			if err != nil || q != q1 || gid != x {
				t.Fatalf("round trip %q: %v", q1, err)
			}
			// Keys of q1 fall inside q1's prefix range and keys of a
			// different queue never do (no prefix trap).
			k2 := kind.enc(q2, x)
			p1 := kind.enc(q1, [16]byte{})[:len(kind.enc(q1, x))-IDLen]
			if (q1 == q2) != bytes.HasPrefix(k2, p1) {
				t.Fatalf("prefix trap: %q key under %q prefix", q2, q1)
			}
			if got, want := bytes.Compare(kind.enc(q1, x), k2), cmp.Compare(q1, q2); want != 0 && got != want {
				t.Fatalf("queue order %q vs %q: %d want %d", q1, q2, got, want)
			}
		}
		for _, enc := range []func(string) []byte{QueueConfigKey, CountersKey} {
			k := enc(q1)
			var got string
			var err error
			if k[1] == MetaQueueConfig {
				got, err = DecodeQueueConfigKey(k)
			} else {
				got, err = DecodeCountersKey(k)
			}
			if err != nil || got != q1 {
				t.Fatalf("meta round trip %q: %v", q1, err)
			}
		}
	})
}

func FuzzItemRoundTrip(f *testing.F) {
	for _, r := range itemCases() {
		f.Add(EncodeItem(r))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeItem(b)
		if err != nil {
			return
		}
		// Every decodable value has exactly one encoding.
		if got := EncodeItem(r); !bytes.Equal(got, b) {
			t.Fatalf("re-encode differs:\n in %x\nout %x", b, got)
		}
	})
}

func FuzzValuesRoundTrip(f *testing.F) {
	for _, r := range leaseCases() {
		f.Add(EncodeLease(r))
	}
	for _, c := range countersCases() {
		f.Add(EncodeCounters(c))
	}
	f.Add(EncodeDedup(DedupRecord{ID: id(1), ExpiresAt: 5}))
	f.Add(EncodeQueueConfig(QueueConfigRecord{MaxAttempts: 5}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := DecodeLease(b); err == nil && !bytes.Equal(EncodeLease(r), b) {
			t.Fatalf("lease re-encode differs")
		}
		if r, err := DecodeCounters(b); err == nil && !bytes.Equal(EncodeCounters(r), b) {
			t.Fatalf("counters re-encode differs")
		}
		if r, err := DecodeDedup(b); err == nil && !bytes.Equal(EncodeDedup(r), b) {
			t.Fatalf("dedup re-encode differs")
		}
		if r, err := DecodeQueueConfig(b); err == nil && !bytes.Equal(EncodeQueueConfig(r), b) {
			t.Fatalf("queue config re-encode differs")
		}
		if r, err := DecodeUint64(b); err == nil && !bytes.Equal(EncodeUint64(r), b) {
			t.Fatalf("uint64 re-encode differs")
		}
	})
}

// FuzzDecodeGarbage feeds arbitrary bytes to every decoder: each either
// fails with ErrMalformed or succeeds, and none panics.
func FuzzDecodeGarbage(f *testing.F) {
	for _, c := range keyCases() {
		f.Add(c.encode(c))
	}
	for _, r := range itemCases() {
		f.Add(EncodeItem(r))
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, dec := range decoders() {
			_ = dec(b) // must not panic; errors are expected
		}
		// Keys that decode re-encode to themselves.
		if q, x, err := DecodeAvailableKey(b); err == nil && !bytes.Equal(AvailableKey(q, x), b) {
			t.Fatalf("available key not canonical: %x", b)
		}
		if q, p, vt, x, err := DecodeVisibilityKey(b); err == nil && !bytes.Equal(VisibilityKey(q, p, vt, x), b) {
			t.Fatalf("visibility key not canonical: %x", b)
		}
	})
}
