package rpc

import (
	"errors"
	"fmt"

	"github.com/leaseq/leaseq/storage"
)

// DefaultMaxReplyBytes bounds one message a node sends a client (a Return,
// or a Call to the client's Consumer), frame included, and is what the Go
// client reads. 1 GiB holds the largest reply storage.DefaultLimits allow:
// a poll, deliver, peek or dead-letter page of MaxBatch (1000) items of
// MaxPayload (1 MiB), each with a dedup key, queue name and reasons of
// the limits' sizes. It is not DefaultMaxMessageBytes (64 MiB), which
// bounds what a node, and the client, accept from the other side's calls:
// a reply can be much larger than the request that asked for it.
//
// A node whose limits allow items larger than that (a raised --max-payload,
// --max-batch, --max-dedup-key or --max-reason) returns fewer items than a
// poll asks for, a peek or dead-letter page has fewer than its limit, and a
// subscription's pushes carry fewer, so that no reply can exceed it
// (replyItems); a caller pages on, or polls again, for the rest.
const DefaultMaxReplyBytes = 1 << 30

// replyReserveBytes is what a reply holds besides its items: the frame's
// segment table (at most 512 segments), the rpc Return or Call, the
// Status and its detail, the lease.
const replyReserveBytes = 64 << 10

// itemReplyBytes bounds the bytes one Item (or DeadItem) of a reply takes
// under limits l: its payload, dedup key, queue name, last error and dead
// reason at their largest, and the structs, pointers and padding around
// them (a DeadItem's struct, the item's 16-byte id, landing pads).
func itemReplyBytes(l storage.Limits) int64 {
	pad := func(n int) int64 { return (int64(n) + 7) &^ 7 }
	return pad(l.MaxPayload) + pad(l.MaxQueueName+1) + pad(l.MaxDedupKey+1) +
		2*pad(l.MaxReason+64) + 512
}

// replyItems is how many items of the largest size limits l allow fit in
// one reply of maxReply bytes: MaxBatch with the default limits (and any
// smaller ones), fewer with larger items, and at least 1 (a lone item
// too large for it is refused by the client rather than never served).
func replyItems(l storage.Limits, maxReply int64) int {
	n := (maxReply - replyReserveBytes) / itemReplyBytes(l)
	return int(max(1, min(n, int64(l.MaxBatch))))
}

// fitReply returns how many of the first items, whose sizes size reports,
// fit in one reply of maxReply bytes (at least 1 when there are any). A
// peek or dead-letter page is cut there: items stored under larger limits
// than the node's present ones could otherwise make a page too large, and
// the caller pages on from the last item it got.
func fitReply(n int, size func(i int) int64, maxReply int64) int {
	left := maxReply - replyReserveBytes
	for i := 0; i < n; i++ {
		if left -= size(i); left < 0 {
			return max(i, 1)
		}
	}
	return n
}

// giveBackFunc gives back items a poll claimed and will not answer with
// (Server.giveBack, or the lean engine's giveBackLater).
type giveBackFunc func(queue string, lease storage.LeaseID, ids []storage.ItemID, reason string)

// trimPoll shapes a poll's batch into the answer a connection sends, and
// gives back what it leaves out, on every engine and listener:
//   - while the connection's unread answers are over its reply budget
//     (gate), none of it: the result is empty. Found by review (session
//     70): the reader admits calls while the budget has room, and a burst
//     of pipelined polls was all admitted before the first answer was
//     counted, each answer up to a whole reply; the node held them all.
//   - else what fits in one reply by the items' stored sizes. The poll's
//     max is already cut to what fits by the present limits (replyItems);
//     items stored under larger ones (a node restarted with a lower
//     --max-payload) may not fit (found by review, session 70: the client
//     refused the answer and closed the connection, the items stayed
//     leased until their lease ended, and every later poll did the same).
func (s *Server) trimPoll(gate *replyGate, queue string, pr *storage.PollResult, giveBack giveBackFunc) {
	if len(pr.Items) == 0 {
		return
	}
	if gate.over() {
		giveBack(queue, pr.Lease, itemIDs(pr.Items), "the client does not read its answers")
		*pr = storage.PollResult{}
		return
	}
	if len(pr.Items) < 2 {
		return
	}
	n := fitReply(len(pr.Items), func(i int) int64 { return storedItemBytes(&pr.Items[i]) }, s.cfg.maxReplyBytes)
	if n < len(pr.Items) {
		giveBack(queue, pr.Lease, itemIDs(pr.Items[n:]), "too large for one answer")
		pr.Items = pr.Items[:n]
	}
}

// storedItemBytes bounds the bytes item it takes in a reply (as
// itemReplyBytes, for the sizes it has).
func storedItemBytes(it *storage.Item) int64 {
	return int64(len(it.Payload)+len(it.Queue)+len(it.DedupKey)+len(it.LastError)) + 512
}

// ErrReplyTooLarge reports that the client refused a message from the node
// larger than it reads (DefaultMaxReplyBytes): a node of another version
// or configuration. The connection is closed, and the outcome of the calls
// open on it is unknown (a poll's items stay leased until their lease
// ends). It is not a disconnection in the sense of IsDisconnected: the
// node did not go away, and no request broke the node's limits.
var ErrReplyTooLarge = errors.New("rpc: reply larger than the client reads")

// replyTooLargeError is how the client reports a message over its read
// limit; it wraps ErrReplyTooLarge.
type replyTooLargeError struct {
	size, limit uint64
}

func (e *replyTooLargeError) Error() string {
	return fmt.Sprintf("rpc: the node sent a message of %d bytes, over the %d bytes this client reads (DefaultMaxReplyBytes); "+
		"the connection is closed and the outcome of its open calls is unknown (a poll's items stay leased until the lease ends)", e.size, e.limit)
}

func (e *replyTooLargeError) Unwrap() error { return ErrReplyTooLarge }
