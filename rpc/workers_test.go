package rpc

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
)

// The pool runs every function even when all its workers are busy, keeps
// at most maxIdleWorkers waiting, hands the next function to one of them
// instead of starting a goroutine, and lets them all go at quit.
func TestWorkerPool(t *testing.T) {
	quit := make(chan struct{})
	p := newWorkerPool(quit)
	const n = maxIdleWorkers + 8
	release := make(chan struct{})
	var started, done sync.WaitGroup
	started.Add(n)
	done.Add(n)
	for range n {
		p.run(func() {
			started.Done()
			<-release
			done.Done()
		})
	}
	started.Wait() // all n at once: a busy pool starts more workers
	close(release)
	done.Wait()
	rpctest.Eventually(t, 10*time.Second, func() bool { return p.idle.Load() == maxIdleWorkers },
		"%d workers waiting, want %d", p.idle.Load(), maxIdleWorkers)

	// The next function runs on a waiting worker. (A worker counted idle
	// may not be receiving yet; then run starts a goroutine, which is
	// correct too: try again.)
	reused := false
	for try := 0; try < 100 && !reused; try++ {
		hold := make(chan struct{})
		ran := make(chan struct{})
		p.run(func() { close(ran); <-hold })
		<-ran
		reused = p.idle.Load() == maxIdleWorkers-1
		close(hold)
		rpctest.Eventually(t, 10*time.Second, func() bool { return p.idle.Load() == maxIdleWorkers })
	}
	require.True(t, reused, "no function ran on a waiting worker")

	close(quit)
	rpctest.Eventually(t, 10*time.Second, func() bool { return p.idle.Load() == 0 }, "workers still waiting after quit")
}
