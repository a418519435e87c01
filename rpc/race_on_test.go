//go:build race

package rpc

// raceEnabled scales down tests whose size only matters without the race
// detector, which makes go-capnp's byte loops (zeroing, copying segments)
// many times slower.
const raceEnabled = true
