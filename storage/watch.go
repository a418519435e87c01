package storage

import "context"

// ReadyWatcher is implemented by stores whose queues can gain ready items
// from other processes (fdbsync: many nodes share one database), so a
// long-poll on one node must learn about an enqueue, nack, redrive or lease
// expiry on another. A local Store does not need it: the node that changed
// the queue notifies its own waiters.
//
// Use: after a Poll returned nothing, call WatchReady and wait on the
// channel (and your own timeout), then poll again. The channel is closed
// when the queue may have gained ready items since the watch was set: an
// item became ready, the queue already had ready items when the watch was
// set (so a change between the empty Poll and the watch is not lost), the
// watch failed, ctx ended, or the store closed. A close is a hint, never a
// promise: the next Poll may still find nothing.
type ReadyWatcher interface {
	WatchReady(ctx context.Context, queue string) (<-chan struct{}, error)
}
