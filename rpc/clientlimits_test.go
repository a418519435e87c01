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
	"github.com/leaseq/leaseq/storage"
)

// stallProxy is a TCP proxy in front of a real node. Each connection it
// accepts is forwarded to the node, or, when forward says no, held: accepted
// and never read or answered (a node whose process stalled: the kernel
// completes the handshake, nobody answers). freeze stops it reading what
// clients send to the node (a partition, a node that stopped reading), so a
// client's writes fill the socket buffers and then wait.
type stallProxy struct {
	ln       net.Listener
	upstream string
	forward  func(i int) bool // nil: forward every connection

	mu     sync.Mutex
	conns  []net.Conn
	n      int // connections accepted
	closed bool

	frozen     chan struct{}
	freezeOnce sync.Once
	done       chan struct{}
	closeOnce  sync.Once
	wg         sync.WaitGroup
}

func newStallProxy(t *testing.T, upstream string, forward func(i int) bool) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &stallProxy{ln: ln, upstream: upstream, forward: forward, frozen: make(chan struct{}), done: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.closeAll)
	return p
}

func (p *stallProxy) addr() string { return p.ln.Addr().String() }

// track records c for closeAll; false (and c closed) once closeAll ran.
func (p *stallProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.conns = append(p.conns, c)
	return true
}

func (p *stallProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.mu.Lock()
		i := p.n
		p.n++
		p.mu.Unlock()
		if p.forward != nil && !p.forward(i) {
			continue // held
		}
		u, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(u) {
			return
		}
		p.wg.Add(2)
		go p.pipe(u, c, true)
		go p.pipe(c, u, false)
	}
}

// pipe copies src to dst; the client-to-node direction stops reading
// once the proxy is frozen.
func (p *stallProxy) pipe(dst, src net.Conn, freezable bool) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		if freezable {
			select {
			case <-p.frozen:
				<-p.done
				return
			default:
			}
		}
		n, err := src.Read(buf)
		if n > 0 {
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

func (p *stallProxy) freeze() { p.freezeOnce.Do(func() { close(p.frozen) }) }

func (p *stallProxy) accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// closeAll closes every connection and waits for the proxy's goroutines.
func (p *stallProxy) closeAll() {
	p.closeOnce.Do(func() {
		close(p.done)
		_ = p.ln.Close()
		p.mu.Lock()
		p.closed = true
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
}

// TestClient_CloseNotHeldByCapnpConnDial: Close must end the client
// even while Queue() (or Subscribe) is opening the lean client's go-capnp
// connection to a node that does not answer the bootstrap. capnpConn holds
// gcMu through the dial and bootstrap (with Queue(), under
// context.Background()), and Close waits for gcMu.
func TestClient_CloseNotHeldByCapnpConnDial(t *testing.T) {
	b := setup(t, bundleOpts{factory: memFactory()})
	// The lean connection is forwarded; the go-capnp one is held.
	px := newStallProxy(t, b.addr, func(i int) bool { return i == 0 })
	c, err := Dial(ctxT(t), px.addr(), ClientOptions{})
	require.NoError(t, err)
	require.NotNil(t, c.lean)
	_, err = c.NodeInfo(ctxT(t))
	require.NoError(t, err)

	queued := make(chan struct{})
	go func() {
		_ = c.Queue()
		close(queued)
	}()
	rpctest.Eventually(t, 5*time.Second, func() bool { return px.accepted() >= 2 }, "Queue() did not dial")
	time.Sleep(100 * time.Millisecond) // its Bootstrap is out, unanswered

	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case <-closed:
		px.closeAll()
		select {
		case <-queued:
		case <-time.After(5 * time.Second):
			t.Fatal("Queue() did not return after Close")
		}
	case <-time.After(5 * time.Second):
		px.closeAll() // the bootstrap fails: Queue() returns, Close goes on
		<-closed
		<-queued
		t.Fatal("Client.Close had not returned after 5s: held by Queue()'s dial of the go-capnp connection")
	}
}

// TestClient_EnqueueRefusesNegativeDelay: the Client mirrors storage.Store,
// whose Enqueue refuses an item with a negative delay (CodeInvalid, as
// Limits.ValidateItem says; Client.Nack refuses a negative delay too). The
// client sends it as 0 instead: the item is enqueued ready.
func TestClient_EnqueueRefusesNegativeDelay(t *testing.T) {
	b := setup(t, bundleOpts{factory: memFactory()})
	c := b.dial()
	ctx := ctxT(t)
	item := storage.EnqueueItem{Payload: []byte("x"), Delay: -time.Hour}

	direct, err := b.store.Enqueue(ctx, storage.EnqueueParams{Queue: "direct", Items: []storage.EnqueueItem{item}, Now: testStart})
	require.NoError(t, err)
	require.Equal(t, storage.CodeInvalid, direct[0].Code, "the store refuses a negative delay")

	res, err := c.Enqueue(ctx, "q", []storage.EnqueueItem{item})
	if err != nil {
		require.ErrorIs(t, err, storage.ErrInvalidArgument)
		return
	}
	require.Len(t, res, 1)
	require.Equal(t, storage.CodeInvalid, res[0].Code, "Client.Enqueue accepted a negative delay (sent as 0): %+v", res[0])
}

// TestClient_SmallCallsPassUnderSmallFlowLimit: FlowLimitBytes documents
// that "a single call larger than it fails with ErrInvalidArgument". A
// call of a few bytes is far smaller than a 32 KiB limit, yet checkSize
// adds 64 KiB to every request and refuses it.
func TestClient_SmallCallsPassUnderSmallFlowLimit(t *testing.T) {
	b := setup(t, bundleOpts{factory: memFactory()})
	c, err := b.dialErr(ClientOptions{FlowLimitBytes: 32 << 10})
	require.NoError(t, err)
	res, err := c.Enqueue(ctxT(t), "q", []storage.EnqueueItem{{Payload: []byte("tiny")}})
	require.NoError(t, err, "a 4-byte enqueue under a 32 KiB flow limit")
	require.Len(t, res, 1)
	require.Equal(t, storage.CodeOK, res[0].Code)
}

// TestClient_ProducerBatchesFitClientFlowLimit: a Producer's calls must be
// ones its own Client sends. With FlowLimitBytes at 1 MiB and the
// producer's defaults (MaxBytes 1 MiB), a full batch of small items is
// refused by Client.Enqueue's size check, and every caller in it fails
// with "split the batch", which a caller of single-item Enqueue cannot do.
func TestClient_ProducerBatchesFitClientFlowLimit(t *testing.T) {
	b := setup(t, bundleOpts{factory: memFactory()})
	c, err := b.dialErr(ClientOptions{FlowLimitBytes: 1 << 20})
	require.NoError(t, err)
	mock := clock.NewMock()
	mock.Set(testStart)
	// A long Linger on a clock that does not move until the first call
	// left: that call leaves when MaxBatch (the default, 128) items wait.
	// The clock moves an hour at a tick below: the calls' bound
	// (CallTimeout, on the same clock) must not cut a call in flight.
	p, cs := newProducer(t, c, ProducerOptions{Linger: time.Hour, Clock: mock, CallTimeout: 100 * 365 * 24 * time.Hour})

	const n = DefaultProducerBatch
	errs := make(chan error, n)
	ids := make(chan storage.ItemID, n)
	for i := 0; i < n; i++ {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			r, err := p.Enqueue(ctx, storage.EnqueueItem{Payload: make([]byte, 8<<10)})
			if err == nil {
				ids <- r.ID
			}
			errs <- err
		}()
	}
	rpctest.Eventually(t, 10*time.Second, func() bool { return len(cs.get()) > 0 }, "no call left")
	// Whatever a smaller first call left behind goes on after its linger.
	stopTick := make(chan struct{})
	ticked := make(chan struct{})
	go func() {
		defer close(ticked)
		for {
			select {
			case <-stopTick:
				return
			case <-time.After(20 * time.Millisecond):
				mock.Add(time.Hour)
			}
		}
	}()
	defer func() { close(stopTick); <-ticked }()
	var failed []error
	for i := 0; i < n; i++ {
		select {
		case err := <-errs:
			if err != nil {
				failed = append(failed, err)
			}
		case <-time.After(40 * time.Second):
			t.Fatal("producer callers did not return")
		}
	}
	if len(failed) > 0 {
		t.Fatalf("%d of %d single 8 KiB items failed; first: %v", len(failed), n, failed[0])
	}
	seen := map[storage.ItemID]bool{}
	for i := 0; i < n; i++ {
		id := <-ids
		require.False(t, seen[id], "id handed to two callers")
		seen[id] = true
	}
}

// TestClient_ProducerDoesNotUsePayloadAfterEnqueueReturns: once
// Producer.Enqueue has returned, the caller owns its payload again (Go's
// rule for a slice passed to a call that documents nothing else). A caller
// whose ctx ends after its item was taken into a batch, but before the
// batch's call was built, returns at once; the call is built from the
// caller's slice later, so a caller that reuses its buffer has other bytes
// enqueued under its item (and a data race).
func TestClient_ProducerDoesNotUsePayloadAfterEnqueueReturns(t *testing.T) {
	b := setup(t, bundleOpts{factory: memFactory()})
	c := b.dial()
	p, err := c.Producer("q", ProducerOptions{MaxInflight: 1})
	require.NoError(t, err)
	inCall := make(chan struct{})
	gate := make(chan struct{})
	var once sync.Once
	p.onCall = func(int) {
		once.Do(func() { close(inCall) })
		<-gate
	}
	defer func() { _ = p.Close() }()

	buf := []byte("original")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := p.Enqueue(ctx, storage.EnqueueItem{Payload: buf})
		done <- err
	}()
	<-inCall // the item is in a batch; the call is not built yet
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	copy(buf, "CLOBBER!") // the caller's buffer is its own again
	close(gate)
	require.NoError(t, p.Close())

	got, err := c.Poll(ctxT(t), "q", 10, time.Minute, 0)
	require.NoError(t, err)
	for _, it := range got.Items {
		require.Equal(t, "original", string(it.Payload), "the enqueued payload is what the caller's buffer held after Enqueue returned")
	}
}
