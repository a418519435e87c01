//go:build !race

package memstore_test

// raceEnabled: see race_on_test.go.
const raceEnabled = false
