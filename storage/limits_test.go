package storage

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

func TestLimits_WithDefaults(t *testing.T) {
	t.Parallel()
	if got := (Limits{}).WithDefaults(); got != DefaultLimits {
		t.Fatalf("zero limits: got %+v, want DefaultLimits", got)
	}
	got := Limits{MaxBatch: 10, MaxLease: time.Minute}.WithDefaults()
	want := DefaultLimits
	want.MaxBatch, want.MaxLease = 10, time.Minute
	if got != want {
		t.Fatalf("partial limits: got %+v, want %+v", got, want)
	}
}

func TestLimits_ValidateItem(t *testing.T) {
	t.Parallel()
	l := Limits{MaxPayload: 4, MaxDedupKey: 2, MaxDelay: time.Second}
	cases := []struct {
		it   EnqueueItem
		want string
	}{
		{EnqueueItem{Payload: []byte("1234")}, ""},
		{EnqueueItem{Payload: []byte("12345")}, "payload of 5 bytes exceeds the limit of 4"},
		{EnqueueItem{Delay: 2 * time.Second}, "delay 2s outside [0, 1s]"},
		{EnqueueItem{Delay: -1}, "delay -1ns outside [0, 1s]"},
		{EnqueueItem{DedupKey: "abc"}, "dedup key of 3 bytes exceeds the limit of 2"},
		// Several faults: the first in the documented order is named.
		{EnqueueItem{Payload: []byte("12345"), DedupKey: "abc"}, "payload of 5 bytes exceeds the limit of 4"},
	}
	for _, c := range cases {
		err := l.ValidateItem(c.it)
		if c.want == "" {
			if err != nil {
				t.Fatalf("%+v: unexpected %v", c.it, err)
			}
			continue
		}
		var ie *ItemError
		if !errors.As(err, &ie) || ie.Detail != c.want || !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("%+v: got %v, want ItemError %q wrapping ErrInvalidArgument", c.it, err, c.want)
		}
	}
	// Zero limits mean the defaults.
	if err := (Limits{}).ValidateItem(EnqueueItem{Payload: make([]byte, DefaultLimits.MaxPayload)}); err != nil {
		t.Fatal(err)
	}
}

func TestLeaseCode(t *testing.T) {
	t.Parallel()
	want := map[Presence][2]Code{ // [not live, live]
		Absent:      {CodeNotFound, CodeNotFound},
		HeldByLease: {CodeLeaseExpired, CodeOK},
		HeldByOther: {CodeLeaseMismatch, CodeLeaseMismatch},
		NotInflight: {CodeLeaseExpired, CodeLeaseMismatch},
	}
	for p, w := range want {
		if got := LeaseCode(p, false); got != w[0] {
			t.Errorf("presence %d, not live: got %v, want %v", p, got, w[0])
		}
		if got := LeaseCode(p, true); got != w[1] {
			t.Errorf("presence %d, live: got %v, want %v", p, got, w[1])
		}
	}
}

func TestExtendCode(t *testing.T) {
	t.Parallel()
	other := errors.New("disk on fire")
	for _, c := range []struct {
		err     error
		code    Code
		failure error
	}{
		{nil, CodeOK, nil},
		{fmt.Errorf("x: %w", ErrLeaseExpired), CodeLeaseExpired, nil},
		{fmt.Errorf("x: %w", ErrLeaseMismatch), CodeLeaseMismatch, nil},
		{ErrNotFound, 0, ErrNotFound},
		{other, 0, other},
	} {
		code, err := ExtendCode(c.err)
		if code != c.code || !errors.Is(err, c.failure) || (c.failure == nil) != (err == nil) {
			t.Errorf("ExtendCode(%v) = %v, %v; want %v, %v", c.err, code, err, c.code, c.failure)
		}
	}
}

// A new queue's config is brought within the store's limits: the default
// lease into [MinLease, MaxLease], the dedup window and backoff under
// MaxDelay.
func TestLimits_DefaultQueueConfig(t *testing.T) {
	t.Parallel()
	if got := DefaultLimits.DefaultQueueConfig(); got != DefaultQueueConfig() {
		t.Errorf("default limits: %+v, want %+v", got, DefaultQueueConfig())
	}
	l := Limits{MinLease: time.Minute, MaxLease: time.Hour, MaxDelay: 200 * time.Millisecond}
	c := l.DefaultQueueConfig()
	want := DefaultQueueConfig()
	want.LeaseDuration, want.DedupWindow, want.BackoffBase, want.BackoffMax = time.Minute, 200*time.Millisecond, 200*time.Millisecond, 200*time.Millisecond
	if c != want {
		t.Errorf("narrow limits: %+v, want %+v", c, want)
	}
	if err := l.WithDefaults().ValidateQueueConfig(c); err != nil {
		t.Errorf("the config is refused: %v", err)
	}
}
