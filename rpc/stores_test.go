package rpc

// extraFactories lists the other backends the RPC tests run against.
// rocksstore joins once it is committed (it is being written).
func extraFactories() []storeFactory { return nil }
