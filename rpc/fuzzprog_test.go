package rpc

// The fuzz target's input language (FuzzServerConn, fuzz_test.go): how
// fuzz bytes become a sequence of rpc.capnp messages, well-formed or not.

import (
	"encoding/binary"
	"strings"
	"testing"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/schema"
)

// framedMessages splits data into framed messages: per message, one byte
// for the segment count (1-3), one per segment for its size in words, then
// the segments' bytes (zeros past the end of data).
func framedMessages(data []byte) [][]byte {
	src := &fuzzSrc{b: data}
	var out [][]byte
	for !src.empty() && len(out) < 64 {
		nseg := 1 + int(src.byte())%3
		sizes := make([]uint32, nseg)
		for i := range sizes {
			sizes[i] = uint32(src.byte())
		}
		hdr := make([]byte, 4+4*nseg)
		binary.LittleEndian.PutUint32(hdr, uint32(nseg-1))
		for i, s := range sizes {
			binary.LittleEndian.PutUint32(hdr[4+4*i:], s)
		}
		if len(hdr)%8 != 0 {
			hdr = append(hdr, 0, 0, 0, 0)
		}
		fr := hdr
		for _, s := range sizes {
			fr = append(fr, src.bytes(int(s)*8)...)
		}
		out = append(out, fr)
	}
	return out
}

// fuzzSrc hands out the fuzz input byte by byte; past its end, zeros.
type fuzzSrc struct{ b []byte }

func (s *fuzzSrc) empty() bool { return len(s.b) == 0 }

func (s *fuzzSrc) byte() byte {
	if len(s.b) == 0 {
		return 0
	}
	c := s.b[0]
	s.b = s.b[1:]
	return c
}

// bytes returns the next n bytes, zero-padded past the end of the input.
func (s *fuzzSrc) bytes(n int) []byte {
	out := make([]byte, n)
	k := copy(out, s.b)
	s.b = s.b[k:]
	return out
}

func (s *fuzzSrc) u64() uint64 { return binary.LittleEndian.Uint64(s.bytes(8)) }

// Opcodes of the structured mode: each message starts with one byte, whose
// value modulo numFuzzOps picks the message.
const (
	opBootstrap = iota
	opCall
	opFinish
	opRelease
	opReturn
	opDisembargo
	opAbort
	opResolve
	opUnimplemented
	opLevel3 // provide, accept or join
	opOddRoot
	numFuzzOps
)

// fuzzNames are the queue names the structured mode uses: a few valid
// ones, so calls reach the store, and a few invalid ones.
var fuzzNames = []string{"q", "jobs", "", "a/b", "fuzz", strings.Repeat("n", 300)}

// fuzzProgram runs data as a program of at most 64 messages (see the op*
// constants and the build functions for each one's operands) and returns
// them framed.
func fuzzProgram(t testing.TB, data []byte) [][]byte {
	src := &fuzzSrc{b: data}
	var out [][]byte
	for !src.empty() && len(out) < 64 {
		op := src.byte() % numFuzzOps
		if op == opOddRoot {
			out = append(out, oddRoot(t, src))
			continue
		}
		out = append(out, rpcMessageBytes(t, func(m rpccp.Message) error { return buildMessage(m, op, src) }))
	}
	return out
}

// oddRoot is a root struct of arbitrary shape: a union tag no Message has,
// or a Message whose fields have the wrong types.
func oddRoot(t testing.TB, src *fuzzSrc) []byte {
	msg, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	require.NoError(t, err)
	defer msg.Release()
	size := capnp.ObjectSize{DataSize: capnp.Size(8 * (src.byte() % 3)), PointerCount: uint16(src.byte() % 3)}
	st, err := capnp.NewRootStruct(seg, size)
	require.NoError(t, err)
	if size.DataSize > 0 {
		st.SetUint16(0, uint16(src.byte())%24) // the union tag
		if size.DataSize > 8 {
			st.SetUint64(8, src.u64())
		}
	}
	for i := uint16(0); i < size.PointerCount; i++ {
		p, err := fuzzPtr(seg, src, 0)
		require.NoError(t, err)
		require.NoError(t, st.SetPtr(i, p))
	}
	b, err := msg.Marshal()
	require.NoError(t, err)
	return b
}

func buildMessage(m rpccp.Message, op byte, src *fuzzSrc) error {
	switch op {
	case opBootstrap:
		b, err := m.NewBootstrap()
		if err != nil {
			return err
		}
		b.SetQuestionId(uint32(src.byte() % 16))
		return nil
	case opCall:
		return buildCall(m, src)
	case opFinish:
		f, err := m.NewFinish()
		if err != nil {
			return err
		}
		f.SetQuestionId(uint32(src.byte() % 16))
		flags := src.byte()
		f.SetReleaseResultCaps(flags&1 != 0)
		f.SetRequireEarlyCancellationWorkaround(flags&2 != 0)
		return nil
	case opRelease:
		r, err := m.NewRelease()
		if err != nil {
			return err
		}
		r.SetId(uint32(src.byte() % 8))
		r.SetReferenceCount(uint32(src.byte() % 4))
		return nil
	case opReturn:
		return buildReturn(m, src)
	case opDisembargo:
		d, err := m.NewDisembargo()
		if err != nil {
			return err
		}
		tgt, err := d.NewTarget()
		if err != nil {
			return err
		}
		if err := fuzzTarget(tgt, src); err != nil {
			return err
		}
		switch id := uint32(src.byte()); id % 3 {
		case 0:
			d.Context().SetSenderLoopback(id / 3 % 8)
		case 1:
			d.Context().SetReceiverLoopback(id / 3 % 8)
		default:
			return d.Context().SetAccept(src.bytes(int(id / 3 % 4)))
		}
		return nil
	case opAbort:
		e, err := m.NewAbort()
		if err != nil {
			return err
		}
		return fuzzException(e, src)
	case opResolve:
		r, err := m.NewResolve()
		if err != nil {
			return err
		}
		r.SetPromiseId(uint32(src.byte() % 8))
		if src.byte()%2 == 0 {
			d, err := r.NewCap()
			if err != nil {
				return err
			}
			return fuzzCapDescriptor(d, src)
		}
		e, err := r.NewException()
		if err != nil {
			return err
		}
		return fuzzException(e, src)
	case opUnimplemented:
		// Unimplemented echoes a message the server sent (or not).
		inner, err := m.NewUnimplemented()
		if err != nil {
			return err
		}
		sub := src.byte() % numFuzzOps
		if sub == opUnimplemented || sub == opOddRoot {
			sub = opCall
		}
		return buildMessage(inner, sub, src)
	case opLevel3:
		return buildLevel3(m, src)
	}
	return nil
}

func buildCall(m rpccp.Message, src *fuzzSrc) error {
	c, err := m.NewCall()
	if err != nil {
		return err
	}
	c.SetQuestionId(uint32(src.byte() % 16))
	tgt, err := c.NewTarget()
	if err != nil {
		return err
	}
	if err := fuzzTarget(tgt, src); err != nil {
		return err
	}
	switch src.byte() % 4 {
	case 0:
		c.SetInterfaceId(schema.Queue_TypeID)
	case 1:
		c.SetInterfaceId(schema.Consumer_TypeID)
	case 2:
		c.SetInterfaceId(schema.Subscription_TypeID)
	default:
		c.SetInterfaceId(src.u64())
	}
	c.SetMethodId(uint16(src.byte() % 20)) // Queue has 17 methods
	flags := src.byte()
	switch flags % 3 {
	case 1:
		c.SendResultsTo().SetYourself()
	case 2:
		if err := c.SendResultsTo().SetThirdParty(capnp.Ptr{}); err != nil {
			return err
		}
	}
	c.SetNoPromisePipelining(flags&4 != 0)
	c.SetOnlyPromisePipeline(flags&8 != 0)
	c.SetAllowThirdPartyTailCall(flags&16 != 0)
	p, err := c.NewParams()
	if err != nil {
		return err
	}
	return fuzzPayload(p, src)
}

func buildReturn(m rpccp.Message, src *fuzzSrc) error {
	r, err := m.NewReturn()
	if err != nil {
		return err
	}
	r.SetAnswerId(uint32(src.byte() % 16))
	flags := src.byte()
	r.SetReleaseParamCaps(flags&1 != 0)
	r.SetNoFinishNeeded(flags&2 != 0)
	switch flags / 4 % 6 {
	case 0:
		p, err := r.NewResults()
		if err != nil {
			return err
		}
		return fuzzPayload(p, src)
	case 1:
		e, err := r.NewException()
		if err != nil {
			return err
		}
		return fuzzException(e, src)
	case 2:
		r.SetCanceled()
	case 3:
		r.SetResultsSentElsewhere()
	case 4:
		r.SetTakeFromOtherQuestion(uint32(src.byte() % 16))
	default:
		return r.SetAwaitFromThirdParty(capnp.Ptr{})
	}
	return nil
}

func buildLevel3(m rpccp.Message, src *fuzzSrc) error {
	q := uint32(src.byte() % 16)
	switch src.byte() % 3 {
	case 0:
		p, err := m.NewProvide()
		if err != nil {
			return err
		}
		p.SetQuestionId(q)
		tgt, err := p.NewTarget()
		if err != nil {
			return err
		}
		return fuzzTarget(tgt, src)
	case 1:
		a, err := m.NewAccept()
		if err != nil {
			return err
		}
		a.SetQuestionId(q)
		return a.SetEmbargo(src.bytes(int(src.byte() % 4)))
	default:
		j, err := m.NewJoin()
		if err != nil {
			return err
		}
		j.SetQuestionId(q)
		tgt, err := j.NewTarget()
		if err != nil {
			return err
		}
		return fuzzTarget(tgt, src)
	}
}

// fuzzTarget is an imported capability (the bootstrap Queue is export 0
// once bootstrapped) or a promised answer with a short transform.
func fuzzTarget(tgt rpccp.MessageTarget, src *fuzzSrc) error {
	b := src.byte()
	if b%2 == 0 {
		tgt.SetImportedCap(uint32(b / 2 % 8))
		return nil
	}
	pa, err := tgt.NewPromisedAnswer()
	if err != nil {
		return err
	}
	return fuzzPromisedAnswer(pa, uint32(b/2%16), src)
}

func fuzzPromisedAnswer(pa rpccp.PromisedAnswer, q uint32, src *fuzzSrc) error {
	pa.SetQuestionId(q)
	n := int32(src.byte() % 3)
	if n == 0 {
		return nil
	}
	ops, err := pa.NewTransform(n)
	if err != nil {
		return err
	}
	for i := range int(n) {
		if b := src.byte(); b%2 == 0 {
			ops.At(i).SetNoop()
		} else {
			ops.At(i).SetGetPointerField(uint16(b / 2 % 4))
		}
	}
	return nil
}

func fuzzException(e rpccp.Exception, src *fuzzSrc) error {
	e.SetType(rpccp.Exception_Type(src.byte() % 5))
	return e.SetReason(string(src.bytes(int(src.byte() % 16))))
}

// fuzzPayload fills a Call's params or a Return's results: content and a
// cap table of up to 3 entries.
func fuzzPayload(p rpccp.Payload, src *fuzzSrc) error {
	content, err := fuzzPtr(p.Segment(), src, 0)
	if err != nil {
		return err
	}
	if err := p.SetContent(content); err != nil {
		return err
	}
	n := int32(src.byte() % 4)
	if n == 0 {
		return nil
	}
	caps, err := p.NewCapTable(n)
	if err != nil {
		return err
	}
	for i := range int(n) {
		if err := fuzzCapDescriptor(caps.At(i), src); err != nil {
			return err
		}
	}
	return nil
}

func fuzzCapDescriptor(d rpccp.CapDescriptor, src *fuzzSrc) error {
	b := src.byte()
	id := uint32(src.byte() % 8)
	switch b % 6 {
	case 0:
		d.SetNone()
	case 1:
		d.SetSenderHosted(id)
	case 2:
		d.SetSenderPromise(id)
	case 3:
		d.SetReceiverHosted(id)
	case 4:
		pa, err := d.NewReceiverAnswer()
		if err != nil {
			return err
		}
		return fuzzPromisedAnswer(pa, id*2%16, src)
	default:
		tp, err := d.NewThirdPartyHosted()
		if err != nil {
			return err
		}
		tp.SetVineId(id)
	}
	return nil
}

// fuzzPtr builds a pointer of the fuzz input's choosing: the kinds every
// Queue method's params hold (text, data, lists of items and ids, a
// capability), a generic params struct, or nothing. depth bounds nesting.
func fuzzPtr(seg *capnp.Segment, src *fuzzSrc, depth int) (capnp.Ptr, error) {
	switch src.byte() % 8 {
	case 1:
		return fuzzParams(seg, src, depth)
	case 2:
		txt, err := capnp.NewText(seg, fuzzNames[int(src.byte())%len(fuzzNames)])
		return txt.ToPtr(), err
	case 3:
		n := int(src.byte() % 24)
		if n%8 == 0 {
			n = 16 // ids and lease tokens
		}
		d, err := capnp.NewData(seg, src.bytes(n))
		return d.ToPtr(), err
	case 4: // items, as enqueue takes them
		n := int32(src.byte() % 4)
		l, err := capnp.NewCompositeList(seg, capnp.ObjectSize{DataSize: 16, PointerCount: 2}, n)
		if err != nil {
			return capnp.Ptr{}, err
		}
		for i := range int(n) {
			it := l.Struct(i)
			it.SetUint64(0, uint64(src.byte())*1000) // delayMs
			it.SetUint64(8, src.u64())               // priority, maxAttempts
			d, err := capnp.NewData(seg, src.bytes(int(src.byte()%8)))
			if err != nil {
				return capnp.Ptr{}, err
			}
			if err := it.SetPtr(0, d.ToPtr()); err != nil {
				return capnp.Ptr{}, err
			}
		}
		return l.ToPtr(), nil
	case 5: // ids
		n := int32(src.byte() % 4)
		l, err := capnp.NewDataList(seg, n)
		if err != nil {
			return capnp.Ptr{}, err
		}
		for i := range int(n) {
			size := 16
			if b := src.byte(); b%4 == 0 {
				size = int(b) % 20
			}
			if err := l.Set(i, src.bytes(size)); err != nil {
				return capnp.Ptr{}, err
			}
		}
		return l.ToPtr(), nil
	case 6: // a capability: an index into the payload's cap table
		return capnp.NewInterface(seg, capnp.CapabilityID(src.byte()%4)).ToPtr(), nil
	case 7:
		l, err := capnp.NewUInt64List(seg, int32(src.byte()%4))
		return l.ToPtr(), err
	}
	return capnp.Ptr{}, nil
}

// fuzzParams is a struct big enough to be any Queue method's params (and
// any result the server waits for): 3 data words of small, large or
// extreme values, and 4 pointers.
func fuzzParams(seg *capnp.Segment, src *fuzzSrc, depth int) (capnp.Ptr, error) {
	if depth > 2 {
		return capnp.Ptr{}, nil
	}
	st, err := capnp.NewStruct(seg, capnp.ObjectSize{DataSize: 24, PointerCount: 4})
	if err != nil {
		return capnp.Ptr{}, err
	}
	for i := range 3 {
		var v uint64
		switch b := src.byte(); b % 4 {
		case 1:
			v = uint64(b / 4)
		case 2:
			v = src.u64()
		case 3:
			v = ^uint64(b / 4)
		}
		st.SetUint64(capnp.DataOffset(8*i), v)
	}
	for i := range uint16(4) {
		p, err := fuzzPtr(seg, src, depth+1)
		if err != nil {
			return capnp.Ptr{}, err
		}
		if err := st.SetPtr(i, p); err != nil {
			return capnp.Ptr{}, err
		}
	}
	return st.ToPtr(), nil
}
