// Package errcode is the one mapping from Go errors to the request-level
// error codes every leaseq front end reports: the ErrorCode of
// schema/queue.capnp in Cap'n Proto results (package rpc), and the "code"
// of the HTTP API's JSON errors (package rpc/httpapi). Both front ends call
// Of, so a storage sentinel means the same code everywhere, and both name
// the per-item result codes with ItemCodeName.
//
// It holds no capnp types, so a front end that does not speak Cap'n Proto
// does not depend on the schema. Code and ItemCodeName mirror the
// schema's ErrorCode and ResultCode enums value for value and name for
// name; rpc's tests check that they agree.
package errcode

import (
	"context"
	"errors"
	"fmt"

	"github.com/leaseq/leaseq/rpc/dispatch"
	"github.com/leaseq/leaseq/storage"
)

// Code is a request-level outcome. The values and names are those of
// schema.ErrorCode: part of the wire format; never renumber or reuse.
type Code uint16

// Codes, in schema order.
const (
	None            Code = iota // applied
	InvalidArgument             // bad queue name, batch too large, lease/wait/delay out of range, bad id
	NotFound                    // no such queue (stats, config)
	LeaseMismatch               // extend: the token belongs to another queue
	LeaseExpired                // extend: the token is not live
	Unavailable                 // the node is shutting down or its store cannot serve: retry later or elsewhere
	TooManyWaiters              // too many long polls or subscriptions waiting on this queue or node
	Internal                    // the store failed (I/O, corruption) or a bug; the outcome is unknown
	NotEmpty                    // deleteQueue without force: the queue still holds items
	numCodes
)

var codeNames = [numCodes]string{
	"none", "invalidArgument", "notFound", "leaseMismatch", "leaseExpired", "unavailable", "tooManyWaiters", "internal",
	"notEmpty",
}

// String returns the code's name in the schema ("invalidArgument").
func (c Code) String() string {
	if c < numCodes {
		return codeNames[c]
	}
	return fmt.Sprintf("code(%d)", uint16(c))
}

// All returns every code except None, in schema order (a new slice each
// call).
func All() []Code {
	out := make([]Code, 0, numCodes-1)
	for c := InvalidArgument; c < numCodes; c++ {
		out = append(out, c)
	}
	return out
}

// Sentinels of the front ends, besides the storage sentinels that keep
// their own identity. Match them with errors.Is. Package rpc re-exports
// them under the same names.
var (
	// ErrTooManyWaiters reports that a queue or the node already holds the
	// maximum number of parked long polls and subscriptions.
	ErrTooManyWaiters = dispatch.ErrTooManyWaiters

	// ErrUnavailable reports that the node is shutting down or its store
	// is closed: retry later or elsewhere.
	ErrUnavailable = errors.New("rpc: unavailable")

	// ErrInternal reports a failure inside the node (I/O, corrupt data, a
	// bug). The outcome of the request is unknown.
	ErrInternal = errors.New("rpc: internal error")
)

// table is the one mapping between Go sentinels and codes. Of walks it in
// order and uses the first sentinel the error matches; Sentinel maps a
// code back to the first sentinel listed for it.
var table = []struct {
	err  error
	code Code
}{
	{storage.ErrInvalidArgument, InvalidArgument},
	{storage.ErrNotFound, NotFound},
	{storage.ErrLeaseMismatch, LeaseMismatch},
	{storage.ErrLeaseExpired, LeaseExpired},
	{storage.ErrNotEmpty, NotEmpty},
	{ErrUnavailable, Unavailable},
	{storage.ErrClosed, Unavailable},
	{storage.ErrNoSpace, Unavailable},
	{storage.ErrUnavailable, Unavailable},
	{context.Canceled, Unavailable},
	{ErrTooManyWaiters, TooManyWaiters},
	{ErrInternal, Internal},
	{storage.ErrCorrupt, Internal},
}

// Of returns the code of a request's error (nil: None). Errors that match
// no sentinel are Internal.
func Of(err error) Code {
	if err == nil {
		return None
	}
	for _, e := range table {
		if errors.Is(err, e.err) {
			return e.code
		}
	}
	return Internal
}

// Sentinel returns the error a client matches for code c: the first
// sentinel the table lists for it; nil for None, ErrInternal for a code
// this build does not know (from a newer server).
func Sentinel(c Code) error {
	if c == None {
		return nil
	}
	for _, e := range table {
		if e.code == c {
			return e.err
		}
	}
	return ErrInternal
}

// Sentinels returns every error the table maps, in table order (a new
// slice each call).
func Sentinels() []error {
	out := make([]error, len(table))
	for i, e := range table {
		out[i] = e.err
	}
	return out
}

// InternalReason is what a client is told of an internal failure: its
// kind and the reference under which the node logged the cause, never the
// cause's text (file paths, library messages).
func InternalReason(err error, ref uint64) error {
	kind := ErrInternal
	if errors.Is(err, storage.ErrCorrupt) {
		kind = storage.ErrCorrupt
	}
	return fmt.Errorf("%w (the node logged the cause as ref=%d)", kind, ref)
}

// itemCodeNames are the names of schema.ResultCode, indexed by the
// storage.Code of the same value.
var itemCodeNames = [...]string{
	storage.CodeOK:            "ok",
	storage.CodeNotFound:      "notFound",
	storage.CodeLeaseMismatch: "leaseMismatch",
	storage.CodeLeaseExpired:  "leaseExpired",
	storage.CodeInvalid:       "invalid",
}

// ItemCodeName returns the wire name of a per-item result code, as
// schema.ResultCode spells it ("ok", "notFound", "leaseMismatch",
// "leaseExpired", "invalid"); a code this build does not know is
// "invalid", which is what it means to a caller: the item was not applied.
func ItemCodeName(c storage.Code) string {
	if int(c) < len(itemCodeNames) {
		return itemCodeNames[c]
	}
	return itemCodeNames[storage.CodeInvalid]
}
