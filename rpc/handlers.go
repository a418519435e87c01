package rpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"capnproto.org/go/capnp/v3"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// queueServer implements schema.Queue_Server for one connection.
//
// Each method X is a thin go-capnp wrapper around a body x(ctx, args, res)
// over the generated Params and Results structs, which the lean engine
// (lean.go) calls too, so the logic of a method lives once.
//
// Every handler calls call.Go() first: storage calls wait for fsync and polls
// may park, and neither should hold up the connection's other calls. So
// calls on one connection that the client did not await in turn run
// concurrently, in no defined order.
//
// Arguments alias the incoming message and are valid only until the handler
// returns; anything kept longer (the Consumer capability) is AddRef'd, and
// payloads handed to the store are copied.
type queueServer struct {
	s       *Server
	remote  string
	gate    *replyGate      // nil: answers unbounded (or not over a connection)
	connCtx context.Context // done when the connection ends (nil: not over a connection)
	// framesCounted: the connection counts every frame it queues in gate
	// (the lean engine's sendFrame), answers among them.
	framesCounted bool
	// answers gives back the items of poll answers never written (the
	// go-capnp engine's, unwritten.go; nil: the lean engine, which does
	// it itself).
	answers *unwrittenAnswers
}

// statusResults is what every generated *_Results has.
type statusResults interface {
	NewStatus() (schema.Status, error)
	Message() *capnp.Message
}

// fail answers a call with a request-level error. Unexpected errors (not in
// the table) are logged, since they mean a broken store or a bug.
func (q *queueServer) fail(op Op, res statusResults, err error) error {
	err = q.s.clientError(op, q.remote, err)
	st, e := res.NewStatus()
	if e != nil {
		return e
	}
	return setStatus(st, err)
}

// call runs one handler body with accounting: metrics, the in-flight count
// Stop drains, and the shutdown refusal.
func (q *queueServer) call(op Op, res statusResults, allocErr error, body func() error) error {
	return q.begin(op).finish(res, allocErr, body)
}

// callTicket is a call begun (counted in the calls Stop drains, its
// latency timed) whose body finish runs, maybe later: a long poll the lean
// engine parks without a goroutine.
type callTicket struct {
	q     *queueServer
	op    Op
	start time.Time
	ok    bool // false: the server is stopping
}

func (q *queueServer) begin(op Op) callTicket {
	return callTicket{q: q, op: op, start: q.s.cfg.Clock.Now(), ok: q.s.begin()}
}

// finish runs body (unless allocErr, or the server was stopping at begin),
// writes a failure into res as a Status, and ends the call.
func (t callTicket) finish(res statusResults, allocErr error, body func() error) error {
	q, op, ok := t.q, t.op, t.ok
	failed := true
	defer func() { q.s.end(op, t.start, failed) }()
	if allocErr != nil {
		return allocErr
	}
	if !ok {
		return q.fail(op, res, fmt.Errorf("%w: server shutting down", ErrUnavailable))
	}
	listing := op == OpPeek || op == OpDeadList
	if listing {
		// Listing answers can be large: a client that does not read its
		// answers gets no new ones built.
		if err := q.gate.acquire(); err != nil {
			return q.fail(op, res, err)
		}
		defer q.gate.release()
	}
	err := body()
	if err != nil {
		return q.fail(op, res, err)
	}
	failed = false
	if !q.framesCounted || listing {
		// Counted until written (replyGate). A listing answer is counted
		// here even where the connection counts its frames when it queues
		// them: between the release of its building slot and that, the
		// answer was counted nowhere, and calls run on goroutines of
		// their own (a store that waits) each built one in that gap, past
		// the budget. Found by CI (session 73). add counts a message once.
		q.gate.add(res.Message())
	}
	return nil
}

func (q *queueServer) queueName(get func() (string, error)) (string, error) {
	name, err := get()
	if err != nil {
		return "", fmt.Errorf("%w: queue: %v", storage.ErrInvalidArgument, err)
	}
	if err := q.s.limits.ValidateQueueName(name); err != nil {
		return "", err
	}
	return name, nil
}

func (q *queueServer) lease(get func() ([]byte, error)) (storage.LeaseID, error) {
	b, err := get()
	if err != nil {
		return storage.LeaseID{}, fmt.Errorf("%w: lease: %v", storage.ErrInvalidArgument, err)
	}
	return leaseID(b)
}

// after decodes an optional page cursor: empty means from the start.
func after(get func() ([]byte, error)) (storage.ItemID, error) {
	b, err := get()
	if err != nil {
		return storage.ItemID{}, fmt.Errorf("%w: after: %v", storage.ErrInvalidArgument, err)
	}
	if len(b) == 0 {
		return storage.ItemID{}, nil
	}
	return itemID(b)
}

// DefaultPageLimit is used by peek, deadList, redrive and purgeDead when the
// request's limit is 0 (the node's MaxBatch when that is lower).
const DefaultPageLimit = 100

// pageLimit is a request's limit with 0 meaning DefaultPageLimit, or
// MaxBatch when the node's is lower (found by review: a node run with
// --max-batch under 100 refused every page that named no limit); the
// store checks the range (storage's Params.Validate).
func (s *Server) pageLimit(n uint32) int {
	if n == 0 {
		return min(DefaultPageLimit, s.limits.MaxBatch)
	}
	return int(n)
}

// pageItems is a peek or dead-letter page's limit cut to what fits in one
// reply (replyItems). A limit over MaxBatch is left for the store to
// refuse.
func (s *Server) pageItems(limit int) int {
	if limit > s.limits.MaxBatch {
		return limit
	}
	return min(limit, s.replyItems)
}

func (q *queueServer) leaseDur(ms uint64, what string, allowZero bool) (time.Duration, error) {
	d := durMs(ms)
	if d == 0 && !allowZero {
		return 0, fmt.Errorf("%w: %s must be given", storage.ErrInvalidArgument, what)
	}
	if err := q.s.limits.ValidateLease(d); err != nil {
		return 0, err
	}
	return d, nil
}

// Enqueue implements schema.Queue_Server.
func (q *queueServer) Enqueue(ctx context.Context, call schema.Queue_enqueue) error {
	call.Go()
	res, err := call.AllocResults()
	return q.call(OpEnqueue, res, err, func() error { return q.enqueue(ctx, call.Args(), res) })
}

// enqueue is Enqueue's body, shared by both engines (lean.go).
func (q *queueServer) enqueue(ctx context.Context, args schema.Queue_enqueue_Params, res schema.Queue_enqueue_Results) error {
	e, err := q.enqueueArgs(args)
	if err != nil {
		return err
	}
	defer e.release()
	if len(e.items) > 0 {
		out, err := q.s.Enqueue(ctx, storage.EnqueueParams{Queue: e.queue, Items: e.items})
		if err != nil {
			return err
		}
		e.merge(out)
	}
	return writeEnqueue(res, e.results)
}

// enqueueCall is one enqueue call's items, checked: items (the valid
// ones) go to the store, the others are answered as invalid. Calls come
// from enqueueCalls and go back with release once answered, so a call's
// three lists are reused instead of allocated per call
// (BenchmarkDecodeEnqueue).
type enqueueCall struct {
	queue   string
	results []storage.EnqueueResult // one per item of the call
	items   []storage.EnqueueItem
	index   []int // items[k] is the call's item index[k]
}

var enqueueCalls = sync.Pool{New: func() any { return new(enqueueCall) }}

// maxPooledItems bounds the lists a pooled enqueueCall keeps, so that one
// call of a huge batch does not keep its lists for good.
const maxPooledItems = 1024

// newEnqueueCall returns an enqueueCall with room for n items.
func newEnqueueCall(queue string, n int) *enqueueCall {
	e := enqueueCalls.Get().(*enqueueCall)
	e.queue = queue
	if cap(e.results) < n {
		e.results = make([]storage.EnqueueResult, n)
		e.items = make([]storage.EnqueueItem, 0, n)
		e.index = make([]int, 0, n)
	}
	e.results = e.results[:n]
	return e
}

// release returns e to the pool. REQUIRES: e's answer is written and
// nothing reads e.items or e.results any more (the store keeps no
// reference to a call's items once it answered it).
func (e *enqueueCall) release() {
	if cap(e.results) > maxPooledItems {
		*e = enqueueCall{}
	} else {
		// Drop the references into the call's message and the answer's
		// error strings; a zeroed result is also what a new call expects.
		clear(e.results)
		clear(e.items)
		e.results, e.items, e.index = e.results[:0], e.items[:0], e.index[:0]
		e.queue = ""
	}
	enqueueCalls.Put(e)
}

// enqueueArgs reads and checks an enqueue call's arguments.
func (q *queueServer) enqueueArgs(args schema.Queue_enqueue_Params) (*enqueueCall, error) {
	queue, err := q.queueName(args.Queue)
	if err != nil {
		return nil, err
	}
	in, err := args.Items()
	if err != nil {
		return nil, fmt.Errorf("%w: items: %v", storage.ErrInvalidArgument, err)
	}
	n := in.Len()
	if err := q.s.limits.ValidateBatch(n); err != nil {
		return nil, err
	}
	e := newEnqueueCall(queue, n)
	for i := 0; i < n; i++ {
		it, reason := q.enqueueItem(in.At(i))
		if reason != "" {
			e.results[i] = storage.EnqueueResult{Code: storage.CodeInvalid, Err: reason}
			continue
		}
		e.items = append(e.items, it)
		e.index = append(e.index, i)
	}
	return e, nil
}

// merge puts the store's results for e.items in their places.
func (e *enqueueCall) merge(out []storage.EnqueueResult) {
	for k, r := range out {
		e.results[e.index[k]] = r
	}
}

// writeEnqueue writes an enqueue's results.
func writeEnqueue(res schema.Queue_enqueue_Results, results []storage.EnqueueResult) error {
	l, err := res.NewResults(int32(len(results)))
	if err != nil {
		return err
	}
	// A new list is zeroed: code ok and duplicate false need no write.
	for i := range results {
		w := l.At(i)
		if results[i].Code != storage.CodeOK {
			w.SetCode(wireCode(results[i].Code))
		}
		if results[i].Duplicate {
			w.SetDuplicate(true)
		}
		if results[i].Code == storage.CodeOK {
			if err := w.SetId(results[i].ID[:]); err != nil {
				return err
			}
		}
		if results[i].Err != "" {
			if err := w.SetDetail(results[i].Err); err != nil {
				return err
			}
		}
	}
	return nil
}

// enqueueItem checks one item against the limits; a non-empty reason
// rejects only that item.
func (q *queueServer) enqueueItem(w schema.EnqueueItem) (storage.EnqueueItem, string) {
	p, err := w.Payload()
	if err != nil {
		return storage.EnqueueItem{}, fmt.Sprintf("payload: %v", err)
	}
	var key string
	if w.HasDedupKey() { // most items have none: skip the pointer's decoding
		if key, err = w.DedupKey(); err != nil {
			return storage.EnqueueItem{}, fmt.Sprintf("dedup key: %v", err)
		}
	}
	it := storage.EnqueueItem{
		Payload:     p,
		Delay:       durMs(w.DelayMs()),
		Priority:    w.Priority(),
		DedupKey:    key,
		MaxAttempts: w.MaxAttempts(),
	}
	if err := q.s.limits.ValidateItem(it); err != nil {
		var ie *storage.ItemError
		if errors.As(err, &ie) {
			return storage.EnqueueItem{}, ie.Detail
		}
		return storage.EnqueueItem{}, err.Error()
	}
	// p points into the call's message, which lives until the call
	// returns; stores keep no reference to payloads after Enqueue.
	return it, ""
}

// Poll implements schema.Queue_Server.
func (q *queueServer) Poll(ctx context.Context, call schema.Queue_poll) error {
	call.Go()
	res, err := call.AllocResults()
	return q.call(OpPoll, res, err, func() error { return q.poll(ctx, call.Args(), res) })
}

// poll is Poll's body, shared by both engines (lean.go).
func (q *queueServer) poll(ctx context.Context, args schema.Queue_poll_Params, res schema.Queue_poll_Results) error {
	p, wait, err := q.pollArgs(args)
	if err != nil {
		return err
	}
	if q.gate.over() {
		// The reply budget is spent: a claim would only be given back
		// (trimPoll), as on the lean engine (leanConn.longPoll).
		return writePoll(res, storage.PollResult{})
	}
	pr, err := q.s.disp.Poll(ctx, p, wait)
	if err != nil {
		return err
	}
	q.s.trimPoll(q.gate, p.Queue, &pr, q.s.giveBack)
	if err := writePoll(res, pr); err != nil {
		return err
	}
	q.answers.pollHook(q.s, res.Message(), p.Queue, pr)
	return nil
}

// pollArgs reads and checks a poll's arguments.
func (q *queueServer) pollArgs(args schema.Queue_poll_Params) (storage.PollParams, time.Duration, error) {
	queue, err := q.queueName(args.Queue)
	if err != nil {
		return storage.PollParams{}, 0, err
	}
	p := storage.PollParams{Queue: queue, Max: int(args.Max()), Lease: durMs(args.LeaseMs())}
	wait := durMs(args.WaitMs())
	if err := q.s.checkPoll(p, wait); err != nil {
		return p, wait, err
	}
	p.Max = min(p.Max, q.s.replyItems) // what fits in one reply (replyItems)
	return p, wait, nil
}

func writePoll(res schema.Queue_poll_Results, pr storage.PollResult) error {
	if len(pr.Items) == 0 {
		return nil
	}
	if err := res.SetLease(pr.Lease[:]); err != nil {
		return err
	}
	res.SetExpiresAt(toMs(pr.ExpiresAt))
	l, err := res.NewItems(int32(len(pr.Items)))
	if err != nil {
		return err
	}
	return writeItems(l, pr.Items)
}

// settleArgs are what ack and nack share.
type settleArgs interface {
	Queue() (string, error)
	Lease() ([]byte, error)
	Ids() (capnp.DataList, error)
}

// parseSettle validates the queue, lease and ids of an ack or nack, in that
// order, so the first bad argument is the one reported.
func (q *queueServer) parseSettle(args settleArgs) (string, storage.LeaseID, []storage.ItemID, error) {
	queue, err := q.queueName(args.Queue)
	if err != nil {
		return "", storage.LeaseID{}, nil, err
	}
	lease, err := q.lease(args.Lease)
	if err != nil {
		return "", storage.LeaseID{}, nil, err
	}
	idl, err := args.Ids()
	if err != nil {
		return "", storage.LeaseID{}, nil, fmt.Errorf("%w: ids: %v", storage.ErrInvalidArgument, err)
	}
	ids, err := readIDs(idl, q.s.limits)
	if err != nil {
		return "", storage.LeaseID{}, nil, err
	}
	return queue, lease, ids, nil
}

// setCodes allocates a result's codes list and fills it, one per id.
func setCodes(newCodes func(int32) (schema.ResultCode_List, error), codes []storage.Code) error {
	l, err := newCodes(int32(len(codes)))
	if err != nil {
		return err
	}
	writeCodes(l, codes)
	return nil
}

// Ack implements schema.Queue_Server.
func (q *queueServer) Ack(ctx context.Context, call schema.Queue_ack) error {
	call.Go()
	res, err := call.AllocResults()
	return q.call(OpAck, res, err, func() error { return q.ack(ctx, call.Args(), res) })
}

// ack is Ack's body, shared by both engines (lean.go).
func (q *queueServer) ack(ctx context.Context, args schema.Queue_ack_Params, res schema.Queue_ack_Results) error {
	queue, lease, ids, err := q.parseSettle(args)
	if err != nil {
		return err
	}
	codes, err := q.s.Ack(ctx, storage.AckParams{Queue: queue, Lease: lease, IDs: ids})
	if err != nil {
		return err
	}
	return setCodes(res.NewCodes, codes)
}

// Nack implements schema.Queue_Server.
func (q *queueServer) Nack(ctx context.Context, call schema.Queue_nack) error {
	call.Go()
	res, err := call.AllocResults()
	return q.call(OpNack, res, err, func() error { return q.nack(ctx, call.Args(), res) })
}

// nack is Nack's body, shared by both engines (lean.go).
func (q *queueServer) nack(ctx context.Context, args schema.Queue_nack_Params, res schema.Queue_nack_Results) error {
	queue, lease, ids, err := q.parseSettle(args)
	if err != nil {
		return err
	}
	var delay *time.Duration
	if ms := args.DelayMs(); ms >= 0 {
		d := durMs(uint64(ms))
		if err := q.s.limits.ValidateDelay(d); err != nil {
			return err
		}
		delay = &d
	}
	reason, err := args.Reason()
	if err != nil {
		return fmt.Errorf("%w: reason: %v", storage.ErrInvalidArgument, err)
	}
	reason = q.s.limits.TruncateReason(reason)
	codes, err := q.s.cfg.Store.Nack(ctx, storage.NackParams{Queue: queue, Lease: lease, IDs: ids, Delay: delay, Reason: reason, Now: q.s.cfg.Clock.Now(),
		Undelivered: args.Undelivered()})
	if err != nil {
		return err
	}
	q.s.tracker.settled(lease, codes)
	// Backoff can be ~0 and an explicit 0 is "ready now": let one
	// waiter look. Positive delays are the sweeper's to announce.
	if delay == nil || *delay == 0 {
		for _, c := range codes {
			if c == storage.CodeOK {
				q.s.disp.Notify(queue)
				break
			}
		}
	}
	return setCodes(res.NewCodes, codes)
}

// Extend implements schema.Queue_Server.
func (q *queueServer) Extend(ctx context.Context, call schema.Queue_extend) error {
	call.Go()
	res, err := call.AllocResults()
	return q.call(OpExtend, res, err, func() error { return q.extend(ctx, call.Args(), res) })
}

// extend is Extend's body, shared by both engines (lean.go).
func (q *queueServer) extend(ctx context.Context, args schema.Queue_extend_Params, res schema.Queue_extend_Results) error {
	queue, err := q.queueName(args.Queue)
	if err != nil {
		return err
	}
	lease, err := q.lease(args.Lease)
	if err != nil {
		return err
	}
	d, err := q.leaseDur(args.LeaseMs(), "leaseMs", false)
	if err != nil {
		return err
	}
	exp, err := q.s.ExtendLease(ctx, storage.ExtendParams{Queue: queue, Lease: lease, Duration: d})
	if err != nil {
		return err
	}
	res.SetExpiresAt(toMs(exp))
	return nil
}

// Stats implements schema.Queue_Server.
func (q *queueServer) Stats(ctx context.Context, call schema.Queue_stats) error {
	call.Go()
	res, err := call.AllocResults()
	return q.call(OpStats, res, err, func() error { return q.stats(ctx, call.Args(), res) })
}

// stats is Stats's body, shared by both engines (lean.go).
func (q *queueServer) stats(ctx context.Context, args schema.Queue_stats_Params, res schema.Queue_stats_Results) error {
	name, err := args.Queue()
	if err != nil {
		return fmt.Errorf("%w: queue: %v", storage.ErrInvalidArgument, err)
	}
	if name != "" {
		if err := q.s.limits.ValidateQueueName(name); err != nil {
			return err
		}
	}
	st, err := q.s.cfg.Store.Stats(ctx, storage.StatsParams{Queue: name, Now: q.s.cfg.Clock.Now()})
	if err != nil {
		return err
	}
	l, err := res.NewStats(int32(len(st)))
	if err != nil {
		return err
	}
	for i := range st {
		if err := writeStats(l.At(i), &st[i]); err != nil {
			return err
		}
	}
	return nil
}

// Queues implements schema.Queue_Server.
func (q *queueServer) Queues(ctx context.Context, call schema.Queue_queues) error {
	call.Go()
	res, err := call.AllocResults()
	return q.call(OpQueues, res, err, func() error { return q.queues(ctx, call.Args(), res) })
}

// queues is Queues's body, shared by both engines (lean.go).
func (q *queueServer) queues(ctx context.Context, _ schema.Queue_queues_Params, res schema.Queue_queues_Results) error {
	names, err := q.s.cfg.Store.Queues(ctx)
	if err != nil {
		return err
	}
	l, err := res.NewQueues(int32(len(names)))
	if err != nil {
		return err
	}
	for i, n := range names {
		if err := l.Set(i, n); err != nil {
			return err
		}
	}
	return nil
}

// NodeInfo implements schema.Queue_Server.
func (q *queueServer) NodeInfo(ctx context.Context, call schema.Queue_nodeInfo) error {
	res, err := call.AllocResults()
	return q.call(OpNodeInfo, res, err, func() error { return q.nodeInfo(ctx, call.Args(), res) })
}

// nodeInfo is NodeInfo's body, shared by both engines (lean.go).
func (q *queueServer) nodeInfo(ctx context.Context, _ schema.Queue_nodeInfo_Params, res schema.Queue_nodeInfo_Results) error {
	info, err := res.NewInfo()
	if err != nil {
		return err
	}
	ni := q.s.cfg.Info
	info.SetMaxBatch(uint32(q.s.limits.MaxBatch))
	info.SetMaxPayload(uint32(q.s.limits.MaxPayload))
	// Whole milliseconds within the limits: the shortest lease rounded
	// up, the longest lease and delay down.
	info.SetMinLeaseMs(uint64((q.s.limits.MinLease + time.Millisecond - 1) / time.Millisecond))
	info.SetMaxLeaseMs(msDur(q.s.limits.MaxLease))
	info.SetMaxDelayMs(msDur(q.s.limits.MaxDelay))
	if err := info.SetVersion(ni.Version); err != nil {
		return err
	}
	if err := info.SetBackend(ni.Backend); err != nil {
		return err
	}
	return info.SetSync(ni.Sync)
}

// Peek implements schema.Queue_Server.
func (q *queueServer) Peek(ctx context.Context, call schema.Queue_peek) error {
	call.Go()
	res, err := call.AllocResults()
	return q.call(OpPeek, res, err, func() error { return q.peek(ctx, call.Args(), res) })
}

// peek is Peek's body, shared by both engines (lean.go).
func (q *queueServer) peek(ctx context.Context, args schema.Queue_peek_Params, res schema.Queue_peek_Results) error {
	queue, err := q.queueName(args.Queue)
	if err != nil {
		return err
	}
	aft, err := after(args.After)
	if err != nil {
		return err
	}
	limit := q.s.pageItems(q.s.pageLimit(args.Limit()))
	items, err := q.s.cfg.Store.Peek(ctx, storage.PeekParams{Queue: queue, Inflight: args.Inflight(), After: aft, Limit: limit, Now: q.s.cfg.Clock.Now()})
	if err != nil {
		return err
	}
	items = items[:fitReply(len(items), func(i int) int64 { return storedItemBytes(&items[i]) }, q.s.cfg.maxReplyBytes)]
	l, err := res.NewItems(int32(len(items)))
	if err != nil {
		return err
	}
	return writeItems(l, items)
}

// Purge implements schema.Queue_Server.
func (q *queueServer) Purge(ctx context.Context, call schema.Queue_purge) error {
	call.Go()
	res, err := call.AllocResults()
	return q.call(OpPurge, res, err, func() error { return q.purge(ctx, call.Args(), res) })
}

// purge is Purge's body, shared by both engines (lean.go).
func (q *queueServer) purge(ctx context.Context, args schema.Queue_purge_Params, res schema.Queue_purge_Results) error {
	queue, err := q.queueName(args.Queue)
	if err != nil {
		return err
	}
	n, err := q.s.cfg.Store.Purge(ctx, storage.PurgeParams{Queue: queue, Now: q.s.cfg.Clock.Now()})
	if err != nil {
		return err
	}
	res.SetPurged(uint64(n))
	return nil
}

// DeleteQueue implements schema.Queue_Server.
func (q *queueServer) DeleteQueue(ctx context.Context, call schema.Queue_deleteQueue) error {
	call.Go()
	res, err := call.AllocResults()
	return q.call(OpDeleteQueue, res, err, func() error { return q.deleteQueue(ctx, call.Args(), res) })
}

// deleteQueue is DeleteQueue's body, shared by both engines (lean.go).
func (q *queueServer) deleteQueue(ctx context.Context, args schema.Queue_deleteQueue_Params, res schema.Queue_deleteQueue_Results) error {
	queue, err := q.queueName(args.Queue)
	if err != nil {
		return err
	}
	n, err := q.s.cfg.Store.DeleteQueue(ctx, storage.DeleteQueueParams{Queue: queue, Force: args.Force(), Now: q.s.cfg.Clock.Now()})
	if err != nil {
		return err
	}
	res.SetDeleted(uint64(n))
	return nil
}

// DeadList implements schema.Queue_Server.
func (q *queueServer) DeadList(ctx context.Context, call schema.Queue_deadList) error {
	call.Go()
	res, err := call.AllocResults()
	return q.call(OpDeadList, res, err, func() error { return q.deadList(ctx, call.Args(), res) })
}

// deadList is DeadList's body, shared by both engines (lean.go).
func (q *queueServer) deadList(ctx context.Context, args schema.Queue_deadList_Params, res schema.Queue_deadList_Results) error {
	queue, err := q.queueName(args.Queue)
	if err != nil {
		return err
	}
	aft, err := after(args.After)
	if err != nil {
		return err
	}
	limit := q.s.pageItems(q.s.pageLimit(args.Limit()))
	dead, err := q.s.cfg.Store.DeadList(ctx, storage.DeadListParams{Queue: queue, After: aft, Limit: limit})
	if err != nil {
		return err
	}
	dead = dead[:fitReply(len(dead), func(i int) int64 { return storedItemBytes(&dead[i].Item) + int64(len(dead[i].Reason)) }, q.s.cfg.maxReplyBytes)]
	l, err := res.NewItems(int32(len(dead)))
	if err != nil {
		return err
	}
	for i := range dead {
		w := l.At(i)
		it, err := w.NewItem()
		if err != nil {
			return err
		}
		if err := writeItem(it, &dead[i].Item); err != nil {
			return err
		}
		if err := w.SetReason(dead[i].Reason); err != nil {
			return err
		}
		w.SetDeadAt(toMs(dead[i].DeadAt))
	}
	return nil
}

// deadArgs and deadResults are what redrive and purgeDead share.
type deadArgs interface {
	Queue() (string, error)
	Ids() (capnp.DataList, error)
	Limit() uint32
}

type deadResults interface {
	statusResults
	NewCodes(int32) (schema.ResultCode_List, error)
	SetMoved(uint64)
}

// deadOp runs redrive or purgeDead: the listed ids (one code each), or, with
// no ids, up to limit dead items in id order.
func (q *queueServer) deadOp(ctx context.Context, args deadArgs, res deadResults,
	run func(context.Context, storage.RedriveParams) (storage.RedriveResult, error), notify bool) error {
	queue, err := q.queueName(args.Queue)
	if err != nil {
		return err
	}
	l, err := args.Ids()
	if err != nil {
		return fmt.Errorf("%w: ids: %v", storage.ErrInvalidArgument, err)
	}
	p := storage.RedriveParams{Queue: queue, Now: q.s.cfg.Clock.Now()}
	if l.Len() > 0 {
		if p.IDs, err = readIDs(l, q.s.limits); err != nil {
			return err
		}
		p.Limit = len(p.IDs)
	} else {
		p.Limit = q.s.pageLimit(args.Limit())
	}
	rr, err := run(ctx, p)
	if err != nil {
		return err
	}
	if notify && rr.Moved > 0 {
		q.s.disp.Notify(queue)
	}
	res.SetMoved(uint64(rr.Moved))
	if rr.Codes == nil {
		return nil
	}
	return setCodes(res.NewCodes, rr.Codes)
}

// Redrive implements schema.Queue_Server.
func (q *queueServer) Redrive(ctx context.Context, call schema.Queue_redrive) error {
	call.Go()
	res, err := call.AllocResults()
	return q.call(OpRedrive, res, err, func() error { return q.redrive(ctx, call.Args(), res) })
}

// redrive is Redrive's body, shared by both engines (lean.go).
func (q *queueServer) redrive(ctx context.Context, args schema.Queue_redrive_Params, res schema.Queue_redrive_Results) error {
	return q.deadOp(ctx, args, res, q.s.cfg.Store.Redrive, true)
}

// PurgeDead implements schema.Queue_Server.
func (q *queueServer) PurgeDead(ctx context.Context, call schema.Queue_purgeDead) error {
	call.Go()
	res, err := call.AllocResults()
	return q.call(OpPurgeDead, res, err, func() error { return q.purgeDead(ctx, call.Args(), res) })
}

// purgeDead is PurgeDead's body, shared by both engines (lean.go).
func (q *queueServer) purgeDead(ctx context.Context, args schema.Queue_purgeDead_Params, res schema.Queue_purgeDead_Results) error {
	return q.deadOp(ctx, args, res, q.s.cfg.Store.PurgeDead, false)
}

// GetConfig implements schema.Queue_Server.
func (q *queueServer) GetConfig(ctx context.Context, call schema.Queue_getConfig) error {
	call.Go()
	res, err := call.AllocResults()
	return q.call(OpGetConfig, res, err, func() error { return q.getConfig(ctx, call.Args(), res) })
}

// getConfig is GetConfig's body, shared by both engines (lean.go).
func (q *queueServer) getConfig(ctx context.Context, args schema.Queue_getConfig_Params, res schema.Queue_getConfig_Results) error {
	queue, err := q.queueName(args.Queue)
	if err != nil {
		return err
	}
	c, err := q.s.cfg.Store.QueueConfig(ctx, queue)
	if err != nil {
		return err
	}
	w, err := res.NewConfig()
	if err != nil {
		return err
	}
	writeConfig(w, c)
	return nil
}

// SetConfig implements schema.Queue_Server.
func (q *queueServer) SetConfig(ctx context.Context, call schema.Queue_setConfig) error {
	call.Go()
	res, err := call.AllocResults()
	return q.call(OpSetConfig, res, err, func() error { return q.setConfig(ctx, call.Args(), res) })
}

// setConfig is SetConfig's body, shared by both engines (lean.go).
func (q *queueServer) setConfig(ctx context.Context, args schema.Queue_setConfig_Params, res schema.Queue_setConfig_Results) error {
	queue, err := q.queueName(args.Queue)
	if err != nil {
		return err
	}
	w, err := args.Config()
	if err != nil {
		return fmt.Errorf("%w: config: %v", storage.ErrInvalidArgument, err)
	}
	c := readConfig(w)
	if err := q.s.limits.ValidateQueueConfig(c); err != nil {
		return err
	}
	return q.s.cfg.Store.SetQueueConfig(ctx, queue, c)
}
