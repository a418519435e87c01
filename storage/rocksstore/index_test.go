package rocksstore

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
)

// TestReadyIndex drives a readyIndex with random pushes (mostly in order,
// some out of order, as delays and returned leases make them), pops and
// undo-removes, and checks every answer against a sorted list.
func TestReadyIndex(t *testing.T) {
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 1))
		var x readyIndex
		type ref struct {
			prio uint8
			e    readyEntry
		}
		var model []ref
		cmp := func(a, b ref) int {
			if a.prio != b.prio {
				return int(a.prio) - int(b.prio)
			}
			if a.e.less(b.e) {
				return -1
			}
			if b.e.less(a.e) {
				return 1
			}
			return 0
		}
		now, seq := int64(1000), uint64(0)
		for step := range 5000 {
			switch op := r.IntN(10); {
			case op < 5: // push
				seq++
				vis := now
				if r.IntN(4) == 0 {
					vis = now - int64(r.IntN(500)) + int64(r.IntN(400)) // out of order, or in the future
				}
				prio := uint8(r.IntN(3) * 100)
				e := readyEntry{vis: vis, id: dbkeys.NewID(seq, now)}
				x.push(prio, e)
				model = append(model, ref{prio, e})
				now += int64(r.IntN(3))
			case op < 9: // pop the first visible entry of the lowest priority that has one
				slices.SortFunc(model, cmp)
				var want *ref
				for i := range model {
					if model[i].e.vis <= now {
						// The first visible entry of its priority only
						// if it heads that priority.
						if i == 0 || model[i-1].prio != model[i].prio {
							want = &model[i]
							break
						}
					}
				}
				var got ref
				ok := false
				x.prios(func(p uint8) bool {
					got.e, ok = x.popReady(p, now)
					got.prio = p
					return !ok
				})
				if want == nil {
					require.False(t, ok, "seed %d step %d: popped %+v from no visible head", seed, step, got)
					continue
				}
				require.True(t, ok, "seed %d step %d: want %+v", seed, step, *want)
				require.Equal(t, *want, got, "seed %d step %d", seed, step)
				i := slices.IndexFunc(model, func(m ref) bool { return m == got })
				model = slices.Delete(model, i, i+1)
			default: // undo a push of some entry
				if len(model) == 0 {
					continue
				}
				i := r.IntN(len(model))
				x.remove(model[i].prio, model[i].e)
				model = slices.Delete(model, i, i+1)
			}
			require.Equal(t, len(model), x.n, "seed %d step %d", seed, step)
		}
		// Drain: everything comes out in order.
		slices.SortFunc(model, cmp)
		for _, m := range model {
			prio, e, ok := x.popAny()
			require.True(t, ok)
			require.Equal(t, m, ref{prio, e})
		}
		_, _, ok := x.popAny()
		require.False(t, ok)
	}
}

// TestReadyRun checks one priority's serve order as it grows past its
// array into many chunks, from empty or from a large array as Open's
// rebuild makes it, and drains through the chunk boundaries, with
// undo-removes anywhere, against a plain slice.
func TestReadyRun(t *testing.T) {
	for seed := range uint64(3) {
		r := rand.New(rand.NewPCG(seed, 2))
		seq := uint64(0)
		next := func() readyEntry {
			seq++
			return readyEntry{vis: int64(seq), id: dbkeys.NewID(seq, 0)}
		}
		var model []readyEntry
		for range r.IntN(3) * (runArray + r.IntN(runArray)) {
			model = append(model, next())
		}
		h := &readyHeap{run: slices.Clip(slices.Clone(model))}
		chunked := false
		for step := range 200000 {
			switch op := r.IntN(200); {
			case op < 60 || (step < 120000 && op < 160): // push; the run grows for a while, then shrinks
				e := next()
				h.push(e)
				model = append(model, e)
			case op < 199: // pop
				if len(model) == 0 {
					continue
				}
				if got := h.pop(); got != model[0] {
					t.Fatalf("seed %d step %d: popped %v, want %v", seed, step, got, model[0])
				}
				model = model[1:]
			default: // undo-remove some entry
				if len(model) == 0 {
					require.False(t, h.remove(next()))
					continue
				}
				i := r.IntN(len(model))
				if !h.remove(model[i]) {
					t.Fatalf("seed %d step %d: %v not found", seed, step, model[i])
				}
				model = slices.Delete(model, i, i+1)
			}
			chunked = chunked || len(h.more) > 1
			first, ok := h.peek()
			if ok != (len(model) > 0) || h.empty() == ok || len(h.rest) > 0 || ok && first != model[0] {
				t.Fatalf("seed %d step %d: first %v %v, empty %v, %d out of order; want %d entries",
					seed, step, first, ok, h.empty(), len(h.rest), len(model))
			}
		}
		require.True(t, chunked, "the run grew into chunks")
		for _, want := range model {
			require.Equal(t, want, h.pop())
		}
		require.True(t, h.empty())
		require.Nil(t, h.more)
	}
}

// BenchmarkReadyIndexGrow: pushes of in-order entries into a priority
// whose backlog only grows (produce-b100: nobody consuming).
func BenchmarkReadyIndexGrow(b *testing.B) {
	var x readyIndex
	b.ReportAllocs()
	for i := range b.N {
		x.push(0, readyEntry{vis: int64(i), id: dbkeys.NewID(uint64(i)+1, 0)})
	}
}

// BenchmarkReadyIndex: one push and one pop on a priority holding a
// backlog of n in-order entries (a queue with a backlog in steady state).
func BenchmarkReadyIndex(b *testing.B) {
	for _, n := range []int{4096, 1 << 20} {
		b.Run(fmt.Sprintf("backlog=%d", n), func(b *testing.B) {
			var x readyIndex
			seq := uint64(0)
			for range n {
				seq++
				x.push(0, readyEntry{vis: int64(seq), id: dbkeys.NewID(seq, 0)})
			}
			b.ResetTimer()
			for range b.N {
				seq++
				x.push(0, readyEntry{vis: int64(seq), id: dbkeys.NewID(seq, 0)})
				if _, ok := x.popReady(0, int64(seq)); !ok {
					b.Fatal("nothing to pop")
				}
			}
		})
	}
}
