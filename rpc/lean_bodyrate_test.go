package rpc

import (
	"sync/atomic"
	"testing"
	"time"

	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/schema"
)

// bodyRateFixture is a lean node whose body watch a test drives with the
// mock clock: FirstMessageTimeout of a second, a node budget of unanswered
// bytes of exactly one enqueue message (msg), so that the test sees when
// the reader took it for a body it waits for, and a stallCheck that makes
// every check of the watch see the bytes the client wrote before it, and
// tells the test it ran.
type bodyRateFixture struct {
	b       *testBundle
	r       *rawRPC
	msg     []byte
	written atomic.Uint64 // bytes the client wrote
	checks  chan struct{} // a body check ran (before it decided)
}

const bodyRateGrace = time.Second

func newBodyRateFixture(t *testing.T) *bodyRateFixture {
	f := &bodyRateFixture{checks: make(chan struct{}, 1024)}
	f.msg = pipelinedCall(t, 1, 0, 0 /* enqueue */, func(p rpccp.Payload) error {
		a, err := schema.NewQueue_enqueue_Params(p.Segment())
		if err != nil {
			return err
		}
		if err := a.SetQueue("q"); err != nil {
			return err
		}
		items, err := a.NewItems(1)
		if err != nil {
			return err
		}
		if err := items.At(0).SetPayload(make([]byte, 128<<10)); err != nil {
			return err
		}
		return p.SetContent(a.ToPtr())
	})
	f.b = setup(t, bundleOpts{mutate: func(c *ServerConfig) {
		c.Engine = EngineLean
		c.FirstMessageTimeout = bodyRateGrace
		c.MaxInflightBytes = int64(len(f.msg))
		c.stallCheck = func(kind string, progress func() uint64, _ uint64) {
			if kind != "body" {
				return
			}
			want := f.written.Load()
			deadline := time.Now().Add(10 * time.Second)
			for progress() < want && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond) // the reader has yet to take the bytes from the socket
			}
			f.checks <- struct{}{}
		}
	}})
	f.r = newRaw(t, f.b)
	require.NoError(t, f.write(t, bootstrapMsg(t)))
	require.Equal(t, rpccp.Return_Which_results, f.r.recvReturn(0).Which())
	return f
}

// write sends p as the client's next bytes.
func (f *bodyRateFixture) write(t *testing.T, p []byte) error {
	_, err := f.r.conn.Write(p)
	if err == nil {
		f.written.Add(uint64(len(p)))
	}
	return err
}

// bodyTaken waits until the reader took the node's budget for msg: it has
// read its header and waits for its body (the watch runs from then).
func (f *bodyRateFixture) bodyTaken(t *testing.T) {
	rpctest.Eventually(t, 10*time.Second, func() bool {
		if f.b.srv.inflight.TryAcquire(1) {
			f.b.srv.inflight.Release(1)
			return false
		}
		return true
	})
}

// TestLeanHostile_TricklingBodyClosed: a client that sends a message's
// body a byte per tick of the clock (a tick is FirstMessageTimeout, so it
// never stalls) has its connection closed once FirstMessageTimeout plus
// the time the message's size takes at bodyMinRate has passed. Found by
// review (session 70): only a stalled body was bounded, and such a client
// held its reader and the budgets of unanswered bytes for the message's
// whole size (here the node's whole budget) as long as it liked.
func TestLeanHostile_TricklingBodyClosed(t *testing.T) {
	t.Parallel()
	f := newBodyRateFixture(t)
	bound := bodyTime(bodyRateGrace, int64(len(f.msg)))
	require.NoError(t, f.write(t, f.msg[:64]))
	f.bodyTaken(t)

	readErr := rpctest.Go(func() error {
		_, err := f.r.conn.Read(make([]byte, 1))
		return err
	})
	// elapsed: the clock's advance; checked: the advance at which the
	// last check ran (the one that closed, once the connection is closed).
	var elapsed, checked time.Duration
	for i := 64; ; i++ {
		require.Less(t, elapsed, bound+2*bodyRateGrace, "a body a byte a second came for %v and the connection is still open (bound %v)", elapsed, bound)
		_ = f.write(t, f.msg[i:i+1]) // fails once the node closed the connection
		f.b.clock.Add(bodyRateGrace)
		elapsed += bodyRateGrace
		select {
		case <-f.checks:
			checked = elapsed // the check saw the byte; it may have closed
			continue
		case err := <-readErr:
			require.Error(t, err)
			select {
			case <-f.checks: // the check that closed it, signalled first
				checked = elapsed
			default:
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no body check ran and the connection is open")
		}
		break
	}
	t.Logf("closed by the check during the tick to %v of a byte a second (bound %v)", checked, bound)
	require.Less(t, checked-bodyRateGrace, bound, "closed within the bound (the check ran during the tick that passed it)")
	require.GreaterOrEqual(t, checked, bound, "and not before it")
	require.Greater(t, checked, 2*bodyRateGrace, "not as a stalled body: it never stalled")
}

// TestLeanHostile_SteadyBodyServed: a client that sends the same message
// in pieces over less than its bound (faster than bodyMinRate) is served.
func TestLeanHostile_SteadyBodyServed(t *testing.T) {
	t.Parallel()
	f := newBodyRateFixture(t)
	require.NoError(t, f.write(t, f.msg[:64]))
	f.bodyTaken(t)
	const pieces = 8
	rest := f.msg[64:]
	step := (len(rest) + pieces - 1) / pieces
	for len(rest) > 0 {
		n := min(step, len(rest))
		f.b.clock.Add(bodyRateGrace / 4) // 4 pieces a second: 128 KiB in 2 s
		require.NoError(t, f.write(t, rest[:n]))
		rest = rest[n:]
	}
	ret := f.r.recvReturn(1)
	require.Equal(t, rpccp.Return_Which_results, ret.Which(), "the enqueue is answered")
}
