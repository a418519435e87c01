package memstore

import "container/heap"

// indexedHeap is a binary min-heap that tells each element its position, so
// an element can be removed or re-ordered in O(log n) when it leaves a state
// for a reason other than reaching the top (a poll of a delayed item, an
// extend, a purge). The store keeps several of them; see Store.
type indexedHeap[T any] struct {
	s      []T
	less   func(a, b T) bool
	setIdx func(x T, i int) // i is -1 once x has left the heap
}

func newHeap[T any](less func(a, b T) bool, setIdx func(x T, i int)) *indexedHeap[T] {
	return &indexedHeap[T]{less: less, setIdx: setIdx}
}

// heap.Interface, for container/heap only; use the lower-case methods.
func (h *indexedHeap[T]) Len() int           { return len(h.s) }
func (h *indexedHeap[T]) Less(i, j int) bool { return h.less(h.s[i], h.s[j]) }
func (h *indexedHeap[T]) Swap(i, j int) {
	h.s[i], h.s[j] = h.s[j], h.s[i]
	h.setIdx(h.s[i], i)
	h.setIdx(h.s[j], j)
}
func (h *indexedHeap[T]) Push(x any) {
	v := x.(T)
	h.setIdx(v, len(h.s))
	h.s = append(h.s, v)
}
func (h *indexedHeap[T]) Pop() any {
	n := len(h.s) - 1
	v := h.s[n]
	var zero T
	h.s[n] = zero // let the GC have it
	h.s = h.s[:n]
	h.setIdx(v, -1)
	return v
}

func (h *indexedHeap[T]) push(x T)     { heap.Push(h, x) }
func (h *indexedHeap[T]) remove(i int) { heap.Remove(h, i) }
func (h *indexedHeap[T]) fix(i int)    { heap.Fix(h, i) }

// top returns the smallest element without removing it.
func (h *indexedHeap[T]) top() (T, bool) {
	if len(h.s) == 0 {
		var zero T
		return zero, false
	}
	return h.s[0], true
}

// valid reports whether the heap property and the recorded positions hold;
// used by Check.
func (h *indexedHeap[T]) valid(idx func(T) int) bool {
	for i, x := range h.s {
		if idx(x) != i {
			return false
		}
		if i > 0 && h.less(x, h.s[(i-1)/2]) {
			return false
		}
	}
	return true
}
