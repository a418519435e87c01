package fdbsync

import (
	"context"
	"fmt"

	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

var _ storage.ReadyWatcher = (*Store)(nil)

// WatchReady implements storage.ReadyWatcher with FDB watches on the
// queue's wake key, which every transaction that makes items ready in that
// queue bumps by atomic add (enqueue, nack, lease expiry, promotion,
// redrive), and on its config key. The same transaction that sets the
// watches snapshot-reads the ready index: if it is not empty the channel
// is closed at once, so an enqueue that landed between an empty Poll and
// this call is not missed. The channel closes when either watch fires;
// the watch goroutine then cancels the other, and likewise both when ctx
// ends or the store closes. A watch refused past FDB's 10,000 watches per
// database handle does not close it: the goroutine stops waiting on it
// (see below).
//
// The wake key alone is not enough since a queue's removal clears it: a
// FDB watch fires only if the key's value differs from the one its
// transaction read, and a queue removed and created again between that
// read and the commit brings the key back to the same value after as many
// bumps (1 -> absent -> 1), so the watch would sleep through an item
// ready (FDB's ABA; found by review, session 72). The config key cannot
// come back: the removal clears it and a creation writes a new
// incarnation (the creating commit's versionstamp) into it. Configs
// written by older nodes hold no incarnation, so a queue an older node
// creates again with the same config may still miss that one wake-up,
// until the poll's wait ends; never an item.
func (s *Store) WatchReady(ctx context.Context, queue string) (<-chan struct{}, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	if err := s.limits.ValidateQueueName(queue); err != nil {
		return nil, err
	}
	// The watches of an attempt that is retried or fails are failed by
	// the transaction (OnError, Cancel), so only the last attempt's two
	// can still be registered.
	var wake, conf kv.Watch
	ready := false
	_, err := s.r.Transact(ctx, func(tx kv.Tx) (any, error) {
		wake, conf, ready = nil, nil, false
		rp := s.k.readyPrefix(queue)
		rows, err := tx.GetRange(rp, kv.PrefixEnd(rp), kv.RangeOptions{Snapshot: true, Limit: 1})
		if err != nil {
			return nil, err
		}
		if len(rows) > 0 {
			ready = true
			return nil, nil
		}
		if wake, err = tx.Watch(s.k.wake(queue)); err != nil {
			return nil, err
		}
		conf, err = tx.Watch(s.k.queue(queue))
		return nil, err
	})
	if err != nil {
		return nil, fmt.Errorf("fdbsync: watch %q: %w", queue, err)
	}
	ch := make(chan struct{})
	if ready {
		close(ch)
		return ch, nil
	}
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		wake.Cancel()
		conf.Cancel()
		return nil, storage.ErrClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer close(ch)
		// Cancelling a watch that has fired is a no-op; cancelling the
		// one still pending releases its registration (on a cluster,
		// one of the database handle's 10,000 watches).
		defer wake.Cancel()
		defer conf.Cancel()
		// A watch refused for too many watches (past the handle's
		// 10,000, FDB fails each new one at once) is no wake-up: closing
		// the channel would have the dispatcher poll, park and watch
		// again at once, a busy loop of transactions per parked poll. It
		// is dropped (a nil channel never receives), and a poll left with
		// no watch waits for its own node's notices or its wait's end.
		// Any other failure (a recovery of the cluster, say) still wakes
		// the poll, which polls and watches again, as a change would.
		// Only this goroutine cancels the watches, and only on its way
		// out, so an error seen here is never that cancellation.
		wakeDone, confDone := wake.Done(), conf.Done()
		for {
			select {
			case <-wakeDone:
				if kv.CodeOf(wake.Err()) != kv.CodeTooManyWatches {
					return
				}
				wakeDone = nil
			case <-confDone:
				if kv.CodeOf(conf.Err()) != kv.CodeTooManyWatches {
					return
				}
				confDone = nil
			case <-ctx.Done():
				return
			case <-s.ctx.Done():
				return
			}
		}
	}()
	return ch, nil
}
