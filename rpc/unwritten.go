package rpc

import (
	"net"
	"sync"
	"sync/atomic"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc/transport"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"

	"github.com/leaseq/leaseq/storage"
)

// What the go-capnp engine (a StartBootstrap listener, such as Queueber's,
// or --rpc-engine go-capnp) does with its answers once they are built.
// go-capnp's rpc.Conn hides its queue of outgoing messages, but every one
// of them goes through the connection's transport, which sees it written
// (Send) or dropped (Release without a Send): answerTransport.
//
//   - A poll answer with items that is never written, not a byte of it (the
//     connection ended or the node stopped while it waited behind a client
//     that reads nothing), gives its items back, ready again at once with
//     no attempt counted (Server.giveBack), as the lean engine does.
//     Found by review (session 70): go-capnp dropped such answers when the
//     connection closed, and their items stayed leased for the poll's
//     whole lease. An answer partly written is the client's, and its items
//     stay leased, as on the lean engine.
//   - So does one the client finished (cancelled) before a byte of it was
//     written: per Cap'n Proto a caller does not use the results of a
//     question it finished, and Queueber has no nack; its RPC library
//     drops the late answer. go-capnp still writes the Return (the client
//     needs it to reuse the question id), so the items may go out too,
//     but they are already ready again. Found by review (session 73): an
//     early Finish gave nothing back, and the items stayed leased for
//     the poll's whole lease with an attempt counted. (The lean engine
//     looks when the answer's write would start instead:
//     leanConn.finishedUnwritten.)
//   - A Return without capabilities is released once written. go-capnp
//     keeps a Return until the question's Finish, for calls pipelined on
//     its results; the transport's guard refuses those on any answer but
//     a Bootstrap's or a subscribe's, which hold a capability and are
//     kept. Found by review (session 70): a client that read its answers
//     and never sent Finish made the node keep every one of them (up to a
//     GiB a poll), uncounted by the reply budget, which counts an answer
//     until it is written.
//
// Each poll answer gives its items back at most once, by whichever of
// these removes its hook first under unwrittenAnswers.mu: the Finish, a
// drop, a write that wrote nothing, or the connection's end. The writer
// marks a hook as being written (sending) under the same lock before the
// first byte goes out, and a Finish leaves such a hook alone: once a
// write has started, it alone decides (nothing written: given back;
// anything written: the client's). A Finish that wins the lock takes the
// hook away, and the write that follows sends the answer unhooked. A
// Finish that comes before the handler hooked its answer is remembered
// (unwrittenAnswers.pending), and the hook gives back at once.

// unwrittenAnswers holds the give-back hooks of one go-capnp connection's
// poll answers, by their Return message, from when the handler built the
// answer until it is written, dropped, or the connection ends (close).
type unwrittenAnswers struct {
	mu    sync.Mutex
	hooks map[*capnp.Message]*answerHook
	// byQuestion are the hooked answers by their question id, for the
	// peer's Finish.
	byQuestion map[uint32]*capnp.Message
	// pending are the peer's calls whose Return has not started to go out
	// (nor been dropped) yet; true once the peer finished the call. A
	// Finish can come before the handler hooks its answer (between the
	// store's claim and the hook): register then gives back at once. A
	// call leaves pending before its Return's first byte is written, so
	// before the client can reuse its id.
	pending map[uint32]bool
	closed  bool           // the connection ended: nothing more is written
	running sync.WaitGroup // writes of hooked answers, and give-backs on a Finish, in progress
}

type answerHook struct {
	giveBack func(reason string)
	sending  bool   // its message is being written
	qid      uint32 // the question it answers
	hasQID   bool   // qid was read from the message
}

// Why a hooked answer's items are given back.
const (
	reasonConnEnded = "the connection ended before the poll's answer was written"
	reasonFinished  = "the client finished the poll before its answer was written"
)

func newUnwrittenAnswers() *unwrittenAnswers {
	return &unwrittenAnswers{hooks: make(map[*capnp.Message]*answerHook), byQuestion: make(map[uint32]*capnp.Message), pending: make(map[uint32]bool)}
}

// returnOf reports the question m answers, if m is a Return.
func returnOf(m rpccp.Message) (qid uint32, ok bool) {
	if m.Which() != rpccp.Message_Which_return {
		return 0, false
	}
	r, err := m.Return()
	if err != nil {
		return 0, false
	}
	return r.AnswerId(), true
}

// register runs giveBack if reply, the Return message of a call, is never
// written, not a byte of it, or if the client finishes the call before a
// byte of it is written. Once the connection has ended, or the client
// has finished the call, it runs it at once. A nil u (not a go-capnp
// connection) does nothing.
func (u *unwrittenAnswers) register(reply *capnp.Message, giveBack func(reason string)) {
	if u == nil || reply == nil {
		return
	}
	// go-capnp sets the Return's answer id before it calls the handler,
	// which is the only one to touch reply until it returns.
	h := &answerHook{giveBack: giveBack}
	if root, err := rpccp.ReadRootMessage(reply); err == nil {
		h.qid, h.hasQID = returnOf(root)
	}
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		giveBack(reasonConnEnded)
		return
	}
	if h.hasQID && u.pending[h.qid] {
		u.mu.Unlock()
		giveBack(reasonFinished)
		return
	}
	u.hooks[reply] = h
	if h.hasQID {
		u.byQuestion[h.qid] = reply
	}
	u.mu.Unlock()
}

// pollHook registers the give-back of pr's items for reply (register).
func (u *unwrittenAnswers) pollHook(s *Server, reply *capnp.Message, queue string, pr storage.PollResult) {
	if u == nil || len(pr.Items) == 0 {
		return
	}
	ids := itemIDs(pr.Items)
	u.register(reply, func(reason string) {
		s.giveBack(queue, pr.Lease, ids, reason)
	})
}

// unhookLocked removes h, m's hook.
// REQUIRES: u.mu held.
func (u *unwrittenAnswers) unhookLocked(m *capnp.Message, h *answerHook) {
	delete(u.hooks, m)
	if h.hasQID && u.byQuestion[h.qid] == m {
		delete(u.byQuestion, h.qid)
	}
}

// called notes a Call of the peer's, question qid.
func (u *unwrittenAnswers) called(qid uint32) {
	u.mu.Lock()
	u.pending[qid] = false
	u.mu.Unlock()
}

// finished handles the peer's Finish of question qid, before go-capnp
// reads it: the items of its answer, if hooked and not being written,
// are given back (see the top of the file for the rule).
func (u *unwrittenAnswers) finished(qid uint32) {
	u.mu.Lock()
	if _, ok := u.pending[qid]; ok {
		u.pending[qid] = true
	}
	m, ok := u.byQuestion[qid]
	h := u.hooks[m]
	if !ok || h == nil || h.sending || u.closed {
		u.mu.Unlock()
		return
	}
	u.unhookLocked(m, h)
	u.running.Add(1) // close waits for the give-back, which uses the store
	u.mu.Unlock()
	defer u.running.Done()
	h.giveBack(reasonFinished)
}

// sending marks m's hook (nil: none) as being written; done ends it.
// qid is the question m answers, if it is a Return (isReturn).
func (u *unwrittenAnswers) sending(m *capnp.Message, qid uint32, isReturn bool) *answerHook {
	u.mu.Lock()
	defer u.mu.Unlock()
	if isReturn {
		delete(u.pending, qid)
	}
	h := u.hooks[m]
	if h != nil {
		h.sending = true
		u.running.Add(1)
	}
	return h
}

// done ends the write of m (hook h, from sending): the items are given
// back if not a byte of it was written.
func (u *unwrittenAnswers) done(m *capnp.Message, h *answerHook, wroteNothing bool) {
	u.mu.Lock()
	u.unhookLocked(m, h)
	u.mu.Unlock()
	if wroteNothing {
		h.giveBack(reasonConnEnded)
	}
	u.running.Done()
}

// dropped gives back the items of m, released without being written
// (qid: the question it answers, if it is a Return).
func (u *unwrittenAnswers) dropped(m *capnp.Message, qid uint32, isReturn bool) {
	u.mu.Lock()
	if isReturn {
		delete(u.pending, qid)
	}
	h := u.hooks[m]
	if h == nil || h.sending {
		u.mu.Unlock()
		return
	}
	u.unhookLocked(m, h)
	u.mu.Unlock()
	h.giveBack(reasonConnEnded)
}

// close runs when the connection has ended and its socket is closed: no
// answer is written any more, so every one still hooked gives its items
// back (after the writes in progress end, which give back their own if
// they wrote nothing). go-capnp may release the messages later still.
func (u *unwrittenAnswers) close() {
	u.mu.Lock()
	u.closed = true
	var left []*answerHook
	for m, h := range u.hooks {
		if !h.sending {
			left = append(left, h)
			u.unhookLocked(m, h)
		}
	}
	u.mu.Unlock()
	for _, h := range left {
		h.giveBack(reasonConnEnded)
	}
	u.running.Wait()
}

// countingConn counts the bytes written to a connection, so that a
// failed write can tell whether it wrote any.
type countingConn struct {
	net.Conn
	written atomic.Uint64
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.written.Add(uint64(n))
	return n, err
}

// answerTransport is a go-capnp connection's transport seen from its
// outgoing messages and the peer's Calls and Finishes (see the top of
// this file).
type answerTransport struct {
	transport.Transport
	answers *unwrittenAnswers
	written *atomic.Uint64 // bytes written to the connection (countingConn)
}

// RecvMessage notes the peer's Calls and Finishes before go-capnp reads
// them: go-capnp may write a finished call's Return all the same.
func (t *answerTransport) RecvMessage() (transport.IncomingMessage, error) {
	in, err := t.Transport.RecvMessage()
	if err != nil {
		return nil, err
	}
	switch m := in.Message(); m.Which() {
	case rpccp.Message_Which_call:
		if c, err := m.Call(); err == nil {
			t.answers.called(c.QuestionId())
		}
	case rpccp.Message_Which_finish:
		if f, err := m.Finish(); err == nil {
			t.answers.finished(f.QuestionId())
		}
	}
	return in, nil
}

func (t *answerTransport) NewMessage() (transport.OutgoingMessage, error) {
	out, err := t.Transport.NewMessage()
	if err != nil {
		return nil, err
	}
	return &answerMsg{OutgoingMessage: out, t: t, key: out.Message().Message()}, nil
}

type answerMsg struct {
	transport.OutgoingMessage
	t        *answerTransport
	key      *capnp.Message // the message handlers and hooks know it by
	sent     bool           // Send was called
	released bool
}

// Send writes the message; go-capnp calls it once, on its send goroutine.
func (m *answerMsg) Send() error {
	// Read before the write: a Return without capabilities is released
	// after it (nothing reads it again; see the top of the file).
	m.sent = true
	qid, isReturn := returnOf(m.OutgoingMessage.Message())
	drop := isReturn && m.key.CapTable().Len() == 0
	h := m.t.answers.sending(m.key, qid, isReturn)
	before := m.t.written.Load()
	err := m.OutgoingMessage.Send()
	if h != nil {
		m.t.answers.done(m.key, h, err != nil && m.t.written.Load() == before)
	}
	if err == nil && drop {
		m.release()
	}
	return err
}

// Release gives back the items of a poll answer never written, and frees
// the message (once: Send may have freed it already).
func (m *answerMsg) Release() {
	if !m.sent {
		qid, isReturn := returnOf(m.OutgoingMessage.Message())
		m.t.answers.dropped(m.key, qid, isReturn)
	}
	m.release()
}

func (m *answerMsg) release() {
	if !m.released {
		m.released = true
		m.OutgoingMessage.Release()
	}
}
