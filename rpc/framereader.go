package rpc

import (
	"encoding/binary"
	"io"
)

// frameReader buffers a Cap'n Proto stream so that a whole message is in
// memory before anything decodes it. A read that stops early (an
// interrupted read, see leanClient.readOwn) then leaves the stream where it
// was: the bytes read so far stay in the buffer for the next fill, where a
// capnp.Decoder reading the socket itself would have consumed half a
// message. The Decoder reads from the frameReader, which only ever hands
// out bytes it already holds.
type frameReader struct {
	src   io.Reader
	buf   []byte
	r, w  int    // unread bytes: buf[r:w]
	limit uint64 // largest message fill waits for; a larger one is reported by tooLarge once its header is read
	size  int    // the buffer's usual size, returned to once a large message is read
}

// Mirrors of go-capnp's stream format limits (codec.go): the segment
// count is stored minus one in the first four bytes, and the Decoder
// refuses a stored count over maxFrameSegments (513 segments pass).
const maxFrameSegments = 512

func newFrameReader(src io.Reader, size int, limit uint64) *frameReader {
	return &frameReader{src: src, buf: make([]byte, size), limit: limit, size: size}
}

// frameLen returns how many bytes the message at the head of the buffer
// needs in all (its header included), or how many it needs before that
// can be known. known is false when the header is not complete yet. A
// header the Decoder will refuse (too many segments, too large) counts as
// complete once the bytes it needs to say so are buffered.
func (f *frameReader) frameLen() (n uint64, known bool) {
	return frameLen(f.buf[f.r:f.w], f.limit)
}

// frameLen is frameReader.frameLen for the message at the head of b,
// with limit the largest message the Decoder accepts.
func frameLen(b []byte, limit uint64) (n uint64, known bool) {
	hdr, total, refused := frameHeader(b)
	switch {
	case refused:
		return 8, true // the Decoder refuses it after the first word
	case total == 0:
		return hdr, false
	case total > limit:
		return hdr, true // the Decoder refuses it after the header
	}
	return total, true
}

// frameHeader reads the stream header at the head of b. hdr is the
// header's length (8 while b holds less than its first word); total the
// message's size, its header included, or 0 while b holds less than hdr
// bytes. refused: the Decoder refuses the header at its first word (too
// many segments).
func frameHeader(b []byte) (hdr, total uint64, refused bool) {
	if len(b) < 8 {
		return 8, 0, false
	}
	maxSeg := uint64(binary.LittleEndian.Uint32(b))
	if maxSeg > maxFrameSegments {
		return 8, 0, true
	}
	hdr = ((maxSeg+2)*4 + 7) &^ 7
	if uint64(len(b)) < hdr {
		return hdr, 0, false
	}
	total = hdr
	for i := uint64(0); i <= maxSeg; i++ {
		total += 8 * uint64(binary.LittleEndian.Uint32(b[4+4*i:]))
	}
	return hdr, total, false
}

// fill reads until a whole message is buffered. An error from the source
// (a deadline, the connection's end) keeps what was read.
func (f *frameReader) fill() error {
	for {
		n, known := f.frameLen()
		if known && uint64(f.w-f.r) >= n {
			return nil
		}
		f.room(int(n))
		m, err := f.src.Read(f.buf[f.w:])
		f.w += m
		if err != nil {
			if m > 0 && err == io.EOF {
				continue // the bytes first; EOF again on the next read
			}
			return err
		}
	}
}

// room makes space for a message of n bytes from f.r, growing the buffer
// only for a message larger than it. It grows the buffer only once it is
// full, at most doubling it: memory follows the bytes that arrived, not
// the size a header claims (up to limit, which may be a GiB), so a peer
// that announces a large message and sends nothing costs nothing.
func (f *frameReader) room(n int) {
	if f.r == f.w {
		f.r, f.w = 0, 0
		if len(f.buf) > f.size && n <= f.size {
			f.buf = make([]byte, f.size)
		}
	}
	if len(f.buf)-f.r >= n {
		return
	}
	if f.r > 0 {
		f.w = copy(f.buf, f.buf[f.r:f.w])
		f.r = 0
	}
	if n <= len(f.buf) || f.w < len(f.buf) {
		return // room for the message, or for more of its bytes
	}
	nb := make([]byte, min(n, 2*len(f.buf)))
	f.w = copy(nb, f.buf[:f.w])
	f.buf = nb
}

// tooLarge reports whether the message at the head of the buffer, whose
// header fill has read, is over limit, and its size (header included).
func (f *frameReader) tooLarge() (uint64, bool) {
	_, total, refused := frameHeader(f.buf[f.r:f.w])
	if refused || total == 0 {
		return 0, false // not read yet, or not a size matter: the Decoder refuses it
	}
	return total, total > f.limit
}

// Read hands out buffered bytes only; it never reads the source, so a
// Decoder after fill never blocks. With nothing buffered it reports
// io.ErrUnexpectedEOF: fill was not called, or the message was refused.
func (f *frameReader) Read(p []byte) (int, error) {
	if f.r == f.w {
		return 0, io.ErrUnexpectedEOF
	}
	n := copy(p, f.buf[f.r:f.w])
	f.r += n
	if f.r == f.w && len(f.buf) > f.size {
		// A large message was read out: do not keep its buffer (up to
		// a GiB for a reply) while the connection waits for the next.
		f.buf, f.r, f.w = make([]byte, f.size), 0, 0
	}
	return n, nil
}
