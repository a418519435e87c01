//go:build !race

package rpc

// raceEnabled: see race_on_test.go.
const raceEnabled = false
