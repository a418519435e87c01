package rpc

import (
	"context"
	"sync"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc/transport"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"

	"github.com/leaseq/leaseq/schema"
)

// Close and the polls in flight on the go-capnp engine (found by review,
// session 74), as leanclient_drain.go on the lean one: a poll's answer
// holds items the node leased for it, and one that nobody receives must be
// given back (Client.giveBack), not left leased until the lease ends.
//
// go-capnp's rpc.Conn gives no API for that, for three reasons:
//   - It tells the node to cancel a call (a Finish) only when the call's
//     context ends, and that also marks the question finished: its Return,
//     when it comes, is released unread (handleReturn), and the caller
//     gets the context's error. So a poll whose caller gave up, or that
//     Close stops, has an answer go-capnp drops.
//   - Conn.Close drops an answer on the wire with the connection.
//   - It does not say which question a call is.
//
// So each poll runs on a context of its own (cancelled when its caller's
// ends, or by Close), and the connection's transport is wrapped
// (pollWatch): it reads the lease and item ids of every poll's Return
// before go-capnp sees it, and that answer is given back once the caller
// is known not to have received it (its call failed). The question id is
// read from the Call message while go-capnp builds it: go-capnp sets the
// id, then places the params in the Call itself (newImportCallMessage,
// newPipelineCallMessage in v3.1.0-alpha.2). Were that to change, built
// stays false and a stopped poll's answer is dropped as it was before
// (TestClientClose_Capnp* would fail).
//
// Close (drain) stops the polls in flight, refuses new ones, and waits,
// within its bound, for each to settle: received by its caller, never
// sent, or answered (and given back). go-capnp sends a Finish only after
// its Call, and never sends a Call whose context ended first.
//
// Lock order: go-capnp's connection lock (held while built runs) ->
// capnpPolls.mu -> Client.gbMu (giveBackPoll). capnpPolls.mu is never
// held while calling into go-capnp, or while ending a call's context.

// capnpPoll is one poll on the go-capnp engine. REQUIRES: capnpPolls.mu
// held for every field but cancel.
type capnpPoll struct {
	cancel context.CancelFunc // ends the call's context: a Finish once sent

	qid      uint32
	built    bool // qid is known (the Call was built)
	sent     bool // the Call was written
	returned bool // its Return was read (gb, hasGB: what it leased)
	gb       pollGiveBack
	hasGB    bool

	stopped   bool // its context was ended: by its caller, or by Close (byClose)
	byClose   bool
	done      bool // its caller has its outcome: delivered, or an error
	delivered bool
	settled   bool // nothing more to do for it
	closeWait bool // Close waits for it to settle
}

// capnpPolls tracks the polls of a go-capnp engine Client.
type capnpPolls struct {
	readLimit uint64 // the codec's (traversalLimit, reset after the read)

	mu        sync.Mutex
	giveBack  func(pollGiveBack)      // Client.giveBack
	qs        map[uint32]*capnpPoll   // built, not yet returned, by question id
	open      map[*capnpPoll]struct{} // not settled
	draining  bool                    // Close has begun
	drainLeft int
	drainDone chan struct{}
}

func newCapnpPolls(readLimit uint64) *capnpPolls {
	return &capnpPolls{readLimit: readLimit, qs: make(map[uint32]*capnpPoll), open: make(map[*capnpPoll]struct{})}
}

// setGiveBack sets where answers nobody received go.
func (p *capnpPolls) setGiveBack(g func(pollGiveBack)) {
	p.mu.Lock()
	p.giveBack = g
	p.mu.Unlock()
}

// invokePoll calls poll with params filled by build, as invoke does; on
// the go-capnp engine, tracked so that an answer nobody receives is given
// back.
func (c *Client) invokePoll(ctx context.Context, build func(schema.Queue_poll_Params) error) (qfuture[schema.Queue_poll_Results], func()) {
	if c.lean != nil || c.cpolls == nil {
		return invoke(ctx, c, mPoll, build)
	}
	return c.cpolls.call(ctx, c, build)
}

// call makes a tracked poll: on a context of its own, which its caller's
// ending or Close cancels.
func (p *capnpPolls) call(ctx context.Context, c *Client, build func(schema.Queue_poll_Params) error) (qfuture[schema.Queue_poll_Results], func()) {
	if err := ctx.Err(); err != nil {
		// Found by review (session 74): the call's own context learns of
		// ctx's end on a goroutine (AfterFunc), so such a poll went out
		// and leased items for a caller that had given up. go-capnp does
		// not send a call whose context has ended.
		return leanFuture(mPoll, leanResult{err: err})
	}
	p.mu.Lock()
	if p.draining {
		p.mu.Unlock()
		return qfuture[schema.Queue_poll_Results]{get: func() (schema.Queue_poll_Results, error) {
			return schema.Queue_poll_Results{}, errClientClosing
		}}, func() {}
	}
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	rec := &capnpPoll{cancel: cancel}
	p.open[rec] = struct{}{}
	p.mu.Unlock()
	stopOnCtx := context.AfterFunc(ctx, func() { p.stop(rec) })
	// Read before the call, as invoke does: a reply refused before that
	// check would otherwise fail as disconnected.
	before := c.replyRefused()
	get, release := mPoll.capnp(c.q, pctx, func(pp schema.Queue_poll_Params) error {
		if err := build(pp); err != nil {
			return err
		}
		p.built(rec, pp.Segment().Message())
		return nil
	})
	tracked := func() (schema.Queue_poll_Results, error) {
		res, err := get()
		stopOnCtx()
		byClose, byCaller := p.finish(rec, err == nil)
		switch {
		case err == nil:
		case byClose:
			err = errClientClosing
		case byCaller && ctx.Err() != nil:
			err = ctx.Err() // not the Canceled of the call's own context
		}
		return res, err
	}
	return qfuture[schema.Queue_poll_Results]{get: refusedReplySince(c, before, tracked)}, func() {
		p.stop(rec) // an answer never asked for: no-op once it was read
		release()
		stopOnCtx()
		cancel()
		p.finish(rec, false)
	}
}

// stop ends rec's call context for its caller, which gave up (or
// releases the call without reading its answer).
func (p *capnpPolls) stop(rec *capnpPoll) {
	p.mu.Lock()
	if rec.done || rec.stopped {
		p.mu.Unlock()
		return
	}
	rec.stopped = true
	p.mu.Unlock()
	rec.cancel()
}

// built learns rec's question id from m, the Call go-capnp is building
// (it runs under go-capnp's connection lock: it takes only p.mu).
func (p *capnpPolls) built(rec *capnpPoll, m *capnp.Message) {
	root, err := rpccp.ReadRootMessage(m)
	if err != nil || root.Which() != rpccp.Message_Which_call {
		return
	}
	call, err := root.Call()
	if err != nil || call.InterfaceId() != schema.Queue_TypeID || call.MethodId() != mPoll.id {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if rec.done {
		return
	}
	rec.qid, rec.built = call.QuestionId(), true
	// An entry left under this id is a poll never sent (go-capnp frees
	// the id of a call it could not send at once): it gets no Return.
	p.qs[rec.qid] = rec
}

// sending returns the tracked poll whose Call m is, or nil.
func (p *capnpPolls) sending(m rpccp.Message) *capnpPoll {
	if m.Which() != rpccp.Message_Which_call {
		return nil
	}
	call, err := m.Call()
	if err != nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.qs[call.QuestionId()]
}

// sent notes that rec's Call was written: an answer will come (or the
// connection ends). It comes before the call can fail for its context
// (go-capnp watches the context once the Call is sent).
func (p *capnpPolls) sent(rec *capnpPoll) {
	p.mu.Lock()
	rec.sent = true
	p.mu.Unlock()
}

// returned handles the Return of a poll: ret as go-capnp is about to read
// it.
func (p *capnpPolls) returned(ret rpccp.Return) {
	qid := ret.AnswerId()
	p.mu.Lock()
	rec := p.qs[qid]
	p.mu.Unlock()
	if rec == nil {
		return
	}
	g, ok := returnPollGiveBack(ret)
	// What this read took from the message's traversal budget is given
	// back for go-capnp and the caller.
	if m := ret.Message(); m != nil {
		m.ResetReadLimit(traversalLimit(m, p.readLimit))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.qs, qid)
	rec.returned, rec.gb, rec.hasGB = true, g, ok
	p.settleLocked(rec)
}

// finish records the outcome of rec's call for its caller (delivered: it
// has the results) and reports who stopped it.
func (p *capnpPolls) finish(rec *capnpPoll, delivered bool) (byClose, byCaller bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rec.done {
		return false, false
	}
	rec.done, rec.delivered = true, delivered
	p.settleLocked(rec)
	return rec.byClose, rec.stopped && !rec.byClose
}

// settleLocked gives back rec's answer if its caller did not receive it,
// and counts rec off once nothing more will come for it. The give-back is
// counted (giveBacks) before Close can learn rec settled. REQUIRES: p.mu.
func (p *capnpPolls) settleLocked(rec *capnpPoll) {
	if rec.settled || !rec.done {
		return
	}
	switch {
	case rec.delivered:
	case rec.returned:
		if rec.hasGB && p.giveBack != nil {
			p.giveBack(rec.gb) // it does not wait: the nack runs on a goroutine of its own
		}
	case !rec.sent:
		// Never sent (a Call sent comes before the call's failure): no
		// answer will come.
		if rec.built && p.qs[rec.qid] == rec {
			delete(p.qs, rec.qid)
		}
	default:
		return // its answer is still to come
	}
	rec.settled = true
	delete(p.open, rec)
	if rec.closeWait {
		rec.closeWait = false
		p.drainLeft--
		if p.drainLeft == 0 {
			close(p.drainDone)
		}
	}
}

// drain stops the polls in flight and returns a channel closed once each
// poll not settled has settled. Later polls are refused.
func (p *capnpPolls) drain() <-chan struct{} {
	p.mu.Lock()
	p.draining = true
	p.drainDone = make(chan struct{})
	var cancels []context.CancelFunc
	for rec := range p.open {
		rec.closeWait = true
		p.drainLeft++
		if !rec.done && !rec.stopped {
			rec.stopped, rec.byClose = true, true
			cancels = append(cancels, rec.cancel)
		}
	}
	if p.drainLeft == 0 {
		close(p.drainDone)
	}
	done := p.drainDone
	p.mu.Unlock()
	for _, cancel := range cancels {
		cancel()
	}
	return done
}

// drainingPolls reports whether Close has begun stopping the polls.
func (p *capnpPolls) drainingPolls() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.draining
}

// pollWatch is the go-capnp engine's transport, which shows p the Calls
// of its polls as they are written and their Returns before go-capnp
// reads them.
type pollWatch struct {
	transport.Transport
	p *capnpPolls
}

func (t *pollWatch) NewMessage() (transport.OutgoingMessage, error) {
	out, err := t.Transport.NewMessage()
	if err != nil {
		return out, err
	}
	return watchedOut{OutgoingMessage: out, p: t.p}, nil
}

func (t *pollWatch) RecvMessage() (transport.IncomingMessage, error) {
	in, err := t.Transport.RecvMessage()
	if err != nil {
		return in, err
	}
	if m := in.Message(); m.Which() == rpccp.Message_Which_return {
		if ret, err := m.Return(); err == nil {
			t.p.returned(ret)
		}
	}
	return in, nil
}

type watchedOut struct {
	transport.OutgoingMessage
	p *capnpPolls
}

func (o watchedOut) Send() error {
	rec := o.p.sending(o.Message())
	err := o.OutgoingMessage.Send()
	if rec != nil && err == nil {
		o.p.sent(rec)
	}
	return err
}
