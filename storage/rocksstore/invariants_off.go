//go:build !invariants

package rocksstore

const invariants = false
