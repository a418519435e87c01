package steadyclock

import (
	"context"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
)

var start = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

// rig is a steady clock over a mock wall clock and a monotonic clock the
// test moves on its own (a mock clock's times carry no monotonic
// reading): the wall can be stepped without the monotonic clock.
type rig struct {
	wall *clock.Mock
	mono time.Duration
	c    *Clock
}

func newRig() *rig {
	r := &rig{wall: clock.NewMock()}
	r.wall.Set(start)
	r.c = New(r.wall)
	r.c.elapsed = func(time.Time) time.Duration { return r.mono }
	return r
}

// pass moves both clocks by d, as time passing does.
func (r *rig) pass(d time.Duration) {
	r.wall.Add(d)
	r.mono += d
}

func TestNow_FollowsTheWall(t *testing.T) {
	r := newRig()
	require.True(t, r.c.Now().Equal(start))
	r.pass(1500 * time.Millisecond)
	require.True(t, r.c.Now().Equal(start.Add(1500*time.Millisecond)))
	require.Equal(t, time.UTC, r.c.Now().Location())
}

func TestNow_TakesAForwardStepAtOnce(t *testing.T) {
	r := newRig()
	r.c.Now()
	r.wall.Add(time.Hour) // an NTP step forward
	require.True(t, r.c.Now().Equal(start.Add(time.Hour)))
}

// A step back: the clock goes on from where it was by the monotonic
// time, never giving an instant earlier than one it gave, and follows the
// wall again once the wall passes it.
func TestNow_NeverStepsBack(t *testing.T) {
	r := newRig()
	r.pass(10 * time.Second)
	before := r.c.Now()
	r.wall.Add(-time.Hour) // the step back
	require.True(t, r.c.Now().Equal(before), "the same instant as before the step")
	r.pass(3 * time.Second)
	require.True(t, r.c.Now().Equal(before.Add(3*time.Second)), "3 s passed: 3 s later than before the step")
	r.pass(time.Minute)
	require.True(t, r.c.Now().Equal(before.Add(63*time.Second)))
	// A forward step that leaves the wall behind the steady time: the
	// steady time goes on by the monotonic clock alone.
	r.wall.Add(10 * time.Minute)
	require.True(t, r.c.Now().Equal(before.Add(63*time.Second)))
	// The wall is corrected forward past the steady time: followed again.
	r.wall.Add(2 * time.Hour)
	require.True(t, r.c.Now().Equal(r.wall.Now()))
	r.pass(time.Second)
	require.True(t, r.c.Now().Equal(r.wall.Now()))
}

// A wall clock that stands still (or repeats a reading) gives instants
// that still move with the monotonic clock.
func TestNow_WallStandingStill(t *testing.T) {
	r := newRig()
	a := r.c.Now()
	r.mono += time.Millisecond
	b := r.c.Now()
	require.Equal(t, time.Millisecond, b.Sub(a))
}

// Over the real clock, whose times carry monotonic readings, the elapsed
// time is the monotonic clock's.
func TestNew_RealClockElapsedIsMonotonic(t *testing.T) {
	c := New(clock.New())
	a := c.Now()
	require.False(t, c.Now().Before(a))
	require.GreaterOrEqual(t, c.elapsed(time.Now()), time.Duration(0))
}

// Small steps back, again and again (a wall clock read on several CPUs
// that disagree by microseconds): never an earlier instant.
func TestNow_SmallStepsBack(t *testing.T) {
	r := newRig()
	prev := r.c.Now()
	for i := 0; i < 100; i++ {
		if i%3 == 0 {
			r.wall.Add(-time.Microsecond)
		} else {
			r.pass(2 * time.Microsecond)
		}
		n := r.c.Now()
		require.False(t, n.Before(prev), "step %d: %v before %v", i, n, prev)
		prev = n
	}
}

func TestAtLeast_RaisesTheClockToTheData(t *testing.T) {
	r := newRig()
	data := start.Add(24 * time.Hour) // the store's data is a day ahead of this boot's clock
	r.c.AtLeast(data)
	require.True(t, r.c.Now().Equal(data))
	r.pass(5 * time.Second)
	require.True(t, r.c.Now().Equal(data.Add(5*time.Second)))
	// An earlier instant or none changes nothing.
	r.c.AtLeast(start)
	r.c.AtLeast(time.Time{})
	require.True(t, r.c.Now().Equal(data.Add(5*time.Second)))
	// NTP sets the wall right: followed from there.
	r.wall.Add(48 * time.Hour)
	require.True(t, r.c.Now().Equal(r.wall.Now()))
}

func TestSinceUntilDeadline_OnTheSteadyTime(t *testing.T) {
	r := newRig()
	r.pass(10 * time.Second)
	t0 := r.c.Now()
	r.wall.Add(-time.Hour)
	r.pass(2 * time.Second)
	require.Equal(t, 2*time.Second, r.c.Since(t0))
	require.Equal(t, 3*time.Second, r.c.Until(t0.Add(5*time.Second)))
	ctx, cancel := r.c.WithDeadline(context.Background(), t0.Add(5*time.Second))
	defer cancel()
	r.wall.Add(2 * time.Second)
	require.NoError(t, ctx.Err(), "the deadline is 3 s of the underlying clock away")
	r.wall.Add(time.Second)
	<-ctx.Done()
	require.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
}

// A wall clock outside [Earliest, Latest] reads as the nearer end (found
// by review, session 70: before 1970 a lease's expiry is negative, which
// the store's "no promise" zero outranked; near 2262 an instant plus a
// lease overflows int64 nanoseconds).
func TestNow_KeptWithinItsRange(t *testing.T) {
	r := newRig()
	r.wall.Set(time.Date(1969, 12, 31, 23, 0, 0, 0, time.UTC))
	require.True(t, r.c.Now().Equal(Earliest), "before 1970: the epoch")
	r2 := newRig()
	r2.wall.Set(time.Date(2262, 4, 11, 0, 0, 0, 0, time.UTC))
	require.True(t, r2.c.Now().Equal(Latest))
	r2.mono += time.Second
	require.True(t, r2.c.Now().Equal(Latest.Add(time.Second)), "it still moves with the monotonic clock")
}

// Found by review (session 70): the node's latency metrics are durations
// between two of its instants, and instants made from unix nanoseconds
// carry no monotonic reading, so a wall clock stepped forward between a
// call's start and its end showed as one call that slow. Instants that
// are the wall's own reading keep its monotonic one (Go prints it as
// "m=+..."), which is what time.Time.Sub then uses.
func TestNow_KeepsTheMonotonicReading(t *testing.T) {
	c := New(clock.New())
	t1 := c.Now()
	require.Contains(t, t1.String(), " m=", "an instant of the real clock keeps its monotonic reading")
	t2 := c.Now()
	require.Contains(t, t2.String(), " m=")
	require.GreaterOrEqual(t, c.Since(t1), t2.Sub(t1))
}
