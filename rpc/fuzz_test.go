package rpc

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3"
	rpccp "capnproto.org/go/capnp/v3/std/capnp/rpc"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/memstore"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// FuzzServerConn feeds arbitrary rpc.capnp message sequences to one
// connection of a real Server over a memstore, as an untrusted client
// would. mode picks how data becomes bytes on the wire:
//
//	fuzzLiteral    data as is (framing and all);
//	fuzzFramed     data split into correctly framed messages whose segments
//	               hold arbitrary bytes (past the framing, into rpc.capnp);
//	fuzzStructured data is a little program (fuzzProgram) building
//	               structurally valid rpc.capnp Messages: Bootstrap, Call
//	               (any target, interface, method, params, cap table),
//	               Return, Finish, Release, Resolve, Disembargo, Abort,
//	               Unimplemented and the level-3 messages, with small ids
//	               so they refer to each other.
//
// It runs on the engine under test (TestMain runs it on each). The rest of
// mode (mode / fuzzModes, modulo fuzzStores) picks the store, and with it
// the paths the lean engine takes: a memstore, whose calls never wait and
// run on the connection's reader; the same without its Nonblocking, so
// that store calls and long polls run on the server's worker goroutines;
// or RocksDB with --sync=always (storage.Async: enqueues, polls and acks
// are answered by the goroutine that fsyncs them).
//
// Properties: the server does not panic; in the framed and structured
// modes it either answers a well-formed probe sent after the input or ends
// the connection, within fuzzBound (never hangs); once the connection is
// closed, the server lets go of it (no open connection, subscription or
// parked poll) and of every goroutine it started for it; and it then
// serves a fresh, well-behaved client. Each run counts the process's
// goroutines, so runs never call t.Parallel.
//
// Run with `make fuzz` or
// `go test -tags invariants -run '^$' -fuzz '^FuzzServerConn$' -fuzztime 60s ./rpc`.
func FuzzServerConn(f *testing.F) {
	for _, s := range fuzzSeeds(f) {
		f.Add(s.mode, s.data)
	}
	f.Fuzz(func(t *testing.T, mode uint8, data []byte) {
		fuzzServerConn(t, mode%fuzzModes, mode/fuzzModes%fuzzStores, data)
	})
}

// Fuzz modes (the mode argument modulo fuzzModes).
const (
	fuzzLiteral uint8 = iota
	fuzzFramed
	fuzzStructured
	fuzzModes
)

// Fuzz stores (mode / fuzzModes, modulo fuzzStores).
const (
	fuzzMemstore uint8 = iota
	fuzzWaitingStore
	fuzzRocksStore
	fuzzStores
)

// fuzzBound bounds every wait of the fuzz target: the server answering or
// closing, and letting go of a closed connection. It is a failure bound
// only; a healthy server takes milliseconds.
const fuzzBound = 10 * time.Second

// fuzzPoll is the polling interval of the fuzz target's bounded waits:
// short, because most runs wait a few goroutine exits twice and the
// fuzzer's throughput is what counts.
const fuzzPoll = 20 * time.Microsecond

// fuzzProbeQuestion is the first question id of the probe; the structured
// mode uses ids below 16 only.
const fuzzProbeQuestion = 1 << 20

func fuzzServerConn(t *testing.T, mode, storeKind uint8, data []byte) {
	var store storage.Store
	if storeKind == fuzzRocksStore {
		rs, err := openFuzzRocks()
		require.NoError(t, err)
		store = rs
	} else {
		ms := memstore.New(memstore.Options{})
		defer func() { _ = ms.Close() }()
		store = ms
		if storeKind == fuzzWaitingStore {
			store = waitingStore{ms}
		}
	}
	before := runtime.NumGoroutine()
	logs := &fuzzLogBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	})
	srv, err := NewServer(ServerConfig{Store: store, Clock: fuzzClock(), Engine: testEngine,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	require.NoError(t, err)
	defer srv.Stop() // after a failed require; Stop is idempotent

	var frames [][]byte
	switch mode {
	case fuzzLiteral:
		frames = [][]byte{data}
	case fuzzFramed:
		frames = framedMessages(data)
	default:
		frames = fuzzProgram(t, data)
	}

	// The probe's question ids are ones the frames sent do not name (as
	// little-endian words anywhere in them): the fuzzer learns the ids the
	// peer compares with, and a call of the input with the probe's id is
	// answered (an exception) and then makes the probe's reuse of it end
	// the connection, as it should (found by a fuzzing run, session 71).
	sent := bytes.Join(frames, nil)
	pq := uint32(fuzzProbeQuestion)
	for namesQuestion(sent, pq) || namesQuestion(sent, pq+1) {
		pq += 2
	}
	cs, ss := net.Pipe()
	peer := startFuzzPeer(cs, pq+1)
	srv.admit(ss, nil) // the Queue interface on the engine under test
	require.NoError(t, cs.SetWriteDeadline(time.Now().Add(fuzzBound)))
	var writeErr error
	for _, fr := range frames {
		if _, writeErr = cs.Write(fr); writeErr != nil {
			break
		}
	}
	var ne net.Error
	if errors.As(writeErr, &ne) && ne.Timeout() {
		t.Fatalf("the server stopped reading the connection for %v", fuzzBound)
	}
	if mode != fuzzLiteral && writeErr == nil {
		// Every frame was whole: the server must now answer a
		// well-formed probe or have ended the connection.
		_, _ = cs.Write(fuzzProbe(t, pq))
		select {
		case <-peer.answered:
		case <-peer.closed:
		case <-time.After(fuzzBound):
			t.Fatalf("the server neither answered the probe nor ended the connection within %v", fuzzBound)
		}
	}
	_ = cs.Close()
	<-peer.closed
	if err := peer.failure(); err != nil {
		t.Fatal(err)
	}

	// The server lets go of the closed connection and everything it
	// started for it.
	waitFor(t, "the server to let go of the closed connection", func() bool {
		m := srv.Metrics()
		return m.ConnsOpen == 0 && m.Subscriptions == 0 && m.Waiters == 0
	})
	// Idle workers wait for the next call until the server stops; the
	// check after Stop below counts them out.
	requireGoroutinesAtMost(t, func() int { return before + int(srv.workers.idle.Load()) })

	// A fresh, well-behaved client gets full service.
	ctx, cancel := context.WithTimeout(context.Background(), fuzzBound)
	defer cancel()
	c2, s2 := net.Pipe()
	srv.admit(s2, srv.queueBootstrap)
	c, err := NewClient(ctx, c2, ClientOptions{})
	require.NoError(t, err)
	res, err := c.Enqueue(ctx, "fresh", payloads(1, 8))
	require.NoError(t, err)
	require.Len(t, res, 1)
	queues, err := c.Queues(ctx)
	require.NoError(t, err)
	require.Contains(t, queues, "fresh")
	require.NoError(t, c.Close())
	srv.Stop()
	requireGoroutinesAtMost(t, func() int { return before })
}

// waitingStore is a store without the Nonblocking (and Async) of the one
// it wraps: the server runs its calls as it would a store's that wait for
// I/O.
type waitingStore struct{ storage.Store }

// fuzzRocks is the RocksDB store of the fuzz runs on RocksDB, opened once
// per process (opening one per run would take most of each run's time)
// and closed by TestMain (closeFuzzRocks). Runs share it, with whatever
// earlier runs left in it: the properties checked do not depend on what a
// queue holds.
var fuzzRocks struct {
	once sync.Once
	dir  string
	s    *rocksstore.Store
	err  error
}

// The fuzz engine kills its worker processes without running TestMain's
// cleanup, so each directory is named after its process and opening one
// removes those whose process is gone.
const fuzzRocksPrefix = "leaseq-fuzz-rocks-"

func openFuzzRocks() (*rocksstore.Store, error) {
	fuzzRocks.once.Do(func() {
		removeOrphanedFuzzRocks()
		if fuzzRocks.dir, fuzzRocks.err = os.MkdirTemp("", fmt.Sprintf("%s%d-", fuzzRocksPrefix, os.Getpid())); fuzzRocks.err == nil {
			fuzzRocks.s, fuzzRocks.err = rocksstore.Open(fuzzRocks.dir, rocksstore.Options{Sync: rocksstore.SyncAlways})
		}
	})
	return fuzzRocks.s, fuzzRocks.err
}

// removeOrphanedFuzzRocks removes the fuzz stores of processes that no
// longer run.
func removeOrphanedFuzzRocks() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), fuzzRocksPrefix+"*"))
	for _, d := range dirs {
		pid, _, ok := strings.Cut(strings.TrimPrefix(filepath.Base(d), fuzzRocksPrefix), "-")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || n <= 0 {
			continue
		}
		if syscall.Kill(n, 0) == syscall.ESRCH {
			_ = os.RemoveAll(d)
		}
	}
}

// closeFuzzRocks closes and removes fuzzRocks, if a run opened it.
func closeFuzzRocks() {
	if fuzzRocks.s != nil {
		_ = fuzzRocks.s.Close()
	}
	if fuzzRocks.dir != "" {
		_ = os.RemoveAll(fuzzRocks.dir)
	}
}

// fuzzClock is the mock clock of every fuzz run, made once: setting a mock
// clock costs a millisecond of real time, a third of a run. Nothing
// advances it, so runs cannot disturb one another through it.
var fuzzClock = sync.OnceValue(func() *clock.Mock {
	mock := clock.NewMock()
	mock.Set(testStart)
	return mock
})

// waitFor polls cond until it holds, failing after fuzzBound.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(fuzzBound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", fuzzBound, what)
		}
		time.Sleep(fuzzPoll) // polling interval, not synchronisation
	}
}

// requireGoroutinesAtMost waits until at most limit() goroutines run (it is
// asked again each time: idle workers come and go), and dumps them when
// that does not happen within fuzzBound.
func requireGoroutinesAtMost(t *testing.T, limit func() int) {
	t.Helper()
	deadline := time.Now().Add(fuzzBound)
	for runtime.NumGoroutine() > limit() {
		if time.Now().After(deadline) {
			var b strings.Builder
			_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Fatalf("goroutine leak: %d running, want at most %d:\n%s", runtime.NumGoroutine(), limit(), b.String())
		}
		time.Sleep(fuzzPoll) // polling interval, not synchronisation
	}
}

// fuzzLogBuffer keeps the server's log of one fuzz run, shown on failure.
type fuzzLogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *fuzzLogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() < 1<<20 {
		l.b.Write(p)
	}
	return len(p), nil
}

func (l *fuzzLogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// fuzzPeer reads what the server sends on the fuzz connection, so the
// server never blocks writing, and watches for the probe's answer.
type fuzzPeer struct {
	probe    uint32
	answered chan struct{} // closed when the probe's Return arrives
	closed   chan struct{} // closed when reading ends
	once     sync.Once
	mu       sync.Mutex
	err      error // the server sent something that is not a message
}

func startFuzzPeer(conn net.Conn, probe uint32) *fuzzPeer {
	p := &fuzzPeer{probe: probe, answered: make(chan struct{}), closed: make(chan struct{})}
	go p.run(conn) // ends when conn is closed, which every run does
	return p
}

func (p *fuzzPeer) run(conn net.Conn) {
	defer close(p.closed)
	dec := capnp.NewDecoder(conn)
	for {
		msg, err := dec.Decode()
		if err != nil {
			// A frame cut short is the connection going away mid-write.
			if !isDisconnect(err) && !errors.Is(err, io.ErrUnexpectedEOF) {
				p.mu.Lock()
				p.err = err
				p.mu.Unlock()
			}
			_, _ = io.Copy(io.Discard, conn)
			return
		}
		if m, err := rpccp.ReadRootMessage(msg); err == nil && m.Which() == rpccp.Message_Which_return {
			if r, err := m.Return(); err == nil && r.AnswerId() == p.probe {
				if r.Which() != rpccp.Return_Which_results {
					p.mu.Lock()
					p.err = errors.New("the probe's answer is not results: " + r.Which().String())
					p.mu.Unlock()
				}
				p.once.Do(func() { close(p.answered) })
			}
		}
		msg.Release()
	}
}

// failure reports a malformed message from the server or a failed probe.
func (p *fuzzPeer) failure() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return errors.New("fuzz peer: " + p.err.Error())
	}
	return nil
}

// namesQuestion reports whether data holds id as a little-endian word.
func namesQuestion(data []byte, id uint32) bool {
	return bytes.Contains(data, binary.LittleEndian.AppendUint32(nil, id))
}

// fuzzProbe is a well-behaved client's first two messages: Bootstrap
// (question q), and Queue.queues pipelined on its answer (q+1).
func fuzzProbe(t *testing.T, q uint32) []byte {
	boot := rpcMessageBytes(t, func(m rpccp.Message) error {
		b, err := m.NewBootstrap()
		if err != nil {
			return err
		}
		b.SetQuestionId(q)
		return nil
	})
	call := rpcMessageBytes(t, func(m rpccp.Message) error {
		c, err := m.NewCall()
		if err != nil {
			return err
		}
		c.SetQuestionId(q + 1)
		c.SetInterfaceId(schema.Queue_TypeID)
		c.SetMethodId(6) // queues
		tgt, err := c.NewTarget()
		if err != nil {
			return err
		}
		if err := promisedAnswerTarget(tgt, q, nil); err != nil {
			return err
		}
		p, err := c.NewParams()
		if err != nil {
			return err
		}
		st, err := capnp.NewStruct(p.Segment(), capnp.ObjectSize{})
		if err != nil {
			return err
		}
		return p.SetContent(st.ToPtr())
	})
	return append(boot, call...)
}

// fuzzSeed is one entry of the seed corpus.
type fuzzSeed struct {
	mode uint8
	data []byte
}

// fuzzSeeds are valid sequences (bootstrap and a stats call, bootstrap and
// an enqueue, a subscribe whose consumer is the client's), their framed
// bytes, and garbage.
func fuzzSeeds(tb testing.TB) []fuzzSeed {
	const (
		ptrNull    = 0
		ptrParams  = 1
		ptrName    = 2 // then the index into fuzzNames
		ptrItems   = 4
		ptrCap     = 6
		targetBoot = 0 // importedCap(0): the bootstrap Queue
		ifaceQueue = 0
		wordZero   = 0
	)
	// call: opCall, question, target, interface, method, flags, then the
	// params payload: content, then cap table size (and descriptors).
	call := func(q, method byte, params ...byte) []byte {
		return append([]byte{opCall, q, targetBoot, ifaceQueue, method, 0}, params...)
	}
	boot := []byte{opBootstrap, 0}
	stats := call(1, 5, ptrParams, wordZero, wordZero, wordZero, ptrName, 0, ptrNull, ptrNull, ptrNull, 0)
	enqueue := call(1, 0, ptrParams, wordZero, wordZero, wordZero,
		ptrName, 1, // queue "jobs"
		ptrItems, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 'a', 'b', 'c', 5, 0, 0, 0, 0, 0, 0, 0, 0, 1, 'x',
		ptrNull, ptrNull, 0)
	// subscribe(queue "jobs", prefetch 1, leaseMs 0, consumer: the
	// client's export 0), then an enqueue so the server pushes to it.
	subscribe := call(1, 14, ptrParams, 1|1<<2, wordZero, wordZero,
		ptrName, 1, ptrCap, 0, ptrNull, ptrNull,
		1, 1, 0) // cap table: one senderHosted(0)
	finish := []byte{opFinish, 1, 0}
	// nodeInfo as question 2, pipelined on field 0 of question 1's
	// results (stats: no capability in them), once they have returned:
	// the lean engine read that Return after its buffer was reused.
	pipelinedOnStats := []byte{opCall, 2, 1 | 1<<1 /* promisedAnswer(1) */, 1 /* one op */, 1 /* getPointerField(0) */, ifaceQueue, 15, 0, ptrNull, 0}
	var seeds []fuzzSeed
	for _, prog := range [][]byte{
		slices.Concat(boot, stats),
		slices.Concat(boot, enqueue),
		slices.Concat(boot, enqueue, finish, stats),
		slices.Concat(boot, stats, pipelinedOnStats),
		slices.Concat(boot, subscribe, call(2, 0, enqueue[6:]...)),
		slices.Concat(boot, []byte{opRelease, 0, 1}, stats),
		slices.Concat(boot, []byte{opAbort, 0, 4, 'b', 'y', 'e', '!'}),
	} {
		seeds = append(seeds, fuzzSeed{fuzzStructured, prog})
	}
	// The same valid sequence framed: each message's segment as the
	// framed mode reads it.
	var framed []byte
	for _, m := range fuzzProgram(tb, slices.Concat(boot, stats)) {
		words := m[8:]
		framed = append(framed, 0, byte(len(words)/8))
		framed = append(framed, words...)
	}
	seeds = append(seeds, fuzzSeed{fuzzFramed, framed})
	var literal []byte
	for _, m := range fuzzProgram(tb, slices.Concat(boot, enqueue)) {
		literal = append(literal, m...)
	}
	seeds = append(seeds,
		fuzzSeed{fuzzLiteral, literal},
		fuzzSeed{fuzzLiteral, bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 16)},
		fuzzSeed{fuzzFramed, []byte{0, 3, 1, 2, 3}},
		fuzzSeed{fuzzStructured, []byte{opOddRoot, 2, 1, 7, 1}},
	)
	// The structured seeds again on the other stores.
	for _, sd := range seeds {
		if sd.mode == fuzzStructured {
			for st := fuzzWaitingStore; st < fuzzStores; st++ {
				seeds = append(seeds, fuzzSeed{sd.mode + st*fuzzModes, sd.data})
			}
		}
	}
	return seeds
}
