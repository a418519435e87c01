package rocksstore

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// An overlay answers lookups with the last write of each key, and sorted
// gives its live entries in byte order, once each, whatever order they
// were first written in, leaving out the keys no longer written; reset
// empties it. Keys with no live entry are at times added without the
// index (overlay.add), as a new item's are.
func TestOverlay(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ov := newOverlay()
	for round := range 200 {
		want := make(map[string][]byte) // nil: a delete
		n := rng.IntN(300)
		if round%2 == 0 {
			n = rng.IntN(smallBatchKeys + 2) // around the direct sort's bound
		}
		var keys []string
		for range n {
			keys = append(keys, string([]byte{byte('a' + rng.IntN(4)), byte(rng.IntN(256)), byte(rng.IntN(256))}))
		}
		switch round % 3 {
		case 0:
			slices.Sort(keys) // written in order already
		case 1:
			// A few ascending runs, as the ops of a batch write them (more
			// than sortRuns merges, at times).
			k := 1 + rng.IntN(maxMergedRuns+3)
			for r := range k {
				slices.Sort(keys[r*len(keys)/k : (r+1)*len(keys)/k])
			}
		}
		for _, k := range keys {
			if _, live := want[k]; !live && rng.IntN(3) == 0 {
				// A key with no live entry, as a new item's: appended
				// without the index, which takes it in on the next lookup
				// or write of any key.
				v := []byte{9}
				ov.add(k, v)
				want[k] = v
				continue
			}
			i := ov.entry(k)
			switch r := rng.IntN(5); {
			case r == 0: // written, then no longer
				ov.setEnt(i, nil, false)
				delete(want, k)
			case r == 1:
				ov.setEnt(i, nil, true)
				want[k] = nil
			default:
				v := []byte{byte(r)}
				ov.setEnt(i, v, true)
				want[k] = v
			}
		}
		require.Equal(t, len(want), ov.live, "round %d", round)
		for _, k := range keys {
			v, found := ov.lookup([]byte(k))
			w, ok := want[k]
			require.Equal(t, ok, found, "round %d: %x", round, k)
			require.Equal(t, w, v, "round %d: %x", round, k)
		}
		wantKeys := make([]string, 0, len(want))
		for k := range want {
			wantKeys = append(wantKeys, k)
		}
		slices.Sort(wantKeys)
		dst := []overlayEnt{{key: "kept"}}
		got := ov.sorted(dst)
		require.Equal(t, "kept", got[0].key, "dst's own entries stay")
		gotKeys := make([]string, 0, len(got)-1)
		for _, e := range got[1:] {
			require.True(t, e.live)
			require.Equal(t, want[e.key], e.val)
			gotKeys = append(gotKeys, e.key)
		}
		require.Equal(t, wantKeys, gotKeys, "round %d", round)
		ov.reset()
		require.Zero(t, ov.live)
		if len(keys) > 0 {
			_, found := ov.lookup([]byte(keys[0]))
			require.False(t, found, "reset empties the overlay")
		}
	}
}

// A batch that outgrows the key arena's chunk leaves a chunk it fits in,
// so batches of the same size allocate none; buffers never overlap, and
// a batch larger than keyArenaMax does not make the arena that large.
func TestKeyArena_GrowsToTheBatch(t *testing.T) {
	var a keyArena
	// batch takes n buffers of size bytes and reports whether they were
	// all empty with room for size bytes and did not overlap.
	batch := func(n, size int) bool {
		ok := true
		var prev []byte
		for i := range n {
			b := a.take(size)
			ok = ok && len(b) == 0 && cap(b) == size
			b = b[:size]
			b[0], b[size-1] = byte(i), byte(i)
			ok = ok && (prev == nil || prev[0] == byte(i-1) && prev[size-1] == byte(i-1))
			prev = b
		}
		a.reset()
		return ok
	}
	n := 3 * keyArenaChunk / 300 // three chunks' worth of 300-byte records
	require.True(t, batch(n, 300))
	require.GreaterOrEqual(t, cap(a.buf), n*300)
	ok := true
	allocs := testing.AllocsPerRun(20, func() { ok = batch(n, 300) && ok })
	require.True(t, ok)
	require.Zero(t, allocs, "a batch of the same size again")

	require.True(t, batch(2*keyArenaMax/4096, 4096))
	require.LessOrEqual(t, cap(a.buf), keyArenaMax, "a batch past keyArenaMax does not size the arena")
}
