package dbkeys

import (
	"encoding/binary"
	"fmt"
)

// FormatVersion is the first byte of every value. Part of the on-disk
// format: a new incompatible layout gets a new version and decoders keep
// reading the old ones.
const FormatVersion byte = 1

// Item record flags. Part of the on-disk format; never renumber or reuse.
const (
	flagPayloadExternal byte = 1 << 0 // payload lives under PayloadKey, not inline
	flagDelayed         byte = 1 << 1 // a DelayedKey entry exists (the item counts as delayed)
	flagLease           byte = 1 << 2 // Lease is present (in_progress records)
	flagDead            byte = 1 << 3 // DeadAt and Reason are present (dlq records)
	knownFlags               = flagPayloadExternal | flagDelayed | flagLease | flagDead
)

// ItemRecord is the value stored under AvailableKey, InProgressKey and
// DLQKey. Instants are unix nanoseconds.
type ItemRecord struct {
	Priority    uint8
	Attempts    uint32
	MaxAttempts uint32 // 0: the queue's config
	EnqueuedAt  int64
	VisibleAt   int64
	DedupKey    string
	LastError   string
	// Delayed is set when a DelayedKey entry was written for the item; the
	// item counts as delayed until that entry is removed (by the sweeper's
	// promotion or by the claim that takes it).
	Delayed bool
	// PayloadExternal means the payload is stored under PayloadKey and
	// Payload is empty.
	PayloadExternal bool
	Payload         []byte
	HasLease        bool
	Lease           [16]byte
	Dead            bool
	DeadAt          int64
	Reason          string
}

const itemFixedLen = 1 + 1 + 1 + 4 + 4 + 8 + 8

// AppendItem appends the encoding of r.
func AppendItem(dst []byte, r ItemRecord) []byte {
	var flags byte
	if r.PayloadExternal {
		flags |= flagPayloadExternal
	}
	if r.Delayed {
		flags |= flagDelayed
	}
	if r.HasLease {
		flags |= flagLease
	}
	if r.Dead {
		flags |= flagDead
	}
	dst = append(dst, FormatVersion, flags, r.Priority)
	dst = binary.BigEndian.AppendUint32(dst, r.Attempts)
	dst = binary.BigEndian.AppendUint32(dst, r.MaxAttempts)
	dst = AppendInt64(dst, r.EnqueuedAt)
	dst = AppendInt64(dst, r.VisibleAt)
	dst = appendString(dst, r.DedupKey)
	dst = appendString(dst, r.LastError)
	if r.HasLease {
		dst = append(dst, r.Lease[:]...)
	}
	if r.Dead {
		dst = AppendInt64(dst, r.DeadAt)
		dst = appendString(dst, r.Reason)
	}
	if !r.PayloadExternal {
		dst = append(dst, r.Payload...)
	}
	return dst
}

// EncodeItem returns the encoding of r.
func EncodeItem(r ItemRecord) []byte {
	return AppendItem(make([]byte, 0, ItemLen(r)), r)
}

// ItemLen is room enough for r's encoding (AppendItem's at most).
func ItemLen(r ItemRecord) int {
	return itemFixedLen + 8 + len(r.DedupKey) + len(r.LastError) + len(r.Payload) + len(r.Reason) + 16 + 12
}

// DecodeItem decodes an item record. Payload aliases b.
func DecodeItem(b []byte) (ItemRecord, error) {
	var r ItemRecord
	if err := checkVersion(b, "item"); err != nil {
		return r, err
	}
	if len(b) < itemFixedLen {
		return r, fmt.Errorf("%w: item: %d bytes, want at least %d", ErrMalformed, len(b), itemFixedLen)
	}
	flags := b[1]
	if flags&^knownFlags != 0 {
		return r, fmt.Errorf("%w: item: unknown flags 0x%02x", ErrMalformed, flags)
	}
	r.PayloadExternal = flags&flagPayloadExternal != 0
	r.Delayed = flags&flagDelayed != 0
	r.HasLease = flags&flagLease != 0
	r.Dead = flags&flagDead != 0
	r.Priority = b[2]
	r.Attempts = binary.BigEndian.Uint32(b[3:7])
	r.MaxAttempts = binary.BigEndian.Uint32(b[7:11])
	r.EnqueuedAt = readInt64(b[11:19])
	r.VisibleAt = readInt64(b[19:27])
	rest := b[itemFixedLen:]
	var err error
	if r.DedupKey, rest, err = readString(rest, "item dedup key"); err != nil {
		return r, err
	}
	if r.LastError, rest, err = readString(rest, "item last error"); err != nil {
		return r, err
	}
	if r.HasLease {
		if len(rest) < IDLen {
			return r, fmt.Errorf("%w: item: truncated lease", ErrMalformed)
		}
		copy(r.Lease[:], rest[:IDLen])
		rest = rest[IDLen:]
	}
	if r.Dead {
		if len(rest) < 8 {
			return r, fmt.Errorf("%w: item: truncated dead_at", ErrMalformed)
		}
		r.DeadAt = readInt64(rest[:8])
		if r.Reason, rest, err = readString(rest[8:], "item reason"); err != nil {
			return r, err
		}
	}
	if r.PayloadExternal {
		if len(rest) != 0 {
			return r, fmt.Errorf("%w: item: %d payload bytes in a record marked external", ErrMalformed, len(rest))
		}
	} else {
		r.Payload = rest
	}
	return r, nil
}

// LeaseRecord is the value stored under LeaseKey: the queue the lease was
// issued on, its expiry (unix nanos) and the ids it still covers.
//
// Ahead marks a lease claimed ahead of any poll (rocksstore's claims
// ahead): until the record is next written, the database cannot tell
// whether a consumer ever received its items. It is one byte after the
// ids, present only when set, so every other record encodes as before.
type LeaseRecord struct {
	Queue     string
	ExpiresAt int64
	IDs       [][16]byte
	Ahead     bool
}

// leaseAhead is the byte after a lease record's ids that sets Ahead.
const leaseAhead = 1

// EncodeLease returns the encoding of r.
func EncodeLease(r LeaseRecord) []byte {
	b := make([]byte, 0, 1+4+len(r.Queue)+8+4+IDLen*len(r.IDs)+1)
	b = append(b, FormatVersion)
	b = appendString(b, r.Queue)
	b = AppendInt64(b, r.ExpiresAt)
	b = binary.BigEndian.AppendUint32(b, uint32(len(r.IDs)))
	for _, id := range r.IDs {
		b = append(b, id[:]...)
	}
	if r.Ahead {
		b = append(b, leaseAhead)
	}
	return b
}

// DecodeLease decodes a lease record.
func DecodeLease(b []byte) (LeaseRecord, error) {
	var r LeaseRecord
	if err := checkVersion(b, "lease"); err != nil {
		return r, err
	}
	q, rest, err := readString(b[1:], "lease queue")
	if err != nil {
		return r, err
	}
	r.Queue = q
	if len(rest) < 12 {
		return r, fmt.Errorf("%w: lease: truncated", ErrMalformed)
	}
	r.ExpiresAt = readInt64(rest[:8])
	n := binary.BigEndian.Uint32(rest[8:12])
	rest = rest[12:]
	if uint64(len(rest)) == uint64(n)*IDLen+1 {
		if rest[len(rest)-1] != leaseAhead {
			return r, fmt.Errorf("%w: lease: unknown flag byte %#x after its ids", ErrMalformed, rest[len(rest)-1])
		}
		r.Ahead = true
		rest = rest[:len(rest)-1]
	}
	if uint64(len(rest)) != uint64(n)*IDLen {
		return r, fmt.Errorf("%w: lease: %d id bytes for %d ids", ErrMalformed, len(rest), n)
	}
	r.IDs = make([][16]byte, n)
	for i := range r.IDs {
		copy(r.IDs[i][:], rest[i*IDLen:])
	}
	return r, nil
}

// DedupRecord is the value stored under DedupKey: the id of the first item
// enqueued with the key and when the key stops suppressing (unix nanos).
type DedupRecord struct {
	ID        [16]byte
	ExpiresAt int64
}

// EncodeDedup returns the encoding of r.
func EncodeDedup(r DedupRecord) []byte {
	b := make([]byte, 0, 1+IDLen+8)
	b = append(b, FormatVersion)
	b = append(b, r.ID[:]...)
	return AppendInt64(b, r.ExpiresAt)
}

// DecodeDedup decodes a dedup record.
func DecodeDedup(b []byte) (DedupRecord, error) {
	var r DedupRecord
	if err := checkVersion(b, "dedup"); err != nil {
		return r, err
	}
	if len(b) != 1+IDLen+8 {
		return r, fmt.Errorf("%w: dedup: %d bytes, want %d", ErrMalformed, len(b), 1+IDLen+8)
	}
	copy(r.ID[:], b[1:1+IDLen])
	r.ExpiresAt = readInt64(b[1+IDLen:])
	return r, nil
}

// QueueConfigRecord is the value stored under QueueConfigKey. Durations are
// nanoseconds.
type QueueConfigRecord struct {
	MaxAttempts uint32
	Lease       int64
	DedupWindow int64
	BackoffBase int64
	BackoffMax  int64
}

const queueConfigLen = 1 + 4 + 4*8

// EncodeQueueConfig returns the encoding of r.
func EncodeQueueConfig(r QueueConfigRecord) []byte {
	b := make([]byte, 0, queueConfigLen)
	b = append(b, FormatVersion)
	b = binary.BigEndian.AppendUint32(b, r.MaxAttempts)
	b = AppendInt64(b, r.Lease)
	b = AppendInt64(b, r.DedupWindow)
	b = AppendInt64(b, r.BackoffBase)
	return AppendInt64(b, r.BackoffMax)
}

// DecodeQueueConfig decodes a queue config.
func DecodeQueueConfig(b []byte) (QueueConfigRecord, error) {
	var r QueueConfigRecord
	if err := checkVersion(b, "queue config"); err != nil {
		return r, err
	}
	if len(b) != queueConfigLen {
		return r, fmt.Errorf("%w: queue config: %d bytes, want %d", ErrMalformed, len(b), queueConfigLen)
	}
	r.MaxAttempts = binary.BigEndian.Uint32(b[1:5])
	r.Lease = readInt64(b[5:13])
	r.DedupWindow = readInt64(b[13:21])
	r.BackoffBase = readInt64(b[21:29])
	r.BackoffMax = readInt64(b[29:37])
	return r, nil
}

// Counters are a queue's persisted counters: gauges (Ready .. Leases) and
// lifetime totals. The same encoding holds an absolute value and a delta
// (a merge operand); Add combines them.
type Counters struct {
	Ready, Delayed, Inflight, Dead, Leases int64
	Enqueued, Duplicates, Delivered        int64
	Acked, Nacked, Expired                 int64
	DeadLettered, Redriven, Purged         int64
}

// countersFields lists the fields in encoding order. Part of the on-disk
// format: append new fields at the end only.
func (c *Counters) fields() [14]*int64 {
	return [14]*int64{
		&c.Ready, &c.Delayed, &c.Inflight, &c.Dead, &c.Leases,
		&c.Enqueued, &c.Duplicates, &c.Delivered,
		&c.Acked, &c.Nacked, &c.Expired,
		&c.DeadLettered, &c.Redriven, &c.Purged,
	}
}

const countersLen = 1 + 14*8

// Add returns c + d field by field.
func (c Counters) Add(d Counters) Counters {
	cf, df := c.fields(), d.fields()
	for i := range cf {
		*cf[i] += *df[i]
	}
	return c
}

// IsZero reports whether every field is zero.
func (c Counters) IsZero() bool { return c == Counters{} }

// EncodeCounters returns the encoding of c.
func EncodeCounters(c Counters) []byte {
	return AppendCounters(make([]byte, 0, countersLen), c)
}

// AppendCounters appends the encoding of c to b.
func AppendCounters(b []byte, c Counters) []byte {
	b = append(b, FormatVersion)
	for _, f := range c.fields() {
		b = binary.BigEndian.AppendUint64(b, uint64(*f))
	}
	return b
}

// DecodeCounters decodes counters.
func DecodeCounters(b []byte) (Counters, error) {
	var c Counters
	if err := checkVersion(b, "counters"); err != nil {
		return c, err
	}
	if len(b) != countersLen {
		return c, fmt.Errorf("%w: counters: %d bytes, want %d", ErrMalformed, len(b), countersLen)
	}
	for i, f := range c.fields() {
		*f = int64(binary.BigEndian.Uint64(b[1+8*i:]))
	}
	return c, nil
}

// EncodeUint64 encodes a meta number (format version, id high-water mark).
func EncodeUint64(v uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{FormatVersion}, v)
}

// DecodeUint64 decodes a meta number.
func DecodeUint64(b []byte) (uint64, error) {
	if err := checkVersion(b, "uint64"); err != nil {
		return 0, err
	}
	if len(b) != 9 {
		return 0, fmt.Errorf("%w: uint64: %d bytes, want 9", ErrMalformed, len(b))
	}
	return binary.BigEndian.Uint64(b[1:]), nil
}

// EncodePayload encodes an external payload value.
func EncodePayload(p []byte) []byte {
	b := make([]byte, 0, 1+len(p))
	return append(append(b, FormatVersion), p...)
}

// DecodePayload decodes an external payload value; the result aliases b.
func DecodePayload(b []byte) ([]byte, error) {
	if err := checkVersion(b, "payload"); err != nil {
		return nil, err
	}
	return b[1:], nil
}

// Marker is the value of index entries that carry no data (visibility,
// lease_expiry, delayed, dedup_expiry): just the format version.
func Marker() []byte { return []byte{FormatVersion} }

// DecodeMarker checks an index entry's value.
func DecodeMarker(b []byte) error {
	if err := checkVersion(b, "marker"); err != nil {
		return err
	}
	if len(b) != 1 {
		return fmt.Errorf("%w: marker: %d bytes, want 1", ErrMalformed, len(b))
	}
	return nil
}

func checkVersion(b []byte, what string) error {
	if len(b) == 0 {
		return fmt.Errorf("%w: %s: empty value", ErrMalformed, what)
	}
	if b[0] != FormatVersion {
		return fmt.Errorf("%w: %s: unknown format version %d", ErrMalformed, what, b[0])
	}
	return nil
}

func appendString(dst []byte, s string) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(s)))
	return append(dst, s...)
}

func readString(b []byte, what string) (string, []byte, error) {
	if len(b) < 4 {
		return "", nil, fmt.Errorf("%w: %s: truncated length", ErrMalformed, what)
	}
	n := binary.BigEndian.Uint32(b[:4])
	if uint64(len(b)-4) < uint64(n) {
		return "", nil, fmt.Errorf("%w: %s: length %d exceeds %d remaining bytes", ErrMalformed, what, n, len(b)-4)
	}
	return string(b[4 : 4+n]), b[4+n:], nil
}
