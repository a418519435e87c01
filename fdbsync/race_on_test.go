//go:build race

package fdbsync_test

// raceEnabled shrinks the largest tests under -race, which runs them about
// ten times slower.
const raceEnabled = true
