package peers

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/redis/go-redis/v9"

	"github.com/leaseq/leaseq/bench/procx"
	"github.com/leaseq/leaseq/bench/target"
)

const (
	redisGroup = "bench"
	// redisField is the single field of every stream entry.
	redisField = "p"
	// redisReadyWait bounds how long a fresh redis-server may take to
	// listen (it starts in milliseconds; the slack is for a loaded box).
	redisReadyWait = 15 * time.Second
)

// Redis is Redis Streams with one appendfsync policy ("always" or
// "everysec").
type Redis struct {
	// Fsync is the appendfsync value.
	Fsync string
}

// Name implements target.System.
func (r Redis) Name() string { return "redis-" + r.Fsync }

// Family implements target.System.
func (Redis) Family() string { return "redis" }

// Durability implements target.System.
func (r Redis) Durability() target.Durability {
	if r.Fsync == "always" {
		// Redis fsyncs the AOF once per event-loop pass before sending the
		// replies of that pass: pipelined and concurrent clients share it.
		return target.Durability{Class: target.ClassDurable, Mode: "AOF fsync always (group commit per event loop)"}
	}
	return target.Durability{Class: target.ClassRelaxed, Mode: "AOF fsync every 1s"}
}

// Available implements target.System.
func (Redis) Available() error {
	_, err := procx.LookPath("redis-server")
	return err
}

// Start implements target.System.
func (r Redis) Start(ctx context.Context, o target.StartOptions) (target.Instance, error) {
	bin, err := procx.LookPath("redis-server")
	if err != nil {
		return nil, err
	}
	port, err := procx.FreePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p, err := procx.Start(ctx, o.Clock, r.Name(), o.Dir, addr, redisReadyWait, bin,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", o.Dir,
		"--appendonly", "yes", "--appendfsync", r.Fsync,
		// RDB snapshots off: the AOF is the durability under test, and a
		// background save would add fork noise to the numbers.
		"--save", "", "--daemonize", "no", "--protected-mode", "no",
		// The AOF rewrite would fork mid-run; the runs are short enough
		// that the log never needs compacting.
		"--auto-aof-rewrite-percentage", "0")
	if err != nil {
		return nil, err
	}
	in := &redisInstance{proc: p, addr: addr, lease: o.Lease, clk: o.Clock}
	in.pool = redis.NewClient(in.options(32))
	for _, q := range o.Queues {
		if err := in.pool.XGroupCreateMkStream(ctx, q, redisGroup, "0").Err(); err != nil {
			cerr := in.Close()
			return nil, errors.Join(fmt.Errorf("peers: redis: create group on %s: %w", q, err), cerr)
		}
	}
	return in, nil
}

type redisInstance struct {
	proc   *procx.Process
	addr   string
	lease  time.Duration
	clk    clock.Clock
	pool   *redis.Client
	nextID atomic.Int64
	closed atomic.Bool
}

func (in *redisInstance) options(pool int) *redis.Options {
	return &redis.Options{
		Addr:     in.addr,
		PoolSize: pool,
		// Blocking XREADGROUP waits up to the poll wait; the client's
		// default 3 s read timeout would cut longer waits.
		ReadTimeout:           -1,
		ContextTimeoutEnabled: true,
		DisableIdentity:       true,
	}
}

func (in *redisInstance) PID() int { return in.proc.PID() }

func (in *redisInstance) Close() error {
	if in.closed.Swap(true) {
		return nil
	}
	return errors.Join(in.pool.Close(), in.proc.Stop())
}

func (in *redisInstance) Connect(ctx context.Context) (target.Client, error) {
	// One connection per worker, like one consumer process per worker.
	c := redis.NewClient(in.options(1))
	if err := c.Ping(ctx).Err(); err != nil {
		return nil, errors.Join(fmt.Errorf("peers: redis: connect: %w", err), c.Close())
	}
	return &redisClient{in: in, c: c, name: "c" + strconv.FormatInt(in.nextID.Add(1), 10), claims: map[string]*redisClaim{}}, nil
}

type redisClient struct {
	in     *redisInstance
	c      *redis.Client
	name   string
	claims map[string]*redisClaim
}

// redisClaim is one client's XAUTOCLAIM scan of one queue.
type redisClaim struct {
	last   time.Time // when the last scan started from the beginning
	cursor string    // where to continue; "" when the last scan finished
}

func (c *redisClient) Close() error { return c.c.Close() }

// Ping is Redis's PING (target.Pinger).
func (c *redisClient) Ping(ctx context.Context) error {
	if err := c.c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("peers: redis: ping: %w", err)
	}
	return nil
}

func (c *redisClient) Enqueue(ctx context.Context, queue string, payloads [][]byte) error {
	if len(payloads) == 1 {
		if err := c.c.XAdd(ctx, &redis.XAddArgs{Stream: queue, Values: []any{redisField, payloads[0]}}).Err(); err != nil {
			return fmt.Errorf("peers: redis: xadd: %w", err)
		}
		return nil
	}
	// One round trip per batch; with appendfsync always, Redis syncs the
	// whole pipeline once before replying.
	_, err := c.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, pl := range payloads {
			p.XAdd(ctx, &redis.XAddArgs{Stream: queue, Values: []any{redisField, pl}})
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("peers: redis: xadd pipeline: %w", err)
	}
	return nil
}

func (c *redisClient) Poll(ctx context.Context, queue string, max int, wait time.Duration) ([]target.Delivery, error) {
	// Reclaim entries whose consumer has been silent longer than the lease.
	// A scan starts at most every lease/4 per queue (XAUTOCLAIM walks the
	// pending list, so running it on every poll would tax the steady state
	// for nothing) and, once it finds entries, continues from its cursor on
	// the following polls until the pending list is exhausted.
	cl := c.claims[queue]
	if cl == nil {
		cl = &redisClaim{}
		c.claims[queue] = cl
	}
	now := c.in.clk.Now()
	if cl.cursor != "" || cl.last.IsZero() || now.Sub(cl.last) >= c.in.lease/4 {
		start := cl.cursor
		if start == "" {
			start, cl.last = "0-0", now
		}
		msgs, next, err := c.c.XAutoClaim(ctx, &redis.XAutoClaimArgs{
			Stream: queue, Group: redisGroup, MinIdle: c.in.lease, Start: start, Count: int64(max), Consumer: c.name,
		}).Result()
		if err != nil {
			return nil, fmt.Errorf("peers: redis: xautoclaim: %w", err)
		}
		cl.cursor = ""
		if next != "0-0" && len(msgs) > 0 {
			cl.cursor = next
		}
		if len(msgs) > 0 {
			return redisDeliveries(msgs), nil
		}
	}
	block := wait
	if block <= 0 {
		// XREADGROUP BLOCK 0 means forever; -1 makes go-redis omit BLOCK.
		block = -1
	}
	res, err := c.c.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: redisGroup, Consumer: c.name, Streams: []string{queue, ">"}, Count: int64(max), Block: block,
	}).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("peers: redis: xreadgroup: %w", err)
	}
	var ds []target.Delivery
	for _, s := range res {
		ds = append(ds, redisDeliveries(s.Messages)...)
	}
	return ds, nil
}

func redisDeliveries(msgs []redis.XMessage) []target.Delivery {
	ds := make([]target.Delivery, 0, len(msgs))
	for _, m := range msgs {
		v, _ := m.Values[redisField].(string)
		ds = append(ds, target.Delivery{Payload: []byte(v), Handle: m.ID})
	}
	return ds
}

func (c *redisClient) Ack(ctx context.Context, queue string, ds []target.Delivery) error {
	ids := make([]string, len(ds))
	for i, d := range ds {
		ids[i] = d.Handle.(string)
	}
	// XACK leaves the entry in the stream; a work queue deletes it, so
	// XDEL goes in the same round trip (Redis 7.0 has no XACKDEL).
	var xack *redis.IntCmd
	_, err := c.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		xack = p.XAck(ctx, queue, redisGroup, ids...)
		p.XDel(ctx, queue, ids...)
		return nil
	})
	if err != nil {
		return fmt.Errorf("peers: redis: xack+xdel: %w", err)
	}
	if lost := xackLost(xack, len(ids)); lost != nil {
		return lost
	}
	return nil
}

// xackLost is the acks XACK did not count (nil when it counted every
// id): an id no longer pending in the group, as another consumer claimed
// it after its idle time and acked it first. Redis says only how many.
func xackLost(xack *redis.IntCmd, n int) *target.LostAcks {
	if got := xack.Val(); got < int64(n) {
		return &target.LostAcks{N: n - int(got)}
	}
	return nil
}

// AckPoll implements target.AckPoller: XACK, XDEL and a non-blocking
// XREADGROUP go out in one pipeline (one round trip; with appendfsync
// always, one fsync for the event-loop pass). When that read finds
// nothing, a plain Poll waits, so the ack is confirmed when the pipeline
// returns rather than after a blocked read. A due XAUTOCLAIM scan also
// falls back to Ack then Poll.
func (c *redisClient) AckPoll(ctx context.Context, queue string, ack []target.Delivery, acked func(*target.LostAcks), max int, wait time.Duration) ([]target.Delivery, error) {
	cl := c.claims[queue]
	if cl == nil || cl.cursor != "" || c.in.clk.Since(cl.last) >= c.in.lease/4 {
		var lost *target.LostAcks
		if err := c.Ack(ctx, queue, ack); err != nil && !errors.As(err, &lost) {
			return nil, err
		}
		acked(lost)
		return c.Poll(ctx, queue, max, wait)
	}
	ids := make([]string, len(ack))
	for i, d := range ack {
		ids[i] = d.Handle.(string)
	}
	var read *redis.XStreamSliceCmd
	var xack *redis.IntCmd
	_, err := c.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		xack = p.XAck(ctx, queue, redisGroup, ids...)
		p.XDel(ctx, queue, ids...)
		read = p.XReadGroup(ctx, &redis.XReadGroupArgs{
			Group: redisGroup, Consumer: c.name, Streams: []string{queue, ">"}, Count: int64(max), Block: -1,
		})
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("peers: redis: xack+xdel+xreadgroup: %w", err)
	}
	if err := xack.Err(); err != nil {
		return nil, fmt.Errorf("peers: redis: xack: %w", err)
	}
	acked(xackLost(xack, len(ids)))
	res, err := read.Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("peers: redis: xreadgroup: %w", err)
	}
	var ds []target.Delivery
	for _, s := range res {
		ds = append(ds, redisDeliveries(s.Messages)...)
	}
	if len(ds) == 0 {
		return c.Poll(ctx, queue, max, wait)
	}
	return ds, nil
}
