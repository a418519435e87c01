package rpc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// Review (session 70): the Go client (lean engine) against a misbehaving
// or hostile node. hostileNode is a real TCP listener on 127.0.0.1 that
// answers the bootstrap properly and then hands every Call it reads to the
// test, which writes whatever reply (or none) it likes.

type hnCall struct {
	qid    uint32
	method uint16
	max    uint32 // a poll's max
}

type hnConn struct {
	net.Conn
	wmu   sync.Mutex
	calls chan hnCall
	fins  chan uint32
	ended chan struct{} // the read loop ended
}

func (c *hnConn) send(t *testing.T, b ...[]byte) {
	t.Helper()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.Write(bytes.Join(b, nil))
	require.NoError(t, err)
}

// call waits for the next Call the client sends.
func (c *hnConn) call(t *testing.T) hnCall {
	t.Helper()
	select {
	case call := <-c.calls:
		return call
	case <-time.After(10 * time.Second):
		t.Fatal("the client sent no call")
		return hnCall{}
	}
}

type hostileNode struct {
	addr  string
	ln    net.Listener
	conns chan *hnConn
	wg    sync.WaitGroup
	mu    sync.Mutex
	all   []net.Conn
	boot  []byte // the bootstrap's Return
}

// startHostileNode listens on 127.0.0.1; boot: answer the bootstrap (else
// accept and never answer anything).
func startHostileNode(t *testing.T, boot bool) *hostileNode {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	n := &hostileNode{addr: ln.Addr().String(), ln: ln, conns: make(chan *hnConn, 8), boot: bootstrapReturnBytes(t, 0)}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			n.mu.Lock()
			n.all = append(n.all, conn)
			n.mu.Unlock()
			hc := &hnConn{Conn: conn, calls: make(chan hnCall, 4096), fins: make(chan uint32, 4096), ended: make(chan struct{})}
			if !boot {
				n.conns <- hc
				continue
			}
			n.wg.Add(1)
			go func() {
				defer n.wg.Done()
				defer close(hc.ended)
				n.serve(hc)
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		n.mu.Lock()
		for _, c := range n.all {
			_ = c.Close()
		}
		n.mu.Unlock()
		n.wg.Wait()
	})
	return n
}

func (n *hostileNode) serve(hc *hnConn) {
	dec := capnp.NewDecoder(hc)
	msg, err := dec.Decode() // the Bootstrap
	if err != nil {
		return
	}
	msg.Release()
	hc.wmu.Lock()
	_, err = hc.Write(n.boot)
	hc.wmu.Unlock()
	if err != nil {
		return
	}
	n.conns <- hc
	for {
		msg, err := dec.Decode()
		if err != nil {
			return
		}
		m, err := rpccp.ReadRootMessage(msg)
		if err != nil {
			msg.Release()
			return
		}
		switch m.Which() {
		case rpccp.Message_Which_call:
			c, _ := m.Call()
			call := hnCall{qid: c.QuestionId(), method: c.MethodId()}
			if call.method == mPoll.id {
				if p, err := c.Params(); err == nil {
					if ct, err := p.Content(); err == nil {
						call.max = schema.Queue_poll_Params(ct.Struct()).Max()
					}
				}
			}
			hc.calls <- call
		case rpccp.Message_Which_finish:
			f, _ := m.Finish()
			if f.QuestionId() == 0 {
				break // the bootstrap's
			}
			select {
			case hc.fins <- f.QuestionId():
			default:
			}
		}
		msg.Release()
	}
}

// conn waits for the client's connection.
func (n *hostileNode) conn(t *testing.T) *hnConn {
	t.Helper()
	select {
	case c := <-n.conns:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no connection")
		return nil
	}
}

// resultsBytes is a Return of qid whose results content build makes.
func resultsBytes(t testing.TB, qid uint32, build func(seg *capnp.Segment) (capnp.Ptr, error)) []byte {
	return returnBytes(t, qid, func(p rpccp.Payload) error {
		ptr, err := build(p.Segment())
		if err != nil {
			return err
		}
		return p.SetContent(ptr)
	})
}

func hnID(i int) []byte {
	id := make([]byte, 16)
	id[0], id[15] = byte(i), 0xee
	return id
}

// pollResultsBytes answers poll qid with n well-formed items under one lease.
func pollResultsBytes(t testing.TB, qid uint32, n int) []byte {
	return resultsBytes(t, qid, func(seg *capnp.Segment) (capnp.Ptr, error) {
		r, err := schema.NewQueue_poll_Results(seg)
		if err != nil {
			return capnp.Ptr{}, err
		}
		if err := r.SetLease(bytes.Repeat([]byte{7}, 16)); err != nil {
			return capnp.Ptr{}, err
		}
		r.SetExpiresAt(uint64(testStart.UnixMilli()) + 60000)
		items, err := r.NewItems(int32(n))
		if err != nil {
			return capnp.Ptr{}, err
		}
		for i := 0; i < n; i++ {
			it := items.At(i)
			if err := it.SetId(hnID(i)); err != nil {
				return capnp.Ptr{}, err
			}
			if err := it.SetQueue("q"); err != nil {
				return capnp.Ptr{}, err
			}
			if err := it.SetPayload([]byte(fmt.Sprintf("p%d", i))); err != nil {
				return capnp.Ptr{}, err
			}
		}
		return r.ToPtr(), nil
	})
}

func dialHostile(t *testing.T, n *hostileNode, opts ClientOptions) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, n.addr, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NotNil(t, c.lean)
	return c
}

// zeroSizeList is a composite list of n elements of zero words: a few
// bytes on the wire, n elements to a reader.
func zeroSizeList(seg *capnp.Segment, n int32) (capnp.List, error) {
	return capnp.NewCompositeList(seg, capnp.ObjectSize{}, n)
}

// ---------------------------------------------------------------------
// Findings.

// TestHostileNode_EnqueueResultCountNotChecked (found by review,
// session 70): Enqueue promises one outcome per item, in input order, and
// refuses an answer with another count (ErrCorrupt), as Ack and Nack do.
// It did not: a node that answered two items with one result was
// reported as success, and a caller that indexes res[i] for each item
// panicked, or lost track of an item it believed enqueued.
func TestHostileNode_EnqueueResultCountNotChecked(t *testing.T) {
	n := startHostileNode(t, true)
	c := dialHostile(t, n, ClientOptions{})
	hc := n.conn(t)
	type out struct {
		res []storage.EnqueueResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := c.Enqueue(ctxT(t), "q", payloads(2, 8))
		done <- out{res, err}
	}()
	call := hc.call(t)
	require.Equal(t, mEnqueue.id, call.method)
	hc.send(t, resultsBytes(t, call.qid, func(seg *capnp.Segment) (capnp.Ptr, error) {
		r, err := schema.NewQueue_enqueue_Results(seg)
		if err != nil {
			return capnp.Ptr{}, err
		}
		l, err := r.NewResults(1) // one result for two items
		if err != nil {
			return capnp.Ptr{}, err
		}
		l.At(0).SetCode(schema.ResultCode_ok)
		return r.ToPtr(), l.At(0).SetId(hnID(1))
	}))
	o := <-done
	require.Error(t, o.err, "Enqueue of 2 items accepted an answer with %d results as success", len(o.res))
	require.ErrorIs(t, o.err, storage.ErrCorrupt)
}

// TestHostileNode_PollMoreItemsThanMax (found by review, session 70): a
// poll answer listing more items than the max asked for is refused
// (ErrCorrupt). It was returned as success, and the Consumer, which
// reserves its MaxItems budget by the max it asks for, ran the handler
// past MaxItems.
func TestHostileNode_PollMoreItemsThanMax(t *testing.T) {
	n := startHostileNode(t, true)
	c := dialHostile(t, n, ClientOptions{})
	hc := n.conn(t)
	type out struct {
		res storage.PollResult
		err error
	}
	done := make(chan out, 1)
	go func() {
		res, err := c.Poll(ctxT(t), "q", 1, time.Minute, 0)
		done <- out{res, err}
	}()
	call := hc.call(t)
	require.Equal(t, mPoll.id, call.method)
	require.EqualValues(t, 1, call.max)
	hc.send(t, pollResultsBytes(t, call.qid, 3))
	o := <-done
	require.Error(t, o.err, "Poll(max=1) returned %d items as success", len(o.res.Items))
	require.ErrorIs(t, o.err, storage.ErrCorrupt)
}

// TestHostileNode_ZeroSizeListAmplification (found by review, session
// 70; the traversal limit now follows the message's size: traversalLimit):
// the client sizes its result slices by a list's declared length before it
// reads any element (Stats client.go:718, DeadList :859, Enqueue :467;
// returnPollGiveBack's ids in lean_write.go:503). A composite list of
// zero-word elements declares up to traversal-limit/8 elements in a few
// bytes: here a Return of ~100 bytes with maxReplyBytes 1 MiB makes Stats
// allocate tens of MiB and return half a million empty QueueStats as
// success. At the default limit (1 GiB, traversal 4 GiB: 2^29 elements)
// the same ~100 bytes crash the client (see ...CrashesClient below).
func TestHostileNode_ZeroSizeListAmplification(t *testing.T) {
	n := startHostileNode(t, true)
	const readLimit = 1 << 20
	c := dialHostile(t, n, ClientOptions{maxReplyBytes: readLimit})
	hc := n.conn(t)
	count := int32(4*readLimit/8 - 64) // within the traversal limit
	type out struct {
		res []storage.QueueStats
		err error
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	done := make(chan out, 1)
	go func() {
		res, err := c.Stats(ctxT(t), "")
		done <- out{res, err}
	}()
	call := hc.call(t)
	msg := resultsBytes(t, call.qid, func(seg *capnp.Segment) (capnp.Ptr, error) {
		r, err := schema.NewQueue_stats_Results(seg)
		if err != nil {
			return capnp.Ptr{}, err
		}
		l, err := zeroSizeList(seg, count)
		if err != nil {
			return capnp.Ptr{}, err
		}
		return r.ToPtr(), r.SetStats(schema.QueueStats_List(l))
	})
	hc.send(t, msg)
	o := <-done
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("reply of %d bytes: Stats err=%v, %d entries, %d MiB allocated (sizeof QueueStats %d)",
		len(msg), o.err, len(o.res), alloc>>20, unsafe.Sizeof(storage.QueueStats{}))
	require.Less(t, alloc, uint64(16<<20),
		"a %d-byte reply made the client allocate %d MiB (x%d of the reply limit; at the default 1 GiB limit: ~%d GiB)",
		len(msg), alloc>>20, alloc/readLimit, (uint64(1<<29)*uint64(unsafe.Sizeof(storage.QueueStats{})))>>30)
	require.Error(t, o.err, "Stats returned %d zero-size entries as success", len(o.res))
}

const oomChildEnv = "LEASEQ_HOSTILE_OOM_CHILD"

// TestHostileNode_ZeroSizeListCrashesClient (found by review, session 70): at the
// default reply limit, one ~100-byte DeadList answer declaring 2^29
// zero-size items makes the client call make([]storage.DeadItem, 2^29)
// (client.go:859) before it reads the first one: over 100 GiB, and the Go
// runtime dies with "fatal error: runtime: out of memory" (not a
// recoverable panic: the whole client process goes). The child process
// runs the call; it must end with an error, not die.
func TestHostileNode_ZeroSizeListCrashesClient(t *testing.T) {
	if os.Getenv(oomChildEnv) != "" {
		oomChild(t)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestHostileNode_ZeroSizeListCrashesClient$", "-test.count=1")
	cmd.Env = append(os.Environ(), oomChildEnv+"=1", "LEASEQ_TEST_ENGINES="+EngineLean)
	var outb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &outb, &outb
	err := cmd.Run()
	out := outb.String()
	if len(out) > 2000 {
		out = out[:2000]
	}
	require.NoError(t, err, "the client process died on one small DeadList answer:\n%s", out)
}

func oomChild(t *testing.T) {
	n := startHostileNode(t, true)
	c := dialHostile(t, n, ClientOptions{}) // the default reply limit
	hc := n.conn(t)
	done := make(chan error, 1)
	go func() {
		_, err := c.DeadList(ctxT(t), storage.DeadListParams{Queue: "q"})
		done <- err
	}()
	call := hc.call(t)
	hc.send(t, resultsBytes(t, call.qid, func(seg *capnp.Segment) (capnp.Ptr, error) {
		r, err := schema.NewQueue_deadList_Results(seg)
		if err != nil {
			return capnp.Ptr{}, err
		}
		l, err := zeroSizeList(seg, 1<<29-64)
		if err != nil {
			return capnp.Ptr{}, err
		}
		return r.ToPtr(), r.SetItems(schema.DeadItem_List(l))
	}))
	err := <-done
	require.Error(t, err) // a zero-size item has no 16-byte id
	t.Logf("DeadList: %v", err)
}

// verifyNoLeaks checks, after every later cleanup (the node's, the
// client's), that no goroutine started since is left.
func verifyNoLeaks(t *testing.T) {
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}

// ---------------------------------------------------------------------
// Probes that pass (kept as regression tests).

// TestHostileNode_NeverAnswers: a node that accepts and never
// answers: Dial honours its ctx; a node that bootstraps then never
// answers: each call honours its ctx, a call without a deadline ends
// when Close is called, Close returns promptly, nothing leaks.
func TestHostileNode_NeverAnswers(t *testing.T) {
	verifyNoLeaks(t)
	silent := startHostileNode(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err := Dial(ctx, silent.addr, ClientOptions{})
	cancel()
	require.Error(t, err)

	n := startHostileNode(t, true)
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	c, err := Dial(ctx, n.addr, ClientOptions{})
	cancel()
	require.NoError(t, err)
	hc := n.conn(t)
	// Calls with short deadlines, some reading, some waiting.
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			_, err := c.Poll(ctx, "q", 1, time.Minute, 0)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("poll: %v", err)
			}
		}()
	}
	wg.Wait()
	bg := make(chan error, 4)
	for i := 0; i < 4; i++ {
		go func() {
			_, err := c.Queues(context.Background())
			bg <- err
		}()
	}
	for i := 0; i < 12; i++ {
		hc.call(t)
	}
	closed := make(chan struct{})
	go func() { _ = c.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hangs on a node that never answers")
	}
	for i := 0; i < 4; i++ {
		select {
		case err := <-bg:
			require.Error(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("a call still waits after Close")
		}
	}
	_ = hc.Close()
}

// TestHostileNode_HalfFrameStall: the node writes half of a
// Return and stalls; the reading caller's ctx ends its wait, a later
// caller's too, and once the rest arrives the stream is whole: the
// late answer frees its given-up question and a new call is answered.
func TestHostileNode_HalfFrameStall(t *testing.T) {
	n := startHostileNode(t, true)
	c := dialHostile(t, n, ClientOptions{})
	hc := n.conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := c.Queues(ctx)
		errc <- err
	}()
	call := hc.call(t)
	full := resultsBytes(t, call.qid, func(seg *capnp.Segment) (capnp.Ptr, error) {
		r, err := schema.NewQueue_queues_Results(seg)
		if err != nil {
			return capnp.Ptr{}, err
		}
		l, err := r.NewQueues(1)
		if err != nil {
			return capnp.Ptr{}, err
		}
		return r.ToPtr(), l.Set(0, "late")
	})
	hc.send(t, full[:len(full)/2])
	select {
	case err := <-errc:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(10 * time.Second):
		t.Fatal("a caller reading a half frame ignores its ctx")
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel2()
	_, err := c.Queues(ctx2)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	c2 := hc.call(t)
	hc.send(t, full[len(full)/2:])
	// The given-up second call is answered now; then a fresh one.
	hc.send(t, resultsBytes(t, c2.qid, func(seg *capnp.Segment) (capnp.Ptr, error) {
		r, err := schema.NewQueue_queues_Results(seg)
		return r.ToPtr(), err
	}))
	go func() {
		call := hc.call(t)
		hc.send(t, resultsBytes(t, call.qid, func(seg *capnp.Segment) (capnp.Ptr, error) {
			r, err := schema.NewQueue_queues_Results(seg)
			if err != nil {
				return capnp.Ptr{}, err
			}
			l, err := r.NewQueues(1)
			if err != nil {
				return capnp.Ptr{}, err
			}
			return r.ToPtr(), l.Set(0, "fresh")
		}))
	}()
	qs, err := c.Queues(ctxT(t))
	require.NoError(t, err)
	require.Equal(t, []string{"fresh"}, qs)
}

// TestHostileNode_ProtocolBreaks: an Abort mid-call, a Return for
// a question never asked, a second Return for one question, and a reply
// over maxReplyBytes each end the connection: every waiting caller gets
// an error at once (ErrReplyTooLarge for the oversized one), none
// hangs, and later calls fail as disconnected.
func TestHostileNode_ProtocolBreaks(t *testing.T) {
	verifyNoLeaks(t)
	cases := []struct {
		name  string
		reply func(t *testing.T, first hnCall) []byte
		check func(t *testing.T, err error)
	}{
		{"abort", func(t *testing.T, _ hnCall) []byte { return rvAbortBytes(t) },
			func(t *testing.T, err error) { require.True(t, IsDisconnected(err), "%v", err) }},
		{"unknown question", func(t *testing.T, f hnCall) []byte { return pollResultsBytes(t, f.qid+1000, 1) },
			func(t *testing.T, err error) { require.True(t, IsDisconnected(err), "%v", err) }},
		{"twice", func(t *testing.T, f hnCall) []byte {
			b := pollResultsBytes(t, f.qid, 0)
			return append(append([]byte(nil), b...), b...)
		}, func(t *testing.T, err error) { require.Error(t, err) }},
		{"too large", func(t *testing.T, f hnCall) []byte {
			return resultsBytes(t, f.qid, func(seg *capnp.Segment) (capnp.Ptr, error) {
				r, err := schema.NewQueue_queues_Results(seg)
				if err != nil {
					return capnp.Ptr{}, err
				}
				l, err := r.NewQueues(1)
				if err != nil {
					return capnp.Ptr{}, err
				}
				return r.ToPtr(), l.Set(0, string(bytes.Repeat([]byte{'x'}, 128<<10)))
			})
		}, func(t *testing.T, err error) {
			require.True(t, errors.Is(err, ErrReplyTooLarge) || IsDisconnected(err), "%v", err)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := startHostileNode(t, true)
			c := dialHostile(t, n, ClientOptions{maxReplyBytes: 64 << 10})
			hc := n.conn(t)
			const callers = 16
			errs := make(chan error, callers)
			for i := 0; i < callers; i++ {
				go func() {
					_, err := c.Poll(ctxT(t), "q", 1, time.Minute, time.Minute)
					errs <- err
				}()
			}
			var first hnCall
			for i := 0; i < callers; i++ {
				call := hc.call(t)
				if i == 0 {
					first = call
				}
			}
			hc.send(t, tc.reply(t, first))
			failed := 0
			for i := 0; i < callers; i++ {
				select {
				case err := <-errs:
					if err != nil {
						failed++
						tc.check(t, err)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("%d callers still wait after the node broke the protocol", callers-i)
				}
			}
			require.GreaterOrEqual(t, failed, callers-1)
			select {
			case <-c.Done():
			case <-time.After(10 * time.Second):
				t.Fatal("Done not closed")
			}
			_, err := c.Queues(ctxT(t))
			require.True(t, IsDisconnected(err), "%v", err)
			require.NoError(t, c.Close())
		})
	}
}

// TestHostileNode_CloseWithManyInFlight: the node closes the
// socket while many calls (reading, waiting, and pairs) are in flight:
// each caller gets a disconnected error, none hangs, nothing leaks.
func TestHostileNode_CloseWithManyInFlight(t *testing.T) {
	verifyNoLeaks(t)
	n := startHostileNode(t, true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	c, err := Dial(ctx, n.addr, ClientOptions{FlowLimitBytes: 4 << 10})
	cancel()
	require.NoError(t, err)
	hc := n.conn(t)
	const callers = 64
	errs := make(chan error, callers)
	for i := 0; i < callers; i++ {
		go func() {
			var err error
			switch i % 3 {
			case 0:
				_, err = c.Enqueue(ctxT(t), "q", payloads(4, 200)) // flow-limited: some wait for bytes
			case 1:
				_, _, err = c.AckPoll(ctxT(t), "q", storage.LeaseID{1}, []storage.ItemID{{1}}, 1, time.Minute, time.Minute)
			default:
				_, err = c.Poll(ctxT(t), "q", 1, time.Minute, time.Minute)
			}
			errs <- err
		}()
	}
	hc.call(t)
	hc.call(t)
	_ = hc.Close()
	for i := 0; i < callers; i++ {
		select {
		case err := <-errs:
			require.Error(t, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("%d callers still wait after the node closed", callers-i)
		}
	}
	require.NoError(t, c.Close())
	<-hc.ended
}

// TestHostileNode_GivenUpPollWithBadItems: a poll given up whose
// late answer carries items with ids of the wrong length, or a lease of
// the wrong length, is dropped without a give-back and without harm; the
// connection stays up and each question gets its Finish.
func TestHostileNode_GivenUpPollWithBadItems(t *testing.T) {
	n := startHostileNode(t, true)
	c := dialHostile(t, n, ClientOptions{})
	hc := n.conn(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	_, err := c.Poll(ctx, "q", 1, time.Minute, time.Minute)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	call := hc.call(t)
	hc.send(t, resultsBytes(t, call.qid, func(seg *capnp.Segment) (capnp.Ptr, error) {
		r, err := schema.NewQueue_poll_Results(seg)
		if err != nil {
			return capnp.Ptr{}, err
		}
		if err := r.SetLease([]byte{1, 2, 3}); err != nil {
			return capnp.Ptr{}, err
		}
		items, err := r.NewItems(2)
		if err != nil {
			return capnp.Ptr{}, err
		}
		return r.ToPtr(), items.At(0).SetId([]byte{9})
	}))
	select {
	case f := <-hc.fins:
		require.Equal(t, call.qid, f)
	case <-time.After(10 * time.Second):
		t.Fatal("no Finish for the given-up poll")
	}
	// A poll answered with a short id fails; one with a short lease too.
	for _, bad := range []string{"id", "lease"} {
		done := make(chan error, 1)
		go func() {
			_, err := c.Poll(ctxT(t), "q", 2, time.Minute, 0)
			done <- err
		}()
		call := hc.call(t)
		hc.send(t, resultsBytes(t, call.qid, func(seg *capnp.Segment) (capnp.Ptr, error) {
			r, err := schema.NewQueue_poll_Results(seg)
			if err != nil {
				return capnp.Ptr{}, err
			}
			lease := bytes.Repeat([]byte{1}, 16)
			id := hnID(1)
			if bad == "lease" {
				lease = lease[:15]
			} else {
				id = id[:15]
			}
			if err := r.SetLease(lease); err != nil {
				return capnp.Ptr{}, err
			}
			items, err := r.NewItems(1)
			if err != nil {
				return capnp.Ptr{}, err
			}
			return r.ToPtr(), items.At(0).SetId(id)
		}))
		require.Error(t, <-done, bad)
	}
	c.lean.mu.Lock()
	open := len(c.lean.qs)
	c.lean.mu.Unlock()
	require.Zero(t, open)
}

// TestHostileNode_ConsumeMaxItemsOverrun (found by review, session 70, a consequence of
// PollMoreItemsThanMax): Consume with MaxItems 1 against a node whose poll
// answer lists 2 items runs the handler on both and returns nil, as if
// it had kept to its budget (consumer.go:304 gives back max-len(items),
// negative here, which itemBudget.give ignores).
func TestHostileNode_ConsumeMaxItemsOverrun(t *testing.T) {
	n := startHostileNode(t, true)
	c := dialHostile(t, n, ClientOptions{})
	hc := n.conn(t)
	go func() {
		for {
			var call hnCall
			select {
			case call = <-hc.calls:
			case <-hc.ended:
				return
			}
			switch call.method {
			case mPoll.id:
				hc.wmu.Lock()
				_, _ = hc.Write(pollResultsBytes(t, call.qid, 2))
				hc.wmu.Unlock()
			case mAck.id, mNack.id:
				b := resultsBytes(t, call.qid, func(seg *capnp.Segment) (capnp.Ptr, error) {
					r, err := schema.NewQueue_ack_Results(seg)
					if err != nil {
						return capnp.Ptr{}, err
					}
					_, err = r.NewCodes(2)
					return r.ToPtr(), err
				})
				hc.wmu.Lock()
				_, _ = hc.Write(b)
				hc.wmu.Unlock()
			}
		}
	}()
	var handled atomic.Int64
	err := c.Consume(ctxT(t), ConsumerConfig{
		Queue: "q", MaxItems: 1, Batch: 1, Lease: time.Minute, Clock: clock.NewMock(),
		Handler: func(context.Context, storage.Item) error { handled.Add(1); return nil },
	})
	require.LessOrEqual(t, handled.Load(), int64(1), "Consume(MaxItems 1) handled more items than its budget")
	require.ErrorIs(t, err, storage.ErrCorrupt, "a node that answers more than asked broke the protocol")
}
