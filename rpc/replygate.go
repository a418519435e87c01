package rpc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/rpc/transport"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/benbjohnson/clock"
)

// replyGate bounds the bytes of answers a connection has built and not yet
// written to its socket. A client that sends calls and never reads the
// answers would otherwise make the server hold every answer in memory
// (go-capnp queues them without bound). Handlers register each answer
// when they finish (add); the transport drops it once it is written or
// released (done); while more than limit bytes are pending, the
// connection's reader stops taking new calls (wait), and if the client
// reads nothing for stall meanwhile, the connection is closed. On the
// lean engine "nothing" is no byte (progress): a client reading a large
// answer slowly is not cut off; on go-capnp it is no whole answer.
type replyGate struct {
	limit int64
	stall time.Duration
	clk   clock.Clock
	// progress, when set (the lean engine), counts the bytes the
	// connection's socket took; a wait is stalled only if it stays put
	// for stall. Set before the connection is served.
	progress func() uint64
	// check, when set (tests: ServerConfig.stallCheck), runs when the
	// stall timer fires, before progress is read.
	check func(kind string, progress func() uint64, last uint64)

	total *atomic.Int64   // the server's sum over connections (Metrics)
	ctx   context.Context // the connection's: waits end with it
	kill  func()          // closes the connection (a stalled client)

	mu       sync.Mutex
	pending  int64
	building int // listing answers being built (acquire/release)
	sizes    map[*capnp.Message]int64
	changed  chan struct{} // closed (and replaced) when pending or building falls and someone waits
	waiting  int           // goroutines in await
}

func newReplyGate(ctx context.Context, kill func(), limit int64, stall time.Duration, clk clock.Clock, total *atomic.Int64) *replyGate {
	return &replyGate{ctx: ctx, kill: kill, limit: limit, stall: stall, clk: clk, total: total,
		sizes: make(map[*capnp.Message]int64), changed: make(chan struct{})}
}

// add registers an answer of the connection once its handler returned.
func (g *replyGate) add(m *capnp.Message) {
	if g == nil || m == nil {
		return
	}
	n, err := m.TotalSize()
	if err != nil {
		return
	}
	g.mu.Lock()
	if _, ok := g.sizes[m]; !ok {
		g.sizes[m] = int64(n)
		g.pending += int64(n)
		g.total.Add(int64(n))
	}
	g.mu.Unlock()
}

// done forgets an answer that was written or released.
func (g *replyGate) done(m *capnp.Message) {
	g.mu.Lock()
	n, ok := g.sizes[m]
	if ok {
		delete(g.sizes, m)
		g.pending -= n
		g.total.Add(-n)
		g.signalLocked()
	}
	g.mu.Unlock()
}

// over reports whether the answers pending are over the limit (a
// client that does not read them). False for a nil gate.
func (g *replyGate) over() bool {
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pending > g.limit
}

// Pending is the bytes of answers built and not yet written.
func (g *replyGate) Pending() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pending
}

// maxBuilding is how many listing answers (peek, dead list) one
// connection may have in the making at once: admission looks at the bytes
// already pending, so without this bound a burst of calls would all be
// admitted before the first answer is counted.
const maxBuilding = 4

// wait returns once pending answers are within the limit (the reader
// calls it before taking the next call). Before it first blocks it calls
// before (if not nil) without the gate's lock, then looks again: the
// lean reader writes its queued answers there, which may be what keeps
// the gate shut.
func (g *replyGate) wait(before func()) error {
	return g.await(func() bool { return g.pending <= g.limit }, before)
}

// acquire admits one listing answer to be built: pending answers within
// the limit and fewer than maxBuilding in the making. release ends it.
func (g *replyGate) acquire() error {
	if g == nil {
		return nil
	}
	return g.await(func() bool {
		if g.pending > g.limit || g.building >= maxBuilding {
			return false
		}
		g.building++
		return true
	}, nil)
}

func (g *replyGate) release() {
	if g == nil {
		return
	}
	g.mu.Lock()
	g.building--
	g.signalLocked()
	g.mu.Unlock()
}

// signalLocked wakes every waiter to look again. With nobody waiting
// (nearly always) it does nothing: a fresh channel per written answer was
// an allocation per call. REQUIRES: g.mu held.
func (g *replyGate) signalLocked() {
	if g.waiting == 0 {
		return
	}
	close(g.changed)
	g.changed = make(chan struct{})
}

// await waits until ok (called with g.mu held) holds; before, if not
// nil, runs once before the first wait (see wait). It fails when the
// connection ends, or when the client reads nothing for stall (no byte,
// with progress; else no answer): then the connection is closed.
func (g *replyGate) await(ok func() bool, before func()) error {
	if g == nil {
		return nil
	}
	var stalled chan struct{}
	var timer *clock.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	var mark uint64 // progress when the timer was armed
	for {
		g.mu.Lock()
		fine, pending, changed := ok(), g.pending, g.changed
		if !fine && before == nil {
			g.waiting++ // from here signalLocked closes changed
		}
		g.mu.Unlock()
		if fine {
			return nil
		}
		if before != nil {
			before()
			before = nil
			continue
		}
		if stalled == nil {
			// A function timer, not a channel one: a mock clock advanced
			// while timers are being made can tick one timer twice, and a
			// second send on its full channel would block with the mock's
			// lock held (benbjohnson/clock 1.3.5; it hung the rpc tests on
			// RocksDB). Once makes a second call harmless.
			ch := make(chan struct{})
			var once sync.Once
			if g.progress != nil {
				mark = g.progress()
			}
			timer = g.clk.AfterFunc(g.stall, func() { once.Do(func() { close(ch) }) })
			stalled = ch
		}
		select {
		case <-changed:
			g.unwait()
		case <-g.ctx.Done():
			g.unwait()
			return fmt.Errorf("%w: connection closed", ErrUnavailable)
		case <-stalled:
			g.unwait()
			if g.progress != nil {
				if g.check != nil {
					g.check("reply gate", g.progress, mark)
				}
				if g.progress() != mark {
					// The socket took bytes meanwhile: the client reads,
					// if slowly. Wait another stall from here.
					stalled = nil
					continue
				}
			}
			g.kill()
			return fmt.Errorf("%w: the client read none of %d bytes of answers for %v; connection closed", ErrUnavailable, pending, g.stall)
		}
	}
}

// unwait ends a wait that await counted in waiting.
func (g *replyGate) unwait() {
	g.mu.Lock()
	g.waiting--
	g.mu.Unlock()
}

// gatedTransport is a connection's transport with its replyGate: it tells
// the gate when answers leave, and holds back reading while too many wait.
type gatedTransport struct {
	transport.Transport
	gate *replyGate
}

func (t *gatedTransport) NewMessage() (transport.OutgoingMessage, error) {
	m, err := t.Transport.NewMessage()
	if err != nil {
		return nil, err
	}
	return &gatedMsg{OutgoingMessage: m, gate: t.gate}, nil
}

func (t *gatedTransport) RecvMessage() (transport.IncomingMessage, error) {
	if err := t.gate.wait(nil); err != nil {
		return nil, err
	}
	return t.Transport.RecvMessage()
}

type gatedMsg struct {
	transport.OutgoingMessage
	gate *replyGate
}

func (m *gatedMsg) msg() *capnp.Message { return rpccp.Message(m.OutgoingMessage.Message()).Message() }

func (m *gatedMsg) Send() error {
	err := m.OutgoingMessage.Send()
	m.gate.done(m.msg())
	return err
}

func (m *gatedMsg) Release() {
	m.gate.done(m.msg())
	m.OutgoingMessage.Release()
}
