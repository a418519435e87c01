package dbkeys

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzDecodeCanonical: every key decoder (FuzzDecodeGarbage
// checks two; this checks all, and the delete mark and visibility-suffix
// decoders it leaves out) either fails with ErrMalformed or decodes bytes
// its encoder gives back exactly (one encoding per key: a scan can never
// meet two keys for one entry).
func FuzzDecodeCanonical(f *testing.F) {
	for _, c := range keyCases() {
		f.Add(c.encode(c))
	}
	f.Add(DeletingKey("a\x00b"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		check := func(what string, err error, re func() []byte) {
			t.Helper()
			if err != nil {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("%s: error %v is not ErrMalformed", what, err)
				}
				return
			}
			if got := re(); !bytes.Equal(got, b) {
				t.Fatalf("%s: not canonical: %x re-encodes to %x", what, b, got)
			}
		}
		for _, kind := range []struct {
			what string
			enc  func(string, [16]byte) []byte
			dec  func([]byte) (string, [16]byte, error)
		}{
			{"available", AvailableKey, DecodeAvailableKey}, {"in_progress", InProgressKey, DecodeInProgressKey},
			{"dlq", DLQKey, DecodeDLQKey}, {"payload", PayloadKey, DecodePayloadKey},
		} {
			q, x, err := kind.dec(b)
			check(kind.what, err, func() []byte { return kind.enc(q, x) })
		}
		q, p, vt, x, err := DecodeVisibilityKey(b)
		check("visibility", err, func() []byte { return VisibilityKey(q, p, vt, x) })
		l, err := DecodeLeaseKey(b)
		check("lease", err, func() []byte { return LeaseKey(l) })
		et, l2, err := DecodeLeaseExpiryKey(b)
		check("lease_expiry", err, func() []byte { return LeaseExpiryKey(et, l2) })
		dt, dq, dx, err := DecodeDelayedKey(b)
		check("delayed", err, func() []byte { return DelayedKey(dt, dq, dx) })
		uq, uk, err := DecodeDedupKey(b)
		check("dedup", err, func() []byte { return DedupKey(uq, uk) })
		xt, xq, xk, err := DecodeDedupExpiryKey(b)
		check("dedup_expiry", err, func() []byte { return DedupExpiryKey(xt, xq, xk) })
		cq, err := DecodeQueueConfigKey(b)
		check("config", err, func() []byte { return QueueConfigKey(cq) })
		nq, err := DecodeCountersKey(b)
		check("counters", err, func() []byte { return CountersKey(nq) })
		mq, err := DecodeDeletingKey(b)
		check("deleting", err, func() []byte { return DeletingKey(mq) })
		sp, st, sx, err := DecodeVisibilitySuffix(b)
		check("visibility suffix", err, func() []byte {
			return VisibilityKey("", sp, st, sx)[len(VisibilityPrefix("")):]
		})
		for name, dec := range decoders() {
			if err := dec(b); err != nil && !errors.Is(err, ErrMalformed) {
				t.Fatalf("%s: error %v is not ErrMalformed", name, err)
			}
		}
	})
}
