package queueber

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strings"
	"testing"
	"time"

	"capnproto.org/go/capnp/v3/exc"
	capnprpc "capnproto.org/go/capnp/v3/rpc"
	"capnproto.org/go/capnp/v3/rpc/transport"
	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/rpc/rpctest"
	qbschema "github.com/leaseq/leaseq/schema/queueber"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestSchema_TypeIDs pins the type ids of schema/queueber.capnp to
// Queueber's: a client compiled from Queueber's own schema sends these
// interface and struct ids, so a change here breaks every such client.
func TestSchema_TypeIDs(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		got  uint64
		want uint64
	}{
		{"Queue", qbschema.Queue_TypeID, 0x8323a518d3254563},
		{"AddRequest", qbschema.AddRequest_TypeID, 0x957e89f15bf7073c},
		{"PollRequest", qbschema.PollRequest_TypeID, 0x909ba3f7e191287e},
	} {
		require.Equal(t, fmt.Sprintf("%#x", c.want), fmt.Sprintf("%#x", c.got), c.name)
	}
}

const testQueue = "qb-jobs"

// testStart is the mock clock's starting instant.
var testStart = time.Date(2026, 11, 22, 1, 0, 0, 0, time.UTC)

type testBundle struct {
	t     *testing.T
	store storage.Store
	clock *clock.Mock
	srv   *rpc.Server
	main  string // the Queue interface's address
	qb    string // the Queueber listener's address
}

// setup starts an rpc server over a RocksDB store in t.TempDir(), with the
// Queue interface and the Queueber protocol (over testQueue) on two
// loopback listeners.
func setup(t *testing.T, limits storage.Limits) *testBundle {
	t.Helper()
	return setupWith(t, func(c *rpc.ServerConfig) { c.Limits = limits })
}

// setupWith is setup with the server's config changed by mutate.
func setupWith(t *testing.T, mutate func(*rpc.ServerConfig)) *testBundle {
	t.Helper()
	st, err := rocksstore.Open(t.TempDir(), rocksstore.Options{Sync: rocksstore.SyncNone})
	require.NoError(t, err)
	t.Cleanup(func() { _ = st.Close() })
	mock := clock.NewMock()
	mock.Set(testStart)
	cfg := rpc.ServerConfig{Store: st, Clock: mock, Logger: rpctest.Logger(t)}
	mutate(&cfg)
	srv, err := rpc.NewServer(cfg)
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	b := &testBundle{t: t, store: st, clock: mock, srv: srv}

	ln, err := rpc.Listen("127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, srv.Start(context.Background(), ln))
	b.main = ln.Addr().String()

	boot, err := Bootstrap(srv, testQueue)
	require.NoError(t, err)
	qln, err := rpc.Listen("127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, srv.StartBootstrap(context.Background(), qln, boot))
	b.qb = qln.Addr().String()
	return b
}

// dial connects a Queueber client, built from the same schema, over TCP.
func (b *testBundle) dial() qbschema.Queue {
	b.t.Helper()
	nc, err := net.Dial("tcp", b.qb)
	require.NoError(b.t, err)
	return b.client(nc)
}

// client runs a Queueber client over nc.
func (b *testBundle) client(nc net.Conn) qbschema.Queue {
	b.t.Helper()
	conn := capnprpc.NewConn(transport.NewStream(nc), &capnprpc.Options{Logger: quietLogger()})
	q := qbschema.Queue(conn.Bootstrap(context.Background()))
	b.t.Cleanup(func() {
		q.Release()
		_ = conn.Close()
	})
	return q
}

// leaseq is a client of the node's own Queue interface.
func (b *testBundle) leaseq() *rpc.Client {
	b.t.Helper()
	c, err := rpc.Dial(ctxT(b.t), b.main, rpc.ClientOptions{Logger: quietLogger()})
	require.NoError(b.t, err)
	b.t.Cleanup(func() { _ = c.Close() })
	return c
}

func (b *testBundle) stats() storage.QueueStats {
	b.t.Helper()
	st, err := b.leaseq().Stats(ctxT(b.t), testQueue)
	require.NoError(b.t, err)
	require.Len(b.t, st, 1)
	return st[0]
}

// sweep expires due leases and promotes due items at the mock clock's now,
// as the node's sweeper would, and wakes parked polls.
func (b *testBundle) sweep() storage.SweepResult {
	b.t.Helper()
	r, err := b.store.Sweep(ctxT(b.t), storage.SweepParams{Now: b.clock.Now(), Limit: 100})
	require.NoError(b.t, err)
	b.srv.Wake(r.ReadyQueues)
	return r
}

type addItem struct {
	contents string
	delay    uint64
}

func add(ctx context.Context, q qbschema.Queue, items ...addItem) ([][]byte, error) {
	f, release := q.Add(ctx, func(p qbschema.Queue_add_Params) error {
		req, err := p.NewReq()
		if err != nil {
			return err
		}
		l, err := req.NewItems(int32(len(items)))
		if err != nil {
			return err
		}
		for i, it := range items {
			if err := l.At(i).SetContents([]byte(it.contents)); err != nil {
				return err
			}
			l.At(i).SetVisibilityTimeoutSecs(it.delay)
		}
		return nil
	})
	defer release()
	res, err := f.Struct()
	if err != nil {
		return nil, err
	}
	resp, err := res.Resp()
	if err != nil {
		return nil, err
	}
	l, err := resp.Ids()
	if err != nil {
		return nil, err
	}
	ids := make([][]byte, l.Len())
	for i := range ids {
		id, err := l.At(i)
		if err != nil {
			return nil, err
		}
		ids[i] = bytes.Clone(id)
	}
	return ids, nil
}

type polled struct {
	lease    []byte
	ids      [][]byte
	contents []string
}

func poll(ctx context.Context, q qbschema.Queue, leaseSecs uint64, n uint32, timeoutSecs uint64) (polled, error) {
	f, release := q.Poll(ctx, func(p qbschema.Queue_poll_Params) error {
		req, err := p.NewReq()
		if err != nil {
			return err
		}
		req.SetLeaseValiditySecs(leaseSecs)
		req.SetNumItems(n)
		req.SetTimeoutSecs(timeoutSecs)
		return nil
	})
	defer release()
	res, err := f.Struct()
	if err != nil {
		return polled{}, err
	}
	resp, err := res.Resp()
	if err != nil {
		return polled{}, err
	}
	var out polled
	lease, err := resp.Lease()
	if err != nil {
		return polled{}, err
	}
	out.lease = bytes.Clone(lease)
	l, err := resp.Items()
	if err != nil {
		return polled{}, err
	}
	for i := 0; i < l.Len(); i++ {
		id, err := l.At(i).Id()
		if err != nil {
			return polled{}, err
		}
		c, err := l.At(i).Contents()
		if err != nil {
			return polled{}, err
		}
		out.ids = append(out.ids, bytes.Clone(id))
		out.contents = append(out.contents, string(c))
	}
	return out, nil
}

func remove(ctx context.Context, q qbschema.Queue, id, lease []byte) (bool, error) {
	f, release := q.Remove(ctx, func(p qbschema.Queue_remove_Params) error {
		req, err := p.NewReq()
		if err != nil {
			return err
		}
		if err := req.SetId(id); err != nil {
			return err
		}
		return req.SetLease(lease)
	})
	defer release()
	res, err := f.Struct()
	if err != nil {
		return false, err
	}
	resp, err := res.Resp()
	if err != nil {
		return false, err
	}
	return resp.Removed(), nil
}

func extend(ctx context.Context, q qbschema.Queue, lease []byte, secs uint64) (bool, error) {
	f, release := q.Extend(ctx, func(p qbschema.Queue_extend_Params) error {
		req, err := p.NewReq()
		if err != nil {
			return err
		}
		req.SetLeaseValiditySecs(secs)
		return req.SetLease(lease)
	})
	defer release()
	res, err := f.Struct()
	if err != nil {
		return false, err
	}
	resp, err := res.Resp()
	if err != nil {
		return false, err
	}
	return resp.Extended(), nil
}

// requireException checks that err is a Cap'n Proto exception of type typ
// whose message contains want.
func requireException(t *testing.T, err error, typ exc.Type, want string) {
	t.Helper()
	require.Error(t, err)
	require.Equal(t, typ, exc.TypeOf(err), "exception type of %v", err)
	require.Contains(t, err.Error(), want)
}

func TestQueueber_AddPollRemoveExtend(t *testing.T) {
	t.Parallel()
	b := setup(t, storage.Limits{})
	q := b.dial()
	ctx := ctxT(t)

	ids, err := add(ctx, q, addItem{contents: "a"}, addItem{contents: "b"}, addItem{contents: "c"})
	require.NoError(t, err)
	require.Len(t, ids, 3)
	for _, id := range ids {
		require.Len(t, id, 16)
	}
	st := b.stats()
	require.Equal(t, int64(3), st.Ready)
	require.Equal(t, uint64(3), st.Enqueued)

	// numItems 0 means 1; FIFO.
	p1, err := poll(ctx, q, 30, 0, 1)
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, p1.contents)
	require.Equal(t, ids[:1], p1.ids)
	require.Len(t, p1.lease, 16)

	p2, err := poll(ctx, q, 30, 10, 1)
	require.NoError(t, err)
	require.Equal(t, []string{"b", "c"}, p2.contents)
	require.Equal(t, ids[1:], p2.ids)
	require.NotEqual(t, p1.lease, p2.lease, "every poll gets a new lease")
	st = b.stats()
	require.Equal(t, int64(0), st.Ready)
	require.Equal(t, int64(3), st.Inflight)
	require.Equal(t, int64(2), st.Leases)

	ok, err := extend(ctx, q, p2.lease, 60)
	require.NoError(t, err)
	require.True(t, ok)
	// 35 s later p1's 30 s lease has run out, p2's extended one has not.
	b.clock.Add(35 * time.Second)
	b.sweep()
	ok, err = extend(ctx, q, p1.lease, 60)
	require.NoError(t, err)
	require.False(t, ok, "an expired lease is not extended")

	// Remove under the wrong lease, then the right one, then again.
	removed, err := remove(ctx, q, ids[1], p1.lease)
	require.NoError(t, err)
	require.False(t, removed)
	for _, id := range p2.ids {
		removed, err = remove(ctx, q, id, p2.lease)
		require.NoError(t, err)
		require.True(t, removed)
	}
	removed, err = remove(ctx, q, ids[1], p2.lease)
	require.NoError(t, err)
	require.False(t, removed, "an item is removed once")
	ok, err = extend(ctx, q, p2.lease, 60)
	require.NoError(t, err)
	require.False(t, ok, "a finished lease is gone")

	// "a" came back when p1 expired: redelivered under a new lease.
	p3, err := poll(ctx, q, 30, 10, 1)
	require.NoError(t, err)
	require.Equal(t, ids[:1], p3.ids)
	removed, err = remove(ctx, q, ids[0], p1.lease)
	require.NoError(t, err)
	require.False(t, removed, "the expired lease no longer holds the item")
	removed, err = remove(ctx, q, ids[0], p3.lease)
	require.NoError(t, err)
	require.True(t, removed)

	st = b.stats()
	require.Equal(t, int64(0), st.Ready+st.Inflight+st.Delayed)
	require.Equal(t, uint64(3), st.Acked)
	require.Equal(t, uint64(1), st.Expired)
	require.Equal(t, uint64(4), st.Delivered)
	ops := b.srv.Metrics().Ops
	require.Equal(t, uint64(1), ops[rpc.OpEnqueue].Count)
	require.Equal(t, uint64(3), ops[rpc.OpPoll].Count)
	require.Equal(t, uint64(6), ops[rpc.OpAck].Count)
}

func TestQueueber_DelayedAdd(t *testing.T) {
	t.Parallel()
	b := setup(t, storage.Limits{})
	q := b.dial()
	ctx := ctxT(t)
	ids, err := add(ctx, q, addItem{contents: "later", delay: 5})
	require.NoError(t, err)
	st := b.stats()
	require.Equal(t, int64(1), st.Delayed)
	require.Equal(t, int64(0), st.Ready)

	// A long poll parks; the item comes due and the sweeper wakes it.
	ch := goPoll(q, 30, 1, 30)
	rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
	b.clock.Add(5 * time.Second)
	require.Equal(t, 1, b.sweep().Promoted)
	o := recvPoll(t, ch)
	require.NoError(t, o.err)
	require.Equal(t, ids, o.p.ids)
	require.Equal(t, []string{"later"}, o.p.contents)
}

type pollOut struct {
	p   polled
	err error
}

func goPoll(q qbschema.Queue, leaseSecs uint64, n uint32, timeoutSecs uint64) <-chan pollOut {
	return rpctest.Go(func() pollOut {
		p, err := poll(context.Background(), q, leaseSecs, n, timeoutSecs)
		return pollOut{p, err}
	})
}

func recvPoll(t *testing.T, ch <-chan pollOut) pollOut {
	t.Helper()
	return rpctest.Recv(t, ch, 10*time.Second)
}

func TestQueueber_LongPoll(t *testing.T) {
	t.Parallel()

	t.Run("WokenByAdd", func(t *testing.T) {
		t.Parallel()
		b := setup(t, storage.Limits{})
		consumer, producer := b.dial(), b.dial()
		ch := goPoll(consumer, 30, 10, 30)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		ids, err := add(ctxT(t), producer, addItem{contents: "wake"})
		require.NoError(t, err)
		o := recvPoll(t, ch)
		require.NoError(t, o.err)
		require.Equal(t, ids, o.p.ids)
		require.Equal(t, 0, b.srv.Metrics().Waiters)
	})

	t.Run("WokenByLeaseqEnqueue", func(t *testing.T) {
		t.Parallel()
		// One dispatcher: an enqueue on the Queue interface wakes a
		// Queueber long poll on the same queue.
		b := setup(t, storage.Limits{})
		ch := goPoll(b.dial(), 30, 10, 30)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		res, err := b.leaseq().Enqueue(ctxT(t), testQueue, []storage.EnqueueItem{{Payload: []byte("from leaseq")}})
		require.NoError(t, err)
		o := recvPoll(t, ch)
		require.NoError(t, o.err)
		require.Equal(t, [][]byte{res[0].ID[:]}, o.p.ids)
		require.Equal(t, []string{"from leaseq"}, o.p.contents)
	})

	t.Run("AddWakesLeaseqPoll", func(t *testing.T) {
		t.Parallel()
		b := setup(t, storage.Limits{})
		c := b.leaseq()
		type out struct {
			pr  storage.PollResult
			err error
		}
		ch := make(chan out, 1)
		go func() {
			pr, err := c.Poll(context.Background(), testQueue, 10, time.Minute, 30*time.Second)
			ch <- out{pr, err}
		}()
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		ids, err := add(ctxT(t), b.dial(), addItem{contents: "from queueber"})
		require.NoError(t, err)
		select {
		case o := <-ch:
			require.NoError(t, o.err)
			require.Len(t, o.pr.Items, 1)
			require.Equal(t, ids[0], o.pr.Items[0].ID[:])
		case <-time.After(10 * time.Second):
			t.Fatal("leaseq poll did not return")
		}
	})

	t.Run("TimesOutEmpty", func(t *testing.T) {
		t.Parallel()
		b := setup(t, storage.Limits{})
		ch := goPoll(b.dial(), 30, 10, 2)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		b.clock.Add(2 * time.Second)
		o := recvPoll(t, ch)
		require.NoError(t, o.err)
		require.Empty(t, o.p.ids)
		require.Empty(t, o.p.lease)
	})

	t.Run("ZeroTimeoutWaitsMaxWait", func(t *testing.T) {
		t.Parallel()
		b := setup(t, storage.Limits{MaxWait: 10 * time.Second})
		ch := goPoll(b.dial(), 30, 1, 0)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		b.clock.Add(9 * time.Second)
		select {
		case o := <-ch:
			t.Fatalf("poll returned before --max-wait: %+v", o)
		default:
		}
		b.clock.Add(time.Second)
		o := recvPoll(t, ch)
		require.NoError(t, o.err)
		require.Empty(t, o.p.ids)
	})

	t.Run("StopEndsParkedPoll", func(t *testing.T) {
		t.Parallel()
		b := setup(t, storage.Limits{})
		ch := goPoll(b.dial(), 30, 1, 30)
		rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().Waiters == 1 })
		b.srv.Stop()
		o := recvPoll(t, ch)
		// Empty, or the connection's end if Stop closed it first.
		if o.err == nil {
			require.Empty(t, o.p.ids)
		}
	})
}

func TestQueueber_Clamps(t *testing.T) {
	t.Parallel()
	b := setup(t, storage.Limits{MaxBatch: 5, MaxLease: time.Minute})
	q := b.dial()
	ctx := ctxT(t)
	items := make([]addItem, 5)
	for i := range items {
		items[i] = addItem{contents: fmt.Sprint(i)}
	}
	_, err := add(ctx, q, items...)
	require.NoError(t, err)
	_, err = add(ctx, q, items[:2]...)
	require.NoError(t, err)

	// numItems over --max-batch gets --max-batch; a lease over
	// --max-lease (even one that overflows a duration) gets --max-lease.
	p, err := poll(ctx, q, math.MaxUint64, math.MaxUint32, math.MaxUint64)
	require.NoError(t, err)
	require.Len(t, p.ids, 5)
	ok, err := extend(ctx, q, p.lease, math.MaxUint64)
	require.NoError(t, err)
	require.True(t, ok)
	b.clock.Add(time.Minute - time.Second)
	require.Equal(t, 0, b.sweep().LeasesExpired)
	b.clock.Add(time.Second)
	require.Equal(t, 1, b.sweep().LeasesExpired, "the lease was clamped to --max-lease")
	require.Equal(t, int64(7), b.stats().Ready)
}

func TestQueueber_BadInput(t *testing.T) {
	t.Parallel()
	b := setup(t, storage.Limits{MaxPayload: 1024, MaxBatch: 10, MaxDelay: time.Hour})
	q := b.dial()
	ctx := ctxT(t)
	ids, err := add(ctx, q, addItem{contents: "x"})
	require.NoError(t, err)
	p, err := poll(ctx, q, 30, 1, 1)
	require.NoError(t, err)
	require.Len(t, p.ids, 1)

	t.Run("AddItemOverLimitsAddsNothing", func(t *testing.T) {
		_, err := add(ctx, q, addItem{contents: "ok"}, addItem{contents: strings.Repeat("x", 2000)})
		requireException(t, err, exc.Failed, "items[1]: storage: invalid argument: payload of 2000 bytes exceeds the limit of 1024")
		_, err = add(ctx, q, addItem{contents: "ok"}, addItem{contents: "late", delay: 3601})
		requireException(t, err, exc.Failed, "items[1]: storage: invalid argument: delay 1h0m1s outside [0, 1h0m0s]")
		_, err = add(ctx, q, addItem{contents: "late", delay: math.MaxUint64})
		requireException(t, err, exc.Failed, "items[0]: storage: invalid argument: delay")
		_, err = add(ctx, q, make([]addItem, 11)...)
		requireException(t, err, exc.Failed, "batch of 11 exceeds the limit of 10")
		require.Equal(t, uint64(1), b.stats().Enqueued, "no item of a refused add went in")
	})

	t.Run("AddNothing", func(t *testing.T) {
		got, err := add(ctx, q)
		require.NoError(t, err)
		require.Empty(t, got)
	})

	t.Run("LeaseOfWrongSize", func(t *testing.T) {
		_, err := remove(ctx, q, ids[0], p.lease[:3])
		requireException(t, err, exc.Failed, "lease must be 16 bytes, got 3")
		_, err = remove(ctx, q, ids[0], nil)
		requireException(t, err, exc.Failed, "lease must be 16 bytes, got 0")
		_, err = extend(ctx, q, append(bytes.Clone(p.lease), 0), 30)
		requireException(t, err, exc.Failed, "lease must be 16 bytes, got 17")
	})

	t.Run("IdOfWrongSize", func(t *testing.T) {
		_, err := remove(ctx, q, ids[0][:15], p.lease)
		requireException(t, err, exc.Failed, "id must be 16 bytes, got 15")
	})

	t.Run("ZeroLease", func(t *testing.T) {
		_, err := poll(ctx, q, 0, 1, 1)
		requireException(t, err, exc.Failed, "leaseValiditySecs must be > 0")
		_, err = extend(ctx, q, p.lease, 0)
		requireException(t, err, exc.Failed, "leaseValiditySecs must be > 0")
	})

	t.Run("UnknownLeaseAndId", func(t *testing.T) {
		forged := bytes.Repeat([]byte{0xab}, 16)
		removed, err := remove(ctx, q, ids[0], forged)
		require.NoError(t, err)
		require.False(t, removed)
		removed, err = remove(ctx, q, forged, p.lease)
		require.NoError(t, err)
		require.False(t, removed)
		ok, err := extend(ctx, q, forged, 30)
		require.NoError(t, err)
		require.False(t, ok)
	})

	t.Run("LeaseOfAnotherQueue", func(t *testing.T) {
		c := b.leaseq()
		_, err := c.Enqueue(ctx, "other", []storage.EnqueueItem{{Payload: []byte("o")}})
		require.NoError(t, err)
		pr, err := c.Poll(ctx, "other", 1, time.Minute, 0)
		require.NoError(t, err)
		ok, err := extend(ctx, q, pr.Lease[:], 30)
		require.NoError(t, err)
		require.False(t, ok)
		removed, err := remove(ctx, q, pr.Items[0].ID[:], pr.Lease[:])
		require.NoError(t, err)
		require.False(t, removed)
	})

	// After all that, the node still serves the connection and the item.
	removed, err := remove(ctx, q, ids[0], p.lease)
	require.NoError(t, err)
	require.True(t, removed)
}

func TestQueueber_MutualTLS(t *testing.T) {
	t.Parallel()
	// The Queueber listener speaks the rpc server's TLS, client
	// certificates included.
	ca := rpctest.NewCA(t, "queueber test CA")
	pool := ca.Pool
	serverCert := ca.Issue(t, "queueber server", x509.ExtKeyUsageServerAuth)
	cert := ca.Issue(t, "queueber client", x509.ExtKeyUsageClientAuth)
	b := setupWith(t, func(c *rpc.ServerConfig) {
		c.TLS = &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	})
	dialTLS := func(certs []tls.Certificate) qbschema.Queue {
		tc, err := tls.Dial("tcp", b.qb, &tls.Config{RootCAs: pool, Certificates: certs, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})
		require.NoError(t, err)
		return b.client(tc)
	}
	ids, err := add(ctxT(t), dialTLS([]tls.Certificate{cert}), addItem{contents: "over tls"})
	require.NoError(t, err)
	require.Len(t, ids, 1)

	_, err = add(ctxT(t), b.dial(), addItem{contents: "plain"})
	require.Error(t, err, "a plain-text client is refused")
	_, err = add(ctxT(t), dialTLS(nil), addItem{contents: "no client cert"})
	require.Error(t, err, "a client without a certificate is refused")
	st, err := b.store.Stats(ctxT(t), storage.StatsParams{Queue: testQueue, Now: b.clock.Now()})
	require.NoError(t, err)
	require.Equal(t, uint64(1), st[0].Enqueued)
}

func TestQueueber_SharesMaxConns(t *testing.T) {
	t.Parallel()
	// Connections of both listeners count against one MaxConns.
	b := setupWith(t, func(c *rpc.ServerConfig) { c.MaxConns = 1 })
	_ = b.leaseq()
	rpctest.Eventually(t, 30*time.Second, func() bool { return b.srv.Metrics().ConnsOpen == 1 })
	// The refused client gets an RPC Abort naming the limit; go-capnp's
	// client reports it as the connection's end.
	_, err := add(ctxT(t), b.dial(), addItem{contents: "x"})
	require.Error(t, err)
	require.Equal(t, uint64(1), b.srv.Metrics().ConnsRefused)
}

func TestQueueber_BootstrapChecksQueue(t *testing.T) {
	t.Parallel()
	b := setup(t, storage.Limits{})
	_, err := Bootstrap(b.srv, "bad name")
	require.ErrorIs(t, err, storage.ErrInvalidArgument)
	_, err = Bootstrap(nil, testQueue)
	require.Error(t, err)
}

func TestQueueber_ClosedStoreIsOverloaded(t *testing.T) {
	t.Parallel()
	// A store that is closed (the node is shutting down) answers with an
	// "overloaded" exception, which tells a client to retry later or
	// elsewhere, not that its request was bad.
	b := setup(t, storage.Limits{})
	q := b.dial()
	require.NoError(t, b.store.Close())
	_, err := add(ctxT(t), q, addItem{contents: "x"})
	requireException(t, err, exc.Overloaded, "storage: closed")
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// quietLogger drops the client side's logs (a normal close logs at ERROR
// inside go-capnp).
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(discard{}, nil))
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
