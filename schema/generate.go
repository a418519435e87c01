// Package schema holds leaseq's Cap'n Proto wire protocol (queue.capnp) and
// the Go code generated from it. Nothing in it is written by hand apart from
// this file; regenerate with `go generate ./schema` (make generate).
package schema

//go:generate sh -c "capnp compile -I$(go list -m -f '{{.Dir}}' capnproto.org/go/capnp/v3)/std -ogo queue.capnp"
