// Conformance cases for request limits and validation, and RunMaxQueues.

package storagetest

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

func testQueueConfigDefaultsAndValidation(t *testing.T, f *fixture) {
	_, err := f.s.QueueConfig(f.ctx, "q")
	requireIs(t, err, storage.ErrNotFound, "no such queue yet")
	_, err = f.s.Stats(f.ctx, storage.StatsParams{Queue: "q", Now: at(0)})
	requireIs(t, err, storage.ErrNotFound)
	f.enqueueN("q", at(0), 1)
	cfg, err := f.s.QueueConfig(f.ctx, "q")
	require.NoError(t, err)
	require.Equal(t, f.h.limits().DefaultQueueConfig(), cfg, "created on first enqueue with the defaults")

	good := storage.QueueConfig{MaxAttempts: 9, LeaseDuration: time.Minute, DedupWindow: time.Hour, BackoffBase: time.Second, BackoffMax: time.Minute}
	lim := f.h.limits()
	for name, mut := range map[string]func(*storage.QueueConfig){
		"zero max attempts":    func(c *storage.QueueConfig) { c.MaxAttempts = 0 },
		"lease below minimum":  func(c *storage.QueueConfig) { c.LeaseDuration = lim.MinLease - 1 },
		"lease above maximum":  func(c *storage.QueueConfig) { c.LeaseDuration = lim.MaxLease + 1 },
		"zero lease":           func(c *storage.QueueConfig) { c.LeaseDuration = 0 },
		"negative dedup":       func(c *storage.QueueConfig) { c.DedupWindow = -1 },
		"dedup above maximum":  func(c *storage.QueueConfig) { c.DedupWindow = lim.MaxDelay + 1 },
		"negative backoff":     func(c *storage.QueueConfig) { c.BackoffBase = -1 },
		"base above max":       func(c *storage.QueueConfig) { c.BackoffBase, c.BackoffMax = time.Minute, time.Second },
		"backoff max too long": func(c *storage.QueueConfig) { c.BackoffMax = lim.MaxDelay + 1 },
	} {
		bad := good
		mut(&bad)
		requireIs(t, f.s.SetQueueConfig(f.ctx, "q", bad), storage.ErrInvalidArgument, name)
		requireIs(t, f.s.SetQueueConfig(f.ctx, "fresh", bad), storage.ErrInvalidArgument, name)
	}
	cfg, err = f.s.QueueConfig(f.ctx, "q")
	require.NoError(t, err)
	require.Equal(t, f.h.limits().DefaultQueueConfig(), cfg, "rejected configs changed nothing")
	_, err = f.s.QueueConfig(f.ctx, "fresh")
	requireIs(t, err, storage.ErrNotFound, "a rejected config does not create the queue")

	f.setConfig("q", good)
	cfg, err = f.s.QueueConfig(f.ctx, "q")
	require.NoError(t, err)
	require.Equal(t, good, cfg)
	require.Equal(t, good, f.stats("q", at(0)).Config)
	p := f.poll("q", 1, 0, at(0))
	requireTime(t, at(time.Minute), p.ExpiresAt, "the new default lease applies")
}

func testBadQueueNames(t *testing.T, f *fixture) {
	f.enqueueN("q", at(0), 1)
	p := f.poll("q", 1, time.Minute, at(0))
	lim := f.h.limits()
	ok := string(bytes.Repeat([]byte("n"), lim.MaxQueueName))
	f.enqueueN(ok, at(0), 1) // the longest name is fine
	for _, name := range []string{"", ok + "n", "a/b", "a b", "ä", "q\x00", "q:1"} {
		_, err := f.s.Enqueue(f.ctx, storage.EnqueueParams{Queue: name, Items: []storage.EnqueueItem{{Payload: []byte("x")}}, Now: at(0)})
		requireIs(t, err, storage.ErrInvalidArgument, "enqueue %q", name)
		_, err = f.s.Poll(f.ctx, storage.PollParams{Queue: name, Max: 1, Now: at(0)})
		requireIs(t, err, storage.ErrInvalidArgument, "poll %q", name)
		_, err = f.s.Ack(f.ctx, storage.AckParams{Queue: name, Lease: p.Lease, IDs: ids(p.Items), Now: at(0)})
		requireIs(t, err, storage.ErrInvalidArgument, "ack %q", name)
		_, err = f.s.Nack(f.ctx, storage.NackParams{Queue: name, Lease: p.Lease, IDs: ids(p.Items), Now: at(0)})
		requireIs(t, err, storage.ErrInvalidArgument, "nack %q", name)
		_, err = f.s.ExtendLease(f.ctx, storage.ExtendParams{Queue: name, Lease: p.Lease, Duration: time.Minute, Now: at(0)})
		requireIs(t, err, storage.ErrInvalidArgument, "extend %q", name)
		if name != "" { // "" means all queues
			_, err = f.s.Stats(f.ctx, storage.StatsParams{Queue: name, Now: at(0)})
			requireIs(t, err, storage.ErrInvalidArgument, "stats %q", name)
		}
		_, err = f.s.Peek(f.ctx, storage.PeekParams{Queue: name, Limit: 1, Now: at(0)})
		requireIs(t, err, storage.ErrInvalidArgument, "peek %q", name)
		_, err = f.s.Purge(f.ctx, storage.PurgeParams{Queue: name, Now: at(0)})
		requireIs(t, err, storage.ErrInvalidArgument, "purge %q", name)
		_, err = f.s.DeadList(f.ctx, storage.DeadListParams{Queue: name, Limit: 1})
		requireIs(t, err, storage.ErrInvalidArgument, "dead list %q", name)
		_, err = f.s.Redrive(f.ctx, storage.RedriveParams{Queue: name, Limit: 1, Now: at(0)})
		requireIs(t, err, storage.ErrInvalidArgument, "redrive %q", name)
		_, err = f.s.PurgeDead(f.ctx, storage.RedriveParams{Queue: name, Limit: 1, Now: at(0)})
		requireIs(t, err, storage.ErrInvalidArgument, "purge dead %q", name)
		_, err = f.s.QueueConfig(f.ctx, name)
		requireIs(t, err, storage.ErrInvalidArgument, "queue config %q", name)
		requireIs(t, f.s.SetQueueConfig(f.ctx, name, storage.DefaultQueueConfig()), storage.ErrInvalidArgument, "set queue config %q", name)
	}
	qs, err := f.s.Queues(f.ctx)
	require.NoError(t, err)
	require.Equal(t, []string{ok, "q"}, qs)
	require.Equal(t, counts{Inflight: 1, Leases: 1}, gauges(f.stats("q", at(0))))
}

func testBatchAndRangeLimits(t *testing.T, f *fixture) {
	lim := f.h.limits()
	f.enqueueN("q", at(0), 1)
	_, err := f.s.Enqueue(f.ctx, storage.EnqueueParams{Queue: "q", Items: make([]storage.EnqueueItem, lim.MaxBatch+1), Now: at(0)})
	requireIs(t, err, storage.ErrInvalidArgument, "enqueue batch too large")
	for _, max := range []int{0, -1, lim.MaxBatch + 1} {
		_, err = f.s.Poll(f.ctx, storage.PollParams{Queue: "q", Max: max, Now: at(0)})
		requireIs(t, err, storage.ErrInvalidArgument, "poll max %d", max)
	}
	for _, lease := range []time.Duration{lim.MinLease - 1, lim.MaxLease + 1, -time.Second} {
		_, err = f.s.Poll(f.ctx, storage.PollParams{Queue: "q", Max: 1, Lease: lease, Now: at(0)})
		requireIs(t, err, storage.ErrInvalidArgument, "poll lease %v", lease)
	}
	require.Equal(t, counts{Ready: 1}, gauges(f.stats("q", at(0))), "rejected calls changed nothing")
	p := f.poll("q", 1, lim.MinLease, at(0))
	requireTime(t, at(lim.MinLease), p.ExpiresAt, "the minimum lease is allowed")
	tooMany := make([]storage.ItemID, lim.MaxBatch+1)
	_, err = f.s.Ack(f.ctx, storage.AckParams{Queue: "q", Lease: p.Lease, IDs: tooMany, Now: at(0)})
	requireIs(t, err, storage.ErrInvalidArgument, "ack batch too large")
	_, err = f.s.Nack(f.ctx, storage.NackParams{Queue: "q", Lease: p.Lease, IDs: tooMany, Now: at(0)})
	requireIs(t, err, storage.ErrInvalidArgument, "nack batch too large")
	_, err = f.s.Redrive(f.ctx, storage.RedriveParams{Queue: "q", IDs: tooMany, Now: at(0)})
	requireIs(t, err, storage.ErrInvalidArgument, "redrive batch too large")
	for _, limit := range []int{0, lim.MaxBatch + 1} {
		_, err = f.s.Peek(f.ctx, storage.PeekParams{Queue: "q", Limit: limit, Now: at(0)})
		requireIs(t, err, storage.ErrInvalidArgument, "peek limit %d", limit)
		_, err = f.s.DeadList(f.ctx, storage.DeadListParams{Queue: "q", Limit: limit})
		requireIs(t, err, storage.ErrInvalidArgument, "dead list limit %d", limit)
		_, err = f.s.Redrive(f.ctx, storage.RedriveParams{Queue: "q", Limit: limit, Now: at(0)})
		requireIs(t, err, storage.ErrInvalidArgument, "redrive limit %d", limit)
		_, err = f.s.PurgeDead(f.ctx, storage.RedriveParams{Queue: "q", Limit: limit, Now: at(0)})
		requireIs(t, err, storage.ErrInvalidArgument, "purge dead limit %d", limit)
	}
	require.Equal(t, codes(storage.CodeOK), f.ack("q", p.Lease, at(0), ids(p.Items)...))
	f.enqueueN("q", at(0), 1)
	p = f.poll("q", 1, lim.MaxLease, at(0))
	requireTime(t, at(lim.MaxLease), p.ExpiresAt, "the maximum lease is allowed")
}

func testPerItemLimits(t *testing.T, f *fixture) {
	lim := f.h.limits()
	res := f.enqueue("q", at(0),
		storage.EnqueueItem{Payload: make([]byte, lim.MaxPayload+1)},
		storage.EnqueueItem{Payload: make([]byte, lim.MaxPayload)},
		storage.EnqueueItem{Payload: []byte("late"), Delay: lim.MaxDelay + 1},
		storage.EnqueueItem{Payload: []byte("longest"), Delay: lim.MaxDelay},
		storage.EnqueueItem{Payload: []byte("past"), Delay: -time.Nanosecond},
		storage.EnqueueItem{Payload: []byte("key"), DedupKey: string(make([]byte, lim.MaxDedupKey+1))},
		storage.EnqueueItem{Payload: []byte{}},
	)
	want := []storage.Code{storage.CodeInvalid, storage.CodeOK, storage.CodeInvalid, storage.CodeOK, storage.CodeInvalid, storage.CodeInvalid, storage.CodeOK}
	for i, r := range res {
		require.Equal(t, want[i], r.Code, "item %d", i)
		if r.Code == storage.CodeInvalid {
			require.NotEmpty(t, r.Err, "item %d says why", i)
			require.True(t, r.ID.IsZero(), "item %d has no id", i)
		} else {
			require.Empty(t, r.Err)
		}
	}
	st := f.stats("q", at(0))
	require.Equal(t, counts{Ready: 2, Delayed: 1}, gauges(st), "the valid items were written")
	require.Equal(t, uint64(3), st.Enqueued)
	p := f.poll("q", 10, time.Minute, at(0))
	require.Len(t, p.Items, 2)
	require.Len(t, p.Items[0].Payload, lim.MaxPayload)
	require.Empty(t, p.Items[1].Payload)
}

func testReasonIsTruncated(t *testing.T, f *fixture) {
	lim := f.h.limits()
	id := f.enqueueN("q", at(0), 1)[0]
	p := f.poll("q", 1, time.Minute, at(0))
	long := string(bytes.Repeat([]byte("r"), lim.MaxReason+10))
	require.Equal(t, codes(storage.CodeOK), f.nack("q", p.Lease, durp(0), long, at(0), id))
	peek := f.peek("q", false, storage.ItemID{}, 1, at(0))
	require.Equal(t, long[:lim.MaxReason], peek[0].LastError)

	// Multi-byte text is cut on a rune boundary: the reason stays valid
	// UTF-8 (a 3-byte rune straddles the limit here).
	p = f.poll("q", 1, time.Minute, at(0))
	require.Len(t, p.Items, 1)
	multi := strings.Repeat("é", lim.MaxReason/2-1) + "€€"
	require.Equal(t, codes(storage.CodeOK), f.nack("q", p.Lease, durp(0), multi, at(0), id))
	peek = f.peek("q", false, storage.ItemID{}, 1, at(0))
	got := peek[0].LastError
	require.True(t, utf8.ValidString(got), "reason %q is not valid UTF-8", got[len(got)-4:])
	require.LessOrEqual(t, len(got), lim.MaxReason)
	require.Equal(t, multi[:lim.MaxReason-2], got, "cut before the rune that does not fit")
}

// RunPartialLimits checks that a store given Limits with only some fields
// set takes storage.DefaultLimits for the others, field by field: opened
// with {MaxBatch: 10}, payloads up to the default MaxPayload are accepted,
// a batch of 11 is refused, and a long nack reason is cut at the default
// MaxReason (not at 0).
func RunPartialLimits(t *testing.T, open func(t *testing.T, lim storage.Limits) storage.Store) {
	t.Helper()
	s := open(t, storage.Limits{MaxBatch: 10})
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	def := storage.DefaultLimits
	res, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: bytes.Repeat([]byte("p"), def.MaxPayload)}}, Now: now})
	require.NoError(t, err)
	require.Equal(t, storage.CodeOK, res[0].Code, "a payload of the default MaxPayload: %s", res[0].Err)
	_, err = s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: make([]storage.EnqueueItem, 11), Now: now})
	require.ErrorIs(t, err, storage.ErrInvalidArgument, "MaxBatch 10 applies")
	p, err := s.Poll(ctx, storage.PollParams{Queue: "q", Max: 1, Lease: time.Minute, Now: now})
	require.NoError(t, err)
	require.Len(t, p.Items, 1)
	zero := time.Duration(0)
	reason := strings.Repeat("r", def.MaxReason+10)
	codes, err := s.Nack(ctx, storage.NackParams{Queue: "q", Lease: p.Lease, IDs: []storage.ItemID{p.Items[0].ID}, Delay: &zero, Reason: reason, Now: now})
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK}, codes)
	items, err := s.Peek(ctx, storage.PeekParams{Queue: "q", Limit: 1, Now: now})
	require.NoError(t, err)
	require.Equal(t, reason[:def.MaxReason], items[0].LastError, "the reason is cut at the default MaxReason")
}

// RunMaxQueues checks Limits.MaxQueues on a store opened with limits
// {MaxQueues: 2}: a third queue is refused (ErrInvalidArgument) by both
// Enqueue and SetQueueConfig, and the existing queues keep working.
func RunMaxQueues(t *testing.T, open func(t *testing.T, lim storage.Limits) storage.Store) {
	t.Helper()
	s := open(t, storage.Limits{MaxQueues: 2})
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	item := []storage.EnqueueItem{{Payload: []byte("x")}}
	for i := range 2 {
		_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: fmt.Sprintf("q%d", i), Items: item, Now: now})
		require.NoError(t, err)
	}
	_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q2", Items: item, Now: now})
	require.ErrorIs(t, err, storage.ErrInvalidArgument)
	require.ErrorContains(t, err, "--max-queues")
	err = s.SetQueueConfig(ctx, "q3", storage.DefaultQueueConfig())
	require.ErrorIs(t, err, storage.ErrInvalidArgument)
	names, err := s.Queues(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"q0", "q1"}, names)
	// Existing queues are not affected.
	_, err = s.Enqueue(ctx, storage.EnqueueParams{Queue: "q1", Items: item, Now: now})
	require.NoError(t, err)
	require.NoError(t, s.SetQueueConfig(ctx, "q0", storage.DefaultQueueConfig()))
	deleteFreesQueueSlot(t, ctx, s, now)
}

// RunNewQueueWithinLimits checks that a queue created by its first
// enqueue on a store with limits narrower than its defaults gets a config
// within them: opened with a 10 s MaxLease and a 1 min MaxDelay, the new
// queue's lease is 10 s and its dedup window 1 min, so a poll that asks
// for the queue's lease is leased for 10 s, and the config is one
// SetQueueConfig accepts.
func RunNewQueueWithinLimits(t *testing.T, open func(t *testing.T, lim storage.Limits) storage.Store) {
	t.Helper()
	lim := storage.Limits{MaxLease: 10 * time.Second, MaxDelay: time.Minute}
	s := open(t, lim)
	ctx := context.Background()
	now := time.Unix(1_700_000_000, 0)
	_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("p")}}, Now: now})
	require.NoError(t, err)
	cfg, err := s.QueueConfig(ctx, "q")
	require.NoError(t, err)
	want := storage.DefaultQueueConfig()
	want.LeaseDuration, want.DedupWindow = 10*time.Second, time.Minute
	require.Equal(t, want, cfg)
	require.NoError(t, lim.WithDefaults().ValidateQueueConfig(cfg))
	require.NoError(t, s.SetQueueConfig(ctx, "q", cfg))
	p, err := s.Poll(ctx, storage.PollParams{Queue: "q", Max: 1, Now: now})
	require.NoError(t, err)
	require.Len(t, p.Items, 1)
	require.Equal(t, now.Add(10*time.Second).UnixNano(), p.ExpiresAt.UnixNano(), "the queue's lease, within MaxLease")
}
