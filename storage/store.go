package storage

import (
	"context"
	"slices"
	"time"
)

// Store is the contract every backend (rocksstore, memstore, fdbsync)
// implements, and that storagetest checks. All methods are safe for
// concurrent use. Instants are passed in by the caller (Now fields): a Store
// never reads a clock. Every mutating call is durable under the store's
// sync policy when it returns without error.
//
// A change may be visible to other calls before it is durable: a poll can
// claim an item whose enqueue has not returned yet (rocksstore writes
// batches before their fsync). That is safe for at-least-once delivery
// because nobody was told of the change: the producer has no OK, and the
// poll's own reply waits for the same fsync or a later one. A crash in the
// window loses the change and whatever was built on it together, with no
// caller answered (rocksstore's TestRocksStore_FsyncFailureInWindow).
//
// Batch calls return one result per input element, in input order; a bad
// element gets its own Code and does not fail the others. A returned error
// means nothing in the call was applied (or, for ErrClosed and I/O errors,
// that the outcome is unknown and the call is safe to retry with the same
// semantics as at-least-once delivery).
type Store interface {
	// Enqueue adds items to a queue, creating the queue with
	// DefaultQueueConfig if it does not exist. An item whose DedupKey was
	// enqueued in the same queue less than the queue's DedupWindow ago
	// (judged at p.Now, by the window in force then) is not written: its
	// result carries the first item's id and Duplicate=true. Two items in
	// one batch with the same key: the second is a duplicate of the first.
	// Errors: ErrInvalidArgument (queue name, batch size); per-item limits
	// give CodeInvalid. The store keeps no reference to p's payloads once
	// Enqueue returns: the caller may reuse their buffers.
	Enqueue(ctx context.Context, p EnqueueParams) ([]EnqueueResult, error)

	// Poll claims up to p.Max ready items (VisibleAt <= p.Now) in serve
	// order: Priority ascending, then VisibleAt, then ID. It increments
	// each item's Attempts, moves them to inflight under one new lease
	// expiring at p.Now + lease (p.Lease, or the queue's default when 0),
	// and returns them. No ready items (or no such queue) is not an error:
	// the result has no items and a zero lease. Poll never blocks waiting
	// for items; long polling lives in rpc.
	Poll(ctx context.Context, p PollParams) (PollResult, error)

	// Ack deletes inflight items held under p.Lease. Per id: CodeOK,
	// CodeNotFound, CodeLeaseMismatch, CodeLeaseExpired (see Code). A lease
	// is live while p.Now < ExpiresAt. A rejected id changes nothing.
	Ack(ctx context.Context, p AckParams) ([]Code, error)

	// Nack ends the delivery of inflight items held under p.Lease without
	// success. Each item goes back to available with VisibleAt = p.Now +
	// delay (p.Delay, or Backoff(config, attempts, rand) when p.Delay is
	// nil), or to the dead-letter namespace with Reason "nack: <reason>"
	// when Attempts >= its max attempts. LastError is set to p.Reason.
	// Codes as for Ack. With p.Undelivered the nack takes the claim back
	// instead (see NackParams.Undelivered).
	Nack(ctx context.Context, p NackParams) ([]Code, error)

	// ExtendLease sets a live lease's expiry to p.Now + p.Duration (which
	// may shorten it) and returns the new expiry. ErrLeaseExpired when the
	// lease is not live; ErrLeaseMismatch when it belongs to another queue.
	ExtendLease(ctx context.Context, p ExtendParams) (time.Time, error)

	// Sweep does one bounded pass of deadline work at p.Now: expires up to
	// p.Limit leases whose expiry <= p.Now (each item back to ready with
	// VisibleAt = its lease's expiry, or to dead with Reason "lease
	// expired" when Attempts >= max attempts), moves delayed items whose
	// VisibleAt <= p.Now into the ready count, and drops expired dedup keys.
	// It reports the queues that gained ready items and the earliest
	// deadline still pending. A store that applies a pass in steps (each
	// atomic) returns with an error what the steps before it did (their
	// counts and the queues they made ready, More false), so that those
	// queues' waiting polls are still woken.
	Sweep(ctx context.Context, p SweepParams) (SweepResult, error)

	// Stats returns one QueueStats per queue (all queues when p.Queue is
	// "", sorted by name). ErrNotFound when p.Queue names no queue. Ready
	// and Delayed are counters: an item whose delay has passed counts as
	// delayed until the next Sweep (the sweeper runs within milliseconds).
	Stats(ctx context.Context, p StatsParams) ([]QueueStats, error)

	// Queues lists queue names in byte order.
	Queues(ctx context.Context) ([]string, error)

	// Peek lists items of a queue without leasing them, in id order
	// starting after p.After: available items (State ready or delayed at
	// p.Now), or inflight items when p.Inflight is set.
	Peek(ctx context.Context, p PeekParams) ([]Item, error)

	// Purge deletes every available and inflight item of a queue (and
	// their leases and index entries) and returns how many it deleted. Dead
	// items are kept (see PurgeDead). The queue and its config remain.
	Purge(ctx context.Context, p PurgeParams) (int, error)

	// DeleteQueue removes a queue: its config, counters and dedup keys.
	// A queue that still holds items (ready, delayed, inflight or dead) is
	// refused with ErrNotEmpty unless p.Force, which deletes the items
	// first (inflight items' leases end: acking them gives CodeNotFound).
	// It returns how many items it deleted; ErrNotFound if no such queue.
	// An enqueue or SetQueueConfig afterwards creates the queue anew, with
	// the default config and zeroed counters. A store may refuse an
	// enqueue or SetQueueConfig of a queue while it deletes it with
	// ErrUnavailable (rocksstore, once it has begun to drop the dedup
	// keys); a retry after the delete creates the queue anew.
	DeleteQueue(ctx context.Context, p DeleteQueueParams) (int, error)

	// DeadList pages through a queue's dead items in id order after
	// p.After.
	DeadList(ctx context.Context, p DeadListParams) ([]DeadItem, error)

	// Redrive moves dead items back to ready (Attempts reset to 0,
	// VisibleAt = p.Now). With p.IDs, per id CodeOK or CodeNotFound; with no
	// ids, up to p.Limit dead items in id order. Returns codes (nil without
	// ids) and the number moved.
	Redrive(ctx context.Context, p RedriveParams) (RedriveResult, error)

	// PurgeDead deletes dead items, selected like Redrive.
	PurgeDead(ctx context.Context, p RedriveParams) (RedriveResult, error)

	// QueueConfig returns a queue's config; ErrNotFound if no such queue.
	QueueConfig(ctx context.Context, queue string) (QueueConfig, error)

	// SetQueueConfig replaces a queue's config, creating the queue if
	// needed. The new MaxAttempts applies to items whose own MaxAttempts is
	// 0 at their next end of delivery. A shorter DedupWindow (or 0, which
	// turns dedup off) applies at once to keys already seen; a longer one
	// does not stretch them: a key stays a duplicate at most until the end
	// of the window it was recorded under, when the sweep drops it, and a
	// dropped key cannot come back. ErrInvalidArgument for a bad config.
	SetQueueConfig(ctx context.Context, queue string, c QueueConfig) error

	// Check verifies every invariant of DESIGN.md with a full scan and
	// reports each violation. The rules live in storage/check; a backend
	// feeds them what its scan found. It is for tests and `leaseq check`;
	// it may be slow. An error means the scan failed (I/O, ctx, ErrClosed);
	// data that does not decode is a violation (check.KindCorrupt).
	Check(ctx context.Context) (CheckReport, error)

	// Close releases resources. Calls after Close return ErrClosed. Close
	// is idempotent.
	Close() error
}

// EnqueueItem is one item to enqueue.
type EnqueueItem struct {
	Payload     []byte
	Delay       time.Duration // 0..Limits.MaxDelay
	Priority    uint8
	DedupKey    string // "" for none
	MaxAttempts uint32 // 0: the queue's config at end of each delivery
}

// EnqueueParams are the arguments of Store.Enqueue.
type EnqueueParams struct {
	Queue string
	Items []EnqueueItem
	Now   time.Time
}

// EnqueueResult is the outcome for one EnqueueItem.
type EnqueueResult struct {
	Code      Code   // CodeOK or CodeInvalid
	ID        ItemID // the new id, or the first item's id when Duplicate
	Duplicate bool
	Err       string // why, when Code is CodeInvalid
}

// PollParams are the arguments of Store.Poll.
type PollParams struct {
	Queue string
	Max   int           // 1..Limits.MaxBatch
	Lease time.Duration // 0: the queue's LeaseDuration
	Now   time.Time
}

// PollResult is what Store.Poll claimed. Lease is zero when Items is empty.
type PollResult struct {
	Lease     LeaseID
	ExpiresAt time.Time
	Items     []Item // State is StateInflight; Attempts includes this delivery
}

// AckParams are the arguments of Store.Ack.
type AckParams struct {
	Queue string
	Lease LeaseID
	IDs   []ItemID
	Now   time.Time
}

// NackParams are the arguments of Store.Nack.
type NackParams struct {
	Queue  string
	Lease  LeaseID
	IDs    []ItemID
	Delay  *time.Duration // nil: exponential backoff with full jitter
	Reason string
	Now    time.Time
	// Undelivered says no consumer received the items (a poll's answer
	// its caller gave up before reading it, a subscription's batch that
	// was never delivered): the nack takes the claim back rather than
	// ending a delivery. Each item is ready again at once, in its old
	// place in the ready order (its VisibleAt is kept), with the Attempts
	// and LastError it had before the claim; it is never dead-lettered.
	// Nacked does not count it; Delivered, a lifetime counter that only
	// increases, keeps the claim. Delay must be nil or zero, and Reason is not
	// recorded.
	Undelivered bool
}

// ExtendParams are the arguments of Store.ExtendLease.
type ExtendParams struct {
	Queue    string
	Lease    LeaseID
	Duration time.Duration // Limits.MinLease..MaxLease
	Now      time.Time
}

// SweepParams are the arguments of Store.Sweep.
type SweepParams struct {
	Now   time.Time
	Limit int // max leases expired (and, separately, delayed items promoted and dedup keys dropped) in this pass
}

// SweepResult reports one Sweep pass.
type SweepResult struct {
	LeasesExpired int // lease records expired
	Requeued      int // items returned to ready by expiry
	DeadLettered  int // items sent to dead by expiry
	Promoted      int // delayed items that became ready
	DedupDropped  int // expired dedup keys removed
	// ReadyQueues are the queues that gained ready items, sorted, no
	// duplicates. A store may name more: a queue whose items no poll
	// could take a moment before (rocksstore gives back a batch it held
	// for a consumer: storage/rocksstore/prefetch.go), so that polls
	// parked on it look again.
	ReadyQueues []string
	More        bool // a limit was hit: call again at once
	// Next is the earliest deadline still pending after this pass (lease
	// expiry, delayed item becoming ready, dedup key expiring); zero when
	// there is none.
	Next time.Time
}

// StatsParams are the arguments of Store.Stats.
type StatsParams struct {
	Queue string // "" for all queues
	Now   time.Time
}

// PeekParams are the arguments of Store.Peek.
type PeekParams struct {
	Queue    string
	Inflight bool
	After    ItemID // zero: from the start
	Limit    int    // 1..Limits.MaxBatch
	Now      time.Time
}

// PurgeParams are the arguments of Store.Purge.
type PurgeParams struct {
	Queue string
	Now   time.Time
}

// DeleteQueueParams are the arguments of Store.DeleteQueue.
type DeleteQueueParams struct {
	Queue string
	Force bool // delete the queue's items too, instead of refusing
	Now   time.Time
}

// DeadListParams are the arguments of Store.DeadList.
type DeadListParams struct {
	Queue string
	After ItemID
	Limit int
}

// RedriveParams are the arguments of Store.Redrive and Store.PurgeDead.
type RedriveParams struct {
	Queue string
	IDs   []ItemID // nil: up to Limit dead items in id order
	Limit int
	Now   time.Time
}

// RedriveResult reports a Redrive or PurgeDead.
type RedriveResult struct {
	Codes []Code // per id when IDs were given, else nil
	Moved int
}

// CheckReport is the outcome of Store.Check. Every backend builds it with
// storage/check, which holds the rules, so the format and the cap on the
// list are the same everywhere.
type CheckReport struct {
	Items  int // items seen (available + inflight + dead)
	Leases int
	// Violations lists what is broken, in a stable order, at most
	// check.MaxViolations of them; empty when every invariant holds.
	Violations []Violation
	// Total counts every violation found, listed or not.
	Total int
}

// OK reports whether no invariant was violated.
func (r CheckReport) OK() bool { return r.Total == 0 && len(r.Violations) == 0 }

// Kinds returns the distinct kinds of the listed violations, sorted.
func (r CheckReport) Kinds() []ViolationKind {
	var ks []ViolationKind
	for _, v := range r.Violations {
		if !slices.Contains(ks, v.Kind) {
			ks = append(ks, v.Kind)
		}
	}
	slices.Sort(ks)
	return ks
}

// ViolationKind names the rule a violation breaks. It is a stable code for
// tests and tools to match on; the message is for people and may change.
// storage/check defines the kinds and documents each.
type ViolationKind string

// Violation is one broken rule found by Store.Check.
type Violation struct {
	Kind ViolationKind
	Msg  string // what is broken, naming the queue, item, lease or key
}

// String returns the message followed by the kind in brackets.
func (v Violation) String() string { return v.Msg + " [" + string(v.Kind) + "]" }
