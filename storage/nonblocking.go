package storage

// Nonblocking is implemented by stores that can tell whether their calls
// ever wait for a device or the network (an fsync, a remote commit). A
// server may run the calls of a store that never waits on its network
// reader instead of on a goroutine of their own (rpc's lean engine). A
// store that does not implement it is taken to wait.
type Nonblocking interface {
	// Nonblocking reports whether every call completes without waiting
	// for I/O beyond memory and the page cache. It does not change over
	// the store's life.
	Nonblocking() bool
}
