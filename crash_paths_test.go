package main

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// Durability across a SIGKILL of a real node, beyond crash_test.go: dedup,
// acks, dead letters, leases, delays, claims ahead, Consume, and
// --sync=none (written by a review, session 71, which found them all
// kept).

func itemIDsOf(items []storage.Item) []storage.ItemID {
	out := make([]storage.ItemID, len(items))
	for i, it := range items {
		out[i] = it.ID
	}
	return out
}

func crashEnqueue(t *testing.T, c *rpc.Client, q string, n int) []storage.ItemID {
	t.Helper()
	items := make([]storage.EnqueueItem, n)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: []byte(fmt.Sprintf("item %d", i))}
	}
	res, err := c.Enqueue(context.Background(), q, items)
	require.NoError(t, err)
	ids := make([]storage.ItemID, n)
	for i, r := range res {
		require.Equal(t, storage.CodeOK, r.Code)
		ids[i] = r.ID
	}
	return ids
}

func crashStats(t *testing.T, c *rpc.Client, q string) storage.QueueStats {
	t.Helper()
	st, err := c.Stats(context.Background(), q)
	require.NoError(t, err)
	require.Len(t, st, 1)
	return st[0]
}

// Dedup, an acked item and a nack to the DLQ, all answered OK, survive a
// SIGKILL; a dedup key enqueued again after the restart is a duplicate.
func TestCrash_DedupAckDLQSurviveKill(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	n := startNode(t, data, "--sync", "always")
	c := dialNode(t, n.addr)
	ctx := context.Background()
	cfg := storage.DefaultQueueConfig()
	cfg.MaxAttempts = 1
	require.NoError(t, c.SetQueueConfig(ctx, "q", cfg))

	res, err := c.Enqueue(ctx, "q", []storage.EnqueueItem{{Payload: []byte("a"), DedupKey: "k"}, {Payload: []byte("b")}, {Payload: []byte("c")}})
	require.NoError(t, err)
	r, err := c.Poll(ctx, "q", 2, time.Minute, 0)
	require.NoError(t, err)
	require.Equal(t, []storage.ItemID{res[0].ID, res[1].ID}, itemIDsOf(r.Items))
	codes, err := c.Ack(ctx, "q", r.Lease, []storage.ItemID{res[0].ID})
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK}, codes)
	zero := time.Duration(0)
	codes, err = c.Nack(ctx, "q", r.Lease, []storage.ItemID{res[1].ID}, &zero, "boom")
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK}, codes)
	n.kill()

	n = startNode(t, data, "--sync", "always")
	c = dialNode(t, n.addr)
	dup, err := c.Enqueue(ctx, "q", []storage.EnqueueItem{{Payload: []byte("a2"), DedupKey: "k"}})
	require.NoError(t, err)
	require.True(t, dup[0].Duplicate, "dedup key forgotten across a SIGKILL")
	require.Equal(t, res[0].ID, dup[0].ID)
	st := crashStats(t, c, "q")
	require.EqualValues(t, 1, st.Ready)
	require.EqualValues(t, 1, st.Dead)
	require.EqualValues(t, 0, st.Inflight)
	dead, err := c.DeadList(ctx, storage.DeadListParams{Queue: "q"})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.Equal(t, res[1].ID, dead[0].ID)
	require.Contains(t, dead[0].Reason, "boom")
	r, err = c.Poll(ctx, "q", 10, time.Minute, 0)
	require.NoError(t, err)
	require.Equal(t, []storage.ItemID{res[2].ID}, itemIDsOf(r.Items), "acked item back, or item lost")
}

// A poll's lease survives a SIGKILL: the item stays leased after the
// restart and comes back at its expiry with its attempt counted. A
// delayed item becomes ready at its time after a restart.
func TestCrash_LeaseAndDelaySurviveKill(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	n := startNode(t, data, "--sync", "always")
	c := dialNode(t, n.addr)
	ctx := context.Background()
	ids := crashEnqueue(t, c, "q", 1)
	res, err := c.Enqueue(ctx, "d", []storage.EnqueueItem{{Payload: []byte("later"), Delay: 2 * time.Second}})
	require.NoError(t, err)
	enqAt := time.Now()
	r, err := c.Poll(ctx, "q", 1, 3*time.Second, 0)
	require.NoError(t, err)
	require.Equal(t, ids, itemIDsOf(r.Items))
	n.kill()

	n = startNode(t, data, "--sync", "always")
	c = dialNode(t, n.addr)
	if time.Now().Before(r.ExpiresAt.Add(-500 * time.Millisecond)) {
		r2, err := c.Poll(ctx, "q", 1, time.Minute, 0)
		require.NoError(t, err)
		if time.Now().Before(r.ExpiresAt) {
			require.Empty(t, r2.Items, "a leased item was delivered again before its lease expired")
		}
	}
	r2, err := c.Poll(ctx, "q", 1, time.Minute, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, ids, itemIDsOf(r2.Items))
	require.EqualValues(t, 2, r2.Items[0].Attempts, "the delivery before the crash is counted")
	// Its old lease is dead.
	codes, err := c.Ack(ctx, "q", r.Lease, ids)
	require.NoError(t, err)
	require.NotEqual(t, storage.CodeOK, codes[0])

	rd, err := c.Poll(ctx, "d", 1, time.Minute, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, []storage.ItemID{res[0].ID}, itemIDsOf(rd.Items))
	require.False(t, time.Now().Before(enqAt.Add(2*time.Second-10*time.Millisecond)), "delayed item served early")
}

// Claims ahead across a SIGKILL: a consumer polls 2, acks them (claiming
// the next 2 ahead) and polls again (taking them); after the crash, the
// taken batch stays leased and its consumer's ack works, and the next
// poll gets the items after it.
func TestCrash_ClaimAheadTakenSurvivesKill(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	n := startNode(t, data, "--sync", "always", "--prefetch-hold", "1s")
	c := dialNode(t, n.addr)
	ctx := context.Background()
	ids := crashEnqueue(t, c, "q", 8)
	r, err := c.Poll(ctx, "q", 2, time.Minute, 0)
	require.NoError(t, err)
	require.Equal(t, ids[0:2], itemIDsOf(r.Items))
	codes, err := c.Ack(ctx, "q", r.Lease, ids[0:2])
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK}, codes)
	r, err = c.Poll(ctx, "q", 2, time.Minute, 0)
	require.NoError(t, err)
	require.Equal(t, ids[2:4], itemIDsOf(r.Items))
	n.kill()

	n = startNode(t, data, "--sync", "always", "--prefetch-hold", "1s")
	c = dialNode(t, n.addr)
	r2, err := c.Poll(ctx, "q", 2, time.Minute, 0)
	require.NoError(t, err)
	require.Equal(t, ids[4:6], itemIDsOf(r2.Items), "a leased batch was served again after the crash")
	codes, err = c.Ack(ctx, "q", r.Lease, ids[2:4])
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK}, codes)
	st := crashStats(t, c, "q")
	require.EqualValues(t, 2, st.Ready)
	require.EqualValues(t, 2, st.Inflight)
	require.EqualValues(t, 4, st.Acked)
}

// Consume across a SIGKILL of its node: the handler's success cannot be
// acked, and Consume says so (OnSettleFailed) and returns an error; the
// restarted node delivers the item again after its lease, attempt 2.
func TestCrash_ConsumeAcrossKill(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	n := startNode(t, data, "--sync", "always")
	c := dialNode(t, n.addr)
	ctx := context.Background()
	ids := crashEnqueue(t, c, "q", 3)

	started := make(chan storage.ItemID, 3)
	release := make(chan struct{})
	var mu sync.Mutex
	var failed []storage.ItemID
	done := make(chan error, 1)
	go func() {
		done <- c.Consume(ctx, rpc.ConsumerConfig{
			Queue: "q", Batch: 1, Lease: 2 * time.Second, Wait: time.Second,
			Clock: clock.New(),
			Handler: func(ctx context.Context, it storage.Item) error {
				started <- it.ID
				<-release
				return nil
			},
			OnSettleFailed: func(id storage.ItemID, ack bool, err error) {
				mu.Lock()
				failed = append(failed, id)
				mu.Unlock()
			},
		})
	}()
	first := <-started
	require.Equal(t, ids[0], first)
	n.kill()
	close(release)
	select {
	case err := <-done:
		require.Error(t, err, "Consume returned nil with its node gone")
	case <-time.After(30 * time.Second):
		t.Fatal("Consume did not return after its node was killed")
	}
	mu.Lock()
	require.Equal(t, []storage.ItemID{ids[0]}, failed, "the ack that never reached the node is reported")
	mu.Unlock()

	n = startNode(t, data, "--sync", "always")
	c = dialNode(t, n.addr)
	r, err := c.Poll(ctx, "q", 3, time.Minute, 10*time.Second)
	require.NoError(t, err)
	got := itemIDsOf(r.Items)
	if len(got) < 3 {
		r2, err := c.Poll(ctx, "q", 3, time.Minute, 10*time.Second)
		require.NoError(t, err)
		got = append(got, itemIDsOf(r2.Items)...)
	}
	require.ElementsMatch(t, ids, got)
	for _, it := range r.Items {
		if it.ID == ids[0] {
			require.EqualValues(t, 2, it.Attempts)
		}
	}
}

// The crash test's ledger with --sync=none: the README promises nothing
// acknowledged is lost across a process crash (the WAL is written to the
// OS before the answer). TestCrash_KillRestart runs --sync=always only.
func TestCrash_SyncNoneKillRestart(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	ledger := newCrashLedger()
	const queue = "crash"
	for round := range 6 {
		n := startNode(t, data, "--sync", "none")
		if round == 0 {
			n.cli("config", queue, "--max-attempts", "4", "--lease", "500ms")
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for p := range 3 {
			wg.Go(func() { crashProducer(ctx, n.addr, round, p, ledger) })
		}
		for i := range 3 {
			wg.Go(func() { crashConsumer(ctx, n.addr, queue, round, uint64(round*10+i), ledger) })
		}
		// Kill once the round has done some work.
		rpctest.Eventually(t, 30*time.Second, func() bool {
			ledger.mu.Lock()
			defer ledger.mu.Unlock()
			return ledger.mu.enqCount > (round+1)*2000 && ledger.mu.ackCount > round*500
		}, "no progress")
		n.kill()
		cancel()
		wg.Wait()
		r := runCLI(t, nil, "", "check", "--data", data)
		require.Equal(t, 0, r.code, "round %d: check:\n%s%s", round, r.stdout, r.stderr)
		ledger.mu.Lock()
		v := ledger.mu.violations
		ledger.mu.Unlock()
		require.Empty(t, v, "round %d", round)
	}
	n := startNode(t, data, "--sync", "none")
	c := dialNode(t, n.addr)
	rpctest.Eventually(t, time.Minute, func() bool {
		st := crashStats(t, c, queue)
		return st.Inflight == 0 && st.Leases == 0
	}, "leases never expired")
	present := scanCrashQueue(t, c, queue)
	ledger.mu.Lock()
	defer ledger.mu.Unlock()
	lost := 0
	for id := range ledger.mu.enqueued {
		if _, here := present[id]; !here && !ledger.mu.acked[id] && !ledger.mu.maybeAcked[id] {
			lost++
		}
	}
	back := 0
	for id := range ledger.mu.acked {
		if _, here := present[id]; here {
			back++
		}
	}
	t.Logf("%d enqueues, %d acks confirmed", ledger.mu.enqCount, ledger.mu.ackCount)
	require.Zero(t, lost, "acknowledged enqueues lost with --sync=none across SIGKILL")
	require.Zero(t, back, "acked items back with --sync=none across SIGKILL")
}
