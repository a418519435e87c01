package fdbmodel

import (
	"encoding/binary"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/leaseq/leaseq/fdbsync/kv"
)

// CodeClientInvalidOperation is FDB's client_invalid_operation (2000),
// returned for a malformed versionstamp offset.
const CodeClientInvalidOperation = 2000

type mutKind uint8

const (
	mutSet mutKind = iota + 1
	mutClear
	mutClearRange
	mutAdd
	mutVSKey
	mutVSValue
)

type mutation struct {
	kind mutKind
	key  string // begin for a clear range
	end  string
	val  []byte
}

// local is this transaction's knowledge of one key (read-your-writes).
type local struct {
	known bool   // val is the final value (nil: absent)
	val   []byte // when known
	adds  [][]byte
	// unreadable: written by a versionstamped value in this transaction.
	unreadable bool
}

// Tx is a model transaction. It implements kv.Tx.
type Tx struct {
	db *DB

	hasRV     bool
	rv        int64
	rvAt      time.Time
	muts      []mutation
	locals    map[string]*local
	clears    []krange
	readConf  []krange
	writeConf []krange
	size      int
	err       error // sticky error surfaced at commit
	watches   []*watch
	usesVS    bool
	vs        kv.Versionstamp
	committed bool
	cancelled bool
}

func (t *Tx) reset() {
	t.hasRV = false
	t.muts = nil
	t.locals = map[string]*local{}
	t.clears = nil
	t.readConf = nil
	t.writeConf = nil
	t.size = 0
	t.err = nil
	t.watches = nil
	t.usesVS = false
	t.committed = false
	t.cancelled = false
}

// readVersionLocked acquires the read version on first use and checks its
// age.
// REQUIRES: t.db.mu held.
func (t *Tx) readVersionLocked() (int64, error) {
	if t.cancelled {
		return 0, kv.Error{Code: kv.CodeTransactionCancelled}
	}
	if t.committed {
		return 0, kv.Error{Code: kv.CodeUsedDuringCommit}
	}
	if !t.hasRV {
		t.hasRV = true
		t.rv = t.db.readVersionLocked()
		t.rvAt = t.db.clk.Now()
		t.db.mu.active[t] = t.rv
		return t.rv, nil
	}
	if t.db.clk.Now().Sub(t.rvAt) > MaxReadVersionAge {
		t.db.mu.stats.TooOld++
		return 0, kv.Error{Code: kv.CodeTransactionTooOld}
	}
	return t.rv, nil
}

func (t *Tx) inCleared(k string) bool {
	for _, c := range t.clears {
		if k >= c.b && k < c.e {
			return true
		}
	}
	return false
}

// valueLocked is the transaction's view of k: committed value at rv plus
// local writes.
// REQUIRES: t.db.mu held.
func (t *Tx) valueLocked(k string, rv int64) ([]byte, bool, error) {
	l := t.locals[k]
	if l != nil && l.unreadable {
		return nil, false, kv.Error{Code: kv.CodeAccessedUnreadable}
	}
	if l != nil && l.known {
		return l.val, l.val != nil, nil
	}
	var base []byte
	var ok bool
	if !t.inCleared(k) {
		base, ok = t.db.readLocked(k, rv)
	}
	if l != nil && len(l.adds) > 0 {
		for _, a := range l.adds {
			base = addLE(base, a)
		}
		ok = true
	}
	return base, ok, nil
}

func checkKey(k []byte) error {
	if len(k) > kv.MaxKeySize {
		return kv.Error{Code: kv.CodeKeyTooLarge}
	}
	return nil
}

// Get implements kv.Tx.
func (t *Tx) Get(key []byte, snapshot bool) ([]byte, error) {
	vs, err := t.GetMany([][]byte{key}, snapshot)
	if err != nil {
		return nil, err
	}
	return vs[0], nil
}

// GetMany implements kv.Tx.
func (t *Tx) GetMany(keys [][]byte, snapshot bool) ([][]byte, error) {
	t.db.mu.Lock()
	defer t.db.mu.Unlock()
	rv, err := t.readVersionLocked()
	if err != nil {
		return nil, err
	}
	out := make([][]byte, len(keys))
	for i, key := range keys {
		if err := checkKey(key); err != nil {
			return nil, err
		}
		k := string(key)
		v, ok, err := t.valueLocked(k, rv)
		if err != nil {
			return nil, err
		}
		if ok {
			out[i] = append([]byte{}, v...)
		}
		if !snapshot {
			if l := t.locals[k]; l == nil || !l.known {
				t.addReadConflict(krange{k, k + "\x00"})
			}
		}
	}
	return out, nil
}

func (t *Tx) addReadConflict(r krange) {
	t.readConf = append(t.readConf, r)
	t.size += len(r.b) + len(r.e)
}

func (t *Tx) addWriteConflict(r krange) {
	t.writeConf = append(t.writeConf, r)
	t.size += len(r.b) + len(r.e)
}

// GetRange implements kv.Tx.
func (t *Tx) GetRange(begin, end []byte, o kv.RangeOptions) ([]kv.KeyValue, error) {
	t.db.mu.Lock()
	defer t.db.mu.Unlock()
	rv, err := t.readVersionLocked()
	if err != nil {
		return nil, err
	}
	if bytesCompare(begin, end) > 0 {
		return nil, kv.Error{Code: kv.CodeInvertedRange}
	}
	b, e := string(begin), string(end)
	// Local keys with a value in range, sorted.
	var lkeys []string
	for k, l := range t.locals {
		if k >= b && k < e && (l.known || len(l.adds) > 0 || l.unreadable) {
			lkeys = append(lkeys, k)
		}
	}
	sort.Strings(lkeys)

	var out []kv.KeyValue
	limit := o.Limit
	forwardLimit := limit
	if o.Reverse {
		forwardLimit = 0 // the model collects the whole range and reverses it
	}
	emit := func(k string) (bool, error) {
		v, ok, err := t.valueLocked(k, rv)
		if err != nil {
			return false, err
		}
		if ok {
			out = append(out, kv.KeyValue{Key: []byte(k), Value: append([]byte{}, v...)})
		}
		return forwardLimit > 0 && len(out) >= forwardLimit, nil
	}
	n := t.db.mu.data.seekGE(b)
	li := 0
	for {
		var next string
		fromLocal := false
		haveDB := false
		// Skip committed keys invisible at rv (tombstones, newer) or
		// cleared/overridden locally: locals are merged separately.
		for n != nil && n.key < e {
			if _, ok := t.locals[n.key]; ok {
				n = n.next[0]
				continue
			}
			if _, ok := n.at(rv); ok && !t.inCleared(n.key) {
				haveDB = true
				break
			}
			n = n.next[0]
		}
		if n == nil || n.key >= e {
			haveDB = false
		}
		switch {
		case haveDB && li < len(lkeys):
			if lkeys[li] < n.key {
				next, fromLocal = lkeys[li], true
			} else {
				next = n.key
			}
		case haveDB:
			next = n.key
		case li < len(lkeys):
			next, fromLocal = lkeys[li], true
		default:
			goto done
		}
		var stop bool
		if fromLocal {
			li++
			var err error
			if stop, err = emit(next); err != nil {
				return nil, err
			}
		} else {
			// A committed key with no local write: its value is the
			// node's version at rv (no second lookup).
			v, _ := n.at(rv)
			out = append(out, kv.KeyValue{Key: []byte(next), Value: append([]byte{}, v...)})
			stop = forwardLimit > 0 && len(out) >= forwardLimit
			n = n.next[0]
		}
		if stop {
			break
		}
	}
done:
	if o.Reverse {
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
		if limit > 0 && len(out) > limit {
			out = out[:limit]
		}
	}
	if !o.Snapshot {
		// Conflict only on the part of the range actually read, as FDB does
		// when a limit cuts the read short.
		r := krange{b, e}
		if limit > 0 && len(out) >= limit {
			last := string(out[len(out)-1].Key)
			if o.Reverse {
				r.b = last
			} else {
				r.e = last + "\x00"
			}
		}
		t.addReadConflict(r)
	}
	return out, nil
}

func bytesCompare(a, b []byte) int { return strings.Compare(string(a), string(b)) }

func (t *Tx) setErr(err error) {
	if t.err == nil {
		t.err = err
	}
}

func (t *Tx) usable() bool {
	if t.cancelled {
		t.setErr(kv.Error{Code: kv.CodeTransactionCancelled})
		return false
	}
	return true
}

// Set implements kv.Tx.
func (t *Tx) Set(key, value []byte) {
	if !t.usable() {
		return
	}
	if err := checkKey(key); err != nil {
		t.setErr(err)
		return
	}
	if len(value) > kv.MaxValueSize {
		t.setErr(kv.Error{Code: kv.CodeValueTooLarge})
		return
	}
	k := string(key)
	v := append([]byte{}, value...)
	t.muts = append(t.muts, mutation{kind: mutSet, key: k, val: v})
	t.locals[k] = &local{known: true, val: v}
	t.size += len(key) + len(value)
	t.addWriteConflict(krange{k, k + "\x00"})
}

// Clear implements kv.Tx.
func (t *Tx) Clear(key []byte) {
	if !t.usable() {
		return
	}
	if err := checkKey(key); err != nil {
		t.setErr(err)
		return
	}
	k := string(key)
	t.muts = append(t.muts, mutation{kind: mutClear, key: k})
	t.locals[k] = &local{known: true}
	t.size += len(key)
	t.addWriteConflict(krange{k, k + "\x00"})
}

// ClearRange implements kv.Tx.
func (t *Tx) ClearRange(begin, end []byte) {
	if !t.usable() {
		return
	}
	if bytesCompare(begin, end) > 0 {
		t.setErr(kv.Error{Code: kv.CodeInvertedRange})
		return
	}
	b, e := string(begin), string(end)
	t.muts = append(t.muts, mutation{kind: mutClearRange, key: b, end: e})
	for k := range t.locals {
		if k >= b && k < e {
			delete(t.locals, k)
		}
	}
	t.clears = append(t.clears, krange{b, e})
	t.size += len(begin) + len(end)
	t.addWriteConflict(krange{b, e})
}

// Add implements kv.Tx.
func (t *Tx) Add(key []byte, delta int64) {
	if !t.usable() {
		return
	}
	if err := checkKey(key); err != nil {
		t.setErr(err)
		return
	}
	k := string(key)
	p := int64LE(delta)
	t.muts = append(t.muts, mutation{kind: mutAdd, key: k, val: p})
	l := t.locals[k]
	switch {
	case l == nil && t.inCleared(k):
		t.locals[k] = &local{known: true, val: addLE(nil, p)}
	case l == nil:
		t.locals[k] = &local{adds: [][]byte{p}}
	case l.known:
		l.val = addLE(l.val, p)
	default:
		l.adds = append(l.adds, p)
	}
	t.size += len(key) + len(p)
	t.addWriteConflict(krange{k, k + "\x00"})
}

// splitOffset validates a versionstamp operand and returns the operand
// without its suffix and the offset.
func splitOffset(b []byte) ([]byte, int, error) {
	if len(b) < 4 {
		return nil, 0, kv.Error{Code: CodeClientInvalidOperation}
	}
	body := b[:len(b)-4]
	off := int(binary.LittleEndian.Uint32(b[len(b)-4:]))
	if off+kv.VersionstampSize > len(body) {
		return nil, 0, kv.Error{Code: CodeClientInvalidOperation}
	}
	return append([]byte{}, body...), off, nil
}

// SetVersionstampedKey implements kv.Tx.
func (t *Tx) SetVersionstampedKey(keyWithOffset, value []byte) {
	if !t.usable() {
		return
	}
	body, _, err := splitOffset(keyWithOffset)
	if err != nil {
		t.setErr(err)
		return
	}
	if err := checkKey(body); err != nil {
		t.setErr(err)
		return
	}
	if len(value) > kv.MaxValueSize {
		t.setErr(kv.Error{Code: kv.CodeValueTooLarge})
		return
	}
	t.usesVS = true
	t.muts = append(t.muts, mutation{kind: mutVSKey, key: string(keyWithOffset), val: append([]byte{}, value...)})
	t.size += 2*len(body) + len(value) // the key and its write conflict range
}

// SetVersionstampedValue implements kv.Tx.
func (t *Tx) SetVersionstampedValue(key, valueWithOffset []byte) {
	if !t.usable() {
		return
	}
	if err := checkKey(key); err != nil {
		t.setErr(err)
		return
	}
	body, _, err := splitOffset(valueWithOffset)
	if err != nil {
		t.setErr(err)
		return
	}
	if len(body) > kv.MaxValueSize {
		t.setErr(kv.Error{Code: kv.CodeValueTooLarge})
		return
	}
	k := string(key)
	t.usesVS = true
	t.muts = append(t.muts, mutation{kind: mutVSValue, key: k, val: append([]byte{}, valueWithOffset...)})
	t.locals[k] = &local{unreadable: true}
	t.size += len(key) + len(body)
	t.addWriteConflict(krange{k, k + "\x00"})
}

// Watch implements kv.Tx.
func (t *Tx) Watch(key []byte) (kv.Watch, error) {
	t.db.mu.Lock()
	defer t.db.mu.Unlock()
	rv, err := t.readVersionLocked()
	if err != nil {
		return nil, err
	}
	if err := checkKey(key); err != nil {
		return nil, err
	}
	k := string(key)
	v, ok, err := t.valueLocked(k, rv)
	if err != nil {
		return nil, err
	}
	w := &watch{key: k, baseline: append([]byte{}, v...), present: ok, done: make(chan struct{}), db: t.db}
	if !ok {
		w.baseline = nil
	}
	t.watches = append(t.watches, w)
	return w, nil
}

// ReadVersion implements kv.Tx.
func (t *Tx) ReadVersion() (int64, error) {
	t.db.mu.Lock()
	defer t.db.mu.Unlock()
	return t.readVersionLocked()
}

// AddReadConflictRange implements kv.Tx.
func (t *Tx) AddReadConflictRange(begin, end []byte) error {
	if bytesCompare(begin, end) > 0 {
		return kv.Error{Code: kv.CodeInvertedRange}
	}
	t.addReadConflict(krange{string(begin), string(end)})
	return nil
}

// AddWriteConflictRange implements kv.Tx.
func (t *Tx) AddWriteConflictRange(begin, end []byte) error {
	if bytesCompare(begin, end) > 0 {
		return kv.Error{Code: kv.CodeInvertedRange}
	}
	t.addWriteConflict(krange{string(begin), string(end)})
	return nil
}

// Size returns the transaction's size so far as the model counts it.
func (t *Tx) Size() int { return t.size }

// Commit implements kv.Tx.
func (t *Tx) Commit() error {
	db := t.db
	db.mu.Lock()
	defer db.mu.Unlock()
	err := t.commitLocked()
	if err != nil {
		// Like FDB, a failed transaction keeps failing until OnError or
		// a reset.
		t.setErr(err)
	}
	t.finishLocked(err)
	return err
}

// finishLocked settles watches and releases the read version.
// REQUIRES: db.mu held.
func (t *Tx) finishLocked(err error) {
	delete(t.db.mu.active, t)
	for _, w := range t.watches {
		if err != nil {
			w.fire(err)
		} else {
			t.db.registerWatchLocked(w)
		}
	}
	t.watches = nil
	t.db.gcLocked()
}

// REQUIRES: db.mu held.
func (t *Tx) commitLocked() error {
	db := t.db
	if t.cancelled {
		return kv.Error{Code: kv.CodeTransactionCancelled}
	}
	if t.committed {
		return kv.Error{Code: kv.CodeUsedDuringCommit}
	}
	if t.err != nil {
		return t.err
	}
	if len(t.muts) == 0 && len(t.writeConf) == 0 {
		db.mu.stats.ReadOnly++
		t.committed = true
		return nil
	}
	if t.hasRV && db.clk.Now().Sub(t.rvAt) > MaxReadVersionAge {
		db.mu.stats.TooOld++
		return kv.Error{Code: kv.CodeTransactionTooOld}
	}
	if !t.hasRV {
		t.rv = db.readVersionLocked()
	}
	db.mu.stats.Transactions++
	if t.size > db.mu.stats.MaxTxnSize {
		db.mu.stats.MaxTxnSize = t.size
	}

	if t.size > 1<<20 {
		db.mu.stats.TxnsOver1MB++
	}
	if t.size > kv.MaxTransactionSize {
		db.mu.stats.TooLarge++
		return kv.Error{Code: kv.CodeTransactionTooLarge}
	}
	f := db.faults
	if f.NotCommitted > 0 && db.mu.rng.Float64() < f.NotCommitted {
		db.mu.stats.InjNotCommitted++
		return kv.Error{Code: kv.CodeNotCommitted}
	}
	if f.TooOld > 0 && db.mu.rng.Float64() < f.TooOld {
		db.mu.stats.InjTooOld++
		return kv.Error{Code: kv.CodeTransactionTooOld}
	}
	if len(t.readConf) > 0 {
		reads := mergeRanges(append([]krange(nil), t.readConf...))
		for _, c := range db.mu.commits {
			if c.v <= t.rv {
				continue
			}
			for _, r := range reads {
				if intersects(c.writes, r) {
					db.mu.stats.Conflicts++
					return kv.Error{Code: kv.CodeNotCommitted}
				}
			}
		}
	}
	unknown := f.UnknownResult > 0 && db.mu.rng.Float64() < f.UnknownResult
	if unknown {
		db.mu.stats.InjUnknown++
		if !(f.UnknownApplied > 0 && db.mu.rng.Float64() < f.UnknownApplied) {
			return kv.Error{Code: kv.CodeCommitUnknownResult}
		}
		db.mu.stats.InjUnknownApplied++
	}
	t.applyLocked()
	if unknown {
		return kv.Error{Code: kv.CodeCommitUnknownResult}
	}
	t.committed = true
	return nil
}

// applyLocked writes the mutations at a new commit version.
// REQUIRES: db.mu held.
func (t *Tx) applyLocked() {
	db := t.db
	// At least one more than the last, and at least the clock's count:
	// versions advance about a million a second, as FDB's do.
	db.mu.version = max(db.mu.version+1, db.mu.maxRV+1, db.clockVersionLocked())
	v := db.mu.version
	db.mu.stats.Committed++
	binary.BigEndian.PutUint64(t.vs[:8], uint64(v))
	t.vs[8], t.vs[9] = 0, 0
	writes := append([]krange(nil), t.writeConf...)
	for _, m := range t.muts {
		switch m.kind {
		case mutSet:
			db.writeLocked(m.key, v, m.val, false)
		case mutClear:
			db.writeLocked(m.key, v, nil, true)
		case mutClearRange:
			var keys []string
			for n := db.mu.data.seekGE(m.key); n != nil && n.key < m.end; n = n.next[0] {
				keys = append(keys, n.key)
			}
			for _, k := range keys {
				db.writeLocked(k, v, nil, true)
			}
			// Watches on absent keys in the range see no change.
		case mutAdd:
			cur, _ := db.readLocked(m.key, v)
			db.writeLocked(m.key, v, addLE(cur, m.val), false)
		case mutVSKey:
			body, off, _ := splitOffset([]byte(m.key))
			copy(body[off:], t.vs[:])
			k := string(body)
			db.writeLocked(k, v, m.val, false)
			writes = append(writes, krange{k, k + "\x00"})
		case mutVSValue:
			body, off, _ := splitOffset(m.val)
			copy(body[off:], t.vs[:])
			db.writeLocked(m.key, v, body, false)
		}
	}
	db.mu.commits = append(db.mu.commits, commitRec{v: v, writes: mergeRanges(writes)})
}

// Versionstamp implements kv.Tx.
func (t *Tx) Versionstamp() (kv.Versionstamp, error) {
	if !t.committed || !t.usesVS {
		return kv.Versionstamp{}, fmt.Errorf("fdbmodel: no versionstamp: %w", kv.Error{Code: CodeClientInvalidOperation})
	}
	return t.vs, nil
}

// OnError implements kv.Tx: retryable errors reset the transaction.
func (t *Tx) OnError(err error) error {
	if !kv.IsRetryable(err) {
		return err
	}
	t.db.mu.Lock()
	delete(t.db.mu.active, t)
	for _, w := range t.watches {
		w.fire(kv.Error{Code: kv.CodeTransactionCancelled})
	}
	t.db.gcLocked()
	t.db.mu.Unlock()
	t.reset()
	return nil
}

// Cancel implements kv.Tx.
func (t *Tx) Cancel() {
	t.db.mu.Lock()
	defer t.db.mu.Unlock()
	if t.committed {
		return
	}
	t.cancelled = true
	delete(t.db.mu.active, t)
	for _, w := range t.watches {
		w.fire(kv.Error{Code: kv.CodeTransactionCancelled})
	}
	t.watches = nil
	t.db.gcLocked()
}
