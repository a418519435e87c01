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
//   - A Return without capabilities is released once written. go-capnp
//     keeps a Return until the question's Finish, for calls pipelined on
//     its results; the transport's guard refuses those on any answer but
//     a Bootstrap's or a subscribe's, which hold a capability and are
//     kept. Found by review (session 70): a client that read its answers
//     and never sent Finish made the node keep every one of them (up to a
//     GiB a poll), uncounted by the reply budget, which counts an answer
//     until it is written.

// unwrittenAnswers holds the give-back hooks of one go-capnp connection's
// poll answers, by their Return message, from when the handler built the
// answer until it is written, dropped, or the connection ends (close).
type unwrittenAnswers struct {
	mu      sync.Mutex
	hooks   map[*capnp.Message]*answerHook
	closed  bool           // the connection ended: nothing more is written
	running sync.WaitGroup // writes of hooked answers in progress
}

type answerHook struct {
	giveBack func()
	sending  bool // its message is being written
}

func newUnwrittenAnswers() *unwrittenAnswers {
	return &unwrittenAnswers{hooks: make(map[*capnp.Message]*answerHook)}
}

// register runs giveBack if reply, the Return message of a call, is never
// written, not a byte of it. Once the connection has ended it runs it at
// once. A nil u (not a go-capnp connection) does nothing.
func (u *unwrittenAnswers) register(reply *capnp.Message, giveBack func()) {
	if u == nil || reply == nil {
		return
	}
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		giveBack()
		return
	}
	u.hooks[reply] = &answerHook{giveBack: giveBack}
	u.mu.Unlock()
}

// pollHook registers the give-back of pr's items for reply (register).
func (u *unwrittenAnswers) pollHook(s *Server, reply *capnp.Message, queue string, pr storage.PollResult) {
	if u == nil || len(pr.Items) == 0 {
		return
	}
	ids := itemIDs(pr.Items)
	u.register(reply, func() {
		s.giveBack(queue, pr.Lease, ids, "the connection ended before the poll's answer was written")
	})
}

// sending marks m's hook (nil: none) as being written; done ends it.
func (u *unwrittenAnswers) sending(m *capnp.Message) *answerHook {
	u.mu.Lock()
	defer u.mu.Unlock()
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
	delete(u.hooks, m)
	u.mu.Unlock()
	if wroteNothing {
		h.giveBack()
	}
	u.running.Done()
}

// dropped gives back the items of m, released without being written.
func (u *unwrittenAnswers) dropped(m *capnp.Message) {
	u.mu.Lock()
	h := u.hooks[m]
	if h == nil || h.sending {
		u.mu.Unlock()
		return
	}
	delete(u.hooks, m)
	u.mu.Unlock()
	h.giveBack()
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
			delete(u.hooks, m)
		}
	}
	u.mu.Unlock()
	for _, h := range left {
		h.giveBack()
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
// outgoing messages (see the top of this file).
type answerTransport struct {
	transport.Transport
	answers *unwrittenAnswers
	written *atomic.Uint64 // bytes written to the connection (countingConn)
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
	released bool
}

// Send writes the message; go-capnp calls it once, on its send goroutine.
func (m *answerMsg) Send() error {
	// Read before the write: a Return without capabilities is released
	// after it (nothing reads it again; see the top of the file).
	drop := m.OutgoingMessage.Message().Which() == rpccp.Message_Which_return && m.key.CapTable().Len() == 0
	h := m.t.answers.sending(m.key)
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
	m.t.answers.dropped(m.key)
	m.release()
}

func (m *answerMsg) release() {
	if !m.released {
		m.released = true
		m.OutgoingMessage.Release()
	}
}
