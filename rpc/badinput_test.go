package rpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// rawConn opens a plain TCP connection to b's server.
func rawConn(t *testing.T, b *testBundle) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", b.addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// requireClosedByServer reads until the server closes conn.
func requireClosedByServer(t *testing.T, conn net.Conn) {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err := io.Copy(io.Discard, conn)
	var ne net.Error
	if err != nil && errorsAs(err, &ne) && ne.Timeout() {
		t.Fatal("server did not close the connection")
	}
}

// rpcMessageBytes returns the framed bytes of one rpc.capnp Message built
// by build.
func rpcMessageBytes(t testing.TB, build func(rpccp.Message) error) []byte {
	msg, m, err := newRPCMessage()
	require.NoError(t, err)
	defer msg.Release()
	require.NoError(t, build(m))
	b, err := msg.Marshal()
	require.NoError(t, err)
	return b
}

// returnBytes is a Return of question qid whose results fill completes.
func returnBytes(t testing.TB, qid uint32, fill func(rpccp.Payload) error) []byte {
	return rpcMessageBytes(t, func(m rpccp.Message) error {
		r, err := m.NewReturn()
		if err != nil {
			return err
		}
		r.SetAnswerId(qid)
		p, err := r.NewResults()
		if err != nil {
			return err
		}
		return fill(p)
	})
}

// bootstrapReturnBytes answers bootstrap question qid with export 0.
func bootstrapReturnBytes(t testing.TB, qid uint32) []byte {
	return returnBytes(t, qid, func(p rpccp.Payload) error {
		caps, err := p.NewCapTable(1)
		if err != nil {
			return err
		}
		caps.At(0).SetSenderHosted(0)
		return p.SetContent(capnp.NewInterface(p.Segment(), 0).ToPtr())
	})
}

// bootstrapMsg is the framed Bootstrap message of question 0.
func bootstrapMsg(t testing.TB) []byte {
	return rpcMessageBytes(t, func(m rpccp.Message) error {
		bs, err := m.NewBootstrap()
		if err != nil {
			return err
		}
		bs.SetQuestionId(0)
		return nil
	})
}

// pipelinedCall is the framed Call of Queue method as question qid on the
// promised answer of question on; params fills its params (nil: empty).
func pipelinedCall(t testing.TB, qid, on uint32, method uint16, params func(rpccp.Payload) error) []byte {
	return pipelinedCallOn(t, qid, on, nil, schema.Queue_TypeID, method, params)
}

// pipelinedCallOn is pipelinedCall on the capability at the pointer fields
// fields of question on's answer (a transform of getPointerField ops), of
// method of interface iface.
func pipelinedCallOn(t testing.TB, qid, on uint32, fields []uint16, iface uint64, method uint16, params func(rpccp.Payload) error) []byte {
	return rpcMessageBytes(t, func(m rpccp.Message) error {
		c, err := m.NewCall()
		if err != nil {
			return err
		}
		c.SetQuestionId(qid)
		c.SetInterfaceId(iface)
		c.SetMethodId(method)
		tgt, err := c.NewTarget()
		if err != nil {
			return err
		}
		if err := promisedAnswerTarget(tgt, on, fields); err != nil {
			return err
		}
		p, err := c.NewParams()
		if err != nil || params == nil {
			return err
		}
		return params(p)
	})
}

// promisedAnswerTarget makes tgt the promised answer of question on, at
// the pointer fields fields of its results.
func promisedAnswerTarget(tgt rpccp.MessageTarget, on uint32, fields []uint16) error {
	pa, err := tgt.NewPromisedAnswer()
	if err != nil {
		return err
	}
	pa.SetQuestionId(on)
	if len(fields) == 0 {
		return nil
	}
	ops, err := pa.NewTransform(int32(len(fields)))
	if err != nil {
		return err
	}
	for i, f := range fields {
		ops.At(i).SetGetPointerField(f)
	}
	return nil
}

// subscribeCall is the framed Call of subscribe(queue) as question 1 on
// the bootstrap capability of question 0; fill, if not nil, sets the
// rest of its params.
func subscribeCall(t testing.TB, queue string, fill func(schema.Queue_subscribe_Params, rpccp.Payload) error) []byte {
	return pipelinedCall(t, 1, 0, 14 /* subscribe */, func(p rpccp.Payload) error {
		args, err := schema.NewQueue_subscribe_Params(p.Segment())
		if err != nil {
			return err
		}
		if err := args.SetQueue(queue); err != nil {
			return err
		}
		if fill != nil {
			if err := fill(args, p); err != nil {
				return err
			}
		}
		return p.SetContent(args.ToPtr())
	})
}

// consumerSubscribe is subscribeCall(queue) with prefetch 1 and, as its
// consumer, entry 0 of a cap table whose entries the descs set.
func consumerSubscribe(t testing.TB, queue string, descs ...func(rpccp.CapDescriptor)) []byte {
	return subscribeCall(t, queue, func(args schema.Queue_subscribe_Params, p rpccp.Payload) error {
		args.SetPrefetch(1)
		if err := capnp.Struct(args).SetPtr(1, capnp.NewInterface(p.Segment(), 0).ToPtr()); err != nil {
			return err
		}
		ct, err := p.NewCapTable(int32(len(descs)))
		if err != nil {
			return err
		}
		for i, set := range descs {
			set(ct.At(i))
		}
		return nil
	})
}

// resolveMsg is a Resolve of the client's promise to the capability cap
// describes.
func resolveMsg(t testing.TB, promise uint32, cap func(rpccp.CapDescriptor)) []byte {
	return rpcMessageBytes(t, func(m rpccp.Message) error {
		r, err := m.NewResolve()
		if err != nil {
			return err
		}
		r.SetPromiseId(promise)
		d, err := r.NewCap()
		if err != nil {
			return err
		}
		cap(d)
		return nil
	})
}

func senderHosted(id uint32) func(rpccp.CapDescriptor) {
	return func(d rpccp.CapDescriptor) { d.SetSenderHosted(id) }
}

func senderPromise(id uint32) func(rpccp.CapDescriptor) {
	return func(d rpccp.CapDescriptor) { d.SetSenderPromise(id) }
}

// rawSubscribe bootstraps on conn and sends subscribe("q", prefetch 1)
// whose consumer is an interface pointer to entry 0 of a cap table of caps
// entries, each a null capability (CapDescriptor none). It returns the
// answer's status code.
func rawSubscribe(t *testing.T, conn net.Conn, caps int32) schema.ErrorCode {
	t.Helper()
	boot := bootstrapMsg(t)
	call := subscribeCall(t, "q", func(args schema.Queue_subscribe_Params, p rpccp.Payload) error {
		args.SetPrefetch(1)
		if err := capnp.Struct(args).SetPtr(1, capnp.NewInterface(p.Segment(), 0).ToPtr()); err != nil {
			return err
		}
		if caps > 0 {
			l, err := p.NewCapTable(caps)
			if err != nil {
				return err
			}
			for i := range int(caps) {
				l.At(i).SetNone()
			}
		}
		return nil
	})
	_, err := conn.Write(append(boot, call...))
	require.NoError(t, err)
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	dec := capnp.NewDecoder(conn)
	for {
		msg, err := dec.Decode()
		require.NoError(t, err, "no answer to subscribe")
		m, err := rpccp.ReadRootMessage(msg)
		require.NoError(t, err)
		if m.Which() != rpccp.Message_Which_return {
			continue
		}
		ret, err := m.Return()
		require.NoError(t, err)
		if ret.AnswerId() != 1 {
			continue
		}
		require.Equal(t, rpccp.Return_Which_results, ret.Which())
		res, err := ret.Results()
		require.NoError(t, err)
		content, err := res.Content()
		require.NoError(t, err)
		st, err := schema.Queue_subscribe_Results(content.Struct()).Status()
		require.NoError(t, err)
		return st.Code()
	}
}

// requireServing checks that a fresh client still gets full service.
func requireServing(t *testing.T, b *testBundle) {
	t.Helper()
	c := b.dial()
	res, err := c.Enqueue(ctxT(t), "still-ok", payloads(1, 8))
	require.NoError(t, err)
	require.Equal(t, storage.CodeOK, res[0].Code)
	require.NoError(t, c.Close())
}

func TestBadInput_Wire(t *testing.T) {
	t.Parallel()

	t.Run("GarbageBytes", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		bystander := b.dial()
		conn := rawConn(t, b)
		garbage := bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef, 0xff, 0xff, 0xff, 0x7f}, 512)
		_, _ = conn.Write(garbage)
		requireClosedByServer(t, conn)
		requireServing(t, b)
		_, err := bystander.Queues(ctxT(t))
		require.NoError(t, err)
	})

	t.Run("TruncatedFrame", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		conn := rawConn(t, b)
		// Header: 1 segment of 100 words, then only 16 bytes of it.
		hdr := make([]byte, 8)
		binary.LittleEndian.PutUint32(hdr[0:], 0)
		binary.LittleEndian.PutUint32(hdr[4:], 100)
		_, err := conn.Write(append(hdr, make([]byte, 16)...))
		require.NoError(t, err)
		require.NoError(t, conn.(*net.TCPConn).CloseWrite())
		requireClosedByServer(t, conn)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 0 })
		requireServing(t, b)
	})

	t.Run("HugeSegmentHeader", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		conn := rawConn(t, b)
		// Claims 512 segments of 2^31 words each: must be refused from the
		// header, without allocating.
		hdr := make([]byte, 4+4*512+4) // padded to a word
		binary.LittleEndian.PutUint32(hdr[0:], 511)
		for i := 0; i < 512; i++ {
			binary.LittleEndian.PutUint32(hdr[4+4*i:], 1<<31)
		}
		_, _ = conn.Write(hdr)
		requireClosedByServer(t, conn)
		requireServing(t, b)
	})

	// A framed message whose root is not a struct (null, or a list) is no
	// rpc.capnp Message: the server must end the connection, not crash
	// (FuzzServerConn found the null root taking the whole node down).
	for name, segment := range map[string][]byte{
		"NullRootMessage": make([]byte, 8),
		"ListRootMessage": {0x01, 0, 0, 0, 0x02, 0, 0, 0}, // a root pointer to an empty list of bytes
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, bundleOpts{})
			conn := rawConn(t, b)
			hdr := []byte{0, 0, 0, 0, byte(len(segment) / 8), 0, 0, 0}
			_, err := conn.Write(append(hdr, segment...))
			require.NoError(t, err)
			requireClosedByServer(t, conn)
			requireServing(t, b)
		})
	}

	// A call whose target is the promised answer of its own question makes
	// go-capnp v3.1.0-alpha.2 dereference a nil pipeline caller (a panic in
	// its receive goroutine: the whole node would go down). The server
	// ends such a connection instead (guardTransport; see doc.go).
	t.Run("CallOnItsOwnAnswer", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		conn := rawConn(t, b)
		boot := bootstrapMsg(t)
		call := pipelinedCall(t, 1, 1, 6 /* queues */, nil)
		_, err := conn.Write(append(boot, call...))
		require.NoError(t, err)
		requireClosedByServer(t, conn)
		requireServing(t, b)
	})

	// Calls pipelined on a subscribe's answer before it returns: on a
	// refused subscribe (a bad queue name: a status, and no subscription
	// of its own), on its subscription and on its status struct, and a
	// call chained on that pipelined call's answer. go-capnp
	// v3.1.0-alpha.2 queues such calls and, when the answer comes and a
	// call's target is no capability, dereferences a nil pipeline caller
	// in its server goroutine (FuzzServerConn found it taking the node
	// down). The node must keep serving; a connection that pipelines on
	// something other than a capability may be ended.
	t.Run("CallsPipelinedOnARefusedSubscribe", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{})
		for range 20 {
			conn := rawConn(t, b)
			subscribe := subscribeCall(t, "##", nil)
			msgs := slices.Concat(bootstrapMsg(t), subscribe,
				pipelinedCallOn(t, 2, 1, []uint16{1 /* subscription */}, schema.Subscription_TypeID, 0 /* cancel */, nil),
				pipelinedCallOn(t, 3, 1, []uint16{0 /* status */}, schema.Queue_TypeID, 15 /* nodeInfo */, nil),
				pipelinedCallOn(t, 4, 3, []uint16{0}, schema.Queue_TypeID, 15, nil))
			_, _ = conn.Write(msgs)
			readUntilReturnOrClose(t, conn, 4)
		}
		requireServing(t, b)
	})

	// subscribe whose consumer is a null capability (a descriptor of
	// none, or an index past the cap table) is refused with a status; the
	// server must not call it.
	for name, caps := range map[string]int32{"NullConsumer": 1, "ConsumerPastCapTable": 0} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, bundleOpts{})
			code := rawSubscribe(t, rawConn(t, b), caps)
			require.Equal(t, schema.ErrorCode_invalidArgument, code)
			requireServing(t, b)
		})
	}

	t.Run("MessageOverLimit", func(t *testing.T) {
		t.Parallel()
		b := setup(t, bundleOpts{mutate: func(c *ServerConfig) { c.MaxMessageBytes = 256 << 10 }})
		c := b.dial()
		_, err := c.Enqueue(ctxT(t), "q", []storage.EnqueueItem{{Payload: make([]byte, 512<<10)}})
		require.Error(t, err)
		requireServing(t, b)
	})
}

func TestBadInput_Requests(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{transport: "pipe"})
	c := b.dial()
	ctx := ctxT(t)
	lim := storage.DefaultLimits

	res, err := c.Enqueue(ctx, "q", payloads(2, 8))
	require.NoError(t, err)
	ids := []storage.ItemID{res[0].ID, res[1].ID}

	t.Run("InvalidQueueNames", func(t *testing.T) {
		for _, name := range []string{"", "a/b", "sp ace", strings.Repeat("x", lim.MaxQueueName+1), "naïve", ".", ".."} {
			_, err := c.Enqueue(ctx, name, payloads(1, 8))
			require.ErrorIs(t, err, storage.ErrInvalidArgument, "%q", name)
			require.Contains(t, err.Error(), "queue name")
			_, err = c.Poll(ctx, name, 1, 0, 0)
			require.ErrorIs(t, err, storage.ErrInvalidArgument)
			_, err = c.Ack(ctx, name, storage.LeaseID{1}, ids)
			require.ErrorIs(t, err, storage.ErrInvalidArgument)
			_, err = c.Purge(ctx, name)
			require.ErrorIs(t, err, storage.ErrInvalidArgument)
			_, err = c.Subscribe(ctx, SubscribeOptions{Queue: name, Prefetch: 1})
			require.ErrorIs(t, err, storage.ErrInvalidArgument)
		}
	})

	t.Run("OversizedLists", func(t *testing.T) {
		_, err := c.Enqueue(ctx, "q", payloads(lim.MaxBatch+1, 1))
		require.ErrorIs(t, err, storage.ErrInvalidArgument)
		require.Contains(t, err.Error(), "batch")
		many := make([]storage.ItemID, lim.MaxBatch+1)
		_, err = c.Ack(ctx, "q", storage.LeaseID{1}, many)
		require.ErrorIs(t, err, storage.ErrInvalidArgument)
		_, err = c.Nack(ctx, "q", storage.LeaseID{1}, many, nil, "")
		require.ErrorIs(t, err, storage.ErrInvalidArgument)
		_, err = c.Redrive(ctx, storage.RedriveParams{Queue: "q", IDs: many})
		require.ErrorIs(t, err, storage.ErrInvalidArgument)
		_, err = c.Poll(ctx, "q", lim.MaxBatch+1, 0, 0)
		require.ErrorIs(t, err, storage.ErrInvalidArgument)
		_, err = c.Poll(ctx, "q", 0, 0, 0)
		require.ErrorIs(t, err, storage.ErrInvalidArgument)
		_, err = c.Peek(ctx, storage.PeekParams{Queue: "q", Limit: lim.MaxBatch + 1})
		require.ErrorIs(t, err, storage.ErrInvalidArgument)
	})

	t.Run("PerItemLimits", func(t *testing.T) {
		items := []storage.EnqueueItem{
			{Payload: make([]byte, lim.MaxPayload+1)},
			{Payload: []byte("fine")},
			{Payload: []byte("late"), Delay: lim.MaxDelay + time.Millisecond},
			{Payload: []byte("key"), DedupKey: strings.Repeat("k", lim.MaxDedupKey+1)},
		}
		out, err := c.Enqueue(ctx, "limits", items)
		require.NoError(t, err)
		require.Equal(t, storage.CodeInvalid, out[0].Code)
		require.Contains(t, out[0].Err, "payload")
		require.Equal(t, storage.CodeOK, out[1].Code)
		require.False(t, out[1].ID.IsZero())
		require.Equal(t, storage.CodeInvalid, out[2].Code)
		require.Contains(t, out[2].Err, "delay")
		require.Equal(t, storage.CodeInvalid, out[3].Code)
		require.Contains(t, out[3].Err, "dedup key")
		// The server reuses a call's lists (enqueueCalls): the next calls
		// on the connection carry nothing of this one's answers.
		for range 3 {
			out, err := c.Enqueue(ctx, "limits", payloads(4, 8))
			require.NoError(t, err)
			require.Len(t, out, 4)
			for i, r := range out {
				require.Equal(t, storage.CodeOK, r.Code, i)
				require.Empty(t, r.Err, i)
				require.False(t, r.ID.IsZero(), i)
			}
		}
	})

	t.Run("LeaseWaitDelayRanges", func(t *testing.T) {
		for _, d := range []time.Duration{lim.MinLease - time.Millisecond, lim.MaxLease + time.Millisecond} {
			_, err := c.Poll(ctx, "q", 1, d, 0)
			require.ErrorIs(t, err, storage.ErrInvalidArgument, "%v", d)
			_, err = c.Extend(ctx, "q", storage.LeaseID{1}, d)
			require.ErrorIs(t, err, storage.ErrInvalidArgument, "%v", d)
		}
		_, err := c.Extend(ctx, "q", storage.LeaseID{1}, 0)
		require.ErrorIs(t, err, storage.ErrInvalidArgument)
		_, err = c.Poll(ctx, "q", 1, 0, lim.MaxWait+time.Millisecond)
		require.ErrorIs(t, err, storage.ErrInvalidArgument)
		d := lim.MaxDelay + time.Millisecond
		_, err = c.Nack(ctx, "q", storage.LeaseID{1}, ids, &d, "")
		require.ErrorIs(t, err, storage.ErrInvalidArgument)
		// A wire value that overflows time.Duration is rejected, not wrapped.
		callPoll := func(leaseMs, waitMs uint64) error {
			f, release := c.Queue().Poll(ctx, func(p schema.Queue_poll_Params) error {
				p.SetMax(1)
				p.SetLeaseMs(leaseMs)
				p.SetWaitMs(waitMs)
				return p.SetQueue("q")
			})
			defer release()
			r, err := f.Struct()
			require.NoError(t, err)
			return status("poll", r.Status)
		}
		require.ErrorIs(t, callPoll(^uint64(0), 0), storage.ErrInvalidArgument)
		require.ErrorIs(t, callPoll(0, ^uint64(0)), storage.ErrInvalidArgument)
	})

	t.Run("ForgedAndUnknownLeases", func(t *testing.T) {
		forged := storage.LeaseID{0xde, 0xad}
		codes, err := c.Ack(ctx, "q", forged, append(ids, storage.ItemID{9, 9}))
		require.NoError(t, err)
		require.Equal(t, []storage.Code{storage.CodeLeaseExpired, storage.CodeLeaseExpired, storage.CodeNotFound}, codes)
		_, err = c.Extend(ctx, "q", forged, time.Second)
		require.ErrorIs(t, err, storage.ErrLeaseExpired)

		pr, err := c.Poll(ctx, "q", 1, time.Minute, 0)
		require.NoError(t, err)
		require.Len(t, pr.Items, 1)
		// Someone else's live lease on that item: mismatch, nothing changes.
		codes, err = c.Ack(ctx, "q", forged, []storage.ItemID{pr.Items[0].ID})
		require.NoError(t, err)
		require.Equal(t, []storage.Code{storage.CodeLeaseMismatch}, codes)
		// The lease of another queue.
		_, err = c.Extend(ctx, "limits", pr.Lease, time.Second)
		require.Error(t, err)
		codes, err = c.Ack(ctx, "q", pr.Lease, []storage.ItemID{pr.Items[0].ID})
		require.NoError(t, err)
		require.Equal(t, []storage.Code{storage.CodeOK}, codes)
	})

	t.Run("MalformedTokensAndIDs", func(t *testing.T) {
		send := func(method uint16, place func(capnp.Struct) error, size capnp.ObjectSize) (capnp.Struct, error) {
			ans, release := capnp.Client(c.Queue()).SendCall(ctx, capnp.Send{
				Method:    capnp.Method{InterfaceID: schema.Queue_TypeID, MethodID: method, InterfaceName: "queue.capnp:Queue"},
				PlaceArgs: place,
				ArgsSize:  size,
			})
			t.Cleanup(release)
			return ans.Struct()
		}
		statusOf := func(s capnp.Struct) error {
			p, err := s.Ptr(0)
			require.NoError(t, err)
			st := schema.Status(p.Struct())
			d, _ := st.Detail()
			return errorOf("raw", st.Code(), d)
		}
		// ack with a 3-byte lease.
		r, err := send(2, func(s capnp.Struct) error {
			a := schema.Queue_ack_Params(s)
			if err := a.SetQueue("q"); err != nil {
				return err
			}
			return a.SetLease([]byte{1, 2, 3})
		}, capnp.ObjectSize{PointerCount: 3})
		require.NoError(t, err)
		require.ErrorIs(t, statusOf(r), storage.ErrInvalidArgument)

		// ack with a 5-byte id.
		r, err = send(2, func(s capnp.Struct) error {
			a := schema.Queue_ack_Params(s)
			if err := a.SetQueue("q"); err != nil {
				return err
			}
			if err := a.SetLease(make([]byte, 16)); err != nil {
				return err
			}
			l, err := a.NewIds(1)
			if err != nil {
				return err
			}
			return l.Set(0, []byte{1, 2, 3, 4, 5})
		}, capnp.ObjectSize{PointerCount: 3})
		require.NoError(t, err)
		require.ErrorIs(t, statusOf(r), storage.ErrInvalidArgument)
	})

	t.Run("WrongStructTypes", func(t *testing.T) {
		send := func(method uint16, place func(capnp.Struct) error, size capnp.ObjectSize) (capnp.Struct, error) {
			ans, release := capnp.Client(c.Queue()).SendCall(ctx, capnp.Send{
				Method:    capnp.Method{InterfaceID: schema.Queue_TypeID, MethodID: method, InterfaceName: "queue.capnp:Queue"},
				PlaceArgs: place,
				ArgsSize:  size,
			})
			t.Cleanup(release)
			return ans.Struct()
		}
		statusOf := func(s capnp.Struct) error {
			p, err := s.Ptr(0)
			require.NoError(t, err)
			st := schema.Status(p.Struct())
			d, _ := st.Detail()
			return errorOf("raw", st.Code(), d)
		}
		// enqueue whose queue is a struct and whose items are a Text.
		r, err := send(0, func(s capnp.Struct) error {
			seg := s.Segment()
			inner, err := capnp.NewStruct(seg, capnp.ObjectSize{DataSize: 8})
			if err != nil {
				return err
			}
			if err := s.SetPtr(0, inner.ToPtr()); err != nil {
				return err
			}
			txt, err := capnp.NewText(seg, "not a list of items")
			if err != nil {
				return err
			}
			return s.SetPtr(1, txt.ToPtr())
		}, capnp.ObjectSize{PointerCount: 2})
		require.NoError(t, err)
		require.ErrorIs(t, statusOf(r), storage.ErrInvalidArgument)

		// enqueue with a valid name but items as a list of UInt64.
		r, err = send(0, func(s capnp.Struct) error {
			a := schema.Queue_enqueue_Params(s)
			if err := a.SetQueue("q"); err != nil {
				return err
			}
			l, err := capnp.NewUInt64List(s.Segment(), 3)
			if err != nil {
				return err
			}
			l.Set(0, 42)
			return s.SetPtr(1, l.ToPtr())
		}, capnp.ObjectSize{PointerCount: 2})
		require.NoError(t, err)
		// Either refused as a whole, or each "item" read as an empty
		// struct: never a crash, never a silent success with data.
		if st := statusOf(r); st != nil {
			require.ErrorIs(t, st, storage.ErrInvalidArgument)
		}

		// ack whose ids are a list of structs.
		r, err = send(2, func(s capnp.Struct) error {
			a := schema.Queue_ack_Params(s)
			if err := a.SetQueue("q"); err != nil {
				return err
			}
			if err := a.SetLease(make([]byte, 16)); err != nil {
				return err
			}
			l, err := capnp.NewCompositeList(s.Segment(), capnp.ObjectSize{DataSize: 16, PointerCount: 1}, 2)
			if err != nil {
				return err
			}
			return s.SetPtr(2, l.ToPtr())
		}, capnp.ObjectSize{PointerCount: 3})
		require.NoError(t, err)
		require.ErrorIs(t, statusOf(r), storage.ErrInvalidArgument)

		// An unknown method is an exception; the connection lives on.
		_, err = send(99, func(capnp.Struct) error { return nil }, capnp.ObjectSize{})
		require.Error(t, err)
		_, err = c.Queues(ctx)
		require.NoError(t, err)
	})
}

// TestServer_LocalHandlers calls the handlers in-process through
// ServerToClient, without any transport.
func TestServer_LocalHandlers(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{transport: "pipe"})
	q := schema.Queue_ServerToClient(&queueServer{s: b.srv, remote: "local"})
	defer q.Release()
	ctx := context.Background()

	f, release := q.Enqueue(ctx, func(p schema.Queue_enqueue_Params) error {
		if err := p.SetQueue("local"); err != nil {
			return err
		}
		l, err := p.NewItems(1)
		if err != nil {
			return err
		}
		return l.At(0).SetPayload([]byte("hello"))
	})
	r, err := f.Struct()
	require.NoError(t, err)
	require.NoError(t, status("enqueue", r.Status))
	rl, err := r.Results()
	require.NoError(t, err)
	require.Equal(t, schema.ResultCode_ok, rl.At(0).Code())
	release()

	pf, release := q.Poll(ctx, func(p schema.Queue_poll_Params) error {
		p.SetMax(5)
		return p.SetQueue("local")
	})
	pr, err := pf.Struct()
	require.NoError(t, err)
	got, err := readPoll(pr.Lease, pr.ExpiresAt(), pr.Items, 0)
	require.NoError(t, err)
	release()
	require.Len(t, got.Items, 1)
	require.Equal(t, []byte("hello"), got.Items[0].Payload)
	require.Equal(t, testStart.Add(storage.DefaultLeaseDuration), got.ExpiresAt)

	af, release := q.Ack(ctx, func(p schema.Queue_ack_Params) error {
		if err := p.SetQueue("local"); err != nil {
			return err
		}
		if err := p.SetLease(got.Lease[:]); err != nil {
			return err
		}
		l, err := p.NewIds(1)
		if err != nil {
			return err
		}
		return writeIDs(l, []storage.ItemID{got.Items[0].ID})
	})
	ar, err := af.Struct()
	require.NoError(t, err)
	cl, err := ar.Codes()
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK}, readCodes(cl))
	release()
}

func TestWindowLimiter_OversizedMessageDoesNotPanic(t *testing.T) {
	t.Parallel()
	l := newWindowLimiter(1024)
	defer l.Release()
	done, err := l.StartMessage(context.Background(), 512)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	// Larger than the window: waits for the window to drain...
	_, err = l.StartMessage(ctx, 1<<20)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	done()
	// ...then goes alone.
	big, err := l.StartMessage(context.Background(), 1<<20)
	require.NoError(t, err)
	big()
}

// readUntilReturnOrClose reads conn until the Return of question qid
// comes or the server closes the connection.
func readUntilReturnOrClose(t *testing.T, conn net.Conn, qid uint32) {
	t.Helper()
	readReturn(t, conn, qid)
}

// readReturn reads conn until the Return of question qid comes, and
// returns it; false if the server closed the connection first.
func readReturn(t *testing.T, conn net.Conn, qid uint32) (rpccp.Return, bool) {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	dec := capnp.NewDecoder(conn)
	for {
		msg, err := dec.Decode()
		if err != nil {
			var ne net.Error
			require.False(t, errorsAs(err, &ne) && ne.Timeout(), "neither a Return for %d nor a close", qid)
			return rpccp.Return{}, false
		}
		m, err := rpccp.ReadRootMessage(msg)
		require.NoError(t, err)
		if m.Which() == rpccp.Message_Which_return {
			if ret, err := m.Return(); err == nil && ret.AnswerId() == qid {
				return ret, true
			}
		}
	}
}

// TestBadInput_UnknownMethodPipelinedOnASubscription: a call of a method
// the Subscription interface does not have, pipelined on the subscription
// of a subscribe sent just before it (refused or accepted). go-capnp
// v3.1.0-alpha.2 queued the call until the subscribe returned and then
// dereferenced the nil pipeline caller of its Unimplemented rejection
// (FuzzServerConn found it taking the node down, nearly every time). The
// call must be answered with an exception: Unimplemented on an accepted
// subscription.
func TestBadInput_UnknownMethodPipelinedOnASubscription(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	for _, queue := range []string{"##" /* refused */, "q"} {
		for range 20 {
			conn := rawConn(t, b)
			_, err := conn.Write(slices.Concat(bootstrapMsg(t), consumerSubscribe(t, queue, senderHosted(0)),
				pipelinedCallOn(t, 2, 1, []uint16{1 /* subscription */}, schema.Queue_TypeID, 3, nil)))
			require.NoError(t, err)
			ret, ok := readReturn(t, conn, 2)
			require.True(t, ok, "the server closed the connection")
			require.Equal(t, rpccp.Return_Which_exception, ret.Which(), queue)
			ex, err := ret.Exception()
			require.NoError(t, err)
			if queue == "q" { // a refused subscribe's may be a null capability
				reason, _ := ex.Reason()
				require.Equal(t, rpccp.Exception_Type_unimplemented, ex.Type(), reason)
			}
			_ = conn.Close()
		}
	}
	requireServing(t, b)
}

// TestBadInput_PromiseResolvedToItsOwnImport: a consumer passed as a
// promise, then resolved to a capability the client "hosts" under the id
// of a promise: its own, or that of a second promise which is then
// resolved back to the first. go-capnp v3.1.0-alpha.2 takes the import it
// already holds under that id, a promise, and follows the cycle for ever
// in its receive goroutine (FuzzServerConn found the node's Stop waiting
// for it). The node must keep serving and stop (the bundle's cleanup); a
// promise resolved to a capability hosted under a fresh id keeps its
// connection.
func TestBadInput_PromiseResolvedToItsOwnImport(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	subscribeWith := func(promises ...uint32) []byte {
		var descs []func(rpccp.CapDescriptor)
		for _, id := range promises {
			descs = append(descs, senderPromise(id))
		}
		return consumerSubscribe(t, "q", descs...)
	}
	resolve := func(promise, hosted uint32) []byte { return resolveMsg(t, promise, senderHosted(hosted)) }
	nodeInfo := pipelinedCall(t, 3, 0, 15 /* nodeInfo */, nil)
	for range 20 {
		for _, in := range [][]byte{
			slices.Concat(subscribeWith(1), resolve(1, 1)),
			slices.Concat(subscribeWith(1, 2), resolve(2, 1), resolve(1, 2)),
		} {
			conn := rawConn(t, b)
			_, err := conn.Write(slices.Concat(bootstrapMsg(t), in, nodeInfo))
			require.NoError(t, err)
			readUntilReturnOrClose(t, conn, 3)
			_ = conn.Close()
		}
	}
	// Resolved to a capability hosted under a fresh id: no cycle, and the
	// connection goes on.
	conn := rawConn(t, b)
	_, err := conn.Write(slices.Concat(bootstrapMsg(t), subscribeWith(1), resolve(1, 7), nodeInfo))
	require.NoError(t, err)
	ret, ok := readReturn(t, conn, 3)
	require.True(t, ok, "the server closed the connection of a promise resolved to a fresh capability")
	require.Equal(t, rpccp.Return_Which_results, ret.Which())
	requireServing(t, b)
}

// TestBadInput_ConsumerResolvedToItsSubscription: a consumer passed as a
// promise and resolved, once subscribe has returned, to the subscription
// itself (receiverHosted: the node's export in subscribe's results). The
// subscription then holds the only reference to itself, and none to the
// connection; on go-capnp v3.1.0-alpha.2 it kept polling after the
// connection closed, until the node stopped (FuzzServerConn found it). It
// must end with its connection.
func TestBadInput_ConsumerResolvedToItsSubscription(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	call := consumerSubscribe(t, "q", senderPromise(1))
	resolve := func(export uint32) []byte {
		return resolveMsg(t, 1, func(d rpccp.CapDescriptor) { d.SetReceiverHosted(export) })
	}
	for range 5 {
		conn := rawConn(t, b)
		_, err := conn.Write(slices.Concat(bootstrapMsg(t), call))
		require.NoError(t, err)
		ret, ok := readReturn(t, conn, 1)
		require.True(t, ok, "the server closed the connection before subscribe returned")
		require.Equal(t, rpccp.Return_Which_results, ret.Which())
		results, err := ret.Results()
		require.NoError(t, err)
		ct, err := results.CapTable()
		require.NoError(t, err)
		require.Equal(t, 1, ct.Len(), "subscribe's results hold the subscription")
		require.Equal(t, rpccp.CapDescriptor_Which_senderHosted, ct.At(0).Which())
		_, err = conn.Write(resolve(ct.At(0).SenderHosted()))
		require.NoError(t, err)
		require.Equal(t, 1, b.srv.Metrics().Subscriptions)
		require.NoError(t, conn.Close())
		rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Subscriptions == 0 })
	}
	requireServing(t, b)
}

// TestBadInput_ReturnOfAQuestionNotAsked: Returns of the node's question
// 0 (its first push to a consumer) sent before the node has asked it, or
// twice. go-capnp v3.1.0-alpha.2 resolves the question's promise with
// such a Return while the push is still queued, and rejects it again when
// the connection ends with the push unsent: a panic that took the node
// down (FuzzServerConn found it). The go-capnp engine ends a connection
// that returns a question not asked; the node must keep serving.
func TestBadInput_ReturnOfAQuestionNotAsked(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	_, err := b.store.Enqueue(ctxT(t), storage.EnqueueParams{Queue: "q", Items: payloads(64, 8), Now: b.clock.Now()})
	require.NoError(t, err)
	subscribe := consumerSubscribe(t, "q", senderHosted(0))
	ret := rpcMessageBytes(t, func(m rpccp.Message) error {
		r, err := m.NewReturn()
		if err != nil {
			return err
		}
		r.SetAnswerId(0)
		p, err := r.NewResults()
		if err != nil {
			return err
		}
		st, err := capnp.NewStruct(p.Segment(), capnp.ObjectSize{})
		if err != nil {
			return err
		}
		return p.SetContent(st.ToPtr())
	})
	nodeInfo := pipelinedCall(t, 3, 0, 15 /* nodeInfo */, nil)

	// Nothing asked: the connection ends.
	conn := rawConn(t, b)
	_, err = conn.Write(slices.Concat(bootstrapMsg(t), ret, nodeInfo))
	require.NoError(t, err)
	_, answered := readReturn(t, conn, 3)
	if testEngine == EngineGoCapnp {
		require.False(t, answered, "the connection of a Return of a question not asked goes on")
	}
	_ = conn.Close()
	// A push queued or being written (nobody reads the connection: a
	// go-capnp connection, whose sends do not hold up its reads), returned
	// early, then the connection ends.
	if testEngine != EngineGoCapnp {
		requireServing(t, b)
		return
	}
	for range 5 {
		cs, ss := net.Pipe()
		b.srv.admit(ss, nil)
		pushed := b.srv.Metrics().ItemsPushed
		_, err := cs.Write(slices.Concat(bootstrapMsg(t), subscribe))
		require.NoError(t, err)
		rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().ItemsPushed > pushed })
		time.Sleep(10 * time.Millisecond) // the push asks its question after counting its item: not synchronisation, the window the bug needs
		require.NoError(t, cs.SetWriteDeadline(time.Now().Add(10*time.Second)))
		_, _ = cs.Write(ret) // the guard may end the connection before it takes the write
		require.NoError(t, cs.Close())
		rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 0 })
	}
	requireServing(t, b)
}

// TestBadInput_CallPipelinedOnAReturnedAnswerWithoutCapabilities: a call
// pipelined on an answer that has returned (and is not finished yet) but
// holds no capability, with a transform into its results. The server must
// answer it with an exception and keep serving.
func TestBadInput_CallPipelinedOnAReturnedAnswerWithoutCapabilities(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	for range 20 {
		conn := rawConn(t, b)
		_, err := conn.Write(slices.Concat(bootstrapMsg(t), pipelinedCall(t, 1, 0, 15 /* nodeInfo */, nil)))
		require.NoError(t, err)
		readUntilReturnOrClose(t, conn, 1)
		// Other calls' replies reuse the buffers of finished messages.
		_, err = b.dial().Queues(ctxT(t))
		require.NoError(t, err)
		_, err = conn.Write(pipelinedCallOn(t, 2, 1, []uint16{0}, schema.Queue_TypeID, 15, nil))
		require.NoError(t, err)
		readUntilReturnOrClose(t, conn, 2)
	}
	requireServing(t, b)
}

// TestBadInput_DisembargoOnAnAnswer: a sender-loopback Disembargo whose
// target is the promise of a returned answer (Subscription.cancel's,
// whose results are empty). No result of the Queue interface holds a
// capability of the client's, so a conforming client never sends one;
// go-capnp v3.1.0-alpha.2 dereferences the empty results' nil message
// (FuzzServerConn found it taking the node down). The node must keep
// serving; the connection may be ended.
func TestBadInput_DisembargoOnAnAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	disembargo := rpcMessageBytes(t, func(m rpccp.Message) error {
		d, err := m.NewDisembargo()
		if err != nil {
			return err
		}
		tgt, err := d.NewTarget()
		if err != nil {
			return err
		}
		d.Context().SetSenderLoopback(7)
		return promisedAnswerTarget(tgt, 2 /* the cancel below */, nil)
	})
	for range 10 {
		conn := rawConn(t, b)
		_, err := conn.Write(slices.Concat(bootstrapMsg(t), subscribeCall(t, "##", nil),
			pipelinedCallOn(t, 2, 1, []uint16{1 /* subscription */}, schema.Subscription_TypeID, 0 /* cancel */, nil)))
		require.NoError(t, err)
		readUntilReturnOrClose(t, conn, 2)
		_, _ = conn.Write(slices.Concat(disembargo, pipelinedCall(t, 3, 0, 15 /* nodeInfo */, nil)))
		readUntilReturnOrClose(t, conn, 3)
	}
	requireServing(t, b)
}

// TestBadInput_PromiseResolvedToAPromise: a capability passed twice as a
// promise (senderPromise), then resolved to itself, twice. go-capnp
// v3.1.0-alpha.2 can follow the resolution chain for ever in its receive
// goroutine (FuzzServerConn found the connection spinning and the node's
// Stop waiting for it; about one run in a few hundred without the
// guard). The node must keep serving, and stop (the bundle's cleanup).
func TestBadInput_PromiseResolvedToAPromise(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{})
	withPromise := pipelinedCall(t, 1, 0, 10 /* redrive */, func(p rpccp.Payload) error {
		ct, err := p.NewCapTable(2)
		if err != nil {
			return err
		}
		ct.At(0).SetSenderPromise(2)
		ct.At(1).SetSenderPromise(2)
		return nil
	})
	resolve := resolveMsg(t, 2, senderPromise(2))
	for range 5 {
		conn := rawConn(t, b)
		_, err := conn.Write(slices.Concat(bootstrapMsg(t), withPromise, resolve, resolve, pipelinedCall(t, 3, 0, 15 /* nodeInfo */, nil)))
		require.NoError(t, err)
		readUntilReturnOrClose(t, conn, 3)
	}
	requireServing(t, b)
}
