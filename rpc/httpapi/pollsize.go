package httpapi

import (
	"encoding/base64"
	"unicode/utf8"

	"github.com/leaseq/leaseq/storage"
)

// DefaultMaxAnswerBytes bounds the JSON of one poll answer, and of one
// page of peek or the dead-letter list (pageOf). An answer is
// built whole in memory (writeJSON), and an item takes much more room in
// it than in the store: its payload in base64 (4/3) and again as "text"
// when it is valid UTF-8, where a control character takes six bytes
// ("\u0001"). Found by review (session 73): nothing but MaxBatch bounded
// an answer, so one poll of 1000 items of 1 MiB built gigabytes, where
// the RPC server bounds every reply (rpc.DefaultMaxReplyBytes). 128 MiB
// holds a poll of the default MaxBatch (1000) items of 32 KiB of plain
// text, as DefaultMaxBodyBytes holds such an enqueue; a poll of larger
// items returns fewer (at least one), and the client polls again.
const DefaultMaxAnswerBytes = 128 << 20

// answerReserveBytes is what a poll answer holds besides its items: the
// braces, the lease, its expiry and the field names around them.
const answerReserveBytes = 1 << 10

// itemFieldBytes bounds what an Item's JSON holds besides its strings of
// unbounded size: the field names, the id, the numbers, the instants.
const itemFieldBytes = 512

// trimPoll cuts a poll's items to those that fit in one answer of
// s.maxAnswer bytes, by their actual sizes, and gives back the rest with
// an undelivered nack, as the RPC server's trimPoll does: they are ready
// again at once, with no attempt counted, for the next poll.
//
// Why cut after the claim rather than cap max before it (as RPC also does
// from the limits, replyItems): the worst case the limits allow is about
// 7.4 MiB of JSON for an item of 1 MiB (a payload of control characters),
// so a cap up front would hold every poll of a node with the default
// limits to 17 items, however small its items. Items large enough to be
// cut are rare, and then the cost is one nack of the items left out.
// The items claimed are still bounded by MaxBatch and MaxPayload, as over
// RPC.
func (s *Server) trimPoll(queue string, pr *storage.PollResult) {
	n := fitAnswer(pr.Items, s.maxAnswer)
	if n == len(pr.Items) {
		return
	}
	rest := pr.Items[n:]
	pr.Items = pr.Items[:n]
	s.giveBackItems(queue, pr.Lease, rest, "left out of a poll answer too large for one")
}

// fitAnswer returns how many of the first items fit in one poll answer of
// maxAnswer bytes: at least one when there are any, as over RPC (a lone
// item larger than the bound is served rather than never).
func fitAnswer(items []storage.Item, maxAnswer int64) int {
	return fitCount(len(items), maxAnswer, func(i int) int64 { return itemAnswerBytes(&items[i]) })
}

// fitDead is fitAnswer for a page of dead items, each with its reason
// and its instant of death.
func fitDead(dead []storage.DeadItem, maxAnswer int64) int {
	return fitCount(len(dead), maxAnswer, func(i int) int64 {
		return itemAnswerBytes(&dead[i].Item) + jsonStringBytes(dead[i].Reason) + deadFieldBytes
	})
}

// deadFieldBytes bounds a dead item's fields besides its reason: the
// names of both and the instant.
const deadFieldBytes = 64

// fitCount returns how many of n elements, the i-th of size(i) bytes of
// JSON, fit in one answer of maxAnswer bytes (at least one when n > 0).
func fitCount(n int, maxAnswer int64, size func(i int) int64) int {
	left := maxAnswer - answerReserveBytes
	for i := range n {
		if left -= size(i); left < 0 {
			return max(i, 1)
		}
	}
	return n
}

// itemAnswerBytes bounds the bytes the JSON of it takes in an answer
// (toItem, then writeJSON): the payload in base64, the payload as text
// when it is valid UTF-8, the other strings escaped, and the fields.
func itemAnswerBytes(it *storage.Item) int64 {
	n := int64(base64.StdEncoding.EncodedLen(len(it.Payload))) + 2
	if utf8.Valid(it.Payload) {
		n += jsonStringBytes(it.Payload)
	}
	return n + jsonStringBytes(it.Queue) + jsonStringBytes(it.DedupKey) + jsonStringBytes(it.LastError) + itemFieldBytes
}

// jsonStringBytes bounds the bytes s takes as a JSON string, quotes
// included, as encoding/json writes it without HTML escaping (writeJSON):
// a control character takes at most six bytes ("\u001f"), a quote or
// backslash two, U+2028 and U+2029 six for their three, a byte of
// invalid UTF-8 six ("\ufffd"), anything else itself.
func jsonStringBytes[T string | []byte](s T) int64 {
	n := int64(2)
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c < 0x20:
			n += 6
		case c == '"' || c == '\\':
			n += 2
		case c < utf8.RuneSelf:
			n++
		default:
			r, size := utf8.DecodeRune([]byte(s[i:min(i+utf8.UTFMax, len(s))]))
			switch {
			case r == utf8.RuneError && size == 1:
				n += 6
			case r == '\u2028' || r == '\u2029':
				n += 6
			default:
				n += int64(size)
			}
			i += size
			continue
		}
		i++
	}
	return n
}
