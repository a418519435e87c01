package storage

import (
	"testing"
	"time"
)

// Backoff is random(0, min(base*2^attempts, max)) (DESIGN.md), with r the
// random draw in [0, 1).
func TestBackoff(t *testing.T) {
	t.Parallel()
	c := QueueConfig{MaxAttempts: 5, LeaseDuration: time.Second, BackoffBase: time.Second, BackoffMax: 30 * time.Second}
	for _, tc := range []struct {
		attempts uint32
		r        float64
		want     time.Duration
	}{
		{0, 0.5, 500 * time.Millisecond},
		{3, 0.5, 4 * time.Second},
		{5, 0.5, 15 * time.Second}, // 32 s, capped at 30
		{70, 0.5, 15 * time.Second},
		{3, 0, 0},
	} {
		if got := Backoff(c, tc.attempts, tc.r); got != tc.want {
			t.Errorf("Backoff(base 1s, max 30s, attempts %d, r %v) = %v, want %v", tc.attempts, tc.r, got, tc.want)
		}
	}
}

// A queue whose backoff base is 0 (ValidateQueueConfig takes
// 0 <= base <= max) retries a nacked item at once, whatever its max.
func TestBackoff_ZeroBaseRetriesAtOnce(t *testing.T) {
	t.Parallel()
	c := QueueConfig{MaxAttempts: 5, LeaseDuration: time.Second, BackoffBase: 0, BackoffMax: 30 * time.Second}
	if err := DefaultLimits.ValidateQueueConfig(c); err != nil {
		t.Fatalf("the config is refused: %v", err)
	}
	for _, attempts := range []uint32{1, 2, 5, 70} {
		if got := Backoff(c, attempts, 0.5); got != 0 {
			t.Errorf("Backoff(base 0, max 30s, attempts %d, r 0.5) = %v, want 0", attempts, got)
		}
	}
}
