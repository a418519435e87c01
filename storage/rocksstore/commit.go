package rocksstore

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/trace"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// The commit pipeline. Every mutating call becomes an op. Ops are
// combined: the caller that finds no batch being built becomes the leader;
// it takes every pending op (its own first), applies them in order to one
// RocksDB transaction (reads through GetForUpdate, writes buffered in an
// overlay that later ops of the batch read first) and commits the batch
// once, without fsync. Callers arriving meanwhile queue up for the next
// batch, which the leader also builds (up to maxLeadBatches) before it
// hands the lead to the first of them. A leader does the work on its own
// goroutine, so an uncontended call crosses no goroutine at all.
//
// Building and committing do not overlap: handing each built batch to a
// committer goroutine, or passing the lead on before each commit, cost
// more per batch than the overlap saved on two cores, and a third try
// (a committer goroutine, two transactions alternating) did not raise
// e2e either, nor a fourth with SyncAlways, where a core sits idle
// (measured; docs/BENCHMARKS.md, docs/TRIED.md).
//
// With SyncAlways one goroutine at a time fsyncs the WAL, once for every
// batch written since the last fsync, and only then completes their
// callers. While nobody fsyncs, a leader that finds callers waiting once
// its batch is written builds their batch too, and the batches share one
// fsync: that fsync starts a batch later, but the batch after would
// otherwise wait for a whole fsync of its own (measured again where a
// batch takes as long as an fsync, e2e in process: starting the fsync
// first made the two overlap, with twice the fsyncs and no more
// items/s; docs/BENCHMARKS.md, "A trace reader in the harness"). A
// leader that has nobody waiting behind it fsyncs itself (syncInline),
// so a lone caller crosses no goroutine; a leader that hands the lead
// on leaves the fsync to the syncer goroutine, which runs it while the
// next leader builds. With SyncNone callers are completed as soon as
// their batch is written.
//
// Asynchronous ops (async.go) have no caller waiting: their done runs on
// the goroutine that completes them. A caller that submits one and finds
// nobody leading leads, but never fsyncs inline, and when the next op to
// lead for is asynchronous too, a leader past maxLeadBatches hands the
// lead to a new goroutine rather than leading on. Such a leader that
// wakes the syncer when it gives up the lead yields (runtime.Gosched), so
// that the fsync starts at once instead of once the leader parks.
// Completing asynchronous ops costs more than waking callers (their done
// builds and sends RPC answers), so a syncer with many such items to
// complete, and batches waiting behind them, first hands the next fsync
// to the second syncer goroutine (syncers).
//
// A batch's writes are visible (to later batches and to reads) before its
// fsync: an item can be claimed by a poll before the enqueue that made it
// is durable. Nobody has been told the enqueue succeeded yet, and the WAL
// is a sequential log, so the fsync that makes the poll durable makes the
// enqueue durable too; a crash before it loses both, and neither caller
// was answered (see storage/doc.go and TestRocksStore_FsyncFailureInWindow).

// op is one caller's operation in the pipeline.
type op struct {
	apply func(o *opTx) error // runs on the leader
	items int                 // items the op touches: a size hint until it runs (a claim then sets what it took)
	err   error
	next  time.Time // earliest new deadline (OnDeadline)
	// wake receives true when the op is complete, false when its caller
	// must lead the next batch (and true later, when it is complete).
	// nil for an asynchronous op, which done completes instead.
	wake chan bool
	// done, for an asynchronous op (submitAsync), runs once the op is
	// complete, on the goroutine that completes it.
	done func()
}

// newOp returns an op that runs apply and touches about items items.
func newOp(items int, apply func(o *opTx) error) *op {
	return &op{apply: apply, items: items, wake: wakePool.Get().(chan bool)}
}

// wakePool holds empty wake channels of completed ops (submitGroup puts
// them back): a channel per call was one of its allocations.
var wakePool = sync.Pool{New: func() any { return make(chan bool, 1) }}

// maxBatchItems caps the items one batch applies, so a crowd of large
// calls does not build one huge transaction; the rest go into the next
// batch.
const maxBatchItems = 4096

// yieldBelowItems: a caller that takes the lead for calls of fewer items
// than this yields its P once first (submitGroup). Goroutines already
// runnable, such as connection readers woken with their calls by the same
// network poll, then pend their ops before the first batch is taken, and
// one commit and one WAL write serve them all. Larger calls carry their
// commit's fixed cost already, and the yield would only delay them.
// Asynchronous callers (RPC readers with --sync=always) never yield
// here: the reader that wakes the syncer yields instead (leadBatches).
const yieldBelowItems = 64

// maxLeadBatches is how many batches one leader builds before it hands the
// lead on: enough that a burst of arrivals during its first batch rides
// along without a hand-off, few enough that its own call is not delayed.
const maxLeadBatches = 2

// earlyFsyncItems is how many items a batch must touch for its fsync to
// start as soon as its record is in the WAL file rather than after its
// commit returns: a commit then inserts into the memtables for about a
// third of the batch's time, and the fsync overlaps it. Below it the
// overlap is small (with 1: produce-b1 and latency-max, in process and
// over RPC, gained nothing).
const earlyFsyncItems = 32

// maxReusedOverlay is the largest overlay map a batch hands on to the
// next one; a larger one is dropped (see runBatch).
const maxReusedOverlay = 512

type pipeline struct {
	mu      sync.Mutex
	pending []*op
	leading bool // a leader is building batches
	// handedOff is set while the lead is handed on (to the first pending
	// op's goroutine, or a new one) and nobody has taken it yet: that
	// goroutine may itself wait for an earlier op's fsync, so a release
	// of the holds must start it (ReleaseSync). REQUIRES: mu held.
	handedOff bool
	// unsynced are the batches written and waiting for the WAL fsync
	// (SyncAlways); syncing is set while a goroutine fsyncs them: the
	// syncer goroutine, or a leader that wrote a batch with nobody
	// waiting behind it. One at a time, so groups complete in order.
	// REQUIRES: mu held.
	unsynced []written
	syncing  bool
	// holds counts the callers between HoldSync and ReleaseSync: while
	// any holds, no fsync starts on the syncers (the last release starts
	// it), so the calls a holder hands over together share one, unless
	// holdsOff (breakHolds); for good once Close broke them
	// (holdsClosed). REQUIRES: mu held.
	holds       int
	holdsOff    bool
	holdsClosed bool
	kick        chan struct{} // wakes the syncer goroutine
	idle        sync.Cond     // signalled when syncing or leading ends
	wg          sync.WaitGroup
	failed      error // set by a failed write or fsync; REQUIRES: mu held
	slot        *txnSlot
	buf         []*op  // the leader's scratch list; REQUIRES: leading
	batches     uint64 // batches begun (batch.seq); REQUIRES: leading
	// callers counts the synchronous calls in submitGroup, alone the
	// calls in a row that found no other there (enterCall); an
	// asynchronous call resets it. Counted only with skipLoneYield.
	callers atomic.Int32
	alone   atomic.Uint32
	// skipLoneYield: a lone caller does not yield (SyncNone); set at
	// open.
	skipLoneYield bool
	// spare and freeOps are the room of completed groups, for the next
	// unsynced list and the next batches' op lists (a batch hands its
	// list to the fsync); REQUIRES: mu held.
	spare   []written
	freeOps [][]*op
	// logged: the syncers may fsync a batch as soon as its record is in
	// the WAL file (early fsync, see fsyncEarlyLocked); set at open.
	// earlyMark is the batch a syncer was kicked for that way, and
	// finished the last batch the leader is done with (written or
	// failed), signalled by done. REQUIRES: mu held.
	logged    bool
	earlyMark uint64
	finished  uint64
	done      sync.Cond
}

// maxFreeOps is how many completed op lists the pipeline keeps.
const maxFreeOps = 4

// recycleLocked keeps the room of a completed group for later groups and
// batches. REQUIRES: mu held; nobody uses group or its op lists any more.
func (p *pipeline) recycleLocked(group []written) {
	for _, w := range group {
		if len(p.freeOps) < maxFreeOps && cap(w.ops) <= maxReusedSorted {
			clear(w.ops)
			p.freeOps = append(p.freeOps, w.ops[:0])
		}
	}
	if p.spare == nil && cap(group) <= maxReusedSorted {
		clear(group)
		p.spare = group[:0]
	}
}

// opsLocked returns an empty op list, recycled if there is one.
// REQUIRES: mu held.
func (p *pipeline) opsLocked() []*op {
	if n := len(p.freeOps); n > 0 {
		l := p.freeOps[n-1]
		p.freeOps[n-1] = nil
		p.freeOps = p.freeOps[:n-1]
		return l
	}
	return nil
}

// txnSlot is a reusable RocksDB transaction object and its write batch.
type txnSlot struct {
	// t is the batch's transaction, begun by the batch's first read
	// (txn): a batch that reads nothing through it, enqueues and acks
	// alone, is written outside any transaction.
	t     *rdbTxn
	began bool
	// ov is the overlay of the batch being built, reused across batches.
	ov overlay
	// keys and vals hold the batch's hot-path keys and item records (see
	// opTx.availableKey and opTx.itemValue); they are reset when the next
	// batch starts, as ov is.
	keys keyArena
	vals keyArena
	// wbuf collects the batch's writes for one call into RocksDB, in the
	// order of sorted, the overlay's live entries in key order.
	wbuf   writeBuf
	sorted []overlayEnt
	// undo and undoFn are the undo logs ops reuse, one op at a time.
	undo   []undoWrite
	undoFn []undoStep
	// ot is the view of the op being applied, reused op after op.
	ot opTx
	// cs is the claims' scratch, reset when the next batch starts.
	cs claimScratch
	// b is the batch being built, its lists reused from batch to batch.
	b batch
}

// txn returns the batch's transaction, begun by its first use in the
// batch.
func (b *batch) txn() *rdbTxn {
	if !b.slot.began {
		b.slot.t = b.s.db.begin(b.slot.t)
		b.slot.began = true
	}
	return b.slot.t
}

// claimScratch holds the lists the batch's claims use, so a poll
// allocates none of them: the claimed items (opTx.claimBuf), and one
// claim's keys, cached records and values with getManyForUpdate's split
// of them into keys to lock (hit) and keys to read (miss, at their
// positions at).
type claimScratch struct {
	claimed                      []claimedItem
	keys, known, vals, miss, hit [][]byte
	at                           []int
}

// maxReusedWriteBuf is the largest write buffer kept for the next batch.
const maxReusedWriteBuf = 1 << 20

// maxReusedSorted is the largest entry list kept for the next batch.
const maxReusedSorted = 4096

// maxReusedUndo is the largest undo log kept for the next op.
const maxReusedUndo = 4096

// keepUndo takes back the undo logs of a finished op, cleared so that
// they hold nothing alive.
func (t *txnSlot) keepUndo(o *opTx) {
	clear(o.undo)
	clear(o.undoFn)
	if cap(o.undo) <= maxReusedUndo {
		t.undo = o.undo[:0]
	}
	if cap(o.undoFn) <= maxReusedUndo {
		t.undoFn = o.undoFn[:0]
	}
	clear(o.deltas)
	clear(o.notes)
}

// reset drops what the last batch's claims left, keeping the lists'
// room when it is not too large.
func (c *claimScratch) reset() {
	clear(c.claimed)
	c.claimed = c.claimed[:0]
	if cap(c.claimed) > maxReusedClaimed {
		c.claimed = nil
	}
	for _, l := range []*[][]byte{&c.keys, &c.known, &c.vals, &c.miss, &c.hit} {
		clear(*l)
		if cap(*l) > maxReusedClaimed {
			*l = nil
		}
	}
	if cap(c.at) > maxReusedClaimed {
		c.at = nil
	}
}

// scratch returns *l resized to n zeroed entries, reusing its room.
func scratch(l *[][]byte, n int) [][]byte {
	if cap(*l) < n {
		*l = make([][]byte, n)
		return *l
	}
	*l = (*l)[:n]
	clear(*l)
	return *l
}

// claimBuf returns an empty list with room for n claimed items, from the
// batch's claimed items: it stays valid until the next batch starts, so
// an op's undo can still read it.
func (o *opTx) claimBuf(n int) []claimedItem {
	cs := &o.b.slot.cs
	c := cs.claimed
	if cap(c)-len(c) < n {
		c = make([]claimedItem, 0, max(n, 64))
	}
	l := len(c)
	cs.claimed = c[:l+n]
	return c[l : l : l+n]
}

// maxReusedClaimed is the most claimed items whose room the slot keeps
// for the next batch.
const maxReusedClaimed = maxBatchItems

// keyArena hands out buffers from large chunks, so the several keys and
// records an item's life writes cost no allocation each. A buffer taken
// from it lives until the next batch starts: only the overlay, undo
// records and RocksDB's write batch (which copies) may hold it. A value
// read back from the overlay is copied (opTx.overlay), so none reaches a
// caller.
type keyArena struct {
	buf  []byte
	used int // bytes taken since reset, over every chunk
}

// keyArenaChunk is the size of a fresh chunk: about 700 keys of a queue
// with a 20-byte name.
const keyArenaChunk = 32 << 10

// keyArenaMax is the largest chunk reset makes for the batches to come.
const keyArenaMax = 1 << 20

// take returns an empty slice with room for n bytes.
func (a *keyArena) take(n int) []byte {
	if cap(a.buf)-len(a.buf) < n {
		a.buf = make([]byte, 0, max(keyArenaChunk, n))
	}
	a.used += n
	l := len(a.buf)
	a.buf = a.buf[:l+n]
	return a.buf[l : l : l+n]
}

// reset makes the current chunk reusable; earlier chunks go to the GC. A
// batch that outgrew the chunk gets one it would have fitted in (up to
// keyArenaMax) for the batches to come, so that batches of a steady size
// allocate no chunk each (in e2e over RPC they made a tenth of the
// node's allocated bytes).
func (a *keyArena) reset() {
	if a.used > cap(a.buf) && a.used <= keyArenaMax {
		a.buf = make([]byte, 0, min(a.used+a.used/4, keyArenaMax))
	}
	a.buf, a.used = a.buf[:0], 0
}

func (s *Store) startPipeline() {
	p := &s.pipe
	p.kick = make(chan struct{}, 1)
	p.logged = s.opts.Sync == SyncAlways && s.db.canWaitLogged()
	p.skipLoneYield = s.opts.Sync == SyncNone
	p.done.L = &p.mu
	p.idle.L = &p.mu
	p.wg.Add(syncers)
	for range syncers {
		go s.syncLoop()
	}
	p.slot = &txnSlot{t: s.db.begin(nil), ov: newOverlay()}
	s.slots = append(s.slots, p.slot)
}

// stopPipeline stops the syncer goroutines, once no goroutine fsyncs or
// leads. REQUIRES: no call in flight (s.life held exclusively), so no
// batch waiting for an fsync, and a leader or syncer left only finishing
// after its ops' done callbacks.
func (s *Store) stopPipeline() {
	p := &s.pipe
	p.mu.Lock()
	// An asynchronous leader goes on with the pipeline after its ops'
	// done callbacks (which let Close and Recover take Store.life): wait
	// for it as for the syncers. Neither waits on the store in a done.
	for p.syncing || p.leading {
		p.idle.Wait()
	}
	p.mu.Unlock()
	close(p.kick)
	p.wg.Wait()
}

// submit runs fn in a batch and waits until the batch is durable under
// the sync policy. REQUIRES: s.life held shared (enter).
func (s *Store) submit(queue string, items int, fn func(o *opTx) error) (time.Time, error) {
	o := newOp(items, fn)
	if err := s.submitGroup(queue, []*op{o}); err != nil {
		return time.Time{}, err
	}
	return o.next, o.err
}

// submitGroup hands ops to the pipeline together: they run in this order
// with nothing between them (in one batch unless maxBatchItems splits
// them), and it returns once all are durable under the sync policy; each
// op's err says how it went. The caller that finds nobody leading leads.
// REQUIRES: s.life held shared (enter).
func (s *Store) submitGroup(queue string, ops []*op) error {
	alone := s.pipe.enterCall()
	defer s.pipe.exitCall()
	lead, err := s.pend(ops)
	if err != nil {
		return err
	}
	if lead {
		if n := opItems(ops); n < yieldBelowItems && !alone {
			// Measured (docs/BENCHMARKS.md, "A leader that yields first"):
			// produce-b1 over RPC with --sync=none 9 % less node CPU per
			// call, in process 10 %; e2e in process with --sync=always
			// 19 % less per item.
			runtime.Gosched()
		}
		s.lead()
	}
	// The lead is only ever handed to the first pending op, and ops run in
	// order: waiting for them in order never waits on a lead this
	// goroutine was handed for a later one. It may wait for an earlier
	// op's fsync while handed the lead for a later one: the hand-off
	// kicks the syncer, or the release of the holds that kept it back
	// does (handedOff).
	for _, o := range ops {
		for !<-o.wake {
			s.lead()
		}
		// Complete: nobody sends on wake again, and it is empty.
		wakePool.Put(o.wake)
		if o.err != nil && errors.Is(o.err, storage.ErrCorrupt) {
			s.noteCorrupt(queue, o.err)
		}
	}
	return nil
}

// enterCall counts a synchronous caller in (the caller counts itself out
// when its ops are complete) and reports whether, with SyncNone, the store
// has served one caller at a time for more than aloneCalls calls in a row.
// Such a caller does not yield before it leads (submitGroup): nobody else's
// op could join its batch, and Gosched wakes a parked thread for the idle
// P (wakep) that finds nothing to run and parks again, a futex wake and a
// futex sleep per call, 15 % of a lone single-item consumer's CPU. The
// count is of calls already in the store, not of goroutines about to call
// it, so the yield stops only after a long run of lone calls, and the
// first call that meets another restarts it. With SyncAlways a lone
// caller keeps yielding: without the yield lone callers spent 25-60 %
// more CPU per item, Go's sysmon taking 8 % of the samples instead of 1 %
// while the caller sat in its inline fsync (docs/BENCHMARKS.md, "A lone
// leader's yield").
func (p *pipeline) enterCall() (alone bool) {
	if !p.skipLoneYield {
		return false // nothing counted: exitCall neither
	}
	if p.callers.Add(1) > 1 {
		p.crowded()
		return false
	}
	if p.alone.Load() > aloneCalls {
		return true // no add: the count stops here
	}
	return p.alone.Add(1) > aloneCalls
}

// exitCall counts out a caller enterCall counted in.
func (p *pipeline) exitCall() {
	if p.skipLoneYield {
		p.callers.Add(-1)
	}
}

// crowded notes a call that met another.
func (p *pipeline) crowded() {
	if p.alone.Load() != 0 { // no store while it stays 0: the line stays shared
		p.alone.Store(0)
	}
}

// aloneCalls is how many calls in a row must find no other call in the
// store before a leader stops yielding.
const aloneCalls = 64

// opItems is the items ops carry.
func opItems(ops []*op) int {
	n := 0
	for _, o := range ops {
		n += o.items
	}
	return n
}

// pend appends ops to the pipeline's pending ops, unless the store has
// failed (err); lead: nobody was leading, and the caller now leads.
func (s *Store) pend(ops []*op) (lead bool, err error) {
	p := &s.pipe
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed != nil {
		return false, p.failed
	}
	p.pending = append(p.pending, ops...)
	lead = !p.leading
	p.leading = true
	return lead, nil
}

// noteCorrupt records undecodable data met by a call on queue ("": not
// one queue's, the sweeper's): Corruption, and the queue's
// QueueStats.CorruptErrors.
func (s *Store) noteCorrupt(queue string, err error) {
	if s.m.corrupt.Add(1) == 1 {
		s.corruptFirst.Store(&err)
	}
	if queue != "" {
		s.corruptQ.Lock()
		if s.corruptQ.n == nil {
			s.corruptQ.n = make(map[string]uint64)
		}
		s.corruptQ.n[queue]++
		s.corruptQ.Unlock()
	}
	s.log.Error("rocksstore: corrupt data", "queue", queue, "err", err)
}

// corruptErrors returns how many calls on queue met damaged data.
func (s *Store) corruptErrors(queue string) uint64 {
	s.corruptQ.Lock()
	defer s.corruptQ.Unlock()
	return s.corruptQ.n[queue]
}

// Corruption reports how many calls met data they could not decode (a
// damaged record or SST block) since Open, and the first such error. A
// queue whose head item is damaged cannot be polled past it: the node
// reports itself not ready while count > 0.
func (s *Store) Corruption() (count uint64, first error) {
	count = s.m.corrupt.Load()
	if p := s.corruptFirst.Load(); p != nil {
		first = *p
	}
	return count, first
}

// lead builds and writes batches of pending ops until none is left or
// maxLeadBatches were built, then gives up the lead (to the first pending
// op, if any). REQUIRES: the caller was made leader.
func (s *Store) lead() { s.leadBatches(false) }

// leadAsync leads as lead does, for a caller that must not wait for an
// fsync (submitAsync): the written batches go to the syncer goroutine.
func (s *Store) leadAsync() { s.leadBatches(true) }

// leadBatches is lead; async: the leader leaves every fsync to the
// syncers. An asynchronous op has no goroutine to take the lead: when the
// next pending op past maxLeadBatches is one, a new goroutine leads on.
func (s *Store) leadBatches(async bool) {
	p := &s.pipe
	for n := 0; ; n++ {
		p.mu.Lock()
		p.handedOff = false
		if len(p.pending) == 0 {
			kicked := p.kickLocked() // written batches left by a failed one
			p.leading = false
			p.idle.Broadcast() // stopPipeline
			p.mu.Unlock()
			if kicked && async {
				// A connection's reader that just woke the syncer gives
				// way to it: the woken goroutine waits for this P
				// otherwise, and its fsync with it, until the reader
				// parks. The reader goes on on another P. Measured on
				// latency-max over RPC with --sync=always: 8 % more
				// items/s and a 7 % lower enqueue p50 (docs/BENCHMARKS.md).
				runtime.Gosched()
			}
			return
		}
		if n >= maxLeadBatches {
			p.kickLocked()
			p.handedOff = true
			if p.pending[0].wake != nil {
				p.pending[0].wake <- false
				p.mu.Unlock()
				return
			}
			// The next op is asynchronous: it has no goroutine to take
			// the lead, and this one (a caller, or a connection's
			// reader) must not lead for ever. A goroutine of the
			// store's own leads on.
			p.mu.Unlock()
			go s.leadAsync()
			return
		}
		k, items := 0, 0
		for k < len(p.pending) && (k == 0 || items+p.pending[k].items <= maxBatchItems) {
			items += p.pending[k].items
			k++
		}
		ops := append(p.buf[:0], p.pending[:k]...)
		rest := copy(p.pending, p.pending[k:])
		clear(p.pending[rest:])
		p.pending = p.pending[:rest]
		failed := p.failed
		mark := p.batches + 1 // this batch's seq (runBatch)
		early := failed == nil && p.fsyncEarlyLocked(mark, items, n, len(ops), async)
		p.mu.Unlock()
		if failed != nil {
			// The in-memory indexes may be ahead of the database.
			finish(ops, failed)
			p.buf = ops
			continue
		}

		rg := traceBatch(len(ops))
		wrote, err := s.runBatch(ops)
		rg.End()
		if early {
			s.db.markDone(mark) // in case runBatch committed nothing
		}
		switch {
		case err != nil:
			finish(ops, s.fail(err))
			p.buf = ops
			p.mu.Lock()
			p.finishedLocked(mark)
			p.mu.Unlock()
		case s.opts.Sync == SyncNone:
			finish(ops, nil)
			p.buf = ops
		default:
			// A batch that wrote nothing still waits for the fsync of the
			// batches before it: its answers (a duplicate enqueue, say)
			// may rest on their writes. Whoever fsyncs owns ops from here.
			// Nobody fsyncing and nobody waiting to be led: this goroutine
			// fsyncs inline, so a lone caller crosses no goroutine.
			// Nobody fsyncing but callers waiting: this leader builds
			// their batch first, so that one fsync covers both (an
			// fsync costs far more than a batch); the syncer takes over
			// when the leader hands the lead on. An fsync already
			// running: the batch waits for the next one.
			p.mu.Lock()
			p.buf = p.opsLocked()
			if p.unsynced == nil {
				p.unsynced, p.spare = p.spare, nil
			}
			p.unsynced = append(p.unsynced, written{ops: ops, wrote: wrote, seq: mark})
			p.finishedLocked(mark)
			inline := false
			if !p.syncing && len(p.pending) == 0 && !async {
				p.syncing = true
				p.leading = false
				inline = true
			}
			p.mu.Unlock()
			if inline {
				s.syncInline()
				return
			}
		}
	}
}

// fsyncEarlyLocked kicks a syncer to fsync batch mark (of calls ops
// touching items items, the leader's n-th batch in this lead; async: the
// leader leads asynchronous calls) as soon as its record is in the WAL
// file, and reports whether it did: when the WAL's logs can tell
// (pipeline.logged), nobody fsyncs nor holds fsyncs back, the batch is
// large enough (earlyFsyncItems), and it is the last this leader builds
// before the fsync would start anyway (nothing pending behind it, or the
// leader's last batch), so fsyncs cover as many batches as before. A
// lone synchronous call keeps its inline fsync: woken twice (the syncer,
// then the caller), it lost more than the overlap saved
// (BenchmarkCycle sync=always, 1 worker: 46k against 53k items/s).
// REQUIRES: mu held.
func (p *pipeline) fsyncEarlyLocked(mark uint64, items, n, calls int, async bool) bool {
	if !p.logged || p.syncing || p.heldLocked() || items < earlyFsyncItems ||
		(len(p.pending) > 0 && n+1 < maxLeadBatches) ||
		(len(p.pending) == 0 && calls == 1 && !async) {
		return false
	}
	p.syncing = true
	p.earlyMark = mark
	p.kick <- struct{}{}
	return true
}

// finishedLocked records that the leader is done with batch seq.
// REQUIRES: mu held.
func (p *pipeline) finishedLocked(seq uint64) {
	p.finished = seq
	p.done.Broadcast()
}

// fail puts the store into a failed state after a write or fsync error:
// the in-memory indexes may be ahead of the database, so every later call
// fails until the store is reopened (Open rebuilds them from the database).
func (s *Store) fail(err error) error {
	p := &s.pipe
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failed == nil {
		reason := "a write or fsync failed"
		if strings.Contains(err.Error(), "No space left on device") {
			reason = "the disk is full"
		}
		p.failed = fmt.Errorf("rocksstore: %w: %s (outcome of the calls in flight unknown); the store reopens from its database when Recover runs (the node retries by itself once there is disk space)",
			storage.ErrUnavailable, reason)
		s.log.Error("rocksstore write failed; every call fails until the store is recovered", "err", err)
	}
	return p.failed
}

// traceBatch marks a batch in a Go execution trace (runtime/trace; leaseq
// serve --pprof serves one at /debug/pprof/trace), with how many calls it
// holds, so that a trace shows each batch and each fsync
// ("rocksstore.fsync") next to what the calls waited for. With no trace
// running a region costs one check.
func traceBatch(calls int) *trace.Region {
	if trace.IsEnabled() {
		trace.Logf(context.Background(), TraceBatchRegion, "calls=%d", calls)
	}
	return trace.StartRegion(context.Background(), TraceBatchRegion)
}

// The names of the execution trace's regions (runtime/trace) around each
// batch a leader builds and writes, and around each WAL fsync; each batch
// region follows a log of the same category, "calls=N" (bench/tracestat
// reads both).
const (
	TraceBatchRegion = "rocksstore.batch"
	TraceFsyncRegion = "rocksstore.fsync"
)

func finish(ops []*op, err error) {
	for _, o := range ops {
		if err != nil && o.err == nil {
			o.err = err
			o.next = time.Time{}
		}
		if o.done != nil {
			o.done()
			continue
		}
		o.wake <- true
	}
}

// batch is the transaction a leader applies a group of ops to.
type batch struct {
	s    *Store
	slot *txnSlot
	// rewritten lists the single-deletable keys (dbkeys.SingleDeletable)
	// that the batch deleted and then wrote again: they may exist in the
	// database, so their write is preceded by a single delete.
	rewritten []string
	deltas    []queueDelta
	notes     []noteRef
	polls     int
	// seq numbers the store's batches from 1 (leaseState.wrote);
	// freshFrom is the first id sequence number the batch can reserve, so
	// an item with a lower one was enqueued before it; touched is set by
	// the first write of a key of such an item, or of a lease, through
	// the overlay's index (opTx.untouched).
	seq       uint64
	freshFrom uint64
	touched   bool
}

// touches reports whether writing k through the overlay's index ends the
// batch's untouched state: k is a lease key or a key of an item enqueued
// before the batch (every item key ends with the item's id).
func (b *batch) touches(k string) bool {
	switch k[0] {
	case dbkeys.NsLeases, dbkeys.NsLeaseExpiry:
		return true
	case dbkeys.NsAvailable, dbkeys.NsVisibility, dbkeys.NsInProgress, dbkeys.NsDelayed, dbkeys.NsPayload, dbkeys.NsDLQ:
		return b.oldKey(keyBytes(k))
	}
	return false
}

// oldKey reports whether item key k (it ends with the item's id) is of an
// item enqueued before the batch.
func (b *batch) oldKey(k []byte) bool {
	return len(k) < dbkeys.IDLen || dbkeys.IDSeq([16]byte(k[len(k)-dbkeys.IDLen:])) < b.freshFrom
}

// maxReusedBatchList is the longest list of a batch (rewritten keys,
// counter deltas, notes) whose room the next batch reuses.
const maxReusedBatchList = 1024

// release clears the batch's lists, so that they hold nothing alive, and
// keeps their room for the next batch unless it grew too large.
func (b *batch) release() {
	*b = batch{
		rewritten: reuseEmpty(b.rewritten, maxReusedBatchList),
		deltas:    reuseEmpty(b.deltas, maxReusedBatchList),
		notes:     reuseEmpty(b.notes, maxReusedBatchList),
	}
}

// reuseEmpty returns l cleared and empty, keeping its room unless that is room for
// more than max entries.
func reuseEmpty[T any](l []T, max int) []T {
	if cap(l) > max {
		return nil
	}
	clear(l)
	return l[:0]
}

type queueDelta struct {
	q *queueState
	d dbkeys.Counters
}

// noteRef is a dedup-expiry entry announced to the sweep cursor.
type noteRef struct {
	c   *cursor
	key string
}

// runBatch applies ops to one transaction and commits it (without fsync).
// An op whose apply fails leaves no trace; a commit failure fails them
// all. REQUIRES: the caller leads.
func (s *Store) runBatch(ops []*op) (wrote bool, err error) {
	slot := s.pipe.slot
	slot.ov.reset()
	slot.keys.reset()
	slot.vals.reset()
	slot.cs.reset()
	slot.began = false
	b := &slot.b
	b.s, b.slot = s, slot // its lists are empty (release)
	s.pipe.batches++
	b.seq, b.freshFrom = s.pipe.batches, s.ids.next
	defer func() {
		for _, n := range b.notes {
			n.c.done(n.key)
		}
		b.release()
	}()
	for _, o := range ops {
		ot := &slot.ot
		clear(ot.returned)
		*ot = opTx{b: b, op: o, entsAt: int32(len(slot.ov.ents)), undo: slot.undo[:0], undoFn: slot.undoFn[:0],
			deltas: ot.deltas[:0], notes: ot.notes[:0], returned: ot.returned[:0], rewrittenLen: len(b.rewritten)}
		if err := o.apply(ot); err != nil {
			ot.rollback()
			o.err = err
		} else {
			ot.finish()
		}
		slot.keepUndo(ot)
	}
	s.compactDeadlines() // between ops: no undo can bring a dropped entry back
	if slot.ov.live == 0 && len(b.deltas) == 0 {
		if slot.began {
			if err := slot.t.rollback(); err != nil {
				return false, translate("rollback", err)
			}
		}
		return false, nil
	}
	// Sorted, the memtable inserts a run along one skiplist path instead
	// of searching from the top for every key.
	keys := slot.ov.sorted(slot.sorted[:0])
	if invariants {
		checkUniqueKeys(keys)
		s.checkWriteOnce(b, keys)
		s.checkReadyWrites(keys)
	}
	w := &slot.wbuf
	w.reset()
	for i := 0; i < len(keys); i++ {
		e := keys[i]
		k, v := e.key, e.val
		kb := keyBytes(k)
		if v == nil {
			n := idRun(keys[i:])
			if n == 0 {
				n = b.headRun(keys[i:])
			}
			if n >= minRangeRun {
				w.delThrough(kb, keyBytes(keys[i+n-1].key))
				i += n - 1
				continue
			}
		}
		switch {
		case !dbkeys.SingleDeletable(kb):
			if v != nil {
				w.put(kb, v)
			} else {
				w.del(kb)
			}
		case v == nil:
			w.singleDel(kb)
		default:
			if len(b.rewritten) > 0 && slices.Contains(b.rewritten, k) {
				w.singleDel(kb)
			}
			w.put(kb, v)
		}
	}
	// A changed queue's counters are written whole: the ops applied their
	// deltas to the in-memory counters (opTx.finish), which only the
	// leader changes, and a failed commit fails the store, so they are
	// what the database holds once this batch is in. One put per batch
	// costs the commit what a merge operand did, and the flush keeps the
	// newest instead of summing an operand per batch.
	var cbuf [128]byte
	for _, d := range b.deltas {
		if !d.d.IsZero() {
			d.q.mu.Lock()
			c := d.q.counters
			d.q.mu.Unlock()
			w.put(d.q.countersKey, dbkeys.AppendCounters(cbuf[:0], c))
		}
	}
	// The writes go into the transaction's batch unlocked and unindexed
	// (rdb.go): batches are applied one at a time, and the records a batch
	// changes were read with GetForUpdate. A batch that read nothing
	// (enqueues without dedup keys, acks) has no transaction: its writes
	// go to the database as one write batch, which spares beginning and
	// committing a transaction.
	if slot.began {
		slot.t.write(w)
		err = slot.t.commit(b.seq)
	} else {
		err = s.db.writeMarked(w, false, b.seq)
		s.m.plainCommits.Add(1)
	}
	clear(keys)
	if cap(keys) <= maxReusedSorted {
		slot.sorted = keys[:0]
	}
	if cap(w.b) > maxReusedWriteBuf {
		w.b = nil
	}
	if err != nil {
		return false, translate("commit", err)
	}
	if invariants {
		qs := make([]*queueState, len(b.deltas))
		for i, d := range b.deltas {
			qs[i] = d.q
		}
		checkIndexes(qs)
	}
	s.m.commits.Add(1)
	s.m.ops.Add(uint64(len(ops)))
	if b.polls > 0 {
		s.m.claimPasses.Add(1)
	}
	for _, o := range ops {
		s.m.items.Add(uint64(o.items))
	}
	return true, nil
}
