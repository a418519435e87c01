package rpc

import (
	"capnproto.org/go/capnp/v3/exc"
)

// Close and the polls in flight (found by review, session 73). A poll's
// answer holds items the node leased for it. Closing the connection while
// that answer is on its way would leave them leased to nobody until the
// lease ends: the node wrote the answer, so it cannot give them back. So
// Client.Close first stops the polls in flight (drainPolls): each caller
// still waiting gets errClientClosing at once, the node is told to cancel
// the call (a Finish: a long poll with nothing to hand out ends now), and
// the question stays open, gone, so that its answer, when it comes, is
// given back (abandoned) like that of a poll whose caller gave up. Close
// then waits, within its bound, until every such answer has been read.
//
// A Finish must never reach the node ahead of its Call (the node would
// not know the question). A poll registered but not yet sent when Close
// begins is therefore only counted; its caller, once the send returns,
// stops it itself (pollSent). Polls asked once Close has begun are
// refused before they are sent.

// errClientClosing fails a poll that Close stopped, or refused.
var errClientClosing = exc.New(exc.Disconnected, "", "client closed")

// drainPolls stops the polls in flight and returns a channel closed once
// the answer of each has been read (or its call was never sent). Later
// polls are refused. Someone reads while any question is open.
func (l *leanClient) drainPolls() <-chan struct{} {
	l.mu.Lock()
	l.draining = true
	l.drainDone = make(chan struct{})
	stopped := false
	if l.err == nil {
		for qid, q := range l.qs {
			if q.method != mPoll.id || q.answered {
				continue
			}
			q.closeWait = true
			l.drainLeft++
			if q.sent {
				stopped = l.stopPoll(qid, q) || stopped
			}
		}
	}
	if l.drainLeft == 0 {
		close(l.drainDone)
	}
	done := l.drainDone
	// As watchIdle: the read side is free only while no question is
	// open, or for the moment a caller takes between its send and its
	// read; taken here, that caller waits for its Return instead.
	wake := l.callersRead && !l.reading && l.pending > 0 && l.err == nil
	if wake {
		l.reading = true
	}
	l.mu.Unlock()
	if wake {
		l.wake <- struct{}{}
	}
	if stopped {
		l.flushPending()
	}
	return done
}

// pollSent is called by a poll's caller once its Call is sent: if Close
// began meanwhile, the poll is stopped as drainPolls stops those sent
// before it.
func (l *leanClient) pollSent(lc outCall) {
	if lc.q.method != mPoll.id {
		return
	}
	l.mu.Lock()
	lc.q.sent = true
	stopped := false
	if lc.q.closeWait && l.qs[lc.qid] == lc.q {
		stopped = l.stopPoll(lc.qid, lc.q)
	}
	l.mu.Unlock()
	if stopped {
		l.flushPending()
	}
}

// stopPoll fails a sent poll's caller with errClientClosing and queues its
// Finish, leaving the question open (gone) for its answer to be given
// back; it reports whether it queued a Finish. A caller that gave up
// already queued its own. REQUIRES: l.mu.
func (l *leanClient) stopPoll(qid uint32, q *leanQuestion) bool {
	if q.gone || q.answered || l.err != nil {
		return false
	}
	q.gone = true
	q.reply <- leanReply{err: errClientClosing} // empty: q was not answered
	l.addPendingFinish(qid, false, true)
	return true
}

// pollDrained counts off a poll Close waits for, whose answer was read or
// whose call was never sent. REQUIRES: l.mu.
func (l *leanClient) pollDrained(q *leanQuestion) {
	if !q.closeWait {
		return
	}
	q.closeWait = false
	l.drainLeft--
	if l.drainLeft == 0 {
		close(l.drainDone)
	}
}

// drainingPolls reports whether Close has begun stopping the polls.
func (l *leanClient) drainingPolls() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.draining
}
