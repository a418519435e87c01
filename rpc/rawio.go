package rpc

import (
	"io"
	"net"
	"syscall"
	"unsafe"
)

// rawIO reads and writes a TCP or unix socket of the lean engine with raw
// system calls on its non-blocking descriptor, waiting for readiness
// through the runtime's poller (syscall.RawConn). It skips the runtime's
// system-call bookkeeping (entersyscall), which on a mostly idle process
// wakes the sysmon thread at every read and write: a futex wake and a
// context switch per call (BenchmarkRPC_NodeInfoRoundTrip, rpc/doc.go).
// The descriptor is non-blocking, so no call here blocks the thread.
//
// It cannot skip the read that finds nothing after a reply was written
// (waiting for readiness first): RawConn.Read resets the poller's
// readiness before its first attempt, so data that arrived meanwhile
// would never be seen.
type rawIO struct {
	rc syscall.RawConn
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
	return &rawIO{rc: rc}
}

func (r *rawIO) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	var n int
	var errno syscall.Errno
	err := r.rc.Read(func(fd uintptr) bool {
		for {
			m, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
			switch e {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false
			}
			n, errno = int(m), e
			return true
		}
	})
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

// writeNow writes what the socket takes of p without waiting for it to
// become writable: a short count and no error when it is full.
func (r *rawIO) writeNow(p []byte) (int, error) { return r.write(p, false) }

func (r *rawIO) Write(p []byte) (int, error) { return r.write(p, true) }

// write writes p, waiting for the socket to become writable when it is
// full (wait) or returning what it wrote so far.
func (r *rawIO) write(p []byte, wait bool) (int, error) {
	written := 0
	var errno syscall.Errno
	err := r.rc.Write(func(fd uintptr) bool {
		for written < len(p) {
			m, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&p[written])), uintptr(len(p)-written))
			switch e {
			case 0:
				written += int(m)
			case syscall.EINTR:
			case syscall.EAGAIN:
				return !wait // false: wait until writable
			default:
				errno = e
				return true
			}
		}
		return true
	})
	if err == nil && errno != 0 {
		err = errno
	}
	return written, err
}
