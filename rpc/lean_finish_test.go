package rpc

import (
	"math/rand/v2"
	"testing"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"
)

// finishFrame encodes a Finish as the Go client (and rawRPC) does.
func finishFrame(t *testing.T, qid uint32, release, earlyCancel bool) []byte {
	t.Helper()
	msg, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	require.NoError(t, err)
	m, err := rpccp.NewRootMessage(seg)
	require.NoError(t, err)
	f, err := m.NewFinish()
	require.NoError(t, err)
	f.SetQuestionId(qid)
	f.SetReleaseResultCaps(release)
	f.SetRequireEarlyCancellationWorkaround(earlyCancel)
	b, err := msg.Marshal()
	require.NoError(t, err)
	return b
}

// decodeFinish decodes frame b with go-capnp, as the Decoder path does:
// ok is false when b is not a Finish.
func decodeFinish(b []byte) (qid uint32, release, ok bool) {
	msg, err := capnp.Unmarshal(append([]byte(nil), b...))
	if err != nil {
		return 0, false, false
	}
	m, err := rpccp.ReadRootMessage(msg)
	if err != nil || m.Which() != rpccp.Message_Which_finish {
		return 0, false, false
	}
	f, err := m.Finish()
	if err != nil {
		return 0, false, false
	}
	return f.QuestionId(), f.ReleaseResultCaps(), true
}

// The in-place reading of a Finish agrees with go-capnp's on every Finish
// the Go encoder makes, and takes nothing else.
func TestParseFinishFrame(t *testing.T) {
	t.Parallel()
	for _, qid := range []uint32{0, 1, 7, 1 << 31, 0xffffffff} {
		for _, release := range []bool{true, false} {
			for _, early := range []bool{true, false} {
				b := finishFrame(t, qid, release, early)
				require.Len(t, b, finishFrameLen, "the layout finishFast expects")
				gq, gr, ok := parseFinishFrame(b)
				require.True(t, ok)
				require.Equal(t, qid, gq)
				require.Equal(t, release, gr)
				// Bytes after the frame (the next call) do not matter.
				gq, gr, ok = parseFinishFrame(append(b, 1, 2, 3))
				require.True(t, ok)
				require.Equal(t, qid, gq)
				require.Equal(t, release, gr)
				_, _, ok = parseFinishFrame(b[:finishFrameLen-1])
				require.False(t, ok, "a partial frame")
			}
		}
	}

	// Messages of the same size that are not a Finish.
	other := func(build func(m rpccp.Message) error) []byte {
		msg, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
		require.NoError(t, err)
		m, err := rpccp.NewRootMessage(seg)
		require.NoError(t, err)
		require.NoError(t, build(m))
		b, err := msg.Marshal()
		require.NoError(t, err)
		return b
	}
	for name, b := range map[string][]byte{
		"release": other(func(m rpccp.Message) error {
			r, err := m.NewRelease()
			r.SetId(5)
			r.SetReferenceCount(1)
			return err
		}),
		"bootstrap": other(func(m rpccp.Message) error {
			bs, err := m.NewBootstrap()
			bs.SetQuestionId(5)
			return err
		}),
	} {
		_, _, ok := parseFinishFrame(b)
		require.False(t, ok, name)
	}

	// Any one byte changed: either still a Finish in this layout (only
	// the Finish's data word may change) and read as go-capnp reads it,
	// or refused.
	base := finishFrame(t, 1234, true, true)
	rng := rand.New(rand.NewPCG(3, 4))
	accepted := 0
	for range 20000 {
		b := append([]byte(nil), base...)
		for n := 1 + rng.IntN(3); n > 0; n-- {
			b[rng.IntN(len(b))] = byte(rng.Uint32())
		}
		qid, release, ok := parseFinishFrame(b)
		if !ok {
			continue
		}
		accepted++
		wq, wr, wok := decodeFinish(b)
		require.True(t, wok, "% x", b)
		require.Equal(t, wq, qid, "% x", b)
		require.Equal(t, wr, release, "% x", b)
	}
	require.Greater(t, accepted, 0)
}
