package sweeper

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// signalTimeout bounds every wait for a loop event. It is a failure
// deadline, not a synchronisation sleep: events normally arrive within
// microseconds, but -race on a shared 2-core machine can be slow.
const signalTimeout = 20 * time.Second

// logRecorder is a slog.Handler that writes to t.Log and remembers the
// level and message of every record, so tests can assert what was logged.
type logRecorder struct {
	t     testing.TB
	attrs []slog.Attr
	mu    *sync.Mutex
	recs  *[]logRec
}

type logRec struct {
	level slog.Level
	msg   string
}

func newLogRecorder(t testing.TB) *logRecorder {
	return &logRecorder{t: t, mu: &sync.Mutex{}, recs: &[]logRec{}}
}

func (h *logRecorder) Enabled(context.Context, slog.Level) bool { return true }

func (h *logRecorder) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	for _, a := range h.attrs {
		b.WriteString(" " + a.String())
	}
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	h.t.Log(b.String())
	h.mu.Lock()
	*h.recs = append(*h.recs, logRec{r.Level, r.Message})
	h.mu.Unlock()
	return nil
}

func (h *logRecorder) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr{}, h.attrs...), as...)
	return &c
}

func (h *logRecorder) WithGroup(string) slog.Handler { return h }

// count returns how many records at level had message msg.
func (h *logRecorder) count(level slog.Level, msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range *h.recs {
		if r.level == level && r.msg == msg {
			n++
		}
	}
	return n
}

// passEvent is one TestSignals.PassDone call.
type passEvent struct {
	res storage.SweepResult
	err error
}

// testBundle is a Sweeper on a mock clock with its signals turned into
// channels. The channels are large enough that the loop never blocks on
// them in these tests.
type testBundle struct {
	clock   *clock.Mock
	sweeper *Sweeper
	armed   chan time.Time
	passes  chan passEvent
	ready   chan []string
	logs    *logRecorder
}

// setup builds a Sweeper over store with cfg's Store, Clock, Logger,
// OnReady and TestSignals filled in, and registers Stop as cleanup. The
// caller starts it.
func setup(t *testing.T, store Store, cfg Config) *testBundle {
	t.Helper()
	b := &testBundle{
		clock:  clock.NewMock(),
		armed:  make(chan time.Time, 1024),
		passes: make(chan passEvent, 1024),
		ready:  make(chan []string, 1024),
		logs:   newLogRecorder(t),
	}
	cfg.Store = store
	cfg.Clock = b.clock
	cfg.Logger = slog.New(b.logs)
	cfg.OnReady = func(qs []string) { b.ready <- qs }
	cfg.TestSignals = TestSignals{
		TimerArmed: func(d time.Time) { b.armed <- d },
		PassDone:   func(res storage.SweepResult, err error) { b.passes <- passEvent{res, err} },
	}
	s, err := New(cfg)
	require.NoError(t, err)
	b.sweeper = s
	t.Cleanup(s.Stop)
	return b
}

func (b *testBundle) start(t *testing.T) {
	t.Helper()
	require.NoError(t, b.sweeper.Start(context.Background()))
}

// at returns the mock epoch plus d: the instant "+d of mock time".
func (b *testBundle) at(d time.Duration) time.Time { return time.Unix(0, 0).Add(d) }

// waitArmed waits until the loop arms its timer for want. Earlier events
// for other deadlines are skipped; a re-arm for the same deadline (after a
// stale wake-up) is harmless.
func (b *testBundle) waitArmed(t *testing.T, want time.Time) {
	t.Helper()
	deadline := time.After(signalTimeout)
	for {
		select {
		case got := <-b.armed:
			if got.Equal(want) {
				return
			}
		case <-deadline:
			t.Fatalf("timer never armed for %v (mock now %v)", want, b.clock.Now())
		}
	}
}

// nextPass waits for the next PassDone.
func (b *testBundle) nextPass(t *testing.T) passEvent {
	t.Helper()
	select {
	case ev := <-b.passes:
		return ev
	case <-time.After(signalTimeout):
		t.Fatalf("no pass finished (mock now %v)", b.clock.Now())
		return passEvent{}
	}
}

// noPassYet fails if a pass has finished that the test has not consumed.
// Passes happen only on the sweeper goroutine after a timer fires inside
// mock.Add, a Notify, or Start; callers use it right after an Add that must
// not have fired the timer.
func (b *testBundle) noPassYet(t *testing.T) {
	t.Helper()
	select {
	case ev := <-b.passes:
		t.Fatalf("unexpected pass: %+v", ev)
	default:
	}
}

// advanceTo moves the mock clock to target one armed timer at a time, so
// the loop has armed the timer for each step before time passes it. It
// returns after the pass for the last timer at or before target, if any.
func (b *testBundle) advanceTo(t *testing.T, target time.Time) {
	t.Helper()
	for {
		var armed time.Time
		select {
		case armed = <-b.armed:
		case <-time.After(signalTimeout):
			t.Fatalf("no timer armed while advancing to %v (mock now %v)", target, b.clock.Now())
		}
		if armed.After(target) {
			if d := target.Sub(b.clock.Now()); d > 0 {
				b.clock.Add(d)
			}
			return
		}
		b.clock.Add(armed.Sub(b.clock.Now()))
		b.nextPass(t)
	}
}

// fakeStore is a minimal hand-written Store: a list of lease deadlines
// per queue. Sweep expires due ones up to the limit, earliest first, and
// records every call. It lets tests count calls and inject errors, which a
// real store cannot do.
type fakeStore struct {
	mu     sync.Mutex
	leases []fakeLease
	calls  []storage.SweepParams
	failN  int // the next failN calls fail
}

type fakeLease struct {
	queue string
	at    time.Time
}

var errInjected = errors.New("injected sweep failure")

func (f *fakeStore) add(queue string, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leases = append(f.leases, fakeLease{queue, at})
}

func (f *fakeStore) Sweep(ctx context.Context, p storage.SweepParams) (storage.SweepResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, p)
	if f.failN > 0 {
		f.failN--
		return storage.SweepResult{}, errInjected
	}
	sort.Slice(f.leases, func(i, j int) bool { return f.leases[i].at.Before(f.leases[j].at) })
	var res storage.SweepResult
	queues := map[string]bool{}
	i := 0
	for ; i < len(f.leases) && !f.leases[i].at.After(p.Now); i++ {
		if res.LeasesExpired == p.Limit {
			res.More = true
			break
		}
		res.LeasesExpired++
		res.Requeued++
		queues[f.leases[i].queue] = true
	}
	f.leases = f.leases[res.LeasesExpired:]
	if len(f.leases) > 0 {
		res.Next = f.leases[0].at
	}
	for q := range queues {
		res.ReadyQueues = append(res.ReadyQueues, q)
	}
	sort.Strings(res.ReadyQueues)
	return res, nil
}

func (f *fakeStore) callCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func (f *fakeStore) lastCall() storage.SweepParams {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[len(f.calls)-1]
}

func (f *fakeStore) allCalls() []storage.SweepParams {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]storage.SweepParams(nil), f.calls...)
}

func (f *fakeStore) pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.leases)
}
