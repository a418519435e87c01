package rpc

import (
	"fmt"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
)

// Messages the node starts on a lean client's connection. The client
// only asks, but the protocol lets the node send it anything: a message
// kind newer than the client's rpc.capnp (or a level 2+ one) must be
// echoed in an Unimplemented, since that echo is how a newer node learns
// to fall back; a Call or a Bootstrap waits for its Return, and would
// wait forever without one. The client hosts no capabilities on this
// connection (a subscription's Consumer lives on the go-capnp connection,
// Client.capnpConn), so both are answered with an exception.

// maxNodeReplies bounds the replies a connection writes to messages the
// node started. A node that learns from them sends a few; one that keeps
// sending them would keep the client writing without bound, so past the
// bound the connection ends (the node bounds its own echoes likewise).
const maxNodeReplies = 64

// answerNode replies to m, a message the node started that the client
// does not act on. The reply is built before the caller releases m (an
// echo copies it) and written by the write lock's holder, so the reader
// never waits on the socket for it. An error ends the connection.
func (l *leanClient) answerNode(m rpccp.Message) error {
	var reply *capnp.Message
	var err error
	switch m.Which() {
	case rpccp.Message_Which_unimplemented, rpccp.Message_Which_abort:
		// Never answered: echoing an Unimplemented would loop, and an
		// Abort ends the connection (the callers see to it).
		return nil
	case rpccp.Message_Which_finish, rpccp.Message_Which_release,
		rpccp.Message_Which_resolve, rpccp.Message_Which_disembargo:
		// Understood, and about questions the client answered with an
		// exception or capabilities and promises it never holds:
		// nothing to do.
		return nil
	case rpccp.Message_Which_call:
		c, e := m.Call()
		if e != nil {
			return e
		}
		reply, err = exceptionReturn(c.QuestionId(), "the client hosts no capabilities")
	case rpccp.Message_Which_bootstrap:
		b, e := m.Bootstrap()
		if e != nil {
			return e
		}
		reply, err = exceptionReturn(b.QuestionId(), "the client offers no bootstrap capability")
	default:
		reply, err = echoUnimplemented(m)
	}
	if err != nil {
		return err
	}
	return l.queueReply(reply)
}

// exceptionReturn is a Return of question qid holding an unimplemented
// exception. releaseParamCaps keeps its default, true: capabilities the
// node passed in the call are released with it.
func exceptionReturn(qid uint32, reason string) (*capnp.Message, error) {
	msg, m, err := newRPCMessage()
	if err != nil {
		return nil, err
	}
	ret, err := m.NewReturn()
	if err == nil {
		ret.SetAnswerId(qid)
		var e rpccp.Exception
		if e, err = ret.NewException(); err == nil {
			e.SetType(rpccp.Exception_Type_unimplemented)
			err = e.SetReason(reason)
		}
	}
	if err != nil {
		msg.Release()
		return nil, err
	}
	return msg, nil
}

// echoUnimplemented is an Unimplemented message holding a copy of m. A
// message that cannot be copied is malformed, and ends the connection.
func echoUnimplemented(m rpccp.Message) (*capnp.Message, error) {
	msg, out, err := newRPCMessage()
	if err != nil {
		return nil, err
	}
	if err := out.SetUnimplemented(m); err != nil {
		msg.Release()
		return nil, fmt.Errorf("message of kind %d that cannot be echoed: %w", m.Which(), err)
	}
	return msg, nil
}

// queueReply leaves reply for the write lock's holder, as a Finish that
// finds the lock taken (writePending writes it, at once), then tries to
// write it. It owns reply.
func (l *leanClient) queueReply(reply *capnp.Message) error {
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		reply.Release()
		return nil // the connection is gone: nothing to answer
	}
	l.nodeReplies++
	if l.nodeReplies > maxNodeReplies {
		l.mu.Unlock()
		reply.Release()
		return fmt.Errorf("the node sent more than %d messages the client had to answer (unknown kinds, calls or bootstraps)", maxNodeReplies)
	}
	l.replies = append(l.replies, reply)
	l.pendNow = true
	l.storePendN()
	l.mu.Unlock()
	l.flushPending()
	return nil
}
