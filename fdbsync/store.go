package fdbsync

import (
	"context"
	crand "crypto/rand"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

// Tuning constants. Each is a budget that keeps a transaction far from
// FDB's limits (10 MB, 5 s) while still making one transaction per batch
// the common case.
const (
	// DefaultPrefix is the subspace every key lives under.
	DefaultPrefix = "\x15leaseq\x00"
	// txnBudget caps the estimated commit size (mutations plus conflict
	// ranges) of one transaction: a quarter of the 1 MB the tests allow,
	// leaving room for the estimate's error.
	txnBudget = 256 << 10
	// readBudget caps payload bytes one poll reads and returns: FDB reads
	// cost time against the 5 s limit and the reply goes over RPC.
	readBudget = 8 << 20
	// inlineMax is the largest payload kept inside the item record. Larger
	// payloads go to chunk keys that are never rewritten on state changes,
	// so a claim rewrites at most ~16 KiB per item.
	inlineMax = 16 << 10
	// chunkSize keeps each chunk value under FDB's 100 kB value limit.
	chunkSize = 90_000
	// uploadBudget is the chunk bytes per upload transaction: two chunks,
	// inside txnBudget like every other transaction.
	uploadBudget = 2 * chunkSize
	// markerTTL is how long a call's idempotency marker is kept: far longer
	// than any retry loop can run (transactions live 5 s, retries are
	// bounded), so a retry after commit_unknown_result always finds it.
	markerTTL = 10 * time.Minute
	// versionsPerSecond is how fast FoundationDB's versions advance; marker
	// ages are counted in versions (keys.marker).
	versionsPerSecond = 1_000_000
	// legacyMarkerTTL is how long a marker filed under an older node's
	// clock is kept, by this node's clock: a day, far above any clock
	// skew, as such markers are only left over from before an upgrade.
	legacyMarkerTTL = 24 * time.Hour
	// uploadTTL is how long chunks of an enqueue that never committed stay
	// before the sweeper removes them.
	uploadTTL = time.Hour
	// pollerTTL is how long a node counts as polling a queue after its
	// last heartbeat; heartbeatEvery is how often a node rewrites it.
	pollerTTL      = 5 * time.Second
	heartbeatEvery = time.Second
	// heartbeatTTL is when the sweeper deletes a heartbeat: long after it
	// stopped counting, so clock skew between nodes cannot delete a live
	// one.
	heartbeatTTL = time.Hour
	// spread sizes the claim window per active poller: with n nodes a
	// poll looks at the first Max*n*spread ready items and takes its hash
	// share. Measured (doc.go): 4 gives ~0.0003 retries per claimed item
	// and 1.01 transactions per poll with 8 nodes; 2 gives 0.002 and 1.06.
	spread = 4
	// headCap caps the ready-head snapshot read of one poll (and the due
	// delayed items it considers): a few hundred kB of keys at most. With
	// n nodes the window is min(Max*n*spread, headCap); past that (very
	// large batches on many nodes) shares run short and top-ups conflict.
	headCap = 2048
	// gcEvery spaces garbage collection passes (old markers, orphan
	// uploads) on one node: their keys are harmless for markerTTL anyway.
	gcEvery = 10 * time.Second
	// defaultSweepLimit is used when SweepParams.Limit is 0.
	defaultSweepLimit = 100
)

// Options configures a Store.
type Options struct {
	// Prefix is the subspace; DefaultPrefix when empty. Two Stores with
	// different prefixes on one cluster are independent.
	Prefix []byte
	// Limits are the request limits; zero fields take storage.DefaultLimits'.
	Limits storage.Limits
	// Logger receives lifecycle messages; discarded when nil.
	Logger *slog.Logger
	// OnDeadline is called after a commit that created a deadline.
	OnDeadline storage.DeadlineFunc
	// Clock bounds the time one call spends retrying (with MaxRetryTime);
	// optional: without it only MaxAttempts bounds a call. It is the
	// node's clock: WatchReady, which takes no instant, judges by it which
	// ready entries the node's polls serve (watch.go).
	Clock        clock.Clock
	MaxRetryTime time.Duration
	// MaxAttempts bounds attempts per transaction; kv.DefaultMaxAttempts
	// when 0.
	MaxAttempts int
	// Seed seeds the claim-window and backoff randomness; random when 0.
	Seed uint64
	// ClaimSpread sizes the claim window when n nodes poll one queue: a
	// poll takes its hash share of the first Max*n*ClaimSpread ready items
	// (at most 2048). 0 means the measured default (DefaultClaimSpread); a
	// negative value always claims the strict head (for measurements: it
	// conflict-storms with several nodes).
	ClaimSpread int
}

// DefaultClaimSpread is the claim spread chosen by measurement (doc.go).
const DefaultClaimSpread = spread

// Metrics is a snapshot of a Store's counters. Counters only increase.
type Metrics struct {
	Txn           kv.RetrierMetrics // every transaction the store ran
	Polls         int64             // Poll calls that reached the database
	PollAttempts  int64             // transaction attempts made by those polls
	PollRetries   int64             // attempts after the first
	Claimed       int64             // items handed out by polls
	NonEmptyPolls int64             // polls that claimed at least one item
	Enqueued      int64
	UploadTxns    int64 // chunk upload transactions
	Heartbeats    int64 // poller heartbeat transactions (at most one per queue per second)
}

// Sub returns m - prev.
func (m Metrics) Sub(prev Metrics) Metrics {
	return Metrics{
		Txn:           m.Txn.Sub(prev.Txn),
		Polls:         m.Polls - prev.Polls,
		PollAttempts:  m.PollAttempts - prev.PollAttempts,
		PollRetries:   m.PollRetries - prev.PollRetries,
		Claimed:       m.Claimed - prev.Claimed,
		NonEmptyPolls: m.NonEmptyPolls - prev.NonEmptyPolls,
		Enqueued:      m.Enqueued - prev.Enqueued,
		UploadTxns:    m.UploadTxns - prev.UploadTxns,
		Heartbeats:    m.Heartbeats - prev.Heartbeats,
	}
}

// Store is a storage.Store on FoundationDB (or the model). It is stateless
// apart from caches and per-node coordination: any number of Stores, in any
// number of processes, may share one database and prefix.
type Store struct {
	db     kv.DB
	r      *kv.Retrier
	k      keys
	limits storage.Limits
	log    *slog.Logger
	onDL   storage.DeadlineFunc
	node   [16]byte
	spread int
	clk    clock.Clock  // Options.Clock; nil when not given
	latest atomic.Int64 // Latest, unix ns (0: none; set by Open)

	closed atomic.Bool
	ctx    context.Context // cancelled by Close: ends watch goroutines
	cancel context.CancelFunc
	wg     sync.WaitGroup

	pollLocks struct {
		sync.Mutex
		m map[string]*pollLock // queue -> one claim pass per queue per node, while polls use it
	}

	mu struct {
		sync.Mutex
		rng       *rand.Rand
		heartbeat map[string]time.Time // queue -> last heartbeat written, within about heartbeatTTL
		hbPruned  time.Time            // caller time of the last pruneHeartbeatsLocked
		hbPruneAt int                  // prune when heartbeat grows past this many entries
		lastGC    time.Time            // last collectGarbage, caller time
		hbCursor  []byte               // where the next garbage pass reads heartbeats from (nil: the start)
	}

	polls, pollAttempts, pollRetries, claimed, nonEmpty, enqueued, uploads, heartbeats atomic.Int64
}

// New returns a Store over db. It writes nothing until the first call.
func New(db kv.DB, o Options) (*Store, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: fdbsync: nil database", storage.ErrInvalidArgument)
	}
	o.Limits = o.Limits.WithDefaults()
	if len(o.Prefix) == 0 {
		o.Prefix = []byte(DefaultPrefix)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Store{
		db:     db,
		r:      kv.NewRetrier(db, kv.RetrierOptions{MaxAttempts: o.MaxAttempts, MaxDuration: o.MaxRetryTime, Clock: o.Clock}),
		k:      keys{prefix: append([]byte{}, o.Prefix...)},
		limits: o.Limits,
		log:    o.Logger.With("svc", "fdbsync"),
		onDL:   o.OnDeadline,
		spread: o.ClaimSpread,
		clk:    o.Clock,
	}
	if s.spread == 0 {
		s.spread = spread
	}
	if _, err := crand.Read(s.node[:]); err != nil {
		return nil, fmt.Errorf("fdbsync: node id: %w", err)
	}
	seed := o.Seed
	if seed == 0 {
		seed = uint64(s.node[0]) | uint64(s.node[1])<<8 | uint64(s.node[2])<<16 | uint64(s.node[3])<<24 | uint64(s.node[4])<<32
	}
	s.mu.rng = rand.New(rand.NewPCG(seed, seed^0xa5a5))
	s.mu.heartbeat = map[string]time.Time{}
	s.pollLocks.m = map[string]*pollLock{}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// latestHeartbeats caps the poller heartbeats Open reads for Latest: a
// few hundred kB of keys, one snapshot range read.
const latestHeartbeats = 4096

// Open returns a Store over db, as New does, having read Latest from it.
// OpenCluster opens with it; New reads nothing (tests, tools).
func Open(ctx context.Context, db kv.DB, o Options) (*Store, error) {
	s, err := New(db, o)
	if err != nil {
		return nil, err
	}
	if err := s.readLatest(ctx); err != nil {
		_ = s.Close() // nothing to clear: it never polled
		return nil, fmt.Errorf("fdbsync: open: read the cluster's latest time: %w", err)
	}
	return s, nil
}

// Latest returns a bound of the latest instant the nodes' clocks had
// reached by what they wrote, as Open read it, zero when none (or when
// the store came from New): the latest poller heartbeat (of the first
// latestHeartbeats, which nodes rewrite every second while they poll and
// a node's Close removes), the time the dedup key that expires last was
// seen, and the enqueue instant of the delayed item due last. A node whose
// clock reads earlier at start would hide entries others made ready, keep
// dedup keys, and grant leases other nodes' sweepers expire at once: main
// raises its clock to this first, as it does with rocksstore's Latest.
// Found by review (session 74): nothing did (doc.go, Clock skew).
func (s *Store) Latest() time.Time {
	if n := s.latest.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// readLatest sets latest from a few reads of one snapshot transaction;
// it never scans a queue. Values that do not decode are skipped (Check
// reports them).
func (s *Store) readLatest(ctx context.Context) error {
	v, err := s.view(ctx, func(tx kv.Tx) (any, error) {
		var latest time.Time
		raise := func(t time.Time) {
			if t.After(latest) {
				latest = t
			}
		}
		hb := s.k.ns(nsPoller)
		rows, err := tx.GetRange(hb, kv.PrefixEnd(hb), kv.RangeOptions{Snapshot: true, Limit: latestHeartbeats})
		if err != nil {
			return nil, err
		}
		for _, r := range rows {
			if t, _, err := readTime(r.Value); err == nil {
				raise(t)
			}
		}
		last := func(tag byte) ([]byte, error) {
			ns := s.k.ns(tag)
			rows, err := tx.GetRange(ns, kv.PrefixEnd(ns), kv.RangeOptions{Snapshot: true, Limit: 1, Reverse: true})
			if err != nil || len(rows) == 0 {
				return nil, err
			}
			return rows[0].Key[len(ns):], nil
		}
		// U <expires> <queue> <key>: the record's seen is its writer's
		// clock (the expiry is ahead of it).
		if rest, err := last(nsDedupExp); err != nil {
			return nil, err
		} else if rest != nil {
			_, rest, err1 := readTime(rest)
			q, rest, err2 := readStr(rest)
			key, _, err3 := readStr(rest)
			if err1 == nil && err2 == nil && err3 == nil {
				b, err := tx.Get(s.k.dedup(q, key), true)
				if err != nil {
					return nil, err
				}
				if rec, err := decodeDedup(b); b != nil && err == nil {
					raise(rec.seen)
				}
			}
		}
		// D <visible> <queue> <id>: the item's enqueue instant (its
		// visible_at is ahead of the clock).
		if rest, err := last(nsDelayAll); err != nil {
			return nil, err
		} else if rest != nil {
			_, rest, err1 := readTime(rest)
			q, rest, err2 := readStr(rest)
			id, err3 := idFromTail(rest)
			if err1 == nil && err2 == nil && err3 == nil {
				b, err := tx.Get(s.k.available(q, id), true)
				if err != nil {
					return nil, err
				}
				if rec, err := decodeRecord(b); b != nil && err == nil {
					raise(rec.enqueuedAt)
				}
			}
		}
		return latest, nil
	})
	if err != nil {
		return err
	}
	t, err := as[time.Time](v)
	if err != nil {
		return err
	}
	if !t.IsZero() {
		s.latest.Store(t.UnixNano())
	}
	return nil
}

// DB returns the database the store runs on (to open another Store, a
// new node, over the same data).
func (s *Store) DB() kv.DB { return s.db }

// Metrics returns the store's counters.
func (s *Store) Metrics() Metrics {
	return Metrics{
		Txn: s.r.Metrics(), Polls: s.polls.Load(), PollAttempts: s.pollAttempts.Load(),
		PollRetries: s.pollRetries.Load(), Claimed: s.claimed.Load(), NonEmptyPolls: s.nonEmpty.Load(),
		Enqueued: s.enqueued.Load(), UploadTxns: s.uploads.Load(), Heartbeats: s.heartbeats.Load(),
	}
}

// Close ends watches, removes this node's poller heartbeats and marks the
// store closed. It is idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	already := s.closed.Swap(true)
	s.mu.Unlock()
	if already {
		return nil
	}
	s.cancel()
	s.wg.Wait()
	s.mu.Lock()
	queues := make([]string, 0, len(s.mu.heartbeat))
	for q := range s.mu.heartbeat {
		queues = append(queues, q)
	}
	s.mu.Unlock()
	// Forget this node as a poller so a single remaining node serves in
	// strict order at once rather than after pollerTTL. A transaction per
	// txnBudget of keys: a node that polled tens of thousands of queues
	// within heartbeatTTL cleared them all in one, past FDB's 10 MB (found
	// by review, session 72).
	for len(queues) > 0 {
		n, size := 0, 0
		for ; n < len(queues) && size < txnBudget; n++ {
			// The key, its clear and its write conflict range.
			size += 3 * len(s.k.poller(queues[n], s.node))
		}
		batch := queues[:n]
		queues = queues[n:]
		err := s.blind(context.Background(), func(tx kv.Tx) {
			for _, q := range batch {
				tx.Clear(s.k.poller(q, s.node))
			}
		})
		if err != nil {
			// The rest stop counting after pollerTTL anyway.
			return fmt.Errorf("fdbsync: close: %w", err)
		}
	}
	return nil
}

func (s *Store) checkOpen() error {
	if s.closed.Load() {
		return storage.ErrClosed
	}
	return nil
}

func (s *Store) float() float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.rng.Float64()
}

func (s *Store) intN(n int) int {
	if n <= 1 {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.rng.IntN(n)
}

func randomToken() ([16]byte, error) {
	var b [16]byte
	_, err := crand.Read(b[:])
	return b, err
}

// call is one idempotent Store call: a marker key unique to the call, and,
// on an attempt after commit_unknown_result, the marker's value if an
// earlier attempt committed.
type call struct {
	key     []byte
	prior   []byte // non-nil: an earlier attempt committed with this result
	attempt int    // 1 for the first attempt
}

// set records the call's result; it commits with the call's writes.
func (c *call) set(tx kv.Tx, v []byte) {
	tx.Set(c.key, append([]byte{fmtMarker}, v...))
}

// setStamped records a result whose bytes [1:11) (after the format byte)
// are filled with the commit's versionstamp.
func (c *call) setStamped(tx kv.Tx, v []byte) {
	b := append([]byte{fmtMarker}, make([]byte, kv.VersionstampSize)...)
	b = append(b, v...)
	tx.SetVersionstampedValue(c.key, withOffset(b, 1))
}

// result returns the stored result without its format byte.
func (c *call) result() ([]byte, error) {
	if len(c.prior) < 1 || c.prior[0] != fmtMarker {
		return nil, errBadValue
	}
	return c.prior[1:], nil
}

// mutate runs fn as one idempotent transaction. Every attempt declares a
// read conflict on the call's marker and every committing attempt writes
// it, so at most one attempt of a call can ever commit. An attempt after
// commit_unknown_result first reads the marker: if present, fn is called
// with c.prior set and must only rebuild the result from it. It returns
// fn's value, the committed transaction (for its versionstamp) and the
// retry report.
func (s *Store) mutate(ctx context.Context, fn func(tx kv.Tx, c *call) (any, error)) (any, kv.Tx, kv.Report, error) {
	tok, err := randomToken()
	if err != nil {
		return nil, nil, kv.Report{}, fmt.Errorf("fdbsync: marker token: %w", err)
	}
	var mk []byte // filed under the first attempt's read version
	var last kv.Tx
	v, rep, err := s.r.Run(ctx, func(tx kv.Tx, cl kv.Call) (any, error) {
		last = tx
		if mk == nil {
			rv, err := tx.ReadVersion()
			if err != nil {
				return nil, err
			}
			mk = s.k.marker(rv, tok)
		}
		c := &call{key: mk, attempt: cl.Attempt}
		if cl.MaybeCommitted {
			prior, err := tx.Get(mk, false)
			if err != nil {
				return nil, err
			}
			c.prior = prior
		} else if err := tx.AddReadConflictRange(mk, kv.KeyAfter(mk)); err != nil {
			return nil, err
		}
		return fn(tx, c)
	})
	return v, last, rep, err
}

// blind runs fn, a transaction of plain writes that are safe to apply
// twice, with a marker so that a retry after commit_unknown_result can tell
// the write landed and stop (without it, a run of unknown results would
// retry until the limit).
func (s *Store) blind(ctx context.Context, fn func(tx kv.Tx)) error {
	_, _, _, err := s.mutate(ctx, func(tx kv.Tx, c *call) (any, error) {
		if c.prior != nil {
			return nil, nil
		}
		fn(tx)
		c.set(tx, nil)
		return nil, nil
	})
	return err
}

// view runs a read-only transaction.
func (s *Store) view(ctx context.Context, fn func(tx kv.Tx) (any, error)) (any, error) {
	return s.r.Transact(ctx, fn)
}

// as is the checked form of v.(T) for transaction results: a mismatch is
// a bug in this package, reported as an error instead of a panic in a
// caller's goroutine.
func as[T any](v any) (T, error) {
	t, ok := v.(T)
	if !ok {
		var zero T
		return zero, fmt.Errorf("fdbsync: internal error: transaction returned %T, want %T", v, zero)
	}
	return t, nil
}

// add bumps a queue counter.
func (s *Store) add(tx kv.Tx, q string, ctr byte, d int64) {
	if d != 0 {
		tx.Add(s.k.counter(q, ctr), d)
	}
}

// wakeQueue bumps the queue's wake key so watchers on other nodes see new
// ready items.
func (s *Store) wakeQueue(tx kv.Tx, q string) { tx.Add(s.k.wake(q), 1) }

// config reads a queue's config (with a read conflict: a concurrent
// SetQueueConfig re-runs the caller), brought within this node's limits
// (another node of the cluster may have set it under wider ones). ok is
// false when the queue does not exist.
func (s *Store) config(tx kv.Tx, q string) (storage.QueueConfig, bool, error) {
	c, _, ok, err := s.queueConfig(tx, q)
	return c, ok, err
}

// queueConfig is config with the queue's incarnation: the versionstamp of
// the commit that created it (zero for a queue an older node created).
// Dedup records written before it are left from a removed queue of the
// same name (removeQueue clears them after the queue is gone, a chunk per
// transaction) and count as absent.
func (s *Store) queueConfig(tx kv.Tx, q string) (storage.QueueConfig, kv.Versionstamp, bool, error) {
	b, err := tx.Get(s.k.queue(q), false)
	if err != nil {
		return storage.QueueConfig{}, kv.Versionstamp{}, false, err
	}
	if b == nil {
		return storage.QueueConfig{}, kv.Versionstamp{}, false, nil
	}
	c, err := decodeConfig(b)
	if err != nil {
		return c, kv.Versionstamp{}, false, fmt.Errorf("fdbsync: queue %q config: %w", q, err)
	}
	return s.limits.ClampQueueConfig(c), configCreated(b), true, nil
}

// maxAttempts is the limit that applies to r at the end of a delivery.
func maxAttempts(r *record, c storage.QueueConfig) uint32 {
	if r.maxAttempts != 0 {
		return r.maxAttempts
	}
	return c.MaxAttempts
}

// payloads fills the payload of each record (snapshot reads: chunks are
// written once before the item exists and never change).
func (s *Store) payloads(tx kv.Tx, recs []*record) ([][]byte, error) {
	out := make([][]byte, len(recs))
	var keys [][]byte
	for _, r := range recs {
		if r.chunked {
			for n := 0; n < int(r.nchunks); n++ {
				keys = append(keys, s.k.chunk(r.pid, n))
			}
		}
	}
	var vals [][]byte
	if len(keys) > 0 {
		var err error
		if vals, err = tx.GetMany(keys, true); err != nil {
			return nil, err
		}
	}
	j := 0
	for i, r := range recs {
		if !r.chunked {
			out[i] = append([]byte{}, r.inline...)
			continue
		}
		p := make([]byte, 0, r.size)
		for n := 0; n < int(r.nchunks); n++ {
			if vals[j] == nil {
				return nil, fmt.Errorf("%w: fdbsync: payload chunk %d missing", storage.ErrCorrupt, n)
			}
			p = append(p, vals[j]...)
			j++
		}
		out[i] = p
	}
	return out, nil
}

// clearPayload deletes a chunked payload.
func (s *Store) clearPayload(tx kv.Tx, r *record) {
	if r.chunked {
		p := s.k.chunkPrefix(r.pid)
		tx.ClearRange(p, kv.PrefixEnd(p))
	}
}

// toItem builds a storage.Item.
func toItem(q string, id storage.ItemID, r *record, payload []byte, st storage.State) storage.Item {
	return storage.Item{
		ID: id, Queue: q, Payload: payload, Priority: r.prio, Attempts: r.attempts, MaxAttempts: r.maxAttempts,
		EnqueuedAt: r.enqueuedAt, VisibleAt: r.visibleAt, DedupKey: r.dedupKey, LastError: r.lastError, State: st,
	}
}

// putAvailable writes r as available with its index entries: ready when
// VisibleAt <= now, else delayed. It returns the state it counted.
func (s *Store) putAvailable(tx kv.Tx, q string, id storage.ItemID, r *record, now time.Time) storage.State {
	r.lease = storage.LeaseID{}
	r.delayed = r.visibleAt.After(now)
	tx.Set(s.k.available(q, id), r.encode())
	if r.delayed {
		tx.Set(s.k.delayed(q, r.visibleAt, id), []byte{r.prio})
		tx.Set(s.k.delayAll(r.visibleAt, q, id), nil)
		s.add(tx, q, ctrDelayed, 1)
		return storage.StateDelayed
	}
	tx.Set(s.k.ready(q, r.prio, r.visibleAt, id), nil)
	s.add(tx, q, ctrReady, 1)
	return storage.StateReady
}

// clearAvailable removes an available item and its index entries, and
// uncounts it.
func (s *Store) clearAvailable(tx kv.Tx, q string, id storage.ItemID, r *record) {
	tx.Clear(s.k.available(q, id))
	if r.delayed {
		tx.Clear(s.k.delayed(q, r.visibleAt, id))
		tx.Clear(s.k.delayAll(r.visibleAt, q, id))
		s.add(tx, q, ctrDelayed, -1)
	} else {
		tx.Clear(s.k.ready(q, r.prio, r.visibleAt, id))
		s.add(tx, q, ctrReady, -1)
	}
}

// deadline reports a new deadline to the sweeper hook.
func (s *Store) deadline(t time.Time) {
	if s.onDL != nil && !t.IsZero() {
		s.onDL(t)
	}
}

// recordSize estimates the commit bytes of moving r between namespaces
// under keys of about keyLen bytes: the record set, an index entry set, the
// old key and index entry cleared, each with its write conflict range
// (about twice the key again), as FDB counts them. Checked against the
// model's exact count: within the budget in every test.
func recordSize(r *record, keyLen int) int {
	return 12*keyLen + 160 + len(r.inline) + len(r.dedupKey) + len(r.lastError) + len(r.reason)
}

var _ storage.Store = (*Store)(nil)
