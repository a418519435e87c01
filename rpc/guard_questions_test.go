package rpc

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestGuardTransport_OpenQuestionsBounded: a client that opens questions
// and never finishes them. The node keeps an answer (about a KiB on
// go-capnp) for each question until its Finish, so past the bound
// (ServerConfig.maxOpenQuestions, leanMaxOpenQuestions by default) the
// connection ends with an Abort that says why, on either engine; finished
// questions make room again, and the node serves on.
// Found by review (session 73): go-capnp's rpc.Conn, which serves every
// Queueber connection and --rpc-engine go-capnp, kept an answer per
// unfinished question and nothing bounded them (guardTransport counted no
// questions; only the lean engine did): a client's calls without Finish
// grew the node's memory without end.
func TestGuardTransport_OpenQuestionsBounded(t *testing.T) {
	t.Parallel()
	const limit = 8
	b := setup(t, bundleOpts{factory: rocksFactory(), mutate: func(c *ServerConfig) { c.maxOpenQuestions = limit }})
	reason := abortPastOpenQuestions(t, b, limit)
	t.Logf("engine %s: abort %q", testEngine, reason)
	require.Contains(t, reason, "more than 8 questions without a Finish")
	requireServing(t, b)
}

// abortPastOpenQuestions opens and finishes 3*limit questions on a raw
// connection to b, each answered, then keeps limit open (the bootstrap
// among them) and sends one more call: it returns the reason of the
// Abort that answers it.
func abortPastOpenQuestions(t *testing.T, b *testBundle, limit uint32) string {
	t.Helper()
	r := newRaw(t, b)
	boot := r.bootstrap(0) // open question 1 of limit
	for q := uint32(1); q <= 3*limit; q++ {
		r.call(q, methodNodeInfo, onImport(boot), nil)
		requireNodeInfoReturn(t, r.recvReturn(q))
		r.finish(q, true)
	}
	for q := uint32(100); q < 100+limit-1; q++ {
		r.call(q, methodNodeInfo, onImport(boot), nil)
		requireNodeInfoReturn(t, r.recvReturn(q))
	}
	r.call(200, methodNodeInfo, onImport(boot), nil)
	return r.recvAbort()
}
