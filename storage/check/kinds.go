package check

import "github.com/leaseq/leaseq/storage"

// The kinds of violation Run reports. Each is a stable code: tests and
// tools match on it, never on the message. Part of Check's output format;
// never rename or reuse a kind, add new ones instead. The number in
// brackets is the invariant of DESIGN.md the rule belongs to (0: a rule of
// the layout that DESIGN.md does not number).
const (
	// KindCorrupt (0): the backend could not read part of its own data: a
	// key or value that does not decode, or an in-memory structure out of
	// shape (memstore's heaps). The adapter reports it; the rest of the
	// data is still checked.
	KindCorrupt storage.ViolationKind = "corrupt"
	// KindUnknownQueue (0): an item, lease, dedup key or counters record
	// names a queue that has no config (queues exist by their config).
	KindUnknownQueue storage.ViolationKind = "unknown_queue"

	// KindItemDuplicate (1): one item id of a queue is in two of
	// available, in_progress and dlq.
	KindItemDuplicate storage.ViolationKind = "item_duplicate"
	// KindItemNoState (1): an item the backend could not place in any
	// state.
	KindItemNoState storage.ViolationKind = "item_no_state"
	// KindItemRecordState (1): an item's record contradicts its state: an
	// inflight item without a lease token, another one with a token, a dead
	// item without its death record (reason, dead_at) or another one with
	// one.
	KindItemRecordState storage.ViolationKind = "item_record_state"

	// KindServeEntryCount (2): an item that belongs in the serve-order
	// (visibility) index has no entry there, or more than one.
	KindServeEntryCount storage.ViolationKind = "serve_entry_count"
	// KindServeEntryOrphan (2): a serve-order entry names no item that
	// belongs in the index.
	KindServeEntryOrphan storage.ViolationKind = "serve_entry_orphan"
	// KindServeEntryMismatch (2): a serve-order entry of an item disagrees
	// with the item's priority or visible_at.
	KindServeEntryMismatch storage.ViolationKind = "serve_entry_mismatch"
	// KindDelayedEntryCount (2): a delayed item has no entry in one of the
	// backend's delayed indexes, or more than one.
	KindDelayedEntryCount storage.ViolationKind = "delayed_entry_count"
	// KindDelayedEntryOrphan (2): a delayed-index entry names no delayed
	// item.
	KindDelayedEntryOrphan storage.ViolationKind = "delayed_entry_orphan"
	// KindDelayedEntryMismatch (2): a delayed-index entry of a delayed item
	// disagrees with its visible_at (or priority, where the index keeps it).
	KindDelayedEntryMismatch storage.ViolationKind = "delayed_entry_mismatch"

	// KindInflightListing (3): an inflight item is listed by no lease
	// holding its token, or by more than one listing.
	KindInflightListing storage.ViolationKind = "inflight_listing"
	// KindLeaseEmpty (3): a lease lists no items.
	KindLeaseEmpty storage.ViolationKind = "lease_empty"
	// KindLeaseItemMissing (3): a lease lists an item that is not inflight
	// (gone, or available or dead).
	KindLeaseItemMissing storage.ViolationKind = "lease_item_missing"
	// KindLeaseItemForeign (3): a lease lists an inflight item whose record
	// carries another lease's token.
	KindLeaseItemForeign storage.ViolationKind = "lease_item_foreign"
	// KindLeaseExpiryCount (3): a lease has no lease_expiry entry, or more
	// than one.
	KindLeaseExpiryCount storage.ViolationKind = "lease_expiry_count"
	// KindLeaseExpiryOrphan (3): a lease_expiry entry names no lease.
	KindLeaseExpiryOrphan storage.ViolationKind = "lease_expiry_orphan"
	// KindLeaseExpiryMismatch (3): a lease_expiry entry disagrees with its
	// lease's expiry.
	KindLeaseExpiryMismatch storage.ViolationKind = "lease_expiry_mismatch"

	// KindCounterMismatch (4): a persisted per-queue counter (ready,
	// delayed, inflight, dead, leases) differs from what the scan counts.
	KindCounterMismatch storage.ViolationKind = "counter_mismatch"

	// KindAttemptsExceeded (5): an item outside the dlq has more attempts
	// than its own max_attempts. (A queue's max_attempts may be lowered
	// under items, so only an item's own limit is checked.)
	KindAttemptsExceeded storage.ViolationKind = "attempts_exceeded"

	// KindDedupExpiryCount (0): a dedup key has no dedup_expiry entry, or
	// more than one, so the sweeper would never (or twice) drop it.
	KindDedupExpiryCount storage.ViolationKind = "dedup_expiry_count"
	// KindDedupExpiryOrphan (0): a dedup_expiry entry names no dedup key.
	KindDedupExpiryOrphan storage.ViolationKind = "dedup_expiry_orphan"
	// KindDedupExpiryMismatch (0): a dedup_expiry entry disagrees with its
	// key's expiry.
	KindDedupExpiryMismatch storage.ViolationKind = "dedup_expiry_mismatch"

	// KindPayloadMissing (0): an item's out-of-record payload is absent or
	// has the wrong number of parts.
	KindPayloadMissing storage.ViolationKind = "payload_missing"
	// KindPayloadOrphan (0): an out-of-record payload that no item refers
	// to and that is not a pending upload.
	KindPayloadOrphan storage.ViolationKind = "payload_orphan"
	// KindPayloadPending (0): an item refers to a payload still marked as
	// a pending upload, which the garbage collector would drop.
	KindPayloadPending storage.ViolationKind = "payload_pending"
)

// Kinds lists every kind, in the order above.
var Kinds = []storage.ViolationKind{
	KindCorrupt, KindUnknownQueue,
	KindItemDuplicate, KindItemNoState, KindItemRecordState,
	KindServeEntryCount, KindServeEntryOrphan, KindServeEntryMismatch,
	KindDelayedEntryCount, KindDelayedEntryOrphan, KindDelayedEntryMismatch,
	KindInflightListing, KindLeaseEmpty, KindLeaseItemMissing, KindLeaseItemForeign,
	KindLeaseExpiryCount, KindLeaseExpiryOrphan, KindLeaseExpiryMismatch,
	KindCounterMismatch,
	KindAttemptsExceeded,
	KindDedupExpiryCount, KindDedupExpiryOrphan, KindDedupExpiryMismatch,
	KindPayloadMissing, KindPayloadOrphan, KindPayloadPending,
}

// Invariant returns the number of the DESIGN.md invariant k belongs to, or
// 0 for a rule DESIGN.md does not number.
func Invariant(k storage.ViolationKind) int {
	switch k {
	case KindItemDuplicate, KindItemNoState, KindItemRecordState:
		return 1
	case KindServeEntryCount, KindServeEntryOrphan, KindServeEntryMismatch,
		KindDelayedEntryCount, KindDelayedEntryOrphan, KindDelayedEntryMismatch:
		return 2
	case KindInflightListing, KindLeaseEmpty, KindLeaseItemMissing, KindLeaseItemForeign,
		KindLeaseExpiryCount, KindLeaseExpiryOrphan, KindLeaseExpiryMismatch:
		return 3
	case KindCounterMismatch:
		return 4
	case KindAttemptsExceeded:
		return 5
	}
	return 0
}
