package storage

import (
	"encoding/hex"
	"fmt"
	"time"
)

// ItemID identifies an item. The server assigns it at enqueue; ids are unique
// per node (per cluster for fdbsync) and increase in enqueue order, so
// bytes.Compare on two ids orders them by enqueue. The byte layout is the
// backend's business; clients treat it as opaque.
type ItemID [16]byte

// String returns the id as 32 lowercase hex digits.
func (id ItemID) String() string { return hex.EncodeToString(id[:]) }

// IsZero reports whether id is the zero id (never assigned to an item).
func (id ItemID) IsZero() bool { return id == ItemID{} }

// ParseItemID parses 32 hex digits. The error wraps ErrInvalidArgument.
func ParseItemID(s string) (ItemID, error) {
	var id ItemID
	if err := parseHex16(s, id[:]); err != nil {
		return id, fmt.Errorf("%w: item id %q: %v", ErrInvalidArgument, s, err)
	}
	return id, nil
}

// LeaseID is the token handed out by one poll. Every poll gets a new one: it
// is the fence that ack, nack and extend must present.
type LeaseID [16]byte

// String returns the token as 32 lowercase hex digits.
func (l LeaseID) String() string { return hex.EncodeToString(l[:]) }

// IsZero reports whether l is the zero token (no lease).
func (l LeaseID) IsZero() bool { return l == LeaseID{} }

// ParseLeaseID parses 32 hex digits. The error wraps ErrInvalidArgument.
func ParseLeaseID(s string) (LeaseID, error) {
	var l LeaseID
	if err := parseHex16(s, l[:]); err != nil {
		return l, fmt.Errorf("%w: lease %q: %v", ErrInvalidArgument, s, err)
	}
	return l, nil
}

func parseHex16(s string, dst []byte) error {
	if len(s) != 32 {
		return fmt.Errorf("want 32 hex digits, got %d characters", len(s))
	}
	_, err := hex.Decode(dst, []byte(s))
	return err
}

// State is where an item is in its life. Each item is in exactly one state.
type State uint8

// States. Part of the wire format; never renumber or reuse.
const (
	StateUnknown State = iota
	// StateReady: in available with VisibleAt <= now. Enters by enqueue
	// without delay, by time passing a delayed item, by lease expiry, by
	// redrive. Leaves by poll (-> inflight) or purge.
	StateReady
	// StateDelayed: in available with VisibleAt > now. Enters by enqueue
	// with a delay or by nack (explicit delay or backoff). Leaves when time
	// passes (-> ready) or by purge.
	StateDelayed
	// StateInflight: in in_progress, listed by exactly one lease. Enters by
	// poll. Leaves by ack (gone), nack (-> delayed/ready or dead), lease
	// expiry (-> ready or dead), or purge.
	StateInflight
	// StateDead: in the dead-letter namespace. Enters when a delivery ends
	// without ack and Attempts >= max attempts. Leaves by redrive (-> ready,
	// attempts reset) or dead purge.
	StateDead
)

func (s State) String() string {
	switch s {
	case StateReady:
		return "ready"
	case StateDelayed:
		return "delayed"
	case StateInflight:
		return "inflight"
	case StateDead:
		return "dead"
	}
	return "unknown"
}

// Code is the per-item outcome of a batch call. Part of the wire format
// (schema's ResultCode mirrors it); never renumber or reuse.
type Code uint8

const (
	// CodeOK: the operation applied to this item.
	CodeOK Code = iota
	// CodeNotFound: no such item in this queue (acked, purged, or never
	// existed), or, for redrive and dead purge, not in the dead-letter queue.
	CodeNotFound
	// CodeLeaseMismatch: the item is inflight under a different lease, or
	// the presented lease is live but does not list this item.
	CodeLeaseMismatch
	// CodeLeaseExpired: the presented lease is not live (now >= expiry,
	// already finished, or never issued) and the item is not inflight under
	// some other live lease.
	CodeLeaseExpired
	// CodeInvalid: this item was rejected by a limit (payload size, delay,
	// dedup key length, ...); the others in the batch were still applied.
	CodeInvalid
)

func (c Code) String() string {
	switch c {
	case CodeOK:
		return "ok"
	case CodeNotFound:
		return "not_found"
	case CodeLeaseMismatch:
		return "lease_mismatch"
	case CodeLeaseExpired:
		return "lease_expired"
	case CodeInvalid:
		return "invalid"
	}
	return fmt.Sprintf("code(%d)", uint8(c))
}

// Item is an item with its metadata. Payload is owned by the caller once
// returned by a Store (stores copy out of their buffers).
type Item struct {
	ID          ItemID
	Queue       string
	Payload     []byte
	Priority    uint8  // lower is served first; 0 (the default) is most urgent
	Attempts    uint32 // deliveries so far, counting the current one when inflight
	MaxAttempts uint32 // 0 means the queue's configured max_attempts
	EnqueuedAt  time.Time
	VisibleAt   time.Time // when it becomes (or became) ready
	DedupKey    string    // "" when none
	LastError   string    // reason from the last nack, "" when none
	State       State     // filled in by Peek, Poll (inflight) and DeadList (dead)
}

// DeadItem is an item in the dead-letter namespace.
type DeadItem struct {
	Item
	// Reason says why it died: "lease expired" or "nack: <reason>".
	Reason string
	DeadAt time.Time
}

// QueueConfig is a queue's configuration.
type QueueConfig struct {
	MaxAttempts   uint32
	LeaseDuration time.Duration // used when a poll asks for lease 0
	DedupWindow   time.Duration
	BackoffBase   time.Duration
	BackoffMax    time.Duration
}

// DefaultQueueConfig is the configuration of a queue created by its first
// enqueue.
func DefaultQueueConfig() QueueConfig {
	return QueueConfig{
		MaxAttempts:   DefaultMaxAttempts,
		LeaseDuration: DefaultLeaseDuration,
		DedupWindow:   DefaultDedupWindow,
		BackoffBase:   DefaultBackoffBase,
		BackoffMax:    DefaultBackoffMax,
	}
}

// Backoff returns the nack delay for an item that has been delivered
// attempts times: random(0, min(base*2^attempts, max)), with r a uniform
// random number in [0, 1). Every Store uses this function so the bound is
// the same everywhere.
func Backoff(c QueueConfig, attempts uint32, r float64) time.Duration {
	if c.BackoffBase <= 0 {
		return 0 // min(0*2^attempts, max): a queue that retries at once
	}
	ceil := c.BackoffMax
	if attempts < 62 {
		if d := c.BackoffBase << attempts; d > 0 && d < ceil && d>>attempts == c.BackoffBase {
			ceil = d
		}
	}
	if ceil <= 0 {
		return 0
	}
	return time.Duration(r * float64(ceil))
}

// QueueStats is a snapshot of one queue. Computing it is O(1) in the number
// of items (persisted counters), apart from OldestReadyAge which may cost
// one seek per priority level in use.
type QueueStats struct {
	Queue          string
	Ready          int64
	Delayed        int64
	Inflight       int64
	Dead           int64
	Leases         int64 // live lease records (including expired, not yet swept)
	OldestReadyAge time.Duration
	// Lifetime counters; they only increase.
	Enqueued     uint64 // items accepted (duplicates excluded)
	Duplicates   uint64 // enqueues suppressed by a dedup key
	Delivered    uint64 // items claimed by polls and subscriptions (a claim given back undelivered too)
	Acked        uint64
	Nacked       uint64
	Expired      uint64 // item deliveries ended by lease expiry
	DeadLettered uint64
	Redriven     uint64
	Purged       uint64 // items dropped by purge or dead purge
	// CorruptErrors counts the calls on this queue that met damaged data
	// (storage.ErrCorrupt) since the store was opened: non-zero means part
	// of the queue may be unreachable until the data is repaired
	// (rocksstore; the other backends report 0).
	CorruptErrors uint64
	Config        QueueConfig
}
