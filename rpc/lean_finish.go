package rpc

import (
	"encoding/binary"

	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
)

// A caller sends a Finish for every call it made, usually in the same
// write as its next call. Decoding it as any other message (a Message, its
// arena, the root's traversal, putting it back) cost about a sixth of the
// node's user-space CPU in a nodeInfo round trip. finishFast reads the
// layout go-capnp's encoder (the Go client's) gives a Finish straight from
// the read buffer; anything else, a Finish laid out otherwise included,
// goes to the Decoder as before.

// finishFrameLen is that Finish's frame: the stream header of one segment,
// then four words (the root pointer, Message's discriminant and its
// pointer to the Finish, the Finish's data word).
const finishFrameLen = 8 + 4*8

// The words of that frame other than the Finish's data, as the stream
// holds them (little-endian).
const (
	finishHeader  = uint64(4) << 32           // one segment (count-1 = 0) of 4 words
	finishRoot    = uint64(0x0001_0001) << 32 // struct at +0: 1 data word, 1 pointer
	finishMessage = uint64(rpccp.Message_Which_finish)
	finishPtr     = uint64(0x0000_0001) << 32 // struct at +0: 1 data word, no pointer
)

// parseFinishFrame reports whether b starts with a Finish in that layout,
// and its fields.
func parseFinishFrame(b []byte) (qid uint32, releaseResultCaps, ok bool) {
	if len(b) < finishFrameLen {
		return 0, false, false
	}
	le := binary.LittleEndian
	if le.Uint64(b) != finishHeader || le.Uint64(b[8:]) != finishRoot ||
		le.Uint64(b[16:]) != finishMessage || le.Uint64(b[24:]) != finishPtr {
		return 0, false, false
	}
	d := le.Uint64(b[32:])
	// releaseResultCaps defaults to true: the wire holds it inverted.
	return uint32(d), d&(1<<32) == 0, true
}

// finishFast waits for input as the Decoder would, then handles a Finish at
// the head of the read buffer in place. handled: it did (err is then
// the Finish's outcome), or the connection failed while waiting (err says
// why, as the Decoder would have).
func (c *leanConn) finishFast() (handled bool, err error) {
	if c.br.Buffered() == 0 {
		if _, err := c.br.Peek(1); err != nil {
			return true, err
		}
	}
	if c.br.Buffered() < finishFrameLen {
		return false, nil
	}
	b, _ := c.br.Peek(finishFrameLen)
	qid, release, ok := parseFinishFrame(b)
	if !ok {
		return false, nil
	}
	_, _ = c.br.Discard(finishFrameLen)
	return true, c.finish(qid, release)
}
