package rpc

// From a review (session 69; nothing found): the lean engine's reader
// holds the store's fsyncs
// (storage.SyncHolder) while it hands over the calls of one read. These
// tests check, on a real RocksDB store with SyncAlways behind the lean
// engine over real sockets, that no call the reader runs waits for an
// fsync its own hold keeps back, and that every way a reader stops
// releases its hold (a leaked hold stalls every asynchronous durable call
// of the node).

import (
	"context"
	"encoding/binary"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// rvhSetup is setupLeanRocksAlways with mutate applied to the config.
func rvhSetup(t *testing.T, mutate func(*ServerConfig)) (*testBundle, *rocksstore.Store) {
	var rs *rocksstore.Store
	f := rocksWith(rocksstore.Options{Sync: rocksstore.SyncAlways}, &rs)
	b := setup(t, bundleOpts{factory: f, mutate: func(cfg *ServerConfig) {
		cfg.Engine = EngineLean
		if mutate != nil {
			mutate(cfg)
		}
	}})
	return b, rs
}

// rvhQueueArg fills a params struct that has only a queue (pointer 0).
func rvhQueueArg(queue string) func(rpccp.Payload) error {
	return func(p rpccp.Payload) error {
		s, err := capnp.NewStruct(p.Segment(), capnp.ObjectSize{DataSize: 8, PointerCount: 4})
		if err != nil {
			return err
		}
		if err := s.SetText(0, queue); err != nil {
			return err
		}
		return p.SetContent(s.ToPtr())
	}
}

func rvhEnqueueArg(queue string, n int) func(rpccp.Payload) error {
	return func(p rpccp.Payload) error {
		args, err := schema.NewQueue_enqueue_Params(p.Segment())
		if err != nil {
			return err
		}
		if err := args.SetQueue(queue); err != nil {
			return err
		}
		items, err := args.NewItems(int32(n))
		if err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if err := items.At(i).SetPayload([]byte("payload")); err != nil {
				return err
			}
		}
		return p.SetContent(args.ToPtr())
	}
}

// rvhLeaseArg fills ack/nack/extend params (queue, lease, ids; leaseMs)
// with a lease and item id nobody holds.
func rvhSettleArg(method uint16, queue string) func(rpccp.Payload) error {
	return func(p rpccp.Payload) error {
		seg := p.Segment()
		lease := make([]byte, 16)
		lease[0] = 1
		id := make([]byte, 16)
		id[0] = 1
		ids, err := capnp.NewDataList(seg, 1)
		if err != nil {
			return err
		}
		if err := ids.Set(0, id); err != nil {
			return err
		}
		var content capnp.Ptr
		switch method {
		case 2:
			a, err := schema.NewQueue_ack_Params(seg)
			if err != nil {
				return err
			}
			_ = a.SetQueue(queue)
			_ = a.SetLease(lease)
			_ = a.SetIds(ids)
			content = a.ToPtr()
		case 3:
			a, err := schema.NewQueue_nack_Params(seg)
			if err != nil {
				return err
			}
			_ = a.SetQueue(queue)
			_ = a.SetLease(lease)
			_ = a.SetIds(ids)
			content = a.ToPtr()
		case 4:
			a, err := schema.NewQueue_extend_Params(seg)
			if err != nil {
				return err
			}
			_ = a.SetQueue(queue)
			_ = a.SetLease(lease)
			a.SetLeaseMs(60_000)
			content = a.ToPtr()
		}
		return p.SetContent(content)
	}
}

func rvhSubscribeArg(queue string) func(rpccp.Payload) error {
	return func(p rpccp.Payload) error {
		args, err := schema.NewQueue_subscribe_Params(p.Segment())
		if err != nil {
			return err
		}
		if err := args.SetQueue(queue); err != nil {
			return err
		}
		args.SetPrefetch(1)
		args.SetLeaseMs(60_000)
		if err := capnp.Struct(args).SetPtr(1, capnp.NewInterface(p.Segment(), 0).ToPtr()); err != nil {
			return err
		}
		ct, err := p.NewCapTable(1)
		if err != nil {
			return err
		}
		ct.At(0).SetSenderHosted(7)
		return p.SetContent(args.ToPtr())
	}
}

func rvhFinish(t testing.TB, qid uint32) []byte {
	return rpcMessageBytes(t, func(m rpccp.Message) error {
		f, err := m.NewFinish()
		if err != nil {
			return err
		}
		f.SetQuestionId(qid)
		return nil
	})
}

// rvhMix returns one write's worth of pipelined calls, questions
// base..base+n-1 on the bootstrap (question 0), and the questions that
// are answered without waiting (all but the subscribe, which returns
// at once too, and the long poll).
func rvhMix(t testing.TB, base uint32) (buf []byte, answered []uint32) {
	q := base
	add := func(method uint16, params func(rpccp.Payload) error, expect bool) {
		buf = append(buf, pipelinedCall(t, q, 0, method, params)...)
		if expect {
			answered = append(answered, q)
		}
		q++
	}
	add(0, rvhEnqueueArg("mix", 3), true)     // enqueue (async)
	add(5, rvhQueueArg("mix"), true)          // stats (worker)
	add(1, pollParamsRaw("mix", 1), true)     // poll (async)
	add(2, rvhSettleArg(2, "mix"), true)      // ack (async, unknown lease)
	add(4, rvhSettleArg(4, "mix"), true)      // extend (worker, durable)
	add(3, rvhSettleArg(3, "mix"), true)      // nack (worker, durable)
	add(6, nil, true)                         // queues (worker)
	add(7, rvhQueueArg("mix"), true)          // peek (worker)
	add(12, rvhQueueArg("mix"), true)         // getConfig (worker)
	add(15, nil, true)                        // nodeInfo (reader)
	add(9, rvhQueueArg("mix"), true)          // deadList (worker)
	add(8, rvhQueueArg("mix-purge"), true)    // purge (worker, durable)
	add(16, rvhQueueArg("mix-gone"), true)    // deleteQueue (worker, durable)
	add(14, rvhSubscribeArg("mix-sub"), true) // subscribe (reader)
	add(0, rvhEnqueueArg("", 1), true)        // enqueue failing validation
	add(1, pollParamsRaw("mix", 0), true)     // poll failing validation
	add(0, rvhEnqueueArg("mix", 2), true)     // enqueue (async)
	add(99, nil, true)                        // unknown method
	add(5, rvhQueueArg("mix"), true)          // stats again
	add(0, rvhEnqueueArg("mix", 1), true)     // enqueue (async)
	return buf, answered
}

// rvhDurableOK checks that an asynchronous durable enqueue still
// completes: from another connection of the server (when c is not nil)
// and straight on the store's asynchronous call, which never fsyncs
// inline, so a leaked hold stops it.
func rvhDurableOK(t *testing.T, c *Client, rs *rocksstore.Store, what string) {
	t.Helper()
	if c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.Enqueue(ctx, "probe", payloads(1, 8))
		cancel()
		require.NoError(t, err, "%s: another connection's durable enqueue did not complete", what)
	}
	done := make(chan error, 1)
	rs.EnqueueAsync(context.Background(), storage.EnqueueParams{Queue: "probe-store", Now: testStart,
		Items: []storage.EnqueueItem{{Payload: []byte("x")}}}, func(_ []storage.EnqueueResult, err error) { done <- err })
	select {
	case err := <-done:
		require.NoError(t, err, what)
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: an asynchronous durable enqueue waits for an fsync: a hold leaked", what)
	}
}

// rvhReadReturns reads conn until every question of want has its Return.
func rvhReadReturns(t *testing.T, conn net.Conn, dec *capnp.Decoder, want []uint32) {
	t.Helper()
	left := make(map[uint32]bool, len(want))
	for _, q := range want {
		left[q] = true
	}
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	for len(left) > 0 {
		msg, err := dec.Decode()
		require.NoError(t, err, "answers still missing: %v", left)
		m, err := rpccp.ReadRootMessage(msg)
		require.NoError(t, err)
		if m.Which() == rpccp.Message_Which_return {
			ret, err := m.Return()
			require.NoError(t, err)
			delete(left, ret.AnswerId())
		}
	}
}

// TestLeanHolds_PipelinedMixInOneRead: the lead "a reader that
// holds the fsyncs runs a synchronous store call itself" — a mix of
// every Queue method (async enqueue/poll/ack, worker-run
// stats/extend/nack/peek/purge/deleteQueue, reader-run
// nodeInfo/subscribe, calls that fail validation) in one write, so that
// one read carries them and the reader holds the fsyncs while it hands
// them over. Every call must be answered, and another connection's
// durable calls complete meanwhile.
func TestLeanHolds_PipelinedMixInOneRead(t *testing.T) {
	t.Parallel()
	b, rs := rvhSetup(t, nil)
	other := b.dial()
	ctx := ctxT(t)
	_, err := other.Enqueue(ctx, "mix", payloads(50, 8))
	require.NoError(t, err)

	// Concurrent durable traffic from another connection throughout.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := other.Enqueue(cctx, "bg", payloads(1, 8))
			cancel()
			if err != nil {
				select {
				case errs <- err:
				default:
				}
				return
			}
		}
	}()

	for round := 0; round < 10; round++ {
		conn := rawConn(t, b)
		dec := capnp.NewDecoder(conn)
		mix, want := rvhMix(t, 1)
		buf := slices.Concat(bootstrapMsg(t), mix)
		require.Less(t, len(buf), leanReadBuffer)
		_, err := conn.Write(buf)
		require.NoError(t, err)
		rvhReadReturns(t, conn, dec, append([]uint32{0}, want...))
		_ = conn.Close()
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatalf("background durable enqueue: %v", err)
	default:
	}
	rvhDurableOK(t, other, rs, "after the mixes")
}

// TestLeanHolds_SyncCallsOnWorkersWhileReaderHolds: many
// connections send bursts of durable calls the store runs synchronously
// (nack, extend, purge on workers) together with asynchronous ones in one
// write each: the workers' calls wait for holds other readers (and their
// own) keep, which must end when each reader has handed over its read.
func TestLeanHolds_SyncCallsOnWorkersWhileReaderHolds(t *testing.T) {
	t.Parallel()
	b, rs := rvhSetup(t, nil)
	other := b.dial()
	var wg sync.WaitGroup
	failures := make(chan string, 8)
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := net.Dial("tcp", b.addr)
			if err != nil {
				failures <- err.Error()
				return
			}
			defer conn.Close()
			dec := capnp.NewDecoder(conn)
			if _, err := conn.Write(bootstrapMsg(t)); err != nil {
				failures <- err.Error()
				return
			}
			q := uint32(1)
			for round := 0; round < 15; round++ {
				var buf []byte
				var want []uint32
				for k := 0; k < 8; k++ {
					var p func(rpccp.Payload) error
					var method uint16
					switch k % 4 {
					case 0:
						method, p = 0, rvhEnqueueArg("w", 1)
					case 1:
						method, p = 3, rvhSettleArg(3, "w")
					case 2:
						method, p = 4, rvhSettleArg(4, "w")
					case 3:
						method, p = 2, rvhSettleArg(2, "w")
					}
					buf = append(buf, pipelinedCall(t, q, 0, method, p)...)
					want = append(want, q)
					q++
				}
				if _, err := conn.Write(buf); err != nil {
					failures <- err.Error()
					return
				}
				left := map[uint32]bool{}
				for _, w := range want {
					left[w] = true
				}
				_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
				for len(left) > 0 {
					msg, err := dec.Decode()
					if err != nil {
						failures <- "answers missing: " + err.Error()
						return
					}
					m, err := rpccp.ReadRootMessage(msg)
					if err == nil && m.Which() == rpccp.Message_Which_return {
						ret, _ := m.Return()
						delete(left, ret.AnswerId())
					}
				}
				var fin []byte
				for _, w := range want {
					fin = append(fin, rvhFinish(t, w)...)
				}
				if _, err := conn.Write(fin); err != nil {
					failures <- err.Error()
					return
				}
			}
		}()
	}
	wg.Wait()
	close(failures)
	for f := range failures {
		t.Fatal(f)
	}
	rvhDurableOK(t, other, rs, "after the bursts")
}

// TestLeanHolds_HoldReleasedWhenReaderEnds: a read that carries
// calls (so the reader takes the hold) followed by something that ends
// the connection (a frame that fails to decode, a protocol error, a
// connection closed mid-frame, an Abort, a frame over the size limit, a
// Finish of an unknown question, a question id in use, too many open
// questions): the reader must release its hold, or every asynchronous
// durable call of the node stalls.
func TestLeanHolds_HoldReleasedWhenReaderEnds(t *testing.T) {
	t.Parallel()
	b, rs := rvhSetup(t, func(c *ServerConfig) {
		c.MaxMessageBytes = 16 << 10
		c.maxOpenQuestions = 4
	})
	other := b.dial()
	enq := func(qid uint32) []byte { return pipelinedCall(t, qid, 0, 0, rvhEnqueueArg("end", 1)) }
	lead := func() []byte { return slices.Concat(bootstrapMsg(t), enq(1), enq(2)) }
	tooManySegs := binary.LittleEndian.AppendUint32(nil, maxFrameSegments+1)
	tooManySegs = append(tooManySegs, 0, 0, 0, 0)
	oversize := binary.LittleEndian.AppendUint32(nil, 0)
	oversize = binary.LittleEndian.AppendUint32(oversize, (64<<10)/8)
	abort := rpcMessageBytes(t, func(m rpccp.Message) error {
		ab, err := m.NewAbort()
		if err != nil {
			return err
		}
		return ab.SetReason("bye")
	})
	notAStruct := func() []byte {
		msg, seg, _ := capnp.NewMessage(capnp.SingleSegment(nil))
		l, _ := capnp.NewTextList(seg, 1)
		_ = msg.SetRoot(l.ToPtr())
		out, _ := msg.Marshal()
		return out
	}()
	cases := []struct {
		name  string
		tail  []byte
		close bool // the client closes after the write
	}{
		{"too many segments", tooManySegs, false},
		{"over the size limit", oversize, false},
		{"not a struct root", notAStruct, false},
		{"abort", abort, false},
		{"finish of unknown question", rvhFinish(t, 77), false},
		{"question id in use", enq(1), false},
		{"pipelined on its own answer", pipelinedCall(t, 9, 9, 0, rvhEnqueueArg("end", 1)), false},
		{"too many open questions", slices.Concat(enq(3), enq(4), enq(5), enq(6)), false},
		{"closed mid-frame", enq(3)[:20], true},
		{"closed after whole frames", enq(3), true},
	}
	for _, tc := range cases {
		for round := 0; round < 5; round++ {
			conn, err := net.Dial("tcp", b.addr)
			require.NoError(t, err)
			_, err = conn.Write(slices.Concat(lead(), tc.tail, enq(20)))
			require.NoError(t, err)
			if tc.close {
				_ = conn.Close()
			} else {
				requireClosedByServer(t, conn)
				_ = conn.Close()
			}
			rvhDurableOK(t, other, rs, tc.name)
		}
	}
}

// TestLeanHolds_HoldReleasedWhenFlowWaits: a node whose in-flight
// budget is smaller than one read's calls: the reader, holding the
// fsyncs for the calls it already handed over, waits for budget that
// only their answers (after an fsync) give back. It must release the
// hold before it waits.
func TestLeanHolds_HoldReleasedWhenFlowWaits(t *testing.T) {
	t.Parallel()
	b, rs := rvhSetup(t, func(c *ServerConfig) {
		c.MaxInflightBytes = 2 << 10
		c.ConnFlowLimitBytes = 1 << 10
		c.ConnReplyLimitBytes = 1 << 10
	})
	other := b.dial()
	conn := rawConn(t, b)
	dec := capnp.NewDecoder(conn)
	big := func(qid uint32) []byte {
		return pipelinedCall(t, qid, 0, 0, func(p rpccp.Payload) error {
			args, err := schema.NewQueue_enqueue_Params(p.Segment())
			if err != nil {
				return err
			}
			_ = args.SetQueue("flow")
			items, err := args.NewItems(1)
			if err != nil {
				return err
			}
			if err := items.At(0).SetPayload(make([]byte, 300)); err != nil {
				return err
			}
			return p.SetContent(args.ToPtr())
		})
	}
	buf := bootstrapMsg(t)
	var want []uint32
	for q := uint32(1); q <= 40; q++ {
		buf = append(buf, big(q)...)
		want = append(want, q)
	}
	_, err := conn.Write(buf)
	require.NoError(t, err)
	rvhReadReturns(t, conn, dec, want)
	rvhDurableOK(t, other, rs, "after the flow waits")
}

// TestLeanHolds_HoldReleasedAtStop: Stop while connections are
// sending bursts of calls: after Stop the store's asynchronous durable
// calls still complete (no reader left its hold taken).
func TestLeanHolds_HoldReleasedAtStop(t *testing.T) {
	t.Parallel()
	b, rs := rvhSetup(t, nil)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		conn, err := net.Dial("tcp", b.addr)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		_, err = conn.Write(bootstrapMsg(t))
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			q := uint32(1)
			for i := 0; i < 200; i++ {
				var buf []byte
				for k := 0; k < 6; k++ {
					buf = append(buf, pipelinedCall(t, q, 0, 0, rvhEnqueueArg("stop", 1))...)
					buf = append(buf, rvhFinish(t, q)...)
					q++
				}
				_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
				if _, err := conn.Write(buf); err != nil {
					return
				}
			}
		}()
		go func() { _, _ = capnp.NewDecoder(conn).Decode(); _ = drain(conn) }()
	}
	stopped := make(chan struct{})
	go func() { b.srv.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("Stop did not return")
	}
	wg.Wait()
	rvhDurableOK(t, nil, rs, "after Stop")
}

func drain(conn net.Conn) error {
	buf := make([]byte, 64<<10)
	for {
		if _, err := conn.Read(buf); err != nil {
			return err
		}
	}
}
