// Package steadyclock is the node's clock: the system's wall clock, except
// that it never steps back.
//
// Every instant the node writes (visible_at, lease expiries, dedup
// windows) comes from its clock, and an item is ready when its visible_at
// is at or before now. A wall clock stepped back (an NTP correction of a
// clock that ran ahead, a device whose clock was set by hand) would hide
// every ready item enqueued within the step until the wall caught up
// again, serve items enqueued after the step first, and hold leases that
// long past what their consumers were told (found by review, session 70).
// So the node reads its time through Clock: while the wall reads later
// than the last instant given, Clock gives the wall's reading (a forward
// step is taken at once); when it reads earlier, Clock goes on from the
// last instant given by the monotonic time elapsed since (a Go wall-clock reading
// carries a monotonic reading beside the wall's, which no step moves),
// until the wall passes it again. A wall clock slewed by NTP (slowed or
// sped up a little) is followed as it is.
//
// A restart with a clock behind the data is the other case (a device with
// no battery-backed clock boots at an old time): AtLeast raises the clock
// to an instant the store read from its data (rocksstore.Store.Latest) before
// the node serves.
//
// The instants given are kept within [Earliest, Latest]: the store's
// arithmetic (unix nanoseconds, an instant plus a lease or a delay) holds
// there, and a wall clock outside it is broken, not a date to work at.
//
// While the wall clock goes forward, Now gives its reading as it is, with
// Go's monotonic reading, so the time between two instants (a call's
// latency in the node's metrics) is the time that passed, not a step of
// the wall clock between them.
//
// Timers, tickers and sleeps are durations and go to the underlying clock.
package steadyclock

import (
	"context"
	"sync"
	"time"

	"github.com/benbjohnson/clock"
)

// The range of instants Now gives: a wall clock reading outside it reads
// as its nearer end.
var (
	Earliest = time.Unix(0, 0).UTC()                       // 1970-01-01
	Latest   = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC) // far from int64 nanoseconds' end (2262)
)

// Clock is a clock.Clock whose Now never goes back.
type Clock struct {
	clock.Clock // the wall clock; timers, tickers and sleeps
	start       time.Time
	// elapsed is the monotonic time from start to wall: wall.Sub(start),
	// which Go takes from the monotonic readings of the real clock's
	// times (a mock clock's have none: its wall time). Tests replace it.
	elapsed func(wall time.Time) time.Duration

	mu       sync.Mutex
	last     int64         // the last instant given, unix ns (0: none yet)
	lastMono time.Duration // elapsed when last was given
}

// New returns a steady clock over the wall clock inner.
func New(inner clock.Clock) *Clock {
	c := &Clock{Clock: inner, start: inner.Now()}
	c.elapsed = func(wall time.Time) time.Duration { return wall.Sub(c.start) }
	return c
}

// Now returns the wall clock's time or, when the wall reads earlier than
// the last instant given, that instant plus the monotonic time since.
func (c *Clock) Now() time.Time {
	wall := c.Clock.Now()
	mono := c.elapsed(wall)
	var n int64
	switch {
	case wall.Before(Earliest):
		n = Earliest.UnixNano()
	case wall.After(Latest):
		n = Latest.UnixNano()
	default:
		n = wall.UnixNano()
	}
	c.mu.Lock()
	if n <= c.last {
		n = c.last + max(0, int64(mono-c.lastMono)) // the wall stepped back
	}
	c.last, c.lastMono = n, mono
	c.mu.Unlock()
	if n == wall.UnixNano() {
		// The wall's own reading, with its monotonic one: durations
		// between two such instants (a call's latency) are the time
		// that passed, not a wall clock's step forward between them.
		return wall
	}
	return time.Unix(0, n).In(wall.Location())
}

// AtLeast makes t the earliest instant Now gives from here on: while the
// wall reads earlier, the time goes on from t by the monotonic time
// elapsed since.
func (c *Clock) AtLeast(t time.Time) {
	if t.IsZero() {
		return
	}
	mono := c.elapsed(c.Clock.Now())
	c.mu.Lock()
	defer c.mu.Unlock()
	if n := t.UnixNano(); n > c.last {
		c.last, c.lastMono = n, mono
	}
}

// Since returns the time elapsed since t on this clock.
func (c *Clock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }

// Until returns the time until t on this clock.
func (c *Clock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

// WithDeadline returns a context that ends at instant d of this clock
// (a timeout from now on the underlying clock).
func (c *Clock) WithDeadline(parent context.Context, d time.Time) (context.Context, context.CancelFunc) {
	return c.Clock.WithTimeout(parent, c.Until(d))
}
