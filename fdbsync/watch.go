package fdbsync

import (
	"context"
	"fmt"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

var _ storage.ReadyWatcher = (*Store)(nil)

// WatchReady implements storage.ReadyWatcher with FDB watches on the
// queue's wake key, which every transaction that makes items ready in that
// queue bumps by atomic add (enqueue, nack, lease expiry, promotion,
// redrive), and on its config key. The same transaction that sets the
// watches snapshot-reads the ready index: if it holds an entry this
// node's polls serve now the channel is closed at once, so an enqueue that
// landed between an empty Poll and this call is not missed; an entry
// visible only later by the node's clock (Options.Clock; written by a
// node whose clock runs ahead) closes it then (readyNow). The channel closes when either watch fires;
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
	var visibleAt time.Time // the earliest entry not yet visible by s.clk
	_, err := s.r.Transact(ctx, func(tx kv.Tx) (any, error) {
		wake, conf, ready, visibleAt = nil, nil, false, time.Time{}
		var err error
		if ready, visibleAt, err = s.readyNow(tx, queue); err != nil || ready {
			return nil, err
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
	// An entry not yet visible by this node's clock: wake when it is.
	var visible <-chan time.Time
	var timer *clock.Timer
	if !visibleAt.IsZero() {
		timer = s.clk.Timer(visibleAt.Sub(s.clk.Now()))
		visible = timer.C
	}
	go func() {
		defer s.wg.Done()
		if timer != nil {
			defer timer.Stop()
		}
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
			case <-visible:
				return
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

// readyNow reports whether q's ready index holds an entry its polls serve
// now. Without a clock (Options.Clock nil) any entry counts. With one, an
// entry counts only once visible by it, as Poll judges (readyHead): an
// entry written by a node whose clock runs ahead is not, and at names
// the earliest such one, when the watch must wake by itself. Found by
// review (session 74): any entry woke the watch at once, so a parked
// poll on a node behind polled, found nothing, watched and woke again, a
// busy loop of transactions for the whole skew. The index is in
// (priority, visible_at, id) order, so the first entry of each priority
// is its earliest: one snapshot read of one row per priority present.
func (s *Store) readyNow(tx kv.Tx, q string) (ready bool, at time.Time, err error) {
	rp := s.k.readyPrefix(q)
	end := kv.PrefixEnd(rp)
	var now time.Time
	if s.clk != nil {
		now = s.clk.Now()
	}
	for from := rp; ; {
		rows, err := tx.GetRange(from, end, kv.RangeOptions{Snapshot: true, Limit: 1})
		if err != nil || len(rows) == 0 {
			return false, at, err
		}
		if s.clk == nil {
			return true, time.Time{}, nil
		}
		rest := rows[0].Key[len(rp):]
		if len(rest) != 1+8+16 {
			return false, time.Time{}, errBadKey
		}
		vis, _, err := readTime(rest[1:])
		if err != nil {
			return false, time.Time{}, err
		}
		if !vis.After(now) {
			return true, time.Time{}, nil
		}
		if at.IsZero() || vis.Before(at) {
			at = vis
		}
		if rest[0] == 0xff {
			return false, at, nil
		}
		from = append(append([]byte{}, rp...), rest[0]+1)
	}
}
