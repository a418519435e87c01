// Package queueber serves Queueber's Cap'n Proto protocol
// (schema/queueber.capnp) over one leaseq queue, so that clients written
// for Queueber (a Rust queue server on RocksDB and Cap'n Proto) work
// against a leaseq node unchanged: `leaseq serve --queueber-listen ADDR
// --queueber-queue NAME`.
//
// Bootstrap returns the rpc.BootstrapFunc that rpc.Server.StartBootstrap
// serves on a listener of its own. The connections are the rpc server's:
// they share MaxConns and MaxConnsPerAddr with the Queue listener, and get
// the same TLS, first-message timeout, message size, traversal and flow
// limits and reply budget; Stop ends them with the rest. Calls are counted
// in the rpc metrics under the leaseq operation they map to.
//
// Answers, as on the Queue interface (rpc.Conn.Poll; the go-capnp engine
// serves these connections): a poll that completes while the
// connection's unwritten answers are over its reply budget gives its
// items back and answers empty. A poll answer with items that is never
// written, not a byte of it (the client went away, or Stop came, while
// the answer waited behind a client that reads nothing), gives its items
// back when the connection ends: ready again at once, with no attempt
// counted. An answer partly written is the client's, and its items stay
// leased. Stop does not wait for such a client: its connection is closed.
// A poll the client finishes (cancels) before a byte of its answer was
// written gives its items back at once too: Queueber has no nack, and its
// client library drops the answer, which still goes out. An answer is
// not kept once written, so a client that never sends Finish does not
// make the node hold its answers, and a connection may have at most
// 65,536 questions without a Finish (as on the Queue interface; one more
// ends it); a call that passes a capability naming a field of an answer
// (a receiverAnswer) ends the connection, since Queueber's results hold
// none.
//
// The mapping, in Queueber's whole seconds:
//
//   - add: one enqueue of every item, all or nothing (Server.Enqueue checks
//     every item first); visibilityTimeoutSecs is the item's delay (at most
//     --max-delay). At most --max-batch items per call. The ids are leaseq's
//     16-byte item ids, in order.
//   - poll: claims up to numItems (0 means 1; more than --max-batch means
//     --max-batch) under one new lease of leaseValiditySecs (0 is refused,
//     as Queueber refuses it; otherwise clamped to [--min-lease,
//     --max-lease]), waiting through the rpc server's long-poll dispatcher,
//     the same one the Queue interface's polls park in, so an enqueue on
//     either listener (or the sweeper) wakes it. timeoutSecs 0, which
//     Queueber takes as "wait until an item comes", and anything over
//     --max-wait wait --max-wait; an empty answer has no items and an empty
//     lease.
//   - remove: an ack of one id under its lease; removed is false for
//     leaseq's notFound, leaseMismatch and leaseExpired.
//   - extend: the lease's expiry becomes now + leaseValiditySecs (clamped
//     as for poll); extended is false when the lease has expired, was
//     finished, or belongs to another queue.
//
// Bad input is refused with a Cap'n Proto exception ("failed") that says
// why: a lease or id that is not 16 bytes, leaseValiditySecs 0, a batch or
// an item over the node's limits. Errors that mean "retry later" (the node
// is shutting down or short of disk space, too many parked polls) are
// "overloaded" exceptions, and internal failures carry a reference to the
// node's log line, as on the Queue interface.
//
// leaseq semantics that Queueber lacks still apply to the queue: an item
// delivered --max-attempts times (per queue, 5 by default; `leaseq config
// NAME --max-attempts N`) without being removed goes to the dead-letter
// queue instead of coming back again.
//
// Concurrency: the handlers keep no state of their own beyond the
// connection and are safe for concurrent calls; every handler calls
// call.Go() first, so a parked poll does not hold up the connection's other
// calls. Arguments are copied before they outlive a handler. No locks.
package queueber
