package sweeper

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

func TestNew_Config(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	clk := clock.NewMock()
	log := slog.New(newLogRecorder(t))
	for _, tc := range []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"NoStore", Config{Clock: clk, Logger: log}, "Store is nil"},
		{"NoClock", Config{Store: store, Logger: log}, "Clock is nil"},
		{"NoLogger", Config{Store: store, Clock: clk}, "Logger is nil"},
		{"NegativeBatch", Config{Store: store, Clock: clk, Logger: log, BatchLimit: -1}, "BatchLimit"},
		{"NegativeInterval", Config{Store: store, Clock: clk, Logger: log, SweepInterval: -time.Second}, "SweepInterval"},
		{"Defaults", Config{Store: store, Clock: clk, Logger: log}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := New(tc.cfg)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				require.Nil(t, s)
				return
			}
			require.NoError(t, err)
			require.Equal(t, DefaultBatchLimit, s.batchLimit)
			require.Equal(t, DefaultSweepInterval, s.interval)
		})
	}
}

func TestSweeper_Lifecycle(t *testing.T) {
	t.Parallel()
	t.Run("StopBeforeStartIsSafeAndFinal", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &fakeStore{}, Config{})
		b.sweeper.Stop()
		b.sweeper.Stop()
		require.ErrorContains(t, b.sweeper.Start(context.Background()), "start after stop")
	})
	t.Run("StopIsIdempotent", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &fakeStore{}, Config{})
		b.start(t)
		b.nextPass(t)
		b.sweeper.Stop()
		b.sweeper.Stop()
	})
	t.Run("DoubleStartFails", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &fakeStore{}, Config{})
		b.start(t)
		require.ErrorContains(t, b.sweeper.Start(context.Background()), "already started")
	})
	t.Run("CancelledContextEndsLoop", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &fakeStore{}, Config{})
		ctx, cancel := context.WithCancel(context.Background())
		require.NoError(t, b.sweeper.Start(ctx))
		b.waitArmed(t, b.at(DefaultSweepInterval))
		cancel()
		b.sweeper.Stop() // must not hang: the loop already returned
	})
	t.Run("NotifyOnNilSweeper", func(t *testing.T) {
		t.Parallel()
		var s *Sweeper
		require.NotPanics(t, func() { s.Notify(time.Unix(1, 0)) })
	})
	t.Run("NotifyBeforeStartIsKept", func(t *testing.T) {
		t.Parallel()
		b := setup(t, &fakeStore{}, Config{SweepInterval: time.Minute})
		b.sweeper.Notify(b.at(5 * time.Second))
		b.start(t)
		b.nextPass(t)
		b.waitArmed(t, b.at(5*time.Second))
	})
}

// TestSweeper_FakeLeaseReclaimedAtDeadline uses the fake store; the memstore
// and rocksstore versions of this test are in store_test.go.
func TestSweeper_FakeLeaseReclaimedAtDeadline(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	b := setup(t, store, Config{})
	deadline := b.at(30 * time.Second)
	store.add("q1", deadline)
	b.start(t)
	first := b.nextPass(t)
	require.NoError(t, first.err)
	require.Equal(t, deadline, first.res.Next)

	// Walk the 1 s capped timers up to one millisecond before the deadline.
	b.advanceTo(t, deadline.Add(-time.Millisecond))
	b.noPassYet(t)
	require.Equal(t, 1, store.pending(), "lease reclaimed before its deadline")

	b.clock.Add(time.Millisecond)
	ev := b.nextPass(t)
	require.NoError(t, ev.err)
	require.Equal(t, 1, ev.res.LeasesExpired)
	require.Equal(t, 0, store.pending())
	require.Equal(t, []string{"q1"}, <-b.ready)
	require.Equal(t, deadline, b.clock.Now())
	require.Equal(t, time.Duration(0), b.sweeper.Metrics().LastLag)
	require.Equal(t, 1, b.logs.count(slog.LevelInfo, "sweep expired leases"))
}

func TestSweeper_NotifyEarlierRearms(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	b := setup(t, store, Config{SweepInterval: 10 * time.Second})
	b.start(t)
	b.nextPass(t)
	b.waitArmed(t, b.at(10*time.Second))

	// A later deadline than the armed timer changes nothing; an earlier
	// one re-arms. The next armed event must be the earlier deadline: had
	// the later one re-armed, an event for 10 s would come first.
	b.sweeper.Notify(b.at(20 * time.Second))
	store.add("q", b.at(3*time.Second))
	b.sweeper.Notify(b.at(3 * time.Second))
	require.Equal(t, b.at(3*time.Second), <-b.armed)

	b.clock.Add(3*time.Second - time.Millisecond)
	b.noPassYet(t)
	b.clock.Add(time.Millisecond)
	ev := b.nextPass(t)
	require.Equal(t, 1, ev.res.LeasesExpired)
	require.Equal(t, b.at(3*time.Second), store.lastCall().Now)
	b.waitArmed(t, b.at(13*time.Second))
}

func TestSweeper_BoundedBatchesLoopWhileMore(t *testing.T) {
	t.Parallel()
	store := &fakeStore{}
	for i := range 5 {
		store.add(fmt.Sprintf("q%d", i%2), time.Unix(0, 0))
	}
	store.add("later", time.Unix(7, 0))
	b := setup(t, store, Config{BatchLimit: 2, SweepInterval: time.Minute})
	b.start(t)
	ev := b.nextPass(t)
	require.NoError(t, ev.err)
	require.Equal(t, 5, ev.res.LeasesExpired)
	require.Equal(t, 5, ev.res.Requeued)
	require.False(t, ev.res.More)
	require.Equal(t, time.Unix(7, 0), ev.res.Next)
	require.Equal(t, []string{"q0", "q1"}, ev.res.ReadyQueues)
	require.Equal(t, []string{"q0", "q1"}, <-b.ready, "OnReady once per pass with the union")
	require.Equal(t, 3, store.callCount(), "2+2+1 expired in three bounded batches")
	for _, c := range store.allCalls() {
		require.Equal(t, 2, c.Limit)
	}
	b.waitArmed(t, time.Unix(7, 0))

	m := b.sweeper.Metrics()
	require.Equal(t, uint64(1), m.Passes)
	require.Equal(t, uint64(5), m.LeasesExpired)
	require.Equal(t, uint64(5), m.Requeued)
}

// endlessStore always has more work: only the context check between
// batches lets a pass end.
type endlessStore struct{ calls chan struct{} }

func (e *endlessStore) Sweep(ctx context.Context, p storage.SweepParams) (storage.SweepResult, error) {
	select {
	case e.calls <- struct{}{}:
	default:
	}
	return storage.SweepResult{LeasesExpired: p.Limit, More: true}, nil
}

func TestSweeper_StopInterruptsBacklog(t *testing.T) {
	t.Parallel()
	store := &endlessStore{calls: make(chan struct{}, 1)}
	b := setup(t, store, Config{BatchLimit: 1})
	b.start(t)
	<-store.calls // the pass is looping on More
	b.sweeper.Stop()
	ev := b.nextPass(t)
	require.ErrorIs(t, ev.err, context.Canceled)
	require.Zero(t, b.logs.count(slog.LevelWarn, "sweep failed"), "shutdown is not a failure")
}

func TestSweeper_FailureBackoff(t *testing.T) {
	t.Parallel()
	store := &fakeStore{failN: 6}
	b := setup(t, store, Config{SweepInterval: 200 * time.Millisecond})
	b.start(t)
	// Backoff doubles from 10 ms and is capped at the interval.
	delays := []time.Duration{10, 20, 40, 80, 160, 200}
	for i, d := range delays {
		ev := b.nextPass(t)
		require.ErrorIs(t, ev.err, errInjected, "pass %d", i)
		want := b.clock.Now().Add(d * time.Millisecond)
		b.waitArmed(t, want)
		b.clock.Add(d * time.Millisecond)
	}
	ev := b.nextPass(t)
	require.NoError(t, ev.err)
	require.Equal(t, 4, b.logs.count(slog.LevelWarn, "sweep failed"))
	require.Equal(t, 2, b.logs.count(slog.LevelError, "sweep failed"))
	require.Equal(t, 1, b.logs.count(slog.LevelInfo, "sweeper recovered"))
	m := b.sweeper.Metrics()
	require.Equal(t, uint64(7), m.Passes)
	require.Equal(t, uint64(6), m.FailedPasses)
}

func TestMetrics_Sub(t *testing.T) {
	t.Parallel()
	prev := Metrics{Passes: 3, FailedPasses: 1, LeasesExpired: 10, Requeued: 8, DeadLettered: 2, Promoted: 4, DedupDropped: 1, LastPassDuration: time.Second, LastLag: time.Millisecond, MaxLag: time.Second}
	cur := Metrics{Passes: 5, FailedPasses: 1, LeasesExpired: 15, Requeued: 12, DeadLettered: 3, Promoted: 9, DedupDropped: 1, LastPassDuration: 2 * time.Millisecond, LastLag: 0, MaxLag: time.Second}
	require.Equal(t, Metrics{Passes: 2, LeasesExpired: 5, Requeued: 4, DeadLettered: 1, Promoted: 5, LastPassDuration: 2 * time.Millisecond, MaxLag: time.Second}, cur.Sub(prev))
}

// TestSweeper_StartStopStress starts and stops many sweepers while
// other goroutines hammer Notify and Metrics, on both the mock and the real
// clock. Under -race it checks the lifecycle and Notify paths for data
// races; goleak (TestMain) checks every loop was joined.
func TestSweeper_StartStopStress(t *testing.T) {
	t.Parallel()
	for _, real := range []bool{false, true} {
		t.Run(fmt.Sprintf("realClock=%v", real), func(t *testing.T) {
			t.Parallel()
			for i := range 50 {
				store := &fakeStore{}
				var clk clock.Clock = clock.NewMock()
				if real {
					clk = clock.New()
				}
				store.add("q", clk.Now().Add(time.Duration(i)*time.Millisecond))
				s, err := New(Config{Store: store, Clock: clk, Logger: slog.New(slog.DiscardHandler), SweepInterval: time.Millisecond})
				require.NoError(t, err)
				var wg sync.WaitGroup
				stop := make(chan struct{})
				for range 4 {
					wg.Go(func() {
						for j := 0; ; j++ {
							select {
							case <-stop:
								return
							default:
							}
							s.Notify(clk.Now().Add(time.Duration(j%7) * time.Millisecond))
							_ = s.Metrics()
						}
					})
				}
				if i%3 != 0 { // sometimes never started at all
					require.NoError(t, s.Start(context.Background()))
				}
				var stops sync.WaitGroup
				for range 3 {
					stops.Go(s.Stop)
				}
				stops.Wait()
				close(stop)
				wg.Wait()
				require.Error(t, s.Start(context.Background()))
			}
		})
	}
}

// stuckStore always reports More without doing anything: a store that
// cannot get past some entry.
type stuckStore struct{}

func (stuckStore) Sweep(context.Context, storage.SweepParams) (storage.SweepResult, error) {
	return storage.SweepResult{More: true}, nil
}

func TestSweeper_NoProgressBacksOff(t *testing.T) {
	t.Parallel()
	b := setup(t, stuckStore{}, Config{})
	b.start(t)
	ev := b.nextPass(t)
	require.ErrorIs(t, ev.err, ErrNoProgress)
	b.waitArmed(t, b.at(minErrorBackoff))
	b.clock.Add(minErrorBackoff)
	ev = b.nextPass(t)
	require.ErrorIs(t, ev.err, ErrNoProgress)
	b.waitArmed(t, b.at(3*minErrorBackoff))
	require.Equal(t, 2, b.logs.count(slog.LevelWarn, "sweep failed"))
}

// partialStore's Sweep applies part of its pass, then fails.
type partialStore struct{}

func (partialStore) Sweep(context.Context, storage.SweepParams) (storage.SweepResult, error) {
	return storage.SweepResult{LeasesExpired: 3, Requeued: 3, ReadyQueues: []string{"q"}}, errInjected
}

// TestSweeper_FailedSweepStillWakesWhatItMadeReady: a sweep that fails
// after applying part of its pass (rocksstore commits a pass in steps)
// returns what it did; the queues it made ready are woken and its counts
// kept. The sweeper dropped both, so long polls on those queues waited
// out their timeouts (found by review).
func TestSweeper_FailedSweepStillWakesWhatItMadeReady(t *testing.T) {
	t.Parallel()
	b := setup(t, partialStore{}, Config{})
	b.start(t)
	ev := b.nextPass(t)
	require.ErrorIs(t, ev.err, errInjected)
	select {
	case qs := <-b.ready:
		require.Equal(t, []string{"q"}, qs)
	case <-time.After(10 * time.Second):
		t.Fatal("the queue the failed sweep made ready was not woken")
	}
	m := b.sweeper.Metrics()
	require.EqualValues(t, 3, m.LeasesExpired)
	require.EqualValues(t, 1, m.FailedPasses)
}
