package peers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leaseq/leaseq/bench/procx"
	"github.com/leaseq/leaseq/bench/target"
)

const (
	natsStream = "LQ"
	// natsReadyWait bounds how long nats-server may take to listen; it
	// recovers JetStream state first, which is empty here.
	natsReadyWait = 20 * time.Second
	// natsMaxPending caps async publishes in flight per client: above the
	// largest batch (1,000) so a batch is never split by back-pressure.
	natsMaxPending = 4096
)

// NATS is NATS JetStream with file storage, with sync_interval always or
// the server default.
type NATS struct {
	// SyncAlways sets jetstream.sync_interval: always (nats-server >=
	// 2.10): fsync after every write. Otherwise the default 2 min interval.
	SyncAlways bool
}

// Name implements target.System.
func (n NATS) Name() string {
	if n.SyncAlways {
		return "nats-syncalways"
	}
	return "nats-default"
}

// Family implements target.System.
func (NATS) Family() string { return "nats" }

// Durability implements target.System.
func (n NATS) Durability() target.Durability {
	if n.SyncAlways {
		return target.Durability{Class: target.ClassDurable, Mode: "file store, sync_interval always"}
	}
	return target.Durability{Class: target.ClassRelaxed, Mode: "file store, fsync every 2m (default)"}
}

// Available implements target.System. It also rejects a nats-server too
// old for sync_interval, which fails at start with a config error.
func (NATS) Available() error {
	_, err := procx.LookPath("nats-server", procx.GoBinDirs()...)
	return err
}

// Start implements target.System.
func (n NATS) Start(ctx context.Context, o target.StartOptions) (target.Instance, error) {
	bin, err := procx.LookPath("nats-server", procx.GoBinDirs()...)
	if err != nil {
		return nil, err
	}
	port, err := procx.FreePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	store := filepath.Join(o.Dir, "js")
	conf := fmt.Sprintf("listen: %q\njetstream {\n  store_dir: %q\n", addr, store)
	if n.SyncAlways {
		conf += "  sync_interval: always\n"
	}
	conf += "}\n"
	confPath := filepath.Join(o.Dir, "nats.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return nil, fmt.Errorf("peers: nats: config: %w", err)
	}
	p, err := procx.Start(ctx, o.Clock, n.Name(), o.Dir, addr, natsReadyWait, bin, "-c", confPath)
	if err != nil {
		return nil, err
	}
	in := &natsInstance{proc: p, url: "nats://" + addr, lease: o.Lease}
	if err := in.setup(ctx, o.Queues); err != nil {
		return nil, errors.Join(err, in.Close())
	}
	return in, nil
}

type natsInstance struct {
	proc   *procx.Process
	url    string
	lease  time.Duration
	closed atomic.Bool
}

func natsSubject(queue string) string { return "q." + queue }

func (in *natsInstance) setup(ctx context.Context, queues []string) error {
	nc, err := nats.Connect(in.url)
	if err != nil {
		return fmt.Errorf("peers: nats: connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("peers: nats: jetstream: %w", err)
	}
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name: natsStream, Subjects: []string{"q.>"},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage,
	})
	if err != nil {
		return fmt.Errorf("peers: nats: create stream: %w", err)
	}
	for _, q := range queues {
		_, err := js.CreateOrUpdateConsumer(ctx, natsStream, jetstream.ConsumerConfig{
			Durable: q, FilterSubject: natsSubject(q),
			AckPolicy: jetstream.AckExplicitPolicy, AckWait: in.lease,
			// No cap on unacked messages: leaseq has none, and the lease
			// storm holds a whole backlog unacked at once.
			MaxAckPending: -1, MaxDeliver: -1,
			// Pull requests may ask for a batch of up to 1,000.
			MaxRequestBatch: 0,
		})
		if err != nil {
			return fmt.Errorf("peers: nats: create consumer %s: %w", q, err)
		}
	}
	return nil
}

func (in *natsInstance) PID() int { return in.proc.PID() }

func (in *natsInstance) Close() error {
	if in.closed.Swap(true) {
		return nil
	}
	return in.proc.Stop()
}

func (in *natsInstance) Connect(ctx context.Context) (target.Client, error) {
	nc, err := nats.Connect(in.url)
	if err != nil {
		return nil, fmt.Errorf("peers: nats: connect: %w", err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(natsMaxPending))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("peers: nats: jetstream: %w", err)
	}
	return &natsClient{nc: nc, js: js, cons: map[string]jetstream.Consumer{}}, nil
}

type natsClient struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	cons map[string]jetstream.Consumer
}

func (c *natsClient) Close() error {
	c.nc.Close()
	return nil
}

// Ping is the NATS protocol's PING/PONG, which the client sends to flush
// (target.Pinger).
func (c *natsClient) Ping(ctx context.Context) error {
	if err := c.nc.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("peers: nats: ping: %w", err)
	}
	return nil
}

func (c *natsClient) Enqueue(ctx context.Context, queue string, payloads [][]byte) error {
	subj := natsSubject(queue)
	if len(payloads) == 1 {
		if _, err := c.js.Publish(ctx, subj, payloads[0]); err != nil {
			return fmt.Errorf("peers: nats: publish: %w", err)
		}
		return nil
	}
	// JetStream has no batch publish in this client: publish the batch
	// asynchronously and wait for every PubAck, the usual way to batch.
	futs := make([]jetstream.PubAckFuture, 0, len(payloads))
	for _, p := range payloads {
		f, err := c.js.PublishAsync(subj, p)
		if err != nil {
			return fmt.Errorf("peers: nats: publish async: %w", err)
		}
		futs = append(futs, f)
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return fmt.Errorf("peers: nats: publish ack: %w", err)
		case <-ctx.Done():
			return fmt.Errorf("peers: nats: publish ack: %w", ctx.Err())
		}
	}
	return nil
}

func (c *natsClient) consumer(ctx context.Context, queue string) (jetstream.Consumer, error) {
	if cs := c.cons[queue]; cs != nil {
		return cs, nil
	}
	cs, err := c.js.Consumer(ctx, natsStream, queue)
	if err != nil {
		return nil, fmt.Errorf("peers: nats: consumer %s: %w", queue, err)
	}
	c.cons[queue] = cs
	return cs, nil
}

func (c *natsClient) Poll(ctx context.Context, queue string, max int, wait time.Duration) ([]target.Delivery, error) {
	cs, err := c.consumer(ctx, queue)
	if err != nil {
		return nil, err
	}
	// A JetStream fetch returns when its batch is full or its wait ends,
	// not when the first message arrives. So take what is ready at once;
	// if nothing is, wait for one message and then take what is ready
	// behind it: the first item is never held back waiting for a batch.
	ds, err := natsFetch(cs.FetchNoWait(max))
	if err != nil || len(ds) > 0 || wait <= 0 {
		return ds, err
	}
	ds, err = natsFetch(cs.Fetch(1, jetstream.FetchMaxWait(wait)))
	if err != nil || len(ds) == 0 || max == 1 {
		return ds, err
	}
	more, err := natsFetch(cs.FetchNoWait(max - 1))
	return append(ds, more...), err
}

func natsFetch(b jetstream.MessageBatch, err error) ([]target.Delivery, error) {
	if err != nil {
		return nil, fmt.Errorf("peers: nats: fetch: %w", err)
	}
	var ds []target.Delivery
	for m := range b.Messages() {
		ds = append(ds, target.Delivery{Payload: m.Data(), Handle: m})
	}
	if err := b.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
		return ds, fmt.Errorf("peers: nats: fetch: %w", err)
	}
	return ds, nil
}

func (c *natsClient) Ack(ctx context.Context, queue string, ds []target.Delivery) error {
	if len(ds) == 0 {
		return nil
	}
	// Acks of one connection reach the consumer in order, so confirming
	// the last one (a double ack waits for the server's reply) confirms
	// the batch: one round trip per batch, as for the other systems. An
	// error fails the row; the server does not say when an ack came after
	// AckWait had handed the message to another consumer, so unlike the
	// other systems no ack is reported lost (target.LostAcks).
	for _, d := range ds[:len(ds)-1] {
		if err := d.Handle.(jetstream.Msg).Ack(); err != nil {
			return fmt.Errorf("peers: nats: ack: %w", err)
		}
	}
	if err := ds[len(ds)-1].Handle.(jetstream.Msg).DoubleAck(ctx); err != nil {
		return fmt.Errorf("peers: nats: double ack: %w", err)
	}
	return nil
}
