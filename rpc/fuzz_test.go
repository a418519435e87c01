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

	cs, ss := net.Pipe()
	peer := startFuzzPeer(cs, fuzzProbeQuestion+1)
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
		_, _ = cs.Write(fuzzProbe(t))
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

// fuzzProbe is a well-behaved client's first two messages: Bootstrap, and
// Queue.queues pipelined on its answer.
func fuzzProbe(t *testing.T) []byte {
	boot := rpcMessageBytes(t, func(m rpccp.Message) error {
		b, err := m.NewBootstrap()
		if err != nil {
			return err
		}
		b.SetQuestionId(fuzzProbeQuestion)
		return nil
	})
	call := rpcMessageBytes(t, func(m rpccp.Message) error {
		c, err := m.NewCall()
		if err != nil {
			return err
		}
		c.SetQuestionId(fuzzProbeQuestion + 1)
		c.SetInterfaceId(schema.Queue_TypeID)
		c.SetMethodId(6) // queues
		tgt, err := c.NewTarget()
		if err != nil {
			return err
		}
		if err := promisedAnswerTarget(tgt, fuzzProbeQuestion, nil); err != nil {
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

// framedMessages splits data into framed messages: per message, one byte
// for the segment count (1-3), one per segment for its size in words, then
// the segments' bytes (zeros past the end of data).
func framedMessages(data []byte) [][]byte {
	src := &fuzzSrc{b: data}
	var out [][]byte
	for !src.empty() && len(out) < 64 {
		nseg := 1 + int(src.byte())%3
		sizes := make([]uint32, nseg)
		for i := range sizes {
			sizes[i] = uint32(src.byte())
		}
		hdr := make([]byte, 4+4*nseg)
		binary.LittleEndian.PutUint32(hdr, uint32(nseg-1))
		for i, s := range sizes {
			binary.LittleEndian.PutUint32(hdr[4+4*i:], s)
		}
		if len(hdr)%8 != 0 {
			hdr = append(hdr, 0, 0, 0, 0)
		}
		fr := hdr
		for _, s := range sizes {
			fr = append(fr, src.bytes(int(s)*8)...)
		}
		out = append(out, fr)
	}
	return out
}

// fuzzSrc hands out the fuzz input byte by byte; past its end, zeros.
type fuzzSrc struct{ b []byte }

func (s *fuzzSrc) empty() bool { return len(s.b) == 0 }

func (s *fuzzSrc) byte() byte {
	if len(s.b) == 0 {
		return 0
	}
	c := s.b[0]
	s.b = s.b[1:]
	return c
}

// bytes returns the next n bytes, zero-padded past the end of the input.
func (s *fuzzSrc) bytes(n int) []byte {
	out := make([]byte, n)
	k := copy(out, s.b)
	s.b = s.b[k:]
	return out
}

func (s *fuzzSrc) u64() uint64 { return binary.LittleEndian.Uint64(s.bytes(8)) }

// Opcodes of the structured mode: each message starts with one byte, whose
// value modulo numFuzzOps picks the message.
const (
	opBootstrap = iota
	opCall
	opFinish
	opRelease
	opReturn
	opDisembargo
	opAbort
	opResolve
	opUnimplemented
	opLevel3 // provide, accept or join
	opOddRoot
	numFuzzOps
)

// fuzzNames are the queue names the structured mode uses: a few valid
// ones, so calls reach the store, and a few invalid ones.
var fuzzNames = []string{"q", "jobs", "", "a/b", "fuzz", strings.Repeat("n", 300)}

// fuzzProgram runs data as a program of at most 64 messages (see the op*
// constants and the build functions for each one's operands) and returns
// them framed.
func fuzzProgram(t testing.TB, data []byte) [][]byte {
	src := &fuzzSrc{b: data}
	var out [][]byte
	for !src.empty() && len(out) < 64 {
		op := src.byte() % numFuzzOps
		if op == opOddRoot {
			out = append(out, oddRoot(t, src))
			continue
		}
		out = append(out, rpcMessageBytes(t, func(m rpccp.Message) error { return buildMessage(m, op, src) }))
	}
	return out
}

// oddRoot is a root struct of arbitrary shape: a union tag no Message has,
// or a Message whose fields have the wrong types.
func oddRoot(t testing.TB, src *fuzzSrc) []byte {
	msg, seg, err := capnp.NewMessage(capnp.SingleSegment(nil))
	require.NoError(t, err)
	defer msg.Release()
	size := capnp.ObjectSize{DataSize: capnp.Size(8 * (src.byte() % 3)), PointerCount: uint16(src.byte() % 3)}
	st, err := capnp.NewRootStruct(seg, size)
	require.NoError(t, err)
	if size.DataSize > 0 {
		st.SetUint16(0, uint16(src.byte())%24) // the union tag
		if size.DataSize > 8 {
			st.SetUint64(8, src.u64())
		}
	}
	for i := uint16(0); i < size.PointerCount; i++ {
		p, err := fuzzPtr(seg, src, 0)
		require.NoError(t, err)
		require.NoError(t, st.SetPtr(i, p))
	}
	b, err := msg.Marshal()
	require.NoError(t, err)
	return b
}

func buildMessage(m rpccp.Message, op byte, src *fuzzSrc) error {
	switch op {
	case opBootstrap:
		b, err := m.NewBootstrap()
		if err != nil {
			return err
		}
		b.SetQuestionId(uint32(src.byte() % 16))
		return nil
	case opCall:
		return buildCall(m, src)
	case opFinish:
		f, err := m.NewFinish()
		if err != nil {
			return err
		}
		f.SetQuestionId(uint32(src.byte() % 16))
		flags := src.byte()
		f.SetReleaseResultCaps(flags&1 != 0)
		f.SetRequireEarlyCancellationWorkaround(flags&2 != 0)
		return nil
	case opRelease:
		r, err := m.NewRelease()
		if err != nil {
			return err
		}
		r.SetId(uint32(src.byte() % 8))
		r.SetReferenceCount(uint32(src.byte() % 4))
		return nil
	case opReturn:
		return buildReturn(m, src)
	case opDisembargo:
		d, err := m.NewDisembargo()
		if err != nil {
			return err
		}
		tgt, err := d.NewTarget()
		if err != nil {
			return err
		}
		if err := fuzzTarget(tgt, src); err != nil {
			return err
		}
		switch id := uint32(src.byte()); id % 3 {
		case 0:
			d.Context().SetSenderLoopback(id / 3 % 8)
		case 1:
			d.Context().SetReceiverLoopback(id / 3 % 8)
		default:
			return d.Context().SetAccept(src.bytes(int(id / 3 % 4)))
		}
		return nil
	case opAbort:
		e, err := m.NewAbort()
		if err != nil {
			return err
		}
		return fuzzException(e, src)
	case opResolve:
		r, err := m.NewResolve()
		if err != nil {
			return err
		}
		r.SetPromiseId(uint32(src.byte() % 8))
		if src.byte()%2 == 0 {
			d, err := r.NewCap()
			if err != nil {
				return err
			}
			return fuzzCapDescriptor(d, src)
		}
		e, err := r.NewException()
		if err != nil {
			return err
		}
		return fuzzException(e, src)
	case opUnimplemented:
		// Unimplemented echoes a message the server sent (or not).
		inner, err := m.NewUnimplemented()
		if err != nil {
			return err
		}
		sub := src.byte() % numFuzzOps
		if sub == opUnimplemented || sub == opOddRoot {
			sub = opCall
		}
		return buildMessage(inner, sub, src)
	case opLevel3:
		return buildLevel3(m, src)
	}
	return nil
}

func buildCall(m rpccp.Message, src *fuzzSrc) error {
	c, err := m.NewCall()
	if err != nil {
		return err
	}
	c.SetQuestionId(uint32(src.byte() % 16))
	tgt, err := c.NewTarget()
	if err != nil {
		return err
	}
	if err := fuzzTarget(tgt, src); err != nil {
		return err
	}
	switch src.byte() % 4 {
	case 0:
		c.SetInterfaceId(schema.Queue_TypeID)
	case 1:
		c.SetInterfaceId(schema.Consumer_TypeID)
	case 2:
		c.SetInterfaceId(schema.Subscription_TypeID)
	default:
		c.SetInterfaceId(src.u64())
	}
	c.SetMethodId(uint16(src.byte() % 20)) // Queue has 17 methods
	flags := src.byte()
	switch flags % 3 {
	case 1:
		c.SendResultsTo().SetYourself()
	case 2:
		if err := c.SendResultsTo().SetThirdParty(capnp.Ptr{}); err != nil {
			return err
		}
	}
	c.SetNoPromisePipelining(flags&4 != 0)
	c.SetOnlyPromisePipeline(flags&8 != 0)
	c.SetAllowThirdPartyTailCall(flags&16 != 0)
	p, err := c.NewParams()
	if err != nil {
		return err
	}
	return fuzzPayload(p, src)
}

func buildReturn(m rpccp.Message, src *fuzzSrc) error {
	r, err := m.NewReturn()
	if err != nil {
		return err
	}
	r.SetAnswerId(uint32(src.byte() % 16))
	flags := src.byte()
	r.SetReleaseParamCaps(flags&1 != 0)
	r.SetNoFinishNeeded(flags&2 != 0)
	switch flags / 4 % 6 {
	case 0:
		p, err := r.NewResults()
		if err != nil {
			return err
		}
		return fuzzPayload(p, src)
	case 1:
		e, err := r.NewException()
		if err != nil {
			return err
		}
		return fuzzException(e, src)
	case 2:
		r.SetCanceled()
	case 3:
		r.SetResultsSentElsewhere()
	case 4:
		r.SetTakeFromOtherQuestion(uint32(src.byte() % 16))
	default:
		return r.SetAwaitFromThirdParty(capnp.Ptr{})
	}
	return nil
}

func buildLevel3(m rpccp.Message, src *fuzzSrc) error {
	q := uint32(src.byte() % 16)
	switch src.byte() % 3 {
	case 0:
		p, err := m.NewProvide()
		if err != nil {
			return err
		}
		p.SetQuestionId(q)
		tgt, err := p.NewTarget()
		if err != nil {
			return err
		}
		return fuzzTarget(tgt, src)
	case 1:
		a, err := m.NewAccept()
		if err != nil {
			return err
		}
		a.SetQuestionId(q)
		return a.SetEmbargo(src.bytes(int(src.byte() % 4)))
	default:
		j, err := m.NewJoin()
		if err != nil {
			return err
		}
		j.SetQuestionId(q)
		tgt, err := j.NewTarget()
		if err != nil {
			return err
		}
		return fuzzTarget(tgt, src)
	}
}

// fuzzTarget is an imported capability (the bootstrap Queue is export 0
// once bootstrapped) or a promised answer with a short transform.
func fuzzTarget(tgt rpccp.MessageTarget, src *fuzzSrc) error {
	b := src.byte()
	if b%2 == 0 {
		tgt.SetImportedCap(uint32(b / 2 % 8))
		return nil
	}
	pa, err := tgt.NewPromisedAnswer()
	if err != nil {
		return err
	}
	return fuzzPromisedAnswer(pa, uint32(b/2%16), src)
}

func fuzzPromisedAnswer(pa rpccp.PromisedAnswer, q uint32, src *fuzzSrc) error {
	pa.SetQuestionId(q)
	n := int32(src.byte() % 3)
	if n == 0 {
		return nil
	}
	ops, err := pa.NewTransform(n)
	if err != nil {
		return err
	}
	for i := range int(n) {
		if b := src.byte(); b%2 == 0 {
			ops.At(i).SetNoop()
		} else {
			ops.At(i).SetGetPointerField(uint16(b / 2 % 4))
		}
	}
	return nil
}

func fuzzException(e rpccp.Exception, src *fuzzSrc) error {
	e.SetType(rpccp.Exception_Type(src.byte() % 5))
	return e.SetReason(string(src.bytes(int(src.byte() % 16))))
}

// fuzzPayload fills a Call's params or a Return's results: content and a
// cap table of up to 3 entries.
func fuzzPayload(p rpccp.Payload, src *fuzzSrc) error {
	content, err := fuzzPtr(p.Segment(), src, 0)
	if err != nil {
		return err
	}
	if err := p.SetContent(content); err != nil {
		return err
	}
	n := int32(src.byte() % 4)
	if n == 0 {
		return nil
	}
	caps, err := p.NewCapTable(n)
	if err != nil {
		return err
	}
	for i := range int(n) {
		if err := fuzzCapDescriptor(caps.At(i), src); err != nil {
			return err
		}
	}
	return nil
}

func fuzzCapDescriptor(d rpccp.CapDescriptor, src *fuzzSrc) error {
	b := src.byte()
	id := uint32(src.byte() % 8)
	switch b % 6 {
	case 0:
		d.SetNone()
	case 1:
		d.SetSenderHosted(id)
	case 2:
		d.SetSenderPromise(id)
	case 3:
		d.SetReceiverHosted(id)
	case 4:
		pa, err := d.NewReceiverAnswer()
		if err != nil {
			return err
		}
		return fuzzPromisedAnswer(pa, id*2%16, src)
	default:
		tp, err := d.NewThirdPartyHosted()
		if err != nil {
			return err
		}
		tp.SetVineId(id)
	}
	return nil
}

// fuzzPtr builds a pointer of the fuzz input's choosing: the kinds every
// Queue method's params hold (text, data, lists of items and ids, a
// capability), a generic params struct, or nothing. depth bounds nesting.
func fuzzPtr(seg *capnp.Segment, src *fuzzSrc, depth int) (capnp.Ptr, error) {
	switch src.byte() % 8 {
	case 1:
		return fuzzParams(seg, src, depth)
	case 2:
		txt, err := capnp.NewText(seg, fuzzNames[int(src.byte())%len(fuzzNames)])
		return txt.ToPtr(), err
	case 3:
		n := int(src.byte() % 24)
		if n%8 == 0 {
			n = 16 // ids and lease tokens
		}
		d, err := capnp.NewData(seg, src.bytes(n))
		return d.ToPtr(), err
	case 4: // items, as enqueue takes them
		n := int32(src.byte() % 4)
		l, err := capnp.NewCompositeList(seg, capnp.ObjectSize{DataSize: 16, PointerCount: 2}, n)
		if err != nil {
			return capnp.Ptr{}, err
		}
		for i := range int(n) {
			it := l.Struct(i)
			it.SetUint64(0, uint64(src.byte())*1000) // delayMs
			it.SetUint64(8, src.u64())               // priority, maxAttempts
			d, err := capnp.NewData(seg, src.bytes(int(src.byte()%8)))
			if err != nil {
				return capnp.Ptr{}, err
			}
			if err := it.SetPtr(0, d.ToPtr()); err != nil {
				return capnp.Ptr{}, err
			}
		}
		return l.ToPtr(), nil
	case 5: // ids
		n := int32(src.byte() % 4)
		l, err := capnp.NewDataList(seg, n)
		if err != nil {
			return capnp.Ptr{}, err
		}
		for i := range int(n) {
			size := 16
			if b := src.byte(); b%4 == 0 {
				size = int(b) % 20
			}
			if err := l.Set(i, src.bytes(size)); err != nil {
				return capnp.Ptr{}, err
			}
		}
		return l.ToPtr(), nil
	case 6: // a capability: an index into the payload's cap table
		return capnp.NewInterface(seg, capnp.CapabilityID(src.byte()%4)).ToPtr(), nil
	case 7:
		l, err := capnp.NewUInt64List(seg, int32(src.byte()%4))
		return l.ToPtr(), err
	}
	return capnp.Ptr{}, nil
}

// fuzzParams is a struct big enough to be any Queue method's params (and
// any result the server waits for): 3 data words of small, large or
// extreme values, and 4 pointers.
func fuzzParams(seg *capnp.Segment, src *fuzzSrc, depth int) (capnp.Ptr, error) {
	if depth > 2 {
		return capnp.Ptr{}, nil
	}
	st, err := capnp.NewStruct(seg, capnp.ObjectSize{DataSize: 24, PointerCount: 4})
	if err != nil {
		return capnp.Ptr{}, err
	}
	for i := range 3 {
		var v uint64
		switch b := src.byte(); b % 4 {
		case 1:
			v = uint64(b / 4)
		case 2:
			v = src.u64()
		case 3:
			v = ^uint64(b / 4)
		}
		st.SetUint64(capnp.DataOffset(8*i), v)
	}
	for i := range uint16(4) {
		p, err := fuzzPtr(seg, src, depth+1)
		if err != nil {
			return capnp.Ptr{}, err
		}
		if err := st.SetPtr(i, p); err != nil {
			return capnp.Ptr{}, err
		}
	}
	return st.ToPtr(), nil
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
