package fdbsync

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

// Value format versions: the first byte of every value. Part of the on-disk
// format; never renumber or reuse.
const (
	fmtItem   byte = 1
	fmtLease  byte = 1
	fmtConfig byte = 1
	fmtDedup  byte = 1
	fmtMarker byte = 1
)

// Record flags. Part of the on-disk format; never renumber or reuse.
const (
	flagDelayed byte = 1 << 0 // indexed in d/D, not r
	flagChunked byte = 1 << 1 // payload in chunk keys
)

var errBadValue = fmt.Errorf("%w: fdbsync: malformed value", storage.ErrCorrupt)

// record is an item's stored metadata, the same value in available,
// inflight and dead (lease and reason used where they apply).
type record struct {
	prio        uint8
	delayed     bool
	attempts    uint32
	maxAttempts uint32
	enqueuedAt  time.Time
	visibleAt   time.Time
	dedupKey    string
	lastError   string
	lease       storage.LeaseID
	reason      string
	deadAt      time.Time

	inline  []byte // payload when not chunked
	chunked bool
	pid     [16]byte // chunk key prefix id
	size    uint32   // payload length when chunked
	nchunks uint16
}

type enc struct{ b []byte }

func (e *enc) u8(v byte)    { e.b = append(e.b, v) }
func (e *enc) u16(v uint16) { e.b = binary.BigEndian.AppendUint16(e.b, v) }
func (e *enc) u32(v uint32) { e.b = binary.BigEndian.AppendUint32(e.b, v) }
func (e *enc) i64(v int64)  { e.b = binary.BigEndian.AppendUint64(e.b, uint64(v)) }
func (e *enc) t(v time.Time) {
	if v.IsZero() {
		e.i64(math.MinInt64) // the zero time has no unix-nano value
		return
	}
	e.i64(v.UnixNano())
}
func (e *enc) raw(v []byte)   { e.b = append(e.b, v...) }
func (e *enc) bytes(v []byte) { e.u32(uint32(len(v))); e.raw(v) }
func (e *enc) str(v string)   { e.u32(uint32(len(v))); e.b = append(e.b, v...) }

type dec struct {
	b   []byte
	err error
}

func (d *dec) take(n int) []byte {
	if d.err != nil || len(d.b) < n {
		d.err = errBadValue
		// Zeros for the fixed-size readers (at most 16 bytes) so they
		// can index; never a buffer of a length read from bad data.
		return make([]byte, min(n, 16))
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}
func (d *dec) u8() byte    { return d.take(1)[0] }
func (d *dec) u16() uint16 { return binary.BigEndian.Uint16(d.take(2)) }
func (d *dec) u32() uint32 { return binary.BigEndian.Uint32(d.take(4)) }
func (d *dec) i64() int64  { return int64(binary.BigEndian.Uint64(d.take(8))) }
func (d *dec) t() time.Time {
	n := d.i64()
	if n == math.MinInt64 {
		return time.Time{}
	}
	return time.Unix(0, n)
}
func (d *dec) bytes() []byte { return append([]byte{}, d.take(int(d.u32()))...) }
func (d *dec) str() string   { return string(d.take(int(d.u32()))) }

func (r *record) encode() []byte {
	e := enc{b: make([]byte, 0, 96+len(r.inline)+len(r.dedupKey)+len(r.lastError)+len(r.reason))}
	e.u8(fmtItem)
	var flags byte
	if r.delayed {
		flags |= flagDelayed
	}
	if r.chunked {
		flags |= flagChunked
	}
	e.u8(flags)
	e.u8(r.prio)
	e.u32(r.attempts)
	e.u32(r.maxAttempts)
	e.t(r.enqueuedAt)
	e.t(r.visibleAt)
	e.str(r.dedupKey)
	e.str(r.lastError)
	e.raw(r.lease[:])
	e.str(r.reason)
	e.t(r.deadAt)
	if r.chunked {
		e.raw(r.pid[:])
		e.u32(r.size)
		e.u16(r.nchunks)
	} else {
		e.bytes(r.inline)
	}
	return e.b
}

func decodeRecord(b []byte) (record, error) {
	var r record
	d := dec{b: b}
	if d.u8() != fmtItem {
		return r, errBadValue
	}
	flags := d.u8()
	r.delayed = flags&flagDelayed != 0
	r.chunked = flags&flagChunked != 0
	r.prio = d.u8()
	r.attempts = d.u32()
	r.maxAttempts = d.u32()
	r.enqueuedAt = d.t()
	r.visibleAt = d.t()
	r.dedupKey = d.str()
	r.lastError = d.str()
	copy(r.lease[:], d.take(16))
	r.reason = d.str()
	r.deadAt = d.t()
	if r.chunked {
		copy(r.pid[:], d.take(16))
		r.size = d.u32()
		r.nchunks = d.u16()
	} else {
		r.inline = d.bytes()
	}
	if d.err != nil {
		return r, d.err
	}
	return r, nil
}

// leaseRec is a lease: its queue, expiry and the items it still lists.
type leaseRec struct {
	queue  string
	expiry time.Time
	ids    []storage.ItemID
}

func (l *leaseRec) encode() []byte {
	e := enc{b: make([]byte, 0, 16+len(l.queue)+16*len(l.ids))}
	e.u8(fmtLease)
	e.str(l.queue)
	e.t(l.expiry)
	e.u32(uint32(len(l.ids)))
	for _, id := range l.ids {
		e.raw(id[:])
	}
	return e.b
}

func decodeLease(b []byte) (leaseRec, error) {
	var l leaseRec
	d := dec{b: b}
	if d.u8() != fmtLease {
		return l, errBadValue
	}
	l.queue = d.str()
	l.expiry = d.t()
	n := int(d.u32())
	if d.err == nil && n*16 > len(d.b) {
		return l, errBadValue
	}
	l.ids = make([]storage.ItemID, n)
	for i := range l.ids {
		copy(l.ids[i][:], d.take(16))
	}
	return l, d.err
}

func (l *leaseRec) remove(id storage.ItemID) bool {
	for i, x := range l.ids {
		if x == id {
			l.ids = append(l.ids[:i], l.ids[i+1:]...)
			return true
		}
	}
	return false
}

// encodeConfig encodes a queue's config, and after it created, the
// versionstamp of the commit that created the queue (its incarnation; see
// queueConfig). A queue is created with createConfig, which has the commit
// fill created in; a later set keeps the stored one. Configs of older
// nodes end before created: decodeConfig reads both, and older nodes
// ignore the trailing bytes.
func encodeConfig(c storage.QueueConfig, created kv.Versionstamp) []byte {
	e := enc{}
	e.u8(fmtConfig)
	e.u32(c.MaxAttempts)
	e.i64(int64(c.LeaseDuration))
	e.i64(int64(c.DedupWindow))
	e.i64(int64(c.BackoffBase))
	e.i64(int64(c.BackoffMax))
	e.raw(created[:])
	return e.b
}

// configCreatedOffset is where created starts in an encoded config.
const configCreatedOffset = 1 + 4 + 4*8

// createConfig writes the config of a queue created by tx, its created
// filled with tx's versionstamp. Not readable in tx (FDB's rule for
// versionstamped values); no caller reads it back there.
func createConfig(tx kv.Tx, key []byte, c storage.QueueConfig) {
	tx.SetVersionstampedValue(key, withOffset(encodeConfig(c, kv.Versionstamp{}), configCreatedOffset))
}

// configCreated returns the incarnation stored in an encoded config: zero
// for a config written by an older node.
func configCreated(b []byte) kv.Versionstamp {
	var vs kv.Versionstamp
	if len(b) >= configCreatedOffset+kv.VersionstampSize {
		copy(vs[:], b[configCreatedOffset:])
	}
	return vs
}

// dedupBefore reports whether dedup record d was written before the queue
// incarnation created (zero: unknown, counted as not before): such a
// record is left from a removed queue of the same name, and neither
// suppresses an enqueue nor counts in checks. Item ids begin with their
// commit's versionstamp.
func dedupBefore(d dedupRec, created kv.Versionstamp) bool {
	return created != (kv.Versionstamp{}) && bytes.Compare(d.id[:kv.VersionstampSize], created[:]) < 0
}

func decodeConfig(b []byte) (storage.QueueConfig, error) {
	var c storage.QueueConfig
	d := dec{b: b}
	if d.u8() != fmtConfig {
		return c, errBadValue
	}
	c.MaxAttempts = d.u32()
	c.LeaseDuration = time.Duration(d.i64())
	c.DedupWindow = time.Duration(d.i64())
	c.BackoffBase = time.Duration(d.i64())
	c.BackoffMax = time.Duration(d.i64())
	return c, d.err
}

// dedupRec is the value of a dedup key: the first item's id, when the
// key stops suppressing, and when it was seen (the first item's enqueue).
// The id sits at offset 1 so it can be written by SetVersionstampedValue
// in the enqueue that creates the item. The key is a duplicate only
// within the queue's current window from seen (holds), so seen is kept:
// ids here are versionstamps and carry no time. It was added after the
// first release, at the end of the value: a record from an older node has
// none (zero seen, judged by its expiry alone), and an older node reading
// a newer record ignores the trailing bytes as its decoder always has.
type dedupRec struct {
	id      storage.ItemID
	expires time.Time
	seen    time.Time
}

const dedupIDOffset = 1

func (r dedupRec) encode() []byte {
	e := enc{}
	e.u8(fmtDedup)
	e.raw(r.id[:])
	e.t(r.expires)
	if !r.seen.IsZero() {
		e.t(r.seen)
	}
	return e.b
}

func decodeDedup(b []byte) (dedupRec, error) {
	var r dedupRec
	d := dec{b: b}
	if d.u8() != fmtDedup {
		return r, errBadValue
	}
	copy(r.id[:], d.take(16))
	r.expires = d.t()
	if d.err == nil && len(d.b) >= 8 {
		r.seen = d.t()
	}
	return r, d.err
}

// holds reports whether the record still makes an enqueue at now a
// duplicate under the queue's current window. Its expiry was fixed by
// the window when the key was seen; a window shortened since (or set to
// 0, which turns dedup off) applies at once, or producers' items would be
// dropped for up to the old window. A longer window does not stretch the
// record: the sweep drops it at its expiry either way. A record without
// seen (an older node's) is judged by its expiry alone.
func (r dedupRec) holds(now time.Time, window time.Duration) bool {
	if window <= 0 || !r.expires.After(now) {
		return false
	}
	return r.seen.IsZero() || now.Sub(r.seen) < window
}

// counterValue decodes an atomic-add counter (absent is 0).
func counterValue(b []byte) int64 {
	if len(b) == 0 {
		return 0
	}
	var buf [8]byte
	copy(buf[:], b)
	return int64(binary.LittleEndian.Uint64(buf[:]))
}

// errNoVersionstamp is returned when a committed transaction that should
// have used a versionstamp has none (a bug, not a runtime condition).
var errNoVersionstamp = errors.New("fdbsync: committed enqueue has no versionstamp")
