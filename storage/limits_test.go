package storage

import (
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
