package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// settleReport is one OnSettleFailed or OnBackoffNack call.
type settleReport struct {
	id    storage.ItemID
	ack   bool
	delay time.Duration
	err   error
}

// settleRecorder collects what Consume reports through its hooks.
type settleRecorder struct {
	mu      sync.Mutex
	failed  []settleReport // OnSettleFailed
	backoff []settleReport // OnBackoffNack
}

func (r *settleRecorder) hook(cfg *ConsumerConfig) {
	cfg.OnSettleFailed = func(id storage.ItemID, ack bool, err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.failed = append(r.failed, settleReport{id: id, ack: ack, err: err})
	}
	cfg.OnBackoffNack = func(id storage.ItemID, delay time.Duration, err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.backoff = append(r.backoff, settleReport{id: id, delay: delay, err: err})
	}
}

func (r *settleRecorder) failures() []settleReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]settleReport(nil), r.failed...)
}

func (r *settleRecorder) backoffs() []settleReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]settleReport(nil), r.backoff...)
}

// TestConsume_SettleFailedReported: every ack or nack the node did not
// take is reported to OnSettleFailed, whether the node answered a code
// other than ok or the call failed.
func TestConsume_SettleFailedReported(t *testing.T) {
	t.Parallel()

	t.Run("CodeNotOK", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ctx := ctxT(t)
		res, err := c.Enqueue(ctx, "q", []storage.EnqueueItem{{Payload: []byte("ok")}, {Payload: []byte("fail")}})
		require.NoError(t, err)
		var rec settleRecorder
		cfg := ConsumerConfig{
			Queue: "q", Batch: 2, MaxItems: 2, Lease: time.Minute, Clock: b.clock, Logger: rpctest.Logger(t),
			// Each handler acks its own item first, so that Consume's ack
			// or nack finds it gone.
			Handler: func(hctx context.Context, it storage.Item) error {
				hl, _ := HandlerLeaseFrom(hctx)
				codes, err := c.Ack(hctx, "q", hl.Lease, []storage.ItemID{it.ID})
				require.NoError(t, err)
				require.Equal(t, []storage.Code{storage.CodeOK}, codes)
				if string(it.Payload) == "fail" {
					return errors.New("boom")
				}
				return nil
			},
		}
		rec.hook(&cfg)
		require.NoError(t, c.Consume(ctx, cfg))
		got := rec.failures()
		require.Len(t, got, 2)
		byID := map[storage.ItemID]settleReport{got[0].id: got[0], got[1].id: got[1]}
		require.True(t, byID[res[0].ID].ack, "the success's ack")
		require.ErrorIs(t, byID[res[0].ID].err, storage.ErrNotFound)
		require.EqualError(t, byID[res[0].ID].err, "the node answered not_found")
		require.False(t, byID[res[1].ID].ack, "the failure's nack")
		require.ErrorIs(t, byID[res[1].ID].err, storage.ErrNotFound)
		require.Empty(t, rec.backoffs())
	})

	t.Run("CallFails", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		c := b.dial()
		ctx := ctxT(t)
		res, err := c.Enqueue(ctx, "q", payloads(2, 8))
		require.NoError(t, err)
		started, release := make(chan struct{}), make(chan struct{})
		var rec settleRecorder
		cfg := ConsumerConfig{
			Queue: "q", Batch: 2, Lease: time.Minute, Clock: b.clock, Logger: rpctest.Logger(t),
			Handler: func(_ context.Context, it storage.Item) error {
				if it.ID == res[0].ID {
					close(started)
					<-release
				}
				return nil
			},
		}
		rec.hook(&cfg)
		r := startConsume(c, cfg)
		<-started
		b.srv.Stop() // gone before the handlers end: the acks cannot be made
		close(release)
		select {
		case err := <-r.done:
			require.Error(t, err, "the poll beside the ack failed")
		case <-time.After(10 * time.Second):
			t.Fatal("Consume did not notice the lost connection")
		}
		r.cancel()
		got := rec.failures()
		require.Len(t, got, 2, "each item of the batch, once")
		require.ElementsMatch(t, []storage.ItemID{res[0].ID, res[1].ID}, []storage.ItemID{got[0].id, got[1].id})
		for _, f := range got {
			require.True(t, f.ack)
			require.Error(t, f.err)
		}
	})
}

// TestConsume_LostLeaseNotNacked: a handler that fails after Consume
// found its lease lost (here, its ctx cancelled for it) is not nacked,
// as the node delivers the item again, and is not reported; a success of
// the same batch after the loss is still acked, and that ack's refusal is
// reported.
func TestConsume_LostLeaseNotNacked(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	c := b.dial()
	ctx := ctxT(t)
	res, err := c.Enqueue(ctx, "q", []storage.EnqueueItem{{Payload: []byte("hang")}, {Payload: []byte("ok")}})
	require.NoError(t, err)
	started := make(chan struct{})
	lost := make(chan struct{})
	var lostOnce sync.Once
	// The consumer's extend ticker runs on a clock of its own: on the
	// node's, every jump of the node's time would step through the
	// ticker's periods (the mock fires each in turn), and an extend
	// answered within the step's real millisecond would keep the lease
	// alive for good (the test failed so on a fast machine).
	extendClock := clock.NewMock()
	var rec settleRecorder
	cfg := ConsumerConfig{
		Queue: "q", Batch: 2, Lease: 3 * time.Second, Clock: extendClock, Logger: rpctest.Logger(t),
		OnExtend: func(_ storage.LeaseID, _ time.Time, err error) {
			if errors.Is(err, storage.ErrLeaseExpired) || errors.Is(err, storage.ErrLeaseMismatch) {
				lostOnce.Do(func() { close(lost) })
			}
		},
		Handler: func(hctx context.Context, it storage.Item) error {
			if it.Attempts > 1 {
				return nil // the redelivery after the loss
			}
			if string(it.Payload) == "hang" {
				close(started)
				<-hctx.Done()
				return hctx.Err()
			}
			return nil
		},
	}
	rec.hook(&cfg)
	r := startConsume(c, cfg)
	<-started // the extend ticker is armed before the handler runs
	// The node's time jumps past the lease, then the extend ticker fires:
	// that extend finds the lease gone.
	b.clock.Add(10 * time.Second)
	rpctest.Eventually(t, 30*time.Second, func() bool {
		select {
		case <-lost:
			return true
		default:
			extendClock.Add(time.Second)
			time.Sleep(5 * time.Millisecond)
			return false
		}
	}, "no extend found the lease lost")
	// The success's ack rides the next poll, which waits for items: its
	// answer is read once the poll ends.
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Ops[OpAck].Count > 0 }, "the success was not acked")
	require.NoError(t, r.stop(t))
	got := rec.failures()
	require.Len(t, got, 1, "only the success's ack: %+v", got)
	require.Equal(t, res[1].ID, got[0].id)
	require.True(t, got[0].ack)
	require.True(t, errors.Is(got[0].err, storage.ErrLeaseExpired) || errors.Is(got[0].err, storage.ErrLeaseMismatch), "%v", got[0].err)
	require.Zero(t, b.srv.Metrics().Ops[OpNack].Count, "the lost item was not nacked")
}

// TestConsume_RefusedNackDelayFallsBackToBackoff: a nack delay the node
// refuses (over its MaxDelay) gives way to the queue's backoff, so the
// item is nacked with its reason all the same; each such item is
// reported to OnBackoffNack, the first refusal is logged once, and a
// delay at least as long as one refused goes with the backoff straight
// away.
func TestConsume_RefusedNackDelayFallsBackToBackoff(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{mutate: func(cfg *ServerConfig) { cfg.Limits = storage.Limits{MaxDelay: time.Hour} }})
	c := b.dial()
	ctx := ctxT(t)
	res, err := c.Enqueue(ctx, "q", []storage.EnqueueItem{
		{Payload: []byte("gone")}, {Payload: []byte("longer")}, {Payload: []byte("shorter")}, {Payload: []byte("fits")},
	})
	require.NoError(t, err)
	gone, longer, shorter, fits := res[0].ID, res[1].ID, res[2].ID, res[3].ID
	var logs lockedBuf
	nackDelay := 150 * time.Minute
	var rec settleRecorder
	cfg := ConsumerConfig{
		Queue: "q", Batch: 4, MaxItems: 4, Lease: time.Minute, Clock: b.clock, NackDelay: &nackDelay,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		// One batch, handled in order.
		Handler: func(hctx context.Context, it storage.Item) error {
			switch string(it.Payload) {
			case "gone":
				// Acked here: the nack with the backoff that follows the
				// refusal finds it gone, a failure of its own.
				hl, _ := HandlerLeaseFrom(hctx)
				_, err := c.Ack(hctx, "q", hl.Lease, []storage.ItemID{it.ID})
				require.NoError(t, err)
				return RetryAfter(3*time.Hour, errors.New("gone later"))
			case "longer":
				return RetryAfter(4*time.Hour, errors.New("much later"))
			case "shorter":
				return errors.New("broken") // NackDelay, 2.5 h
			}
			return RetryAfter(30*time.Minute, errors.New("soon"))
		},
	}
	rec.hook(&cfg)
	require.NoError(t, c.Consume(ctx, cfg))

	got := rec.backoffs()
	require.Len(t, got, 3)
	want := []settleReport{{id: gone, delay: 3 * time.Hour}, {id: longer, delay: 4 * time.Hour}, {id: shorter, delay: nackDelay}}
	for i, w := range want {
		require.Equal(t, w.id, got[i].id, "report %d", i)
		require.Equal(t, w.delay, got[i].delay, "report %d", i)
		require.ErrorIs(t, got[i].err, storage.ErrInvalidArgument, "report %d", i)
	}
	failed := rec.failures()
	require.Len(t, failed, 1, "only the item acked by its handler: %+v", failed)
	require.Equal(t, gone, failed[0].id)
	require.False(t, failed[0].ack)
	require.ErrorIs(t, failed[0].err, storage.ErrNotFound)

	m := b.srv.Metrics().Ops[OpNack]
	// gone: refused, then with the backoff; longer: with the backoff at
	// once (3 h was refused); shorter: refused (2.5 h had not been), then
	// with the backoff; fits: once.
	require.Equal(t, uint64(6), m.Count)
	require.Equal(t, uint64(2), m.Errors)
	require.Equal(t, 1, logs.count("the node refused a nack delay"), "warned once:\n%s", logs.b.String())

	peek, err := c.Peek(ctx, storage.PeekParams{Queue: "q"})
	require.NoError(t, err)
	require.Len(t, peek, 3)
	items := map[storage.ItemID]storage.Item{}
	for _, it := range peek {
		items[it.ID] = it
	}
	require.Equal(t, "much later", items[longer].LastError)
	require.Equal(t, "broken", items[shorter].LastError)
	for _, id := range []storage.ItemID{longer, shorter} {
		require.False(t, items[id].VisibleAt.After(testStart.Add(storage.DefaultBackoffMax)), "the queue's backoff")
	}
	require.Equal(t, "soon", items[fits].LastError)
	require.Equal(t, testStart.Add(30*time.Minute), items[fits].VisibleAt)
}

// nodeStep is one call a scriptedNode expects, and its answer.
type nodeStep struct {
	method uint16
	// paired: answered only once the next call has come, so a client
	// that waits for this answer before sending the next call hangs.
	paired bool
	reply  func(t *testing.T, params capnp.Ptr, seg *capnp.Segment) (capnp.Ptr, error)
}

// scriptedNode plays a node on conn that answers the calls of steps, in
// order; the ids of each ack are sent on acks. A call out of script
// fails the test and closes conn, so that the client's calls end.
func scriptedNode(t *testing.T, conn net.Conn, steps []nodeStep, acks chan<- []storage.ItemID) {
	defer conn.Close()
	var pending []byte
	next := 0
	nodeLoop(t, conn, func(call rpccp.Call) ([]byte, bool) {
		if next == len(steps) {
			t.Errorf("call of method %d after the script's end", call.MethodId())
			return nil, true
		}
		st := steps[next]
		next++
		if call.MethodId() != st.method {
			t.Errorf("call %d: method %d, want %d", next, call.MethodId(), st.method)
			return nil, true
		}
		p, _ := call.Params()
		params, _ := p.Content()
		if st.method == mAck.id {
			l, _ := schema.Queue_ack_Params(params.Struct()).Ids()
			ids, err := readIDs(l, storage.DefaultLimits)
			if err != nil {
				t.Errorf("ack ids: %v", err)
			}
			acks <- ids
		}
		out := returnBytes(t, call.QuestionId(), func(rp rpccp.Payload) error {
			content, err := st.reply(t, params, rp.Segment())
			if err != nil {
				return err
			}
			return rp.SetContent(content)
		})
		if st.paired {
			pending = out
			return nil, false
		}
		out, pending = append(pending, out...), nil
		return out, false
	})
}

// pollReply answers a poll with ids leased under lease.
func pollReply(lease storage.LeaseID, ids ...storage.ItemID) func(*testing.T, capnp.Ptr, *capnp.Segment) (capnp.Ptr, error) {
	return func(_ *testing.T, _ capnp.Ptr, seg *capnp.Segment) (capnp.Ptr, error) {
		r, err := schema.NewQueue_poll_Results(seg)
		if err != nil {
			return capnp.Ptr{}, err
		}
		if err := r.SetLease(lease[:]); err != nil {
			return capnp.Ptr{}, err
		}
		r.SetExpiresAt(toMs(testStart.Add(time.Minute)))
		l, err := r.NewItems(int32(len(ids)))
		if err != nil {
			return capnp.Ptr{}, err
		}
		for i, id := range ids {
			it := storage.Item{ID: id, Queue: "q", Attempts: 1, EnqueuedAt: testStart, VisibleAt: testStart}
			if err := writeItem(l.At(i), &it); err != nil {
				return capnp.Ptr{}, err
			}
		}
		return r.ToPtr(), nil
	}
}

// ackReply answers an ack with codes.
func ackReply(codes ...storage.Code) func(*testing.T, capnp.Ptr, *capnp.Segment) (capnp.Ptr, error) {
	return func(_ *testing.T, _ capnp.Ptr, seg *capnp.Segment) (capnp.Ptr, error) {
		r, err := schema.NewQueue_ack_Results(seg)
		if err != nil {
			return capnp.Ptr{}, err
		}
		l, err := r.NewCodes(int32(len(codes)))
		if err != nil {
			return capnp.Ptr{}, err
		}
		writeCodes(l, codes)
		return r.ToPtr(), nil
	}
}

// ackUnavailable answers an ack with a failure: its outcome is unknown
// to the client.
func ackUnavailable(_ *testing.T, _ capnp.Ptr, seg *capnp.Segment) (capnp.Ptr, error) {
	r, err := schema.NewQueue_ack_Results(seg)
	if err != nil {
		return capnp.Ptr{}, err
	}
	st, err := r.NewStatus()
	if err != nil {
		return capnp.Ptr{}, err
	}
	st.SetCode(schema.ErrorCode_unavailable)
	return r.ToPtr(), st.SetDetail("the node is busy")
}

// TestConsume_AckRidesTheNextPoll: Consume sends a batch's ack with the
// poll for the next batch, without waiting for the ack's answer (the
// scripted node answers the ack only once the poll came). An ack whose
// outcome is unknown is made again on its own, and only that outcome is
// reported: notFound from it means the first one was applied.
func TestConsume_AckRidesTheNextPoll(t *testing.T) {
	t.Parallel()
	a, b := storage.ItemID{0xa}, storage.ItemID{0xb}
	la, lb := storage.LeaseID{1}, storage.LeaseID{2}
	for _, tc := range []struct {
		name     string
		reAck    storage.Code // the answer to the second ack of a
		reported bool
	}{
		{"ReAckNotFoundIsAcked", storage.CodeNotFound, false},
		{"ReAckOK", storage.CodeOK, false},
		{"ReAckRefusedIsReported", storage.CodeLeaseExpired, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cc, sc := connPair(t, "tcp")
			defer cc.Close()
			defer sc.Close()
			acks := make(chan []storage.ItemID, 8)
			go scriptedNode(t, sc, []nodeStep{
				{method: mPoll.id, reply: pollReply(la, a)},
				{method: mAck.id, paired: true, reply: ackUnavailable}, // a, with the next poll
				{method: mPoll.id, reply: pollReply(lb, b)},
				{method: mAck.id, reply: ackReply(tc.reAck)},       // a again, on its own
				{method: mAck.id, reply: ackReply(storage.CodeOK)}, // b, the last batch's
			}, acks)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			l, err := newLeanClient(ctx, cc, DefaultMaxMessageBytes, DefaultMaxReplyBytes, clock.New())
			require.NoError(t, err)
			c := &Client{lean: l, log: discardLogger(), limit: DefaultMaxMessageBytes, readLimit: DefaultMaxReplyBytes, closed: make(chan struct{})}
			defer c.Close()

			var rec settleRecorder
			cfg := ConsumerConfig{
				Queue: "q", MaxItems: 2, Lease: time.Minute, Clock: clock.NewMock(), Logger: rpctest.Logger(t),
				Handler: func(context.Context, storage.Item) error { return nil },
			}
			rec.hook(&cfg)
			require.NoError(t, c.Consume(ctx, cfg))
			require.NoError(t, ctx.Err(), "Consume ran into the deadline: an ack waited for its answer before the poll was sent")
			var got3 [][]storage.ItemID
			for range 3 {
				select {
				case ids := <-acks:
					got3 = append(got3, ids)
				case <-time.After(5 * time.Second):
					t.Fatalf("acks %v, then no more", got3)
				}
			}
			require.Equal(t, [][]storage.ItemID{{a}, {a}, {b}}, got3)
			got := rec.failures()
			if !tc.reported {
				require.Empty(t, got)
				return
			}
			require.Len(t, got, 1)
			require.Equal(t, a, got[0].id)
			require.True(t, got[0].ack)
			require.ErrorIs(t, got[0].err, storage.ErrLeaseExpired)
		})
	}
}

// extendFailingStore answers every extend with an error that does not
// say the lease is gone (unavailable), or, with hang, not at all until
// the test ends: the node as a consumer sees it when unreachable.
type extendFailingStore struct {
	storage.Store
	hang chan struct{} // nil: fail at once
}

func (s extendFailingStore) ExtendLease(ctx context.Context, p storage.ExtendParams) (time.Time, error) {
	if s.hang != nil {
		<-s.hang
	}
	return time.Time{}, fmt.Errorf("%w: the test's node is unreachable", storage.ErrUnavailable)
}

// TestConsume_UnreachableNodeLosesTheLease: when no extend goes through
// for a whole lease (each fails without saying the lease is gone, or
// never answers), the lease has surely ended on the node, which delivers
// the item again: the handler's ctx is cancelled, as for a lease found
// lost, and its failure is not nacked.
func TestConsume_UnreachableNodeLosesTheLease(t *testing.T) {
	t.Parallel()
	for _, hang := range []bool{false, true} {
		t.Run(fmt.Sprintf("hang=%v", hang), func(t *testing.T) {
			t.Parallel()
			st := extendFailingStore{}
			if hang {
				st.hang = make(chan struct{})
				defer close(st.hang)
			}
			b := setup(t, bundleOpts{factory: storeFactory{"extend-failing", func(t *testing.T) storage.Store {
				st.Store = memFactory().open(t)
				return st
			}}})
			c := b.dial()
			ctx := ctxT(t)
			_, err := c.Enqueue(ctx, "q", payloads(1, 8))
			require.NoError(t, err)
			extendClock := clock.NewMock()
			started, cancelled := make(chan struct{}), make(chan struct{})
			var extends atomic.Int32
			cfg := ConsumerConfig{
				Queue: "q", Lease: 3 * time.Second, Clock: extendClock, Logger: rpctest.Logger(t),
				OnExtend: func(storage.LeaseID, time.Time, error) { extends.Add(1) },
				Handler: func(hctx context.Context, it storage.Item) error {
					close(started)
					<-hctx.Done()
					close(cancelled)
					return hctx.Err()
				},
			}
			r := startConsume(c, cfg)
			<-started
			// Short of a whole lease the handler runs on.
			for i := range int32(2) {
				extendClock.Add(time.Second)
				if !hang {
					rpctest.Eventually(t, 10*time.Second, func() bool { return extends.Load() > i }, "no extend at the tick")
				}
			}
			extendClock.Add(999 * time.Millisecond)
			select {
			case <-cancelled:
				t.Fatal("the handler was cancelled before a whole lease passed without an extend")
			case <-time.After(50 * time.Millisecond):
			}
			extendClock.Add(time.Millisecond)
			select {
			case <-cancelled:
			case <-time.After(10 * time.Second):
				t.Fatal("the handler ran on a whole lease after the last extend that went through")
			}
			require.NoError(t, r.stop(t))
			require.Zero(t, b.srv.Metrics().Ops[OpNack].Count, "the item of the lost lease was nacked")
		})
	}
}

// ackHangingStore never answers an ack until the test ends: a node that
// has stopped answering (stalled disk, partition) as a consumer sees it.
type ackHangingStore struct {
	storage.Store
	hang chan struct{}
}

func (s ackHangingStore) Ack(ctx context.Context, p storage.AckParams) ([]storage.Code, error) {
	<-s.hang
	return nil, fmt.Errorf("%w: the test's node is unreachable", storage.ErrUnavailable)
}

// TestConsume_DrainGivesUpAnAckPastTheLease: Consume's drain finishes
// though the node never answers its ack: once a whole Lease has passed
// after the item's lease was last set, the ack could only be refused, and
// it is given up (found by review: the drain waited for its answer without
// bound, so Consume never returned after its ctx was cancelled).
func TestConsume_DrainGivesUpAnAckPastTheLease(t *testing.T) {
	t.Parallel()
	st := ackHangingStore{hang: make(chan struct{})}
	b := setup(t, bundleOpts{factory: storeFactory{"ack-hanging", func(t *testing.T) storage.Store {
		st.Store = memFactory().open(t)
		return st
	}}})
	t.Cleanup(func() { close(st.hang) }) // before the server stops
	c := b.dial()
	ctx := ctxT(t)
	_, err := c.Enqueue(ctx, "q", payloads(1, 8))
	require.NoError(t, err)
	cClock := clock.NewMock()
	handled := make(chan struct{})
	cfg := ConsumerConfig{
		Queue: "q", Lease: 3 * time.Second, Wait: time.Second, Clock: cClock, Logger: rpctest.Logger(t),
		Handler: func(context.Context, storage.Item) error { close(handled); return nil },
	}
	cctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Consume(cctx, cfg) }()
	<-handled
	time.Sleep(200 * time.Millisecond) // the ack (with the next poll) is sent
	cancel()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case err := <-done:
			require.NoError(t, err)
			return
		case <-deadline:
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			for _, g := range strings.Split(string(buf), "\n\n") {
				if strings.Contains(g, "consumer).loop") {
					t.Log(g)
				}
			}
			t.Fatal("Consume did not return after cancel: its drain waits for an ack the node never answers, long past the lease")
		case <-time.After(50 * time.Millisecond):
			cClock.Add(time.Second) // many whole leases pass
		}
	}
}
