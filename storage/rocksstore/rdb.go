package rocksstore

/*
#cgo CXXFLAGS: -std=c++17 -fno-rtti -O2
#include <stdlib.h>
#include "rdb.h"
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"slices"
	"time"
	"unsafe"
)

// rdb is the store's RocksDB binding: rdb.cc, a small C++ file of our own
// over RocksDB's public C++ API, and these Go wrappers. The store's hot
// path needs what RocksDB's C API does not offer: a transaction whose
// batch takes writes that are neither indexed (nothing reads them back
// through the transaction: the batch overlay answers first) nor locked
// (batches are applied one at a time, and every record a batch changes was
// read with GetForUpdate). RocksDB's transaction.h advises against writing
// to a transaction's batch directly, since such writes bypass its locks and
// its index; bypassing both is the point here, and the single committer
// is what makes it safe. Without the index RocksDB spends about a quarter
// less on leaseq's key pattern (bench/scripts/rocksdb_floor.cc, modes D
// and E; docs/BENCHMARKS.md, "A C++ binding of our own"). The same
// binding opens plain and read-only databases (migrate.go, CheckDir), so
// the package has one way into RocksDB.

// rdbMode is how a database is opened.
type rdbMode int

const (
	txnDB    rdbMode = C.LQ_TXN_DB    // the store: transactions
	plainDB  rdbMode = C.LQ_PLAIN_DB  // migrate.go
	readOnly rdbMode = C.LQ_READ_ONLY // CheckDir: the WAL is replayed into memory only
)

// rdbOptions are the options of lq_open (rdb.h).
type rdbOptions struct {
	mode          rdbMode
	cacheBytes    int64
	memtable      int64
	stats         bool
	delCompact    bool
	pointInTime   bool
	lockTimeoutMs int64
	logDir        string // "": the database directory
	zeroedWAL     int64  // txnDB: new WALs are made over zeros of this size (zerowal.h); 0: empty
}

type rdb struct{ p *C.lq_db }

// cErr turns a message from rdb.cc into an error (and frees it).
func cErr(msg *C.char) error {
	err := errors.New(C.GoString(msg))
	C.lq_free(unsafe.Pointer(msg))
	return err
}

// cMsg is the error of a call that returns its message (NULL: success),
// as lq_write and lq_flush_wal do (rdb.cc's errOf).
func cMsg(msg *C.char) error {
	if msg == nil {
		return nil
	}
	return cErr(msg)
}

// cStatus is a call's error from its return code (0: success) and the
// message it left in *msg. (msg is a pointer so that it is read after the
// call: Go does not order a plain variable operand against a call in the
// same argument list.)
func cStatus(rc C.int, msg **C.char) error {
	if rc != 0 {
		return cErr(*msg)
	}
	return nil
}

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// ptr is a C view of b's bytes (nil for an empty b).
func ptr(b []byte) *C.char {
	if len(b) == 0 {
		return nil
	}
	return (*C.char)(unsafe.Pointer(&b[0]))
}

// openRDB opens the database in dir with the column families names.
func openRDB(dir string, o rdbOptions, names []string) (*rdb, error) {
	cdir := C.CString(dir)
	defer C.free(unsafe.Pointer(cdir))
	co := C.lq_options{
		mode:         C.int(o.mode),
		cache_bytes:  C.int64_t(o.cacheBytes),
		memtable:     C.int64_t(o.memtable),
		stats:        cbool(o.stats),
		del_compact:  cbool(o.delCompact),
		lock_timeout: C.int64_t(o.lockTimeoutMs),
		zeroed_wal:   C.int64_t(o.zeroedWAL),
	}
	co.point_in_time = cbool(o.pointInTime)
	if o.logDir != "" {
		co.log_dir = C.CString(o.logDir)
		defer C.free(unsafe.Pointer(co.log_dir))
	}
	cnames := C.malloc(C.size_t(len(names)) * C.size_t(unsafe.Sizeof((*C.char)(nil))))
	defer C.free(cnames)
	list := unsafe.Slice((**C.char)(cnames), len(names))
	for i, n := range names {
		list[i] = C.CString(n)
		defer C.free(unsafe.Pointer(list[i]))
	}
	var msg *C.char
	p := C.lq_open(cdir, &co, (**C.char)(cnames), C.int(len(names)), &msg)
	if p == nil {
		return nil, cErr(msg)
	}
	return &rdb{p: p}, nil
}

// walFiles reports how many WALs this open created over a zero-filled
// spare and how many empty.
func (d *rdb) walFiles() (zeroed, plain int64) {
	var z, p C.int64_t
	C.lq_wal_files(d.p, &z, &p)
	return int64(z), int64(p)
}

// walSynced reports the last WAL made durable as the next was created:
// its number and its size then (0 and -1: none yet).
func (d *rdb) walSynced() (log uint64, size int64) {
	var l C.uint64_t
	var n C.int64_t
	C.lq_wal_synced(d.p, &l, &n)
	return uint64(l), int64(n)
}

// listFamilies returns the column families of the database in dir.
func listFamilies(dir string) ([]string, error) {
	cdir := C.CString(dir)
	defer C.free(unsafe.Pointer(cdir))
	var n C.size_t
	var msg *C.char
	b := C.lq_list_families(cdir, &n, &msg)
	if b == nil {
		return nil, cErr(msg)
	}
	defer C.lq_free(unsafe.Pointer(b))
	var names []string
	all := C.GoBytes(unsafe.Pointer(b), C.int(n))
	for len(all) > 0 {
		i := 0
		for all[i] != 0 {
			i++
		}
		names = append(names, string(all[:i]))
		all = all[i+1:]
	}
	return names, nil
}

func (d *rdb) close() { C.lq_close(d.p) }

// route sends keys of namespace ns to family fam (-1: nowhere).
func (d *rdb) route(ns byte, fam int) { C.lq_route(d.p, C.int(ns), C.int(fam)) }

// rdbSnap is a snapshot of an rdb.
type rdbSnap struct{ p *C.lq_snap }

func (d *rdb) snapshot() *rdbSnap { return &rdbSnap{p: C.lq_snapshot(d.p)} }

func (d *rdb) release(s *rdbSnap) { C.lq_release_snapshot(d.p, s.p) }

func (s *rdbSnap) c() *C.lq_snap {
	if s == nil {
		return nil
	}
	return s.p
}

// getGuess is the buffer a point read tries first: an item record of a
// small payload fits.
const getGuess = 512

// readValue runs a read that copies its value into a buffer (lq_get,
// lq_txn_get), again with a buffer of the size it needs when the first
// was too small. The value is a fresh slice.
func readValue(read func(out *C.char, cap C.size_t, msg **C.char) C.int64_t) ([]byte, bool, error) {
	buf := make([]byte, getGuess)
	for {
		var msg *C.char
		n := read((*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)), &msg)
		switch {
		case n == -2:
			return nil, false, nil
		case n < 0:
			return nil, false, cErr(msg)
		case int(n) <= len(buf):
			return buf[:n:n], true, nil
		}
		buf = make([]byte, int(n))
	}
}

// get reads key at snap (nil: the latest state) from its namespace's
// family; the value is a copy.
func (d *rdb) get(snap *rdbSnap, key []byte) ([]byte, bool, error) { return d.getIn(snap, -1, key) }

// getIn is get from family fam (-1: key's namespace's).
func (d *rdb) getIn(snap *rdbSnap, fam int, key []byte) ([]byte, bool, error) {
	return readValue(func(out *C.char, cap C.size_t, msg **C.char) C.int64_t {
		return C.lq_get(d.p, snap.c(), C.int(fam), ptr(key), C.size_t(len(key)), out, cap, msg)
	})
}

// write writes w's writes as one batch outside any transaction (sync:
// fsync the WAL first). In the store's TransactionDB the batch goes to the
// base DB: only for keys no transaction holds. The store writes its
// metadata this way outside the pipeline, and the pipeline a batch that
// began no transaction (runBatch): batches are applied one at a time, and
// the pipeline's is the only transaction.
func (d *rdb) write(w *writeBuf, sync bool) error { return d.writeMarked(w, sync, 0) }

// writeMarked is write with the commit marked for waitLogged (mark: the
// batch's number, 0 for none).
func (d *rdb) writeMarked(w *writeBuf, sync bool, mark uint64) error {
	if len(w.b) == 0 {
		return nil
	}
	return cMsg(C.lq_write(d.p, ptr(w.b), C.size_t(len(w.b)), cbool(sync), C.uint64_t(mark)))
}

// canWaitLogged reports whether waitLogged works on this database: it
// does with zeroed WALs, whose logs tell when a marked commit's record is
// in the file (zerowal.h, WALProgress).
func (d *rdb) canWaitLogged() bool { return C.lq_can_wait_logged(d.p) != 0 }

// waitLogged blocks until the commit marked mark has its record in the WAL
// file (true: an fsync begun from now on makes it durable) or ended without
// one (false). Every mark ends: its commit returns, or markDone.
func (d *rdb) waitLogged(mark uint64) bool { return C.lq_wait_logged(d.p, C.uint64_t(mark)) != 0 }

// markDone ends mark for a batch that did not commit.
func (d *rdb) markDone(mark uint64) { C.lq_mark_done(d.p, C.uint64_t(mark)) }

// marksLogged counts the times a marked commit was told logged (tests).
func (d *rdb) marksLogged() uint64 { return uint64(C.lq_marks_logged(d.p)) }

// put writes one key outside any transaction (see write).
func (d *rdb) put(key, value []byte, sync bool) error {
	var w writeBuf
	w.put(key, value)
	return d.write(&w, sync)
}

func (d *rdb) flushWAL(sync bool) error {
	return cMsg(C.lq_flush_wal(d.p, cbool(sync)))
}

// flush flushes every family's memtables and waits for them.
func (d *rdb) flush() error {
	var msg *C.char
	return cStatus(C.lq_flush(d.p, &msg), &msg)
}

// compact compacts all of family fam.
func (d *rdb) compact(fam int) error {
	var msg *C.char
	return cStatus(C.lq_compact_family(d.p, C.int(fam), &msg), &msg)
}

// statistics returns RocksDB's statistics dump ("" without statistics).
func (d *rdb) statistics() string {
	s := C.lq_statistics(d.p)
	if s == nil {
		return ""
	}
	defer C.lq_free(unsafe.Pointer(s))
	return C.GoString(s)
}

// property returns a RocksDB property of family fam.
func (d *rdb) property(fam int, name string) (string, bool) {
	cn := C.CString(name)
	defer C.free(unsafe.Pointer(cn))
	s := C.lq_property(d.p, C.int(fam), cn)
	if s == nil {
		return "", false
	}
	defer C.lq_free(unsafe.Pointer(s))
	return C.GoString(s), true
}

// writeStall is how long writes have waited on RocksDB's write stalls
// (slowed down or stopped while flushes and compactions catch up) since
// open.
func (d *rdb) writeStall() time.Duration {
	return time.Duration(C.lq_write_stall_micros(d.p)) * time.Microsecond
}

// pauseBackground pauses (true) or resumes flushes and compactions; tests
// use it to make writes stall.
func (d *rdb) pauseBackground(pause bool) { C.lq_pause_background(d.p, cbool(pause)) }

// rdbIter iterates one family between bounds. key and value are views
// into RocksDB's memory, valid until the iterator moves or closes.
type rdbIter struct {
	p          *C.lq_iter
	key, value []byte
	err        error
	// e is the C iterator's current entry, in C memory: a move passes no
	// pointer of Go's (out-parameters in Go locals were moved to the
	// heap, five allocations per entry, and checked by cgo on every call:
	// about a quarter of the CPU of opening a 1M backlog).
	e *C.lq_entry
}

// iter returns an iterator over family fam, from lower (inclusive) to
// upper (exclusive; nil: no bound), at snap (nil: the latest state).
// once: a single pass that reads ahead and keeps its blocks out of the
// block cache.
func (d *rdb) iter(snap *rdbSnap, fam int, lower, upper []byte, once bool) *rdbIter {
	var up *C.char
	if upper != nil {
		up = ptr(upper)
		if up == nil {
			up = ptr([]byte{0}) // an empty upper bound: any valid pointer, length 0
		}
	}
	p := C.lq_iter_new(d.p, snap.c(), C.int(fam), ptr(lower), C.size_t(len(lower)), up, C.size_t(len(upper)), cbool(once))
	return &rdbIter{p: p, e: C.lq_iter_entry(p)}
}

// seek moves to the first key >= k (nil: the first key); it reports
// whether there is one (see err after false).
func (it *rdbIter) seek(k []byte) bool {
	var first *C.char
	if k != nil {
		first = ptr(k)
		if first == nil {
			first = ptr([]byte{0}) // the empty key: any valid pointer, length 0
		}
	}
	return it.entry(C.lq_iter_seek(it.p, first, C.size_t(len(k))))
}

// next moves to the next key, as seek.
func (it *rdbIter) next() bool {
	return it.entry(C.lq_iter_next(it.p))
}

// entry sets key and value from the C entry after a seek or next that
// returned r.
func (it *rdbIter) entry(r C.int) bool {
	it.key, it.value = nil, nil
	e := it.e
	switch r {
	case 1:
		it.key = unsafe.Slice((*byte)(unsafe.Pointer(e.k)), int(e.kl))
		it.value = unsafe.Slice((*byte)(unsafe.Pointer(e.v)), int(e.vl))
		if e.kl == 0 {
			it.key = []byte{}
		}
		if e.vl == 0 {
			it.value = []byte{}
		}
		return true
	case 0:
		return false
	default:
		it.err = cErr(e.err)
		e.err = nil
		return false
	}
}

func (it *rdbIter) close() { C.lq_iter_destroy(it.p) }

// rdbTxn is a transaction of a txnDB, reused from batch to batch.
type rdbTxn struct {
	p *C.lq_txn
	// msg receives a failed call's message. A field rather than a local:
	// a local whose address goes to C is moved to the heap, one
	// allocation per commit.
	msg *C.char
	// kb and koff hold lockMany's packed keys, reused from call to call.
	kb   []byte
	koff []uint32
}

// begin starts a transaction, reusing old (nil: a new one).
func (d *rdb) begin(old *rdbTxn) *rdbTxn {
	if old == nil {
		return &rdbTxn{p: C.lq_txn_begin(d.p, nil)}
	}
	old.p = C.lq_txn_begin(d.p, old.p)
	return old
}

func (t *rdbTxn) destroy() { C.lq_txn_destroy(t.p) }

// write appends w's writes to the transaction's batch, unlocked and
// unindexed (see rdb above).
func (t *rdbTxn) write(w *writeBuf) {
	if len(w.b) == 0 {
		return
	}
	C.lq_txn_write(t.p, ptr(w.b), C.size_t(len(w.b)))
}

// commit commits the transaction, marked for waitLogged (see writeMarked).
func (t *rdbTxn) commit(mark uint64) error {
	t.msg = nil
	return cStatus(C.lq_txn_commit(t.p, C.uint64_t(mark), &t.msg), &t.msg)
}

func (t *rdbTxn) rollback() error {
	t.msg = nil
	return cStatus(C.lq_txn_rollback(t.p, &t.msg), &t.msg)
}

// get reads key in the transaction without locking it; a copy.
func (t *rdbTxn) get(key []byte) ([]byte, bool, error) {
	return readValue(func(out *C.char, cap C.size_t, msg **C.char) C.int64_t {
		return C.lq_txn_get(t.p, ptr(key), C.size_t(len(key)), out, cap, msg)
	})
}

// lockMany locks keys as getManyForUpdate does, without reading them, in
// one call into C.
func (t *rdbTxn) lockMany(keys [][]byte) error {
	if len(keys) == 0 {
		return nil
	}
	kb, koff := packKeys(t.kb[:0], t.koff[:0], keys)
	if cap(kb) <= maxReusedWriteBuf {
		t.kb, t.koff = kb, koff
	}
	t.msg = nil
	if C.lq_txn_lock(t.p, (*C.char)(unsafe.Pointer(&kb[0])), (*C.uint32_t)(unsafe.Pointer(&koff[0])), C.int64_t(len(keys)), &t.msg) != 0 {
		return cErr(t.msg)
	}
	return nil
}

// packKeys lays keys end to end for C, appending to kb and koff (empty,
// reused room or nil): key i is kb[koff[i]:koff[i+1]]. kb ends in a zero
// byte, so it is a valid pointer even when every key is empty.
func packKeys(kb []byte, koff []uint32, keys [][]byte) ([]byte, []uint32) {
	total := 0
	for _, k := range keys {
		total += len(k)
	}
	kb = slices.Grow(kb, total+1)
	koff = append(slices.Grow(koff, len(keys)+1), 0)
	for _, k := range keys {
		kb = append(kb, k...)
		koff = append(koff, uint32(len(kb)))
	}
	return append(kb, 0), koff
}

// getManyForUpdate reads keys with an exclusive GetForUpdate, in one call
// into C for all of them. vals[i] is key i's value, nil when it is
// missing; the values share one fresh buffer. The reads skip range
// tombstones (rdb.cc, lq_open): an item key of available or in_progress
// may be read this way only while the store's memory holds the item
// there (ready, or inflight); whether any other item key exists is for
// opTx.get to say.
func (t *rdbTxn) getManyForUpdate(keys [][]byte) ([][]byte, error) {
	n := len(keys)
	if n == 0 {
		return nil, nil
	}
	kb, koff := packKeys(nil, nil, keys)
	vlen := make([]int64, n)
	out := make([]byte, 320*n)
	var used C.size_t
	start := 0
	for start < n {
		t.msg = nil
		next := int(C.lq_txn_get_for_update(t.p, (*C.char)(unsafe.Pointer(&kb[0])), (*C.uint32_t)(unsafe.Pointer(&koff[0])),
			C.int64_t(start), C.int64_t(n), (*C.char)(unsafe.Pointer(&out[0])), C.size_t(len(out)), &used,
			(*C.int64_t)(unsafe.Pointer(&vlen[0])), &t.msg))
		if next < 0 {
			return nil, cErr(t.msg)
		}
		if next < n {
			// Value next did not fit: grow and go on from it.
			grown := make([]byte, max(2*len(out), int(used)+int(vlen[next])+320*(n-next)))
			copy(grown, out[:used])
			out = grown
		}
		start = next
	}
	vals := make([][]byte, n)
	off := 0
	for i, l := range vlen {
		if l < 0 {
			continue
		}
		vals[i] = out[off : off+int(l) : off+int(l)]
		off += int(l)
	}
	return vals, nil
}

// writeBuf collects a batch's writes for one call into C (lq_txn_write,
// lq_write).
type writeBuf struct{ b []byte }

func (w *writeBuf) reset() { w.b = w.b[:0] }

func (w *writeBuf) add(op byte, key, value []byte) {
	w.b = append(w.b, op)
	w.b = binary.NativeEndian.AppendUint32(w.b, uint32(len(key)))
	w.b = append(w.b, key...)
	if op != 'd' && op != 's' {
		w.b = binary.NativeEndian.AppendUint32(w.b, uint32(len(value)))
		w.b = append(w.b, value...)
	}
}

// delIn deletes key from family fam, whatever its namespace (migrate.go).
func (w *writeBuf) delIn(fam int, key []byte) {
	w.b = append(w.b, 'D', byte(fam))
	w.b = binary.NativeEndian.AppendUint32(w.b, uint32(len(key)))
	w.b = append(w.b, key...)
}

func (w *writeBuf) put(key, value []byte) { w.add('p', key, value) }
func (w *writeBuf) del(key []byte)        { w.add('d', key, nil) }
func (w *writeBuf) singleDel(key []byte)  { w.add('s', key, nil) }

// delThrough deletes the item keys of one queue and namespace from first
// through last, both included, where no key the batch leaves lies
// between them (idRun, batch.headRun): one range tombstone. Its begin is
// first without its last byte (ids differ within their first eight
// bytes, and every item key ends with its id, so no other key lies
// between that and first; HintByNamespace in rdb.cc tells such begin
// keys from item keys), its end last followed by a zero byte.
func (w *writeBuf) delThrough(first, last []byte) {
	w.b = append(w.b, 'r')
	w.b = binary.NativeEndian.AppendUint32(w.b, uint32(len(first)-1))
	w.b = append(w.b, first[:len(first)-1]...)
	w.b = binary.NativeEndian.AppendUint32(w.b, uint32(len(last)+1))
	w.b = append(w.b, last...)
	w.b = append(w.b, 0)
}
