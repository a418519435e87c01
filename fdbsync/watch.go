package fdbsync

import (
	"context"
	"fmt"

	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

var _ storage.ReadyWatcher = (*Store)(nil)

// WatchReady implements storage.ReadyWatcher with an FDB watch on the
// queue's wake key, which every transaction that makes items ready in that
// queue bumps by atomic add (enqueue, nack, lease expiry, promotion,
// redrive). The same transaction that sets the watch snapshot-reads the
// ready index: if it is not empty the channel is closed at once, so an
// enqueue that landed between an empty Poll and this call is not missed.
// The watch goroutine ends when the watch fires, ctx ends or the store
// closes.
func (s *Store) WatchReady(ctx context.Context, queue string) (<-chan struct{}, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	if err := s.limits.ValidateQueueName(queue); err != nil {
		return nil, err
	}
	var w kv.Watch
	ready := false
	_, err := s.r.Transact(ctx, func(tx kv.Tx) (any, error) {
		w, ready = nil, false
		rp := s.k.readyPrefix(queue)
		rows, err := tx.GetRange(rp, kv.PrefixEnd(rp), kv.RangeOptions{Snapshot: true, Limit: 1})
		if err != nil {
			return nil, err
		}
		if len(rows) > 0 {
			ready = true
			return nil, nil
		}
		w, err = tx.Watch(s.k.wake(queue))
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
		w.Cancel()
		return nil, storage.ErrClosed
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer close(ch)
		select {
		case <-w.Done():
		case <-ctx.Done():
			w.Cancel()
		case <-s.ctx.Done():
			w.Cancel()
		}
	}()
	return ch, nil
}
