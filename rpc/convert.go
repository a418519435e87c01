package rpc

import (
	"fmt"
	"math"
	"time"

	"capnproto.org/go/capnp/v3"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// toMs converts an instant to wire milliseconds; the zero time is 0.
func toMs(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	ms := t.UnixMilli()
	if ms < 0 {
		return 0
	}
	return uint64(ms)
}

// fromMs converts wire milliseconds to an instant; 0 is the zero time.
func fromMs(ms uint64) time.Time {
	if ms == 0 || ms > math.MaxInt64 {
		return time.Time{}
	}
	return time.UnixMilli(int64(ms)).UTC()
}

// maxDurMs is the largest millisecond count that fits a time.Duration.
const maxDurMs = uint64(math.MaxInt64 / int64(time.Millisecond))

// durMs converts a wire duration; values that overflow saturate, so the
// limit checks reject them with a clear message instead of wrapping.
func durMs(ms uint64) time.Duration {
	if ms > maxDurMs {
		return math.MaxInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// msDur converts a duration to wire milliseconds (negative is 0).
func msDur(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64(d / time.Millisecond)
}

// msDurUp is msDur rounded up to the next millisecond: a delay the wire
// carries is never shorter than the one asked for (found by review,
// session 70: a delay of 0.5 ms went as 0, ready at once, and one 0.5 ms
// over the node's MaxDelay went as MaxDelay, which the store would have
// refused).
func msDurUp(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	return uint64((d + time.Millisecond - 1) / time.Millisecond)
}

// checkLimit refuses a negative page limit, as the stores do (the wire
// would carry it as 0, the default page; found by review, session 70).
func checkLimit(op string, n int) error {
	if n < 0 {
		return fmt.Errorf("leaseq %s: %w: limit must be >= 0 (0: the default page), got %d", op, storage.ErrInvalidArgument, n)
	}
	return nil
}

func itemID(b []byte) (storage.ItemID, error) {
	var id storage.ItemID
	if len(b) != len(id) {
		return id, fmt.Errorf("%w: item id must be %d bytes, got %d", storage.ErrInvalidArgument, len(id), len(b))
	}
	copy(id[:], b)
	return id, nil
}

func leaseID(b []byte) (storage.LeaseID, error) {
	var l storage.LeaseID
	if len(b) != len(l) {
		return l, fmt.Errorf("%w: lease token must be %d bytes, got %d", storage.ErrInvalidArgument, len(l), len(b))
	}
	copy(l[:], b)
	return l, nil
}

// readIDs decodes a list of 16-byte ids. Any malformed id fails the request:
// a client that sends a 3-byte id has a bug worth surfacing loudly.
func readIDs(l capnp.DataList, limits storage.Limits) ([]storage.ItemID, error) {
	if err := limits.ValidateBatch(l.Len()); err != nil {
		return nil, err
	}
	ids := make([]storage.ItemID, l.Len())
	for i := range ids {
		b, err := l.At(i)
		if err != nil {
			return nil, fmt.Errorf("%w: ids[%d]: %v", storage.ErrInvalidArgument, i, err)
		}
		if ids[i], err = itemID(b); err != nil {
			return nil, fmt.Errorf("ids[%d]: %w", i, err)
		}
	}
	return ids, nil
}

func writeIDs(l capnp.DataList, ids []storage.ItemID) error {
	for i := range ids {
		if err := l.Set(i, ids[i][:]); err != nil {
			return err
		}
	}
	return nil
}

func writeCodes(l schema.ResultCode_List, codes []storage.Code) {
	for i, c := range codes {
		l.Set(i, wireCode(c))
	}
}

func readCodes(l schema.ResultCode_List) []storage.Code {
	out := make([]storage.Code, l.Len())
	for i := range out {
		out[i] = storageCode(l.At(i))
	}
	return out
}

// writeItem fills a wire Item. The payload is copied into the message.
func writeItem(w schema.Item, it *storage.Item) error {
	if err := w.SetId(it.ID[:]); err != nil {
		return err
	}
	if err := w.SetQueue(it.Queue); err != nil {
		return err
	}
	if err := w.SetPayload(it.Payload); err != nil {
		return err
	}
	w.SetPriority(it.Priority)
	w.SetAttempts(it.Attempts)
	w.SetMaxAttempts(it.MaxAttempts)
	w.SetEnqueuedAt(toMs(it.EnqueuedAt))
	w.SetVisibleAt(toMs(it.VisibleAt))
	if it.DedupKey != "" {
		if err := w.SetDedupKey(it.DedupKey); err != nil {
			return err
		}
	}
	if it.LastError != "" {
		if err := w.SetLastError(it.LastError); err != nil {
			return err
		}
	}
	w.SetState(schema.ItemState(it.State))
	return nil
}

// readItem copies a wire Item out of its message: nothing in the result
// aliases capnp buffers, which are reused once the call is released.
func readItem(r schema.Item) (storage.Item, error) {
	var ir itemReader
	return ir.read(r)
}

// itemReader decodes the items of one answer: their payloads share
// buffers, and a queue name equal to the previous item's is not copied
// again (a poll's items are all one queue's).
type itemReader struct {
	payloads []byte // the rest of the current shared buffer
	left     int    // items still to read (their payloads size the next buffer)
	queue    string
}

// maxSharedPayloads bounds a shared payload buffer, so that a caller
// keeping one item of a large answer does not keep all of it alive.
const maxSharedPayloads = 256 << 10

// payload copies p out of the message. Payloads are mostly of one size, so
// when the current buffer has no room for p, the next is made for the
// items still to read as if each were as long as p: one allocation for an
// answer whose payloads are alike, and no pass over the payloads to size
// it (reading a pointer twice cost a fifth of BenchmarkDecodePoll). The
// room a new buffer leaves in the old one is less than p, so the buffers
// of one answer add up to less than twice its payloads plus one buffer;
// a payload whose buffer would pass maxSharedPayloads gets its own.
func (ir *itemReader) payload(p []byte) []byte {
	if len(p) > cap(ir.payloads)-len(ir.payloads) {
		n := len(p) * max(ir.left, 1)
		if n > maxSharedPayloads {
			return append([]byte(nil), p...)
		}
		ir.payloads = make([]byte, 0, n)
	}
	n := len(ir.payloads)
	ir.payloads = append(ir.payloads, p...)
	return ir.payloads[n:len(ir.payloads):len(ir.payloads)]
}

func (ir *itemReader) read(r schema.Item) (storage.Item, error) {
	var it storage.Item
	b, err := r.Id()
	if err != nil {
		return it, err
	}
	if it.ID, err = itemID(b); err != nil {
		return it, err
	}
	qb, err := r.QueueBytes()
	if err != nil {
		return it, err
	}
	if string(qb) != ir.queue {
		ir.queue = string(qb)
	}
	it.Queue = ir.queue
	p, err := r.Payload()
	if err != nil {
		return it, err
	}
	it.Payload = ir.payload(p)
	ir.left--
	it.Priority = r.Priority()
	it.Attempts = r.Attempts()
	it.MaxAttempts = r.MaxAttempts()
	it.EnqueuedAt = fromMs(r.EnqueuedAt())
	it.VisibleAt = fromMs(r.VisibleAt())
	// Most items have neither: a null pointer needs no decoding.
	if r.HasDedupKey() {
		if it.DedupKey, err = r.DedupKey(); err != nil {
			return it, err
		}
	}
	if r.HasLastError() {
		if it.LastError, err = r.LastError(); err != nil {
			return it, err
		}
	}
	if s := r.State(); s <= schema.ItemState_dead {
		it.State = storage.State(s)
	}
	return it, nil
}

func writeItems(l schema.Item_List, items []storage.Item) error {
	for i := range items {
		if err := writeItem(l.At(i), &items[i]); err != nil {
			return err
		}
	}
	return nil
}

func readItems(l schema.Item_List) ([]storage.Item, error) {
	// Grown as items prove valid: a malformed answer can declare a list
	// of millions of empty elements in a few bytes.
	n := l.Len()
	out := make([]storage.Item, 0, min(n, 1024))
	ir := itemReader{left: n}
	for i := range n {
		it, err := ir.read(l.At(i))
		if err != nil {
			return nil, fmt.Errorf("items[%d]: %w", i, err)
		}
		out = append(out, it)
	}
	return out, nil
}

func writeConfig(w schema.QueueConfig, c storage.QueueConfig) {
	w.SetMaxAttempts(c.MaxAttempts)
	w.SetLeaseMs(msDur(c.LeaseDuration))
	w.SetDedupWindowMs(msDur(c.DedupWindow))
	w.SetBackoffBaseMs(msDur(c.BackoffBase))
	w.SetBackoffMaxMs(msDur(c.BackoffMax))
}

func readConfig(r schema.QueueConfig) storage.QueueConfig {
	return storage.QueueConfig{
		MaxAttempts:   r.MaxAttempts(),
		LeaseDuration: durMs(r.LeaseMs()),
		DedupWindow:   durMs(r.DedupWindowMs()),
		BackoffBase:   durMs(r.BackoffBaseMs()),
		BackoffMax:    durMs(r.BackoffMaxMs()),
	}
}

func writeStats(w schema.QueueStats, s *storage.QueueStats) error {
	if err := w.SetQueue(s.Queue); err != nil {
		return err
	}
	w.SetReady(s.Ready)
	w.SetDelayed(s.Delayed)
	w.SetInflight(s.Inflight)
	w.SetDead(s.Dead)
	w.SetLeases(s.Leases)
	w.SetOldestReadyAgeMs(msDur(s.OldestReadyAge))
	w.SetEnqueued(s.Enqueued)
	w.SetDuplicates(s.Duplicates)
	w.SetDelivered(s.Delivered)
	w.SetAcked(s.Acked)
	w.SetNacked(s.Nacked)
	w.SetExpired(s.Expired)
	w.SetDeadLettered(s.DeadLettered)
	w.SetRedriven(s.Redriven)
	w.SetPurged(s.Purged)
	w.SetCorruptErrors(s.CorruptErrors)
	c, err := w.NewConfig()
	if err != nil {
		return err
	}
	writeConfig(c, s.Config)
	return nil
}

func readStats(r schema.QueueStats) (storage.QueueStats, error) {
	q, err := r.Queue()
	if err != nil {
		return storage.QueueStats{}, err
	}
	c, err := r.Config()
	if err != nil {
		return storage.QueueStats{}, err
	}
	return storage.QueueStats{
		Queue:          q,
		Ready:          r.Ready(),
		Delayed:        r.Delayed(),
		Inflight:       r.Inflight(),
		Dead:           r.Dead(),
		Leases:         r.Leases(),
		OldestReadyAge: durMs(r.OldestReadyAgeMs()),
		Enqueued:       r.Enqueued(),
		Duplicates:     r.Duplicates(),
		Delivered:      r.Delivered(),
		Acked:          r.Acked(),
		Nacked:         r.Nacked(),
		Expired:        r.Expired(),
		DeadLettered:   r.DeadLettered(),
		Redriven:       r.Redriven(),
		Purged:         r.Purged(),
		CorruptErrors:  r.CorruptErrors(),
		Config:         readConfig(c),
	}, nil
}

func setStatus(st schema.Status, err error) error {
	st.SetCode(codeOf(err))
	return st.SetDetail(err.Error())
}

// wireLimit is a page or batch limit on the wire: negative is 0 (the
// default), and one over what a UInt32 holds is the largest it holds
// (the node caps it to its own maximum) rather than wrapping to a small
// number or 0.
func wireLimit(n int) uint32 {
	return uint32(min(max(n, 0), math.MaxUint32))
}
