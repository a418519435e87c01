package rpc

import (
	"bytes"
	"errors"
	"net"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// Tests of the lean engine's stall checks (a client reading its answers
// slowly is not one that reads none) and of what becomes of the items of
// poll answers never written.

// waitingFactory is memstore behind waitingStore: the lean engine runs its
// calls on goroutines of their own, which write their answers themselves
// while the reader reads on (and waits at the reply gate).
func waitingFactory() storeFactory {
	return storeFactory{"waiting", func(t *testing.T) storage.Store {
		return waitingStore{memFactory().open(t)}
	}}
}

// stallStores are the stores whose answers the lean engine writes from
// different goroutines: the reader (mem), a call's goroutine while the
// reader waits at the reply gate (waiting), and the store's syncer, which
// leaves what the socket does not take at once to a goroutine of the
// connection (rocks, --sync=always).
func stallStores() []storeFactory {
	return []storeFactory{memFactory(), waitingFactory(), rocksFactory()}
}

// stallSetup serves f's store on the lean engine over a unix socket (its
// buffers are small and fixed) with a 1 MiB answer budget, a stall
// timeout of a minute and check as ServerConfig.stallCheck, and fills
// queue "big" with 16 items of 512 KiB: an 8 MiB poll answer.
func stallSetup(t *testing.T, f storeFactory, check func(kind string, progress func() uint64, last uint64)) *testBundle {
	t.Helper()
	b := setup(t, bundleOpts{factory: f, transport: "unix", mutate: func(c *ServerConfig) {
		c.Engine = EngineLean
		c.ConnReplyLimitBytes = 1 << 20
		c.ReplyStallTimeout = time.Minute
		c.stallCheck = check
	}})
	c := b.dial()
	ctx := ctxT(t)
	for range 2 {
		_, err := c.Enqueue(ctx, "big", payloads(8, 512<<10))
		require.NoError(t, err)
	}
	return b
}

// slowReader reads a raw connection's answers slowly but steadily: a
// chunk per stall period. A check for a stalled client (stallCheck) may
// look at any moment of a period; the reader answers it as a client
// reading all along would have: it reads on until the socket took more
// bytes than at the check before.
type slowReader struct {
	mu     sync.Mutex
	conn   net.Conn
	buf    []byte
	frames int // whole messages in buf
	want   int // messages to read
	checks map[string]int
	err    error
}

// check is the server's stallCheck.
func (r *slowReader) check(kind string, progress func() uint64, last uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conn == nil {
		return
	}
	r.checks[kind]++
	for progress() == last && r.readLocked() {
	}
}

// read reads one chunk; false once every message is in (or reading
// failed).
func (r *slowReader) read() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.readLocked()
}

func (r *slowReader) readLocked() bool {
	if r.frames >= r.want || r.err != nil {
		return false
	}
	const chunk = 64 << 10
	start := len(r.buf)
	r.buf = slices.Grow(r.buf, chunk)[:start+chunk]
	_ = r.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := r.conn.Read(r.buf[start:])
	r.buf = r.buf[:start+n]
	if err != nil {
		r.err = err
		return false
	}
	r.frames = 0
	for b := r.buf; ; r.frames++ {
		n, known := frameLen(b, DefaultMaxReplyBytes)
		if !known || uint64(len(b)) < n {
			break
		}
		b = b[n:]
	}
	return r.frames < r.want
}

// pollMsg is the framed Call of a poll (question qid on the bootstrap
// answer) of max items of queue, under a 60 s lease.
func pollMsg(t *testing.T, qid uint32, queue string, max uint32) []byte {
	return pipelinedCall(t, qid, 0, 1 /* poll */, pollParamsRaw(queue, max))
}

// TestLean_SlowReaderOfALargeAnswerIsNotCutOff: a client that reads an
// 8 MiB answer a little in each ReplyStallTimeout takes dozens of stall
// periods to read it; the socket takes some of it in each, so neither the
// write watchdog nor the reply gate cuts the client off.
func TestLean_SlowReaderOfALargeAnswerIsNotCutOff(t *testing.T) {
	t.Parallel()
	for _, f := range stallStores() {
		t.Run("store="+f.name, func(t *testing.T) {
			t.Parallel()
			r := &slowReader{want: 2, checks: make(map[string]int)}
			b := stallSetup(t, f, r.check)
			conn := rawDial(t, b)
			raw := &rawRPC{t: t, conn: conn, dec: capnp.NewDecoder(conn)}
			_, err := conn.Write(bootstrapMsg(t))
			require.NoError(t, err)
			raw.recvReturn(0)
			_, err = conn.Write(pollMsg(t, 1, "big", 16))
			require.NoError(t, err)
			r.mu.Lock()
			r.conn = conn
			r.mu.Unlock()
			require.True(t, r.read(), "the answer's first chunk")
			// A call while the answer is being written: with the waiting
			// store the reader takes it and then waits at the reply gate
			// (the answer is over its budget until written).
			_, err = conn.Write(pipelinedCall(t, 2, 0, 15 /* nodeInfo */, nil))
			require.NoError(t, err)

			periods := 0
			rpctest.Eventually(t, 2*time.Minute, func() bool {
				b.clock.Add(time.Minute) // a stall period passes...
				periods++
				return !r.read() // ...in which the client reads a chunk
			})
			r.mu.Lock()
			defer r.mu.Unlock()
			t.Logf("%d stall periods, checks %v, %d bytes", periods, r.checks, len(r.buf))
			require.NoError(t, r.err, "the connection of a client reading steadily was cut off")
			require.Greater(t, r.checks["watchdog"], 2, "the watchdog looked while the answer was being written")
			if f.name == "waiting" {
				require.Greater(t, r.checks["reply gate"], 2, "the reader waited at the reply gate while the answer was being written")
			}
			dec := capnp.NewDecoder(bytes.NewReader(r.buf))
			for qid := uint32(1); qid <= 2; qid++ {
				msg, err := dec.Decode()
				require.NoError(t, err)
				m, err := rpccp.ReadRootMessage(msg)
				require.NoError(t, err)
				ret, err := m.Return()
				require.NoError(t, err)
				require.Equal(t, qid, ret.AnswerId())
				require.Equal(t, rpccp.Return_Which_results, ret.Which())
				if qid == 1 {
					p, err := ret.Results()
					require.NoError(t, err)
					content, err := p.Content()
					require.NoError(t, err)
					items, err := schema.Queue_poll_Results(content.Struct()).Items()
					require.NoError(t, err)
					require.Equal(t, 16, items.Len())
				}
			}
			// The connection still serves.
			_, err = conn.Write(pipelinedCall(t, 3, 0, 15 /* nodeInfo */, nil))
			require.NoError(t, err)
			raw.recvReturn(3)
		})
	}
}

// TestLean_ReaderOfNothingIsCutOff: a client that reads none of a large
// answer is still cut off once the socket has taken none of it for a
// ReplyStallTimeout.
func TestLean_ReaderOfNothingIsCutOff(t *testing.T) {
	t.Parallel()
	for _, f := range stallStores() {
		t.Run("store="+f.name, func(t *testing.T) {
			t.Parallel()
			b := stallSetup(t, f, nil)
			conn := rawDial(t, b)
			_, err := conn.Write(slices.Concat(bootstrapMsg(t), pollMsg(t, 1, "big", 16)))
			require.NoError(t, err)
			rpctest.Eventually(t, 10*time.Second, func() bool { return peekLen(t, conn) > 0 }, "no answer came")
			_, err = conn.Write(pipelinedCall(t, 2, 0, 15 /* nodeInfo */, nil))
			require.NoError(t, err)
			// Advanced repeatedly: a check may arm its timer after an
			// earlier advance.
			rpctest.Eventually(t, 30*time.Second, func() bool {
				b.clock.Add(time.Minute)
				return b.srv.Metrics().ConnsOpen == 1 // only the producer is left
			})
			requireClosedByServer(t, conn)
		})
	}
}

// peekLen is how many bytes conn (a unix socket) holds unread, up to
// 64 KiB, read without taking them.
func peekLen(t *testing.T, conn net.Conn) int {
	t.Helper()
	rc, err := conn.(*net.UnixConn).SyscallConn()
	require.NoError(t, err)
	buf := make([]byte, 64<<10)
	var n int
	require.NoError(t, rc.Read(func(fd uintptr) bool {
		n, _, err = syscall.Recvfrom(int(fd), buf, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		return true
	}))
	if errors.Is(err, syscall.EAGAIN) {
		return 0
	}
	require.NoError(t, err)
	return n
}

// TestLean_ItemsOfPollAnswersNotWrittenAreGivenBack: a client that reads
// nothing polls an answer too large for the socket buffers ("big"), then
// another ("small") whose answer waits behind it, not a byte of it
// written. When the connection ends (the server stops, or the client
// goes), the small poll's items are ready again at once, long before
// their lease would end, their claim taken back; the big
// answer, partly written, is the client's, and its items stay leased.
func TestLean_ItemsOfPollAnswersNotWrittenAreGivenBack(t *testing.T) {
	t.Parallel()
	for _, f := range stallStores() {
		for _, end := range []string{"stop", "client-closes"} {
			t.Run("store="+f.name+",end="+end, func(t *testing.T) {
				t.Parallel()
				// Stop waits up to ReplyStallTimeout for a client to read
				// the answers owed to it (shutdown_answers_test.go): this
				// one never reads, so the test moves the clock past it.
				b := setup(t, bundleOpts{factory: f, transport: "unix", mutate: func(c *ServerConfig) {
					c.Engine = EngineLean
					c.ReplyStallTimeout = time.Second
				}})
				c := b.dial()
				ctx := ctxT(t)
				_, err := c.Enqueue(ctx, "big", payloads(4, 512<<10))
				require.NoError(t, err)
				_, err = c.Enqueue(ctx, "small", payloads(3, 8))
				require.NoError(t, err)

				conn := rawDial(t, b)
				bootAndBig := slices.Concat(bootstrapMsg(t), pollMsg(t, 1, "big", 4))
				small := pollMsg(t, 2, "small", 3)
				// The polls run apart: the small one is sent once the big
				// answer fills the socket. Whoever writes that answer (the
				// reader with mem, a call's goroutine, the syncer) leaves
				// what the socket does not take to a goroutine of the
				// connection, so the reader reads on (the small poll runs)
				// though the client reads nothing.
				_, err = conn.Write(bootAndBig)
				require.NoError(t, err)
				// Bytes past the bootstrap's answer: the big answer is
				// being written (and waits for the socket).
				rpctest.Eventually(t, 10*time.Second, func() bool { return peekLen(t, conn) > 1<<10 }, "the big answer was not written")
				_, err = conn.Write(small)
				require.NoError(t, err)
				rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Ops[OpPoll].Count == 2 },
					"the reader read no more once the big answer filled the socket")

				switch end {
				case "stop":
					stopped := make(chan struct{})
					go func() {
						b.srv.Stop()
						close(stopped)
					}()
					rpctest.Eventually(t, 30*time.Second, func() bool {
						select {
						case <-stopped:
							return true
						default:
							b.clock.Add(100 * time.Millisecond)
							return false
						}
					}, "Stop did not return")
				case "client-closes":
					require.NoError(t, conn.Close())
					rpctest.Eventually(t, 10*time.Second, func() bool {
						st, err := b.store.Stats(ctx, storage.StatsParams{Queue: "small", Now: b.clock.Now()})
						return err == nil && len(st) == 1 && st[0].Ready == 3
					}, "the small poll's items were not given back")
				}
				// Another consumer gets the small poll's items at once (the
				// clock has not moved: their 60 s lease would still hold).
				pr, err := b.store.Poll(ctx, storage.PollParams{Queue: "small", Max: 10, Lease: time.Minute, Now: b.clock.Now()})
				require.NoError(t, err)
				require.Len(t, pr.Items, 3, "the items of a poll answer never written stay leased")
				for _, it := range pr.Items {
					require.EqualValues(t, 1, it.Attempts, "the claim of the answer never written is taken back, not counted")
				}
				st, err := b.store.Stats(ctx, storage.StatsParams{Queue: "big", Now: b.clock.Now()})
				require.NoError(t, err)
				require.EqualValues(t, 4, st[0].Inflight, "the items of a partly written answer are the client's")
			})
		}
	}
}
