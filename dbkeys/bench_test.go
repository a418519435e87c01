package dbkeys

import "testing"

func BenchmarkVisibilityKey(b *testing.B) {
	b.Run("op=encode", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			_ = VisibilityKey("orders.eu-1", 3, int64(i), id(1))
		}
	})
	k := VisibilityKey("orders.eu-1", 3, 1_700_000_000_000_000_000, id(1))
	b.Run("op=decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, _, _, err := DecodeVisibilityKey(k); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkItem(b *testing.B) {
	r := ItemRecord{Priority: 1, Attempts: 1, EnqueuedAt: 1, VisibleAt: 2, DedupKey: "k", Payload: make([]byte, 256)}
	b.Run("op=encode,payload=256B", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = EncodeItem(r)
		}
	})
	enc := EncodeItem(r)
	b.Run("op=decode,payload=256B", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeItem(enc); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkLease(b *testing.B) {
	r := LeaseRecord{Queue: "orders", ExpiresAt: 5, IDs: make([][16]byte, 32)}
	b.Run("op=encode,ids=32", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = EncodeLease(r)
		}
	})
	enc := EncodeLease(r)
	b.Run("op=decode,ids=32", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeLease(enc); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkCounters(b *testing.B) {
	c := countersCases()[1]
	b.Run("op=encode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = EncodeCounters(c)
		}
	})
	enc := EncodeCounters(c)
	b.Run("op=decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeCounters(enc); err != nil {
				b.Fatal(err)
			}
		}
	})
}
