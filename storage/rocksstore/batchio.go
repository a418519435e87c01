package rocksstore

/*
#include <stdint.h>
#include <string.h>
#include <rocksdb/c.h>

// leaseq_wbwi_apply adds a batch's encoded writes to wb. Each write is an
// op byte ('p' put, 'd' delete, 's' single delete, 'm' merge), a uint32
// key length, the key, and for put and merge a uint32 value length and
// the value (host byte order, unaligned). cfs maps a key's first byte (its
// namespace) to its column family.
static void leaseq_wbwi_apply(rocksdb_writebatch_wi_t* wb,
		rocksdb_column_family_handle_t** cfs, const char* p, size_t n) {
	const char* end = p + n;
	while (p < end) {
		char op = *p++;
		uint32_t kl, vl;
		memcpy(&kl, p, 4);
		p += 4;
		const char* k = p;
		p += kl;
		rocksdb_column_family_handle_t* cf = cfs[(unsigned char)k[0]];
		if (op == 'd') {
			rocksdb_writebatch_wi_delete_cf(wb, cf, k, kl);
			continue;
		}
		if (op == 's') {
			rocksdb_writebatch_wi_singledelete_cf(wb, cf, k, kl);
			continue;
		}
		memcpy(&vl, p, 4);
		p += 4;
		const char* v = p;
		p += vl;
		if (op == 'p') {
			rocksdb_writebatch_wi_put_cf(wb, cf, k, kl, v, vl);
		} else {
			rocksdb_writebatch_wi_merge_cf(wb, cf, k, kl, v, vl);
		}
	}
}

// leaseq_txn_get_for_update reads keys start..n-1 with an exclusive
// GetForUpdate. Key i is keys[koff[i]:koff[i+1]]. Each value found is
// copied to out at *used (vlen[i] is its length; -1: not found) until one
// does not fit in cap: then vlen[i] is the length it needs and i is
// returned. Returns n when every key is read, or -1 with *errptr set. cfs
// is leaseq_wbwi_apply's.
static int64_t leaseq_txn_get_for_update(rocksdb_transaction_t* txn,
		const rocksdb_readoptions_t* ro, rocksdb_column_family_handle_t** cfs,
		const char* keys, const uint32_t* koff,
		int64_t start, int64_t n, char* out, size_t cap, size_t* used,
		int64_t* vlen, char** errptr) {
	for (int64_t i = start; i < n; i++) {
		const char* k = keys + koff[i];
		rocksdb_pinnableslice_t* ps = rocksdb_transaction_get_pinned_for_update_cf(
			txn, ro, cfs[(unsigned char)k[0]], k, koff[i+1] - koff[i], 1, errptr);
		if (*errptr != NULL) {
			return -1;
		}
		if (ps == NULL) {
			vlen[i] = -1;
			continue;
		}
		size_t l = 0;
		const char* v = rocksdb_pinnableslice_value(ps, &l);
		vlen[i] = (int64_t)l;
		if (l > cap - *used) {
			rocksdb_pinnableslice_destroy(ps);
			return i;
		}
		memcpy(out + *used, v, l);
		*used += l;
		rocksdb_pinnableslice_destroy(ps);
	}
	return n;
}
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"unsafe"

	"github.com/linxGnu/grocksdb"
)

// Batched RocksDB calls. A batch's writes, and a claim pass's reads, cross
// into C once instead of once (or twice) per key. The C side calls only
// RocksDB's public C API. It needs the C handles inside grocksdb's
// Transaction, WriteBatchWI and ReadOptions, which grocksdb keeps
// unexported as each struct's first field; TestBatchIO checks that this
// still holds for the grocksdb version in go.mod.

func cTxn(t *grocksdb.Transaction) *C.rocksdb_transaction_t {
	return *(**C.rocksdb_transaction_t)(unsafe.Pointer(t))
}

func cWBWI(wb *grocksdb.WriteBatchWI) *C.rocksdb_writebatch_wi_t {
	return *(**C.rocksdb_writebatch_wi_t)(unsafe.Pointer(wb))
}

func cReadOpts(ro *grocksdb.ReadOptions) *C.rocksdb_readoptions_t {
	return *(**C.rocksdb_readoptions_t)(unsafe.Pointer(ro))
}

// writeBuf collects a batch's writes for applyWrites.
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

func (w *writeBuf) put(key, value []byte)   { w.add('p', key, value) }
func (w *writeBuf) del(key []byte)          { w.add('d', key, nil) }
func (w *writeBuf) singleDel(key []byte)    { w.add('s', key, nil) }
func (w *writeBuf) merge(key, value []byte) { w.add('m', key, value) }

// applyWrites adds w's writes to wb in one call, each to its key's family.
func applyWrites(wb *grocksdb.WriteBatchWI, fams *families, w *writeBuf) {
	if len(w.b) == 0 {
		return
	}
	C.leaseq_wbwi_apply(cWBWI(wb), fams.cTable(), (*C.char)(unsafe.Pointer(&w.b[0])), C.size_t(len(w.b)))
}

// getManyForUpdate reads keys with GetForUpdate (exclusive) in t. vals[i]
// is key i's value, nil when it is missing; the values share one fresh
// buffer.
func getManyForUpdate(t *grocksdb.Transaction, ro *grocksdb.ReadOptions, fams *families, keys [][]byte) ([][]byte, error) {
	n := len(keys)
	if n == 0 {
		return nil, nil
	}
	total := 0
	for _, k := range keys {
		total += len(k)
	}
	kb := make([]byte, 0, total)
	koff := make([]uint32, n+1)
	for i, k := range keys {
		kb = append(kb, k...)
		koff[i+1] = uint32(len(kb))
	}
	if len(kb) == 0 {
		kb = append(kb, 0) // a valid pointer for C; no key reads it
	}
	vlen := make([]int64, n)
	out := make([]byte, 320*n)
	var used C.size_t
	start := 0
	for start < n {
		var cErr *C.char
		var outp *C.char
		if len(out) > 0 {
			outp = (*C.char)(unsafe.Pointer(&out[0]))
		}
		next := int(C.leaseq_txn_get_for_update(cTxn(t), cReadOpts(ro), fams.cTable(),
			(*C.char)(unsafe.Pointer(&kb[0])), (*C.uint32_t)(unsafe.Pointer(&koff[0])),
			C.int64_t(start), C.int64_t(n), outp, C.size_t(len(out)), &used,
			(*C.int64_t)(unsafe.Pointer(&vlen[0])), &cErr))
		if next < 0 {
			msg := C.GoString(cErr)
			C.rocksdb_free(unsafe.Pointer(cErr))
			return nil, translate("get for update", errors.New(msg))
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
