package rpc

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/rpctest"
)

// holdCutProxy is a TCP proxy between a client and a real node whose
// node-to-client direction can be held (bytes the node wrote wait in the
// proxy: an answer on the wire), and whose connections can be cut one by
// one (a NAT or a firewall dropping one connection).
type holdCutProxy struct {
	ln       net.Listener
	upstream string

	mu    sync.Mutex
	gate  chan struct{} // non-nil: node-to-client bytes wait for it
	held  int           // node-to-client bytes that waited for a gate
	pairs [][2]net.Conn // [client side, node side], in accept order
	done  bool
	wg    sync.WaitGroup
}

func newHoldCutProxy(t *testing.T, upstream string) *holdCutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &holdCutProxy{ln: ln, upstream: upstream}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *holdCutProxy) addr() string { return p.ln.Addr().String() }

func (p *holdCutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		u, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.done {
			p.mu.Unlock()
			_ = c.Close()
			_ = u.Close()
			return
		}
		p.pairs = append(p.pairs, [2]net.Conn{c, u})
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(u, c, false)
		go p.pipe(c, u, true)
	}
}

func (p *holdCutProxy) pipe(dst, src net.Conn, gated bool) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if gated {
				p.mu.Lock()
				g := p.gate
				if g != nil {
					p.held += n
				}
				p.mu.Unlock()
				if g != nil {
					<-g
				}
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				_ = src.Close()
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}

// hold makes node-to-client bytes wait until release.
func (p *holdCutProxy) hold() {
	p.mu.Lock()
	p.gate = make(chan struct{})
	p.mu.Unlock()
}

func (p *holdCutProxy) release() {
	p.mu.Lock()
	if p.gate != nil {
		close(p.gate)
		p.gate = nil
	}
	p.mu.Unlock()
}

// cut closes the i-th connection accepted, both sides.
func (p *holdCutProxy) cut(i int) {
	p.mu.Lock()
	pr := p.pairs[i]
	p.mu.Unlock()
	_ = pr[0].Close()
	_ = pr[1].Close()
}

func (p *holdCutProxy) heldBytes() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}

func (p *holdCutProxy) accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.pairs)
}

func (p *holdCutProxy) close() {
	p.release()
	_ = p.ln.Close()
	p.mu.Lock()
	p.done = true
	for _, pr := range p.pairs {
		_ = pr[0].Close()
		_ = pr[1].Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// queueCounts is queue q's ready and inflight counts.
func queueCounts(t *testing.T, c *Client) (ready, inflight int64) {
	t.Helper()
	st, err := c.Stats(ctxT(t), "q")
	require.NoError(t, err)
	if len(st) == 0 {
		return 0, 0
	}
	return st[0].Ready, st[0].Inflight
}

// closeWithPollAnswerOnTheWire runs the scenario of the two Close tests
// below: a lean client, through the proxy, polls 3 items under an hour's
// lease; the node claims them and writes its answer, which the proxy
// holds (the answer is on the wire). giveUp: the poll's context ends
// before Close (a consumer that stops, then closes its client); else
// Close comes while the poll still waits. The answer is let through once
// Close has begun waiting for it (or has returned without waiting: the
// defect); Close's give-back bound is on a mock clock that never moves.
// When the client's connection is gone, the 3 items must be ready again:
// nobody received them.
func closeWithPollAnswerOnTheWire(t *testing.T, giveUp bool) {
	b := setup(t, bundleOpts{})
	obs := b.dial()
	p := newHoldCutProxy(t, b.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	c, err := Dial(ctx, p.addr(), ClientOptions{Logger: rpctest.Logger(t), Clock: clock.NewMock()})
	cancel()
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NotNil(t, c.lean)
	_, err = c.Enqueue(ctxT(t), "q", payloads(3, 8))
	require.NoError(t, err)

	polled := pollHeldOnTheWire(t, obs, c, p, pollThree, giveUp)
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	rpctest.Eventually(t, 10*time.Second, func() bool {
		select {
		case err := <-closed:
			closed <- err
			return true
		default:
			return c.lean.drainingPolls()
		}
	}, "Close neither returned nor began to wait for the poll's answer")
	p.release() // the answer reaches the client, if it still listens
	rpctest.Recv(t, closed, 10*time.Second)
	if !giveUp {
		require.Error(t, rpctest.Recv(t, polled, 10*time.Second))
	}
	// The client's connection has ended at the node (obs is the other).
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 1 })
	ready, inflight := queueCounts(t, obs)
	require.Equal(t, [2]int64{3, 0}, [2]int64{ready, inflight},
		"ready/inflight after Close: the items of a poll nobody received stay leased to nobody until the lease ends (an hour)")
}

// Found by review (session 73): Close dropped a poll's answer already on
// the wire. A consumer stops (its poll's context ends) and closes its
// client at once, while the node's answer to that poll, holding the items
// it claimed, is on the wire. Close waited only for give-backs already
// started: a given-up poll whose Return had not been read yet was dropped
// with the connection (leanClient.close), and its items stayed leased
// until the lease ended, although giveBackPoll promises that "a consumer
// that stops and closes its client at once still gives back what its
// last poll claimed". The node cannot help: it wrote the answer.
func TestClientClose_GivesBackGivenUpPollOnTheWire(t *testing.T) {
	closeWithPollAnswerOnTheWire(t, true)
}

// Found by review (session 73): as above, but Close comes while the
// poll's caller still waits: Close failed the call ("client closed"), so
// the caller never learned the lease, and the items the node claimed for
// it stayed leased to nobody until the lease ended.
func TestClientClose_GivesBackOpenPollOnTheWire(t *testing.T) {
	closeWithPollAnswerOnTheWire(t, false)
}

// TestClientClose_EndsLongPollAtOnce: Close, which waits for the answers
// of the polls in flight (above), tells the node to cancel them, so a
// long poll with nothing to hand out does not hold it up. The node's and
// the client's clocks never move: only the cancel can end the poll.
func TestClientClose_EndsLongPollAtOnce(t *testing.T) {
	b := setup(t, bundleOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	c, err := Dial(ctx, b.addr, ClientOptions{Logger: rpctest.Logger(t), Clock: clock.NewMock()})
	cancel()
	require.NoError(t, err)
	require.NotNil(t, c.lean)
	polled := make(chan error, 1)
	go func() {
		_, err := c.Poll(context.Background(), "q", 1, time.Hour, time.Minute)
		polled <- err
	}()
	rpctest.Eventually(t, 10*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 }, "the poll did not reach the node")
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	require.NoError(t, rpctest.Recv(t, closed, 10*time.Second))
	require.True(t, IsDisconnected(rpctest.Recv(t, polled, 10*time.Second)))
	_, err = c.Poll(context.Background(), "q", 1, time.Hour, 0)
	require.Error(t, err, "a poll after Close")
}
