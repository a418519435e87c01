package leaseqt

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/bench/target"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

func systems() []target.System {
	return []target.System{
		InProcess{Backend: BackendMem},
		InProcess{Backend: BackendRocks, Sync: rocksstore.SyncNone},
		InProcess{Backend: BackendRocks, Sync: rocksstore.SyncAlways},
	}
}

func start(t *testing.T, s target.System, lease time.Duration) (target.Instance, target.Client, target.Client) {
	t.Helper()
	ctx := context.Background()
	in, err := s.Start(ctx, target.StartOptions{Dir: t.TempDir(), Queues: []string{"q"}, Lease: lease, Clock: clock.New()})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, in.Close()) })
	a, err := in.Connect(ctx)
	require.NoError(t, err)
	b, err := in.Connect(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, a.Close()); require.NoError(t, b.Close()) })
	return in, a, b
}

func TestInProcess_EnqueuePollAck(t *testing.T) {
	t.Parallel()
	for _, s := range systems() {
		t.Run(s.Name(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			_, a, _ := start(t, s, time.Minute)
			buf := []byte("one")
			require.NoError(t, a.Enqueue(ctx, "q", [][]byte{buf, []byte("two")}))
			copy(buf, "XXX") // the harness reuses buffers: the store must not see this
			ds, err := a.Poll(ctx, "q", 10, 0)
			require.NoError(t, err)
			require.Len(t, ds, 2)
			require.Equal(t, "one", string(ds[0].Payload))
			require.Equal(t, "two", string(ds[1].Payload))
			require.NoError(t, a.Ack(ctx, "q", ds))
			ds, err = a.Poll(ctx, "q", 10, 0)
			require.NoError(t, err)
			require.Empty(t, ds, "acked items are gone")
			require.NoError(t, a.Ack(ctx, "q", nil))
		})
	}
}

func TestInProcess_WaitingPollWakesOnEnqueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, a, b := start(t, InProcess{Backend: BackendMem}, time.Minute)
	got := make(chan []target.Delivery, 1)
	errc := make(chan error, 1)
	go func() {
		ds, err := b.Poll(ctx, "q", 5, time.Minute)
		errc <- err
		got <- ds
	}()
	require.NoError(t, a.Enqueue(ctx, "q", [][]byte{[]byte("x")}))
	require.NoError(t, <-errc)
	ds := <-got
	require.Len(t, ds, 1, "the waiting poll returned with the enqueued item, well before its minute")
}

func TestInProcess_WaitingPollEndsWithContext(t *testing.T) {
	t.Parallel()
	_, a, _ := start(t, InProcess{Backend: BackendMem}, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := a.Poll(ctx, "q", 5, time.Minute)
	require.ErrorIs(t, err, context.Canceled)
}

func TestInProcess_ExpiredLeaseIsRedeliveredByTheSweepLoop(t *testing.T) {
	t.Parallel()
	for _, s := range systems()[:2] {
		t.Run(s.Name(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			_, a, b := start(t, s, 100*time.Millisecond)
			require.NoError(t, a.Enqueue(ctx, "q", [][]byte{[]byte("x"), []byte("y")}))
			first, err := a.Poll(ctx, "q", 10, 0)
			require.NoError(t, err)
			require.Len(t, first, 2)
			// a hangs; b waits for the sweeper to return the items.
			var again []target.Delivery
			for len(again) < 2 {
				ds, err := b.Poll(ctx, "q", 10, 5*time.Second)
				require.NoError(t, err)
				require.NotEmpty(t, ds, "redelivered within the wait")
				again = append(again, ds...)
			}
			require.NoError(t, b.Ack(ctx, "q", again))
			// The first holder's lease is stale: its ack changes nothing, is
			// no failure (at-least-once consumers meet it), and is reported
			// as lost acks, which the harness does not count as done.
			var lost *target.LostAcks
			require.ErrorAs(t, a.Ack(ctx, "q", first), &lost)
			require.Equal(t, 2, lost.N)
		})
	}
}

func TestInProcess_Describes(t *testing.T) {
	t.Parallel()
	names := map[string]target.Class{}
	for _, s := range systems() {
		require.NoError(t, s.Available())
		require.Equal(t, "leaseq", s.Family())
		names[s.Name()] = s.Durability().Class
	}
	require.Equal(t, map[string]target.Class{
		"leaseq-inproc-mem":    target.ClassMemory,
		"leaseq-inproc-none":   target.ClassRelaxed,
		"leaseq-inproc-always": target.ClassDurable,
	}, names)
	_, err := InProcess{Backend: "tape"}.Start(context.Background(), target.StartOptions{Dir: t.TempDir(), Clock: clock.New()})
	require.ErrorContains(t, err, "unknown backend")
}

// TestInProcess_RaisesProcsWithSyncAlways: a SyncAlways store in process
// runs with one P more than Go's default while it is open, as
// rocksstore.SuggestedProcs suggests (and leaseq serve does); SyncNone
// keeps the default; the last one to close restores it; a GOMAXPROCS in
// the environment wins. Not parallel: it reads the process's GOMAXPROCS.
func TestInProcess_RaisesProcsWithSyncAlways(t *testing.T) {
	base := runtime.GOMAXPROCS(0)
	open := func(mode rocksstore.SyncMode) target.Instance {
		t.Helper()
		in, err := InProcess{Backend: BackendRocks, Sync: mode}.Start(context.Background(),
			target.StartOptions{Dir: t.TempDir(), Queues: []string{"q"}, Lease: time.Minute, Clock: clock.New()})
		require.NoError(t, err)
		return in
	}
	always := InProcess{Backend: BackendRocks, Sync: rocksstore.SyncAlways}
	require.Contains(t, always.Durability().Mode, "GOMAXPROCS CPUs+1")
	a := open(rocksstore.SyncAlways)
	require.Equal(t, base+1, runtime.GOMAXPROCS(0), "raised while a SyncAlways store is open")
	b := open(rocksstore.SyncAlways)
	n := open(rocksstore.SyncNone)
	require.Equal(t, base+1, runtime.GOMAXPROCS(0), "raised once, not once per store")
	require.NoError(t, a.Close())
	require.Equal(t, base+1, runtime.GOMAXPROCS(0), "still raised while one is open")
	require.NoError(t, n.Close())
	require.NoError(t, b.Close())
	require.Equal(t, base, runtime.GOMAXPROCS(0), "restored when the last closes")

	n = open(rocksstore.SyncNone)
	require.Equal(t, base, runtime.GOMAXPROCS(0), "SyncNone keeps Go's default")
	require.NoError(t, n.Close())

	t.Setenv("GOMAXPROCS", strconv.Itoa(base))
	require.NotContains(t, always.Durability().Mode, "GOMAXPROCS")
	a = open(rocksstore.SyncAlways)
	require.Equal(t, base, runtime.GOMAXPROCS(0), "the environment's GOMAXPROCS wins")
	require.NoError(t, a.Close())
	require.Equal(t, base, runtime.GOMAXPROCS(0))
}

func TestLoopback_RPCClientOverAServerInProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := Loopback{Sync: rocksstore.SyncNone}
	require.True(t, s.OnlyWhenNamed())
	_, a, b := start(t, s, 100*time.Millisecond)
	require.NoError(t, a.Enqueue(ctx, "q", [][]byte{[]byte("x"), []byte("y"), []byte("z")}))
	first, err := a.Poll(ctx, "q", 2, time.Second)
	require.NoError(t, err)
	require.Len(t, first, 2)
	require.Equal(t, "x", string(first[0].Payload))
	require.NoError(t, a.Ack(ctx, "q", first[:1]))
	// first[1] is abandoned: the sweeper expires its lease and wakes
	// b's long poll through the server's dispatcher.
	var got []string
	for len(got) < 2 {
		ds, err := b.Poll(ctx, "q", 10, 5*time.Second)
		require.NoError(t, err)
		require.NotEmpty(t, ds)
		for _, d := range ds {
			got = append(got, string(d.Payload))
		}
		require.NoError(t, b.Ack(ctx, "q", ds))
	}
	require.ElementsMatch(t, []string{"y", "z"}, got)
	// Found by review (session 72): a stale lease's ack is tolerated, but
	// it is not an ack, and the harness must not count its item as done.
	var lost *target.LostAcks
	require.ErrorAs(t, a.Ack(ctx, "q", first[1:]), &lost, "a stale lease's ack reads as an ack")
	require.Equal(t, 1, lost.N)
	require.Equal(t, []int{0}, lost.Index)
}

// An in-process RocksDB store reports its write stalls for the row's
// notes; the memory store has no such counter.
func TestInProcess_Counters(t *testing.T) {
	t.Parallel()
	for _, s := range systems() {
		t.Run(s.Name(), func(t *testing.T) {
			in, _, _ := start(t, s, time.Minute)
			cs, ok := in.(target.Counters)
			require.True(t, ok)
			c := cs.Counters()
			if s.(InProcess).Backend == BackendMem {
				require.Nil(t, c)
				return
			}
			require.Contains(t, c, "write_stall_s")
			require.Zero(t, c["write_stall_s"], "an idle store has not stalled")
			before := c["commits"]
			a, err := in.Connect(context.Background())
			require.NoError(t, err)
			defer a.Close()
			require.NoError(t, a.Enqueue(context.Background(), "q", [][]byte{[]byte("x")}))
			c = cs.Counters()
			require.Greater(t, c["commits"], before, "the enqueue was committed")
			if s.(InProcess).Sync == rocksstore.SyncAlways {
				require.Positive(t, c["wal_fsyncs"], "and fsynced")
				require.Positive(t, c["wal_fsync_s"], "and the fsync was timed")
			} else {
				require.Zero(t, c["wal_fsyncs"])
			}
			// A consumer's poll, ack and next poll: with sync=always the
			// ack claims the next batch ahead and the poll takes it.
			ctx := context.Background()
			require.NoError(t, a.Enqueue(ctx, "q", [][]byte{[]byte("y"), []byte("z"), []byte("w")}))
			ds, err := a.Poll(ctx, "q", 1, 0)
			require.NoError(t, err)
			require.NoError(t, a.Ack(ctx, "q", ds))
			ds, err = a.Poll(ctx, "q", 1, 0)
			require.NoError(t, err)
			require.Len(t, ds, 1)
			c = cs.Counters()
			if s.(InProcess).Sync == rocksstore.SyncAlways {
				require.EqualValues(t, 1, c["prefetch_taken"], "the second poll was answered ahead")
			} else {
				require.Zero(t, c["prefetch_taken"])
			}
		})
	}
}

func TestScrapeCounters(t *testing.T) {
	page := `# HELP leaseq_store_commits_total Batches.
# TYPE leaseq_store_commits_total counter
leaseq_store_commits_total 1234
leaseq_store_wal_fsync_seconds_sum 0.5
leaseq_store_wal_fsync_seconds_count 77
leaseq_rpc_requests_total{op="enqueue"} 9
leaseq_store_write_stall_seconds_total 1.5e-03
leaseq_store_prefetch_batches_total{outcome="claimed"} 12
leaseq_store_prefetch_batches_total{outcome="taken"} 11
`
	got, err := scrapeCounters(strings.NewReader(page), nodeCounters)
	require.NoError(t, err)
	require.Equal(t, map[string]float64{"commits": 1234, "wal_fsyncs": 77, "wal_fsync_s": 0.5, "write_stall_s": 0.0015, "prefetch_taken": 11}, got)
	_, err = scrapeCounters(strings.NewReader("leaseq_store_commits_total x\n"), nodeCounters)
	require.ErrorContains(t, err, "leaseq_store_commits_total")
}

// AckPoll acks one batch and takes the next in one step, on every
// in-process store (rocksstore hands the ack to its pipeline first) and
// over the loopback RPC client.
func TestAckPoll_AcksThenTakesTheNext(t *testing.T) {
	t.Parallel()
	for _, s := range append(systems(), Loopback{Sync: rocksstore.SyncAlways}) {
		t.Run(s.Name(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			_, a, b := start(t, s, time.Minute)
			ap, ok := a.(target.AckPoller)
			require.True(t, ok, "%T is an AckPoller", a)
			require.NoError(t, b.Enqueue(ctx, "q", [][]byte{[]byte("1"), []byte("2"), []byte("3")}))
			first, err := a.Poll(ctx, "q", 2, 0)
			require.NoError(t, err)
			require.Len(t, first, 2)
			acked := 0
			next, err := ap.AckPoll(ctx, "q", first, func(*target.LostAcks) { acked++ }, 10, 0)
			require.NoError(t, err)
			require.Equal(t, 1, acked, "the ack was confirmed once")
			require.Len(t, next, 1)
			require.Equal(t, "3", string(next[0].Payload))
			// The queue is empty now: a waiting poll wakes on an enqueue, and
			// the ack is confirmed whether or not items came.
			go func() {
				clock.New().Sleep(50 * time.Millisecond)
				_ = b.Enqueue(ctx, "q", [][]byte{[]byte("4")})
			}()
			last, err := ap.AckPoll(ctx, "q", next, func(*target.LostAcks) { acked++ }, 10, 5*time.Second)
			require.NoError(t, err)
			require.Equal(t, 2, acked)
			require.Len(t, last, 1)
			require.Equal(t, "4", string(last[0].Payload))
			require.NoError(t, a.Ack(ctx, "q", last))
			rest, err := a.Poll(ctx, "q", 10, 0)
			require.NoError(t, err)
			require.Empty(t, rest, "every item was acked once")
		})
	}
}
