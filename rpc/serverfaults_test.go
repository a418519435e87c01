package rpc

import (
	"context"
	"encoding/binary"
	"net"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/schema"
)

// Tests of the RPC server's limits and lifecycle against hostile or stuck peers.

// pollParamsRaw fills a poll's params: max items of queue, a 60 s lease,
// no wait.
func pollParamsRaw(queue string, max uint32) func(rpccp.Payload) error {
	return func(params rpccp.Payload) error {
		p, err := schema.NewQueue_poll_Params(params.Segment())
		if err != nil {
			return err
		}
		if err := p.SetQueue(queue); err != nil {
			return err
		}
		p.SetMax(max)
		p.SetLeaseMs(60_000)
		return params.SetContent(p.ToPtr())
	}
}

// rawDial opens a raw connection to b's server (tcp or unix), closed at
// cleanup.
func rawDial(t *testing.T, b *testBundle) net.Conn {
	t.Helper()
	network, addr := "tcp", b.addr
	if p, ok := strings.CutPrefix(b.addr, "unix:"); ok {
		network, addr = "unix", p
	}
	conn, err := net.Dial(network, addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// maxSegHeader is the first word of a frame of 513 segments: the most
// go-capnp's Decoder accepts (it refuses a segment count above 512+1 only).
func maxSegHeader() []byte {
	var hdr [8]byte
	binary.LittleEndian.PutUint32(hdr[:4], 512) // segment count - 1
	binary.LittleEndian.PutUint32(hdr[4:], 1)   // first segment: one word
	return hdr[:]
}

// TestServer_ReplyNotHeldByFirstWordOfA513SegmentFrame: as
// TestLean_ReplyNotHeldByPartialFrame, with the next frame's header cut
// after its first word, and that frame of 513 segments, which the Decoder
// accepts (frameLen takes it for one the Decoder refuses at once).
func TestServer_ReplyNotHeldByFirstWordOfA513SegmentFrame(t *testing.T) {
	t.Parallel()
	_, conn, r := leanCallThenPart(t, memFactory(), maxSegHeader())

	require.NoError(t, conn.SetReadDeadline(time.Now().Add(3*time.Second)))
	msg, err := r.dec.Decode()
	require.NoError(t, err, "the answer to question 1 is held until the rest of a 513-segment header arrives")
	m, err := rpccp.ReadRootMessage(msg)
	require.NoError(t, err)
	require.Equal(t, rpccp.Message_Which_return, m.Which())
}

// TestServer_PartialHeaderDoesNotHoldOtherConnectionsFsyncs: on RocksDB
// with sync=always, the lean reader holds the store's fsyncs while it
// hands over calls that came in one read (HoldSync). A connection whose
// read ends with the first word of a 513-segment frame must not keep that
// hold while its reader waits for the rest: every other connection's
// durable enqueue would wait for an fsync that never starts (and Stop for
// those calls).
func TestServer_PartialHeaderDoesNotHoldOtherConnectionsFsyncs(t *testing.T) {
	t.Parallel()
	b, _, _ := leanCallThenPart(t, rocksFactory(), maxSegHeader())
	time.Sleep(300 * time.Millisecond) // let the node's reader take the write

	other := b.dial()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := other.Enqueue(ctx, "q", payloads(1, 8))
	require.NoError(t, err, "another connection's enqueue never became durable: the fsync is held by a reader waiting for a header")
}

// TestServer_StopNotHeldByConnectionEndingWithUnreadAnswers: a connection
// that sends undecodable bytes after a call, and never reads, ends with
// its answer (and the Abort) still to write. Stop must still close it:
// here with ConnReplyLimitBytes unbounded (no stall watchdog), Stop must
// not wait forever for that connection's goroutine.
func TestServer_StopNotHeldByConnectionEndingWithUnreadAnswers(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{factory: memFactory(), transport: "unix", mutate: func(c *ServerConfig) {
		c.Engine = EngineLean
		c.ConnReplyLimitBytes = -1 // documented: unbounded
	}})
	c := b.dial()
	ctx := ctxT(t)
	_, err := c.Enqueue(ctx, "big", payloads(8, 512<<10)) // a 4 MiB poll answer
	require.NoError(t, err)

	conn := rawDial(t, b)
	_, err = conn.Write(bootstrapMsg(t))
	require.NoError(t, err)
	garbage := []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0} // a segment count the Decoder refuses
	_, err = conn.Write(slices.Concat(pipelinedCall(t, 1, 0, 1 /* poll */, pollParamsRaw("big", 8)), garbage))
	require.NoError(t, err)
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Ops[OpPoll].Count == 1 })
	time.Sleep(200 * time.Millisecond) // the reader reaches the garbage and ends the connection

	stopped := make(chan struct{})
	go func() {
		b.srv.Stop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("Stop did not return: a connection that ended with unwritten answers is never closed")
	}
}

// TestServer_ListenKeepsSocketOfLiveServerWithFullBacklog: a unix socket
// whose server is alive but has not accepted its last connections (a full
// backlog: connect says EAGAIN) is not stale. Listen must refuse it as a
// live server's, not delete it and take the path over.
func TestServer_ListenKeepsSocketOfLiveServerWithFullBacklog(t *testing.T) {
	t.Parallel()
	dir, err := shortTempDir(t)
	require.NoError(t, err)
	path := filepath.Join(dir, "busy.sock")
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	require.NoError(t, err)
	defer syscall.Close(fd)
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}))
	require.NoError(t, syscall.Listen(fd, 0)) // a busy server: its backlog fills at once
	var pending []net.Conn
	defer func() {
		for _, c := range pending {
			_ = c.Close()
		}
	}()
	for range 4 {
		c, err := net.DialTimeout("unix", path, time.Second)
		if err != nil {
			break
		}
		pending = append(pending, c)
	}
	require.NotEmpty(t, pending, "the live server took no connection at all")

	ln, err := Listen("unix:" + path)
	if err == nil {
		_ = ln.Close()
	}
	require.ErrorContains(t, err, "live server", "the socket of a live (busy) server was removed and its path taken over")
}

// TestServer_HeaderAloneDoesNotMakeTheNodeAllocateTheMessage: the node's
// incoming bytes are bounded by MaxInflightBytes ("over it the server
// reads no more calls"). A peer that sends only the 8-byte header of a
// 60 MiB message (under MaxMessageBytes) must not make the node allocate
// 60 MiB for it before any of it arrived or was admitted: 16 such
// connections would hold ~1 GiB against a 1 MiB budget. (The client's
// codec reads through a frameReader for exactly this; the node's readers
// give the header to capnp.Decoder, which allocates the whole message.)
func TestServer_HeaderAloneDoesNotMakeTheNodeAllocateTheMessage(t *testing.T) {
	b := setup(t, bundleOpts{factory: memFactory(), mutate: func(c *ServerConfig) {
		c.MaxInflightBytes = 1 << 20
	}})
	const conns, claimed = 16, 60 << 20
	var hdr [8]byte
	binary.LittleEndian.PutUint32(hdr[4:], claimed/8) // one segment of 60 MiB
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range conns {
		conn := rawConn(t, b)
		_, err := conn.Write(bootstrapMsg(t))
		require.NoError(t, err)
		_, err = conn.Write(hdr[:])
		require.NoError(t, err)
	}
	time.Sleep(time.Second) // the node's readers take the headers
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap grew by %d MiB for %d headers of %d MiB messages", grew>>20, conns, claimed>>20)
	require.Less(t, grew, int64(256<<20), "the node allocated %d MiB for %d message headers (MaxInflightBytes 1 MiB)", grew>>20, conns)
}

// TestServer_OpMetricsSnapshotIsConsistent: a snapshot's latency buckets
// are the histogram of the calls it counts. /metrics exports Count as the
// histogram's count (its +Inf bucket) and the buckets cumulated: buckets
// summing to more than Count make the le="60" bucket larger than +Inf, an
// invalid Prometheus histogram. Calls finish while scrapes run.
func TestServer_OpMetricsSnapshotIsConsistent(t *testing.T) {
	t.Parallel()
	var c opCounters
	stop := make(chan struct{})
	done := make(chan struct{})
	for range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			for {
				select {
				case <-stop:
					return
				default:
				}
				c.observe(time.Millisecond, false)
			}
		}()
	}
	defer func() {
		close(stop)
		<-done
		<-done
	}()
	deadline := time.Now().Add(2 * time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		m := c.snapshot(OpPoll)
		var sum uint64
		for _, n := range m.Buckets {
			sum += n
		}
		require.Equal(t, m.Count, sum, "snapshot %d: Count %d but the buckets hold %d calls", i, m.Count, sum)
	}
}
