package storage

import (
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// Defaults for per-queue configuration. A queue is created with these on its
// first enqueue (or first SetQueueConfig).
const (
	// DefaultMaxAttempts is how many deliveries an item gets before a
	// delivery that ends without ack sends it to the dead-letter queue.
	DefaultMaxAttempts = 5
	// DefaultLeaseDuration is used when a poll asks for lease 0.
	DefaultLeaseDuration = 30 * time.Second
	// DefaultDedupWindow is how long a dedup key suppresses re-enqueues.
	DefaultDedupWindow = 5 * time.Minute
	// DefaultBackoffBase and DefaultBackoffMax bound the nack backoff
	// random(0, min(base*2^attempts, max)) applied when a nack gives no delay.
	DefaultBackoffBase = 500 * time.Millisecond
	DefaultBackoffMax  = 30 * time.Second
)

// Limits bounds what a single request may carry. Stores and the RPC layer
// enforce the same Limits; DefaultLimits matches DESIGN.md.
type Limits struct {
	MaxPayload   int           // bytes per item payload
	MaxBatch     int           // items (or ids) per call
	MinLease     time.Duration // shortest lease a poll or extend may ask for
	MaxLease     time.Duration // longest lease
	MaxWait      time.Duration // longest long-poll wait (enforced by rpc)
	MaxDelay     time.Duration // longest enqueue or nack delay
	MaxDedupKey  int           // bytes per dedup key
	MaxReason    int           // bytes per nack reason (longer is truncated)
	MaxQueueName int           // bytes per queue name
	MaxQueues    int           // queues per node (creating one more fails)
}

// MaxBatchCeiling is the largest MaxBatch a node takes (leaseq serve
// --max-batch): a client may refuse more before it asks.
const MaxBatchCeiling = 100000

// DefaultLimits are the limits of DESIGN.md.
var DefaultLimits = Limits{
	MaxPayload:   1 << 20,
	MaxBatch:     1000,
	MinLease:     100 * time.Millisecond,
	MaxLease:     12 * time.Hour,
	MaxWait:      60 * time.Second,
	MaxDelay:     7 * 24 * time.Hour,
	MaxDedupKey:  1024,
	MaxReason:    4096,
	MaxQueueName: 200,
	MaxQueues:    10000,
}

// WithDefaults returns l with every zero (or negative) field replaced by
// DefaultLimits' value: Limits{MaxBatch: 10} limits batches and keeps the
// other defaults. Every backend and the rpc layer fill limits this way.
func (l Limits) WithDefaults() Limits {
	d := DefaultLimits
	orInt := func(v *int, def int) {
		if *v <= 0 {
			*v = def
		}
	}
	orDur := func(v *time.Duration, def time.Duration) {
		if *v <= 0 {
			*v = def
		}
	}
	orInt(&l.MaxPayload, d.MaxPayload)
	orInt(&l.MaxBatch, d.MaxBatch)
	orDur(&l.MinLease, d.MinLease)
	orDur(&l.MaxLease, d.MaxLease)
	orDur(&l.MaxWait, d.MaxWait)
	orDur(&l.MaxDelay, d.MaxDelay)
	orInt(&l.MaxDedupKey, d.MaxDedupKey)
	orInt(&l.MaxReason, d.MaxReason)
	orInt(&l.MaxQueueName, d.MaxQueueName)
	orInt(&l.MaxQueues, d.MaxQueues)
	return l
}

// CheckNewQueue reports whether one more queue may be created where
// existing queues exist. The error wraps ErrInvalidArgument; existing
// queues keep working.
func (l Limits) CheckNewQueue(existing int) error {
	max := l.WithDefaults().MaxQueues
	if existing >= max {
		return fmt.Errorf("%w: the node already has %d queues, its limit (--max-queues); use an existing queue", ErrInvalidArgument, existing)
	}
	return nil
}

// ValidateQueueName reports whether name is 1..l.MaxQueueName bytes of
// [A-Za-z0-9._-]. The error wraps ErrInvalidArgument.
func (l Limits) ValidateQueueName(name string) error {
	max := l.MaxQueueName
	if max <= 0 {
		max = DefaultLimits.MaxQueueName
	}
	if len(name) == 0 || len(name) > max {
		return fmt.Errorf("%w: queue name must be 1-%d bytes, got %d", ErrInvalidArgument, max, len(name))
	}
	if name == "." || name == ".." {
		// Names become paths and URL segments in tools; these two would
		// mean something else there.
		return fmt.Errorf("%w: queue name %q is reserved", ErrInvalidArgument, name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return fmt.Errorf("%w: queue name %q: byte %d (%q) is not in [A-Za-z0-9._-]", ErrInvalidArgument, name, i, c)
		}
	}
	return nil
}

// ValidateLease checks a requested lease duration. Zero means "the queue's
// default" and is accepted.
func (l Limits) ValidateLease(d time.Duration) error {
	if d == 0 {
		return nil
	}
	if d < l.MinLease || d > l.MaxLease {
		return fmt.Errorf("%w: lease %v outside [%v, %v]", ErrInvalidArgument, d, l.MinLease, l.MaxLease)
	}
	return nil
}

// ItemError is why one enqueue item was refused (ValidateItem); it wraps
// ErrInvalidArgument. Detail is the reason without the sentinel's text,
// as the rpc layer sends it.
type ItemError struct{ Detail string }

func (e *ItemError) Error() string { return ErrInvalidArgument.Error() + ": " + e.Detail }

func (e *ItemError) Unwrap() error { return ErrInvalidArgument }

// ItemReason is the EnqueueResult.Err of an item refused with err: an
// *ItemError's Detail, as the RPC and HTTP front ends carry it, so a
// refused item reads the same from a Store and over the wire (found by
// review, session 70).
func ItemReason(err error) string {
	var ie *ItemError
	if errors.As(err, &ie) {
		return ie.Detail
	}
	return err.Error()
}

// ValidateItem checks one enqueue item: payload size, delay range, dedup
// key size, in that order. Every backend and the rpc layer use it, so a
// refused item gets the same reason everywhere. The error is an
// *ItemError.
func (l Limits) ValidateItem(it EnqueueItem) error {
	l = l.WithDefaults()
	switch {
	case len(it.Payload) > l.MaxPayload:
		return &ItemError{fmt.Sprintf("payload of %d bytes exceeds the limit of %d", len(it.Payload), l.MaxPayload)}
	case it.Delay < 0 || it.Delay > l.MaxDelay:
		return &ItemError{fmt.Sprintf("delay %v outside [0, %v]", it.Delay, l.MaxDelay)}
	case len(it.DedupKey) > l.MaxDedupKey:
		return &ItemError{fmt.Sprintf("dedup key of %d bytes exceeds the limit of %d", len(it.DedupKey), l.MaxDedupKey)}
	}
	return nil
}

// ValidateDelay checks an enqueue or nack delay.
func (l Limits) ValidateDelay(d time.Duration) error {
	if d < 0 || d > l.MaxDelay {
		return fmt.Errorf("%w: delay %v outside [0, %v]", ErrInvalidArgument, d, l.MaxDelay)
	}
	return nil
}

// ValidateBatch checks the number of items or ids in one call.
func (l Limits) ValidateBatch(n int) error {
	if n > l.MaxBatch {
		return fmt.Errorf("%w: batch of %d exceeds the limit of %d", ErrInvalidArgument, n, l.MaxBatch)
	}
	return nil
}

// ValidateWait checks a long-poll wait.
func (l Limits) ValidateWait(d time.Duration) error {
	if d < 0 || d > l.MaxWait {
		return fmt.Errorf("%w: wait %v outside [0, %v]", ErrInvalidArgument, d, l.MaxWait)
	}
	return nil
}

// ValidateQueueConfig checks a queue configuration.
func (l Limits) ValidateQueueConfig(c QueueConfig) error {
	switch {
	case c.MaxAttempts < 1:
		return fmt.Errorf("%w: max_attempts must be >= 1, got %d", ErrInvalidArgument, c.MaxAttempts)
	case c.LeaseDuration < l.MinLease || c.LeaseDuration > l.MaxLease:
		return fmt.Errorf("%w: default lease %v outside [%v, %v]", ErrInvalidArgument, c.LeaseDuration, l.MinLease, l.MaxLease)
	case c.DedupWindow < 0 || c.DedupWindow > l.MaxDelay:
		return fmt.Errorf("%w: dedup window %v outside [0, %v]", ErrInvalidArgument, c.DedupWindow, l.MaxDelay)
	case c.BackoffBase < 0 || c.BackoffMax < c.BackoffBase || c.BackoffMax > l.MaxDelay:
		return fmt.Errorf("%w: backoff base %v / max %v must satisfy 0 <= base <= max <= %v", ErrInvalidArgument, c.BackoffBase, c.BackoffMax, l.MaxDelay)
	}
	return nil
}

// DefaultQueueConfig is the configuration of a queue created by its
// first enqueue on a store with limits l: DefaultQueueConfig() with its
// lease, dedup window and backoff brought within l (a node started with
// --max-lease 10s gives new queues a 10 s lease, not 30 s), so that
// ValidateQueueConfig accepts it and a poll asking for the queue's lease
// gets one the limits allow. Every backend creates queues with it.
func (l Limits) DefaultQueueConfig() QueueConfig {
	return l.ClampQueueConfig(DefaultQueueConfig())
}

// ClampQueueConfig brings c's lease, dedup window and backoff within l.
// A store applies it to the configs it reads back, so that a queue
// configured under wider limits (a node restarted with a lower
// --max-lease, or another node of an FDB cluster) gets no lease or delay
// longer than this store's limits allow.
func (l Limits) ClampQueueConfig(c QueueConfig) QueueConfig {
	l = l.WithDefaults()
	c.LeaseDuration = min(max(c.LeaseDuration, l.MinLease), l.MaxLease)
	c.DedupWindow = min(c.DedupWindow, l.MaxDelay)
	c.BackoffMax = min(c.BackoffMax, l.MaxDelay)
	c.BackoffBase = min(c.BackoffBase, c.BackoffMax)
	return c
}

// TruncateReason cuts a nack reason to at most l.MaxReason bytes on a rune
// boundary, so a valid UTF-8 reason stays valid. Every backend and the rpc
// layer truncate with it.
func (l Limits) TruncateReason(r string) string {
	max := l.WithDefaults().MaxReason
	if len(r) <= max {
		return r
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(r[cut]) {
		cut--
	}
	return r[:cut]
}
