package rpc

import (
	"context"
	"sync"

	"capnproto.org/go/capnp/v3"

	"github.com/leaseq/leaseq/schema"
)

// The Queue methods the Client calls, each with what both connection
// kinds need: its method id and its params and results types for the
// lean connection (leanclient.go), and the generated go-capnp call.

// qmethod is one Queue method with params P and results R.
type qmethod[P interface{ ToPtr() capnp.Ptr }, R any] struct {
	id    uint16
	newP  func(*capnp.Segment) (P, error)
	toR   func(capnp.Struct) R
	capnp func(q schema.Queue, ctx context.Context, build func(P) error) (func() (R, error), capnp.ReleaseFunc)
}

// qfuture is a call's answer: Struct waits for it (it already has on the
// lean connection), as the generated futures' Struct does.
type qfuture[R any] struct{ get func() (R, error) }

func (f qfuture[R]) Struct() (R, error) { return f.get() }

// invoke calls m with params filled by build (nil: none): on the lean
// connection when the client has one, else through go-capnp. release
// must be called once the results have been read.
func invoke[P interface{ ToPtr() capnp.Ptr }, R any](ctx context.Context, c *Client, m qmethod[P, R], build func(P) error) (qfuture[R], func()) {
	if c.lean == nil {
		// Read before the call: the node may answer it, and the codec
		// refuse that answer, before m.capnp returns. Found by review
		// (session 74): read after it, such a call failed as
		// disconnected, not with ErrReplyTooLarge.
		before := c.replyRefused()
		get, release := m.capnp(c.q, ctx, build)
		w := &capnpWait[R]{get: refusedReplySince(c, before, get), release: release}
		return qfuture[R]{get: func() (R, error) { return w.wait(ctx) }}, w.releaseOnce
	}
	res, release, err := c.lean.call(ctx, m.id, leanBuild(m, build))
	return leanFuture(m, leanResult{res: res, release: release, err: err})
}

// invokeMut is invoke for a call that changes the node's state (all but
// the reads: Poll, Peek, Stats, ...). When its error says the call may
// have reached the node and its answer did not come (outcomeUnknown), the
// error wraps ErrOutcomeUnknown as well. A call whose ctx has ended
// already is not sent, and its error does not wrap it; nor does that of
// a call that failed before it could be sent. The lean engine knows
// which calls were written (callSent). go-capnp does not say: a call it
// fails for its ctx or a lost connection is taken as sent, unless the
// connection had ended before the call was made (capnpLost). The error
// may then wrap ErrOutcomeUnknown for a call that never left the client
// (its ctx ended, or the connection was lost, while it waited for flow
// bytes or in go-capnp's send queue): a caller who takes the unknown for
// "may have been applied" is never wrong, as it would be the other way.
func invokeMut[P interface{ ToPtr() capnp.Ptr }, R any](ctx context.Context, c *Client, m qmethod[P, R], build func(P) error) (qfuture[R], func()) {
	if err := ctx.Err(); err != nil {
		return leanFuture(m, leanResult{err: err})
	}
	if c.lean != nil {
		res, release, sent, err := c.lean.callSent(ctx, m.id, leanBuild(m, build))
		return leanFuture(m, leanResult{res: res, release: release, err: unknownIfSent(sent, err)})
	}
	// Looked at before the call: a connection lost after it was made
	// may have taken the call with it.
	if c.capnpLost() {
		return invoke(ctx, c, m, build) // go-capnp fails it at once: not sent
	}
	f, release := invoke(ctx, c, m, build)
	return qfuture[R]{get: func() (R, error) {
		r, err := f.get()
		return r, outcomeUnknown(err)
	}}, release
}

// capnpLost reports whether the go-capnp connection has ended, or its
// codec refused a reply (it is ending): calls made now are not sent.
func (c *Client) capnpLost() bool {
	if c.replyRefused() {
		return true
	}
	select {
	case <-c.rc.Done():
		return true
	default:
		return false
	}
}

var (
	mEnqueue = qmethod[schema.Queue_enqueue_Params, schema.Queue_enqueue_Results]{
		id:   0,
		newP: schema.NewQueue_enqueue_Params,
		toR:  func(s capnp.Struct) schema.Queue_enqueue_Results { return schema.Queue_enqueue_Results(s) },
		capnp: func(q schema.Queue, ctx context.Context, b func(schema.Queue_enqueue_Params) error) (func() (schema.Queue_enqueue_Results, error), capnp.ReleaseFunc) {
			f, release := q.Enqueue(ctx, b)
			return f.Struct, release
		},
	}
	mPoll = qmethod[schema.Queue_poll_Params, schema.Queue_poll_Results]{
		id:   1,
		newP: schema.NewQueue_poll_Params,
		toR:  func(s capnp.Struct) schema.Queue_poll_Results { return schema.Queue_poll_Results(s) },
		capnp: func(q schema.Queue, ctx context.Context, b func(schema.Queue_poll_Params) error) (func() (schema.Queue_poll_Results, error), capnp.ReleaseFunc) {
			f, release := q.Poll(ctx, b)
			return f.Struct, release
		},
	}
	mAck = qmethod[schema.Queue_ack_Params, schema.Queue_ack_Results]{
		id:   2,
		newP: schema.NewQueue_ack_Params,
		toR:  func(s capnp.Struct) schema.Queue_ack_Results { return schema.Queue_ack_Results(s) },
		capnp: func(q schema.Queue, ctx context.Context, b func(schema.Queue_ack_Params) error) (func() (schema.Queue_ack_Results, error), capnp.ReleaseFunc) {
			f, release := q.Ack(ctx, b)
			return f.Struct, release
		},
	}
	mNack = qmethod[schema.Queue_nack_Params, schema.Queue_nack_Results]{
		id:   3,
		newP: schema.NewQueue_nack_Params,
		toR:  func(s capnp.Struct) schema.Queue_nack_Results { return schema.Queue_nack_Results(s) },
		capnp: func(q schema.Queue, ctx context.Context, b func(schema.Queue_nack_Params) error) (func() (schema.Queue_nack_Results, error), capnp.ReleaseFunc) {
			f, release := q.Nack(ctx, b)
			return f.Struct, release
		},
	}
	mExtend = qmethod[schema.Queue_extend_Params, schema.Queue_extend_Results]{
		id:   4,
		newP: schema.NewQueue_extend_Params,
		toR:  func(s capnp.Struct) schema.Queue_extend_Results { return schema.Queue_extend_Results(s) },
		capnp: func(q schema.Queue, ctx context.Context, b func(schema.Queue_extend_Params) error) (func() (schema.Queue_extend_Results, error), capnp.ReleaseFunc) {
			f, release := q.Extend(ctx, b)
			return f.Struct, release
		},
	}
	mStats = qmethod[schema.Queue_stats_Params, schema.Queue_stats_Results]{
		id:   5,
		newP: schema.NewQueue_stats_Params,
		toR:  func(s capnp.Struct) schema.Queue_stats_Results { return schema.Queue_stats_Results(s) },
		capnp: func(q schema.Queue, ctx context.Context, b func(schema.Queue_stats_Params) error) (func() (schema.Queue_stats_Results, error), capnp.ReleaseFunc) {
			f, release := q.Stats(ctx, b)
			return f.Struct, release
		},
	}
	mQueues = qmethod[schema.Queue_queues_Params, schema.Queue_queues_Results]{
		id:   6,
		newP: schema.NewQueue_queues_Params,
		toR:  func(s capnp.Struct) schema.Queue_queues_Results { return schema.Queue_queues_Results(s) },
		capnp: func(q schema.Queue, ctx context.Context, b func(schema.Queue_queues_Params) error) (func() (schema.Queue_queues_Results, error), capnp.ReleaseFunc) {
			f, release := q.Queues(ctx, b)
			return f.Struct, release
		},
	}
	mPeek = qmethod[schema.Queue_peek_Params, schema.Queue_peek_Results]{
		id:   7,
		newP: schema.NewQueue_peek_Params,
		toR:  func(s capnp.Struct) schema.Queue_peek_Results { return schema.Queue_peek_Results(s) },
		capnp: func(q schema.Queue, ctx context.Context, b func(schema.Queue_peek_Params) error) (func() (schema.Queue_peek_Results, error), capnp.ReleaseFunc) {
			f, release := q.Peek(ctx, b)
			return f.Struct, release
		},
	}
	mPurge = qmethod[schema.Queue_purge_Params, schema.Queue_purge_Results]{
		id:   8,
		newP: schema.NewQueue_purge_Params,
		toR:  func(s capnp.Struct) schema.Queue_purge_Results { return schema.Queue_purge_Results(s) },
		capnp: func(q schema.Queue, ctx context.Context, b func(schema.Queue_purge_Params) error) (func() (schema.Queue_purge_Results, error), capnp.ReleaseFunc) {
			f, release := q.Purge(ctx, b)
			return f.Struct, release
		},
	}
	mDeadList = qmethod[schema.Queue_deadList_Params, schema.Queue_deadList_Results]{
		id:   9,
		newP: schema.NewQueue_deadList_Params,
		toR:  func(s capnp.Struct) schema.Queue_deadList_Results { return schema.Queue_deadList_Results(s) },
		capnp: func(q schema.Queue, ctx context.Context, b func(schema.Queue_deadList_Params) error) (func() (schema.Queue_deadList_Results, error), capnp.ReleaseFunc) {
			f, release := q.DeadList(ctx, b)
			return f.Struct, release
		},
	}
	mRedrive = qmethod[schema.Queue_redrive_Params, schema.Queue_redrive_Results]{
		id:   10,
		newP: schema.NewQueue_redrive_Params,
		toR:  func(s capnp.Struct) schema.Queue_redrive_Results { return schema.Queue_redrive_Results(s) },
		capnp: func(q schema.Queue, ctx context.Context, b func(schema.Queue_redrive_Params) error) (func() (schema.Queue_redrive_Results, error), capnp.ReleaseFunc) {
			f, release := q.Redrive(ctx, b)
			return f.Struct, release
		},
	}
	mPurgeDead = qmethod[schema.Queue_purgeDead_Params, schema.Queue_purgeDead_Results]{
		id:   11,
		newP: schema.NewQueue_purgeDead_Params,
		toR:  func(s capnp.Struct) schema.Queue_purgeDead_Results { return schema.Queue_purgeDead_Results(s) },
		capnp: func(q schema.Queue, ctx context.Context, b func(schema.Queue_purgeDead_Params) error) (func() (schema.Queue_purgeDead_Results, error), capnp.ReleaseFunc) {
			f, release := q.PurgeDead(ctx, b)
			return f.Struct, release
		},
	}
	mGetConfig = qmethod[schema.Queue_getConfig_Params, schema.Queue_getConfig_Results]{
		id:   12,
		newP: schema.NewQueue_getConfig_Params,
		toR:  func(s capnp.Struct) schema.Queue_getConfig_Results { return schema.Queue_getConfig_Results(s) },
		capnp: func(q schema.Queue, ctx context.Context, b func(schema.Queue_getConfig_Params) error) (func() (schema.Queue_getConfig_Results, error), capnp.ReleaseFunc) {
			f, release := q.GetConfig(ctx, b)
			return f.Struct, release
		},
	}
	mSetConfig = qmethod[schema.Queue_setConfig_Params, schema.Queue_setConfig_Results]{
		id:   13,
		newP: schema.NewQueue_setConfig_Params,
		toR:  func(s capnp.Struct) schema.Queue_setConfig_Results { return schema.Queue_setConfig_Results(s) },
		capnp: func(q schema.Queue, ctx context.Context, b func(schema.Queue_setConfig_Params) error) (func() (schema.Queue_setConfig_Results, error), capnp.ReleaseFunc) {
			f, release := q.SetConfig(ctx, b)
			return f.Struct, release
		},
	}
	mNodeInfo = qmethod[schema.Queue_nodeInfo_Params, schema.Queue_nodeInfo_Results]{
		id:   15,
		newP: schema.NewQueue_nodeInfo_Params,
		toR:  func(s capnp.Struct) schema.Queue_nodeInfo_Results { return schema.Queue_nodeInfo_Results(s) },
		capnp: func(q schema.Queue, ctx context.Context, b func(schema.Queue_nodeInfo_Params) error) (func() (schema.Queue_nodeInfo_Results, error), capnp.ReleaseFunc) {
			f, release := q.NodeInfo(ctx, b)
			return f.Struct, release
		},
	}
	mDeleteQueue = qmethod[schema.Queue_deleteQueue_Params, schema.Queue_deleteQueue_Results]{
		id:   16,
		newP: schema.NewQueue_deleteQueue_Params,
		toR:  func(s capnp.Struct) schema.Queue_deleteQueue_Results { return schema.Queue_deleteQueue_Results(s) },
		capnp: func(q schema.Queue, ctx context.Context, b func(schema.Queue_deleteQueue_Params) error) (func() (schema.Queue_deleteQueue_Results, error), capnp.ReleaseFunc) {
			f, release := q.DeleteQueue(ctx, b)
			return f.Struct, release
		},
	}
)

// leanBuild adapts a params filler to the lean connection's builder.
func leanBuild[P interface{ ToPtr() capnp.Ptr }, R any](m qmethod[P, R], build func(P) error) func(*capnp.Segment) (capnp.Ptr, error) {
	return func(seg *capnp.Segment) (capnp.Ptr, error) {
		p, err := m.newP(seg)
		if err != nil {
			return capnp.Ptr{}, err
		}
		if build != nil {
			if err := build(p); err != nil {
				return capnp.Ptr{}, err
			}
		}
		return p.ToPtr(), nil
	}
}

// leanFuture turns a lean call's answer into invoke's future and release.
func leanFuture[P interface{ ToPtr() capnp.Ptr }, R any](m qmethod[P, R], r leanResult) (qfuture[R], func()) {
	if r.err != nil {
		err := r.err
		return qfuture[R]{get: func() (R, error) {
			var zero R
			return zero, err
		}}, func() {}
	}
	res := m.toR(r.res)
	return qfuture[R]{get: func() (R, error) { return res, nil }}, r.release
}

// replyRefused reports whether the go-capnp codec has refused a reply
// over the client's read limit (the connection then ends).
func (c *Client) replyRefused() bool {
	return c.codec != nil && c.codec.refused.Load() != nil
}

// refusedReplySince wraps the result getter of a call made through
// go-capnp: go-capnp fails the calls open on a connection whose codec
// refused a message over the client's read limit with a plain
// "connection closed", so a call that was open when that happened gets
// the codec's ErrReplyTooLarge instead, as on the lean engine. Calls made
// after it fail as disconnected. before is the codec's state read before
// the call was made (c.replyRefused): read after, a call whose answer was
// refused in between would fail as disconnected.
func refusedReplySince[R any](c *Client, before bool, get func() (R, error)) func() (R, error) {
	if c.codec == nil || before {
		return get
	}
	return func() (R, error) {
		r, err := get()
		if err != nil && isDisconnect(err) {
			if e := c.codec.refused.Load(); e != nil {
				err = e
			}
		}
		return r, err
	}
}

// capnpWait is a go-capnp call's answer, waited for until it comes or the
// caller's ctx ends, whichever first. Found by review (session 74):
// go-capnp's future waits in its send while the socket is full (a node
// that stopped reading), long past the call's ctx, so a call did not
// return when its ctx ended. The go-capnp call then goes on in the
// background; release runs once it has ended and the caller released it.
type capnpWait[R any] struct {
	get     func() (R, error) // go-capnp's future
	release func()
	// after, when set, turns get's result into the caller's, on the
	// goroutine that waited for it; taken is false when the caller had
	// given up (its result is then dropped).
	after func(r R, err error, taken bool) (R, error)

	start sync.Once
	done  chan struct{} // closed once get returned and after ran

	mu        sync.Mutex
	started   bool // get runs, or ran
	ended     bool // get returned and after ran
	taken     bool // the result is the caller's
	abandoned bool // the caller's ctx ended first
	released  bool // the caller released the call
	r         R
	err       error
}

// wait returns the call's result, or ctx's error when ctx ends first.
func (w *capnpWait[R]) wait(ctx context.Context) (R, error) {
	w.start.Do(func() {
		w.done = make(chan struct{})
		w.mu.Lock()
		w.started = true
		w.mu.Unlock()
		go w.run()
	})
	select {
	case <-w.done:
	case <-ctx.Done():
		w.mu.Lock()
		taken := w.taken
		if !taken {
			w.abandoned = true
		}
		w.mu.Unlock()
		if !taken {
			var zero R
			return zero, ctx.Err()
		}
		<-w.done // the result is decided: after is running
	}
	return w.r, w.err
}

func (w *capnpWait[R]) run() {
	r, err := w.get()
	w.mu.Lock()
	taken := !w.abandoned
	w.taken = taken
	w.mu.Unlock()
	if w.after != nil {
		r, err = w.after(r, err, taken)
	}
	w.mu.Lock()
	if taken {
		w.r, w.err = r, err
	}
	w.ended = true
	rel := w.released
	w.mu.Unlock()
	close(w.done)
	if rel {
		w.release()
	}
}

// releaseOnce releases the call: at once when its wait is over or never
// began, else when get returns.
func (w *capnpWait[R]) releaseOnce() {
	w.mu.Lock()
	if w.released {
		w.mu.Unlock()
		return
	}
	w.released = true
	now := !w.started || w.ended
	w.mu.Unlock()
	if now {
		w.release()
	}
}
