package rpc

import (
	"testing"

	"capnproto.org/go/capnp/v3"
	"github.com/stretchr/testify/require"
)

// returnMsg is a Return message answering question qid, as go-capnp hands
// it to a handler (the answer id set).
func returnMsg(t *testing.T, qid uint32) *capnp.Message {
	t.Helper()
	msg, m, err := newRPCMessage()
	require.NoError(t, err)
	t.Cleanup(msg.Release)
	ret, err := m.NewReturn()
	require.NoError(t, err)
	ret.SetAnswerId(qid)
	return msg
}

// giveBacks records the reasons a hooked answer's items were given back.
type giveBacks []string

func (g *giveBacks) hook(reason string) { *g = append(*g, reason) }

// TestUnwrittenAnswers_FinishGivesBackOnlyUnwrittenAnswers walks the
// orders in which a poll answer's Finish, its write and the connection's
// end can meet (the rule at the top of unwritten.go): the items of an
// answer the client finished before a byte of it was written are given
// back, once, whatever comes after; an answer whose write has started is
// the write's to settle; a Finish before the answer is hooked gives back
// when it is; a Finish after the Return started out leaves a later call
// under the same question id alone.
// Found by review (session 73): a Finish gave nothing back, and the
// items of a cancelled poll stayed leased for the poll's whole lease.
func TestUnwrittenAnswers_FinishGivesBackOnlyUnwrittenAnswers(t *testing.T) {
	t.Parallel()

	t.Run("FinishBeforeTheWrite", func(t *testing.T) {
		u := newUnwrittenAnswers()
		var g giveBacks
		reply := returnMsg(t, 7)
		u.called(7)
		u.register(reply, g.hook)
		u.finished(7)
		require.Equal(t, giveBacks{reasonFinished}, g)
		// The answer still goes out, unhooked; nothing more is given back.
		h := u.sending(reply, 7, true)
		require.Nil(t, h)
		u.dropped(reply, 7, true)
		u.close()
		require.Equal(t, giveBacks{reasonFinished}, g)
	})

	t.Run("FinishDuringAWriteThatWrites", func(t *testing.T) {
		u := newUnwrittenAnswers()
		var g giveBacks
		reply := returnMsg(t, 7)
		u.called(7)
		u.register(reply, g.hook)
		h := u.sending(reply, 7, true)
		require.NotNil(t, h)
		u.finished(7) // the write has started: the client's
		u.done(reply, h, false)
		u.close()
		require.Empty(t, g)
	})

	t.Run("FinishDuringAWriteThatWritesNothing", func(t *testing.T) {
		u := newUnwrittenAnswers()
		var g giveBacks
		reply := returnMsg(t, 7)
		u.called(7)
		u.register(reply, g.hook)
		h := u.sending(reply, 7, true)
		u.finished(7)
		u.done(reply, h, true)
		u.close()
		require.Equal(t, giveBacks{reasonConnEnded}, g)
	})

	t.Run("FinishBeforeTheHook", func(t *testing.T) {
		u := newUnwrittenAnswers()
		var g giveBacks
		reply := returnMsg(t, 7)
		u.called(7)
		u.finished(7) // the handler has claimed the items, not hooked them yet
		u.register(reply, g.hook)
		require.Equal(t, giveBacks{reasonFinished}, g)
		require.Nil(t, u.sending(reply, 7, true))
		u.close()
		require.Len(t, g, 1)
	})

	t.Run("QuestionIDReusedAfterTheReturn", func(t *testing.T) {
		u := newUnwrittenAnswers()
		var g giveBacks
		first, second := returnMsg(t, 7), returnMsg(t, 7)
		u.called(7)
		h := u.sending(first, 7, true) // an answer without items, unhooked
		require.Nil(t, h)
		u.finished(7)
		u.called(7) // the client got the Return and reuses the id
		u.register(second, g.hook)
		require.Empty(t, g, "the earlier Finish is not the new call's")
		u.finished(7)
		require.Equal(t, giveBacks{reasonFinished}, g)
	})

	t.Run("FinishAfterTheConnectionEnded", func(t *testing.T) {
		u := newUnwrittenAnswers()
		var g giveBacks
		reply := returnMsg(t, 7)
		u.called(7)
		u.register(reply, g.hook)
		u.close()
		u.finished(7)
		u.dropped(reply, 7, true)
		require.Equal(t, giveBacks{reasonConnEnded}, g)
	})
}
