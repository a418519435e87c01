// Package check holds the rules behind Store.Check, once for every
// backend. A backend's Check is a thin adapter: it scans one consistent
// view of its own representation, turns what it finds into Facts (items
// with their state, serve-order and delayed index entries, lease records
// and lease_expiry entries, dedup keys and dedup_expiry entries, per-queue
// counters, queue configs, out-of-record payloads), reports what it cannot
// decode with Facts.Corruptf, and calls Run with its Layout. Run evaluates
// every rule and builds the one report format, storage.CheckReport, with
// one cap (MaxViolations) on the violations listed and the total counted.
//
// The rules, by DESIGN.md invariant (each violation carries a stable
// kind, one of the Kind constants):
//
//  1. Every item id of a queue is in exactly one state (ready, delayed,
//     inflight, dead), and its record fits it: an inflight record carries
//     a lease token and no other does; a dead record carries its death
//     record (reason, dead_at) and no other does.
//  2. Every item that belongs in the serve-order index (ready items, and
//     delayed ones when Layout.ServeIndexHoldsDelayed) has exactly one
//     entry there, at its priority and visible_at, and every entry names
//     such an item. Likewise every delayed item has exactly one entry, at
//     its visible_at, in each of Layout.DelayedIndexes.
//  3. Every inflight item is listed by exactly one lease, the one whose
//     token its record carries; every lease lists at least one item, only
//     inflight items holding its token, and has exactly one lease_expiry
//     entry, at its expiry; every lease_expiry entry names a lease.
//  4. The persisted counters of each queue (ready, delayed, inflight,
//     dead, leases) equal what the scan counts; a queue without a counters
//     record counts as all zero.
//  5. No item outside the dlq has more attempts than its own
//     max_attempts (a queue's max_attempts may be lowered under its items,
//     so only the item's own limit binds).
//
// And the layout rules DESIGN.md does not number: every item, lease, dedup
// key and counters record belongs to a queue with a config; every dedup
// key has exactly one dedup_expiry entry, at its expiry, and every entry
// names a key; every out-of-record payload belongs to exactly the item
// that names it, with the parts the item expects, unless it is a pending
// upload, and no item names a pending upload.
//
// What a backend decides is only its Layout and how it maps records to
// facts (rocksstore, say, counts an available item as delayed while it has
// an entry in the delayed namespace, because its sweeper does not rewrite
// a promoted record), and the rules of its own layout, which it reports
// with Corruptf: rocksstore requires every meta key to decode as Open
// reads it (format version, id sequence, configs, counters), every
// out-of-record payload value to decode, and every item id below the id
// sequence's high-water mark; fdbsync leaves out the dedup keys of a
// removed queue, which its DeleteQueue clears after the queue is gone. The package never reads a clock or a database; Run
// is a pure function of its arguments, not safe for concurrent use on one
// Facts.
package check
