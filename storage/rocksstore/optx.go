package rocksstore

import (
	"bytes"
	"slices"
	"time"
	"unsafe"

	"github.com/leaseq/leaseq/dbkeys"
	"github.com/leaseq/leaseq/storage"
)

// An op's side of the batch (commit.go builds and commits batches): the
// writes it buffers in the batch's overlay, the reads that see them, and
// the undo of both when the op fails.

// opTx is one op's view of the batch: reads see the batch's overlay, and
// every change (overlay writes, in-memory index changes) can be undone if
// the op fails, so a failing op leaves the rest of the batch intact.
type opTx struct {
	b            *batch
	op           *op
	rewrittenLen int // len(b.rewritten) when the op began
	// entsAt is how many entries the overlay had when the op began: the
	// entries from there on are the op's own, and a rollback ends them
	// all, so only changes to older entries need an undo record (undo).
	entsAt int32
	// settleNew is set by an ack or nack whose lease's keys, and its
	// items' in_progress keys, are not in the overlay (settleOp).
	settleNew bool
	// keepClaimed, when set, collects what claims take (claimAhead).
	keepClaimed *[]claimedItem
	// claimingAhead is set while claimAhead claims: grant marks the
	// lease record (dbkeys.LeaseRecord.Ahead).
	claimingAhead bool
	// ahead is the batch the op claimed ahead (claimAhead): finish puts
	// it in its queue's list together with the claim's counters.
	ahead *prefetched
	// returned are the batches claimed ahead the op gives back or ends
	// (leaveAheadLocked): finish takes them out of their queues' returning
	// lists together with the counters.
	returned []*prefetched
	undo     []undoWrite
	undoFn   []undoStep
	deltas   []queueDelta
	notes    []noteRef
}

// undoWrite puts overlay entry i, older than the op, back to what it was
// (had: a write of old).
type undoWrite struct {
	i   int32
	old []byte
	had bool
}

// put buffers a write. key and value are the batch's from here on: the
// caller must not change them.
func (o *opTx) put(key, value []byte) { o.set(keyString(key), putValue(value)) }

// putNew buffers the write of a key the batch has not written: one of an
// item whose id this op reserved. It skips the overlay's index (add).
func (o *opTx) putNew(key, value []byte) {
	o.b.slot.ov.add(keyString(key), putValue(value))
}

// delNew buffers the delete of a key the batch has not written (see
// untouched), skipping the overlay's index as putNew does.
func (o *opTx) delNew(key []byte) {
	o.b.slot.ov.add(keyString(key), nil)
}

// putAs is putNew when fresh (the batch has no entry for key), else put.
func (o *opTx) putAs(fresh bool, key, value []byte) {
	if fresh {
		o.putNew(key, value)
		return
	}
	o.put(key, value)
}

// delAs is delNew when fresh (the batch has no entry for key), else del.
func (o *opTx) delAs(fresh bool, key []byte) {
	if fresh {
		o.delNew(key)
		return
	}
	o.del(key)
}

// untouched reports whether no op of the batch so far wrote, through the
// overlay's index (set), a key of an item enqueued before the batch or a
// lease key. Until one does, the only such keys in the overlay are the
// ones claims and acks wrote with putNew and delNew, and each of those
// moves its item one step (available to inflight, inflight to gone) that
// no later claim or ack of the batch can repeat without a set in between:
// an item taken by a claim is available again only through a nack, an
// expiry or a redrive (all set), and a lease made by the batch cannot be
// acked in it (its token reaches the caller only after the commit; acks
// still check leaseState.wrote). So while untouched, a claim of an item
// the batch did not enqueue and an ack under a lease the batch did not
// write find none of their keys in the overlay, and write them without
// the index: a batch of enqueues, polls and acks then builds no map at all.
func (o *opTx) untouched() bool { return !o.b.touched }

// oldItem reports whether id was enqueued before the batch.
func (o *opTx) oldItem(id [16]byte) bool { return dbkeys.IDSeq(id) < o.b.freshFrom }

// putValue is value as the overlay holds a put: never nil, which means a
// delete there.
func putValue(value []byte) []byte {
	if value == nil {
		return []byte{}
	}
	return value
}

// del buffers a delete; key is the batch's from here on.
func (o *opTx) del(key []byte) { o.set(keyString(key), nil) }

// availableKey, inProgressKey and visibilityKey build keys in the batch's
// key arena (keyArena): valid until the next batch starts.
func (o *opTx) availableKey(q string, id [16]byte) []byte {
	return dbkeys.AppendAvailableKey(o.b.slot.keys.take(dbkeys.QueueIDKeyLen(q)), q, id)
}

func (o *opTx) inProgressKey(q string, id [16]byte) []byte {
	return dbkeys.AppendInProgressKey(o.b.slot.keys.take(dbkeys.QueueIDKeyLen(q)), q, id)
}

func (o *opTx) visibilityKey(q string, prio uint8, visibleAt int64, id [16]byte) []byte {
	return dbkeys.AppendVisibilityKey(o.b.slot.keys.take(dbkeys.VisibilityKeyLen(q)), q, prio, visibleAt, id)
}

// itemValue encodes rec in the batch's value arena (see keyArena).
func (o *opTx) itemValue(rec dbkeys.ItemRecord) []byte {
	return dbkeys.AppendItem(o.b.slot.vals.take(dbkeys.ItemLen(rec)), rec)
}

// overlay looks key up in the batch's overlay. A value found is a copy:
// the overlay's own may live in the batch's arena.
func (o *opTx) overlay(key []byte) (v []byte, found bool) {
	v, found = o.b.slot.ov.lookup(key)
	if v != nil {
		v = bytes.Clone(v)
	}
	return v, found
}

// keyString views a fresh key (from dbkeys, never changed afterwards) as
// a string without copying it: the overlay holds several keys per item.
func keyString(k []byte) string { return unsafe.String(unsafe.SliceData(k), len(k)) }

// keyBytes is the inverse of keyString, for handing an overlay key to
// RocksDB, which copies it.
func keyBytes(k string) []byte { return unsafe.Slice(unsafe.StringData(k), len(k)) }

func (o *opTx) set(k string, v []byte) {
	if !o.b.touched && o.b.touches(k) {
		o.b.touched = true
	}
	ov := &o.b.slot.ov
	i := ov.entry(k)
	old, had := ov.ents[i].val, ov.ents[i].live
	if i < o.entsAt {
		o.undo = append(o.undo, undoWrite{i: i, old: old, had: had})
	}
	if v == nil && had && old != nil && dbkeys.SingleDeletable(keyBytes(k)) && !slices.Contains(o.b.rewritten, k) {
		// Written by this batch for the first time since its last delete
		// (such a key is written once between deletes), and deleted
		// again: neither write reaches RocksDB. An item claimed in the
		// batch that enqueued it costs no available record and no
		// visibility entry.
		ov.setEnt(i, nil, false)
		return
	}
	ov.setEnt(i, v, true)
	if had && old == nil && v != nil && dbkeys.SingleDeletable(keyBytes(k)) {
		o.b.rewritten = append(o.b.rewritten, k)
	}
}

// undoStep reverts one in-memory change of a failed op: fn, or for the
// changes every item or call makes (no closure to allocate) a ready entry
// added (q set), an inflight id released (l set), a ready-record cache
// entry changed (cache set: old and had are what it was) or ids reserved
// (ids set: idNext and idLimit are the id block as it was).
type undoStep struct {
	fn      func()
	ids     bool
	idNext  uint64
	idLimit uint64
	q       *queueState
	l       *leaseState
	cache   *queueState
	old     []byte
	had     bool
	id      storage.ItemID
	vis     int64
	prio    uint8
	delayed bool
}

func (u *undoStep) run(s *Store) {
	switch {
	case u.fn != nil:
		u.fn()
	case u.ids:
		s.ids.next, s.ids.limit = u.idNext, u.idLimit
	case u.q != nil:
		u.q.mu.Lock()
		u.q.ready.remove(u.prio, readyEntry{vis: u.vis, id: u.id})
		u.q.mu.Unlock()
		if u.delayed {
			delete(u.q.delayed, u.id)
		}
	case u.l != nil:
		s.inflight[u.id] = u.l
		u.l.released--
	case u.cache != nil:
		s.undoCache(u.cache, u.id, u.old, u.had)
	}
}

// onUndo registers fn to revert an in-memory change if the op fails.
func (o *opTx) onUndo(fn func()) { o.undoFn = append(o.undoFn, undoStep{fn: fn}) }

// undoReady registers the removal of a ready entry (and delayed mark)
// that the op added.
func (o *opTx) undoReady(q *queueState, prio uint8, vis int64, id storage.ItemID, delayed bool) {
	o.undoFn = append(o.undoFn, undoStep{q: q, prio: prio, vis: vis, id: id, delayed: delayed})
}

// undoRelease registers giving id back to lease l.
func (o *opTx) undoRelease(l *leaseState, id storage.ItemID) {
	o.undoFn = append(o.undoFn, undoStep{l: l, id: id})
}

// getForUpdate reads key, locking it in the batch's transaction; the
// overlay answers first. The value is a copy. An item key of available or
// in_progress may be read only while the store's memory holds the item
// there (rdbTxn.getManyForUpdate skips range tombstones).
func (o *opTx) getForUpdate(key []byte) ([]byte, bool, error) {
	if v, ok := o.overlay(key); ok {
		return v, v != nil, nil
	}
	vals, err := o.b.txn().getManyForUpdate([][]byte{key})
	if err != nil {
		return nil, false, translate("get for update", err)
	}
	return vals[0], vals[0] != nil, nil
}

// getManyForUpdate is getForUpdate for several keys: vals[i] is key i's
// value, nil if it is missing. The values read from the database share
// one buffer. known, if not nil, holds values the caller knows the
// database has (the ready-record cache): such a key is locked without
// being read, and known[i] is its value. With old set, keys of items
// enqueued before the batch are not looked up in the overlay: the caller
// knows they are not there (opTx.untouched). reads counts the keys read.
func (o *opTx) getManyForUpdate(keys, known [][]byte, old bool) (vals [][]byte, reads int, err error) {
	cs := &o.b.slot.cs
	vals = scratch(&cs.vals, len(keys))
	miss, lock, at := cs.miss[:0], cs.hit[:0], cs.at[:0]
	defer func() {
		clear(miss)
		clear(lock)
		cs.miss, cs.hit, cs.at = miss[:0], lock[:0], at[:0]
	}()
	for i, k := range keys {
		if !old || !o.b.oldKey(k) {
			if v, ok := o.overlay(k); ok {
				vals[i] = v
				continue
			}
		}
		if known != nil && known[i] != nil {
			if invariants {
				o.b.s.checkReadyCache(k, known[i])
			}
			vals[i] = known[i]
			lock = append(lock, k)
			continue
		}
		miss = append(miss, k)
		at = append(at, i)
	}
	if len(lock) == 0 && len(miss) == 0 {
		return vals, 0, nil // all in the batch: nothing to lock
	}
	t := o.b.txn()
	if err := t.lockMany(lock); err != nil {
		return nil, 0, translate("get for update", err)
	}
	got, err := t.getManyForUpdate(miss)
	if err != nil {
		return nil, 0, translate("get for update", err)
	}
	for j, v := range got {
		vals[at[j]] = v
	}
	return vals, len(miss), nil
}

// get reads key without locking it; the overlay answers first.
func (o *opTx) get(key []byte) ([]byte, bool, error) {
	if v, ok := o.overlay(key); ok {
		return v, v != nil, nil
	}
	v, ok, err := o.b.txn().get(key)
	return v, ok, translate("get", err)
}

func (o *opTx) exists(key []byte) (bool, error) {
	_, ok, err := o.get(key)
	return ok, err
}

// delta returns the op's pending counter delta of q.
func (o *opTx) delta(q *queueState) *dbkeys.Counters {
	for i := range o.deltas {
		if o.deltas[i].q == q {
			return &o.deltas[i].d
		}
	}
	o.deltas = append(o.deltas, queueDelta{q: q})
	return &o.deltas[len(o.deltas)-1].d
}

func (o *opTx) deadline(t int64) {
	d := instant(t)
	if o.op.next.IsZero() || d.Before(o.op.next) {
		o.op.next = d
	}
}

// note announces a dedup-expiry entry the batch will write to the sweep
// cursor, so a concurrent sweep does not move its bound past it.
func (o *opTx) note(c *cursor, k []byte) {
	c.note(k)
	o.notes = append(o.notes, noteRef{c: c, key: string(k)})
}

func (o *opTx) rollback() {
	ov := &o.b.slot.ov
	for i := len(o.undo) - 1; i >= 0; i-- {
		u := o.undo[i]
		ov.setEnt(u.i, u.old, u.had)
	}
	for i := o.entsAt; i < int32(len(ov.ents)); i++ {
		ov.setEnt(i, nil, false) // the op's own entries
	}
	clear(o.b.rewritten[o.rewrittenLen:])
	o.b.rewritten = o.b.rewritten[:o.rewrittenLen]
	for i := len(o.undoFn) - 1; i >= 0; i-- {
		o.undoFn[i].run(o.b.s)
	}
	for _, n := range o.notes {
		n.c.done(n.key)
	}
	o.op.next = time.Time{}
}

// finish publishes a successful op: its counter deltas go into the batch
// and into the queues' in-memory counters.
func (o *opTx) finish() {
	b := o.b
	held := false
	for _, d := range o.deltas {
		if d.d.IsZero() {
			continue
		}
		d.q.mu.Lock()
		d.q.counters = d.q.counters.Add(d.d)
		d.q.landReturnedLocked(o.returned)
		if e := o.ahead; e != nil && e.l.q == d.q {
			// In the same step as its counters: Stats, which counts a
			// held batch's items as available, never sees one without
			// the other.
			d.q.holdAheadLocked(e)
			d.q.claimingAhead--
			held = true
		}
		d.q.mu.Unlock()
		found := false
		for i := range b.deltas {
			if b.deltas[i].q == d.q {
				b.deltas[i].d = b.deltas[i].d.Add(d.d)
				found = true
				break
			}
		}
		if !found {
			b.deltas = append(b.deltas, d)
		}
	}
	if e := o.ahead; e != nil && !held {
		q := e.l.q
		q.mu.Lock()
		q.holdAheadLocked(e)
		q.claimingAhead--
		q.mu.Unlock()
	}
	for _, e := range o.returned { // those whose queue's counters did not change
		q := e.l.q
		q.mu.Lock()
		q.landReturnedLocked(o.returned)
		q.mu.Unlock()
	}
	b.notes = append(b.notes, o.notes...)
}
