package rpc

import (
	"context"
	"fmt"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/exc"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
)

// importCaps turns a payload's capability descriptors into clients: a
// capability hosted by the client becomes a leanImport. Capabilities
// hosted by this server, promised answers and third parties are refused.
func (c *leanConn) importCaps(p rpccp.Payload) ([]capnp.Client, error) {
	if !p.HasCapTable() {
		return nil, nil
	}
	l, err := p.CapTable()
	if err != nil {
		return nil, fmt.Errorf("read cap table: %w", err)
	}
	out := make([]capnp.Client, l.Len())
	for i := range out {
		d := l.At(i)
		switch d.Which() {
		case rpccp.CapDescriptor_Which_none:
		case rpccp.CapDescriptor_Which_senderHosted:
			out[i] = capnp.NewClient(&leanImport{c: c, id: d.SenderHosted()})
		case rpccp.CapDescriptor_Which_senderPromise:
			// Calls to a promise go to its import id; the peer
			// forwards them once it resolves (see handleResolve).
			out[i] = capnp.NewClient(&leanImport{c: c, id: d.SenderPromise()})
		default:
			for _, cl := range out {
				cl.Release()
			}
			return nil, exc.New(exc.Unimplemented, "", "capability descriptor "+d.Which().String()+" not supported by this server")
		}
	}
	return out, nil
}

// handleReturn completes one of our calls to the client's capabilities.
// keep: the message is referenced by the answer (not to be released).
func (c *leanConn) handleReturn(m rpccp.Message) (keep bool, err error) {
	r, err := m.Return()
	if err != nil {
		return false, protoErrf("read return: %v", err)
	}
	id := r.AnswerId()
	p := c.takeQuestion(id)
	if p == nil {
		return false, protoErrf("return for unknown question id %d", id)
	}
	if p == canceledQuestion {
		return false, nil // its Finish was sent when the call was given up
	}
	switch r.Which() {
	case rpccp.Return_Which_results:
		payload, err := r.Results()
		var content capnp.Ptr
		if err == nil {
			content, err = payload.Content()
		}
		if err != nil {
			p.Reject(fmt.Errorf("read return: %w", err))
		} else {
			p.Fulfill(content)
			keep = true
		}
	case rpccp.Return_Which_exception:
		e, err := r.Exception()
		if err != nil {
			p.Reject(fmt.Errorf("read return: %w", err))
		} else {
			p.Reject(e.ToError())
		}
	case rpccp.Return_Which_canceled:
		p.Reject(exc.New(exc.Failed, "", "call canceled"))
	default:
		p.Reject(exc.New(exc.Unimplemented, "", "return "+r.Which().String()+" not supported"))
	}
	// Capabilities in the results are released by the Finish's flag.
	c.sendFinish(id, false)
	return keep, nil
}

// sendFinish ends question qid, releasing its results' capabilities
// (shared: as sendFrom).
func (c *leanConn) sendFinish(qid uint32, shared bool) {
	c.sendSmall(shared, func(m rpccp.Message) error {
		f, err := m.NewFinish()
		if err != nil {
			return err
		}
		f.SetQuestionId(qid)
		f.SetReleaseResultCaps(true)
		return nil
	})
}

// handleResolve takes the resolution of a promise the client passed in.
// Calls keep going to the promise's import id (the client forwards them),
// so a resolution to a capability is released at once.
func (c *leanConn) handleResolve(m rpccp.Message) error {
	r, err := m.Resolve()
	if err != nil {
		return protoErrf("read resolve: %v", err)
	}
	if r.Which() != rpccp.Resolve_Which_cap {
		return nil
	}
	d, err := r.Cap()
	if err != nil {
		return protoErrf("read resolve: %v", err)
	}
	switch d.Which() {
	case rpccp.CapDescriptor_Which_senderHosted:
		c.sendRelease(d.SenderHosted(), 1)
	case rpccp.CapDescriptor_Which_senderPromise:
		c.sendRelease(d.SenderPromise(), 1)
	}
	return nil
}

// handleDisembargo reflects a sender-loopback embargo, as the protocol
// asks. This server never resolves a promise it exported (it exports
// none), so it never sends one of its own.
func (c *leanConn) handleDisembargo(m rpccp.Message) error {
	d, err := m.Disembargo()
	if err != nil {
		return protoErrf("read disembargo: %v", err)
	}
	if d.Context().Which() != rpccp.Disembargo_context_Which_senderLoopback {
		return protoErrf("disembargo %s not expected", d.Context().Which())
	}
	target, err := d.Target()
	if err != nil {
		return protoErrf("read disembargo: %v", err)
	}
	embargo := d.Context().SenderLoopback()
	c.sendSmall(false, func(m rpccp.Message) error {
		out, err := m.NewDisembargo()
		if err != nil {
			return err
		}
		if err := out.SetTarget(target); err != nil {
			return err
		}
		out.Context().SetReceiverLoopback(embargo)
		return nil
	})
	return nil
}

// handleUnimplemented: the client did not understand a message of ours.
// For a call, that is its answer.
func (c *leanConn) handleUnimplemented(m rpccp.Message) error {
	u, err := m.Unimplemented()
	if err != nil || u.Which() != rpccp.Message_Which_call {
		return nil
	}
	call, err := u.Call()
	if err != nil {
		return nil
	}
	p := c.takeQuestion(call.QuestionId())
	if p != nil && p != canceledQuestion {
		p.Reject(exc.New(exc.Unimplemented, "", "call not implemented by the client"))
	}
	return nil
}

// canceledQuestion stands in the question table for a call the node gave
// up (its ctx ended): the id stays taken until the client's Return.
var canceledQuestion = new(capnp.Promise)

// takeQuestion removes question id from the table and returns it (nil if
// there is none), and stops the watch on its ctx.
func (c *leanConn) takeQuestion(id uint32) *capnp.Promise {
	c.mu.Lock()
	p := c.mu.questions[id]
	delete(c.mu.questions, id)
	stop := c.mu.qstops[id]
	delete(c.mu.qstops, id)
	c.mu.Unlock()
	if stop != nil {
		stop()
	}
	return p
}

// giveUpQuestion rejects question qid, if it still waits as p, with the
// ctx's error and tells the client with a Finish; its id stays taken
// until the client's Return.
func (c *leanConn) giveUpQuestion(ctx context.Context, qid uint32, p *capnp.Promise) {
	c.mu.Lock()
	mine := c.mu.questions != nil && c.mu.questions[qid] == p
	if mine {
		c.mu.questions[qid] = canceledQuestion
		delete(c.mu.qstops, qid)
	}
	c.mu.Unlock()
	if !mine {
		return
	}
	p.Reject(context.Cause(ctx))
	c.sendFinish(qid, true) // shared: ctx may end on any goroutine
}

// sendUnimplemented echoes m, a message of a kind the node does not
// implement, as the protocol asks. A message whose pointers cannot be
// copied is malformed: the connection ends with that reason (found by a
// fuzzing run, session 71: the copy's failure was logged as the node's
// own, "cannot build a message", and the connection went on).
func (c *leanConn) sendUnimplemented(m rpccp.Message) error {
	msg, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	if err != nil {
		return err
	}
	out, err := rpccp.NewRootMessage(seg)
	if err == nil {
		err = out.SetUnimplemented(m)
	}
	if err != nil {
		msg.Release()
		return protoErrf("unimplemented message that cannot be echoed: %v", err)
	}
	c.sendFrom(msg, false, false)
	return nil
}

func (c *leanConn) sendRelease(id, n uint32) {
	// Shared: the last reference may be dropped on any goroutine, a
	// store's syncer completing the call that carried the capability
	// among them, which must not wait for this client's socket.
	c.sendSmall(true, func(m rpccp.Message) error {
		r, err := m.NewRelease()
		if err != nil {
			return err
		}
		r.SetId(id)
		r.SetReferenceCount(n)
		return nil
	})
}

// leanImport is a capability the client passed in (a Consumer): calls on
// it are Call messages on the connection.
type leanImport struct {
	c  *leanConn
	id uint32
}

func (h *leanImport) Send(ctx context.Context, s capnp.Send) (*capnp.Answer, capnp.ReleaseFunc) {
	c := h.c
	msg, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	if err != nil {
		return capnp.ErrorAnswer(s.Method, err), func() {}
	}
	fail := func(err error) (*capnp.Answer, capnp.ReleaseFunc) {
		msg.Release()
		return capnp.ErrorAnswer(s.Method, err), func() {}
	}
	m, err := rpccp.NewRootMessage(seg)
	if err != nil {
		return fail(err)
	}
	call, err := m.NewCall()
	if err != nil {
		return fail(err)
	}
	target, err := call.NewTarget()
	if err != nil {
		return fail(err)
	}
	target.SetImportedCap(h.id)
	call.SetInterfaceId(s.Method.InterfaceID)
	call.SetMethodId(s.Method.MethodID)
	params, err := call.NewParams()
	if err != nil {
		return fail(err)
	}
	args, err := capnp.NewStruct(seg, s.ArgsSize)
	if err != nil {
		return fail(err)
	}
	if err := params.SetContent(args.ToPtr()); err != nil {
		return fail(err)
	}
	if s.PlaceArgs != nil {
		if err := s.PlaceArgs(args); err != nil {
			return fail(err)
		}
	}
	if msg.CapTable().Len() > 0 {
		return fail(exc.New(exc.Unimplemented, "", "passing capabilities to the client is not supported"))
	}
	p := capnp.NewPromise(s.Method, leanNoPipeline{}, nil)
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		return fail(exc.New(exc.Disconnected, "", "rpc: connection closed"))
	}
	// Ids only grow (until they wrap), so an id whose Finish is still
	// queued is never reused.
	for c.mu.questions[c.mu.nextQ] != nil {
		c.mu.nextQ++
	}
	qid := c.mu.nextQ
	c.mu.nextQ++
	c.mu.questions[qid] = p
	c.mu.Unlock()
	call.SetQuestionId(qid)
	c.send(msg, false)
	if ctx.Done() != nil {
		// The caller may give up (a Consumer.done with a timeout, at
		// Stop): the call is rejected then, not at the client's Return.
		// Watched once the Call is queued, so that its Finish follows it.
		c.mu.Lock()
		if c.mu.questions != nil && c.mu.questions[qid] == p {
			c.mu.qstops[qid] = context.AfterFunc(ctx, func() { c.giveUpQuestion(ctx, qid, p) })
		}
		c.mu.Unlock()
	}
	// The results alias the Return message, which is not reused.
	return p.Answer(), func() {}
}

func (h *leanImport) Recv(ctx context.Context, r capnp.Recv) capnp.PipelineCaller {
	r.Reject(exc.New(exc.Unimplemented, "", "local calls on a remote capability"))
	return nil
}

func (h *leanImport) Brand() capnp.Brand { return capnp.Brand{Value: h} }

// Shutdown releases the client's capability when the last reference here
// is dropped.
func (h *leanImport) Shutdown() {
	h.c.mu.Lock()
	closed := h.c.mu.closed
	h.c.mu.Unlock()
	if !closed {
		h.c.sendRelease(h.id, 1)
	}
}

func (h *leanImport) String() string { return fmt.Sprintf("leanImport{id: %d}", h.id) }

// leanNoPipeline refuses pipelined calls on the results of our calls to
// the client (deliver and done return no capabilities).
type leanNoPipeline struct{}

func (leanNoPipeline) PipelineSend(ctx context.Context, transform []capnp.PipelineOp, s capnp.Send) (*capnp.Answer, capnp.ReleaseFunc) {
	return capnp.ErrorAnswer(s.Method, exc.New(exc.Unimplemented, "", "pipelining on a call to the client")), func() {}
}

func (leanNoPipeline) PipelineRecv(ctx context.Context, transform []capnp.PipelineOp, r capnp.Recv) capnp.PipelineCaller {
	r.Reject(exc.New(exc.Unimplemented, "", "pipelining on a call to the client"))
	return nil
}
