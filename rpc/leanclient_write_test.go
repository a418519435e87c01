package rpc

import (
	"context"
	"net"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
)

// bigCall is a Call's params of n bytes: more than loopback's socket
// buffers hold, so its write waits for a node that does not read.
func bigCall(n int) func(*capnp.Segment) (capnp.Ptr, error) {
	return func(seg *capnp.Segment) (capnp.Ptr, error) {
		d, err := capnp.NewData(seg, make([]byte, n))
		if err != nil {
			return capnp.Ptr{}, err
		}
		return d.ToPtr(), nil
	}
}

func smallCall(seg *capnp.Segment) (capnp.Ptr, error) {
	d, err := capnp.NewData(seg, []byte("x"))
	if err != nil {
		return capnp.Ptr{}, err
	}
	return d.ToPtr(), nil
}

// stallingNode plays a node on conn: it answers the bootstrap and reads
// its Finish and then skip messages more, then reads nothing until resume
// is closed (never, when it is nil): a partition, or a node that stopped
// reading. After resume it answers every Call with empty results.
func stallingNode(t *testing.T, conn net.Conn, skip int, resume <-chan struct{}) {
	stallingNodeSeeing(t, conn, skip, resume, nil)
}

// stallingNodeSeeing is stallingNode, telling onFinish (if set) the
// question of each Finish it reads after resume.
func stallingNodeSeeing(t *testing.T, conn net.Conn, skip int, resume <-chan struct{}, onFinish func(qid uint32)) {
	dec := capnp.NewDecoder(conn)
	dec.MaxMessageSize = 1 << 30
	for i := 0; i < 2+skip; i++ { // the Bootstrap, its Finish, skip more
		msg, err := dec.Decode()
		if err != nil {
			return
		}
		msg.Release()
		if i == 0 {
			if _, err := conn.Write(bootstrapReturnBytes(t, 0)); err != nil {
				return
			}
		}
	}
	if resume == nil {
		return
	}
	<-resume
	for {
		msg, err := dec.Decode()
		if err != nil {
			return
		}
		m, err := rpccp.ReadRootMessage(msg)
		if err == nil && m.Which() == rpccp.Message_Which_finish && onFinish != nil {
			f, _ := m.Finish()
			onFinish(f.QuestionId())
		}
		if err == nil && m.Which() == rpccp.Message_Which_call {
			call, _ := m.Call()
			out := returnBytes(t, call.QuestionId(), func(rpccp.Payload) error { return nil })
			if _, err := conn.Write(out); err != nil {
				msg.Release()
				return
			}
		}
		msg.Release()
	}
}

// startCall runs a call of build on l under ctx; the channel gets its
// error.
func startCall(l *leanClient, ctx context.Context, build func(*capnp.Segment) (capnp.Ptr, error)) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, release, err := l.call(ctx, mQueues.id, build)
		if release != nil {
			release()
		}
		done <- err
	}()
	return done
}

// callReturns waits for a call started by startCall, failing the test
// unless it returns within 10 s.
func callReturns(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("a call whose context ended had not returned after 10 s: its write waits for a node that does not read")
		return nil
	}
}

// callWithin runs a call of the client under a context that ends after
// d, and fails the test unless it returns within 10 s.
func callWithin(t *testing.T, l *leanClient, d time.Duration, build func(*capnp.Segment) (capnp.Ptr, error)) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return callReturns(t, startCall(l, ctx, build))
}

// callCancelledInWrite runs a call of build on l and cancels its context
// once the call is registered and its write has had time to fill the
// socket of a node that reads nothing (a deadline set before the call
// could end it before the write began: building a 32 MiB call under
// -race takes longer than one); it returns the call's error.
func callCancelledInWrite(t *testing.T, l *leanClient, build func(*capnp.Segment) (capnp.Ptr, error)) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := startCall(l, ctx, build)
	require.Eventually(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.pending == 1
	}, 10*time.Second, time.Millisecond, "the call was never registered")
	time.Sleep(500 * time.Millisecond) // the write now waits on the full socket
	cancel()
	return callReturns(t, done)
}

// stalledClient is a lean client over transport to a stallingNode that
// reads skip messages after the bootstrap, then waits for resume.
func stalledClient(t *testing.T, transport string, skip int, resume <-chan struct{}) *leanClient {
	t.Helper()
	cc, sc := connPair(t, transport)
	t.Cleanup(func() { _ = sc.Close() })
	go stallingNode(t, sc, skip, resume)
	l, err := newLeanClient(ctxT(t), cc, DefaultMaxMessageBytes, DefaultMaxReplyBytes, clock.New())
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.close() })
	return l
}

// closeWithin closes l, failing the test unless it returns within 10 s.
func closeWithin(t *testing.T, l *leanClient) {
	t.Helper()
	ended := make(chan struct{})
	go func() {
		_ = l.close()
		close(ended)
	}()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("close did not end a connection whose node stopped reading")
	}
}

// TestLeanClient_CallsReturnWhenTheNodeStopsReading: on a plain socket to
// a node that stopped reading, a call whose write fills the socket returns
// when its context ends (the write is cut and goes on in the background),
// and so does a call waiting for the write lock behind it. Close ends the
// connection and the background write.
func TestLeanClient_CallsReturnWhenTheNodeStopsReading(t *testing.T) {
	for _, transport := range []string{"tcp", "pipe"} {
		t.Run(transport, func(t *testing.T) {
			l := stalledClient(t, transport, 0, nil)
			err := callCancelledInWrite(t, l, bigCall(32<<20))
			require.ErrorIs(t, err, context.Canceled, "the call whose write was cut")
			if transport == "tcp" {
				select {
				case <-l.quit:
					t.Fatal("a cut write on a plain socket ended the connection; the rest is to go out once the node reads")
				default:
				}
			}
			// The lock is held by the rest of the cut write (tcp), or the
			// connection is lost (pipe: a cut write cannot go on).
			err = callWithin(t, l, 300*time.Millisecond, smallCall)
			require.Error(t, err, "a call behind the cut write")
			if transport == "tcp" {
				require.ErrorIs(t, err, context.DeadlineExceeded)
			}
			closeWithin(t, l)
		})
	}
}

// TestLeanClient_CutWriteGoesOnWhenTheNodeReadsAgain: a call cut off in
// the middle of its write (one larger than the write buffer, written
// straight from the message) leaves the connection up and the stream
// whole: once the node reads again it gets the rest of that call and its
// Finish, and answers the next call on the same connection. (A review
// found the rest written once more with the cut's deadline still set,
// which ended the connection.)
func TestLeanClient_CutWriteGoesOnWhenTheNodeReadsAgain(t *testing.T) {
	resume := make(chan struct{})
	l := stalledClient(t, "tcp", 0, resume)
	err := callCancelledInWrite(t, l, bigCall(32<<20))
	require.ErrorIs(t, err, context.Canceled)
	select {
	case <-l.quit:
		t.Fatalf("a cut write on a plain socket ended the connection: %v", l.err)
	default:
	}
	close(resume)

	_, release, err := l.call(ctxT(t), mQueues.id, smallCall)
	require.NoError(t, err, "the call after the cut one, once the node reads again")
	release()
	select {
	case <-l.quit:
		t.Fatalf("the connection was lost: %v", l.err)
	default:
	}
	// Every question was settled: the cut call's by the Return its Finish
	// could not stop (freed when it came), the second's by its Finish.
	require.Eventually(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.qs) == 0 && l.pending == 0
	}, 10*time.Second, 10*time.Millisecond, "questions left open")
}

// TestLeanClient_GiveUpNeverWaitsForTheWriteLock: a caller whose context
// ends while another write holds the lock returns at once, and its Finish
// goes out with the lock's next holder, ahead of a call that reuses its
// question id.
func TestLeanClient_GiveUpNeverWaitsForTheWriteLock(t *testing.T) {
	resume := make(chan struct{})
	l := stalledClient(t, "tcp", 0, resume)

	// A small call the node does not answer yet.
	err := callWithin(t, l, 100*time.Millisecond, smallCall)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	// Hold the write lock, as a write waiting on a full socket does, and
	// give a question up meanwhile: giveUp must not wait.
	require.True(t, l.tryLockWrite())
	lc, err := l.prepare(ctxT(t), mQueues.id, smallCall)
	require.NoError(t, err)
	lc.msg.Release()
	gaveUp := make(chan struct{})
	go func() {
		l.giveUp(lc.qid, lc.q)
		close(gaveUp)
	}()
	select {
	case <-gaveUp:
	case <-time.After(10 * time.Second):
		t.Fatal("giveUp waited for the write lock")
	}
	require.Equal(t, int32(1), l.pendN.Load(), "the Finish waits for the lock's holder")
	l.unlockWrite()
	require.Equal(t, int32(0), l.pendN.Load(), "unlocking wrote the waiting Finish")
	close(resume)
	_, release, err := l.call(ctxT(t), mQueues.id, smallCall)
	require.NoError(t, err)
	release()
}

// TestLeanClient_GiveUpDoesNotWaitOnAConnectionWithoutRawWrites: on a
// connection that is not a plain socket (TLS, a pipe) a caller that gives
// up a call returns although its Finish cannot be written (the node read
// the Call, then stopped reading): the Finish's flush waits on a goroutine
// of its own.
func TestLeanClient_GiveUpDoesNotWaitOnAConnectionWithoutRawWrites(t *testing.T) {
	l := stalledClient(t, "pipe", 1, nil)
	require.False(t, l.callersRead, "a pipe has no raw writes")
	err := callWithin(t, l, 200*time.Millisecond, smallCall)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	err = callWithin(t, l, 200*time.Millisecond, smallCall)
	require.ErrorIs(t, err, context.DeadlineExceeded, "a call behind the Finish that waits")
	closeWithin(t, l)
}

// TestLeanClient_FinishOnAFullSocketGoesOutWhenItDrains: a Finish whose
// flush finds the socket full (the node not reading) is written once the
// node reads again, by a goroutine that waits for the socket, not left in
// the buffer for a later call that an idle client never makes (the node
// would hold the answer, or go on with the call given up).
func TestLeanClient_FinishOnAFullSocketGoesOutWhenItDrains(t *testing.T) {
	cc, sc := connPair(t, "tcp")
	t.Cleanup(func() { _ = sc.Close() })
	resume := make(chan struct{})
	seen := make(chan uint32, 1<<16)
	go stallingNodeSeeing(t, sc, 0, resume, func(qid uint32) { seen <- qid })
	l, err := newLeanClient(ctxT(t), cc, DefaultMaxMessageBytes, DefaultMaxReplyBytes, clock.New())
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.close() })

	// Fill the socket with Finishes of a question never asked (the node
	// ignores them), as lazy Finishes flushed at once would.
	const filler = 1 << 20
	require.True(t, l.tryLockWrite())
	for i := 0; ; i++ {
		require.Less(t, i, 1<<20, "the socket never filled")
		require.NoError(t, l.w.encodeFinish(filler, true))
		if l.w.finishes >= 256 {
			l.w.flushNow()
			require.NoError(t, l.w.err)
			if len(l.w.buf) > 0 {
				break // full: the rest is left in the buffer
			}
		}
	}
	l.handOn()

	// A call given up meanwhile: its Finish waits behind the rest.
	lc, err := l.prepare(ctxT(t), mQueues.id, smallCall)
	require.NoError(t, err)
	lc.msg.Release()
	l.giveUp(lc.qid, lc.q)

	close(resume) // the node reads again; the client makes no call
	deadline := time.After(10 * time.Second)
	for {
		select {
		case qid := <-seen:
			if qid == lc.qid {
				return
			}
		case <-deadline:
			t.Fatal("the Finish of the call given up was not written once the node read again")
		}
	}
}
