package storage

import "time"

// DeadlineFunc is called by a store after a commit that created a new
// deadline: a lease expiry (poll, extend) or the VisibleAt of a delayed item
// (enqueue with delay, nack). A sweeper uses it to arm a timer earlier than
// the one it has. It is called outside the store's locks and must not block
// or call back into the store. Backends take it in their Options.
type DeadlineFunc func(t time.Time)
