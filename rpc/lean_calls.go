package rpc

import (
	"context"
	"fmt"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/exc"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// handleCall starts one call; it owns in and held.
func (c *leanConn) handleCall(in *capnp.Message, m rpccp.Message, held flowHeld) error {
	call, err := m.Call()
	if err != nil {
		c.flow.release(held)
		in.Release()
		return protoErrf("read call: %v", err)
	}
	lc := &leanCall{qid: call.QuestionId(), iface: call.InterfaceId(), method: call.MethodId(), in: in, held: held, ans: &leanAnswer{}}
	c.mu.Lock()
	if c.mu.answers[lc.qid] != nil {
		c.mu.Unlock()
		c.releaseCall(lc)
		return protoErrf("call: question id %d is in use", lc.qid)
	}
	if err := c.questionRoomLocked(); err != nil {
		c.mu.Unlock()
		c.releaseCall(lc)
		return err
	}
	c.mu.answers[lc.qid] = lc.ans
	c.mu.Unlock()

	if call.SendResultsTo().Which() != rpccp.Call_sendResultsTo_Which_caller {
		c.fail(lc, exc.New(exc.Unimplemented, "", "results may only be sent to the caller"))
		return nil
	}
	params, err := call.Params()
	if err != nil {
		c.fail(lc, fmt.Errorf("read params: %w", err))
		return nil
	}
	content, err := params.Content()
	if err != nil {
		c.fail(lc, fmt.Errorf("read params: %w", err))
		return nil
	}
	lc.args = content.Struct()
	caps, err := c.importCaps(params)
	in.CapTable().Reset(caps...)
	if err != nil {
		c.fail(lc, err)
		return nil
	}
	target, err := call.Target()
	if err != nil {
		c.fail(lc, fmt.Errorf("read target: %w", err))
		return nil
	}
	switch target.Which() {
	case rpccp.MessageTarget_Which_importedCap:
		c.mu.Lock()
		e := c.mu.exports[target.ImportedCap()]
		var cl capnp.Client
		if e != nil {
			cl = e.client.AddRef()
		}
		c.mu.Unlock()
		if e == nil {
			c.fail(lc, exc.New(exc.Failed, "", fmt.Sprintf("call on unknown export id %d", target.ImportedCap())))
			return nil
		}
		c.dispatch(lc, e.queue, cl)
	case rpccp.MessageTarget_Which_promisedAnswer:
		pa, err := target.PromisedAnswer()
		if err != nil {
			c.fail(lc, fmt.Errorf("read target: %w", err))
			return nil
		}
		if pa.QuestionId() == lc.qid {
			// Its own answer can never resolve: a broken peer.
			c.mu.Lock()
			delete(c.mu.answers, lc.qid)
			c.mu.Unlock()
			c.releaseCall(lc)
			return protoErrf("call %d pipelined on its own answer", lc.qid)
		}
		if lc.transform, err = readTransform(pa); err != nil {
			c.fail(lc, err)
			return nil
		}
		c.mu.Lock()
		on := c.mu.answers[pa.QuestionId()]
		if on == nil || on.finished {
			c.mu.Unlock()
			c.fail(lc, exc.New(exc.Failed, "", fmt.Sprintf("call pipelined on unknown or finished question id %d", pa.QuestionId())))
			return nil
		}
		if !on.returned {
			lc.on = on
			on.pending = append(on.pending, lc)
			c.mu.Unlock()
			return nil
		}
		queue, cl, err := c.resolveLocked(on, lc.transform)
		c.mu.Unlock()
		if err != nil {
			c.fail(lc, err)
			return nil
		}
		c.dispatch(lc, queue, cl)
	default:
		c.fail(lc, exc.New(exc.Unimplemented, "", "unknown call target "+target.Which().String()))
	}
	return nil
}

// readTransform copies a promised answer's transform: the pointer fields
// to follow from the results to the target capability.
func readTransform(pa rpccp.PromisedAnswer) ([]uint16, error) {
	ops, err := pa.Transform()
	if err != nil {
		return nil, fmt.Errorf("read transform: %w", err)
	}
	out := make([]uint16, 0, ops.Len())
	for i := 0; i < ops.Len(); i++ {
		op := ops.At(i)
		switch op.Which() {
		case rpccp.PromisedAnswer_Op_Which_noop:
		case rpccp.PromisedAnswer_Op_Which_getPointerField:
			out = append(out, op.GetPointerField())
		default:
			return nil, exc.New(exc.Unimplemented, "", "unknown transform op "+op.Which().String())
		}
	}
	return out, nil
}

// resolveLocked finds the capability at transform in the returned answer
// a: the connection's Queue (queue) or another export's client (AddRef'd).
// REQUIRES: c.mu held, a returned.
func (c *leanConn) resolveLocked(a *leanAnswer, transform []uint16) (queue bool, cl capnp.Client, err error) {
	if a.err != nil {
		return false, capnp.Client{}, a.err
	}
	p := a.content
	for _, f := range transform {
		if p, err = p.Struct().Ptr(f); err != nil {
			return false, capnp.Client{}, fmt.Errorf("pipelined call: %w", err)
		}
	}
	iface := p.Interface()
	if !iface.IsValid() || int(iface.Capability()) >= len(a.caps) {
		return false, capnp.Client{}, exc.New(exc.Failed, "", "call on a null capability")
	}
	e := c.mu.exports[a.caps[iface.Capability()]]
	if e == nil {
		return false, capnp.Client{}, exc.New(exc.Failed, "", "call on a released capability")
	}
	return e.queue, e.client.AddRef(), nil
}

// dispatch runs lc on the connection's Queue (queue) or forwards it to cl
// (which it releases).
func (c *leanConn) dispatch(lc *leanCall, queue bool, cl capnp.Client) {
	if !queue {
		c.forward(lc, cl)
		return
	}
	if lc.iface != schema.Queue_TypeID {
		c.fail(lc, exc.New(exc.Unimplemented, "", fmt.Sprintf("interface %#x not implemented by Queue", lc.iface)))
		return
	}
	if int(lc.method) >= len(leanMethods) {
		c.fail(lc, exc.New(exc.Unimplemented, "", fmt.Sprintf("method %d of Queue not implemented", lc.method)))
		return
	}
	meth := &leanMethods[lc.method]
	// A poll's answer carries items under a lease: if none of it is
	// written, shutdown gives them back.
	lc.ans.poll = meth.op == OpPoll
	if meth.op != OpSubscribe && lc.in != nil && lc.in.CapTable().Len() > 0 {
		// Only subscribe takes a capability. The ones another call
		// carries are released here, and not by whoever completes the
		// call: a store's syncer, which serves every connection, would
		// send a Release for each.
		lc.in.CapTable().Reset()
	}
	// (A poll taken while the reply budget is spent goes there too: it
	// answers such a poll without calling the store.)
	if meth.op == OpPoll && (c.async != nil || schema.Queue_poll_Params(lc.args).WaitMs() > 0 || c.gate.over()) {
		c.longPoll(lc)
		return
	}
	if c.async != nil && c.runAsync(lc, meth.op) {
		return
	}
	if meth.mayWait(c, lc.args) {
		ctx, cancel := context.WithCancel(c.ctx)
		c.mu.Lock()
		lc.ans.cancel = cancel
		finished := lc.ans.finished
		c.mu.Unlock()
		if finished {
			cancel()
		}
		c.calls.Add(1)
		c.s.workers.run(func() {
			defer c.calls.Done()
			defer cancel()
			c.runQueue(ctx, lc, meth)
		})
		return
	}
	if meth.op == OpPeek || meth.op == OpDeadList {
		// The handler may wait for the reply budget: write what is
		// queued first, so that it is not waiting on the reader.
		c.idle()
		defer c.busy()
	}
	c.runQueue(c.ctx, lc, meth)
}

// runQueue runs one Queue method and sends its Return.
func (c *leanConn) runQueue(ctx context.Context, lc *leanCall, meth *leanMethod) {
	c.reply(lc, func(seg *capnp.Segment) (capnp.Struct, error) { return meth.run(c.q, ctx, lc.args, seg) })
}

// longPoll serves a poll that may wait (waitMs > 0) without a goroutine
// while it is parked: the dispatcher's PollAsync completes it. Its first
// attempt runs on the reader when the store never waits for I/O, else on a
// goroutine that ends when the poll parks or completes. A poll taken
// while the connection's reply budget is spent is answered empty at once.
func (c *leanConn) longPoll(lc *leanCall) {
	ctx, cancel := context.WithCancel(c.ctx)
	c.mu.Lock()
	lc.ans.cancel = cancel
	finished := lc.ans.finished
	c.mu.Unlock()
	if finished {
		cancel()
	}
	// With a store that completes calls asynchronously, the poll may be
	// answered by the store's syncer, or by an enqueue's (that claimed
	// for it).
	lc.ans.shared = c.async != nil
	t := c.q.begin(OpPoll)
	c.calls.Add(1)
	var queue string // set before the poll can claim
	complete := func(pr storage.PollResult, err error) {
		defer c.calls.Done()
		defer cancel()
		if err == nil {
			// What is left out goes back on a worker: the give-back
			// waits for the store, and the store's syncer may run this.
			c.s.trimPoll(c.gate, queue, &pr, c.giveBackLater)
		}
		c.reply(lc, func(seg *capnp.Segment) (capnp.Struct, error) {
			res, allocErr := schema.NewQueue_poll_Results(seg)
			err := t.finish(res, allocErr, func() error {
				if err != nil {
					return err
				}
				return writePoll(res, pr)
			})
			return res.ToPtr().Struct(), err
		})
	}
	if !t.ok {
		complete(storage.PollResult{}, nil) // finish answers "shutting down"
		return
	}
	p, wait, err := c.q.pollArgs(schema.Queue_poll_Params(lc.args))
	if err != nil {
		complete(storage.PollResult{}, err)
		return
	}
	queue = p.Queue
	if c.gate.over() {
		// The client has not read the answers it has (the reply budget
		// is spent): claiming would only give the items back (trimPoll),
		// two store writes for nothing each time it sends a poll. Found
		// by review (session 70). It gets what trimPoll would give it, an
		// empty answer, and the store is not called.
		complete(storage.PollResult{}, nil)
		return
	}
	if c.inline || c.async != nil {
		// The attempt does not wait: the store never does, or it
		// completes the poll on the goroutine that makes it durable.
		c.s.disp.PollAsync(ctx, p, wait, complete)
		return
	}
	c.s.workers.run(func() { c.s.disp.PollAsync(ctx, p, wait, complete) })
}

// giveBackLater gives back items of a poll answered without them
// (Server.giveBack) on a worker: it waits for the store, and the poll may
// complete on the store's own goroutine.
func (c *leanConn) giveBackLater(queue string, lease storage.LeaseID, ids []storage.ItemID, reason string) {
	c.calls.Add(1)
	c.s.workers.run(func() {
		defer c.calls.Done()
		c.s.giveBack(queue, lease, ids, reason)
	})
}

// reply runs a Queue method's body into a new Return (run builds the
// results in seg) and sends it, or the failure.
func (c *leanConn) reply(lc *leanCall, run func(seg *capnp.Segment) (capnp.Struct, error)) {
	msg, ret, err := newReturnMsg(lc.qid)
	if err != nil {
		c.fail(lc, err)
		return
	}
	payload, err := ret.NewResults()
	if err != nil {
		msg.Release()
		c.fail(lc, err)
		return
	}
	res, err := run(ret.Segment())
	if err == nil {
		err = payload.SetContent(res.ToPtr())
	}
	if err != nil {
		if c.gate != nil {
			c.gate.done(msg)
		}
		msg.Release()
		c.fail(lc, err)
		return
	}
	c.complete(lc, msg, payload, res.ToPtr())
}

// forward runs lc on cl (a go-capnp client: a Subscription) on a
// goroutine, and sends its Return.
func (c *leanConn) forward(lc *leanCall, cl capnp.Client) {
	ctx, cancel := context.WithCancel(c.ctx)
	c.mu.Lock()
	lc.ans.cancel = cancel
	finished := lc.ans.finished // before cancel was set: finish missed it
	c.mu.Unlock()
	if finished {
		cancel()
	}
	c.calls.Add(1)
	go func() {
		defer c.calls.Done()
		defer cancel()
		defer cl.Release()
		args := lc.args
		ans, release := cl.SendCall(ctx, capnp.Send{
			Method:   capnp.Method{InterfaceID: lc.iface, MethodID: lc.method},
			ArgsSize: args.Size(),
			PlaceArgs: func(dst capnp.Struct) error {
				if !args.IsValid() {
					return nil
				}
				return dst.CopyFrom(args)
			},
		})
		defer release()
		res, err := ans.Struct()
		if err != nil {
			c.fail(lc, err)
			return
		}
		msg, ret, err := newReturnMsg(lc.qid)
		if err != nil {
			c.fail(lc, err)
			return
		}
		payload, err := ret.NewResults()
		if err == nil {
			err = payload.SetContent(res.ToPtr()) // a deep copy, capabilities included
		}
		if err != nil {
			msg.Release()
			c.fail(lc, err)
			return
		}
		content, _ := payload.Content()
		c.complete(lc, msg, payload, content)
	}()
}

// complete sends lc's Return (msg, whose results are payload with content)
// and settles the answer: exports for the results' capabilities, the
// pipelined calls waiting for it.
func (c *leanConn) complete(lc *leanCall, msg *capnp.Message, payload rpccp.Payload, content capnp.Ptr) {
	c.releaseCall(lc)
	var ids []uint32
	ct := msg.CapTable()
	if n := ct.Len(); n > 0 {
		descs, err := payload.NewCapTable(int32(n))
		if err != nil {
			msg.Release()
			c.fail(lc, err)
			return
		}
		clients := make([]capnp.Client, n)
		for i := range clients {
			clients[i] = ct.At(i).AddRef()
		}
		ct.Reset() // the exports hold the references now
		c.mu.Lock()
		for i, cl := range clients {
			id := c.newExportLocked(&leanExport{client: cl})
			ids = append(ids, id)
			descs.At(i).SetSenderHosted(id)
		}
		c.mu.Unlock()
	}
	c.settle(lc.qid, lc.ans, nil, content, ids, msg)
}

// fail answers lc with an exception.
func (c *leanConn) fail(lc *leanCall, err error) {
	c.releaseCall(lc)
	msg, ret, e := newReturnMsg(lc.qid)
	if e == nil {
		var ex rpccp.Exception
		if ex, e = ret.NewException(); e == nil {
			e = ex.MarshalError(err)
		}
	}
	if e != nil {
		c.s.log.Warn("rpc: cannot build an exception return", "remote", c.remote, "err", e)
		msg = nil
	}
	c.settle(lc.qid, lc.ans, err, capnp.Ptr{}, nil, msg)
}

// releaseCall drops what the call held of the incoming message.
func (c *leanConn) releaseCall(lc *leanCall) {
	if lc.in == nil {
		return
	}
	lc.in.Release() // and the imported capabilities the handler did not keep
	lc.in = nil
	c.flow.release(lc.held)
	lc.held = flowHeld{}
}

// settle records a's outcome, sends msg (nil: nothing to send), and
// starts the calls pipelined on a.
func (c *leanConn) settle(qid uint32, a *leanAnswer, err error, content capnp.Ptr, caps []uint32, msg *capnp.Message) {
	var release []capnp.Client
	// Only a poll answer with items is one whose items may go back
	// (writeBatch, shutdown): an empty one is written as any other.
	poll := a.poll && err == nil && msg != nil && schema.Queue_poll_Results(content.Struct()).HasItems()
	if len(caps) == 0 {
		// The message goes back to its pool once written (see below), so
		// its results cannot be read later; with no capability in them,
		// every call pipelined on them is on a null capability anyway.
		content = capnp.Ptr{}
	}
	c.mu.Lock()
	a.returned, a.err, a.content, a.caps = true, err, content, caps
	pending := a.pending
	a.pending = nil
	if a.finished {
		if c.mu.answers[qid] == a {
			delete(c.mu.answers, qid)
		}
		if a.releaseResultCaps {
			release, _ = c.releaseCapsLocked(caps)
		}
	}
	c.mu.Unlock()
	if msg != nil {
		// Keep the message when pipelined calls may still read its
		// results (it has capabilities).
		c.sendFrame(outFrame{m: msg, keep: len(caps) > 0, poll: poll}, a.shared)
	}
	for _, cl := range release {
		cl.Release()
	}
	for _, p := range pending {
		c.mu.Lock()
		queue, cl, err := c.resolveLocked(a, p.transform)
		c.mu.Unlock()
		if err != nil {
			// Failed on this goroutine, which may serve other
			// connections (a's shared).
			p.ans.shared = p.ans.shared || a.shared
			c.fail(p, err)
			continue
		}
		c.dispatch(p, queue, cl)
	}
}

// newReturnMsg starts a Return message for question qid.
func newReturnMsg(qid uint32) (*capnp.Message, rpccp.Return, error) {
	msg, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	if err != nil {
		return nil, rpccp.Return{}, err
	}
	m, err := rpccp.NewRootMessage(seg)
	if err != nil {
		msg.Release()
		return nil, rpccp.Return{}, err
	}
	ret, err := m.NewReturn()
	if err != nil {
		msg.Release()
		return nil, rpccp.Return{}, err
	}
	ret.SetAnswerId(qid)
	// The capabilities of the params are released by the server itself,
	// each when the handler drops it (leanImport.Shutdown).
	ret.SetReleaseParamCaps(false)
	return msg, ret, nil
}

// leanMethod is one Queue method as the lean engine runs it.
type leanMethod struct {
	op Op
	// waits: the call may wait on its own (a long poll), whatever the
	// store (nil: only if the store waits).
	waits func(args capnp.Struct) bool
	// store: the call goes to the store.
	store bool
	run   func(q *queueServer, ctx context.Context, args capnp.Struct, seg *capnp.Segment) (capnp.Struct, error)
}

// mayWait reports whether the call must run on a goroutine of its own.
func (m *leanMethod) mayWait(c *leanConn, args capnp.Struct) bool {
	if m.waits != nil && m.waits(args) {
		return true
	}
	return m.store && !c.inline
}

// resultsStruct is what every generated *_Results is.
type resultsStruct interface {
	statusResults
	ToPtr() capnp.Ptr
}

// leanRun builds a method's results struct in seg and runs body on it
// with the accounting of queueServer.call.
func leanRun[R resultsStruct](q *queueServer, op Op, seg *capnp.Segment, newRes func(*capnp.Segment) (R, error), body func(R) error) (capnp.Struct, error) {
	res, err := newRes(seg)
	if err != nil {
		return capnp.Struct{}, err
	}
	err = q.call(op, res, nil, func() error { return body(res) })
	return res.ToPtr().Struct(), err
}

// leanMethods is indexed by method id (schema/queue.capnp, the same order
// as Op).
var leanMethods = [...]leanMethod{
	{op: OpEnqueue, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpEnqueue, seg, schema.NewQueue_enqueue_Results, func(res schema.Queue_enqueue_Results) error {
			return q.enqueue(ctx, schema.Queue_enqueue_Params(a), res)
		})
	}},
	{op: OpPoll, store: true, waits: func(a capnp.Struct) bool { return schema.Queue_poll_Params(a).WaitMs() > 0 }, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpPoll, seg, schema.NewQueue_poll_Results, func(res schema.Queue_poll_Results) error { return q.poll(ctx, schema.Queue_poll_Params(a), res) })
	}},
	{op: OpAck, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpAck, seg, schema.NewQueue_ack_Results, func(res schema.Queue_ack_Results) error { return q.ack(ctx, schema.Queue_ack_Params(a), res) })
	}},
	{op: OpNack, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpNack, seg, schema.NewQueue_nack_Results, func(res schema.Queue_nack_Results) error { return q.nack(ctx, schema.Queue_nack_Params(a), res) })
	}},
	{op: OpExtend, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpExtend, seg, schema.NewQueue_extend_Results, func(res schema.Queue_extend_Results) error { return q.extend(ctx, schema.Queue_extend_Params(a), res) })
	}},
	{op: OpStats, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpStats, seg, schema.NewQueue_stats_Results, func(res schema.Queue_stats_Results) error { return q.stats(ctx, schema.Queue_stats_Params(a), res) })
	}},
	{op: OpQueues, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpQueues, seg, schema.NewQueue_queues_Results, func(res schema.Queue_queues_Results) error { return q.queues(ctx, schema.Queue_queues_Params(a), res) })
	}},
	{op: OpPeek, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpPeek, seg, schema.NewQueue_peek_Results, func(res schema.Queue_peek_Results) error { return q.peek(ctx, schema.Queue_peek_Params(a), res) })
	}},
	{op: OpPurge, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpPurge, seg, schema.NewQueue_purge_Results, func(res schema.Queue_purge_Results) error { return q.purge(ctx, schema.Queue_purge_Params(a), res) })
	}},
	{op: OpDeadList, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpDeadList, seg, schema.NewQueue_deadList_Results, func(res schema.Queue_deadList_Results) error {
			return q.deadList(ctx, schema.Queue_deadList_Params(a), res)
		})
	}},
	{op: OpRedrive, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpRedrive, seg, schema.NewQueue_redrive_Results, func(res schema.Queue_redrive_Results) error {
			return q.redrive(ctx, schema.Queue_redrive_Params(a), res)
		})
	}},
	{op: OpPurgeDead, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpPurgeDead, seg, schema.NewQueue_purgeDead_Results, func(res schema.Queue_purgeDead_Results) error {
			return q.purgeDead(ctx, schema.Queue_purgeDead_Params(a), res)
		})
	}},
	{op: OpGetConfig, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpGetConfig, seg, schema.NewQueue_getConfig_Results, func(res schema.Queue_getConfig_Results) error {
			return q.getConfig(ctx, schema.Queue_getConfig_Params(a), res)
		})
	}},
	{op: OpSetConfig, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpSetConfig, seg, schema.NewQueue_setConfig_Results, func(res schema.Queue_setConfig_Results) error {
			return q.setConfig(ctx, schema.Queue_setConfig_Params(a), res)
		})
	}},
	{op: OpSubscribe, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpSubscribe, seg, schema.NewQueue_subscribe_Results, func(res schema.Queue_subscribe_Results) error {
			return q.subscribe(ctx, schema.Queue_subscribe_Params(a), res)
		})
	}},
	{op: OpNodeInfo, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpNodeInfo, seg, schema.NewQueue_nodeInfo_Results, func(res schema.Queue_nodeInfo_Results) error {
			return q.nodeInfo(ctx, schema.Queue_nodeInfo_Params(a), res)
		})
	}},
	{op: OpDeleteQueue, store: true, run: func(q *queueServer, ctx context.Context, a capnp.Struct, seg *capnp.Segment) (capnp.Struct, error) {
		return leanRun(q, OpDeleteQueue, seg, schema.NewQueue_deleteQueue_Results, func(res schema.Queue_deleteQueue_Results) error {
			return q.deleteQueue(ctx, schema.Queue_deleteQueue_Params(a), res)
		})
	}},
}
