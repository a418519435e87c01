package rpc

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"capnproto.org/go/capnp/v3"
	capnprpc "capnproto.org/go/capnp/v3/rpc"
	"capnproto.org/go/capnp/v3/rpc/transport"
	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// ClientOptions configures Dial.
type ClientOptions struct {
	// TLS, when set, is the client TLS config (add Certificates for mutual
	// TLS). ServerName defaults to the host of the address.
	TLS    *tls.Config
	Logger *slog.Logger // nil: discard
	// FlowLimitBytes bounds the bytes of calls in flight on the connection
	// (0: DefaultMaxMessageBytes). A single call larger than it fails with
	// ErrInvalidArgument before it is sent. It bounds what the client
	// sends; what it reads, a reply or a subscription's push, may be up
	// to DefaultMaxReplyBytes (1 GiB).
	FlowLimitBytes int64
	// Engine is how Dial's connection runs the protocol: "lean" (the
	// default: the client's own connection loop, see leanclient.go) or
	// "go-capnp" (go-capnp's rpc.Conn). With "lean", Subscribe and Queue
	// open a go-capnp connection of their own the first time they are
	// used. NewClient always uses go-capnp.
	Engine string
	// Clock times the lean engine's idle watch (leanclient.go); nil: the
	// real clock.
	Clock clock.Clock

	// maxReplyBytes bounds one message the client reads (0:
	// DefaultMaxReplyBytes); tests lower it to see a reply refused.
	maxReplyBytes int64
}

// Client engines (ClientOptions.Engine).
const (
	ClientEngineLean    = "lean"
	ClientEngineGoCapnp = "go-capnp"
)

// Client is a connection to a leaseq node. Its methods mirror
// storage.Store; they are safe for concurrent use, and every []byte they
// return is owned by the caller (copied out of capnp's buffers). Request-
// level failures come back as *StatusError wrapping a storage or rpc
// sentinel; transport failures as other errors (capnp.IsDisconnected after
// the connection is lost).
type Client struct {
	// The go-capnp connection: the only one after NewClient or with the
	// go-capnp engine; with the lean engine opened by capnpConn for
	// Subscribe and Queue, and nil until then. REQUIRES: gcMu held to
	// read them when lean is set.
	conn  net.Conn
	rc    *capnprpc.Conn
	q     schema.Queue
	codec *limitedCodec // rc's (newClientCodec)
	gcMu  sync.Mutex

	lean   *leanClient                             // the lean engine's connection, or nil
	cpolls *capnpPolls                             // the go-capnp engine's polls (client_drain_capnp.go), or nil
	redial func(context.Context) (net.Conn, error) // a new connection like the first (lean engine)

	log       *slog.Logger
	limit     int64  // bytes of calls in flight (flowLimit)
	readLimit uint64 // bytes of one incoming message (replyLimit)

	closeOnce sync.Once
	closed    chan struct{}

	// giveBacks counts the nacks of abandoned polls' items in flight
	// (giveBackPoll), which Close waits for. gbMu orders their Add before
	// Close's Wait: none starts once closed is closed.
	gbMu      sync.Mutex
	giveBacks sync.WaitGroup
	// giveBack gives back the items of a poll answer, or a pushed batch,
	// that no caller received (giveBackPoll).
	giveBack func(pollGiveBack)
	// subs are the live Subscriptions and delivers the Deliver calls
	// running in them, which Close stops and waits for (deliversIdle)
	// before it closes closed, so that their give-backs still go out.
	// REQUIRES: gbMu held.
	subs         map[*Subscription]struct{}
	closing      bool // Close has begun: no new Subscription
	delivers     int
	deliversIdle sync.Cond
	clk          clock.Clock // bounds the waits of give-backs and of Close
}

// Dial connects to addr ("host:port" or "unix:/path") and checks that a
// leaseq node answers. A node at its connection limit makes Dial fail with
// ErrTooManyConns; a TLS failure (say, a missing client certificate) also
// fails Dial. ctx bounds the connect and the first exchange: its deadline,
// or its cancellation, ends a Dial to a peer that does not answer.
func Dial(ctx context.Context, addr string, opts ClientOptions) (*Client, error) {
	switch opts.Engine {
	case "", ClientEngineLean, ClientEngineGoCapnp:
	default:
		return nil, fmt.Errorf("rpc: dial %s: %w: unknown client engine %q (want %q or %q)", addr, storage.ErrInvalidArgument, opts.Engine, ClientEngineLean, ClientEngineGoCapnp)
	}
	redial := func(ctx context.Context) (net.Conn, error) { return dialConn(ctx, addr, opts) }
	conn, err := redial(ctx)
	if err != nil {
		return nil, err
	}
	if opts.Engine == ClientEngineGoCapnp {
		c, err := NewClient(ctx, conn, opts)
		if err != nil {
			return nil, fmt.Errorf("rpc: dial %s: %w", addr, err)
		}
		return c, nil
	}
	limit := flowLimit(opts)
	clk := opts.Clock
	if clk == nil {
		clk = clock.New()
	}
	readLimit := replyLimit(opts)
	l, err := newLeanClient(ctx, conn, limit, readLimit, clk)
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("rpc: dial %s: %w", addr, err)
	}
	c := &Client{lean: l, redial: redial, log: clientLogger(opts), limit: limit, readLimit: readLimit, closed: make(chan struct{})}
	c.initGiveBacks(clk)
	l.giveBack = c.giveBack
	return c, nil
}

// dialConn opens a connection to addr, with TLS when opts asks for it.
func dialConn(ctx context.Context, addr string, opts ClientOptions) (net.Conn, error) {
	network, address, err := splitAddr(addr)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, fmt.Errorf("rpc: dial %s: %w", addr, err)
	}
	if opts.TLS != nil {
		cfg := opts.TLS.Clone()
		if cfg.ServerName == "" && network == "tcp" {
			cfg.ServerName, _, _ = net.SplitHostPort(address)
		}
		tc := tls.Client(conn, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("rpc: dial %s: tls: %w", addr, err)
		}
		conn = tc
	}
	return conn, nil
}

// clientLogger is opts.Logger, or one that discards.
func clientLogger(opts ClientOptions) *slog.Logger {
	if opts.Logger == nil {
		return discardLogger()
	}
	return opts.Logger
}

// flowLimit is opts.FlowLimitBytes or its default.
func flowLimit(opts ClientOptions) int64 {
	if opts.FlowLimitBytes <= 0 {
		return DefaultMaxMessageBytes
	}
	return opts.FlowLimitBytes
}

// replyLimit is the largest message the client reads: DefaultMaxReplyBytes
// unless a test lowered it.
func replyLimit(opts ClientOptions) uint64 {
	if opts.maxReplyBytes <= 0 {
		return DefaultMaxReplyBytes
	}
	return uint64(opts.maxReplyBytes)
}

// NewClient runs the protocol over an established connection (for example
// one end of net.Pipe) and takes ownership of it. opts.TLS is ignored.
func NewClient(ctx context.Context, conn net.Conn, opts ClientOptions) (*Client, error) {
	log := clientLogger(opts)
	limit := flowLimit(opts)
	readLimit := replyLimit(opts)
	polls := newCapnpPolls(readLimit)
	rc, q, codec, err := startCapnpWatched(ctx, conn, log, limit, readLimit, polls)
	if err != nil {
		return nil, err
	}
	c := &Client{conn: conn, rc: rc, q: q, codec: codec, cpolls: polls, log: log, limit: limit, readLimit: readLimit, closed: make(chan struct{})}
	clk := opts.Clock
	if clk == nil {
		clk = clock.New()
	}
	c.initGiveBacks(clk)
	polls.setGiveBack(c.giveBack)
	return c, nil
}

// startCapnp runs go-capnp's rpc.Conn over conn and bootstraps the node's
// Queue capability. limit bounds the bytes of calls in flight, readLimit
// one incoming message (go-capnp's own stream transport reads 64 MiB at
// most, too few for the replies and pushes the node's limits allow).
func startCapnp(ctx context.Context, conn net.Conn, log *slog.Logger, limit int64, readLimit uint64) (*capnprpc.Conn, schema.Queue, *limitedCodec, error) {
	return startCapnpWatched(ctx, conn, log, limit, readLimit, nil)
}

// startCapnpWatched is startCapnp, its polls tracked by polls (pollWatch)
// unless nil.
func startCapnpWatched(ctx context.Context, conn net.Conn, log *slog.Logger, limit int64, readLimit uint64, polls *capnpPolls) (*capnprpc.Conn, schema.Queue, *limitedCodec, error) {
	if readLimit == 0 {
		readLimit = DefaultMaxReplyBytes
	}
	codec := newClientCodec(conn, readLimit)
	aw := &abortWatch{Transport: transport.New(codec)}
	var tr transport.Transport = aw
	if polls != nil {
		tr = &pollWatch{Transport: aw, p: polls}
	}
	rc := capnprpc.NewConn(tr, &capnprpc.Options{Logger: capnpLogger(log)})
	q := schema.Queue(rc.Bootstrap(ctx))
	err := q.Resolve(ctx)
	if err == nil {
		// A bootstrap that failed (the node aborted the session) resolves
		// to an error capability rather than failing Resolve.
		snap := capnp.Client(q).Snapshot()
		if e, ok := snap.Brand().Value.(error); ok {
			err = e
		}
		snap.Release()
	}
	if err != nil {
		q.Release()
		_ = rc.Close()
		if reason, overloaded, ok := aw.aborted(); ok {
			if overloaded {
				return nil, schema.Queue{}, nil, fmt.Errorf("%w: %s", ErrTooManyConns, reason)
			}
			return nil, schema.Queue{}, nil, fmt.Errorf("rpc: bootstrap: node aborted the session: %s", reason)
		}
		return nil, schema.Queue{}, nil, fmt.Errorf("rpc: bootstrap: %w", err)
	}
	q.SetFlowLimiter(newWindowLimiter(limit))
	return rc, q, codec, nil
}

// Close ends the connection. Leases held by this client stay valid until
// they expire or are acked from another connection. It first cancels the
// client's subscriptions and stops its polls in flight (their callers get
// a disconnected error at once, and the node is told to cancel them), and
// waits, at most 5 s in all on ClientOptions.Clock, for the node to end
// those subscriptions and to answer those polls and polls given up
// earlier: a batch pushed that C had no room for, and a poll's answer,
// whose items nobody will receive, are given back. Then it waits for the
// give-backs, each bounded by 5 s. A Subscribe or a Poll once Close has
// begun fails. Close is idempotent.
func (c *Client) Close() error {
	var err error
	c.closeOnce.Do(func() {
		// Polls stop first, so that their answers come while the
		// subscriptions end (found by review, session 73: an answer on
		// the wire when the connection closed left its items leased to
		// nobody until the lease ended).
		var polls <-chan struct{}
		if c.lean != nil {
			polls = c.lean.drainPolls()
		} else if c.cpolls != nil {
			polls = c.cpolls.drain() // found by review (session 74): as above, on go-capnp
		}
		// Subscriptions stop taking batches: a Deliver waiting for room
		// in C gives its batch back, and is waited for.
		c.gbMu.Lock()
		c.closing = true
		subs := c.subs
		c.subs = nil
		c.gbMu.Unlock()
		expired := make(chan struct{})
		if len(subs) > 0 || !isClosedChan(polls) {
			t := c.clk.AfterFunc(giveBackTimeout, func() { close(expired) })
			defer t.Stop()
		}
		c.endSubs(subs, expired)
		if polls != nil {
			// Not under gbMu: the give-backs of the answers take it.
			c.awaitPolls(polls, expired)
		}
		c.gbMu.Lock()
		for c.delivers > 0 {
			c.deliversIdle.Wait()
		}
		close(c.closed) // before gcMu: it ends a dial in capnpConn
		c.gbMu.Unlock()
		// The give-backs of polls given up and of batches not delivered
		// go out first (each within giveBackTimeout).
		c.giveBacks.Wait()
		c.gcMu.Lock()
		if c.rc != nil {
			c.q.Release()
			err = c.rc.Close()
			if isDisconnect(err) {
				err = nil
			}
		}
		c.gcMu.Unlock()
		if c.lean != nil {
			_ = c.lean.close()
		}
	})
	return err
}

// Done is closed when the connection has ended (Close or a failure). The
// lean engine on a plain TCP or unix socket reads only while a call is
// open or once the connection has been idle for 100 ms, so Done may close
// up to that long after an idle connection ended.
func (c *Client) Done() <-chan struct{} {
	if c.lean != nil {
		return c.lean.done
	}
	return c.rc.Done()
}

// Queue returns the raw capnp capability, for callers that pipeline or
// batch calls themselves. It stays owned by the Client. With the lean
// engine it lives on a go-capnp connection opened on first use; if that
// fails, the capability fails every call with the reason. Once that
// connection has ended (the lean one going on), the next Queue or
// Subscribe opens another, and releases the capability Queue returned
// before: ask Queue again after a disconnected error.
func (c *Client) Queue() schema.Queue {
	q, _, err := c.capnpConn(context.Background())
	if err != nil {
		return schema.Queue(capnp.ErrorClient(err))
	}
	return q
}

// status converts a result's Status into an error.
func status(op string, get func() (schema.Status, error)) error {
	st, err := get()
	if err != nil {
		return fmt.Errorf("leaseq %s: reading status: %w", op, err)
	}
	msg, _ := st.Detail()
	return errorOf(op, st.Code(), msg)
}

// statusAnswer is any call's results: each carries a Status.
type statusAnswer interface {
	Status() (schema.Status, error)
}

// answer waits for a call's results and turns a transport failure or a
// non-OK status into the op's error.
func answer[R statusAnswer](op string, get func() (R, error)) (R, error) {
	res, err := get()
	if err != nil {
		return res, fmt.Errorf("leaseq %s: %w", op, err)
	}
	if err := status(op, res.Status); err != nil {
		return res, err
	}
	return res, nil
}

// callOverhead is about what a call's message holds besides its
// arguments: the frame and the RPC call.
const callOverhead = 256

// checkSize refuses a call of about n bytes over the client's flow limit
// (FlowLimitBytes) with a clear error before it is sent. (A message a
// little over the limit from its framing passes: both engines account it
// as the whole limit.)
func (c *Client) checkSize(op string, n int) error {
	if int64(n) > c.limit {
		return fmt.Errorf("leaseq %s: %w: request of about %d bytes exceeds the client's flow limit of %d; split the batch",
			op, storage.ErrInvalidArgument, n, c.limit)
	}
	return nil
}

// Enqueue adds items to queue. Per-item outcomes (CodeOK with ID and
// Duplicate, or CodeInvalid with Err) come back in input order.
func (c *Client) Enqueue(ctx context.Context, queue string, items []storage.EnqueueItem) ([]storage.EnqueueResult, error) {
	// The call around the items: the frame, the RPC call, the queue name
	// (found by review, session 70: a payload just under the limit passed
	// this check and its message went over it).
	size := callOverhead + len(queue)
	for i := range items {
		if items[i].Delay < 0 {
			// As the stores and Nack: a negative delay is refused, not
			// sent as 0 (ready now).
			return nil, fmt.Errorf("leaseq enqueue: %w: item %d: negative delay %v", storage.ErrInvalidArgument, i, items[i].Delay)
		}
		size += len(items[i].Payload) + len(items[i].DedupKey) + 64
	}
	if err := c.checkSize("enqueue", size); err != nil {
		return nil, err
	}
	f, release := invokeMut(ctx, c, mEnqueue, func(p schema.Queue_enqueue_Params) error {
		if err := p.SetQueue(queue); err != nil {
			return err
		}
		l, err := p.NewItems(int32(len(items)))
		if err != nil {
			return err
		}
		for i := range items {
			w := l.At(i)
			if err := w.SetPayload(items[i].Payload); err != nil {
				return err
			}
			w.SetDelayMs(msDurUp(items[i].Delay))
			w.SetPriority(items[i].Priority)
			if items[i].DedupKey != "" {
				if err := w.SetDedupKey(items[i].DedupKey); err != nil {
					return err
				}
			}
			w.SetMaxAttempts(items[i].MaxAttempts)
		}
		return nil
	})
	defer release()
	res, err := answer("enqueue", f.Struct)
	if err != nil {
		return nil, err
	}
	l, err := res.Results()
	if err != nil {
		return nil, fmt.Errorf("leaseq enqueue: results: %w", err)
	}
	if l.Len() != len(items) {
		// Found by review (session 70): a short or long answer was
		// returned as success, and callers index it by their items.
		return nil, fmt.Errorf("leaseq enqueue: %w: %d results for %d items", storage.ErrCorrupt, l.Len(), len(items))
	}
	out := make([]storage.EnqueueResult, l.Len())
	for i := range out {
		r := l.At(i)
		out[i].Code = storageCode(r.Code())
		out[i].Duplicate = r.Duplicate()
		if out[i].Code == storage.CodeOK {
			b, err := r.Id()
			if err != nil {
				return nil, fmt.Errorf("leaseq enqueue: results[%d]: %w", i, err)
			}
			if out[i].ID, err = itemID(b); err != nil {
				return nil, fmt.Errorf("leaseq enqueue: results[%d]: %w", i, err)
			}
		}
		if out[i].Err, err = r.Detail(); err != nil {
			return nil, fmt.Errorf("leaseq enqueue: results[%d]: %w", i, err)
		}
	}
	return out, nil
}

// Poll claims up to max ready items under one new lease of the given
// duration (0: the queue's default), waiting up to wait for the first one.
// No items is not an error: the result is empty with a zero lease. A node
// whose limits allow items too large for max of them to fit in one reply
// (DefaultMaxReplyBytes) returns fewer. The
// items' payloads are the caller's; when they total at most 256 KiB they
// share one buffer, so keeping one payload keeps that buffer alive.
func (c *Client) Poll(ctx context.Context, queue string, max int, lease, wait time.Duration) (storage.PollResult, error) {
	if max < 0 || lease < 0 || wait < 0 {
		return storage.PollResult{}, fmt.Errorf("leaseq poll: %w: negative max, lease or wait", storage.ErrInvalidArgument)
	}
	if err := checkLeaseMs("poll", lease); err != nil {
		return storage.PollResult{}, err
	}
	f, release := c.invokePoll(ctx, pollParams(queue, max, lease, wait))
	if c.lean == nil && c.cpolls != nil {
		f, release = c.awaitPoll(ctx, f, release)
	}
	defer release()
	return pollAnswer(f, max)
}

// awaitPoll waits for a tracked go-capnp poll (client_drain_capnp.go) as
// invoke waits for other calls (capnpWait): until its answer or ctx's
// end. An answer that comes once its caller gave up is given back.
func (c *Client) awaitPoll(ctx context.Context, f qfuture[schema.Queue_poll_Results], release func()) (qfuture[schema.Queue_poll_Results], func()) {
	w := &capnpWait[schema.Queue_poll_Results]{get: f.get, release: release,
		after: func(r schema.Queue_poll_Results, err error, taken bool) (schema.Queue_poll_Results, error) {
			if !taken && err == nil && c.giveBack != nil {
				if g, ok := pollResultsGiveBack(r); ok {
					c.giveBack(g)
				}
			}
			return r, err
		}}
	return qfuture[schema.Queue_poll_Results]{get: func() (schema.Queue_poll_Results, error) { return w.wait(ctx) }}, w.releaseOnce
}

// pollResultsGiveBack reads the lease and the item ids of a poll's
// results, for the give-back of an answer no caller received (go-capnp
// delivered it late; returnPollGiveBack reads a Return's); ok is false
// when they carry none or do not decode.
func pollResultsGiveBack(res schema.Queue_poll_Results) (g pollGiveBack, ok bool) {
	items, err := res.Items()
	if err != nil || items.Len() == 0 {
		return g, false
	}
	b, err := res.Lease()
	if err == nil {
		g.lease, err = leaseID(b)
	}
	if err == nil {
		g.queue, err = items.At(0).Queue()
	}
	g.ids = make([]storage.ItemID, items.Len())
	for i := 0; err == nil && i < len(g.ids); i++ {
		if b, err = items.At(i).Id(); err == nil {
			g.ids[i], err = itemID(b)
		}
	}
	return g, err == nil
}

// checkLeaseMs refuses a lease the wire cannot carry: it counts
// milliseconds, and 0 means the queue's default, so a lease under 1ms
// would silently become that.
func checkLeaseMs(op string, d time.Duration) error {
	if d > 0 && d < time.Millisecond {
		return fmt.Errorf("leaseq %s: %w: lease %v is under 1ms", op, storage.ErrInvalidArgument, d)
	}
	return nil
}

func pollParams(queue string, max int, lease, wait time.Duration) func(schema.Queue_poll_Params) error {
	return func(p schema.Queue_poll_Params) error {
		p.SetMax(uint32(min(max, 1<<31)))
		p.SetLeaseMs(msDur(lease))
		p.SetWaitMs(msDur(wait))
		return p.SetQueue(queue)
	}
}

func pollAnswer(f qfuture[schema.Queue_poll_Results], max int) (storage.PollResult, error) {
	res, err := answer("poll", f.Struct)
	if err != nil {
		return storage.PollResult{}, err
	}
	return readPoll(res.Lease, res.ExpiresAt(), res.Items, max)
}

// readPoll reads a batch leased to the caller: a poll's answer of at most
// max items, or a subscription's push of at most its prefetch (max 0: no
// bound to check). A node that answers more broke the protocol (found by
// review, session 70: the client handed them on, past a consumer's
// MaxItems); the items stay leased until the lease ends.
func readPoll(leaseFn func() ([]byte, error), expires uint64, itemsFn func() (schema.Item_List, error), max int) (storage.PollResult, error) {
	var pr storage.PollResult
	l, err := itemsFn()
	if err != nil {
		return pr, fmt.Errorf("leaseq poll: items: %w", err)
	}
	if l.Len() == 0 {
		return pr, nil
	}
	if max > 0 && l.Len() > max {
		return pr, fmt.Errorf("leaseq poll: %w: %d items for a batch of at most %d", storage.ErrCorrupt, l.Len(), max)
	}
	b, err := leaseFn()
	if err != nil {
		return pr, fmt.Errorf("leaseq poll: lease: %w", err)
	}
	if pr.Lease, err = leaseID(b); err != nil {
		return pr, fmt.Errorf("leaseq poll: %w", err)
	}
	pr.ExpiresAt = fromMs(expires)
	if pr.Items, err = readItems(l); err != nil {
		return pr, fmt.Errorf("leaseq poll: %w", err)
	}
	return pr, nil
}

// codesAnswer is the results of ack and nack.
type codesAnswer interface {
	statusAnswer
	Codes() (schema.ResultCode_List, error)
}

// codesResult reads the answer of ack or nack: one code per id, n ids.
// A node that answers another count broke the protocol.
func codesResult[R codesAnswer](op string, n int, get func() (R, error)) ([]storage.Code, error) {
	res, err := answer(op, get)
	if err != nil {
		return nil, err
	}
	l, err := res.Codes()
	if err != nil {
		return nil, fmt.Errorf("leaseq %s: codes: %w", op, err)
	}
	if l.Len() != n {
		return nil, fmt.Errorf("leaseq %s: %w: %d codes for %d ids", op, storage.ErrCorrupt, l.Len(), n)
	}
	return readCodes(l), nil
}

// Nack ends the delivery of items held under lease without success: ready
// again after delay, or after the queue's backoff when delay is nil; dead
// once attempts reached max attempts. One Code per id, in order.
func (c *Client) Nack(ctx context.Context, queue string, lease storage.LeaseID, ids []storage.ItemID, delay *time.Duration, reason string) ([]storage.Code, error) {
	return c.nack(ctx, queue, lease, ids, delay, reason, false)
}

// nack is Nack, or with undelivered the give-back of items no caller
// received (storage.NackParams.Undelivered; delay nil, reason empty).
func (c *Client) nack(ctx context.Context, queue string, lease storage.LeaseID, ids []storage.ItemID, delay *time.Duration, reason string, undelivered bool) ([]storage.Code, error) {
	if err := c.checkSize("nack", 24*len(ids)+len(reason)); err != nil {
		return nil, err
	}
	if delay != nil && *delay < 0 {
		return nil, fmt.Errorf("leaseq nack: %w: negative delay", storage.ErrInvalidArgument)
	}
	f, release := invokeMut(ctx, c, mNack, func(p schema.Queue_nack_Params) error {
		if err := p.SetQueue(queue); err != nil {
			return err
		}
		if err := p.SetLease(lease[:]); err != nil {
			return err
		}
		if delay != nil {
			p.SetDelayMs(int64(msDurUp(*delay)))
		}
		if err := p.SetReason(reason); err != nil {
			return err
		}
		p.SetUndelivered(undelivered)
		l, err := p.NewIds(int32(len(ids)))
		if err != nil {
			return err
		}
		return writeIDs(l, ids)
	})
	defer release()
	return codesResult("nack", len(ids), f.Struct)
}

// Extend sets a live lease's expiry to now + d and returns it. Errors wrap
// storage.ErrLeaseExpired or storage.ErrLeaseMismatch when it cannot.
func (c *Client) Extend(ctx context.Context, queue string, lease storage.LeaseID, d time.Duration) (time.Time, error) {
	if err := checkLeaseMs("extend", d); err != nil {
		return time.Time{}, err
	}
	f, release := invokeMut(ctx, c, mExtend, func(p schema.Queue_extend_Params) error {
		p.SetLeaseMs(msDur(d))
		if err := p.SetLease(lease[:]); err != nil {
			return err
		}
		return p.SetQueue(queue)
	})
	defer release()
	res, err := answer("extend", f.Struct)
	if err != nil {
		return time.Time{}, err
	}
	return fromMs(res.ExpiresAt()), nil
}

// Stats returns one queue's stats, or every queue's when queue is "".
func (c *Client) Stats(ctx context.Context, queue string) ([]storage.QueueStats, error) {
	f, release := invoke(ctx, c, mStats, func(p schema.Queue_stats_Params) error { return p.SetQueue(queue) })
	defer release()
	res, err := answer("stats", f.Struct)
	if err != nil {
		return nil, err
	}
	l, err := res.Stats()
	if err != nil {
		return nil, fmt.Errorf("leaseq stats: %w", err)
	}
	out := make([]storage.QueueStats, l.Len())
	for i := range out {
		if out[i], err = readStats(l.At(i)); err != nil {
			return nil, fmt.Errorf("leaseq stats: %w", err)
		}
	}
	return out, nil
}

// Queues lists queue names in byte order.
func (c *Client) Queues(ctx context.Context) ([]string, error) {
	f, release := invoke(ctx, c, mQueues, nil)
	defer release()
	res, err := answer("queues", f.Struct)
	if err != nil {
		return nil, err
	}
	l, err := res.Queues()
	if err != nil {
		return nil, fmt.Errorf("leaseq queues: %w", err)
	}
	out := make([]string, l.Len())
	for i := range out {
		if out[i], err = l.At(i); err != nil {
			return nil, fmt.Errorf("leaseq queues: %w", err)
		}
	}
	return out, nil
}

// IsDisconnected reports whether err (from a Client method) means the
// connection to the node is gone: the node closed it (it stopped, or the
// request broke a limit such as its maximum message size) or the network
// failed. The call's outcome is then unknown.
func IsDisconnected(err error) bool { return err != nil && isDisconnect(err) }

// NodeInfo describes the node: version, backend, durability mode and its
// limits (NodeInfo.Limits).
func (c *Client) NodeInfo(ctx context.Context) (NodeInfo, error) {
	f, release := invoke(ctx, c, mNodeInfo, nil)
	defer release()
	res, err := answer("node info", f.Struct)
	if err != nil {
		return NodeInfo{}, err
	}
	info, err := res.Info()
	if err != nil {
		return NodeInfo{}, fmt.Errorf("leaseq node info: %w", err)
	}
	ni := NodeInfo{MaxBatch: int(info.MaxBatch()), MaxPayload: int(info.MaxPayload()),
		MinLease: durMs(info.MinLeaseMs()), MaxLease: durMs(info.MaxLeaseMs()), MaxDelay: durMs(info.MaxDelayMs())}
	for _, f := range []struct {
		dst *string
		get func() (string, error)
	}{{&ni.Version, info.Version}, {&ni.Backend, info.Backend}, {&ni.Sync, info.Sync}} {
		if *f.dst, err = f.get(); err != nil {
			return NodeInfo{}, fmt.Errorf("leaseq node info: %w", err)
		}
	}
	return ni, nil
}

// Peek lists items without leasing them (p.Now is ignored: the node's
// clock decides). p.Limit 0 means DefaultPageLimit. A page may hold fewer
// items than the limit before the end (those that fit in one reply,
// DefaultMaxReplyBytes): page on from the last item's ID.
func (c *Client) Peek(ctx context.Context, p storage.PeekParams) ([]storage.Item, error) {
	if err := checkLimit("peek", p.Limit); err != nil {
		return nil, err
	}
	f, release := invoke(ctx, c, mPeek, func(a schema.Queue_peek_Params) error {
		a.SetInflight(p.Inflight)
		a.SetLimit(wireLimit(p.Limit))
		if !p.After.IsZero() {
			if err := a.SetAfter(p.After[:]); err != nil {
				return err
			}
		}
		return a.SetQueue(p.Queue)
	})
	defer release()
	res, err := answer("peek", f.Struct)
	if err != nil {
		return nil, err
	}
	l, err := res.Items()
	if err != nil {
		return nil, fmt.Errorf("leaseq peek: %w", err)
	}
	items, err := readItems(l)
	if err != nil {
		return nil, fmt.Errorf("leaseq peek: %w", err)
	}
	return items, nil
}

// Purge deletes every available and inflight item of queue.
func (c *Client) Purge(ctx context.Context, queue string) (int, error) {
	f, release := invokeMut(ctx, c, mPurge, func(p schema.Queue_purge_Params) error { return p.SetQueue(queue) })
	defer release()
	res, err := answer("purge", f.Struct)
	if err != nil {
		return 0, err
	}
	return int(res.Purged()), nil
}

// DeleteQueue removes queue (see storage.Store.DeleteQueue): refused with
// an error wrapping storage.ErrNotEmpty while it holds items, unless force.
// It returns how many items it deleted.
func (c *Client) DeleteQueue(ctx context.Context, queue string, force bool) (int, error) {
	f, release := invokeMut(ctx, c, mDeleteQueue, func(p schema.Queue_deleteQueue_Params) error {
		p.SetForce(force)
		return p.SetQueue(queue)
	})
	defer release()
	res, err := answer("delete queue", f.Struct)
	if err != nil {
		return 0, err
	}
	return int(res.Deleted()), nil
}

// DeadList pages through dead items after p.After (p.Limit 0: DefaultPageLimit).
// A page may hold fewer items than the limit before the end, as Peek's.
func (c *Client) DeadList(ctx context.Context, p storage.DeadListParams) ([]storage.DeadItem, error) {
	if err := checkLimit("dead list", p.Limit); err != nil {
		return nil, err
	}
	f, release := invoke(ctx, c, mDeadList, func(a schema.Queue_deadList_Params) error {
		a.SetLimit(wireLimit(p.Limit))
		if !p.After.IsZero() {
			if err := a.SetAfter(p.After[:]); err != nil {
				return err
			}
		}
		return a.SetQueue(p.Queue)
	})
	defer release()
	res, err := answer("dead list", f.Struct)
	if err != nil {
		return nil, err
	}
	l, err := res.Items()
	if err != nil {
		return nil, fmt.Errorf("leaseq dead list: %w", err)
	}
	out := make([]storage.DeadItem, l.Len())
	for i := range out {
		w := l.At(i)
		it, err := w.Item()
		if err != nil {
			return nil, fmt.Errorf("leaseq dead list: %w", err)
		}
		if out[i].Item, err = readItem(it); err != nil {
			return nil, fmt.Errorf("leaseq dead list: %w", err)
		}
		if out[i].Reason, err = w.Reason(); err != nil {
			return nil, fmt.Errorf("leaseq dead list: %w", err)
		}
		out[i].DeadAt = fromMs(w.DeadAt())
	}
	return out, nil
}

type deadParams interface {
	SetQueue(string) error
	NewIds(int32) (capnp.DataList, error)
	SetLimit(uint32)
}

func setDeadParams(a deadParams, p storage.RedriveParams) error {
	if err := a.SetQueue(p.Queue); err != nil {
		return err
	}
	a.SetLimit(wireLimit(p.Limit))
	if len(p.IDs) == 0 {
		return nil
	}
	l, err := a.NewIds(int32(len(p.IDs)))
	if err != nil {
		return err
	}
	return writeIDs(l, p.IDs)
}

type deadAnswer interface {
	statusAnswer
	Codes() (schema.ResultCode_List, error)
	Moved() uint64
}

// deadResult reads the answer of redrive or purgeDead.
func deadResult[R deadAnswer](op string, get func() (R, error)) (storage.RedriveResult, error) {
	res, err := answer(op, get)
	if err != nil {
		return storage.RedriveResult{}, err
	}
	rr := storage.RedriveResult{Moved: int(res.Moved())}
	l, err := res.Codes()
	if err != nil {
		return rr, fmt.Errorf("leaseq %s: %w", op, err)
	}
	if l.Len() > 0 {
		rr.Codes = readCodes(l)
	}
	return rr, nil
}

// Redrive moves dead items back to ready: p.IDs (one Code each), or up to
// p.Limit (0: DefaultPageLimit) in id order when p.IDs is empty.
func (c *Client) Redrive(ctx context.Context, p storage.RedriveParams) (storage.RedriveResult, error) {
	if err := checkLimit("redrive", p.Limit); err != nil {
		return storage.RedriveResult{}, err
	}
	f, release := invokeMut(ctx, c, mRedrive, func(a schema.Queue_redrive_Params) error { return setDeadParams(a, p) })
	defer release()
	return deadResult("redrive", f.Struct)
}

// PurgeDead deletes dead items, selected like Redrive.
func (c *Client) PurgeDead(ctx context.Context, p storage.RedriveParams) (storage.RedriveResult, error) {
	if err := checkLimit("purge dead", p.Limit); err != nil {
		return storage.RedriveResult{}, err
	}
	f, release := invokeMut(ctx, c, mPurgeDead, func(a schema.Queue_purgeDead_Params) error { return setDeadParams(a, p) })
	defer release()
	return deadResult("purge dead", f.Struct)
}

// QueueConfig returns a queue's config (ErrNotFound for no such queue).
func (c *Client) QueueConfig(ctx context.Context, queue string) (storage.QueueConfig, error) {
	f, release := invoke(ctx, c, mGetConfig, func(p schema.Queue_getConfig_Params) error { return p.SetQueue(queue) })
	defer release()
	res, err := answer("get config", f.Struct)
	if err != nil {
		return storage.QueueConfig{}, err
	}
	w, err := res.Config()
	if err != nil {
		return storage.QueueConfig{}, fmt.Errorf("leaseq get config: %w", err)
	}
	return readConfig(w), nil
}

// SetQueueConfig replaces a queue's config, creating the queue if needed.
func (c *Client) SetQueueConfig(ctx context.Context, queue string, cfg storage.QueueConfig) error {
	if cfg.LeaseDuration < 0 || cfg.DedupWindow < 0 || cfg.BackoffBase < 0 || cfg.BackoffMax < 0 {
		return fmt.Errorf("leaseq set config: %w: negative duration", storage.ErrInvalidArgument)
	}
	f, release := invokeMut(ctx, c, mSetConfig, func(p schema.Queue_setConfig_Params) error {
		w, err := p.NewConfig()
		if err != nil {
			return err
		}
		writeConfig(w, cfg)
		return p.SetQueue(queue)
	})
	defer release()
	_, err := answer("set config", f.Struct)
	return err
}
