package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// metricsNode is an in-process `leaseq serve` on a mock clock, with
// /metrics on a loopback port.
type metricsNode struct {
	t       *testing.T
	te      *testEnv
	clk     *clock.Mock
	codes   <-chan int
	sigc    chan<- os.Signal
	metrics string
	c       *rpc.Client
	stopped bool
}

func startMetricsNode(t *testing.T, data string, clk *clock.Mock, extra ...string) *metricsNode {
	t.Helper()
	te := newTestEnv(nil)
	te.env.clock = clk
	metrics := freePort(t)
	sock := "unix:" + filepath.Join(t.TempDir(), "s.sock")
	args := append([]string{"serve", "--data", data, "--log-format", "json", "--listen", sock, "--metrics", metrics, "--min-free-disk", "0"}, extra...)
	codes := make(chan int, 1)
	go func() { codes <- run(context.Background(), args, &te.env) }()
	var sigc chan<- os.Signal
	select {
	case sigc = <-te.sigs:
	case code := <-codes:
		t.Fatalf("serve exited with %d; stderr:\n%s\nstdout:\n%s", code, te.errOut, te.out)
	case <-time.After(time.Minute):
		t.Fatal("serve never registered for signals")
	}
	n := &metricsNode{t: t, te: te, clk: clk, codes: codes, sigc: sigc, metrics: metrics}
	rpctest.Eventually(t, time.Minute, func() bool {
		resp, err := http.Get("http://" + metrics + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "node not ready")
	n.c = dialNode(t, sock)
	t.Cleanup(func() {
		if !n.stopped {
			n.stop()
		}
	})
	return n
}

func (n *metricsNode) stop() {
	n.t.Helper()
	n.stopped = true
	_ = n.c.Close()
	n.sigc <- syscall.SIGTERM
	select {
	case code := <-n.codes:
		require.Zero(n.t, code, "serve exit; stderr:\n%s", n.te.errOut)
	case <-time.After(20 * time.Second):
		buf := make([]byte, 1<<22)
		buf = buf[:runtime.Stack(buf, true)]
		n.t.Fatalf("serve did not stop; logs:\n%s\n%s\nstacks:\n%s", n.te.out, n.te.errOut, buf)
	}
}

func (n *metricsNode) page() string {
	n.t.Helper()
	resp, err := http.Get("http://" + n.metrics + "/metrics")
	require.NoError(n.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(n.t, err)
	return string(b)
}

// num returns the value of series in page (-1 when absent).
func num(t *testing.T, page, series string) float64 {
	t.Helper()
	v := metricValue(page, series)
	if v == "" {
		return -1
	}
	f, err := strconv.ParseFloat(v, 64)
	require.NoError(t, err, "%s %q", series, v)
	return f
}

func depth(q, state string) string {
	return fmt.Sprintf(`leaseq_queue_depth{queue=%q,state=%q}`, q, state)
}

func items(q, ev string) string {
	return fmt.Sprintf(`leaseq_queue_items_total{event=%q,queue=%q}`, ev, q)
}

// advance advances the mock clock by d and waits until the sweeper has
// finished a pass started after it.
func (n *metricsNode) advance(d time.Duration) {
	n.t.Helper()
	before := num(n.t, n.page(), "leaseq_sweeper_passes_total")
	n.clk.Add(d)
	rpctest.Eventually(n.t, 30*time.Second, func() bool {
		return num(n.t, n.page(), "leaseq_sweeper_passes_total") > before
	}, "no sweep after advancing the clock")
}

func newMock() *clock.Mock {
	clk := clock.NewMock()
	clk.Set(time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC))
	return clk
}

type wantQ struct {
	ready, delayed, inflight, dead, leases               float64
	enq, dup, delivered, acked, nacked, expired, dl, red float64
	purged                                               float64
}

func checkQ(t *testing.T, page, q string, w wantQ, step string) {
	t.Helper()
	got := wantQ{
		ready: num(t, page, depth(q, "ready")), delayed: num(t, page, depth(q, "delayed")),
		inflight: num(t, page, depth(q, "inflight")), dead: num(t, page, depth(q, "dead")),
		leases:    num(t, page, fmt.Sprintf(`leaseq_queue_leases_active{queue=%q}`, q)),
		enq:       num(t, page, items(q, "enqueued")),
		dup:       num(t, page, items(q, "duplicate")),
		delivered: num(t, page, items(q, "delivered")),
		acked:     num(t, page, items(q, "acked")),
		nacked:    num(t, page, items(q, "nacked")),
		expired:   num(t, page, items(q, "expired")),
		dl:        num(t, page, items(q, "dead_lettered")),
		red:       num(t, page, items(q, "redriven")),
		purged:    num(t, page, items(q, "purged")),
	}
	require.Equal(t, w, got, "queue %q after %s", q, step)
}

// TestMetrics_Lifecycle drives every item operation on a real node
// and compares each scrape with what must be true.
func TestMetrics_Lifecycle(t *testing.T) {
	clk := newMock()
	n := startMetricsNode(t, filepath.Join(t.TempDir(), "data"), clk, "--sync", "none")
	ctx := context.Background()
	c := n.c
	q := "jobs"
	require.NoError(t, c.SetQueueConfig(ctx, q, storage.QueueConfig{MaxAttempts: 2, LeaseDuration: 30 * time.Second, DedupWindow: time.Minute}))
	_, err := c.Enqueue(ctx, q, []storage.EnqueueItem{{Payload: []byte("a"), DedupKey: "k"}, {Payload: []byte("b")}, {Payload: []byte("c")}})
	require.NoError(t, err)
	_, err = c.Enqueue(ctx, q, []storage.EnqueueItem{{Payload: []byte("a2"), DedupKey: "k"}})
	require.NoError(t, err)
	w := wantQ{ready: 3, enq: 3, dup: 1}
	checkQ(t, n.page(), q, w, "enqueue")
	clk.Add(5 * time.Second)
	require.Equal(t, 5.0, num(t, n.page(), fmt.Sprintf(`leaseq_queue_oldest_ready_age_seconds{queue=%q}`, q)))

	res, err := c.Poll(ctx, q, 2, 30*time.Second, 0)
	require.NoError(t, err)
	require.Len(t, res.Items, 2)
	w = wantQ{ready: 1, inflight: 2, leases: 1, enq: 3, dup: 1, delivered: 2}
	checkQ(t, n.page(), q, w, "poll")

	_, err = c.Extend(ctx, q, res.Lease, time.Minute)
	require.NoError(t, err)
	checkQ(t, n.page(), q, w, "extend")

	_, err = c.Ack(ctx, q, res.Lease, []storage.ItemID{res.Items[0].ID})
	require.NoError(t, err)
	w.inflight, w.acked = 1, 1
	checkQ(t, n.page(), q, w, "ack")

	d := 10 * time.Second
	_, err = c.Nack(ctx, q, res.Lease, []storage.ItemID{res.Items[1].ID}, &d, "later")
	require.NoError(t, err)
	w.inflight, w.leases, w.delayed, w.nacked = 0, 0, 1, 1
	checkQ(t, n.page(), q, w, "nack with delay")

	// The delayed item comes due: the sweeper promotes it.
	n.advance(11 * time.Second)
	w.delayed, w.ready = 0, 2
	checkQ(t, n.page(), q, w, "promotion")

	// Both ready items polled under a short lease that expires: one goes
	// back to ready, the other (second attempt, max 2) is dead-lettered.
	res, err = c.Poll(ctx, q, 2, time.Second, 0)
	require.NoError(t, err)
	require.Len(t, res.Items, 2)
	w.ready, w.inflight, w.leases, w.delivered = 0, 2, 1, 4
	checkQ(t, n.page(), q, w, "second poll")
	n.advance(2 * time.Second)
	w.inflight, w.leases, w.expired, w.ready, w.dead, w.dl = 0, 0, 2, 1, 1, 1
	checkQ(t, n.page(), q, w, "expiry")

	// Nack without delay (backoff base 0: ready at once).
	res, err = c.Poll(ctx, q, 1, 30*time.Second, 0)
	require.NoError(t, err)
	require.Len(t, res.Items, 1)
	zero := time.Duration(0)
	_, err = c.Nack(ctx, q, res.Lease, []storage.ItemID{res.Items[0].ID}, &zero, "x")
	require.NoError(t, err)
	w.delivered, w.nacked, w.dead, w.dl, w.ready = 5, 2, 2, 2, 0 // 2nd attempt: dead
	checkQ(t, n.page(), q, w, "nack at max attempts")

	rr, err := c.Redrive(ctx, storage.RedriveParams{Queue: q, Limit: 1})
	require.NoError(t, err)
	require.Equal(t, 1, rr.Moved)
	w.dead, w.ready, w.red = 1, 1, 1
	checkQ(t, n.page(), q, w, "redrive")

	rr, err = c.PurgeDead(ctx, storage.RedriveParams{Queue: q})
	require.NoError(t, err)
	require.Equal(t, 1, rr.Moved)
	w.dead, w.purged = 0, 1
	checkQ(t, n.page(), q, w, "dlq purge")

	np, err := c.Purge(ctx, q)
	require.NoError(t, err)
	require.Equal(t, 1, np)
	w.ready, w.purged = 0, 2
	checkQ(t, n.page(), q, w, "purge")

	_, err = c.DeleteQueue(ctx, q, false)
	require.NoError(t, err)
	page := n.page()
	require.Equal(t, -1.0, num(t, page, items(q, "enqueued")), "deleted queue's series gone")
	require.Equal(t, 0.0, num(t, page, "leaseq_queues"))

	_, err = c.Enqueue(ctx, q, []storage.EnqueueItem{{Payload: []byte("again")}})
	require.NoError(t, err)
	checkQ(t, n.page(), q, wantQ{ready: 1, enq: 1}, "re-created queue")
}

// TestMetrics_DeliveredNeverDecreases (found by review, session 69;
// failed before its fix): leaseq_queue_items_total is a Prometheus
// counter ("lifetime item events"; storage.QueueStats: "they only
// increase"), but an undelivered nack, which any client may send (and the
// Go client sends for an abandoned poll), took the delivered count back
// down.
func TestMetrics_DeliveredNeverDecreases(t *testing.T) {
	clk := newMock()
	n := startMetricsNode(t, filepath.Join(t.TempDir(), "data"), clk, "--sync", "none")
	ctx := context.Background()
	q := "jobs"
	_, err := n.c.Enqueue(ctx, q, []storage.EnqueueItem{{Payload: []byte("a")}})
	require.NoError(t, err)
	res, err := n.c.Poll(ctx, q, 1, 30*time.Second, 0)
	require.NoError(t, err)
	require.Len(t, res.Items, 1)
	before := num(t, n.page(), items(q, "delivered"))
	require.Equal(t, 1.0, before)

	f, release := n.c.Queue().Nack(ctx, func(p schema.Queue_nack_Params) error {
		if err := p.SetQueue(q); err != nil {
			return err
		}
		if err := p.SetLease(res.Lease[:]); err != nil {
			return err
		}
		p.SetUndelivered(true)
		l, err := p.NewIds(1)
		if err != nil {
			return err
		}
		return l.Set(0, res.Items[0].ID[:])
	})
	defer release()
	r, err := f.Struct()
	require.NoError(t, err)
	st, err := r.Status()
	require.NoError(t, err)
	require.Equal(t, schema.ErrorCode_none, st.Code())

	after := num(t, n.page(), items(q, "delivered"))
	require.GreaterOrEqual(t, after, before, "counter leaseq_queue_items_total{event=delivered} went down: %v -> %v", before, after)
}

// TestMetrics_OtherBucketNeverDecreases (found by review, session 69;
// failed before its fix): past --metrics-max-queues the queues are summed
// under queue="(other)", whose leaseq_queue_items_total series is exported
// as a counter. It must not go down, yet deleting a queue of the sum (or a
// queue ranking into the top) dropped its events from the sum.
func TestMetrics_OtherBucketNeverDecreases(t *testing.T) {
	clk := newMock()
	n := startMetricsNode(t, filepath.Join(t.TempDir(), "data"), clk, "--sync", "none", "--metrics-max-queues", "1")
	ctx := context.Background()
	enq := func(q string, k int) {
		for range k {
			_, err := n.c.Enqueue(ctx, q, []storage.EnqueueItem{{Payload: []byte("x")}})
			require.NoError(t, err)
		}
	}
	enq("big", 10)
	enq("b", 2)
	enq("c", 3)
	page := n.page()
	require.Equal(t, 3.0, num(t, page, "leaseq_queues"))
	require.Equal(t, 10.0, num(t, page, items("big", "enqueued")))
	other := items(otherQueues, "enqueued")
	before := num(t, page, other)
	require.Equal(t, 5.0, before)

	// Drain and delete queue c: its lifetime events leave the sum.
	_, err := n.c.DeleteQueue(ctx, "c", true)
	require.NoError(t, err)
	after := num(t, n.page(), other)
	require.GreaterOrEqual(t, after, before, "counter %s went down: %v -> %v", other, before, after)
}

// TestMetrics_ErrorCountedUnderOp: a refused call counts as an
// error of its own op only.
func TestMetrics_ErrorCountedUnderOp(t *testing.T) {
	clk := newMock()
	n := startMetricsNode(t, filepath.Join(t.TempDir(), "data"), clk, "--sync", "none")
	ctx := context.Background()
	_, err := n.c.Poll(ctx, "q", 1, time.Millisecond, 0) // lease below --min-lease
	require.Error(t, err)
	_, err = n.c.Extend(ctx, "q", storage.LeaseID{1}, time.Minute) // unknown lease
	require.Error(t, err)
	_, err = n.c.Enqueue(ctx, "q", []storage.EnqueueItem{{Payload: []byte("a")}})
	require.NoError(t, err)
	page := n.page()
	for op, want := range map[string][2]float64{"poll": {1, 1}, "extend": {1, 1}, "enqueue": {1, 0}, "ack": {0, 0}} {
		require.Equal(t, want[0], num(t, page, fmt.Sprintf(`leaseq_rpc_requests_total{op=%q}`, op)), op)
		require.Equal(t, want[1], num(t, page, fmt.Sprintf(`leaseq_rpc_request_errors_total{op=%q}`, op)), op)
	}
}

// TestMetrics_ClaimsAhead: with --sync=always an ack that ends its
// lease claims the next batch; /metrics shows no trace of it until a poll
// takes it, and the claim ahead is counted once.
func TestMetrics_ClaimsAhead(t *testing.T) {
	clk := newMock()
	data := filepath.Join(t.TempDir(), "data")
	n := startMetricsNode(t, data, clk, "--sync", "always")
	ctx := context.Background()
	q := "jobs"
	var batch []storage.EnqueueItem
	for i := range 10 {
		batch = append(batch, storage.EnqueueItem{Payload: []byte{byte(i)}})
	}
	_, err := n.c.Enqueue(ctx, q, batch)
	require.NoError(t, err)
	res, err := n.c.Poll(ctx, q, 2, 30*time.Second, 0)
	require.NoError(t, err)
	_, err = n.c.Ack(ctx, q, res.Lease, []storage.ItemID{res.Items[0].ID, res.Items[1].ID})
	require.NoError(t, err)
	page := n.page()
	require.Equal(t, 1.0, num(t, page, `leaseq_store_prefetch_batches_total{outcome="claimed"}`), "an ack claimed ahead")
	checkQ(t, page, q, wantQ{ready: 8, enq: 10, delivered: 2, acked: 2}, "ack claiming ahead")
	require.Greater(t, num(t, page, "leaseq_store_sync_commits_total"), 0.0)
	require.Greater(t, num(t, page, "leaseq_store_wal_fsync_seconds_count"), 0.0)

	res, err = n.c.Poll(ctx, q, 2, 30*time.Second, 0)
	require.NoError(t, err)
	require.Len(t, res.Items, 2)
	page = n.page()
	require.Equal(t, 1.0, num(t, page, `leaseq_store_prefetch_batches_total{outcome="taken"}`))
	checkQ(t, page, q, wantQ{ready: 6, inflight: 2, leases: 1, enq: 10, delivered: 4, acked: 2}, "poll taking the batch")

	// Another ack claims ahead; Close gives it back; the restarted node
	// counts from the persisted counters.
	_, err = n.c.Ack(ctx, q, res.Lease, []storage.ItemID{res.Items[0].ID, res.Items[1].ID})
	require.NoError(t, err)
	page = n.page()
	require.Equal(t, 2.0, num(t, page, `leaseq_store_prefetch_batches_total{outcome="claimed"}`))
	want := wantQ{ready: 6, enq: 10, delivered: 4, acked: 4}
	checkQ(t, page, q, want, "second ack")
	n.stop()
	n = startMetricsNode(t, data, clk, "--sync", "none")
	checkQ(t, n.page(), q, want, "restart")
	require.Zero(t, num(t, n.page(), "leaseq_store_sync_commits_total"), "--sync=none waits for no fsync")
}
