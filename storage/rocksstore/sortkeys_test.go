package rocksstore

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// sortedKeys gives the overlay's keys in byte order, once each, whatever
// order they were first written in, and leaves out the dropped ones.
func TestSortedKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		writes := make(map[string][]byte)
		var order []string
		n := rng.IntN(300)
		if round%2 == 0 {
			n = rng.IntN(smallBatchKeys + 2) // around the direct sort's bound
		}
		for range n {
			k := string([]byte{byte('a' + rng.IntN(4)), byte(rng.IntN(256)), byte(rng.IntN(256))})
			order = append(order, k) // repeats included
			if rng.IntN(5) > 0 {
				writes[k] = []byte("v")
			} else {
				delete(writes, k) // written, then dropped from the overlay
			}
		}
		if round%3 == 0 {
			slices.Sort(order) // already in order
		}
		want := make([]string, 0, len(writes))
		for k := range writes {
			want = append(want, k)
		}
		slices.Sort(want)
		dst := []string{"kept"}
		got := sortedKeys(dst, slices.Clone(order), writes)
		require.Equal(t, "kept", got[0], "dst's own entries stay")
		require.Equal(t, want, got[1:], "round %d", round)
	}
}
