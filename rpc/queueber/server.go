package queueber

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"capnproto.org/go/capnp/v3"
	"capnproto.org/go/capnp/v3/exc"

	"github.com/leaseq/leaseq/rpc"
	qbschema "github.com/leaseq/leaseq/schema/queueber"
	"github.com/leaseq/leaseq/storage"
)

// Bootstrap checks queue and returns the BootstrapFunc that serves
// Queueber's Queue interface over the leaseq queue named queue: pass it to
// srv.StartBootstrap with the Queueber listener. The queue is created on
// the first add, as every leaseq queue is.
func Bootstrap(srv *rpc.Server, queue string) (rpc.BootstrapFunc, error) {
	if srv == nil {
		return nil, errors.New("queueber: nil rpc.Server")
	}
	if err := srv.Limits().ValidateQueueName(queue); err != nil {
		return nil, fmt.Errorf("queueber: queue: %w", err)
	}
	return func(c *rpc.Conn) capnp.Client {
		return capnp.Client(qbschema.Queue_ServerToClient(&queueServer{srv: srv, conn: c, queue: queue, limits: srv.Limits()}))
	}, nil
}

// queueServer implements qbschema.Queue_Server for one connection. Every
// handler calls call.Go() first, as the Queue interface's do: a poll may
// park and every write waits for its fsync, and neither may hold up the
// connection's other calls. Arguments alias the incoming message and are
// valid only until the handler returns; payloads handed to the store are
// copied.
type queueServer struct {
	srv    *rpc.Server
	conn   *rpc.Conn
	queue  string
	limits storage.Limits // srv.Limits(): defaults filled in
}

// call runs body through the connection's accounting (metrics, shutdown
// draining, reply budget) and turns its error into a Cap'n Proto
// exception: "overloaded" for errors that mean "retry later" (the node is
// shutting down or out of disk space, too many parked polls), "failed"
// for the rest.
func (q *queueServer) call(op rpc.Op, reply *capnp.Message, body func() error) error {
	err := q.conn.Call(op, reply, body)
	if err == nil {
		return nil
	}
	typ := exc.Failed
	if rpc.Overloaded(err) {
		typ = exc.Overloaded
	}
	return &exc.Exception{Type: typ, Prefix: "leaseq queueber", Cause: err}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{storage.ErrInvalidArgument}, args...)...)
}

// secs converts whole seconds from the wire, saturating instead of
// overflowing, so the range checks see a huge value as huge.
func secs(n uint64) time.Duration {
	if n > uint64(math.MaxInt64/int64(time.Second)) {
		return math.MaxInt64
	}
	return time.Duration(n) * time.Second
}

// leaseFor is a Queueber lease in whole seconds as a leaseq lease: 0 is
// refused (as Queueber refuses it), anything else is clamped to the node's
// [--min-lease, --max-lease].
func (q *queueServer) leaseFor(n uint64) (time.Duration, error) {
	if n == 0 {
		return 0, invalid("leaseValiditySecs must be > 0")
	}
	return min(max(secs(n), q.limits.MinLease), q.limits.MaxLease), nil
}

// leaseArg reads and checks a request's lease field (16 bytes).
func leaseArg(get func() ([]byte, error)) (storage.LeaseID, error) {
	var l storage.LeaseID
	b, err := get()
	if err != nil {
		return l, invalid("lease: %v", err)
	}
	if len(b) != len(l) {
		return l, invalid("lease must be %d bytes, got %d", len(l), len(b))
	}
	copy(l[:], b)
	return l, nil
}

// Add implements qbschema.Queue_Server: one enqueue of every item into the
// queue, all or nothing. One 16-byte id per item, in order.
func (q *queueServer) Add(ctx context.Context, call qbschema.Queue_add) error {
	call.Go()
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return q.call(rpc.OpEnqueue, res.Message(), func() error {
		req, err := call.Args().Req()
		if err != nil {
			return invalid("req: %v", err)
		}
		in, err := req.Items()
		if err != nil {
			return invalid("items: %v", err)
		}
		n := in.Len()
		if err := q.limits.ValidateBatch(n); err != nil {
			return err
		}
		items := make([]storage.EnqueueItem, n)
		for i := range items {
			w := in.At(i)
			p, err := w.Contents()
			if err != nil {
				return invalid("items[%d]: contents: %v", i, err)
			}
			// The message's buffer is released after the call.
			items[i] = storage.EnqueueItem{Payload: bytes.Clone(p), Delay: secs(w.VisibilityTimeoutSecs())}
		}
		// Server.Enqueue checks every item (payload size, delay) before
		// writing any: one bad item fails the call, naming its index.
		out, err := q.srv.Enqueue(ctx, storage.EnqueueParams{Queue: q.queue, Items: items})
		if err != nil {
			return err
		}
		for i, r := range out {
			if r.Code != storage.CodeOK {
				// The server checked every item against the same limits as
				// the store, so this is a store that disagrees: say that
				// the other items went in.
				return fmt.Errorf("%w: the store refused items[%d] (%s) after enqueueing the others", rpc.ErrInternal, i, r.Err)
			}
		}
		resp, err := res.NewResp()
		if err != nil {
			return err
		}
		ids, err := resp.NewIds(int32(n))
		if err != nil {
			return err
		}
		for i := range out {
			if err := ids.Set(i, out[i].ID[:]); err != nil {
				return err
			}
		}
		return nil
	})
}

// Poll implements qbschema.Queue_Server: a long poll through the node's
// dispatcher, with numItems, the lease and the wait clamped to the node's
// limits (see the package doc).
func (q *queueServer) Poll(ctx context.Context, call qbschema.Queue_poll) error {
	call.Go()
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return q.call(rpc.OpPoll, res.Message(), func() error {
		req, err := call.Args().Req()
		if err != nil {
			return invalid("req: %v", err)
		}
		lease, err := q.leaseFor(req.LeaseValiditySecs())
		if err != nil {
			return err
		}
		n := min(max(int64(req.NumItems()), 1), int64(q.limits.MaxBatch))
		wait := secs(req.TimeoutSecs())
		if wait == 0 || wait > q.limits.MaxWait {
			// Queueber waits for an item without end when timeoutSecs
			// is 0; the server may return sooner, and a leaseq node
			// parks no poll longer than --max-wait.
			wait = q.limits.MaxWait
		}
		pr, err := q.conn.Poll(ctx, res.Message(), storage.PollParams{Queue: q.queue, Max: int(n), Lease: lease}, wait)
		if err != nil {
			return err
		}
		resp, err := res.NewResp()
		if err != nil {
			return err
		}
		l, err := resp.NewItems(int32(len(pr.Items)))
		if err != nil {
			return err
		}
		if len(pr.Items) == 0 {
			return nil // no lease: there is nothing to remove or extend
		}
		if err := resp.SetLease(pr.Lease[:]); err != nil {
			return err
		}
		for i := range pr.Items {
			w := l.At(i)
			if err := w.SetContents(pr.Items[i].Payload); err != nil {
				return err
			}
			if err := w.SetId(pr.Items[i].ID[:]); err != nil {
				return err
			}
		}
		return nil
	})
}

// Remove implements qbschema.Queue_Server: an ack of one id under its
// lease. removed is false when the item is not in the queue any more, is
// held under another lease, or the lease has expired.
func (q *queueServer) Remove(ctx context.Context, call qbschema.Queue_remove) error {
	call.Go()
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return q.call(rpc.OpAck, res.Message(), func() error {
		req, err := call.Args().Req()
		if err != nil {
			return invalid("req: %v", err)
		}
		lease, err := leaseArg(req.Lease)
		if err != nil {
			return err
		}
		ib, err := req.Id()
		if err != nil {
			return invalid("id: %v", err)
		}
		var id storage.ItemID
		if len(ib) != len(id) {
			return invalid("id must be %d bytes, got %d", len(id), len(ib))
		}
		copy(id[:], ib)
		codes, err := q.srv.Ack(ctx, storage.AckParams{Queue: q.queue, Lease: lease, IDs: []storage.ItemID{id}})
		if err != nil {
			return err
		}
		if len(codes) != 1 {
			return fmt.Errorf("%w: store returned %d codes for 1 id", rpc.ErrInternal, len(codes))
		}
		resp, err := res.NewResp()
		if err != nil {
			return err
		}
		resp.SetRemoved(codes[0] == storage.CodeOK)
		return nil
	})
}

// Extend implements qbschema.Queue_Server: the lease's expiry becomes now +
// leaseValiditySecs (clamped to the node's lease limits). extended is
// false when the lease is not live any more (expired, or every item of it
// removed) or belongs to another queue.
func (q *queueServer) Extend(ctx context.Context, call qbschema.Queue_extend) error {
	call.Go()
	res, err := call.AllocResults()
	if err != nil {
		return err
	}
	return q.call(rpc.OpExtend, res.Message(), func() error {
		req, err := call.Args().Req()
		if err != nil {
			return invalid("req: %v", err)
		}
		lease, err := leaseArg(req.Lease)
		if err != nil {
			return err
		}
		d, err := q.leaseFor(req.LeaseValiditySecs())
		if err != nil {
			return err
		}
		_, err = q.srv.ExtendLease(ctx, storage.ExtendParams{Queue: q.queue, Lease: lease, Duration: d})
		extended := err == nil
		if errors.Is(err, storage.ErrLeaseExpired) || errors.Is(err, storage.ErrLeaseMismatch) || errors.Is(err, storage.ErrNotFound) {
			err = nil
		}
		if err != nil {
			return err
		}
		resp, err := res.NewResp()
		if err != nil {
			return err
		}
		resp.SetExtended(extended)
		return nil
	})
}
