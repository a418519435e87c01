package storage

import "errors"

// Sentinel errors returned (wrapped with %w) by every Store implementation.
// Callers match them with errors.Is, never by string.
var (
	// ErrNotFound reports that a queue, item or lease named by the caller
	// does not exist.
	ErrNotFound = errors.New("storage: not found")

	// ErrLeaseMismatch reports that a lease token exists and is live but
	// does not cover the item or queue it was presented for.
	ErrLeaseMismatch = errors.New("storage: lease mismatch")

	// ErrLeaseExpired reports that a lease token is not live: its expiry
	// has passed (now >= ExpiresAt), it was already fully acked or nacked,
	// or it was never issued. A lease is rejected as expired even before
	// the sweeper has returned its items.
	ErrLeaseExpired = errors.New("storage: lease expired")

	// ErrInvalidArgument reports a malformed request: a bad queue name, a
	// lease or delay out of range, a batch that is too large, and so on.
	// The wrapping error says which argument and why.
	ErrInvalidArgument = errors.New("storage: invalid argument")

	// ErrNotEmpty reports a queue that cannot be deleted because it still
	// holds items (DeleteQueue without Force).
	ErrNotEmpty = errors.New("storage: queue not empty")

	// ErrClosed reports a call on a Store after Close.
	ErrClosed = errors.New("storage: closed")

	// ErrNoSpace reports a write refused because the store is short of
	// disk space (rocksstore: free space below Options.MinFreeDisk).
	// Calls that free space (ack, purge) are still accepted; retry the
	// refused call later.
	ErrNoSpace = errors.New("storage: not enough free disk space")

	// ErrUnavailable reports a store that cannot serve writes for now
	// (rocksstore after a failed write, until Recover reopens it).
	ErrUnavailable = errors.New("storage: unavailable")

	// ErrCorrupt reports data on disk that cannot be decoded or violates
	// an invariant in a way the store cannot continue from.
	ErrCorrupt = errors.New("storage: corrupt data")
)
