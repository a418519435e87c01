package rpc

import (
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
)

// abandoned handles the Return of a question whose caller gave up before
// reading it (q.gone, or answered while giveUp ran). A poll's answer
// holds items under a lease that nobody will process: a long poll that
// claimed items just as its context ended, or a consumer that is
// stopping. Without a give-back they would stay leased, invisible to
// every consumer, until the lease expires; so they are given back at
// once (l.giveBack: an undelivered nack, which takes the claim back and
// counts no attempt; it runs on a goroutine of its own, as the reader
// must not wait for a call, and Client.Close waits for it). Answers of
// other methods need nothing. The reader calls it with l.mu held (so that
// the give-back is counted before the question is freed): it must not
// take l.mu.
func (l *leanClient) abandoned(q *leanQuestion, ret rpccp.Return) {
	if q.method != mPoll.id || l.giveBack == nil {
		return
	}
	g, ok := returnPollGiveBack(ret)
	if !ok {
		return
	}
	l.giveBack(g) // it does not wait: the nack runs on a goroutine of its own
}
