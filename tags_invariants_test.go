//go:build invariants

package main

// The tests run with -tags invariants (make test): build the leaseq binary
// under test the same way.
func init() { binTags = "invariants" }
