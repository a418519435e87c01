package rpc

import (
	"errors"
	"fmt"

	"github.com/leaseq/leaseq/rpc/errcode"
	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// Sentinels of the rpc layer, besides the storage sentinels that cross the
// wire unchanged. Match them with errors.Is. The first three are
// package errcode's, which the HTTP API reports too.
var (
	// ErrTooManyWaiters reports that a queue already has the maximum number
	// of parked long polls and subscriptions (ServerConfig.MaxWaitersPerQueue).
	ErrTooManyWaiters = errcode.ErrTooManyWaiters

	// ErrUnavailable reports that the node is shutting down or its store is
	// closed: retry later or elsewhere.
	ErrUnavailable = errcode.ErrUnavailable

	// ErrInternal reports a failure inside the node (I/O, corrupt data, a
	// bug). The outcome of the request is unknown.
	ErrInternal = errcode.ErrInternal

	// ErrTooManyConns reports that the node refused the connection because
	// it is at ServerConfig.MaxConns.
	ErrTooManyConns = errors.New("rpc: too many connections")

	// ErrOutcomeUnknown reports that a call that changes the node's
	// state went out but its answer did not come: its context ended, the
	// connection was lost, or the answer was too large to read, first.
	// The node may have applied it or not. Every such Client call
	// reports it (Enqueue, Ack, AckPoll's ack, Nack, Extend, Purge,
	// DeleteQueue, Redrive, PurgeDead, SetQueueConfig; and the
	// Producer's Enqueue), its error wrapping the cause as well
	// (context.DeadlineExceeded, a disconnection: IsDisconnected,
	// ErrReplyTooLarge). An enqueue so cut may have added its items: made
	// again, it adds them twice unless they carry a DedupKey. An ack may
	// have deleted its items; if it did not, they come back once their
	// lease ends, and an ack made again answers notFound for those it did
	// delete. A call that was not sent (its context had ended, the
	// connection was already lost) does not wrap it, nor does any answer
	// of the node, a refusal (*StatusError) or an exception (but one of
	// type disconnected, which reads as a lost connection). On the
	// go-capnp client engine, which does not say whether a call left the
	// client, a call cut before it was written may wrap it too (never
	// the other way). Read-only calls (Poll, Peek, Stats, ...) do not
	// wrap it: a poll's answer that did not come is given back. It is the
	// client's own: no wire code carries it.
	ErrOutcomeUnknown = errors.New("rpc: outcome unknown, the call may have been applied")
)

// codeOf returns the wire code of a handler error (nil: none) by
// errcode's one table: schema.ErrorCode has errcode.Code's values.
func codeOf(err error) schema.ErrorCode {
	return schema.ErrorCode(errcode.Of(err))
}

// errorOf turns a wire status into a Go error wrapping the sentinel of its
// code, with the server's message. A code this client does not know (from a
// newer server) is reported as internal.
func errorOf(op string, code schema.ErrorCode, msg string) error {
	if code == schema.ErrorCode_none {
		return nil
	}
	return &StatusError{Op: op, code: code, Message: msg, sentinel: errcode.Sentinel(errcode.Code(code))}
}

// StatusError is a request-level error reported by the server. It wraps the
// storage or rpc sentinel of its code, so errors.Is(err,
// storage.ErrInvalidArgument) works.
type StatusError struct {
	Op       string // the client method, e.g. "poll"
	Message  string // the server's explanation
	code     schema.ErrorCode
	sentinel error
}

// Error implements error.
func (e *StatusError) Error() string {
	return fmt.Sprintf("leaseq %s: %s (%v)", e.Op, e.Message, e.sentinel)
}

// Unwrap returns the sentinel of the code.
func (e *StatusError) Unwrap() error { return e.sentinel }

// Code conversion between storage.Code and schema.ResultCode: the enums are
// defined to have the same values (never renumbered), so this is a cast
// guarded by a range check.
func wireCode(c storage.Code) schema.ResultCode { return schema.ResultCode(c) }

func storageCode(c schema.ResultCode) storage.Code {
	if c > schema.ResultCode_invalid {
		// A newer server's code this client does not know: the item was
		// not applied, which is what invalid means to a caller.
		return storage.CodeInvalid
	}
	return storage.Code(c)
}

// Overloaded reports whether err means "not now, retry later or elsewhere":
// the wire codes unavailable (shutting down, store closed or out of disk
// space) and tooManyWaiters of the table above. Protocols without status
// codes (rpc/queueber) send such errors as Cap'n Proto "overloaded"
// exceptions.
func Overloaded(err error) bool {
	c := codeOf(err)
	return c == schema.ErrorCode_unavailable || c == schema.ErrorCode_tooManyWaiters
}
