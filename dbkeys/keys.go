package dbkeys

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// ErrMalformed reports bytes that are not a valid encoding. Decoders wrap it
// with what they were decoding and why.
var ErrMalformed = errors.New("dbkeys: malformed encoding")

// Namespace bytes: the first byte of every key. Part of the on-disk format;
// never renumber or reuse.
const (
	NsMeta        byte = 0x01 // store metadata: format, id sequence, queue configs, counters
	NsAvailable   byte = 0x02 // items that are ready or delayed
	NsVisibility  byte = 0x03 // serve-order index over available items
	NsInProgress  byte = 0x04 // inflight items
	NsLeases      byte = 0x05 // lease records by token
	NsLeaseExpiry byte = 0x06 // global index of lease expiries
	NsDLQ         byte = 0x07 // dead items
	NsDedup       byte = 0x08 // dedup keys per queue
	NsDedupExpiry byte = 0x09 // global index of dedup key expiries
	NsDelayed     byte = 0x0A // global index of delayed items by visible_at
	NsPayload     byte = 0x0B // payloads stored outside the item record
)

// Meta kinds: the byte after NsMeta. Part of the on-disk format; never
// renumber or reuse.
const (
	MetaFormat      byte = 0x01 // -> EncodeUint64 (format version of the database)
	MetaIDSeq       byte = 0x02 // -> EncodeUint64 (id sequence high-water mark)
	MetaQueueConfig byte = 0x03 // queue -> QueueConfigRecord; its presence means the queue exists
	MetaCounters    byte = 0x04 // queue -> Counters
	MetaDeleting    byte = 0x05 // queue -> marker; the queue's delete has begun (rocksstore)
)

// IDLen is the length of item ids and lease tokens.
const IDLen = 16

// Queue names are escaped: 0x00 becomes 0x00 0xFF, and the name ends with
// 0x00 0x01. A name that is a prefix of another therefore sorts first and can
// never match the other's range, and byte order of encodings is byte order of
// names.
const (
	escByte  byte = 0x00
	escZero  byte = 0xFF
	escTerm  byte = 0x01
	signFlip      = uint64(1) << 63
)

// AppendQueue appends the escaped, terminated encoding of q.
func AppendQueue(dst []byte, q string) []byte {
	for i := 0; i < len(q); i++ {
		c := q[i]
		dst = append(dst, c)
		if c == escByte {
			dst = append(dst, escZero)
		}
	}
	return append(dst, escByte, escTerm)
}

// decodeQueue reads an escaped queue name and returns it and the rest.
func decodeQueue(b []byte) (string, []byte, error) {
	var sb strings.Builder
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c != escByte {
			sb.WriteByte(c)
			continue
		}
		if i+1 >= len(b) {
			return "", nil, fmt.Errorf("%w: queue name: truncated escape", ErrMalformed)
		}
		switch b[i+1] {
		case escZero:
			sb.WriteByte(0)
			i++
		case escTerm:
			return sb.String(), b[i+2:], nil
		default:
			return "", nil, fmt.Errorf("%w: queue name: bad escape 0x%02x", ErrMalformed, b[i+1])
		}
	}
	return "", nil, fmt.Errorf("%w: queue name: no terminator", ErrMalformed)
}

// AppendInt64 appends t big-endian with the sign bit flipped, so byte order
// is numeric order for negative and positive values alike.
func AppendInt64(dst []byte, t int64) []byte {
	return binary.BigEndian.AppendUint64(dst, uint64(t)^signFlip)
}

func readInt64(b []byte) int64 { return int64(binary.BigEndian.Uint64(b) ^ signFlip) }

// PrefixEnd returns the smallest key greater than every key starting with
// p, for use as an exclusive upper bound. It returns nil when no such key
// exists (p is empty or all 0xFF), meaning "no upper bound".
func PrefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] != 0xFF {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// SingleDeletable reports whether k is in a namespace whose keys are
// written once between deletes: an item's available record and
// visibility entry (written when it becomes available, deleted when it
// leaves), its in_progress record (written at claim, deleted at settle),
// and a lease's lease_expiry entry (its expiry and token; an extend
// deletes the old entry and writes a new one). A store may delete such a
// key with RocksDB's SingleDelete, which drops the delete together with
// the one write it covers when they meet in a flush or compaction; so it
// must never write such a key that already exists without deleting it
// first (in the same batch, the delete comes before the new write).
// Lease records, dedup keys, counters and the other namespaces are
// rewritten in place and are never single-deleted.
func SingleDeletable(k []byte) bool {
	if len(k) == 0 {
		return false
	}
	switch k[0] {
	case NsAvailable, NsVisibility, NsInProgress, NsLeaseExpiry:
		return true
	}
	return false
}

// NamespacePrefix returns the one-byte prefix of namespace ns.
func NamespacePrefix(ns byte) []byte { return []byte{ns} }

func expectNs(k []byte, ns byte, what string) ([]byte, error) {
	if len(k) == 0 || k[0] != ns {
		return nil, fmt.Errorf("%w: %s key: wrong namespace", ErrMalformed, what)
	}
	return k[1:], nil
}

func queueIDKey(ns byte, q string, id [16]byte) []byte {
	return appendQueueIDKey(make([]byte, 0, QueueIDKeyLen(q)), ns, q, id)
}

func appendQueueIDKey(dst []byte, ns byte, q string, id [16]byte) []byte {
	dst = append(dst, ns)
	dst = AppendQueue(dst, q)
	return append(dst, id[:]...)
}

// QueueIDKeyLen is the length of an available, in_progress, dlq or
// payload key of queue q whose name needs no escaping (a capacity hint).
func QueueIDKeyLen(q string) int { return 1 + len(q) + 2 + IDLen }

// VisibilityKeyLen is VisibilityKey's length for a queue q whose name
// needs no escaping (a capacity hint).
func VisibilityKeyLen(q string) int { return 1 + len(q) + 2 + 1 + 8 + IDLen }

func queuePrefix(ns byte, q string) []byte {
	k := make([]byte, 0, 1+len(q)+2)
	k = append(k, ns)
	return AppendQueue(k, q)
}

func decodeQueueIDKey(k []byte, ns byte, what string) (string, [16]byte, error) {
	var id [16]byte
	rest, err := expectNs(k, ns, what)
	if err != nil {
		return "", id, err
	}
	q, rest, err := decodeQueue(rest)
	if err != nil {
		return "", id, fmt.Errorf("%s key: %w", what, err)
	}
	if len(rest) != IDLen {
		return "", id, fmt.Errorf("%w: %s key: id is %d bytes, want %d", ErrMalformed, what, len(rest), IDLen)
	}
	copy(id[:], rest)
	return q, id, nil
}

// AvailableKey is the key of an available (ready or delayed) item.
func AvailableKey(q string, id [16]byte) []byte { return queueIDKey(NsAvailable, q, id) }

// AppendAvailableKey appends AvailableKey(q, id) to dst.
func AppendAvailableKey(dst []byte, q string, id [16]byte) []byte {
	return appendQueueIDKey(dst, NsAvailable, q, id)
}

// AvailablePrefix is the prefix of every available item of queue q.
func AvailablePrefix(q string) []byte { return queuePrefix(NsAvailable, q) }

// DecodeAvailableKey is the inverse of AvailableKey.
func DecodeAvailableKey(k []byte) (string, [16]byte, error) {
	return decodeQueueIDKey(k, NsAvailable, "available")
}

// InProgressKey is the key of an inflight item.
func InProgressKey(q string, id [16]byte) []byte { return queueIDKey(NsInProgress, q, id) }

// AppendInProgressKey appends InProgressKey(q, id) to dst.
func AppendInProgressKey(dst []byte, q string, id [16]byte) []byte {
	return appendQueueIDKey(dst, NsInProgress, q, id)
}

// InProgressPrefix is the prefix of every inflight item of queue q.
func InProgressPrefix(q string) []byte { return queuePrefix(NsInProgress, q) }

// DecodeInProgressKey is the inverse of InProgressKey.
func DecodeInProgressKey(k []byte) (string, [16]byte, error) {
	return decodeQueueIDKey(k, NsInProgress, "in_progress")
}

// DLQKey is the key of a dead item.
func DLQKey(q string, id [16]byte) []byte { return queueIDKey(NsDLQ, q, id) }

// DLQPrefix is the prefix of every dead item of queue q.
func DLQPrefix(q string) []byte { return queuePrefix(NsDLQ, q) }

// DecodeDLQKey is the inverse of DLQKey.
func DecodeDLQKey(k []byte) (string, [16]byte, error) { return decodeQueueIDKey(k, NsDLQ, "dlq") }

// PayloadKey is the key of a payload stored outside its item record.
func PayloadKey(q string, id [16]byte) []byte { return queueIDKey(NsPayload, q, id) }

// PayloadPrefix is the prefix of every external payload of queue q.
func PayloadPrefix(q string) []byte { return queuePrefix(NsPayload, q) }

// DecodePayloadKey is the inverse of PayloadKey.
func DecodePayloadKey(k []byte) (string, [16]byte, error) {
	return decodeQueueIDKey(k, NsPayload, "payload")
}

// VisibilityKey is the serve-order index entry of an available item:
// priority ascending, then visible_at, then id.
func VisibilityKey(q string, prio uint8, visibleAt int64, id [16]byte) []byte {
	return AppendVisibilityKey(make([]byte, 0, VisibilityKeyLen(q)), q, prio, visibleAt, id)
}

// AppendVisibilityKey appends VisibilityKey(q, prio, visibleAt, id) to dst.
func AppendVisibilityKey(dst []byte, q string, prio uint8, visibleAt int64, id [16]byte) []byte {
	dst = append(dst, NsVisibility)
	dst = AppendQueue(dst, q)
	dst = append(dst, prio)
	dst = AppendInt64(dst, visibleAt)
	return append(dst, id[:]...)
}

// VisibilityPrefix is the prefix of queue q's whole visibility index.
func VisibilityPrefix(q string) []byte { return queuePrefix(NsVisibility, q) }

// VisibilityPrioPrefix is the prefix of queue q's entries at priority prio.
func VisibilityPrioPrefix(q string, prio uint8) []byte {
	return append(queuePrefix(NsVisibility, q), prio)
}

// VisibilityPrioBound returns the key below every entry of queue q at
// priority prio whose visible_at is >= t: entries that are ready at t-1
// sort before it.
func VisibilityPrioBound(q string, prio uint8, t int64) []byte {
	return AppendInt64(VisibilityPrioPrefix(q, prio), t)
}

// DecodeVisibilityKey is the inverse of VisibilityKey.
func DecodeVisibilityKey(k []byte) (q string, prio uint8, visibleAt int64, id [16]byte, err error) {
	rest, err := expectNs(k, NsVisibility, "visibility")
	if err != nil {
		return "", 0, 0, id, err
	}
	q, rest, err = decodeQueue(rest)
	if err != nil {
		return "", 0, 0, id, fmt.Errorf("visibility key: %w", err)
	}
	if len(rest) != 1+8+IDLen {
		return "", 0, 0, id, fmt.Errorf("%w: visibility key: %d bytes after queue, want %d", ErrMalformed, len(rest), 1+8+IDLen)
	}
	prio = rest[0]
	visibleAt = readInt64(rest[1:9])
	copy(id[:], rest[9:])
	return q, prio, visibleAt, id, nil
}

// LeaseKey is the key of a lease record.
func LeaseKey(lease [16]byte) []byte {
	k := make([]byte, 0, 1+IDLen)
	k = append(k, NsLeases)
	return append(k, lease[:]...)
}

// DecodeLeaseKey is the inverse of LeaseKey.
func DecodeLeaseKey(k []byte) ([16]byte, error) {
	var l [16]byte
	rest, err := expectNs(k, NsLeases, "lease")
	if err != nil {
		return l, err
	}
	if len(rest) != IDLen {
		return l, fmt.Errorf("%w: lease key: token is %d bytes, want %d", ErrMalformed, len(rest), IDLen)
	}
	copy(l[:], rest)
	return l, nil
}

// TimeBound returns the key of global time index ns (NsLeaseExpiry,
// NsDelayed, NsDedupExpiry) below every entry whose instant is >= t. A scan
// of [NamespacePrefix(ns), TimeBound(ns, now+1)) finds everything due at now.
func TimeBound(ns byte, t int64) []byte {
	return AppendInt64([]byte{ns}, t)
}

// LeaseExpiryKey is the global expiry index entry of a lease.
func LeaseExpiryKey(expiresAt int64, lease [16]byte) []byte {
	k := make([]byte, 0, 1+8+IDLen)
	k = AppendInt64(append(k, NsLeaseExpiry), expiresAt)
	return append(k, lease[:]...)
}

// DecodeLeaseExpiryKey is the inverse of LeaseExpiryKey.
func DecodeLeaseExpiryKey(k []byte) (int64, [16]byte, error) {
	var l [16]byte
	rest, err := expectNs(k, NsLeaseExpiry, "lease_expiry")
	if err != nil {
		return 0, l, err
	}
	if len(rest) != 8+IDLen {
		return 0, l, fmt.Errorf("%w: lease_expiry key: %d bytes, want %d", ErrMalformed, len(rest), 8+IDLen)
	}
	copy(l[:], rest[8:])
	return readInt64(rest[:8]), l, nil
}

// DelayedKey is the global index entry of a delayed item, found by the
// sweeper once visible_at has passed.
func DelayedKey(visibleAt int64, q string, id [16]byte) []byte {
	k := make([]byte, 0, 1+8+len(q)+2+IDLen)
	k = AppendInt64(append(k, NsDelayed), visibleAt)
	k = AppendQueue(k, q)
	return append(k, id[:]...)
}

// DecodeDelayedKey is the inverse of DelayedKey.
func DecodeDelayedKey(k []byte) (visibleAt int64, q string, id [16]byte, err error) {
	rest, err := expectNs(k, NsDelayed, "delayed")
	if err != nil {
		return 0, "", id, err
	}
	if len(rest) < 8 {
		return 0, "", id, fmt.Errorf("%w: delayed key: truncated", ErrMalformed)
	}
	visibleAt = readInt64(rest[:8])
	q, rest, err = decodeQueue(rest[8:])
	if err != nil {
		return 0, "", id, fmt.Errorf("delayed key: %w", err)
	}
	if len(rest) != IDLen {
		return 0, "", id, fmt.Errorf("%w: delayed key: id is %d bytes, want %d", ErrMalformed, len(rest), IDLen)
	}
	copy(id[:], rest)
	return visibleAt, q, id, nil
}

// DedupKey is the key of a dedup entry. The dedup key is the last component
// and is stored raw.
func DedupKey(q, key string) []byte {
	k := make([]byte, 0, 1+len(q)+2+len(key))
	k = append(k, NsDedup)
	k = AppendQueue(k, q)
	return append(k, key...)
}

// DedupPrefix is the prefix of every dedup entry of queue q.
func DedupPrefix(q string) []byte { return queuePrefix(NsDedup, q) }

// DecodeDedupKey is the inverse of DedupKey.
func DecodeDedupKey(k []byte) (q, key string, err error) {
	rest, err := expectNs(k, NsDedup, "dedup")
	if err != nil {
		return "", "", err
	}
	q, rest, err = decodeQueue(rest)
	if err != nil {
		return "", "", fmt.Errorf("dedup key: %w", err)
	}
	return q, string(rest), nil
}

// DedupExpiryKey is the global expiry index entry of a dedup key.
func DedupExpiryKey(expiresAt int64, q, key string) []byte {
	k := make([]byte, 0, 1+8+len(q)+2+len(key))
	k = AppendInt64(append(k, NsDedupExpiry), expiresAt)
	k = AppendQueue(k, q)
	return append(k, key...)
}

// DecodeDedupExpiryKey is the inverse of DedupExpiryKey.
func DecodeDedupExpiryKey(k []byte) (expiresAt int64, q, key string, err error) {
	rest, err := expectNs(k, NsDedupExpiry, "dedup_expiry")
	if err != nil {
		return 0, "", "", err
	}
	if len(rest) < 8 {
		return 0, "", "", fmt.Errorf("%w: dedup_expiry key: truncated", ErrMalformed)
	}
	expiresAt = readInt64(rest[:8])
	q, rest, err = decodeQueue(rest[8:])
	if err != nil {
		return 0, "", "", fmt.Errorf("dedup_expiry key: %w", err)
	}
	return expiresAt, q, string(rest), nil
}

// MetaFormatKey is the key holding the database format version.
func MetaFormatKey() []byte { return []byte{NsMeta, MetaFormat} }

// MetaIDSeqKey is the key holding the id sequence high-water mark.
func MetaIDSeqKey() []byte { return []byte{NsMeta, MetaIDSeq} }

// QueueConfigKey is the key of queue q's config; it exists iff the queue does.
func QueueConfigKey(q string) []byte {
	return AppendQueue([]byte{NsMeta, MetaQueueConfig}, q)
}

// QueueConfigPrefix is the prefix of every queue config key.
func QueueConfigPrefix() []byte { return []byte{NsMeta, MetaQueueConfig} }

// DecodeQueueConfigKey is the inverse of QueueConfigKey.
func DecodeQueueConfigKey(k []byte) (string, error) {
	return decodeMetaQueueKey(k, MetaQueueConfig, "queue config")
}

// DeletingKey is the key of queue q's delete mark: present from the first
// write of a delete that takes more than one batch until the queue's
// config is removed, so that a delete a crash cut short is finished at
// open.
func DeletingKey(q string) []byte {
	return AppendQueue([]byte{NsMeta, MetaDeleting}, q)
}

// DeletingPrefix is the prefix of every delete mark key.
func DeletingPrefix() []byte { return []byte{NsMeta, MetaDeleting} }

// DecodeDeletingKey is the inverse of DeletingKey.
func DecodeDeletingKey(k []byte) (string, error) {
	return decodeMetaQueueKey(k, MetaDeleting, "delete mark")
}

// CountersKey is the key of queue q's persisted counters.
func CountersKey(q string) []byte {
	return AppendQueue([]byte{NsMeta, MetaCounters}, q)
}

// CountersPrefix is the prefix of every counters key.
func CountersPrefix() []byte { return []byte{NsMeta, MetaCounters} }

// DecodeCountersKey is the inverse of CountersKey.
func DecodeCountersKey(k []byte) (string, error) {
	return decodeMetaQueueKey(k, MetaCounters, "counters")
}

func decodeMetaQueueKey(k []byte, kind byte, what string) (string, error) {
	if len(k) < 2 || k[0] != NsMeta || k[1] != kind {
		return "", fmt.Errorf("%w: %s key: wrong prefix", ErrMalformed, what)
	}
	q, rest, err := decodeQueue(k[2:])
	if err != nil {
		return "", fmt.Errorf("%s key: %w", what, err)
	}
	if len(rest) != 0 {
		return "", fmt.Errorf("%w: %s key: %d trailing bytes", ErrMalformed, what, len(rest))
	}
	return q, nil
}

// NewID builds an item id: the big-endian sequence number first, so ids
// sort in allocation order, then the enqueue instant, which makes ids from
// different databases unlikely to collide and helps when reading dumps.
func NewID(seq uint64, enqueuedAt int64) [16]byte {
	var id [16]byte
	binary.BigEndian.PutUint64(id[:8], seq)
	binary.BigEndian.PutUint64(id[8:], uint64(enqueuedAt)^signFlip)
	return id
}

// IDSeq returns the sequence number of an id built by NewID.
func IDSeq(id [16]byte) uint64 { return binary.BigEndian.Uint64(id[:8]) }

// IDEnqueuedAt returns the enqueue instant (Unix nanoseconds) of an id
// built by NewID. rocksstore reads it back to judge a dedup key by the
// queue's current window: the key was seen when its first item was
// enqueued, and the dedup record itself keeps only the expiry fixed by
// the window then in force.
func IDEnqueuedAt(id [16]byte) int64 { return readInt64(id[8:]) }

// VisibilitySuffixLen is the length of a visibility key after its
// queue's VisibilityPrefix: priority, visible_at, id.
const VisibilitySuffixLen = 1 + 8 + IDLen

// DecodeVisibilitySuffix decodes the part of a visibility key after
// VisibilityPrefix(q), for scans of one queue's index that already know
// the queue.
func DecodeVisibilitySuffix(rest []byte) (prio uint8, visibleAt int64, id [16]byte, err error) {
	if len(rest) != VisibilitySuffixLen {
		return 0, 0, id, fmt.Errorf("%w: visibility key: %d bytes after queue, want %d", ErrMalformed, len(rest), VisibilitySuffixLen)
	}
	copy(id[:], rest[9:])
	return rest[0], readInt64(rest[1:9]), id, nil
}
