package memstore

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// TestCheck_FindsBrokenInvariants breaks the model's structures by hand and
// requires Check to notice, so a passing Check in the suites means
// something.
func TestCheck_FindsBrokenInvariants(t *testing.T) {
	t.Parallel()
	now := time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)
	for name, breakIt := range map[string]func(s *Store){
		"ready counter": func(s *Store) { s.mu.queues["q"].st.Ready++ },
		"lease counter": func(s *Store) { s.mu.queues["q"].st.Leases-- },
		"dead counter":  func(s *Store) { s.mu.queues["q"].st.Dead++ },
		"inflight item without its lease": func(s *Store) {
			for _, l := range s.mu.leases {
				for id := range l.items {
					delete(l.items, id)
				}
			}
		},
		"lease without expiry entry": func(s *Store) {
			for _, l := range s.mu.leases {
				s.mu.leaseHeap.remove(l.idx)
			}
		},
		"available item missing from its index": func(s *Store) {
			q := s.mu.queues["q"]
			for _, e := range q.items {
				if e.loc == locAvailable && !e.delayed {
					q.avail[e.item.Priority].remove(e.availIdx)
					return
				}
			}
		},
		"item in no namespace": func(s *Store) {
			for _, e := range s.mu.queues["q"].items {
				if e.loc == locDead {
					e.loc = 0
				}
			}
		},
		"attempts above the item's max": func(s *Store) {
			for _, l := range s.mu.leases {
				for _, e := range l.items {
					e.item.MaxAttempts = 1
					e.item.Attempts = 2
				}
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s := New(Options{})
			t.Cleanup(func() { require.NoError(t, s.Close()) })
			ctx := context.Background()
			c := storage.DefaultQueueConfig()
			c.MaxAttempts = 1
			require.NoError(t, s.SetQueueConfig(ctx, "q", c))
			_, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: "q", Now: now, Items: []storage.EnqueueItem{
				{Payload: []byte("dies")}, {Payload: []byte("held")}, {Payload: []byte("ready")}, {Payload: []byte("later"), Delay: time.Hour},
			}})
			require.NoError(t, err)
			p, err := s.Poll(ctx, storage.PollParams{Queue: "q", Max: 1, Now: now})
			require.NoError(t, err)
			_, err = s.Nack(ctx, storage.NackParams{Queue: "q", Lease: p.Lease, IDs: []storage.ItemID{p.Items[0].ID}, Now: now})
			require.NoError(t, err)
			_, err = s.Poll(ctx, storage.PollParams{Queue: "q", Max: 1, Now: now})
			require.NoError(t, err)
			rep, err := s.Check(ctx)
			require.NoError(t, err)
			require.True(t, rep.OK(), "before breaking: %v", rep.Violations)
			require.Equal(t, 4, rep.Items)
			require.Equal(t, 1, rep.Leases)

			s.mu.Lock()
			breakIt(s)
			s.mu.Unlock()
			rep, err = s.Check(ctx)
			require.NoError(t, err)
			require.False(t, rep.OK(), "Check missed a broken %s", name)
		})
	}
}
