package peers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/beanstalkd/go-beanstalk"

	"github.com/leaseq/leaseq/bench/procx"
	"github.com/leaseq/leaseq/bench/target"
)

// beanstalkReadyWait bounds how long beanstalkd may take to listen; it
// replays its binlog first, which is empty for a fresh directory.
const beanstalkReadyWait = 15 * time.Second

// beanstalkPri is the priority of every put: the middle of the range, so
// nothing in the workloads depends on priority order.
const beanstalkPri = 1 << 31

// Beanstalkd is beanstalkd with its binlog, fsyncing every write or never.
type Beanstalkd struct {
	// Fsync true runs -f 0 (fsync after every binlog write); false runs
	// -F (never fsync).
	Fsync bool
}

// Name implements target.System.
func (b Beanstalkd) Name() string {
	if b.Fsync {
		return "beanstalkd-fsync"
	}
	return "beanstalkd-nofsync"
}

// Family implements target.System.
func (Beanstalkd) Family() string { return "beanstalkd" }

// Durability implements target.System.
func (b Beanstalkd) Durability() target.Durability {
	if b.Fsync {
		return target.Durability{Class: target.ClassDurable, Mode: "binlog fsync per write (-f 0)"}
	}
	return target.Durability{Class: target.ClassRelaxed, Mode: "binlog, no fsync (-F)"}
}

// Available implements target.System.
func (Beanstalkd) Available() error {
	_, err := procx.LookPath("beanstalkd")
	return err
}

// Start implements target.System.
func (b Beanstalkd) Start(ctx context.Context, o target.StartOptions) (target.Instance, error) {
	bin, err := procx.LookPath("beanstalkd")
	if err != nil {
		return nil, err
	}
	if o.Lease < time.Second {
		// TTR is whole seconds in the protocol.
		return nil, fmt.Errorf("peers: beanstalkd: lease %v below its 1 s TTR granularity", o.Lease)
	}
	port, err := procx.FreePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	args := []string{"-l", "127.0.0.1", "-p", strconv.Itoa(port), "-b", o.Dir,
		// Payloads up to the harness's largest (1 MiB, leaseq's limit).
		"-z", strconv.Itoa(1 << 20)}
	if b.Fsync {
		args = append(args, "-f", "0")
	} else {
		args = append(args, "-F")
	}
	p, err := procx.Start(ctx, o.Clock, b.Name(), o.Dir, addr, beanstalkReadyWait, bin, args...)
	if err != nil {
		return nil, err
	}
	return &beanstalkInstance{proc: p, addr: addr, ttr: o.Lease}, nil
}

type beanstalkInstance struct {
	proc   *procx.Process
	addr   string
	ttr    time.Duration
	closed atomic.Bool
}

func (in *beanstalkInstance) PID() int { return in.proc.PID() }

func (in *beanstalkInstance) Close() error {
	if in.closed.Swap(true) {
		return nil
	}
	return in.proc.Stop()
}

func (in *beanstalkInstance) Connect(ctx context.Context) (target.Client, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", in.addr)
	if err != nil {
		return nil, fmt.Errorf("peers: beanstalkd: connect: %w", err)
	}
	c := beanstalk.NewConn(nc)
	return &beanstalkClient{in: in, c: c, nc: nc, tubes: map[string]*beanstalk.Tube{}, sets: map[string]*beanstalk.TubeSet{}}, nil
}

type beanstalkClient struct {
	in    *beanstalkInstance
	c     *beanstalk.Conn
	nc    net.Conn
	tubes map[string]*beanstalk.Tube
	sets  map[string]*beanstalk.TubeSet
}

func (c *beanstalkClient) Close() error { return c.c.Close() }

// watchCtx makes a blocked protocol call give up when ctx ends, by setting
// the connection's deadline; the returned func undoes it.
func (c *beanstalkClient) watchCtx(ctx context.Context) func() {
	stop := context.AfterFunc(ctx, func() {
		_ = c.nc.SetDeadline(time.Unix(1, 0))
	})
	return func() { stop() }
}

func (c *beanstalkClient) Enqueue(ctx context.Context, queue string, payloads [][]byte) error {
	defer c.watchCtx(ctx)()
	t := c.tubes[queue]
	if t == nil {
		t = beanstalk.NewTube(c.c, queue)
		c.tubes[queue] = t
	}
	for _, p := range payloads {
		if _, err := t.Put(p, beanstalkPri, 0, c.in.ttr); err != nil {
			return fmt.Errorf("peers: beanstalkd: put: %w", err)
		}
	}
	return nil
}

func (c *beanstalkClient) Poll(ctx context.Context, queue string, max int, wait time.Duration) ([]target.Delivery, error) {
	defer c.watchCtx(ctx)()
	ts := c.sets[queue]
	if ts == nil {
		ts = beanstalk.NewTubeSet(c.c, queue)
		c.sets[queue] = ts
	}
	var ds []target.Delivery
	for len(ds) < max {
		// Only the first reserve waits; the rest of the batch takes what is
		// ready now (timeout 0), like a batch poll.
		w := time.Duration(0)
		if len(ds) == 0 {
			w = wait
		}
		id, body, err := ts.Reserve(w)
		if errors.Is(err, beanstalk.ErrTimeout) || errors.Is(err, beanstalk.ErrDeadline) {
			break
		}
		if err != nil {
			if ctx.Err() != nil {
				return ds, fmt.Errorf("peers: beanstalkd: reserve: %w", ctx.Err())
			}
			return ds, fmt.Errorf("peers: beanstalkd: reserve: %w", err)
		}
		ds = append(ds, target.Delivery{Payload: body, Handle: id})
	}
	return ds, nil
}

func (c *beanstalkClient) Ack(ctx context.Context, queue string, ds []target.Delivery) error {
	defer c.watchCtx(ctx)()
	var lost target.LostAcks
	for i, d := range ds {
		err := c.c.Delete(d.Handle.(uint64))
		// NOT_FOUND: the TTR ran out and another worker holds (or deleted)
		// the job; at-least-once, so not a failure of the run, but not a
		// job this delete completed either (target.LostAcks).
		if errors.Is(err, beanstalk.ErrNotFound) {
			lost.N++
			lost.Index = append(lost.Index, i)
			continue
		}
		if err != nil {
			return fmt.Errorf("peers: beanstalkd: delete: %w", err)
		}
	}
	if lost.N > 0 {
		return &lost
	}
	return nil
}
