package fdbsync

import (
	"encoding/binary"
	"errors"
	"time"

	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

// Namespace tags: one byte after the subspace prefix. Part of the on-disk
// format; never renumber or reuse.
const (
	nsQueue     byte = 'q' // q <queue>                          -> queue config
	nsCounter   byte = 'c' // c <queue> <ctr>                    -> int64 LE (atomic add)
	nsWake      byte = 'w' // w <queue>                          -> int64 LE, bumped when items become ready (watched)
	nsAvailable byte = 'a' // a <queue> <id>                     -> item record
	nsReady     byte = 'r' // r <queue> <prio> <visible> <id>    -> "" (ready index, serve order)
	nsDelayed   byte = 'd' // d <queue> <visible> <id>           -> priority (per-queue delayed index, for poll)
	nsDelayAll  byte = 'D' // D <visible> <queue> <id>           -> "" (global delayed index, for sweep)
	nsInflight  byte = 'i' // i <queue> <id>                     -> item record with lease
	nsLease     byte = 'l' // l <lease>                          -> lease record
	nsExpiry    byte = 'e' // e <expiry> <lease>                 -> ""
	nsDead      byte = 'x' // x <queue> <id>                     -> item record with reason
	nsDedup     byte = 'u' // u <queue> <key>                    -> dedup record
	nsDedupExp  byte = 'U' // U <expires> <queue> <key>          -> ""
	nsChunk     byte = 'p' // p <payload id> <n>                 -> payload chunk
	nsUpload    byte = 'P' // P <created> <payload id>           -> "" (chunks not yet referenced)
	nsMarker    byte = 't' // t <read version> <token>           -> result of a committed call (older nodes: t <created> <token>)
	nsPoller    byte = 'n' // n <queue> <node>                   -> last poll time (who polls this queue)
)

// Counter ids inside nsCounter. Part of the on-disk format; never renumber.
const (
	ctrReady byte = iota + 1
	ctrDelayed
	ctrInflight
	ctrDead
	ctrLeases
	ctrEnqueued
	ctrDuplicates
	ctrDelivered
	ctrAcked
	ctrNacked
	ctrExpired
	ctrDeadLettered
	ctrRedriven
	ctrPurged
	ctrCount // one past the last
)

// errBadKey reports a key that does not decode.
var errBadKey = errors.New("fdbsync: malformed key")

// keys builds keys under one subspace prefix. Every component is either
// fixed width (ids, times, priority) or an escaped, terminated string, so
// bytes.Compare on keys agrees with comparing the components in order and
// no queue name is a prefix trap ("a" sorts and scans apart from "ab").
type keys struct {
	prefix []byte
}

// str appends s escaped (0x00 -> 0x00 0xff) and terminated by 0x00, the
// FDB tuple layer's byte-string rule.
func appendStr(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		b = append(b, s[i])
		if s[i] == 0 {
			b = append(b, 0xff)
		}
	}
	return append(b, 0)
}

// readStr decodes a string written by appendStr.
func readStr(b []byte) (string, []byte, error) {
	var out []byte
	for i := 0; i < len(b); i++ {
		if b[i] != 0 {
			out = append(out, b[i])
			continue
		}
		if i+1 < len(b) && b[i+1] == 0xff {
			out = append(out, 0)
			i++
			continue
		}
		return string(out), b[i+1:], nil
	}
	return "", nil, errBadKey
}

// appendTime appends a unix-nano time with the sign bit flipped, so byte
// order is time order across the epoch.
func appendTime(b []byte, t time.Time) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(t.UnixNano())^(1<<63))
}

func readTime(b []byte) (time.Time, []byte, error) {
	if len(b) < 8 {
		return time.Time{}, nil, errBadKey
	}
	n := int64(binary.BigEndian.Uint64(b) ^ (1 << 63))
	return time.Unix(0, n), b[8:], nil
}

func (k keys) ns(tag byte) []byte {
	out := make([]byte, 0, len(k.prefix)+64)
	out = append(out, k.prefix...)
	return append(out, tag)
}

func (k keys) queue(q string) []byte           { return appendStr(k.ns(nsQueue), q) }
func (k keys) counters(q string) []byte        { return appendStr(k.ns(nsCounter), q) }
func (k keys) counter(q string, c byte) []byte { return append(k.counters(q), c) }
func (k keys) wake(q string) []byte            { return appendStr(k.ns(nsWake), q) }
func (k keys) availablePrefix(q string) []byte { return appendStr(k.ns(nsAvailable), q) }
func (k keys) available(q string, id storage.ItemID) []byte {
	return append(k.availablePrefix(q), id[:]...)
}
func (k keys) readyPrefix(q string) []byte { return appendStr(k.ns(nsReady), q) }
func (k keys) ready(q string, prio uint8, vis time.Time, id storage.ItemID) []byte {
	b := append(k.readyPrefix(q), prio)
	return append(appendTime(b, vis), id[:]...)
}
func (k keys) delayedPrefix(q string) []byte { return appendStr(k.ns(nsDelayed), q) }
func (k keys) delayed(q string, vis time.Time, id storage.ItemID) []byte {
	return append(appendTime(k.delayedPrefix(q), vis), id[:]...)
}
func (k keys) delayAll(vis time.Time, q string, id storage.ItemID) []byte {
	return append(appendStr(appendTime(k.ns(nsDelayAll), vis), q), id[:]...)
}
func (k keys) inflightPrefix(q string) []byte { return appendStr(k.ns(nsInflight), q) }
func (k keys) inflight(q string, id storage.ItemID) []byte {
	return append(k.inflightPrefix(q), id[:]...)
}
func (k keys) lease(l storage.LeaseID) []byte { return append(k.ns(nsLease), l[:]...) }
func (k keys) expiry(at time.Time, l storage.LeaseID) []byte {
	return append(appendTime(k.ns(nsExpiry), at), l[:]...)
}
func (k keys) deadPrefix(q string) []byte { return appendStr(k.ns(nsDead), q) }
func (k keys) dead(q string, id storage.ItemID) []byte {
	return append(k.deadPrefix(q), id[:]...)
}
func (k keys) dedupPrefix(q string) []byte { return appendStr(k.ns(nsDedup), q) }
func (k keys) dedup(q, key string) []byte  { return appendStr(k.dedupPrefix(q), key) }
func (k keys) dedupExp(at time.Time, q, key string) []byte {
	return appendStr(appendStr(appendTime(k.ns(nsDedupExp), at), q), key)
}
func (k keys) chunkPrefix(pid [16]byte) []byte { return append(k.ns(nsChunk), pid[:]...) }
func (k keys) chunk(pid [16]byte, n int) []byte {
	return binary.BigEndian.AppendUint16(k.chunkPrefix(pid), uint16(n))
}
func (k keys) upload(created time.Time, pid [16]byte) []byte {
	return append(appendTime(k.ns(nsUpload), created), pid[:]...)
}

// marker is a call's idempotency marker, filed under the read version of
// the call's first attempt: the cluster's versions, which advance about
// versionsPerSecond, age every node's markers alike, where the nodes'
// clocks may not agree (a node whose clock ran ahead collected others'
// markers early, and a retry after commit_unknown_result applied its call
// twice). Versions are below 1<<63, so these keys sort before the time-
// keyed markers of older nodes (appendTime sets that bit after 1970).
func (k keys) marker(version int64, token [16]byte) []byte {
	return append(k.markerBound(version), token[:]...)
}

// markerBound is the end of "every marker filed before version v".
func (k keys) markerBound(v int64) []byte {
	return binary.BigEndian.AppendUint64(k.ns(nsMarker), uint64(max(v, 0)))
}
func (k keys) pollersPrefix(q string) []byte { return appendStr(k.ns(nsPoller), q) }
func (k keys) poller(q string, node [16]byte) []byte {
	return append(k.pollersPrefix(q), node[:]...)
}

// timeBound returns ns + time(t): the end of "every entry before t" in a
// namespace keyed first by time.
func (k keys) timeBound(tag byte, t time.Time) []byte { return appendTime(k.ns(tag), t) }

// after returns the key just after id in a per-queue id namespace.
func after(prefix []byte, id storage.ItemID) []byte {
	if id.IsZero() {
		return prefix
	}
	return kv.KeyAfter(append(append([]byte{}, prefix...), id[:]...))
}

// idFromTail reads the 16-byte id at the end of key.
func idFromTail(key []byte) (storage.ItemID, error) {
	var id storage.ItemID
	if len(key) < len(id) {
		return id, errBadKey
	}
	copy(id[:], key[len(key)-len(id):])
	return id, nil
}

// placeholderID is the id a versionstamped key or value carries before
// commit: 10 bytes for the versionstamp, then the 2-byte order of the item
// within its transaction, then 4 zero bytes padding storage.ItemID's 16.
func placeholderID(order int) storage.ItemID {
	var id storage.ItemID
	binary.BigEndian.PutUint16(id[10:12], uint16(order))
	return id
}

// stampID fills a placeholder id with the committed versionstamp.
func stampID(vs kv.Versionstamp, order int) storage.ItemID {
	id := placeholderID(order)
	copy(id[:kv.VersionstampSize], vs[:])
	return id
}

// withOffset appends FDB's 4-byte little-endian versionstamp offset.
func withOffset(b []byte, off int) []byte {
	return binary.LittleEndian.AppendUint32(b, uint32(off))
}

// vsKey turns key, whose last 16 bytes are a placeholder id, into a
// SetVersionstampedKey operand.
func vsKey(key []byte) []byte {
	return withOffset(key, len(key)-len(storage.ItemID{}))
}
