package storage

import "context"

// EnqueueClaimer is implemented by stores that can claim, in the commit
// (and fsync) that makes new items durable, items for polls that are
// waiting on the queue: a server hands it the polls parked there, so a
// durable enqueue and the claims it feeds share one fsync instead of
// taking one each.
type EnqueueClaimer interface {
	// EnqueueClaim is Enqueue(p) followed, in the same commit, by
	// Poll(polls[i]) for each i in order (each poll's Queue is p.Queue).
	// It returns the enqueue's results and one PollResult per poll (empty
	// when nothing was ready for it). A returned error means the enqueue
	// failed as Enqueue's would and no poll claimed anything; a poll
	// whose own claim fails gets an empty result and does not fail the
	// enqueue.
	EnqueueClaim(ctx context.Context, p EnqueueParams, polls []PollParams) ([]EnqueueResult, []PollResult, error)
}
