package rpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// The lean engine's wire handling against unusual or hostile clients,
// from a review (session 69): every test names the lean engine itself.

var leanOnly = func(c *ServerConfig) { c.Engine = EngineLean }

// settledGoroutines returns a check that the goroutine count settles back
// to at most what it is now (plus slack).
func settledGoroutines(t *testing.T) func() {
	t.Helper()
	before := runtime.NumGoroutine()
	return func() {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for runtime.NumGoroutine() > before+2 {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20)
				n := runtime.Stack(buf, true)
				t.Fatalf("goroutine leak: %d running, %d before:\n%s", runtime.NumGoroutine(), before, buf[:n])
			}
			runtime.Gosched()
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// provideBytes is a framed level-2 Provide message carrying n bytes of
// data in its recipient: the lean server answers it with an Unimplemented
// message that echoes it whole.
func provideBytes(t testing.TB, qid uint32, n int) []byte {
	return rpcMessageBytes(t, func(m rpccp.Message) error {
		p, err := m.NewProvide()
		if err != nil {
			return err
		}
		p.SetQuestionId(qid)
		d, err := capnp.NewData(p.Segment(), bytes.Repeat([]byte{0x5a}, n))
		if err != nil {
			return err
		}
		return p.SetRecipient(d.ToPtr())
	})
}

// TestLeanHostile_UnimplementedEchoUnbounded (found by review): a client
// that sends level-2 messages (Provide) and never reads its socket made
// the node build an Unimplemented echo of each one. Those echoes were
// counted by no budget (the flow budget is released once the message is
// handled, the reply gate counted only Queue results), so the reader never
// stopped: the node held every echo in memory until the stall watchdog
// fired (30 s of wall time by default; never on this test's mock clock).
// Every frame now counts in the reply budget, and the reader stops once
// the connection's budget of unwritten replies is reached.
func TestLeanHostile_UnimplementedEchoUnbounded(t *testing.T) {
	const (
		msgSize = 1 << 20
		budget  = 2 << 20
		total   = 96 // messages: 96 MiB
	)
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) {
		c.Engine = EngineLean
		c.ConnFlowLimitBytes = budget
		c.ConnReplyLimitBytes = budget
		c.MaxMessageBytes = 2 * msgSize
	}})
	bystander := b.dial()
	conn := rawConn(t, b)
	frame := provideBytes(t, 7, msgSize)
	var written atomic.Int64 // bytes the server took
	for i := 0; i < total; i++ {
		// A server that stops reading makes this write block: the
		// deadline ends the test's writing then.
		require.NoError(t, conn.SetWriteDeadline(time.Now().Add(3*time.Second)))
		n, err := conn.Write(frame)
		written.Add(int64(n))
		if err != nil {
			break
		}
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("client wrote %d MiB without reading; heap in use %d MiB", written.Load()>>20, ms.HeapInuse>>20)
	// Budget plus what the kernel's socket buffers hold (a few MiB each
	// way on loopback) is all a bounded server can take.
	require.Less(t, written.Load(), int64(40<<20),
		"the server kept reading (and echoing into memory) past its %d byte budget of unwritten replies", budget)
	_, err := bystander.Queues(ctxT(t))
	require.NoError(t, err)
}

// callBytes is a framed Call of Queue method as question qid on import
// boot whose params content is built by params (nil: none).
func rvCallBytes(t testing.TB, qid, boot uint32, method uint16, params func(seg *capnp.Segment) (capnp.Ptr, error)) []byte {
	return rpcMessageBytes(t, func(m rpccp.Message) error {
		c, err := m.NewCall()
		if err != nil {
			return err
		}
		c.SetQuestionId(qid)
		c.SetInterfaceId(schema.Queue_TypeID)
		c.SetMethodId(method)
		tg, err := c.NewTarget()
		if err != nil {
			return err
		}
		tg.SetImportedCap(boot)
		p, err := c.NewParams()
		if err != nil || params == nil {
			return err
		}
		content, err := params(c.Segment())
		if err != nil {
			return err
		}
		return p.SetContent(content)
	})
}

func rvEnqueueParams(queue string, n int) func(seg *capnp.Segment) (capnp.Ptr, error) {
	return func(seg *capnp.Segment) (capnp.Ptr, error) {
		a, err := schema.NewQueue_enqueue_Params(seg)
		if err != nil {
			return capnp.Ptr{}, err
		}
		if err := a.SetQueue(queue); err != nil {
			return capnp.Ptr{}, err
		}
		items, err := a.NewItems(int32(n))
		if err != nil {
			return capnp.Ptr{}, err
		}
		for i := 0; i < n; i++ {
			if err := items.At(i).SetPayload([]byte(fmt.Sprintf("p%d", i))); err != nil {
				return capnp.Ptr{}, err
			}
		}
		return a.ToPtr(), nil
	}
}

func rvPollParams(queue string, max uint32, waitMs uint64) func(seg *capnp.Segment) (capnp.Ptr, error) {
	return func(seg *capnp.Segment) (capnp.Ptr, error) {
		a, err := schema.NewQueue_poll_Params(seg)
		if err != nil {
			return capnp.Ptr{}, err
		}
		a.SetMax(max)
		a.SetWaitMs(waitMs)
		return a.ToPtr(), a.SetQueue(queue)
	}
}

func rvAbortBytes(t testing.TB) []byte {
	return rpcMessageBytes(t, func(m rpccp.Message) error {
		ab, err := m.NewAbort()
		if err != nil {
			return err
		}
		return ab.SetReason("bye")
	})
}

// pollItemsReturn reads the items of a poll's Return.
func rvPollItems(t *testing.T, ret rpccp.Return) int {
	t.Helper()
	require.Equal(t, rpccp.Return_Which_results, ret.Which())
	p, err := ret.Results()
	require.NoError(t, err)
	c, err := p.Content()
	require.NoError(t, err)
	items, err := schema.Queue_poll_Results(c.Struct()).Items()
	require.NoError(t, err)
	return items.Len()
}

// TestLeanHostile_AbortMidStreamCleansUp: a client holding a lease, a
// parked poll and a subscription with a delivery outstanding sends an
// enqueue and an Abort in one piece (the reader holds the store's fsyncs
// between them). Everything of the connection ends: no waiter, no
// subscription, no goroutine; another connection gets every item after
// the leases end, and its durable enqueues complete.
func TestLeanHostile_AbortMidStreamCleansUp(t *testing.T) {
	// The test moves the clock an hour at once: the reply watchdog then
	// looks twice in a row within microseconds, and a write of the
	// bystander's last answer still counted in progress (its writer not
	// yet back from the system call) read as a stalled client.
	calm := func(c *ServerConfig) { c.Engine = EngineLean; c.ReplyStallTimeout = 48 * time.Hour }
	t.Run("RocksSyncAlways", func(t *testing.T) {
		f := rocksWith(rocksstore.Options{Sync: rocksstore.SyncAlways}, nil)
		abortMidStream(t, setup(t, bundleOpts{factory: f, mutate: calm}))
	})
	t.Run("Mem", func(t *testing.T) {
		abortMidStream(t, setup(t, bundleOpts{factory: memFactory(), mutate: calm}))
	})
}

func abortMidStream(t *testing.T, b *testBundle) {
	ctx := ctxT(t)
	c2 := b.dial()
	_, err := c2.Enqueue(ctx, "qa", payloads(3, 8))
	require.NoError(t, err)
	check := settledGoroutines(t)

	r := newRaw(t, b)
	boot := r.bootstrap(0)
	_, err = r.conn.Write(rvCallBytes(t, 1, boot, methodPoll, rvPollParams("qa", 3, 0)))
	require.NoError(t, err)
	require.Equal(t, 3, rvPollItems(t, r.recvReturn(1)))
	r.finish(1, true)
	_, err = r.conn.Write(rvCallBytes(t, 2, boot, methodPoll, rvPollParams("qb", 1, 60_000)))
	require.NoError(t, err)
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
	_, err = r.conn.Write(consumerSubscribe(t, "qc", senderHosted(0)))
	require.NoError(t, err)
	ret := r.recvReturn(1)
	require.Equal(t, rpccp.Return_Which_results, ret.Which())
	_, err = c2.Enqueue(ctx, "qc", payloads(1, 8))
	require.NoError(t, err)
	for { // the deliver call to our consumer
		m := r.recv()
		if m.Which() == rpccp.Message_Which_call {
			break
		}
	}
	require.Equal(t, 1, b.srv.Metrics().Subscriptions)

	_, err = r.conn.Write(append(rvCallBytes(t, 3, boot, 0 /* enqueue */, rvEnqueueParams("qd", 1)), rvAbortBytes(t)...))
	require.NoError(t, err)
	requireClosedByServer(t, r.conn)
	rpctest.Eventually(t, 10*time.Second, func() bool {
		m := b.srv.Metrics()
		return m.ConnsOpen == 1 && m.Waiters == 0 && m.Subscriptions == 0
	})

	// Durable enqueues still complete (no fsync hold left behind); the
	// parked poll is gone, so an item for qb is not claimed by it.
	_, err = c2.Enqueue(ctx, "qb", payloads(1, 8))
	require.NoError(t, err)
	pr, err := c2.Poll(ctx, "qb", 10, time.Minute, 0)
	require.NoError(t, err)
	require.Len(t, pr.Items, 1, "the dead connection's parked poll took the item")

	b.clock.Add(time.Hour) // every lease of the dead connection ends
	_, err = b.store.Sweep(ctx, storage.SweepParams{Now: b.clock.Now(), Limit: 100})
	require.NoError(t, err)
	pr, err = c2.Poll(ctx, "qa", 10, time.Minute, 0)
	require.NoError(t, err)
	require.Len(t, pr.Items, 3)
	pr, err = c2.Poll(ctx, "qc", 10, time.Minute, 0)
	require.NoError(t, err)
	require.Len(t, pr.Items, 1)
	require.NoError(t, c2.Close())
	check()
}

// TestLeanHostile_HeaderOnlyFramesStallOthers (found by review): a client
// that sends a frame header announcing a large message and then nothing
// makes the reader take the node's budget of unanswered bytes for the
// whole size (and Decode allocate it) and wait for the body. With no
// deadline a few such connections (16 headers of 64 MiB take the default
// 1 GiB) took the whole node budget for as long as they stayed open, and
// every other client's calls waited for it. A body that makes no progress
// for FirstMessageTimeout now closes its connection.
func TestLeanHostile_HeaderOnlyFramesStallOthers(t *testing.T) {
	const msgMax = 4 << 20
	b := setup(t, bundleOpts{mutate: func(c *ServerConfig) {
		c.Engine = EngineLean
		c.MaxMessageBytes = msgMax
		c.MaxInflightBytes = 2 * (8 + 0x7fff0*8) // two such headers take it all
	}})
	bystander := b.dial()
	_, err := bystander.Queues(ctxT(t))
	require.NoError(t, err)
	check := settledGoroutines(t)
	var hostile []net.Conn
	for i := 0; i < 2; i++ {
		r := newRaw(t, b)
		r.bootstrap(0)
		hdr := make([]byte, 8)                    // one segment of almost msgMax, never sent
		hdr[4], hdr[5], hdr[6] = 0xf0, 0xff, 0x07 // 0x7fff0 words
		_, err := r.conn.Write(hdr)
		require.NoError(t, err)
		hostile = append(hostile, r.conn)
	}
	// Both readers took their share: nothing is left of the node budget.
	rpctest.Eventually(t, 10*time.Second, func() bool {
		if b.srv.inflight.TryAcquire(1) {
			b.srv.inflight.Release(1)
			return false
		}
		return true
	})
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	t.Logf("heap in use with two header-only frames pending: %d MiB", ms.HeapInuse>>20)
	// Until their bodies have stalled a whole FirstMessageTimeout.
	b.clock.Add(DefaultFirstMessageTimeout)
	for _, c := range hostile {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		_, err := c.Read(make([]byte, 1<<10))
		require.Error(t, err, "the node closes a connection whose message body stalled")
		var ne net.Error
		require.False(t, errorsAs(err, &ne) && ne.Timeout(), "the node closes a connection whose message body stalled")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = bystander.Queues(ctx)
	require.NoError(t, err, "two connections that sent only a header stall every other client")
	for _, c := range hostile {
		_ = c.Close()
	}
	check()
}

// TestLeanHostile_QuestionIDs: reuse and Finish rules.
func TestLeanHostile_QuestionIDs(t *testing.T) {
	lean := bundleOpts{mutate: leanOnly}
	t.Run("CallReusesReturnedUnfinishedID", func(t *testing.T) {
		b := setup(t, lean)
		r := newRaw(t, b)
		boot := r.bootstrap(0)
		r.call(1, methodNodeInfo, onImport(boot), nil)
		requireNodeInfoReturn(t, r.recvReturn(1))
		r.call(1, methodNodeInfo, onImport(boot), nil) // no Finish yet
		require.Contains(t, r.recvAbort(), "question id 1 is in use")
		requireServing(t, b)
	})
	t.Run("CallReusesFinishedUnreturnedID", func(t *testing.T) {
		b := setup(t, lean)
		r := newRaw(t, b)
		boot := r.bootstrap(0)
		r.call(1, methodPoll, onImport(boot), func(s capnp.Struct) error {
			p := schema.Queue_poll_Params(s)
			p.SetMax(1)
			p.SetWaitMs(50_000)
			return p.SetQueue("q")
		})
		rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		// Finish and the reuse in one write: the reuse comes before the
		// Return could be read.
		_, err := r.conn.Write(append(finishFrame(t, 1, true, false), rvCallBytes(t, 1, boot, methodNodeInfo, nil)...))
		require.NoError(t, err)
		// Either the poll's Return came first (the id was free again) or
		// the reuse is refused; never two answers to one id.
		for {
			m := r.recv()
			if m.Which() == rpccp.Message_Which_abort {
				requireClosedByServer(t, r.conn)
				break
			}
			if m.Which() != rpccp.Message_Which_return {
				continue
			}
			ret, err := m.Return()
			require.NoError(t, err)
			require.Equal(t, uint32(1), ret.AnswerId())
			if ret.Which() == rpccp.Return_Which_results {
				if _, err := ret.Results(); err == nil {
					// could be the poll or the nodeInfo; stop at nodeInfo
					p, _ := ret.Results()
					c, _ := p.Content()
					if info, err := schema.Queue_nodeInfo_Results(c.Struct()).Info(); err == nil && info.MaxBatch() == 1000 {
						break
					}
				}
			}
		}
		requireServing(t, b)
	})
	t.Run("SecondFinishAborts", func(t *testing.T) {
		b := setup(t, lean)
		check := settledGoroutines(t)
		r := newRaw(t, b)
		boot := r.bootstrap(0)
		r.call(1, methodNodeInfo, onImport(boot), nil)
		requireNodeInfoReturn(t, r.recvReturn(1))
		r.finish(1, true)
		r.finish(1, true)
		require.Contains(t, r.recvAbort(), "unknown question id 1")
		requireServing(t, b)
		check()
	})
	t.Run("SecondFinishBeforeReturnAborts", func(t *testing.T) {
		b := setup(t, lean)
		check := settledGoroutines(t)
		r := newRaw(t, b)
		boot := r.bootstrap(0)
		r.call(1, methodPoll, onImport(boot), func(s capnp.Struct) error {
			p := schema.Queue_poll_Params(s)
			p.SetMax(1)
			p.SetWaitMs(50_000)
			return p.SetQueue("q")
		})
		rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		_, err := r.conn.Write(append(finishFrame(t, 1, true, false), finishFrame(t, 1, true, false)...))
		require.NoError(t, err)
		reason := r.recvAbort()
		require.True(t, strings.Contains(reason, "second finish of question id 1") || strings.Contains(reason, "unknown question id 1"), reason)
		rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Waiters == 0 })
		requireServing(t, b)
		check()
	})
}

// TestLeanHostile_Exports: bootstrap twice, release counts.
func TestLeanHostile_Exports(t *testing.T) {
	lean := bundleOpts{mutate: leanOnly}
	t.Run("BootstrapTwiceCountsTwoReferences", func(t *testing.T) {
		b := setup(t, lean)
		r := newRaw(t, b)
		boot := r.bootstrap(0)
		require.Equal(t, boot, r.bootstrap(1))
		r.finish(0, false)
		r.finish(1, false)
		r.send(func(m rpccp.Message) error {
			rel, err := m.NewRelease()
			rel.SetId(boot)
			rel.SetReferenceCount(1)
			return err
		})
		r.call(2, methodNodeInfo, onImport(boot), nil)
		requireNodeInfoReturn(t, r.recvReturn(2))
		r.send(func(m rpccp.Message) error {
			rel, err := m.NewRelease()
			rel.SetId(boot)
			rel.SetReferenceCount(1)
			return err
		})
		r.call(3, methodNodeInfo, onImport(boot), nil)
		requireException(t, r.recvReturn(3), "unknown export")
	})
	t.Run("OverReleaseOfSubscriptionAborts", func(t *testing.T) {
		b := setup(t, lean)
		check := settledGoroutines(t)
		bystander := b.dial()
		r := newRaw(t, b)
		_, err := r.conn.Write(append(bootstrapMsg(t), consumerSubscribe(t, "q", senderHosted(0))...))
		require.NoError(t, err)
		ret := r.recvReturn(1)
		require.Equal(t, rpccp.Return_Which_results, ret.Which())
		p, err := ret.Results()
		require.NoError(t, err)
		ct, err := p.CapTable()
		require.NoError(t, err)
		require.Equal(t, 1, ct.Len())
		sub := ct.At(0).SenderHosted()
		require.Equal(t, 1, b.srv.Metrics().Subscriptions)
		r.send(func(m rpccp.Message) error {
			rel, err := m.NewRelease()
			rel.SetId(sub)
			rel.SetReferenceCount(2)
			return err
		})
		require.Contains(t, r.recvAbort(), "release of 2 references")
		rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Subscriptions == 0 })
		_, err = bystander.Queues(ctxT(t))
		require.NoError(t, err)
		require.NoError(t, bystander.Close())
		check()
	})
}

// TestLeanHostile_PipelinedOnFailedAnswer: calls pipelined on the
// Subscription of a subscribe that fails are refused with its error, and
// the connection goes on.
func TestLeanHostile_PipelinedOnFailedAnswer(t *testing.T) {
	b := setup(t, bundleOpts{mutate: leanOnly})
	check := settledGoroutines(t)
	r := newRaw(t, b)
	// A consumer the server cannot import: subscribe's answer is an
	// exception; cancel is pipelined on its subscription (pointer 1).
	sub := consumerSubscribe(t, "q", func(d rpccp.CapDescriptor) { d.SetReceiverHosted(0) })
	cancel := pipelinedCallOn(t, 2, 1, []uint16{1}, schema.Subscription_TypeID, 0, nil)
	_, err := r.conn.Write(append(append(bootstrapMsg(t), sub...), cancel...))
	require.NoError(t, err)
	require.Equal(t, rpccp.Return_Which_exception, r.recvReturn(1).Which())
	requireException(t, r.recvReturn(2), "not supported")
	// A subscribe that fails with a status (bad queue name) has no
	// subscription: the pipelined call is on a null capability.
	bad := pipelinedCall(t, 3, 0, 14, func(p rpccp.Payload) error {
		args, err := schema.NewQueue_subscribe_Params(p.Segment())
		if err != nil {
			return err
		}
		if err := args.SetQueue(""); err != nil {
			return err
		}
		return p.SetContent(args.ToPtr())
	})
	cancel = pipelinedCallOn(t, 4, 3, []uint16{1}, schema.Subscription_TypeID, 0, nil)
	_, err = r.conn.Write(append(bad, cancel...))
	require.NoError(t, err)
	r.recvReturn(3)
	requireException(t, r.recvReturn(4), "null capability")
	r.call(5, methodNodeInfo, func(tg rpccp.MessageTarget) error {
		pa, err := tg.NewPromisedAnswer()
		pa.SetQuestionId(0)
		return err
	}, nil)
	requireNodeInfoReturn(t, r.recvReturn(5))
	_ = r.conn.Close()
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 0 })
	check()
}

// TestLeanHostile_UnknownMessageWithBadPointerAborts: a message of a kind
// the node does not implement is echoed as Unimplemented; one whose
// pointers cannot be copied is malformed, and the connection ends with
// that reason. Found by a fuzzing run (session 71): the copy's failure
// was logged as the node's own ("cannot build a message") on every such
// message, and the connection went on.
func TestLeanHostile_UnknownMessageWithBadPointerAborts(t *testing.T) {
	b := setup(t, bundleOpts{mutate: leanOnly})
	r := newRaw(t, b)
	frame := make([]byte, 8+3*8)
	binary.LittleEndian.PutUint32(frame[0:], 0) // one segment
	binary.LittleEndian.PutUint32(frame[4:], 3) // of three words
	seg := frame[8:]
	binary.LittleEndian.PutUint64(seg[0:], 1<<32|1<<48)    // root: a struct of one data word, one pointer
	binary.LittleEndian.PutUint16(seg[8:], 12336)          // a Message kind the schema does not have
	binary.LittleEndian.PutUint64(seg[16:], 1000<<2|1<<32) // its pointer: a struct far past the segment
	_, err := r.conn.Write(frame)
	require.NoError(t, err)
	require.Contains(t, r.recvAbort(), "cannot be echoed")
	requireServing(t, b)
}
