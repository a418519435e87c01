package rocksstore

import (
	"context"
	"runtime/trace"
	"time"
)

// The fsync side of the commit pipeline (commit.go): the syncer
// goroutines and the inline fsync of a lone leader, which make written
// batches durable under SyncAlways and complete their ops, the holds
// that keep an fsync back while a caller hands over calls that came
// together (HoldSync, async.go), and the WAL fsync itself.

// heldLocked reports whether holds keep the next fsync from starting.
// REQUIRES: mu held.
func (p *pipeline) heldLocked() bool { return p.holds > 0 && !p.holdsOff }

// breakHolds makes holds stop holding back fsyncs (until mendHolds) and
// starts the fsync of what they held back. Close and Recover call it
// before they wait for the calls in flight: those calls may wait for an
// fsync a hold keeps back, while the holder waits to enter the store
// behind Close or Recover (a waiting writer blocks new readers of
// Store.life).
func (p *pipeline) breakHolds() { p.breakHoldsFor(false) }

// breakHoldsForGood is breakHolds for Close: no mendHolds undoes it.
func (p *pipeline) breakHoldsForGood() { p.breakHoldsFor(true) }

func (p *pipeline) breakHoldsFor(good bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holdsOff = true
	p.holdsClosed = p.holdsClosed || good
	if !p.leading || p.handedOff {
		p.kickLocked()
	}
}

// mendHolds lets holds hold fsyncs back again (Recover, once reopened),
// unless Close broke them meanwhile: a Recover that ended after Close
// began turned them back on, and an asynchronous call written behind a
// hold waited for an fsync the hold kept back while its holder waited to
// enter the store behind Close (found by review, session 69).
func (p *pipeline) mendHolds() {
	p.mu.Lock()
	p.holdsOff = p.holdsClosed
	p.mu.Unlock()
}

// kickLocked hands the written batches to the syncer goroutine unless a
// goroutine fsyncs already, and reports whether it woke the syncer.
// REQUIRES: mu held.
func (p *pipeline) kickLocked() bool {
	if len(p.unsynced) > 0 && !p.syncing && !p.heldLocked() {
		p.syncing = true
		p.kick <- struct{}{}
		return true
	}
	return false
}

// written is a batch written and waiting for its fsync.
type written struct {
	ops   []*op
	wrote bool   // the batch wrote to the WAL
	seq   uint64 // the batch's number (batch.seq)
}

// syncers is the number of syncer goroutines. One fsyncs at a time; a
// second lets the one that just fsynced complete its group's
// asynchronous ops (which build and send the calls' answers, see
// submitAsync) while the other already fsyncs the next group.
const syncers = 2

// syncInline fsyncs the written batches on the caller's goroutine (a
// leader that gave up the lead); batches written meanwhile go to the
// syncer goroutine, so the caller is held for one fsync only.
// REQUIRES: p.syncing was set for this goroutine.
func (s *Store) syncInline() {
	p := &s.pipe
	p.mu.Lock()
	group := p.unsynced
	p.unsynced = nil
	p.mu.Unlock()
	complete(group, s.syncFor(group, true))
	// Completed first: the batches written meanwhile then share the
	// syncer's next fsync (measured: produce-b100 in process).
	p.mu.Lock()
	p.recycleLocked(group)
	if len(p.unsynced) > 0 && !p.heldLocked() {
		p.kick <- struct{}{} // the syncing passes to the syncer
	} else {
		p.endSyncingLocked()
	}
	p.mu.Unlock()
}

// endSyncingLocked: nobody fsyncs any more. REQUIRES: mu held.
func (p *pipeline) endSyncingLocked() {
	p.syncing = false
	p.idle.Broadcast()
}

// syncLoop is a syncer goroutine: once kicked (and made the one
// syncing), it fsyncs the WAL once for every batch written since the last
// fsync and completes their ops, until none is waiting. When a group's
// asynchronous ops are large and more batches wait, it hands the syncing
// to the other syncer before it completes the group (see syncers).
func (s *Store) syncLoop() {
	p := &s.pipe
	defer p.wg.Done()
	for range p.kick {
		var completed []written // recycled at the next lock
		for {
			p.mu.Lock()
			if completed != nil {
				p.recycleLocked(completed)
				completed = nil
			}
			if mark := p.earlyMark; mark != 0 {
				p.earlyMark = 0
				p.mu.Unlock()
				group, ok := s.syncEarly(mark)
				if ok {
					completed = group
					continue
				}
				p.mu.Lock()
			}
			if len(p.unsynced) == 0 || p.heldLocked() {
				// Held: the last ReleaseSync starts the next fsync.
				p.endSyncingLocked()
				p.mu.Unlock()
				break
			}
			group := p.unsynced
			p.unsynced = nil
			p.mu.Unlock()
			err := s.syncFor(group, false)
			handed := false
			if asyncItems(group) >= handOffItems {
				p.mu.Lock()
				if len(p.unsynced) > 0 && !p.heldLocked() {
					p.kick <- struct{}{}
					handed = true
				}
				p.mu.Unlock()
			}
			complete(group, err)
			if handed {
				p.mu.Lock()
				p.recycleLocked(group)
				p.mu.Unlock()
				break
			}
			completed = group
		}
	}
}

// syncEarly is a syncer kicked before batch mark was written
// (fsyncEarlyLocked): once the batch's record is in the WAL file it
// fsyncs, while the leader's commit still inserts into the memtables,
// then waits for the leader to be done with the batch and completes the
// written batches up to it. ok is false, and nothing was done, when the
// batch wrote no record, or its fsync would start while holds hold
// fsyncs back or the store has failed: the usual loop goes on from there.
func (s *Store) syncEarly(mark uint64) (group []written, ok bool) {
	p := &s.pipe
	logged := s.db.waitLogged(mark)
	p.mu.Lock()
	if !logged || p.heldLocked() || p.failed != nil {
		p.mu.Unlock()
		return nil, false
	}
	p.mu.Unlock()
	err := s.fsyncWAL(false)
	s.m.earlySyncs.Add(1)
	p.mu.Lock()
	for p.finished < mark {
		p.done.Wait()
	}
	// Batches are written in order: those up to mark were written before
	// the fsync began; later ones wait for the next.
	n := 0
	for n < len(p.unsynced) && p.unsynced[n].seq <= mark {
		n++
	}
	group = append(p.spare[:0], p.unsynced[:n]...)
	p.spare = nil
	p.unsynced = append(p.unsynced[:0], p.unsynced[n:]...)
	p.mu.Unlock()
	s.m.syncedBatches.Add(wroteBatches(group))
	complete(group, err)
	return group, true
}

// handOffItems is how many items the asynchronous ops of a group must
// touch for a syncer to hand the next fsync to the other syncer before it
// completes them: completing a few single-item calls costs less than
// waking the other syncer (measured: produce-b1 and e2e over RPC,
// docs/BENCHMARKS.md).
const handOffItems = 32

// asyncItems returns the items the asynchronous ops of a group touch.
func asyncItems(group []written) int {
	n := 0
	for _, w := range group {
		for _, o := range w.ops {
			if o.done != nil {
				n += o.items
			}
		}
	}
	return n
}

// syncFor fsyncs the WAL for a group of written batches (inline: on the
// goroutine of a call, see syncInline) and returns the error their ops
// complete with. Batches are written in order, so when none in the group
// wrote, every earlier write was synced by an earlier group. Once the
// store has failed, a group fails without an fsync: after a failed fsync
// the kernel may have dropped the dirty pages it could not write and
// marked them clean, so a later fsync that succeeds proves nothing about
// batches written before the failure was known (and a group that wrote
// nothing may answer from their writes).
func (s *Store) syncFor(group []written, inline bool) error {
	s.pipe.mu.Lock()
	failed := s.pipe.failed
	s.pipe.mu.Unlock()
	if failed != nil {
		return failed
	}
	wrote := wroteBatches(group)
	if wrote == 0 {
		return nil
	}
	s.m.syncedBatches.Add(wrote)
	return s.fsyncWAL(inline)
}

// wroteBatches counts the batches of a group that wrote to the WAL.
func wroteBatches(group []written) uint64 {
	n := uint64(0)
	for _, w := range group {
		if w.wrote {
			n++
		}
	}
	return n
}

// fsyncWAL fsyncs the WAL, counted and timed in the metrics and marked in
// an execution trace, and returns the error the synced ops complete with.
func (s *Store) fsyncWAL(inline bool) error {
	var start time.Time
	if s.opts.Now != nil {
		start = s.opts.Now()
	}
	rg := trace.StartRegion(context.Background(), TraceFsyncRegion)
	err := s.syncWAL()
	rg.End()
	if s.opts.Now != nil {
		s.m.syncNanos.Add(uint64(s.opts.Now().Sub(start)))
	}
	s.m.walSyncs.Add(1)
	if inline {
		s.m.inlineSyncs.Add(1)
	}
	if err != nil {
		err = s.fail(translate("sync wal", err))
	}
	return err
}

// complete completes the ops of a group that syncFor fsynced.
func complete(group []written, err error) {
	for _, w := range group {
		finish(w.ops, err)
	}
}

// syncWAL fsyncs the WAL in one cgo call, on the goroutine that syncs
// (Options.syncHook wraps it in tests). One call per group, not one inside
// every caller's commit; a C thread of its own measured worse
// (docs/BENCHMARKS.md).
func (s *Store) syncWAL() error {
	sync := func() error { return s.db.flushWAL(true) }
	if s.opts.syncHook != nil {
		return s.opts.syncHook(sync)
	}
	return sync()
}
