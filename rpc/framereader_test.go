package rpc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"testing"

	"capnproto.org/go/capnp/v3"
	"github.com/stretchr/testify/require"
)

// frame builds a Cap'n Proto stream frame whose segments hold the given
// words (filled with a pattern of seed).
func frame(seed byte, words ...uint32) []byte {
	var b []byte
	b = binary.LittleEndian.AppendUint32(b, uint32(len(words)-1))
	for _, w := range words {
		b = binary.LittleEndian.AppendUint32(b, w)
	}
	if len(b)%8 != 0 {
		b = append(b, 0, 0, 0, 0)
	}
	for i, w := range words {
		for j := range int(w) * 8 {
			b = append(b, seed+byte(i)+byte(j))
		}
	}
	return b
}

// choppy returns its data a few bytes at a time, failing with a read
// deadline before every other chunk, as a caller's interrupted read does.
type choppy struct {
	data []byte
	rnd  *rand.Rand
	fail bool
}

func (c *choppy) Read(p []byte) (int, error) {
	if c.fail = !c.fail; c.fail {
		return 0, os.ErrDeadlineExceeded
	}
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(c.data), 1+c.rnd.IntN(40))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

// TestFrameReader_InterruptedReads: reads that stop early, anywhere in a
// message, lose nothing: every message decodes intact, including ones
// with several segments and one larger than the buffer, which grows for
// it and shrinks back after.
func TestFrameReader_InterruptedReads(t *testing.T) {
	frames := [][]byte{
		frame(1, 3),
		frame(2, 0),
		frame(3, 1, 2, 3),
		frame(4, 200, 1),
		frame(5, 1),
		frame(6, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1),
		frame(7, 2),
	}
	var stream []byte
	for _, f := range frames {
		stream = append(stream, f...)
	}
	src := &choppy{data: stream, rnd: rand.New(rand.NewPCG(1, 2))}
	fr := newFrameReader(src, 512, 1<<20)
	dec := capnp.NewDecoder(fr)
	interrupted := 0
	for i, f := range frames {
		for {
			err := fr.fill()
			if err == nil {
				break
			}
			require.ErrorIs(t, err, os.ErrDeadlineExceeded)
			interrupted++
		}
		if i == 3 {
			require.Greater(t, len(fr.buf), 512, "the buffer grew for the large frame")
		}
		msg, err := dec.Decode()
		require.NoError(t, err, "frame %d", i)
		want, err := capnp.Unmarshal(f)
		require.NoError(t, err)
		require.Equal(t, want.NumSegments(), msg.NumSegments(), "frame %d", i)
		for s := int64(0); s < want.NumSegments(); s++ {
			ws, err := want.Segment(capnp.SegmentID(s))
			require.NoError(t, err)
			gs, err := msg.Segment(capnp.SegmentID(s))
			require.NoError(t, err)
			require.True(t, bytes.Equal(ws.Data(), gs.Data()), "frame %d segment %d", i, s)
		}
		msg.Release()
	}
	require.Greater(t, interrupted, len(frames), "reads were interrupted")
	err := fr.fill()
	if errors.Is(err, os.ErrDeadlineExceeded) {
		err = fr.fill()
	}
	require.ErrorIs(t, err, io.EOF)
	require.Len(t, fr.buf, 512, "the buffer went back to its usual size")
}

// TestFrameReader_RefusedFrames: a frame the Decoder refuses (too many
// segments, larger than the limit) is refused from its header, without
// waiting for bytes that may never come; Read with nothing buffered fails.
func TestFrameReader_RefusedFrames(t *testing.T) {
	tooMany := binary.LittleEndian.AppendUint32(nil, maxFrameSegments+1)
	tooMany = append(tooMany, 1, 0, 0, 0)
	tooLarge := frame(0, 1<<20)[:8] // only the header: 8 MiB announced
	for name, b := range map[string][]byte{"segments": tooMany, "size": tooLarge} {
		t.Run(name, func(t *testing.T) {
			fr := newFrameReader(bytes.NewReader(b), 64, 1<<20)
			require.NoError(t, fr.fill())
			_, err := capnp.NewDecoder(fr).Decode()
			require.Error(t, err)
		})
	}
	fr := newFrameReader(bytes.NewReader(nil), 64, 1<<20)
	_, err := fr.Read(make([]byte, 8))
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
}
