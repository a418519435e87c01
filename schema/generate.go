// Package schema holds leaseq's Cap'n Proto wire protocol (queue.capnp) and
// the Go code generated from it. queueber.capnp is Queueber's protocol,
// which a node can serve as well (see rpc/queueber); its Go code is
// generated into the sub-package schema/queueber, so its Queue and Item do
// not clash with leaseq's. Nothing here is written by hand apart from this
// file; regenerate with `go generate ./schema` (make generate).
package schema

//go:generate sh -c "capnp compile -I$(go list -m -f '{{.Dir}}' capnproto.org/go/capnp/v3)/std -ogo queue.capnp"
//go:generate sh -c "capnp compile -I$(go list -m -f '{{.Dir}}' capnproto.org/go/capnp/v3)/std -ogo:queueber queueber.capnp"
