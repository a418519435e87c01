package httpapi

import (
	"encoding/base64"
	"fmt"
	"math"
	"time"
	"unicode/utf8"

	"github.com/leaseq/leaseq/rpc/errcode"
	"github.com/leaseq/leaseq/storage"
)

// The JSON bodies of the API. Field names are snake_case; durations are
// integer milliseconds (*_ms); instants are RFC 3339 in UTC with
// milliseconds; ids and leases are 32 hex digits. openapi.json describes
// the same shapes.

// timeFormat is how instants are written, as the CLI writes them.
const timeFormat = "2006-01-02T15:04:05.000Z07:00"

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(timeFormat)
}

// msDur converts milliseconds from a request to a duration; values that
// overflow saturate, so the limit checks reject them with a clear message
// instead of wrapping.
func msDur(ms int64) time.Duration {
	const maxMs = math.MaxInt64 / int64(time.Millisecond)
	switch {
	case ms > maxMs:
		return math.MaxInt64
	case ms < -maxMs:
		return math.MinInt64
	}
	return time.Duration(ms) * time.Millisecond
}

// EnqueueItem is one item of an enqueue request. Payload (standard base64)
// and Text (the payload as UTF-8 text) are exclusive; with neither the
// payload is empty.
type EnqueueItem struct {
	Payload     *string `json:"payload,omitempty"`
	Text        *string `json:"text,omitempty"`
	DelayMs     int64   `json:"delay_ms,omitempty"`
	Priority    int64   `json:"priority,omitempty"`
	DedupKey    string  `json:"dedup_key,omitempty"`
	MaxAttempts int64   `json:"max_attempts,omitempty"`

	raw []byte // the payload of an application/octet-stream enqueue
}

// item converts an enqueue item and checks it with storage's rules; a
// non-empty reason rejects this item only.
func (e *EnqueueItem) item(l storage.Limits) (storage.EnqueueItem, string) {
	payload := e.raw
	switch {
	case e.raw != nil:
	case e.Payload != nil && e.Text != nil:
		return storage.EnqueueItem{}, "give payload (base64) or text, not both"
	case e.Text != nil:
		payload = []byte(*e.Text)
	case e.Payload != nil:
		var err error
		if payload, err = decodeBase64(*e.Payload); err != nil {
			return storage.EnqueueItem{}, fmt.Sprintf("payload is not standard base64: %v", err)
		}
	}
	if e.Priority < 0 || e.Priority > math.MaxUint8 {
		return storage.EnqueueItem{}, fmt.Sprintf("priority %d outside [0, 255]", e.Priority)
	}
	if e.MaxAttempts < 0 || e.MaxAttempts > math.MaxUint32 {
		return storage.EnqueueItem{}, fmt.Sprintf("max_attempts %d outside [0, %d]", e.MaxAttempts, uint32(math.MaxUint32))
	}
	it := storage.EnqueueItem{
		Payload:     payload,
		Delay:       msDur(e.DelayMs),
		Priority:    uint8(e.Priority),
		DedupKey:    e.DedupKey,
		MaxAttempts: uint32(e.MaxAttempts),
	}
	if err := l.ValidateItem(it); err != nil {
		return storage.EnqueueItem{}, itemReason(err)
	}
	return it, ""
}

// itemReason is the reason of a ValidateItem error, as RPC sends it.
func itemReason(err error) string {
	if ie, ok := err.(*storage.ItemError); ok {
		return ie.Detail
	}
	return err.Error()
}

// decodeBase64 accepts standard base64 with or without padding.
func decodeBase64(s string) ([]byte, error) {
	if len(s)%4 == 0 {
		return base64.StdEncoding.DecodeString(s)
	}
	return base64.RawStdEncoding.DecodeString(s)
}

// EnqueueResponse answers an enqueue: IDs[i] is the id of item i (null
// when it was refused; the first item's id when it was a duplicate), and
// Results[i] its outcome.
type EnqueueResponse struct {
	IDs     []*string       `json:"ids"`
	Results []EnqueueResult `json:"results"`
}

// EnqueueResult is one item's outcome: Code "ok" or "invalid" (with
// Error saying why).
type EnqueueResult struct {
	Code      string `json:"code"`
	ID        string `json:"id,omitempty"`
	Duplicate bool   `json:"duplicate,omitempty"`
	Error     string `json:"error,omitempty"`
}

func enqueueResponse(rs []storage.EnqueueResult) EnqueueResponse {
	out := EnqueueResponse{IDs: make([]*string, len(rs)), Results: make([]EnqueueResult, len(rs))}
	for i, r := range rs {
		res := EnqueueResult{Code: errcode.ItemCodeName(r.Code), Duplicate: r.Duplicate, Error: r.Err}
		if r.Code == storage.CodeOK {
			id := r.ID.String()
			res.ID, out.IDs[i] = id, &id
		}
		out.Results[i] = res
	}
	return out
}

// PollRequest asks for up to Max items (default 1) under a lease of
// LeaseMs (0: the queue's), waiting up to WaitMs for the first one.
type PollRequest struct {
	Max     *int64 `json:"max,omitempty"`
	LeaseMs int64  `json:"lease_ms,omitempty"`
	WaitMs  int64  `json:"wait_ms,omitempty"`
}

// PollResponse is what a poll leased: Lease and ExpiresAt are absent when
// Items is empty.
type PollResponse struct {
	Lease     string `json:"lease,omitempty"`
	ExpiresAt string `json:"expires_at,omitempty"`
	Items     []Item `json:"items"`
}

// Item is an item as poll, peek and the dead-letter list show it. Text is
// the payload itself, present exactly when the payload is valid UTF-8;
// Reason and DeadAt are set for dead items only.
type Item struct {
	ID          string  `json:"id"`
	Queue       string  `json:"queue"`
	State       string  `json:"state,omitempty"`
	Attempts    uint32  `json:"attempts"`
	MaxAttempts uint32  `json:"max_attempts,omitempty"`
	Priority    uint8   `json:"priority"`
	EnqueuedAt  string  `json:"enqueued_at"`
	VisibleAt   string  `json:"visible_at,omitempty"`
	DedupKey    string  `json:"dedup_key,omitempty"`
	LastError   string  `json:"last_error,omitempty"`
	Reason      string  `json:"reason,omitempty"`
	DeadAt      string  `json:"dead_at,omitempty"`
	Payload     []byte  `json:"payload"`
	Text        *string `json:"text,omitempty"`
}

func toItem(it *storage.Item) Item {
	j := Item{
		ID:          it.ID.String(),
		Queue:       it.Queue,
		Attempts:    it.Attempts,
		MaxAttempts: it.MaxAttempts,
		Priority:    it.Priority,
		EnqueuedAt:  fmtTime(it.EnqueuedAt),
		VisibleAt:   fmtTime(it.VisibleAt),
		DedupKey:    it.DedupKey,
		LastError:   it.LastError,
		Payload:     it.Payload,
	}
	if it.State != storage.StateUnknown {
		j.State = it.State.String()
	}
	if j.Payload == nil {
		j.Payload = []byte{}
	}
	if utf8.Valid(it.Payload) {
		text := string(it.Payload)
		j.Text = &text
	}
	return j
}

func toItems(items []storage.Item) []Item {
	out := make([]Item, len(items))
	for i := range items {
		out[i] = toItem(&items[i])
	}
	return out
}

// SettleRequest is the body of ack, nack and extend. Nack also reads
// DelayMs (absent: the queue's backoff) and Reason; extend reads LeaseMs
// (required) and takes Ids as optional.
type SettleRequest struct {
	Lease   string   `json:"lease"`
	IDs     []string `json:"ids"`
	DelayMs *int64   `json:"delay_ms,omitempty"`
	Reason  string   `json:"reason,omitempty"`
	LeaseMs int64    `json:"lease_ms,omitempty"`
}

// IDResult is one id's outcome: a per-item code name.
type IDResult struct {
	ID   string `json:"id"`
	Code string `json:"code"`
}

// SettleResponse answers ack and nack: one result per id, in order.
type SettleResponse struct {
	Results []IDResult `json:"results"`
}

// ExtendResponse answers extend: the lease's new expiry (absent when it
// was not extended), and with ids in the request one result per id, the
// lease's outcome.
type ExtendResponse struct {
	ExpiresAt string     `json:"expires_at,omitempty"`
	Results   []IDResult `json:"results,omitempty"`
}

func idResults(ids []storage.ItemID, codes []storage.Code) []IDResult {
	out := make([]IDResult, len(ids))
	for i, id := range ids {
		c := storage.CodeInvalid
		if i < len(codes) {
			c = codes[i]
		}
		out[i] = IDResult{ID: id.String(), Code: errcode.ItemCodeName(c)}
	}
	return out
}

// QueueConfig is a queue's configuration; durations in milliseconds.
type QueueConfig struct {
	MaxAttempts   uint32 `json:"max_attempts"`
	LeaseMs       int64  `json:"lease_ms"`
	DedupWindowMs int64  `json:"dedup_window_ms"`
	BackoffBaseMs int64  `json:"backoff_base_ms"`
	BackoffMaxMs  int64  `json:"backoff_max_ms"`
}

// NewQueueConfig is c in its JSON form (the CLI's --json output uses it
// too).
func NewQueueConfig(c storage.QueueConfig) QueueConfig {
	return QueueConfig{
		MaxAttempts:   c.MaxAttempts,
		LeaseMs:       c.LeaseDuration.Milliseconds(),
		DedupWindowMs: c.DedupWindow.Milliseconds(),
		BackoffBaseMs: c.BackoffBase.Milliseconds(),
		BackoffMaxMs:  c.BackoffMax.Milliseconds(),
	}
}

// ConfigUpdate is the body of PUT .../config: each field given replaces
// the queue's setting; the others keep theirs (the defaults for a queue
// this creates).
type ConfigUpdate struct {
	MaxAttempts   *int64 `json:"max_attempts,omitempty"`
	LeaseMs       *int64 `json:"lease_ms,omitempty"`
	DedupWindowMs *int64 `json:"dedup_window_ms,omitempty"`
	BackoffBaseMs *int64 `json:"backoff_base_ms,omitempty"`
	BackoffMaxMs  *int64 `json:"backoff_max_ms,omitempty"`
}

// apply returns c with u's fields replaced; a max_attempts outside
// uint32 is invalid.
func (u ConfigUpdate) apply(c storage.QueueConfig) (storage.QueueConfig, error) {
	if u.MaxAttempts != nil {
		if *u.MaxAttempts < 0 || *u.MaxAttempts > math.MaxUint32 {
			return c, fmt.Errorf("%w: max_attempts %d outside [1, %d]", storage.ErrInvalidArgument, *u.MaxAttempts, uint32(math.MaxUint32))
		}
		c.MaxAttempts = uint32(*u.MaxAttempts)
	}
	for _, f := range []struct {
		v   *int64
		dst *time.Duration
	}{
		{u.LeaseMs, &c.LeaseDuration}, {u.DedupWindowMs, &c.DedupWindow},
		{u.BackoffBaseMs, &c.BackoffBase}, {u.BackoffMaxMs, &c.BackoffMax},
	} {
		if f.v != nil {
			*f.dst = msDur(*f.v)
		}
	}
	return c, nil
}

// QueueStats is one queue's stats, as `leaseq stats --json` prints them.
type QueueStats struct {
	Queue            string      `json:"queue"`
	Ready            int64       `json:"ready"`
	Delayed          int64       `json:"delayed"`
	Inflight         int64       `json:"inflight"`
	Dead             int64       `json:"dead"`
	Leases           int64       `json:"leases"`
	OldestReadyAgeMs int64       `json:"oldest_ready_age_ms"`
	Enqueued         uint64      `json:"enqueued"`
	Duplicates       uint64      `json:"duplicates"`
	Delivered        uint64      `json:"delivered"`
	Acked            uint64      `json:"acked"`
	Nacked           uint64      `json:"nacked"`
	Expired          uint64      `json:"expired"`
	DeadLettered     uint64      `json:"dead_lettered"`
	Redriven         uint64      `json:"redriven"`
	Purged           uint64      `json:"purged"`
	CorruptErrors    uint64      `json:"corrupt_errors"`
	Config           QueueConfig `json:"config"`
}

// NewQueueStats is q in its JSON form (the CLI's `stats --json` uses it
// too).
func NewQueueStats(q *storage.QueueStats) QueueStats {
	return QueueStats{
		Queue: q.Queue, Ready: q.Ready, Delayed: q.Delayed, Inflight: q.Inflight, Dead: q.Dead, Leases: q.Leases,
		OldestReadyAgeMs: q.OldestReadyAge.Milliseconds(),
		Enqueued:         q.Enqueued, Duplicates: q.Duplicates, Delivered: q.Delivered, Acked: q.Acked, Nacked: q.Nacked,
		Expired: q.Expired, DeadLettered: q.DeadLettered, Redriven: q.Redriven, Purged: q.Purged,
		CorruptErrors: q.CorruptErrors, Config: NewQueueConfig(q.Config),
	}
}

// QueuesResponse lists every queue with its stats, by name.
type QueuesResponse struct {
	Queues []QueueStats `json:"queues"`
}

// PageResponse is one page of peek or the dead-letter list. NextAfter,
// when present, is the "after" of the next page (the page was full, or
// cut to the answer bound, DefaultMaxAnswerBytes).
type PageResponse struct {
	Items     []Item `json:"items"`
	NextAfter string `json:"next_after,omitempty"`
}

// DeleteQueueResponse answers a queue delete: the items deleted with it.
type DeleteQueueResponse struct {
	Deleted int `json:"deleted"`
}

// PurgeResponse answers a purge of live items.
type PurgeResponse struct {
	Purged int `json:"purged"`
}

// DeadRequest selects dead items for redrive or purge: the listed ids,
// or with All up to Limit (default 100) dead items in id order.
type DeadRequest struct {
	IDs   []string `json:"ids,omitempty"`
	All   bool     `json:"all,omitempty"`
	Limit int64    `json:"limit,omitempty"`
}

// DeadResponse answers a redrive or dead purge: how many items it moved
// or deleted, and with ids one result per id ("ok" or "notFound").
type DeadResponse struct {
	Count   int        `json:"count"`
	Results []IDResult `json:"results,omitempty"`
}
