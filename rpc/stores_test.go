package rpc

// extraFactories lists the other backends the RPC tests run against.
func extraFactories() []storeFactory { return nil }
