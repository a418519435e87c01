package storage

import "context"

// Async is implemented by stores whose calls can complete without holding
// the caller's goroutine while they wait for durability: a server's
// network reader hands a call over and goes back to reading, and done
// runs, on whichever goroutine makes the call durable (an fsync's, say),
// with what the synchronous call would have returned. done is called
// exactly once, maybe before the method returns; it must not block, since
// it may run on the goroutine that completes a whole group of calls.
type Async interface {
	// EnqueueAsync is Enqueue.
	EnqueueAsync(ctx context.Context, p EnqueueParams, done func([]EnqueueResult, error))
	// EnqueueClaimAsync is EnqueueClaimer.EnqueueClaim.
	EnqueueClaimAsync(ctx context.Context, p EnqueueParams, polls []PollParams, done func([]EnqueueResult, []PollResult, error))
	// PollAsync is Poll.
	PollAsync(ctx context.Context, p PollParams, done func(PollResult, error))
	// AckAsync is Ack.
	AckAsync(ctx context.Context, p AckParams, done func([]Code, error))
}

// SyncHolder is implemented by an Async store whose fsyncs can wait for
// calls that are about to be handed over: between HoldSync and
// ReleaseSync the store writes what it is handed but starts no fsync on
// its own goroutines, so calls handed over together (a client's pipelined
// ack and poll, read in one piece) share one. A holder holds only while it
// hands over calls it already has, and releases before it waits for
// anything, the store's answers included: a hold that is never released
// stops every asynchronous call's fsync.
type SyncHolder interface {
	HoldSync()
	ReleaseSync()
}
