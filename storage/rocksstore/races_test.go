package rocksstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// splitEnqueueClaim is an EnqueueClaim of 1000 items with 8 parked polls of
// max 1000: the ops carry 9000 items, more than two batches of
// maxBatchItems, so the leader builds [enq p1 p2 p3] and [p4..p7], then
// hands the lead to p8, the first pending op, which is its own caller's.
func splitEnqueueClaim(now time.Time) (storage.EnqueueParams, []storage.PollParams) {
	items := make([]storage.EnqueueItem, 1000)
	for i := range items {
		items[i] = storage.EnqueueItem{Payload: []byte(fmt.Sprintf("n%d", i))}
	}
	polls := make([]storage.PollParams, 8)
	for i := range polls {
		polls[i] = storage.PollParams{Queue: "q", Max: 1000, Lease: time.Minute, Now: now}
	}
	return storage.EnqueueParams{Queue: "q", Items: items, Now: now}, polls
}

// A synchronous call whose ops fill more batches than one leader builds
// is handed the lead for its own later op while its first op waits for
// the fsync of the batches before. With a HoldSync in force at that
// hand-off, the release of the hold must start the fsync.
func TestPipeline_HandedOffLeadUnderHoldSync(t *testing.T) {
	b := setup(t, func(o *Options) {
		o.Sync = SyncAlways
		o.PrefetchHold = -1
	})
	b.s.HoldSync()
	ep, polls := splitEnqueueClaim(at(0))
	done := make(chan error, 1)
	go func() {
		_, _, err := b.s.EnqueueClaim(b.ctx, ep, polls)
		done <- err
	}()
	// The first two batches are written (held: no fsync), then the lead
	// is handed to p8.
	require.Eventually(t, func() bool {
		p := &b.s.pipe
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.unsynced) == 2 && len(p.pending) == 1
	}, 10*time.Second, time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	b.s.ReleaseSync()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Errorf("EnqueueClaim never returned after ReleaseSync: the pipeline stalled (leading=true, nobody leads, no fsync)")
		// Unstick it so that the cleanup's Close does not hang too.
		p := &b.s.pipe
		p.mu.Lock()
		p.kickLocked()
		p.mu.Unlock()
		require.NoError(t, <-done)
	}
}

// An EnqueueClaim whose claims span batches in different fsync groups:
// the enqueue's group is fsynced, the last claim's fsync fails. The call
// may succeed (its enqueue is durable), but the claim whose fsync failed
// answers its poll with nothing.
func TestEnqueueClaim_ClaimWhoseFsyncFailedAnswersNothing(t *testing.T) {
	h := newBlockingSync()
	h.free.Store(true)
	b := setup(t, func(o *Options) {
		o.Sync = SyncAlways
		o.PrefetchHold = -1
		o.syncHook = h.hook
	})
	for i := 0; i < 8; i++ {
		b.enqueueN("q", at(0), 1000)
	}
	h.free.Store(false)
	// No early fsync (as on a WAL whose logs cannot tell, canWaitLogged),
	// so that the groups are [b1 b2] and [b3] every run. With it, the
	// groups may also be [b1] and [b2]: then p4..p7 are the claims
	// answered although their fsync failed.
	b.s.pipe.mu.Lock()
	b.s.pipe.logged = false
	b.s.pipe.mu.Unlock()
	ep, polls := splitEnqueueClaim(at(time.Second))
	type out struct {
		prs []storage.PollResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		_, prs, err := b.s.EnqueueClaim(b.ctx, ep, polls)
		done <- out{prs, err}
	}()
	<-h.entered // the fsync of [enq p1 p2 p3] and [p4..p7]
	h.release <- nil
	<-h.entered // the fsync of [p8]
	h.release <- errors.New("injected: fsync failed")
	r := <-done
	require.Error(t, b.s.Failed(), "the store failed")
	if r.err == nil {
		require.Empty(t, r.prs[7].Items, "p8's claim is answered although the fsync of its batch failed (lease %s)", r.prs[7].Lease)
	}

	// Reopen without the hook for the cleanup's check.
	h.free.Store(true)
	b.reopenWithoutSyncHook()
}

// An asynchronous leader completes its ops (their done callbacks let go
// of Store.life) and then goes on with the pipeline as its leader.
// Recover waits for it before it resets the pipeline, so that a new
// caller's lead is never shared with it. The window is held open by a
// done callback that blocks on the leader's goroutine.
func TestRecover_WaitsForAsyncLeader(t *testing.T) {
	b := setup(t) // SyncNone: a leader completes its batches itself
	s := b.s

	// W: an asynchronous op whose apply blocks; its submitter leads.
	gateW, inW := make(chan struct{}), make(chan struct{})
	gwDone := make(chan struct{})
	require.NoError(t, s.enter("w"))
	go func() {
		defer close(gwDone)
		w := &op{apply: func(o *opTx) error { close(inW); <-gateW; return nil }, items: 1}
		s.submitAsync("", []*op{w}, func() { s.exit() })
	}()
	<-inW

	// Y: pended behind W (nobody leads for it); its done blocks.
	gateY, inY := make(chan struct{}), make(chan struct{})
	var yErr error
	s.EnqueueAsync(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("y")}}, Now: at(0)},
		func(_ []storage.EnqueueResult, err error) { yErr = err; close(inY); <-gateY })

	// The store fails (a write or fsync of someone else's batch).
	s.fail(errors.New("injected: write failed"))
	close(gateW)
	<-inY // W's leader completed Y with the failure; Y's done holds it
	require.Error(t, yErr)

	// Nothing holds Store.life, but W's leader is still at work: Recover
	// waits for it before it resets the pipeline.
	type recovered struct {
		ok  bool
		err error
	}
	rec := make(chan recovered, 1)
	go func() {
		ok, err := s.Recover()
		rec <- recovered{ok, err}
	}()
	select {
	case r := <-rec:
		t.Fatalf("Recover returned while the leader was still at work: %v, %v", r.ok, r.err)
	case <-time.After(100 * time.Millisecond):
	}
	close(gateY)
	<-gwDone
	r := <-rec
	require.NoError(t, r.err)
	require.True(t, r.ok)

	// Z: a new synchronous call leads the new pipeline and is mid-batch.
	gateZ, inZ := make(chan struct{}), make(chan struct{})
	zDone := make(chan error, 1)
	go func() {
		if err := s.enter("z"); err != nil {
			zDone <- err
			return
		}
		defer s.exit()
		_, err := s.submit("", 1, func(o *opTx) error { close(inZ); <-gateZ; return nil })
		zDone <- err
	}()
	<-inZ

	p := &s.pipe
	p.mu.Lock()
	leading := p.leading
	p.mu.Unlock()
	close(gateZ)
	require.NoError(t, <-zDone)
	require.True(t, leading, "the stale asynchronous leader cleared p.leading while Z was leading: the next caller leads a second, concurrent batch")
}

// hookCtx runs fn the first time Err is called (Stats checks it between
// listing the queues and reading each one).
type hookCtx struct {
	context.Context
	once sync.Once
	fn   func()
}

func (c *hookCtx) Err() error {
	c.once.Do(c.fn)
	return c.Context.Err()
}

// Stats over all queues skips a queue deleted between its listing and
// its lookup.
func TestStats_QueueDeletedWhileListed(t *testing.T) {
	b := setup(t)
	b.enqueueN("q", at(0), 1)
	ctx := &hookCtx{Context: context.Background(), fn: func() {
		_, err := b.s.DeleteQueue(context.Background(), storage.DeleteQueueParams{Queue: "q", Force: true, Now: at(time.Second)})
		require.NoError(t, err)
	}}
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("Stats panicked when the queue was deleted between its listing and its lookup: %v", r)
			}
		}()
		st, err := b.s.Stats(ctx, storage.StatsParams{Now: at(time.Second)})
		require.NoError(t, err)
		require.Empty(t, st)
	}()
}

// Failed (what /readyz asks) may run while Recover resets the pipeline:
// under -race, both touch the pipeline's failure only under its lock.
func TestRecover_FailedReadDuringReset(t *testing.T) {
	b := setup(t)
	s := b.s
	for round := 0; round < 20; round++ {
		s.fail(errors.New("injected: write failed"))
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
					_ = s.Failed()
				}
			}
		}()
		ok, err := s.Recover()
		close(stop)
		<-done
		require.NoError(t, err)
		require.True(t, ok)
		require.NoError(t, s.Failed())
	}
	b.enqueue("q", at(0), storage.EnqueueItem{Payload: []byte("after")})
}
