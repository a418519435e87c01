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
