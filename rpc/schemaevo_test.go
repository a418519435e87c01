package rpc

import (
	"context"
	"net"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// Schema evolution (review, session 72): clients built against an older
// or a newer queue.capnp than the node's, and the Go client against nodes
// that answer with older or newer rpc.capnp messages. Messages are built
// by hand on a real TCP socket to a lean server on RocksDB.

func evoBundle(t *testing.T) *testBundle {
	return setup(t, bundleOpts{factory: rocksFactory(), mutate: func(c *ServerConfig) { c.Engine = EngineLean }})
}

// callSized sends a call of iface/method as question qid to the import
// target with a params struct of exactly size (an older or newer schema's
// layout), filled by place.
func (r *rawRPC) callSized(qid uint32, target uint32, iface uint64, method uint16, size capnp.ObjectSize, place func(capnp.Struct) error) {
	r.t.Helper()
	r.send(func(m rpccp.Message) error {
		c, err := m.NewCall()
		if err != nil {
			return err
		}
		c.SetQuestionId(qid)
		c.SetInterfaceId(iface)
		c.SetMethodId(method)
		tg, err := c.NewTarget()
		if err != nil {
			return err
		}
		tg.SetImportedCap(target)
		p, err := c.NewParams()
		if err != nil {
			return err
		}
		args, err := capnp.NewStruct(c.Segment(), size)
		if err != nil {
			return err
		}
		if place != nil {
			if err := place(args); err != nil {
				return err
			}
		}
		return p.SetContent(args.ToPtr())
	})
}

// results reads the Return of qid as results (failing on an exception)
// and finishes the question.
func (r *rawRPC) results(qid uint32) capnp.Struct {
	r.t.Helper()
	ret := r.recvReturn(qid)
	if ret.Which() == rpccp.Return_Which_exception {
		e, _ := ret.Exception()
		reason, _ := e.Reason()
		r.t.Fatalf("question %d: exception %v: %s", qid, e.Type(), reason)
	}
	require.Equal(r.t, rpccp.Return_Which_results, ret.Which())
	p, err := ret.Results()
	require.NoError(r.t, err)
	c, err := p.Content()
	require.NoError(r.t, err)
	r.finish(qid, true)
	return c.Struct()
}

func setText(s capnp.Struct, i uint16, v string) error {
	t, err := capnp.NewText(s.Segment(), v)
	if err != nil {
		return err
	}
	return s.SetPtr(i, t.ToPtr())
}

func setData(s capnp.Struct, i uint16, v []byte) error {
	d, err := capnp.NewData(s.Segment(), v)
	if err != nil {
		return err
	}
	return s.SetPtr(i, d.ToPtr())
}

func requireStatusNone(t *testing.T, st schema.Status, err error) {
	t.Helper()
	require.NoError(t, err)
	d, _ := st.Detail()
	require.Equal(t, schema.ErrorCode_none, st.Code(), "status detail: %s", d)
}

// TestSchemaEvo_OldClientSmallStructs: a client whose structs are
// smaller than the node's (fields it does not know left out entirely:
// the data and pointer sections end before them) gets each missing
// field's documented default: an EnqueueItem of only a payload is ready
// at once with priority 0 and the queue's max attempts; a poll of only
// queue and max leases for the queue's default lease and does not wait;
// a nack of no data section backs off (delayMs = -1) and counts the
// attempt (undelivered = false).
func TestSchemaEvo_OldClientSmallStructs(t *testing.T) {
	b := evoBundle(t)
	r := newRaw(t, b)
	q := r.bootstrap(0)
	const queue = "evo-old"

	// enqueue: params {queue, items}, each item a struct of one pointer
	// (payload) and no data.
	r.callSized(1, q, schema.Queue_TypeID, 0, capnp.ObjectSize{PointerCount: 2}, func(s capnp.Struct) error {
		if err := setText(s, 0, queue); err != nil {
			return err
		}
		l, err := capnp.NewCompositeList(s.Segment(), capnp.ObjectSize{PointerCount: 1}, 2)
		if err != nil {
			return err
		}
		for i := 0; i < 2; i++ {
			if err := setData(l.Struct(i), 0, []byte{byte('a' + i)}); err != nil {
				return err
			}
		}
		return s.SetPtr(1, l.ToPtr())
	})
	er := schema.Queue_enqueue_Results(r.results(1))
	st, err := er.Status()
	requireStatusNone(t, st, err)
	rl, err := er.Results()
	require.NoError(t, err)
	require.Equal(t, 2, rl.Len())
	for i := 0; i < 2; i++ {
		require.Equal(t, schema.ResultCode_ok, rl.At(i).Code())
	}

	// poll: params {max} in 4 data bytes... the smallest data section is
	// one word: max only, leaseMs and waitMs absent.
	r.callSized(2, q, schema.Queue_TypeID, 1, capnp.ObjectSize{DataSize: 8, PointerCount: 1}, func(s capnp.Struct) error {
		s.SetUint32(0, 1)
		return setText(s, 0, queue)
	})
	pr := schema.Queue_poll_Results(r.results(2))
	st, err = pr.Status()
	requireStatusNone(t, st, err)
	items, err := pr.Items()
	require.NoError(t, err)
	require.Equal(t, 1, items.Len())
	it := items.At(0)
	require.Equal(t, uint8(0), it.Priority())
	require.Equal(t, uint32(1), it.Attempts())
	require.Equal(t, toMs(b.clock.Now().Add(storage.DefaultLeaseDuration)), pr.ExpiresAt(), "the queue's default lease")
	lease, err := pr.Lease()
	require.NoError(t, err)
	id, err := it.Id()
	require.NoError(t, err)

	// nack: params with no data section (an old client that knows
	// neither delayMs nor undelivered): backoff, attempt counted.
	r.callSized(3, q, schema.Queue_TypeID, 3, capnp.ObjectSize{PointerCount: 3}, func(s capnp.Struct) error {
		if err := setText(s, 0, queue); err != nil {
			return err
		}
		if err := setData(s, 1, lease); err != nil {
			return err
		}
		l, err := capnp.NewDataList(s.Segment(), 1)
		if err != nil {
			return err
		}
		if err := l.Set(0, id); err != nil {
			return err
		}
		return s.SetPtr(2, l.ToPtr())
	})
	nr := schema.Queue_nack_Results(r.results(3))
	st, err = nr.Status()
	requireStatusNone(t, st, err)
	codes, err := nr.Codes()
	require.NoError(t, err)
	require.Equal(t, 1, codes.Len())
	require.Equal(t, schema.ResultCode_ok, codes.At(0))

	c := b.dial()
	stats, err := c.Stats(ctxT(t), queue)
	require.NoError(t, err)
	require.Len(t, stats, 1)
	require.Equal(t, uint64(1), stats[0].Nacked, "an old client's nack is a nack, not a give-back")
	// After the longest backoff the item is back with its attempt counted.
	b.clock.Add(storage.DefaultBackoffMax + time.Second)
	got, err := c.Peek(ctxT(t), storage.PeekParams{Queue: queue})
	require.NoError(t, err)
	require.Len(t, got, 2)
	require.Equal(t, uint32(1), got[0].Attempts, "attempts of the nacked item")
}

// TestSchemaEvo_NewClientLargeStructs: a client whose structs are
// larger than the node's (fields added after it, set to non-zero values)
// is served as if they were not there: params, enqueue items and the
// items of a list of larger elements.
func TestSchemaEvo_NewClientLargeStructs(t *testing.T) {
	b := evoBundle(t)
	r := newRaw(t, b)
	q := r.bootstrap(0)
	const queue = "evo-new"
	junk := func(s capnp.Struct, fromWord, words int, fromPtr, ptrs uint16) error {
		for w := fromWord; w < words; w++ {
			s.SetUint64(capnp.DataOffset(8*w), 0xdeadbeefcafef00d)
		}
		for p := fromPtr; p < ptrs; p++ {
			if err := setText(s, p, "a field from the future"); err != nil {
				return err
			}
		}
		return nil
	}
	// EnqueueItem: 3 words, 2 pointers now; send 8 words, 6 pointers.
	r.callSized(1, q, schema.Queue_TypeID, 0, capnp.ObjectSize{DataSize: 64, PointerCount: 8}, func(s capnp.Struct) error {
		if err := setText(s, 0, queue); err != nil {
			return err
		}
		l, err := capnp.NewCompositeList(s.Segment(), capnp.ObjectSize{DataSize: 64, PointerCount: 6}, 1)
		if err != nil {
			return err
		}
		e := schema.EnqueueItem(l.Struct(0))
		if err := e.SetPayload([]byte("x")); err != nil {
			return err
		}
		e.SetPriority(3)
		if err := junk(l.Struct(0), 3, 8, 2, 6); err != nil {
			return err
		}
		if err := s.SetPtr(1, l.ToPtr()); err != nil {
			return err
		}
		return junk(s, 0, 8, 2, 8)
	})
	er := schema.Queue_enqueue_Results(r.results(1))
	st, err := er.Status()
	requireStatusNone(t, st, err)
	rl, err := er.Results()
	require.NoError(t, err)
	require.Equal(t, 1, rl.Len())
	require.Equal(t, schema.ResultCode_ok, rl.At(0).Code())

	// poll: 3 words, 1 pointer now; send 6 words, 5 pointers.
	r.callSized(2, q, schema.Queue_TypeID, 1, capnp.ObjectSize{DataSize: 48, PointerCount: 5}, func(s capnp.Struct) error {
		p := schema.Queue_poll_Params(s)
		p.SetMax(10)
		p.SetLeaseMs(5000)
		if err := p.SetQueue(queue); err != nil {
			return err
		}
		return junk(s, 3, 6, 1, 5)
	})
	pr := schema.Queue_poll_Results(r.results(2))
	st, err = pr.Status()
	requireStatusNone(t, st, err)
	items, err := pr.Items()
	require.NoError(t, err)
	require.Equal(t, 1, items.Len())
	require.Equal(t, uint8(3), items.At(0).Priority())
	require.Equal(t, toMs(b.clock.Now().Add(5*time.Second)), pr.ExpiresAt())
	lease, err := pr.Lease()
	require.NoError(t, err)
	id, err := items.At(0).Id()
	require.NoError(t, err)

	// ack: 0 words, 3 pointers now; send 4 words, 7 pointers.
	r.callSized(3, q, schema.Queue_TypeID, 2, capnp.ObjectSize{DataSize: 32, PointerCount: 7}, func(s capnp.Struct) error {
		a := schema.Queue_ack_Params(s)
		if err := a.SetQueue(queue); err != nil {
			return err
		}
		if err := a.SetLease(lease); err != nil {
			return err
		}
		l, err := a.NewIds(1)
		if err != nil {
			return err
		}
		if err := l.Set(0, id); err != nil {
			return err
		}
		return junk(s, 0, 4, 3, 7)
	})
	ar := schema.Queue_ack_Results(r.results(3))
	st, err = ar.Status()
	requireStatusNone(t, st, err)
	codes, err := ar.Codes()
	require.NoError(t, err)
	require.Equal(t, 1, codes.Len())
	require.Equal(t, schema.ResultCode_ok, codes.At(0))
}

// TestSchemaEvo_UnknownMethodsAndInterfaces: a newer client's
// methods (ordinals past the node's) and interfaces the node does not
// serve are answered with an unimplemented exception, and the connection
// goes on.
func TestSchemaEvo_UnknownMethodsAndInterfaces(t *testing.T) {
	b := evoBundle(t)
	r := newRaw(t, b)
	q := r.bootstrap(0)
	cases := []struct {
		iface  uint64
		method uint16
	}{
		{schema.Queue_TypeID, uint16(len(leanMethods))},
		{schema.Queue_TypeID, 100},
		{schema.Queue_TypeID, 0xffff},
		{0x1234567890abcdef, 0},
		{schema.Consumer_TypeID, 0},
		{schema.Subscription_TypeID, 0},
	}
	qid := uint32(1)
	for _, tc := range cases {
		r.callSized(qid, q, tc.iface, tc.method, capnp.ObjectSize{DataSize: 8, PointerCount: 1}, nil)
		ret := r.recvReturn(qid)
		require.Equal(t, rpccp.Return_Which_exception, ret.Which(), "iface %#x method %d", tc.iface, tc.method)
		e, err := ret.Exception()
		require.NoError(t, err)
		require.Equal(t, rpccp.Exception_Type_unimplemented, e.Type(), "iface %#x method %d", tc.iface, tc.method)
		r.finish(qid, true)
		qid++
	}
	r.callSized(qid, q, schema.Queue_TypeID, methodNodeInfo, capnp.ObjectSize{}, nil)
	requireNodeInfoReturn(t, r.recvReturn(qid))
}

// unknownMessage is a Message whose union member is which, one this
// rpc.capnp does not know, holding a small struct.
func unknownMessage(which uint16) func(rpccp.Message) error {
	return unknownMessageWith(which, "from the future")
}

// unknownMessageWith is unknownMessage with text in its struct.
func unknownMessageWith(which uint16, text string) func(rpccp.Message) error {
	return func(m rpccp.Message) error {
		s := capnp.Struct(m)
		s.SetUint16(0, which)
		body, err := capnp.NewStruct(s.Segment(), capnp.ObjectSize{DataSize: 8, PointerCount: 1})
		if err != nil {
			return err
		}
		body.SetUint64(0, 42)
		if err := setText(body, 0, text); err != nil {
			return err
		}
		return s.SetPtr(0, body.ToPtr())
	}
}

// TestSchemaEvo_UnknownMessageEchoedByNode: a Message member newer
// than the node's rpc.capnp is echoed in an Unimplemented, intact, and
// the connection goes on.
func TestSchemaEvo_UnknownMessageEchoedByNode(t *testing.T) {
	b := evoBundle(t)
	r := newRaw(t, b)
	q := r.bootstrap(0)
	for i, which := range []uint16{14, 15, 200} {
		r.send(unknownMessage(which))
		m := r.recv()
		require.Equal(t, rpccp.Message_Which_unimplemented, m.Which())
		u, err := m.Unimplemented()
		require.NoError(t, err)
		require.Equal(t, rpccp.Message_Which(which), u.Which())
		p, err := capnp.Struct(u).Ptr(0)
		require.NoError(t, err)
		require.Equal(t, uint64(42), p.Struct().Uint64(0))
		qid := uint32(10 + i)
		r.callSized(qid, q, schema.Queue_TypeID, methodNodeInfo, capnp.ObjectSize{}, nil)
		requireNodeInfoReturn(t, r.recvReturn(qid))
		r.finish(qid, true)
	}
}

// evoNode is a hand-driven node on a real TCP socket for the Go client.
type evoNode struct {
	t    *testing.T
	ln   net.Listener
	conn net.Conn
	dec  *capnp.Decoder
}

func newEvoNode(t *testing.T) *evoNode {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	return &evoNode{t: t, ln: ln}
}

func (f *evoNode) accept() {
	f.t.Helper()
	c, err := f.ln.Accept()
	require.NoError(f.t, err)
	f.t.Cleanup(func() { _ = c.Close() })
	f.conn, f.dec = c, capnp.NewDecoder(c)
}

func (f *evoNode) send(build func(rpccp.Message) error) {
	f.t.Helper()
	_, err := f.conn.Write(rpcMessageBytes(f.t, build))
	require.NoError(f.t, err)
}

func (f *evoNode) recv() (rpccp.Message, error) {
	_ = f.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	msg, err := f.dec.Decode()
	if err != nil {
		return rpccp.Message{}, err
	}
	return rpccp.ReadRootMessage(msg)
}

// dial connects a Go client to the node, closed at the test's end.
func (f *evoNode) dial(ctx context.Context) *Client {
	f.t.Helper()
	c, err := Dial(ctx, f.ln.Addr().String(), ClientOptions{})
	require.NoError(f.t, err)
	f.t.Cleanup(func() { _ = c.Close() })
	return c
}

// recvExceptionReturn reads the next message, which must be a Return of
// question qid carrying an exception.
func (f *evoNode) recvExceptionReturn(qid uint32) error {
	m, err := f.recv()
	if err != nil {
		return err
	}
	requireExceptionReturn(f.t, m, qid)
	return nil
}

// serveBootstrap answers the client's Bootstrap with export id 0.
func (f *evoNode) serveBootstrap() {
	f.t.Helper()
	m, err := f.recv()
	require.NoError(f.t, err)
	require.Equal(f.t, rpccp.Message_Which_bootstrap, m.Which())
	bs, err := m.Bootstrap()
	require.NoError(f.t, err)
	_, err = f.conn.Write(bootstrapReturnBytes(f.t, bs.QuestionId()))
	require.NoError(f.t, err)
}

// TestSchemaEvo_ClientReadsOlderNodeInfo: a node older than
// nodeInfo's limit fields answers a NodeInfo of three pointers and no
// data: the client reads 0 for them and Limits gives the defaults, not 0.
func TestSchemaEvo_ClientReadsOlderNodeInfo(t *testing.T) {
	f := newEvoNode(t)
	done := make(chan error, 1)
	go func() {
		f.accept()
		f.serveBootstrap()
		for {
			m, err := f.recv()
			if err != nil {
				done <- err
				return
			}
			if m.Which() != rpccp.Message_Which_call {
				continue
			}
			call, _ := m.Call()
			_, err = f.conn.Write(returnBytes(t, call.QuestionId(), func(p rpccp.Payload) error {
				res, err := capnp.NewStruct(p.Segment(), capnp.ObjectSize{PointerCount: 2}) // status, info
				if err != nil {
					return err
				}
				info, err := capnp.NewStruct(p.Segment(), capnp.ObjectSize{PointerCount: 3})
				if err != nil {
					return err
				}
				if err := setText(info, 0, "v0.1"); err != nil {
					return err
				}
				if err := res.SetPtr(1, info.ToPtr()); err != nil {
					return err
				}
				return p.SetContent(res.ToPtr())
			}))
			done <- err
			return
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := f.dial(ctx)
	ni, err := c.NodeInfo(ctx)
	require.NoError(t, err)
	require.NoError(t, <-done)
	require.Equal(t, "v0.1", ni.Version)
	l := ni.Limits()
	d := storage.DefaultLimits
	require.Equal(t, d.MaxBatch, l.MaxBatch)
	require.Equal(t, d.MaxDelay, l.MaxDelay)
	require.Equal(t, 45*time.Second, ni.LeaseWithin(45*time.Second))
}
