package dbkeys

import (
	"bytes"
	"cmp"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite testdata/golden.txt from the current encoders")

func id(b byte) [16]byte {
	var x [16]byte
	for i := range x {
		x[i] = b + byte(i)
	}
	return x
}

// keyCase is one fixed key input; the table drives the round-trip tests,
// the golden file and the fuzz corpus.
type keyCase struct {
	name   string
	q      string
	prio   uint8
	t      int64
	id     [16]byte
	dedup  string
	encode func(c keyCase) []byte
	check  func(t *testing.T, c keyCase, k []byte)
}

var queues = []string{"a", "orders", "orders.eu-1", "x\x00y", "\x00", "Q_9"}

var times = []int64{math.MinInt64, -1, 0, 1, 1_700_000_000_123_456_789, math.MaxInt64}

func keyCases() []keyCase {
	var cs []keyCase
	for i, q := range queues {
		tm := times[i%len(times)]
		iid := id(byte(i * 16))
		base := keyCase{q: q, prio: uint8(i * 40), t: tm, id: iid, dedup: "k" + q}
		add := func(kind string, enc func(c keyCase) []byte, chk func(t *testing.T, c keyCase, k []byte)) {
			c := base
			c.name = fmt.Sprintf("%s/%d", kind, i)
			c.encode, c.check = enc, chk
			cs = append(cs, c)
		}
		qid := func(dec func([]byte) (string, [16]byte, error)) func(t *testing.T, c keyCase, k []byte) {
			return func(t *testing.T, c keyCase, k []byte) {
				q, gotID, err := dec(k)
				require.NoError(t, err)
				require.Equal(t, c.q, q)
				require.Equal(t, c.id, gotID)
			}
		}
		add("available", func(c keyCase) []byte { return AvailableKey(c.q, c.id) }, qid(DecodeAvailableKey))
		add("in_progress", func(c keyCase) []byte { return InProgressKey(c.q, c.id) }, qid(DecodeInProgressKey))
		add("dlq", func(c keyCase) []byte { return DLQKey(c.q, c.id) }, qid(DecodeDLQKey))
		add("payload", func(c keyCase) []byte { return PayloadKey(c.q, c.id) }, qid(DecodePayloadKey))
		add("visibility", func(c keyCase) []byte { return VisibilityKey(c.q, c.prio, c.t, c.id) },
			func(t *testing.T, c keyCase, k []byte) {
				q, p, vt, gotID, err := DecodeVisibilityKey(k)
				require.NoError(t, err)
				require.Equal(t, []any{c.q, c.prio, c.t, c.id}, []any{q, p, vt, gotID})
			})
		add("lease", func(c keyCase) []byte { return LeaseKey(c.id) },
			func(t *testing.T, c keyCase, k []byte) {
				l, err := DecodeLeaseKey(k)
				require.NoError(t, err)
				require.Equal(t, c.id, l)
			})
		add("lease_expiry", func(c keyCase) []byte { return LeaseExpiryKey(c.t, c.id) },
			func(t *testing.T, c keyCase, k []byte) {
				tm, l, err := DecodeLeaseExpiryKey(k)
				require.NoError(t, err)
				require.Equal(t, c.t, tm)
				require.Equal(t, c.id, l)
			})
		add("delayed", func(c keyCase) []byte { return DelayedKey(c.t, c.q, c.id) },
			func(t *testing.T, c keyCase, k []byte) {
				tm, q, gotID, err := DecodeDelayedKey(k)
				require.NoError(t, err)
				require.Equal(t, []any{c.t, c.q, c.id}, []any{tm, q, gotID})
			})
		add("dedup", func(c keyCase) []byte { return DedupKey(c.q, c.dedup) },
			func(t *testing.T, c keyCase, k []byte) {
				q, d, err := DecodeDedupKey(k)
				require.NoError(t, err)
				require.Equal(t, []string{c.q, c.dedup}, []string{q, d})
			})
		add("dedup_expiry", func(c keyCase) []byte { return DedupExpiryKey(c.t, c.q, c.dedup) },
			func(t *testing.T, c keyCase, k []byte) {
				tm, q, d, err := DecodeDedupExpiryKey(k)
				require.NoError(t, err)
				require.Equal(t, []any{c.t, c.q, c.dedup}, []any{tm, q, d})
			})
		add("queue_config", func(c keyCase) []byte { return QueueConfigKey(c.q) },
			func(t *testing.T, c keyCase, k []byte) {
				q, err := DecodeQueueConfigKey(k)
				require.NoError(t, err)
				require.Equal(t, c.q, q)
			})
		add("counters", func(c keyCase) []byte { return CountersKey(c.q) },
			func(t *testing.T, c keyCase, k []byte) {
				q, err := DecodeCountersKey(k)
				require.NoError(t, err)
				require.Equal(t, c.q, q)
			})
	}
	return cs
}

func itemCases() []ItemRecord {
	return []ItemRecord{
		{},
		{Priority: 3, Attempts: 1, MaxAttempts: 5, EnqueuedAt: 1_700_000_000_000_000_000, VisibleAt: 1_700_000_000_500_000_000,
			DedupKey: "order-42", Payload: []byte("hello")},
		{Priority: 255, Attempts: math.MaxUint32, EnqueuedAt: -5, VisibleAt: math.MaxInt64, PayloadExternal: true, Delayed: true},
		{Attempts: 2, HasLease: true, Lease: id(0xA0), Payload: []byte{0, 1, 2}, LastError: "boom"},
		{Attempts: 5, Dead: true, DeadAt: 42, Reason: "nack: bad input", LastError: "bad input", Payload: []byte("x")},
		{HasLease: true, Lease: id(1), Dead: true, DeadAt: math.MinInt64, Reason: "lease expired", PayloadExternal: true},
	}
}

func leaseCases() []LeaseRecord {
	return []LeaseRecord{
		{Queue: "q", ExpiresAt: 0, IDs: [][16]byte{}},
		{Queue: "orders", ExpiresAt: 1_700_000_030_000_000_000, IDs: [][16]byte{id(1), id(2), id(3)}},
		{Queue: "orders", ExpiresAt: 1_700_000_030_000_000_000, IDs: [][16]byte{id(4), id(5)}, Ahead: true},
	}
}

// TestLease_AheadMark: the claimed-ahead mark is one byte after the ids,
// present only when set (a record without it encodes as before the mark
// existed), and any other byte there is malformed.
func TestLease_AheadMark(t *testing.T) {
	t.Parallel()
	r := LeaseRecord{Queue: "q", ExpiresAt: 7, IDs: [][16]byte{id(1)}}
	plain := EncodeLease(r)
	r.Ahead = true
	marked := EncodeLease(r)
	require.Equal(t, append(bytes.Clone(plain), leaseAhead), marked)
	got, err := DecodeLease(marked)
	require.NoError(t, err)
	require.True(t, got.Ahead)
	got, err = DecodeLease(plain)
	require.NoError(t, err)
	require.False(t, got.Ahead)
	bad := append(bytes.Clone(plain), 2)
	_, err = DecodeLease(bad)
	require.ErrorIs(t, err, ErrMalformed)
	_, err = DecodeLease(append(bytes.Clone(marked), leaseAhead))
	require.ErrorIs(t, err, ErrMalformed)
}

func countersCases() []Counters {
	return []Counters{{}, {Ready: 1, Delayed: -2, Inflight: 3, Dead: 4, Leases: 5, Enqueued: 6, Duplicates: 7,
		Delivered: 8, Acked: 9, Nacked: 10, Expired: 11, DeadLettered: 12, Redriven: 13, Purged: math.MinInt64}}
}

func TestKeys_RoundTrip(t *testing.T) {
	t.Parallel()
	for _, c := range keyCases() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			k := c.encode(c)
			c.check(t, c, k)
		})
	}
}

func TestKeys_QueueIsNoPrefixTrap(t *testing.T) {
	t.Parallel()
	// "a" must not see keys of "ab" or "a\x00" inside its range.
	for _, other := range []string{"ab", "a\x00", "a\x00\x01", "a.", "b"} {
		p := AvailablePrefix("a")
		k := AvailableKey(other, id(0))
		require.False(t, bytes.HasPrefix(k, p), "queue %q key inside queue a's range", other)
		require.Equal(t, cmp.Compare("a", other), bytes.Compare(AvailableKey("a", id(0xFF)), k), "order for %q", other)
	}
}

func TestKeys_Bounds(t *testing.T) {
	t.Parallel()
	require.Equal(t, []byte{0x03}, PrefixEnd([]byte{0x02, 0xFF}))
	require.Nil(t, PrefixEnd([]byte{0xFF, 0xFF}))
	require.Nil(t, PrefixEnd(nil))
	// Every entry ready at t sorts below TimeBound(t+1) and above at t+1.
	k := DelayedKey(100, "q", id(9))
	require.Negative(t, bytes.Compare(k, TimeBound(NsDelayed, 101)))
	require.Positive(t, bytes.Compare(k, TimeBound(NsDelayed, 100)))
	v := VisibilityKey("q", 7, 100, id(9))
	require.Negative(t, bytes.Compare(v, VisibilityPrioBound("q", 7, 101)))
	require.True(t, bytes.HasPrefix(v, VisibilityPrioPrefix("q", 7)))
	require.True(t, bytes.HasPrefix(v, VisibilityPrefix("q")))
	require.True(t, bytes.HasPrefix(QueueConfigKey("q"), QueueConfigPrefix()))
	require.True(t, bytes.HasPrefix(CountersKey("q"), CountersPrefix()))
	require.True(t, bytes.HasPrefix(DedupKey("q", "k"), DedupPrefix("q")))
	require.True(t, bytes.HasPrefix(InProgressKey("q", id(1)), InProgressPrefix("q")))
	require.True(t, bytes.HasPrefix(DLQKey("q", id(1)), DLQPrefix("q")))
	require.True(t, bytes.HasPrefix(PayloadKey("q", id(1)), PayloadPrefix("q")))
	require.Equal(t, []byte{NsLeases}, NamespacePrefix(NsLeases))
	require.Equal(t, []byte{NsMeta, MetaFormat}, MetaFormatKey())
	require.Equal(t, []byte{NsMeta, MetaIDSeq}, MetaIDSeqKey())
}

func TestIDs_OrderBySequence(t *testing.T) {
	t.Parallel()
	a, b := NewID(1, 999), NewID(2, -999)
	require.Negative(t, bytes.Compare(a[:], b[:]))
	require.Equal(t, uint64(2), IDSeq(b))
}

func TestIDs_EnqueuedAtRoundTrip(t *testing.T) {
	t.Parallel()
	for _, at := range []int64{0, 1, -1, 999, -999, 1_700_000_000_123_456_789, math.MaxInt64, math.MinInt64} {
		id := NewID(42, at)
		require.Equal(t, at, IDEnqueuedAt(id), "enqueued at %d", at)
		require.Equal(t, uint64(42), IDSeq(id))
	}
}

func TestValues_RoundTrip(t *testing.T) {
	t.Parallel()
	for i, r := range itemCases() {
		got, err := DecodeItem(EncodeItem(r))
		require.NoError(t, err, "item %d", i)
		requireItemEqual(t, r, got)
	}
	for _, r := range leaseCases() {
		got, err := DecodeLease(EncodeLease(r))
		require.NoError(t, err)
		require.Equal(t, r, got)
	}
	d := DedupRecord{ID: id(3), ExpiresAt: -7}
	gotD, err := DecodeDedup(EncodeDedup(d))
	require.NoError(t, err)
	require.Equal(t, d, gotD)
	qc := QueueConfigRecord{MaxAttempts: 5, Lease: 30e9, DedupWindow: 300e9, BackoffBase: 5e8, BackoffMax: 30e9}
	gotQ, err := DecodeQueueConfig(EncodeQueueConfig(qc))
	require.NoError(t, err)
	require.Equal(t, qc, gotQ)
	for _, c := range countersCases() {
		got, err := DecodeCounters(EncodeCounters(c))
		require.NoError(t, err)
		require.Equal(t, c, got)
	}
	u, err := DecodeUint64(EncodeUint64(1 << 40))
	require.NoError(t, err)
	require.Equal(t, uint64(1<<40), u)
	p, err := DecodePayload(EncodePayload([]byte("abc")))
	require.NoError(t, err)
	require.Equal(t, []byte("abc"), p)
	require.NoError(t, DecodeMarker(Marker()))
}

func TestCounters_Add(t *testing.T) {
	t.Parallel()
	c := Counters{Ready: 2, Acked: 1}.Add(Counters{Ready: -1, Inflight: 1, Acked: 3})
	require.Equal(t, Counters{Ready: 1, Inflight: 1, Acked: 4}, c)
	require.True(t, Counters{}.IsZero())
	require.False(t, c.IsZero())
}

func TestDecode_Errors(t *testing.T) {
	t.Parallel()
	bad := [][]byte{nil, {}, {0x00}, {FormatVersion + 1}, {0xFF, 0xFF, 0xFF}}
	for _, b := range bad {
		for name, dec := range decoders() {
			err := dec(b)
			require.Error(t, err, "%s(%x)", name, b)
			require.True(t, errors.Is(err, ErrMalformed), "%s(%x): %v", name, b, err)
		}
	}
	// Specific malformations.
	_, _, err := DecodeAvailableKey(append(AvailablePrefix("q"), 1, 2))
	require.ErrorIs(t, err, ErrMalformed)
	_, _, err = DecodeAvailableKey([]byte{NsAvailable, 'q', 0x00, 0x07})
	require.ErrorIs(t, err, ErrMalformed)
	_, _, err = DecodeAvailableKey([]byte{NsAvailable, 'q'})
	require.ErrorIs(t, err, ErrMalformed)
	item := EncodeItem(ItemRecord{PayloadExternal: true})
	_, err = DecodeItem(append(item, 'x'))
	require.ErrorIs(t, err, ErrMalformed)
	item[1] = 0x80
	_, err = DecodeItem(item)
	require.ErrorIs(t, err, ErrMalformed)
	lease := EncodeLease(LeaseRecord{Queue: "q", IDs: [][16]byte{id(1)}})
	_, err = DecodeLease(lease[:len(lease)-1])
	require.ErrorIs(t, err, ErrMalformed)
	_, err = DecodeQueueConfigKey(append(QueueConfigKey("q"), 'x'))
	require.ErrorIs(t, err, ErrMalformed)
}

// decoders returns every decoder wrapped to a common shape.
func decoders() map[string]func([]byte) error {
	e1 := func(f func([]byte) error) func([]byte) error { return f }
	return map[string]func([]byte) error{
		"available":    func(b []byte) error { _, _, err := DecodeAvailableKey(b); return err },
		"in_progress":  func(b []byte) error { _, _, err := DecodeInProgressKey(b); return err },
		"dlq":          func(b []byte) error { _, _, err := DecodeDLQKey(b); return err },
		"payload_key":  func(b []byte) error { _, _, err := DecodePayloadKey(b); return err },
		"visibility":   func(b []byte) error { _, _, _, _, err := DecodeVisibilityKey(b); return err },
		"lease_key":    func(b []byte) error { _, err := DecodeLeaseKey(b); return err },
		"lease_expiry": func(b []byte) error { _, _, err := DecodeLeaseExpiryKey(b); return err },
		"delayed":      func(b []byte) error { _, _, _, err := DecodeDelayedKey(b); return err },
		"dedup_key":    func(b []byte) error { _, _, err := DecodeDedupKey(b); return err },
		"dedup_expiry": func(b []byte) error { _, _, _, err := DecodeDedupExpiryKey(b); return err },
		"config_key":   func(b []byte) error { _, err := DecodeQueueConfigKey(b); return err },
		"counters_key": func(b []byte) error { _, err := DecodeCountersKey(b); return err },
		"item":         func(b []byte) error { _, err := DecodeItem(b); return err },
		"lease":        func(b []byte) error { _, err := DecodeLease(b); return err },
		"dedup":        func(b []byte) error { _, err := DecodeDedup(b); return err },
		"config":       func(b []byte) error { _, err := DecodeQueueConfig(b); return err },
		"counters":     func(b []byte) error { _, err := DecodeCounters(b); return err },
		"uint64":       func(b []byte) error { _, err := DecodeUint64(b); return err },
		"payload":      func(b []byte) error { _, err := DecodePayload(b); return err },
		"marker":       e1(DecodeMarker),
	}
}

func requireItemEqual(t *testing.T, want, got ItemRecord) {
	t.Helper()
	require.True(t, bytes.Equal(want.Payload, got.Payload), "payload %x != %x", want.Payload, got.Payload)
	want.Payload, got.Payload = nil, nil
	require.Equal(t, want, got)
}

// goldenEntries renders every fixed encoding as "name hex" lines.
func goldenEntries() []string {
	var lines []string
	add := func(name string, b []byte) { lines = append(lines, name+" "+hex.EncodeToString(b)) }
	for _, c := range keyCases() {
		add("key/"+c.name, c.encode(c))
	}
	for i, r := range itemCases() {
		add(fmt.Sprintf("value/item/%d", i), EncodeItem(r))
	}
	for i, r := range leaseCases() {
		add(fmt.Sprintf("value/lease/%d", i), EncodeLease(r))
	}
	for i, c := range countersCases() {
		add(fmt.Sprintf("value/counters/%d", i), EncodeCounters(c))
	}
	add("value/dedup", EncodeDedup(DedupRecord{ID: id(3), ExpiresAt: 1_700_000_300_000_000_000}))
	add("value/queue_config", EncodeQueueConfig(QueueConfigRecord{MaxAttempts: 5, Lease: 30e9, DedupWindow: 300e9, BackoffBase: 5e8, BackoffMax: 30e9}))
	add("value/uint64", EncodeUint64(1<<40+7))
	add("value/payload", EncodePayload([]byte("payload")))
	add("value/marker", Marker())
	add("key/meta_format", MetaFormatKey())
	add("key/meta_idseq", MetaIDSeqKey())
	add("key/meta_deleting", DeletingKey("orders"))
	add("key/time_bound_lease_expiry", TimeBound(NsLeaseExpiry, 1_700_000_000_000_000_000))
	add("key/visibility_prio_bound", VisibilityPrioBound("q", 2, 5))
	add("id/new", func() []byte { x := NewID(7, 1_700_000_000_000_000_000); return x[:] }())
	return lines
}

func TestGolden(t *testing.T) {
	t.Parallel()
	path := filepath.Join("testdata", "golden.txt")
	got := strings.Join(goldenEntries(), "\n") + "\n"
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test ./dbkeys -run TestGolden -update to create it")
	require.Equal(t, string(want), got, "on-disk encoding changed: if intended, bump FormatVersion or add a new kind, then -update")
}

// TestOrder_Table checks order preservation on the table inputs; the fuzz
// target does the same on random ones.
func TestOrder_Table(t *testing.T) {
	t.Parallel()
	for _, a := range times {
		for _, b := range times {
			require.Equal(t, cmp.Compare(a, b), bytes.Compare(LeaseExpiryKey(a, id(0)), LeaseExpiryKey(b, id(0))))
		}
	}
	for _, a := range queues {
		for _, b := range queues {
			require.Equal(t, cmp.Compare(a, b), bytes.Compare(QueueConfigKey(a), QueueConfigKey(b)), "%q vs %q", a, b)
		}
	}
}

func TestItemRecord_FieldsCovered(t *testing.T) {
	t.Parallel()
	// Guards against adding a field to ItemRecord without encoding it: the
	// richest table case must set every field.
	want := reflect.TypeOf(ItemRecord{}).NumField()
	require.Equal(t, 15, want, "ItemRecord changed: update the encoding, the table cases and this test")
}

func TestSingleDeletable_OnlyWriteOnceNamespaces(t *testing.T) {
	t.Parallel()
	yes := map[string][]byte{
		"available":    AvailableKey("q", id(1)),
		"visibility":   VisibilityKey("q", 3, 1234, id(1)),
		"in_progress":  InProgressKey("q", id(1)),
		"lease_expiry": LeaseExpiryKey(1234, id(2)),
	}
	no := map[string][]byte{
		"lease":        LeaseKey(id(2)),
		"dlq":          DLQKey("q", id(1)),
		"payload":      PayloadKey("q", id(1)),
		"delayed":      DelayedKey(1234, "q", id(1)),
		"dedup":        DedupKey("q", "k"),
		"dedup_expiry": DedupExpiryKey(1234, "q", "k"),
		"id_seq":       MetaIDSeqKey(),
		"config":       QueueConfigKey("q"),
		"counters":     CountersKey("q"),
		"empty":        nil,
	}
	for name, k := range yes {
		require.True(t, SingleDeletable(k), name)
	}
	for name, k := range no {
		require.False(t, SingleDeletable(k), name)
	}
}
