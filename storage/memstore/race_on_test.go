//go:build race

package memstore_test

// raceEnabled scales down tests whose size only matters for speed: the race
// detector slows the heap code tenfold.
const raceEnabled = true
