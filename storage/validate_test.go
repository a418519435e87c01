package storage

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestParams_Validate: every Params struct's Validate, at and beyond each
// bound. want is "" for valid, else a fragment of the error, which must
// wrap ErrInvalidArgument.
func TestParams_Validate(t *testing.T) {
	t.Parallel()
	l := Limits{MaxBatch: 3, MinLease: time.Second, MaxLease: time.Minute, MaxDelay: time.Hour}.WithDefaults()
	ids := func(n int) []ItemID { return make([]ItemID, n) }
	dur := func(d time.Duration) *time.Duration { return &d }
	long := strings.Repeat("q", 201)
	cases := []struct {
		name string
		p    interface{ Validate(Limits) error }
		want string
	}{
		{"enqueue ok", EnqueueParams{Queue: "q", Items: make([]EnqueueItem, 3)}, ""},
		{"enqueue empty", EnqueueParams{Queue: "q"}, ""},
		{"enqueue batch", EnqueueParams{Queue: "q", Items: make([]EnqueueItem, 4)}, "batch of 4"},
		{"enqueue name", EnqueueParams{Queue: ""}, "queue name"},
		{"poll ok", PollParams{Queue: "q", Max: 3, Lease: time.Second}, ""},
		{"poll default lease", PollParams{Queue: "q", Max: 1}, ""},
		{"poll max 0", PollParams{Queue: "q", Max: 0}, "max must be 1-3, got 0"},
		{"poll max 4", PollParams{Queue: "q", Max: 4}, "max must be 1-3, got 4"},
		{"poll lease short", PollParams{Queue: "q", Max: 1, Lease: time.Millisecond}, "lease"},
		{"poll lease long", PollParams{Queue: "q", Max: 1, Lease: time.Hour}, "lease"},
		{"poll name", PollParams{Queue: long, Max: 1}, "queue name"},
		{"ack ok", AckParams{Queue: "q", IDs: ids(3)}, ""},
		{"ack batch", AckParams{Queue: "q", IDs: ids(4)}, "batch of 4"},
		{"ack name", AckParams{Queue: "a/../b\x00", IDs: ids(1)}, "queue name"},
		{"nack ok", NackParams{Queue: "q", IDs: ids(1), Delay: dur(time.Hour)}, ""},
		{"nack backoff", NackParams{Queue: "q", IDs: ids(1)}, ""},
		{"nack delay", NackParams{Queue: "q", IDs: ids(1), Delay: dur(time.Hour + 1)}, "delay"},
		{"nack negative delay", NackParams{Queue: "q", IDs: ids(1), Delay: dur(-1)}, "delay"},
		{"nack batch", NackParams{Queue: "q", IDs: ids(4)}, "batch of 4"},
		{"extend ok", ExtendParams{Queue: "q", Duration: time.Minute}, ""},
		{"extend long", ExtendParams{Queue: "q", Duration: time.Minute + 1}, "lease"},
		{"stats all", StatsParams{}, ""},
		{"stats one", StatsParams{Queue: "q"}, ""},
		{"stats name", StatsParams{Queue: long}, "queue name"},
		{"peek ok", PeekParams{Queue: "q", Limit: 3}, ""},
		{"peek limit 0", PeekParams{Queue: "q"}, "limit must be 1-3, got 0"},
		{"peek limit 4", PeekParams{Queue: "q", Limit: 4}, "limit must be 1-3, got 4"},
		{"dead list ok", DeadListParams{Queue: "q", Limit: 1}, ""},
		{"dead list limit", DeadListParams{Queue: "q", Limit: 4}, "got 4"},
		{"purge ok", PurgeParams{Queue: "q"}, ""},
		{"purge name", PurgeParams{Queue: ".."}, "queue name"},
		{"delete ok", DeleteQueueParams{Queue: "q"}, ""},
		{"delete name", DeleteQueueParams{Queue: "."}, "queue name"},
		{"redrive ids", RedriveParams{Queue: "q", IDs: ids(3)}, ""},
		{"redrive ids ignore limit", RedriveParams{Queue: "q", IDs: ids(1), Limit: 99}, ""},
		{"redrive ids batch", RedriveParams{Queue: "q", IDs: ids(4)}, "batch of 4"},
		{"redrive limit", RedriveParams{Queue: "q", Limit: 3}, ""},
		{"redrive empty ids use limit", RedriveParams{Queue: "q", IDs: ids(0), Limit: 0}, "got 0"},
		{"redrive limit 4", RedriveParams{Queue: "q", Limit: 4}, "got 4"},
	}
	for _, c := range cases {
		err := c.p.Validate(l)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: unexpected error %v", c.name, err)
		case c.want != "" && err == nil:
			t.Errorf("%s: no error, want %q", c.name, c.want)
		case c.want != "" && (!errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: error %v, want ErrInvalidArgument with %q", c.name, err, c.want)
		}
	}
}
