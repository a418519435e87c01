package rpc

import (
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"unsafe"
)

// rawIO reads and writes a TCP or unix socket of the lean engine with raw
// system calls on its non-blocking descriptor, waiting for readiness
// through the runtime's poller (syscall.RawConn). It skips the runtime's
// system-call bookkeeping (entersyscall), which on a mostly idle process
// wakes the sysmon thread at every read and write: a futex wake and a
// context switch per call (BenchmarkRPC_NodeInfoRoundTrip, rpc/doc.go).
// Go's calls here were measured again on a busy host, where a lone
// round trip had seemed cheaper with them: that gain was within the
// host's drift, and beside Redis they did no row any good and cost
// produce-b1 or produce-b100 an eighth to a third (docs/BENCHMARKS.md,
// "The busy host's lead, followed up").
// The descriptor is non-blocking, so no call here blocks the thread.
//
// It cannot skip the read that finds nothing after a reply was written
// (waiting for readiness first): RawConn.Read resets the poller's
// readiness before its first attempt, so data that arrived meanwhile
// would never be seen. (A reader looping inside one RawConn.Read, with
// TCP_INQ to tell a FIN that came with the last read, can skip it; it
// saved less than the machine's drift: docs/BENCHMARKS.md, "A read
// session that skips the empty read".)
type rawIO struct {
	rc syscall.RawConn
	// The read and the write in progress, and the functions RawConn runs
	// for them, made once: a closure per call cost two allocations per
	// RPC call. One goroutine reads at a time, and one writes.
	rd, wr          rawOp
	readFn, writeFn func(fd uintptr) bool
	// sent, when set (the node's connections), counts the bytes the
	// socket took, as each write system call returns: what the stall
	// checks judge a slow reader by (leanConn.sent). nil: not counted.
	sent *atomic.Uint64
}

// rawOp is one read or write: its buffer, progress and outcome.
type rawOp struct {
	p     []byte
	n     int
	errno syscall.Errno
	wait  bool // write: wait for the socket to become writable
}

// newRawIO returns a rawIO for conn, or nil when conn is not a plain TCP or
// unix socket (TLS, a pipe).
func newRawIO(conn net.Conn) *rawIO {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil
	}
	switch conn.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	r := &rawIO{rc: rc}
	r.readFn = r.read
	r.writeFn = r.write
	return r
}

func (r *rawIO) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.rd = rawOp{p: p}
	err := r.rc.Read(r.readFn)
	n, errno := r.rd.n, r.rd.errno
	r.rd.p = nil
	switch {
	case err != nil:
		return 0, err
	case errno != 0:
		return 0, errno
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// read is RawConn.Read's function for r.rd: false when the socket has
// nothing yet (RawConn then waits for it).
func (r *rawIO) read(fd uintptr) bool {
	p := r.rd.p
	for {
		m, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		switch e {
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		r.rd.n, r.rd.errno = int(m), e
		return true
	}
}

// writeNow writes what the socket takes of p without waiting for it to
// become writable: a short count and no error when it is full.
func (r *rawIO) writeNow(p []byte) (int, error) { return r.writeOp(p, false) }

func (r *rawIO) Write(p []byte) (int, error) { return r.writeOp(p, true) }

// writeOp writes p, waiting for the socket to become writable when it
// is full (wait) or returning what it wrote so far.
func (r *rawIO) writeOp(p []byte, wait bool) (int, error) {
	r.wr = rawOp{p: p, wait: wait}
	err := r.rc.Write(r.writeFn)
	n, errno := r.wr.n, r.wr.errno
	r.wr.p = nil
	if err == nil && errno != 0 {
		err = errno
	}
	return n, err
}

// write is RawConn.Write's function for r.wr: false to wait until the
// socket is writable.
func (r *rawIO) write(fd uintptr) bool {
	w := &r.wr
	for w.n < len(w.p) {
		m, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&w.p[w.n])), uintptr(len(w.p)-w.n))
		switch e {
		case 0:
			w.n += int(m)
			if r.sent != nil {
				r.sent.Add(uint64(m))
			}
		case syscall.EINTR:
		case syscall.EAGAIN:
			return !w.wait
		default:
			w.errno = e
			return true
		}
	}
	return true
}
