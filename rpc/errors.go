package rpc

import (
	"context"
	"errors"
	"fmt"

	"github.com/leaseq/leaseq/rpc/dispatch"
	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// Sentinels of the rpc layer, besides the storage sentinels that cross the
// wire unchanged. Match them with errors.Is.
var (
	// ErrTooManyWaiters reports that a queue already has the maximum number
	// of parked long polls and subscriptions (ServerConfig.MaxWaitersPerQueue).
	ErrTooManyWaiters = dispatch.ErrTooManyWaiters

	// ErrUnavailable reports that the node is shutting down or its store is
	// closed: retry later or elsewhere.
	ErrUnavailable = errors.New("rpc: unavailable")

	// ErrInternal reports a failure inside the node (I/O, corrupt data, a
	// bug). The outcome of the request is unknown.
	ErrInternal = errors.New("rpc: internal error")

	// ErrTooManyConns reports that the node refused the connection because
	// it is at ServerConfig.MaxConns.
	ErrTooManyConns = errors.New("rpc: too many connections")
)

// errorTable is the one mapping between Go sentinels and wire ErrorCodes.
// The server walks it in order and uses the first sentinel the error
// matches; the client maps a code back to the first sentinel listed for it.
// Part of the wire contract: codes are fixed forever (see schema.ErrorCode).
var errorTable = []struct {
	err  error
	code schema.ErrorCode
}{
	{storage.ErrInvalidArgument, schema.ErrorCode_invalidArgument},
	{storage.ErrNotFound, schema.ErrorCode_notFound},
	{storage.ErrLeaseMismatch, schema.ErrorCode_leaseMismatch},
	{storage.ErrLeaseExpired, schema.ErrorCode_leaseExpired},
	{storage.ErrNotEmpty, schema.ErrorCode_notEmpty},
	{ErrUnavailable, schema.ErrorCode_unavailable},
	{storage.ErrClosed, schema.ErrorCode_unavailable},
	{storage.ErrNoSpace, schema.ErrorCode_unavailable},
	{storage.ErrUnavailable, schema.ErrorCode_unavailable},
	{context.Canceled, schema.ErrorCode_unavailable},
	{ErrTooManyWaiters, schema.ErrorCode_tooManyWaiters},
	{ErrInternal, schema.ErrorCode_internal},
	{storage.ErrCorrupt, schema.ErrorCode_internal},
}

// codeOf returns the wire code of a handler error (nil: none). Errors that
// match no sentinel are internal.
func codeOf(err error) schema.ErrorCode {
	if err == nil {
		return schema.ErrorCode_none
	}
	for _, e := range errorTable {
		if errors.Is(err, e.err) {
			return e.code
		}
	}
	return schema.ErrorCode_internal
}

// errorOf turns a wire status into a Go error wrapping the sentinel of its
// code, with the server's message. A code this client does not know (from a
// newer server) is reported as internal.
func errorOf(op string, code schema.ErrorCode, msg string) error {
	if code == schema.ErrorCode_none {
		return nil
	}
	for _, e := range errorTable {
		if e.code == code {
			return &StatusError{Op: op, code: code, Message: msg, sentinel: e.err}
		}
	}
	return &StatusError{Op: op, code: code, Message: msg, sentinel: ErrInternal}
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

// internalReason is what a client is told of an internal failure: its
// kind and the reference under which the node logged the cause, never the
// cause's text (file paths, library messages).
func internalReason(err error, ref uint64) error {
	kind := ErrInternal
	if errors.Is(err, storage.ErrCorrupt) {
		kind = storage.ErrCorrupt
	}
	return fmt.Errorf("%w (the node logged the cause as ref=%d)", kind, ref)
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
