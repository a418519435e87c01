package storage

import "errors"

// Presence is where an id presented with a lease token (ack, nack,
// extend) stands in its queue: what a store must know to apply the
// lease-token rules of the package documentation.
type Presence uint8

const (
	// Absent: not in the queue (acked, purged, never enqueued).
	Absent Presence = iota
	// HeldByLease: inflight under the presented lease.
	HeldByLease
	// HeldByOther: inflight under another lease.
	HeldByOther
	// NotInflight: in the queue but available or dead.
	NotInflight
)

// LeaseCode is the per-id code of the lease-token rules, given the id's
// presence and whether the presented lease is live (now < its expiry; a
// lease that was never issued or is used up is not). Every backend
// decides with it:
//   - Absent: CodeNotFound;
//   - HeldByLease: CodeOK if live, else CodeLeaseExpired;
//   - HeldByOther: CodeLeaseMismatch;
//   - NotInflight: CodeLeaseMismatch if live (the lease does not list the
//     item), else CodeLeaseExpired (a stale token whose items returned).
func LeaseCode(p Presence, live bool) Code {
	switch p {
	case Absent:
		return CodeNotFound
	case HeldByOther:
		return CodeLeaseMismatch
	case HeldByLease:
		if live {
			return CodeOK
		}
		return CodeLeaseExpired
	}
	if live {
		return CodeLeaseMismatch
	}
	return CodeLeaseExpired
}

// ExtendCode is the per-id code of an extend, for front ends that answer
// an extend naming ids with one code per id: every id gets the lease's
// outcome (a store extends leases, not items). err is ExtendLease's error:
// nil is CodeOK, ErrLeaseExpired and ErrLeaseMismatch are their codes, and
// any other error is returned as the request's failure.
func ExtendCode(err error) (Code, error) {
	switch {
	case err == nil:
		return CodeOK, nil
	case errors.Is(err, ErrLeaseExpired):
		return CodeLeaseExpired, nil
	case errors.Is(err, ErrLeaseMismatch):
		return CodeLeaseMismatch, nil
	}
	return 0, err
}
