package rocksstore

import (
	"slices"
	"strings"
)

// overlay holds the writes of the batch being built: one entry per key,
// in the order the batch first wrote each key, and an index from key to
// entry. The batch's reads see it before the database (opTx.overlay); at
// commit its live entries go to RocksDB in key order (sorted).
//
// An entry is never removed while the batch is built: a key the batch
// wrote and then no longer writes (an item claimed in the batch that
// enqueued it, see opTx.set, or an op rolled back) stays as a dead entry,
// so each write costs one map lookup, plus one insert for a key new to the
// batch, and the commit needs none.
//
// The keys of a new item (its id was reserved by this batch) cannot be in
// the batch yet, so add appends them without a lookup, and the index takes
// them in only when a later lookup or write needs it: a batch of enqueues
// alone, such as produce-b100's, never builds the index.
type overlay struct {
	idx     map[string]int32 // key -> its entry in ents, for ents[:indexed]
	ents    []overlayEnt
	indexed int32        // ents from here on were added by add and are not in idx yet
	live    int          // entries that are writes
	tmp     []overlayEnt // sortRuns' merge buffer
}

type overlayEnt struct {
	key  string
	val  []byte // nil: a delete
	live bool   // false: the batch does not write this key (anymore)
}

func newOverlay() overlay { return overlay{idx: make(map[string]int32)} }

// reset empties ov for the next batch. A map keeps the capacity of its
// largest size, and clearing it costs that capacity: one that grew past
// maxReusedOverlay keys starts small again.
func (ov *overlay) reset() {
	if len(ov.idx) > maxReusedOverlay {
		ov.idx = make(map[string]int32)
	} else {
		clear(ov.idx)
	}
	clear(ov.ents) // drop what the entries point to
	ov.ents = ov.ents[:0]
	if cap(ov.ents) > maxReusedSorted {
		ov.ents = nil
	}
	if cap(ov.tmp) > maxReusedSorted {
		ov.tmp = nil
	}
	ov.live, ov.indexed = 0, 0
}

// index puts the entries add appended into idx. Entries are indexed in
// order, so a key written again after a rolled-back add maps to its latest
// entry.
func (ov *overlay) index() {
	for i := ov.indexed; i < int32(len(ov.ents)); i++ {
		ov.idx[ov.ents[i].key] = i
	}
	ov.indexed = int32(len(ov.ents))
}

// add appends a write of v to k, a key the batch has no live entry for
// (a new item's, or see opTx.untouched).
func (ov *overlay) add(k string, v []byte) {
	ov.ents = append(ov.ents, overlayEnt{key: k, val: v, live: true})
	ov.live++
}

// lookup returns the batch's write of k: found with v nil is a delete.
func (ov *overlay) lookup(k []byte) (v []byte, found bool) {
	ov.index()
	if i, ok := ov.idx[string(k)]; ok && ov.ents[i].live {
		return ov.ents[i].val, true
	}
	return nil, false
}

// entry returns k's entry, adding a dead one if the batch has none.
func (ov *overlay) entry(k string) int32 {
	ov.index()
	i, ok := ov.idx[k]
	if !ok {
		i = int32(len(ov.ents))
		ov.ents = append(ov.ents, overlayEnt{key: k})
		ov.idx[k] = i
		ov.indexed++
	}
	return i
}

// setEnt makes entry i write v (live) or not write at all (!live).
func (ov *overlay) setEnt(i int32, v []byte, live bool) {
	e := &ov.ents[i]
	switch {
	case live && !e.live:
		ov.live++
	case !live && e.live:
		ov.live--
	}
	e.val, e.live = v, live
}

// sorted appends ov's live entries to dst in key order. The entries are
// in the order first written: one counting pass groups them by their
// first byte (the namespace), and within a namespace they come as a few
// ascending runs (ids rise within each op), which sortRuns merges; a map
// walk followed by a sort of keys in random order cost 7 % of the serial
// batch path (docs/BENCHMARKS.md).
func (ov *overlay) sorted(dst []overlayEnt) []overlayEnt {
	base := len(dst)
	if ov.live <= smallBatchKeys {
		// A call or two: a plain sort costs less than the counting pass.
		for _, e := range ov.ents {
			if e.live {
				dst = append(dst, e)
			}
		}
		slices.SortFunc(dst[base:], cmpEnt)
		return dst
	}
	var count [256]int32
	for _, e := range ov.ents {
		if e.live {
			count[e.key[0]]++
		}
	}
	var at [256]int32
	n := int32(0)
	for i, c := range count {
		at[i] = n
		n += c
	}
	dst = slices.Grow(dst, int(n))[:base+int(n)]
	for _, e := range ov.ents {
		if e.live {
			dst[base+int(at[e.key[0]])] = e
			at[e.key[0]]++
		}
	}
	start := int32(0)
	for _, c := range count {
		if c > 1 {
			ov.sortRuns(dst[base+int(start) : base+int(start+c)])
		}
		start += c
	}
	clear(ov.tmp)
	return dst
}

// maxMergedRuns is the most ascending runs sortRuns merges; a group with
// more is sorted.
const maxMergedRuns = 8

// sortRuns sorts g, one namespace's entries in the order first written.
// That order is a few ascending runs: each op writes its keys in id
// order (an enqueue's new items, a poll's claimed ones, an ack's), so a
// batch's group is the runs of its ops. Merging them costs a comparison
// or two per entry where a sort costs log(n).
func (ov *overlay) sortRuns(g []overlayEnt) {
	var ends [maxMergedRuns]int
	runs := 0
	for i := 1; i <= len(g); i++ {
		if i == len(g) || cmpEnt(g[i-1], g[i]) > 0 {
			if runs == maxMergedRuns {
				slices.SortFunc(g, cmpEnt)
				return
			}
			ends[runs] = i
			runs++
		}
	}
	// Merge each run into the sorted prefix before it.
	for r := 1; r < runs; r++ {
		a, b := g[:ends[r-1]], g[ends[r-1]:ends[r]]
		if cmpEnt(a[len(a)-1], b[0]) < 0 {
			continue // already in order
		}
		m := append(ov.tmp[:0], a...)
		i, j, k := 0, 0, 0
		for i < len(m) && j < len(b) {
			if cmpEnt(m[i], b[j]) < 0 {
				g[k] = m[i]
				i++
			} else {
				g[k] = b[j]
				j++
			}
			k++
		}
		copy(g[k:], m[i:]) // what is left of b is in place already
		ov.tmp = m
	}
}

func cmpEnt(a, b overlayEnt) int { return strings.Compare(a.key, b.key) }

// smallBatchKeys is the most keys sorted sorts directly.
const smallBatchKeys = 16
