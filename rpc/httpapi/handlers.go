package httpapi

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/leaseq/leaseq/storage"
)

// openAPI is the OpenAPI 3 description of the routes (TestOpenAPI_MatchesRoutes
// keeps it in step with apiRoutes).
//
//go:embed openapi.json
var openAPI []byte

// apiRoutes is the API: every route, its name (logs and metrics), the
// query parameters it reads (any other is refused), and its handler.
func (s *Server) apiRoutes() []Route {
	const q = "/v1/queues/{queue}"
	return []Route{
		{Method: http.MethodPost, Path: q + "/items", op: "enqueue", query: []string{"delay_ms", "priority", "dedup_key", "max_attempts"}, h: s.enqueue},
		{Method: http.MethodPost, Path: q + "/poll", op: "poll", h: s.poll},
		{Method: http.MethodPost, Path: q + "/ack", op: "ack", h: s.ack},
		{Method: http.MethodPost, Path: q + "/nack", op: "nack", h: s.nack},
		{Method: http.MethodPost, Path: q + "/extend", op: "extend", h: s.extend},
		{Method: http.MethodGet, Path: "/v1/queues", op: "queues", h: s.queues},
		{Method: http.MethodGet, Path: q, op: "stats", h: s.stats},
		{Method: http.MethodDelete, Path: q, op: "delete_queue", query: []string{"force"}, h: s.deleteQueue},
		{Method: http.MethodPut, Path: q + "/config", op: "set_config", h: s.setConfig},
		{Method: http.MethodGet, Path: q + "/items", op: "peek", query: []string{"state", "after", "limit"}, h: s.peek},
		{Method: http.MethodDelete, Path: q + "/items", op: "purge", h: s.purge},
		{Method: http.MethodGet, Path: q + "/dlq", op: "dead_list", query: []string{"after", "limit"}, h: s.deadList},
		{Method: http.MethodPost, Path: q + "/dlq/redrive", op: "redrive", h: s.redrive},
		{Method: http.MethodDelete, Path: q + "/dlq", op: "purge_dead", h: s.purgeDead},
		{Method: http.MethodGet, Path: "/v1/openapi.json", op: "openapi", h: func(*call) (any, error) { return json.RawMessage(openAPI), nil }},
	}
}

// checkQuery refuses query parameters the route does not read, so a
// misspelt one fails loudly, and any given twice (which of the two would
// count is not for the node to guess).
func checkQuery(c *call, allowed []string) error {
	for k, vs := range c.r.URL.Query() {
		if len(vs) > 1 && slices.Contains(allowed, k) {
			return fmt.Errorf("%w: query parameter %q given %d times", storage.ErrInvalidArgument, k, len(vs))
		}
		if !slices.Contains(allowed, k) {
			if len(allowed) == 0 {
				return fmt.Errorf("%w: unknown query parameter %q (this route takes none)", storage.ErrInvalidArgument, k)
			}
			return fmt.Errorf("%w: unknown query parameter %q (want %s)", storage.ErrInvalidArgument, k, strings.Join(allowed, ", "))
		}
	}
	return nil
}

// queue returns the route's {queue}, checked.
func (s *Server) queue(c *call) (string, error) {
	name := c.r.PathValue("queue")
	if err := s.limits.ValidateQueueName(name); err != nil {
		return "", err
	}
	return name, nil
}

// queryInt parses an optional integer query parameter (def when absent).
func queryInt(c *call, name string, def int64) (int64, error) {
	v := c.r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: query parameter %s=%q: want an integer", storage.ErrInvalidArgument, name, v)
	}
	return n, nil
}

func (s *Server) enqueue(c *call) (any, error) {
	queue, err := s.queue(c)
	if err != nil {
		return nil, err
	}
	mt, err := c.mediaType()
	if err != nil {
		return nil, err
	}
	var in []EnqueueItem
	switch mt {
	case mediaOctet:
		if in, err = c.rawItem(); err != nil {
			return nil, err
		}
	case mediaJSON, "":
		if len(c.r.URL.Query()) > 0 {
			return nil, fmt.Errorf("%w: query parameters set a raw item's options; with a JSON body give them in each item", storage.ErrInvalidArgument)
		}
		body, err := c.readBody(s.cfg.MaxBodyBytes)
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(body)) > 0 && mt == "" {
			return nil, wrongType(mt, mediaJSON, mediaOctet)
		}
		if t := bytes.TrimSpace(body); len(t) == 0 || t[0] != '[' {
			return nil, fmt.Errorf("%w: request body: want a JSON array of items", storage.ErrInvalidArgument)
		}
		if err := decodeStrict(body, &in); err != nil {
			return nil, err
		}
	default:
		return nil, wrongType(mt, mediaJSON, mediaOctet)
	}
	if err := s.limits.ValidateBatch(len(in)); err != nil {
		return nil, err
	}
	results := make([]storage.EnqueueResult, len(in))
	items := make([]storage.EnqueueItem, 0, len(in))
	index := make([]int, 0, len(in)) // items[k] is input index[k]
	for i := range in {
		it, reason := in[i].item(s.limits)
		if reason != "" {
			results[i] = storage.EnqueueResult{Code: storage.CodeInvalid, Err: reason}
			continue
		}
		items = append(items, it)
		index = append(index, i)
	}
	if len(items) > 0 {
		p := storage.EnqueueParams{Queue: queue, Items: items, Now: s.cfg.Clock.Now()}
		out, err := s.disp.Enqueue(c.r.Context(), s.cfg.Store, p)
		if err != nil {
			return nil, err
		}
		if len(out) != len(items) {
			return nil, fmt.Errorf("httpapi: store returned %d results for %d items", len(out), len(items))
		}
		for k, r := range out {
			results[index[k]] = r
		}
	}
	return enqueueResponse(results), nil
}

// rawItem is the one item of an application/octet-stream enqueue: the
// body is the payload, the query parameters its options.
func (c *call) rawItem() ([]EnqueueItem, error) {
	var it EnqueueItem
	var err error
	if it.DelayMs, err = queryInt(c, "delay_ms", 0); err != nil {
		return nil, err
	}
	if it.Priority, err = queryInt(c, "priority", 0); err != nil {
		return nil, err
	}
	if it.MaxAttempts, err = queryInt(c, "max_attempts", 0); err != nil {
		return nil, err
	}
	it.DedupKey = c.r.URL.Query().Get("dedup_key")
	body, err := c.readBody(c.s.cfg.MaxBodyBytes)
	if err != nil {
		return nil, err
	}
	it.raw = body
	if it.raw == nil {
		it.raw = []byte{}
	}
	return []EnqueueItem{it}, nil
}

func (s *Server) poll(c *call) (any, error) {
	queue, err := s.queue(c)
	if err != nil {
		return nil, err
	}
	var req PollRequest
	if err := c.decodeJSON(&req); err != nil {
		return nil, err
	}
	max := int64(1)
	if req.Max != nil {
		max = *req.Max
	}
	p := storage.PollParams{Queue: queue, Max: int(max), Lease: msDur(req.LeaseMs)}
	if err := p.Validate(s.limits); err != nil {
		return nil, err
	}
	wait := msDur(req.WaitMs)
	if err := s.limits.ValidateWait(wait); err != nil {
		return nil, err
	}
	// The wait ends when the client goes away or Stop is called.
	ctx, cancel := context.WithCancel(c.r.Context())
	defer cancel()
	defer context.AfterFunc(s.stopCtx, cancel)()
	pr, err := s.disp.Poll(ctx, p, wait)
	if s.stopCtx.Err() != nil && (err != nil || len(pr.Items) == 0) {
		return nil, errShuttingDown
	}
	if len(pr.Items) > 0 && c.r.Context().Err() != nil {
		// Claimed as the client went away: nobody will read the answer.
		s.giveBack(queue, pr)
		return nil, c.r.Context().Err()
	}
	if err != nil {
		return nil, err
	}
	s.trimPoll(queue, &pr) // an answer too large for one gives back the rest
	out := &pollAnswer{PollResponse: PollResponse{Items: toItems(pr.Items)}}
	if len(pr.Items) > 0 {
		out.Lease, out.ExpiresAt = pr.Lease.String(), fmtTime(pr.ExpiresAt)
		out.giveBack = func() { s.giveBack(queue, pr) }
	}
	return out, nil
}

// pollAnswer is a poll's answer and, when it holds items, how to give
// them back if it cannot be written (Server.wrap): the client then never
// learns of the lease, as over RPC.
type pollAnswer struct {
	PollResponse
	giveBack func()
}

// giveBack returns the items of a poll answer no client will read
// (dispatch.GiveBack), as the RPC server does: one claimed as its client
// went away, or one whose write failed.
func (s *Server) giveBack(queue string, pr storage.PollResult) {
	s.giveBackItems(queue, pr.Lease, pr.Items, "of a poll whose client went away")
}

// giveBackItems gives back items claimed under lease that no client will
// read; why, what they are, goes to the log if the give-back fails.
func (s *Server) giveBackItems(queue string, lease storage.LeaseID, items []storage.Item, why string) {
	ids := make([]storage.ItemID, len(items))
	for i := range items {
		ids[i] = items[i].ID
	}
	if _, err := s.disp.GiveBack(s.cfg.Store, queue, lease, ids); err != nil {
		s.log.Warn("items "+why+" stay leased until the lease ends", "queue", queue, "items", len(ids), "err", err)
	}
}

// parseIDs parses ids of a request body; any malformed id fails the
// request, as in RPC.
func (s *Server) parseIDs(ss []string) ([]storage.ItemID, error) {
	if err := s.limits.ValidateBatch(len(ss)); err != nil {
		return nil, err
	}
	ids := make([]storage.ItemID, len(ss))
	for i, v := range ss {
		var err error
		if ids[i], err = storage.ParseItemID(v); err != nil {
			return nil, fmt.Errorf("ids[%d]: %w", i, err)
		}
	}
	return ids, nil
}

// settle reads the queue, body, lease and ids of ack, nack and extend, in
// that order, so the first bad argument is the one reported.
func (s *Server) settle(c *call) (string, SettleRequest, storage.LeaseID, []storage.ItemID, error) {
	var req SettleRequest
	queue, err := s.queue(c)
	if err != nil {
		return "", req, storage.LeaseID{}, nil, err
	}
	if err := c.decodeJSON(&req); err != nil {
		return "", req, storage.LeaseID{}, nil, err
	}
	lease, err := storage.ParseLeaseID(req.Lease)
	if err != nil {
		return "", req, storage.LeaseID{}, nil, err
	}
	ids, err := s.parseIDs(req.IDs)
	if err != nil {
		return "", req, storage.LeaseID{}, nil, err
	}
	return queue, req, lease, ids, nil
}

// only refuses fields of SettleRequest the route does not read.
func only(req SettleRequest, op string, delay, reason, leaseMs bool) error {
	switch {
	case req.DelayMs != nil && !delay:
		return fmt.Errorf("%w: %s takes no delay_ms", storage.ErrInvalidArgument, op)
	case req.Reason != "" && !reason:
		return fmt.Errorf("%w: %s takes no reason", storage.ErrInvalidArgument, op)
	case req.LeaseMs != 0 && !leaseMs:
		return fmt.Errorf("%w: %s takes no lease_ms", storage.ErrInvalidArgument, op)
	}
	return nil
}

func (s *Server) ack(c *call) (any, error) {
	queue, req, lease, ids, err := s.settle(c)
	if err != nil {
		return nil, err
	}
	if err := only(req, "ack", false, false, false); err != nil {
		return nil, err
	}
	codes, err := s.cfg.Store.Ack(c.r.Context(), storage.AckParams{Queue: queue, Lease: lease, IDs: ids, Now: s.cfg.Clock.Now()})
	if err != nil {
		return nil, err
	}
	if s.cfg.Leases != nil {
		s.cfg.Leases.LeaseSettled(lease, codes)
	}
	return SettleResponse{Results: idResults(ids, codes)}, nil
}

func (s *Server) nack(c *call) (any, error) {
	queue, req, lease, ids, err := s.settle(c)
	if err != nil {
		return nil, err
	}
	if err := only(req, "nack", true, true, false); err != nil {
		return nil, err
	}
	var delay *time.Duration
	if req.DelayMs != nil {
		d := msDur(*req.DelayMs)
		if err := s.limits.ValidateDelay(d); err != nil {
			return nil, err
		}
		delay = &d
	}
	p := storage.NackParams{Queue: queue, Lease: lease, IDs: ids, Delay: delay, Reason: s.limits.TruncateReason(req.Reason), Now: s.cfg.Clock.Now()}
	codes, err := s.cfg.Store.Nack(c.r.Context(), p)
	if err != nil {
		return nil, err
	}
	if s.cfg.Leases != nil {
		s.cfg.Leases.LeaseSettled(lease, codes)
	}
	// Backoff can be ~0 and an explicit 0 is "ready now": let one waiter
	// look. Positive delays are the sweeper's to announce.
	if (delay == nil || *delay == 0) && slices.Contains(codes, storage.CodeOK) {
		s.disp.Notify(queue)
	}
	return SettleResponse{Results: idResults(ids, codes)}, nil
}

func (s *Server) extend(c *call) (any, error) {
	queue, req, lease, ids, err := s.settle(c)
	if err != nil {
		return nil, err
	}
	if err := only(req, "extend", false, false, true); err != nil {
		return nil, err
	}
	if req.LeaseMs == 0 {
		return nil, fmt.Errorf("%w: lease_ms must be given", storage.ErrInvalidArgument)
	}
	d := msDur(req.LeaseMs)
	if err := s.limits.ValidateLease(d); err != nil {
		return nil, err
	}
	exp, err := s.cfg.Store.ExtendLease(c.r.Context(), storage.ExtendParams{Queue: queue, Lease: lease, Duration: d, Now: s.cfg.Clock.Now()})
	if s.cfg.Leases != nil {
		s.cfg.Leases.LeaseExtended(lease, exp, err)
	}
	if len(ids) == 0 {
		if err != nil {
			return nil, err
		}
		return ExtendResponse{ExpiresAt: fmtTime(exp)}, nil
	}
	// With ids, every id gets the lease's outcome: the store extends
	// leases, not items, and does not check that the ids are the lease's.
	code, cerr := storage.ExtendCode(err)
	if cerr != nil {
		return nil, cerr
	}
	codes := make([]storage.Code, len(ids))
	for i := range codes {
		codes[i] = code
	}
	out := ExtendResponse{Results: idResults(ids, codes)}
	if err == nil {
		out.ExpiresAt = fmtTime(exp)
	}
	return out, nil
}

func (s *Server) queues(c *call) (any, error) {
	st, err := s.cfg.Store.Stats(c.r.Context(), storage.StatsParams{Now: s.cfg.Clock.Now()})
	if err != nil {
		return nil, err
	}
	out := QueuesResponse{Queues: make([]QueueStats, len(st))}
	for i := range st {
		out.Queues[i] = NewQueueStats(&st[i])
	}
	return out, nil
}

func (s *Server) stats(c *call) (any, error) {
	queue, err := s.queue(c)
	if err != nil {
		return nil, err
	}
	st, err := s.cfg.Store.Stats(c.r.Context(), storage.StatsParams{Queue: queue, Now: s.cfg.Clock.Now()})
	if err != nil {
		return nil, err
	}
	if len(st) != 1 {
		return nil, fmt.Errorf("httpapi: store returned %d stats for queue %q", len(st), queue)
	}
	return NewQueueStats(&st[0]), nil
}

func (s *Server) setConfig(c *call) (any, error) {
	queue, err := s.queue(c)
	if err != nil {
		return nil, err
	}
	var u ConfigUpdate
	if err := c.decodeJSON(&u); err != nil {
		return nil, err
	}
	// Read, change, write, as `leaseq config` does: two concurrent
	// updates of different fields may lose one.
	cur, err := s.cfg.Store.QueueConfig(c.r.Context(), queue)
	if errors.Is(err, storage.ErrNotFound) {
		cur, err = s.limits.DefaultQueueConfig(), nil
	}
	if err != nil {
		return nil, err
	}
	next, err := u.apply(cur)
	if err != nil {
		return nil, err
	}
	if err := s.limits.ValidateQueueConfig(next); err != nil {
		return nil, err
	}
	if err := s.cfg.Store.SetQueueConfig(c.r.Context(), queue, next); err != nil {
		return nil, err
	}
	return NewQueueConfig(next), nil
}

// page reads the after and limit query parameters of a listing.
func (s *Server) page(c *call) (storage.ItemID, int, error) {
	var after storage.ItemID
	if v := c.r.URL.Query().Get("after"); v != "" {
		var err error
		if after, err = storage.ParseItemID(v); err != nil {
			return after, 0, fmt.Errorf("after: %w", err)
		}
	}
	limit, err := queryInt(c, "limit", 0)
	if err != nil {
		return after, 0, err
	}
	return after, s.pageLimit(limit), nil
}

// pageLimit is a request's limit with 0 meaning DefaultPageLimit, or
// MaxBatch when the node's is lower; the store checks the range
// (storage's Params.Validate).
func (s *Server) pageLimit(n int64) int {
	if n == 0 {
		return min(DefaultPageLimit, s.limits.MaxBatch)
	}
	return int(n)
}

// pageOf is a page of items, of limit asked for, of which cut were left
// out to keep the answer within its bound (fitAnswer): a full page, or
// one cut short, names where the next begins. Found by review (session
// 73): peek and dead-list pages were built whole whatever their size, up
// to --max-batch items at --max-payload each, where polls are bound.
func pageOf(items []Item, limit int, cut bool) PageResponse {
	p := PageResponse{Items: items}
	if (cut || len(items) == limit) && len(items) > 0 {
		p.NextAfter = items[len(items)-1].ID
	}
	return p
}

func (s *Server) peek(c *call) (any, error) {
	queue, err := s.queue(c)
	if err != nil {
		return nil, err
	}
	var inflight bool
	switch st := c.r.URL.Query().Get("state"); st {
	case "", "ready":
	case "inflight":
		inflight = true
	default:
		return nil, fmt.Errorf("%w: state=%q: want ready (available items, ready or delayed) or inflight", storage.ErrInvalidArgument, st)
	}
	after, limit, err := s.page(c)
	if err != nil {
		return nil, err
	}
	items, err := s.cfg.Store.Peek(c.r.Context(), storage.PeekParams{Queue: queue, Inflight: inflight, After: after, Limit: limit, Now: s.cfg.Clock.Now()})
	if err != nil {
		return nil, err
	}
	n := fitAnswer(items, s.maxAnswer)
	return pageOf(toItems(items[:n]), limit, n < len(items)), nil
}

func (s *Server) purge(c *call) (any, error) {
	queue, err := s.queue(c)
	if err != nil {
		return nil, err
	}
	if err := c.noBody(); err != nil {
		return nil, err
	}
	n, err := s.cfg.Store.Purge(c.r.Context(), storage.PurgeParams{Queue: queue, Now: s.cfg.Clock.Now()})
	if err != nil {
		return nil, err
	}
	return PurgeResponse{Purged: n}, nil
}

func (s *Server) deleteQueue(c *call) (any, error) {
	queue, err := s.queue(c)
	if err != nil {
		return nil, err
	}
	if err := c.noBody(); err != nil {
		return nil, err
	}
	force := false
	switch v := c.r.URL.Query().Get("force"); v {
	case "", "false":
	case "true":
		force = true
	default:
		return nil, fmt.Errorf("%w: query parameter force=%q: want true or false", storage.ErrInvalidArgument, v)
	}
	n, err := s.cfg.Store.DeleteQueue(c.r.Context(), storage.DeleteQueueParams{Queue: queue, Force: force, Now: s.cfg.Clock.Now()})
	if err != nil {
		return nil, err
	}
	return DeleteQueueResponse{Deleted: n}, nil
}

func (s *Server) deadList(c *call) (any, error) {
	queue, err := s.queue(c)
	if err != nil {
		return nil, err
	}
	after, limit, err := s.page(c)
	if err != nil {
		return nil, err
	}
	dead, err := s.cfg.Store.DeadList(c.r.Context(), storage.DeadListParams{Queue: queue, After: after, Limit: limit})
	if err != nil {
		return nil, err
	}
	n := fitDead(dead, s.maxAnswer)
	items := make([]Item, n)
	for i := range items {
		items[i] = toItem(&dead[i].Item)
		items[i].Reason, items[i].DeadAt = dead[i].Reason, fmtTime(dead[i].DeadAt)
	}
	return pageOf(items, limit, n < len(dead)), nil
}

// deadOp runs a redrive or dead purge on the ids of the body, or with
// "all" on up to limit dead items in id order.
func (s *Server) deadOp(c *call, run func(context.Context, storage.RedriveParams) (storage.RedriveResult, error)) (string, DeadResponse, error) {
	queue, err := s.queue(c)
	if err != nil {
		return "", DeadResponse{}, err
	}
	var req DeadRequest
	if err := c.decodeJSON(&req); err != nil {
		return "", DeadResponse{}, err
	}
	p := storage.RedriveParams{Queue: queue, Now: s.cfg.Clock.Now()}
	switch {
	case req.All && len(req.IDs) > 0:
		return "", DeadResponse{}, fmt.Errorf("%w: give ids or all, not both", storage.ErrInvalidArgument)
	case req.All:
		p.Limit = s.pageLimit(req.Limit)
	case len(req.IDs) > 0:
		if req.Limit != 0 {
			return "", DeadResponse{}, fmt.Errorf("%w: limit goes with all, not with ids", storage.ErrInvalidArgument)
		}
		if p.IDs, err = s.parseIDs(req.IDs); err != nil {
			return "", DeadResponse{}, err
		}
		p.Limit = len(p.IDs)
	default:
		return "", DeadResponse{}, fmt.Errorf("%w: give ids, or \"all\": true (up to limit, default %d)", storage.ErrInvalidArgument, DefaultPageLimit)
	}
	rr, err := run(c.r.Context(), p)
	if err != nil {
		return "", DeadResponse{}, err
	}
	out := DeadResponse{Count: rr.Moved}
	if p.IDs != nil {
		out.Results = idResults(p.IDs, rr.Codes)
	}
	return queue, out, nil
}

func (s *Server) redrive(c *call) (any, error) {
	queue, out, err := s.deadOp(c, s.cfg.Store.Redrive)
	if err != nil {
		return nil, err
	}
	if out.Count > 0 {
		s.disp.Notify(queue)
	}
	return out, nil
}

func (s *Server) purgeDead(c *call) (any, error) {
	_, out, err := s.deadOp(c, s.cfg.Store.PurgeDead)
	if err != nil {
		return nil, err
	}
	return out, nil
}
