package rpc

import "sync/atomic"

// maxIdleWorkers bounds the goroutines kept waiting for calls that may
// wait (workerPool).
const maxIdleWorkers = 32

// workerPool runs the calls that may wait (a durable call the store does
// not complete asynchronously, a nack waiting for its fsync say; a
// forwarded call; the rest of an answer a full socket did not take) on
// goroutines that outlive them. Such a call
// goes deep into the store, and a fresh goroutine starts with a small
// stack that it then grows by copying: the copies were 6 % of the node's
// CPU under single durable enqueues (docs/BENCHMARKS.md). A worker keeps
// its grown stack for the next call. Up to maxIdleWorkers wait for work;
// when none waits, run starts one. They end when the server's
// connections are closed (quit).
type workerPool struct {
	work chan func()
	quit <-chan struct{}
	idle atomic.Int32
}

func newWorkerPool(quit <-chan struct{}) *workerPool {
	return &workerPool{work: make(chan func()), quit: quit}
}

// run runs fn on a waiting worker, or on a new one.
func (p *workerPool) run(fn func()) {
	select {
	case p.work <- fn:
	default:
		go p.worker(fn)
	}
}

func (p *workerPool) worker(fn func()) {
	for {
		fn()
		if p.idle.Add(1) > maxIdleWorkers {
			p.idle.Add(-1)
			return
		}
		select {
		case fn = <-p.work:
			p.idle.Add(-1)
		case <-p.quit:
			p.idle.Add(-1)
			return
		}
	}
}
