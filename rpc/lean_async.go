package rpc

import (
	"capnproto.org/go/capnp/v3"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// Calls completed by the store (storage.Async). With a store whose calls
// wait for an fsync, an enqueue or an ack does not take a goroutine of
// its own: the reader decodes it, hands it to the store (leading the
// store's batch itself when nobody else does) and reads on; the store
// completes it on the goroutine that fsynced it, which builds and sends
// the Return there. So one fsync's goroutine answers every call it
// covered, where each call's goroutine used to be woken to answer its
// own (docs/BENCHMARKS.md, "Calls completed by the fsync's goroutine").
// Polls take the same way through the dispatcher (longPoll).

// runAsync serves lc, a call of op, through the store's asynchronous
// calls, and reports whether it did (false: op has none).
func (c *leanConn) runAsync(lc *leanCall, op Op) bool {
	switch op {
	case OpEnqueue:
		c.enqueueAsync(lc)
	case OpAck:
		c.ackAsync(lc)
	default:
		return false
	}
	return true
}

// asyncCall begins an asynchronous call of op on lc: start runs it, and
// must call complete exactly once, with the call's error or nil after it
// made write ready to build the results in res.
func asyncCall[R resultsStruct](c *leanConn, lc *leanCall, op Op, newRes func(*capnp.Segment) (R, error),
	start func(complete func(write func(R) error, err error))) {
	lc.ans.shared = true // answered by the store's syncer
	t := c.q.begin(op)
	c.calls.Add(1)
	complete := func(write func(R) error, err error) {
		defer c.calls.Done()
		c.reply(lc, func(seg *capnp.Segment) (capnp.Struct, error) {
			res, allocErr := newRes(seg)
			err := t.finish(res, allocErr, func() error {
				if err != nil {
					return err
				}
				return write(res)
			})
			return res.ToPtr().Struct(), err
		})
	}
	if !t.ok {
		complete(nil, nil) // finish answers "shutting down"
		return
	}
	start(complete)
}

// enqueueAsync is the enqueue of queueServer.enqueue, completed by the
// store.
func (c *leanConn) enqueueAsync(lc *leanCall) {
	asyncCall(c, lc, OpEnqueue, schema.NewQueue_enqueue_Results, func(complete func(func(schema.Queue_enqueue_Results) error, error)) {
		e, err := c.q.enqueueArgs(schema.Queue_enqueue_Params(lc.args))
		if err != nil {
			complete(nil, err)
			return
		}
		// complete builds and sends the answer before it returns: e goes
		// back to its pool after it.
		write := func(res schema.Queue_enqueue_Results) error { return writeEnqueue(res, e.results) }
		if len(e.items) == 0 {
			complete(write, nil)
			e.release()
			return
		}
		p, err := c.s.enqueueParams(storage.EnqueueParams{Queue: e.queue, Items: e.items})
		if err != nil {
			complete(nil, err)
			e.release()
			return
		}
		c.s.disp.EnqueueAsync(c.ctx, c.async, p, func(out []storage.EnqueueResult, err error) {
			out, err = enqueueOut(p, out, err)
			if err == nil {
				e.merge(out)
			}
			complete(write, err)
			e.release()
		})
	})
}

// ackAsync is the ack of queueServer.ack, completed by the store.
func (c *leanConn) ackAsync(lc *leanCall) {
	asyncCall(c, lc, OpAck, schema.NewQueue_ack_Results, func(complete func(func(schema.Queue_ack_Results) error, error)) {
		queue, lease, ids, err := c.q.parseSettle(schema.Queue_ack_Params(lc.args))
		if err != nil {
			complete(nil, err)
			return
		}
		p := storage.AckParams{Queue: queue, Lease: lease, IDs: ids}
		if err := p.Validate(c.s.limits); err != nil {
			complete(nil, err)
			return
		}
		p.Now = c.s.cfg.Clock.Now()
		c.async.AckAsync(c.ctx, p, func(codes []storage.Code, err error) {
			if err == nil {
				c.s.tracker.settled(p.Lease, codes)
			}
			complete(func(res schema.Queue_ack_Results) error { return setCodes(res.NewCodes, codes) }, err)
		})
	})
}
