package httpapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

func TestHTTP_EnqueuePollAck(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	bin := []byte{0xff, 0x00, 0xfe}
	var res EnqueueResponse
	b.call(http.MethodPost, "/v1/queues/jobs/items", []EnqueueItem{
		{Text: ptr("hello")},
		{Payload: ptr(base64.StdEncoding.EncodeToString(bin)), Priority: 0},
		{Payload: ptr(strings.TrimRight(base64.StdEncoding.EncodeToString([]byte("x")), "=")), DedupKey: "k"},
	}, &res)
	require.Len(t, res.IDs, 3)
	require.Len(t, res.Results, 3)
	for i, r := range res.Results {
		require.Equal(t, "ok", r.Code, "%d: %+v", i, r)
		require.Equal(t, *res.IDs[i], r.ID)
		require.Len(t, r.ID, 32)
		require.False(t, r.Duplicate)
	}

	p := b.poll("jobs", PollRequest{Max: ptr[int64](10), LeaseMs: 60000})
	require.Len(t, p.Lease, 32)
	require.Equal(t, "2026-11-22T01:01:00.000Z", p.ExpiresAt, "lease of 60 s from the mock clock's now")
	require.Len(t, p.Items, 3)
	hello := p.Items[0]
	require.Equal(t, *res.IDs[0], hello.ID)
	require.Equal(t, "jobs", hello.Queue)
	require.Equal(t, "inflight", hello.State)
	require.EqualValues(t, 1, hello.Attempts)
	require.Equal(t, "2026-11-22T01:00:00.000Z", hello.EnqueuedAt)
	require.Equal(t, []byte("hello"), hello.Payload)
	require.Equal(t, "hello", *hello.Text)
	require.Equal(t, bin, p.Items[1].Payload)
	require.Nil(t, p.Items[1].Text, "no text for a payload that is not UTF-8")
	require.Equal(t, "x", *p.Items[2].Text, "unpadded base64 is accepted")
	require.Equal(t, "k", p.Items[2].DedupKey)

	var ack SettleResponse
	b.call(http.MethodPost, "/v1/queues/jobs/ack", SettleRequest{Lease: p.Lease, IDs: []string{hello.ID, p.Items[1].ID}}, &ack)
	require.Equal(t, []IDResult{{hello.ID, "ok"}, {p.Items[1].ID, "ok"}}, ack.Results)
	b.call(http.MethodPost, "/v1/queues/jobs/ack", SettleRequest{Lease: p.Lease, IDs: []string{hello.ID}}, &ack)
	require.Equal(t, []IDResult{{hello.ID, "notFound"}}, ack.Results, "an acked item is gone")

	var st QueueStats
	b.call(http.MethodGet, "/v1/queues/jobs", nil, &st)
	require.Equal(t, "jobs", st.Queue)
	require.EqualValues(t, 1, st.Inflight)
	require.EqualValues(t, 2, st.Acked)
	require.EqualValues(t, 3, st.Enqueued)

	// The raw body of an empty poll answer: no lease, an empty list.
	status, raw := b.request(http.MethodPost, "/v1/queues/jobs/poll", "", nil)
	require.Equal(t, http.StatusOK, status)
	require.JSONEq(t, `{"items":[]}`, string(raw))
}

func TestHTTP_EnqueueRaw(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	bin := []byte{0, 1, 2, 0xff}
	status, raw := b.request(http.MethodPost, "/v1/queues/q/items?priority=7&dedup_key=a&max_attempts=3", "application/octet-stream", bin)
	require.Equal(t, http.StatusOK, status, "%s", raw)
	status, raw = b.request(http.MethodPost, "/v1/queues/q/items?dedup_key=a", "application/octet-stream", "again")
	require.Equal(t, http.StatusOK, status, "%s", raw)
	require.Contains(t, string(raw), `"duplicate":true`)
	status, raw = b.request(http.MethodPost, "/v1/queues/q/items?delay_ms=5000", "application/octet-stream", "later")
	require.Equal(t, http.StatusOK, status, "%s", raw)
	status, raw = b.request(http.MethodPost, "/v1/queues/q/items", "application/octet-stream", nil)
	require.Equal(t, http.StatusOK, status, "an empty raw body is an empty payload: %s", raw)

	var page PageResponse
	b.call(http.MethodGet, "/v1/queues/q/items", nil, &page)
	require.Len(t, page.Items, 3)
	require.Equal(t, bin, page.Items[0].Payload)
	require.EqualValues(t, 7, page.Items[0].Priority)
	require.EqualValues(t, 3, page.Items[0].MaxAttempts)
	require.Equal(t, "a", page.Items[0].DedupKey)
	require.Equal(t, "ready", page.Items[0].State)
	require.Equal(t, "later", *page.Items[1].Text)
	require.Equal(t, "delayed", page.Items[1].State)
	require.Equal(t, "2026-11-22T01:00:05.000Z", page.Items[1].VisibleAt)
	require.Equal(t, "", *page.Items[2].Text)
	require.Empty(t, page.Items[2].Payload)

	b.fails(http.MethodPost, "/v1/queues/q/items?priority=high", "application/octet-stream", "x", 400, "invalidArgument", `priority="high": want an integer`)
	b.fails(http.MethodPost, "/v1/queues/q/items?prio=1", "application/octet-stream", "x", 400, "invalidArgument", `unknown query parameter "prio"`)
	b.fails(http.MethodPost, "/v1/queues/q/items?priority=1", "application/json", `[]`, 400, "invalidArgument", "with a JSON body give them in each item")
}

// TestHTTP_EnqueueRefusesItemsAlone: an item over a limit gets code
// invalid with storage's reason; the rest of the batch is applied.
func TestHTTP_EnqueueRefusesItemsAlone(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Limits = storage.Limits{MaxPayload: 4, MaxDedupKey: 3} })
	var res EnqueueResponse
	b.call(http.MethodPost, "/v1/queues/q/items", []EnqueueItem{
		{Text: ptr("ok")},
		{Text: ptr("too long")},
		{Text: ptr("a"), Payload: ptr("YQ==")},
		{Payload: ptr("!!!")},
		{Text: ptr("p"), Priority: 256},
		{Text: ptr("d"), DelayMs: -1},
		{Text: ptr("d"), DelayMs: 8 * 24 * 3600 * 1000},
		{Text: ptr("k"), DedupKey: "long"},
		{Text: ptr("m"), MaxAttempts: -2},
		{Text: ptr("ok2")},
	}, &res)
	want := []string{
		"",
		"payload of 8 bytes exceeds the limit of 4",
		"give payload (base64) or text, not both",
		"payload is not standard base64",
		"priority 256 outside [0, 255]",
		"delay -1ms outside [0, 168h0m0s]",
		"delay 192h0m0s outside [0, 168h0m0s]",
		"dedup key of 4 bytes exceeds the limit of 3",
		"max_attempts -2 outside",
		"",
	}
	require.Len(t, res.Results, len(want))
	for i, w := range want {
		r := res.Results[i]
		if w == "" {
			require.Equal(t, "ok", r.Code, "%d", i)
			require.NotNil(t, res.IDs[i])
			continue
		}
		require.Equal(t, "invalid", r.Code, "%d", i)
		require.Contains(t, r.Error, w, "%d", i)
		require.Nil(t, res.IDs[i], "%d", i)
		require.Empty(t, r.ID)
	}
	var st QueueStats
	b.call(http.MethodGet, "/v1/queues/q", nil, &st)
	require.EqualValues(t, 2, st.Ready)

	// The batch size is the request's, as in RPC.
	many := make([]EnqueueItem, storage.DefaultLimits.MaxBatch+1)
	b.fails(http.MethodPost, "/v1/queues/q/items", "application/json", many, 400, "invalidArgument", "batch of 1001 exceeds the limit of 1000")
}

func TestHTTP_NackRedriveDead(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.call(http.MethodPut, "/v1/queues/q/config", ConfigUpdate{MaxAttempts: ptr[int64](2)}, nil)
	ids := b.enqueueTexts("q", "a")

	p := b.poll("q", PollRequest{})
	var res SettleResponse
	b.call(http.MethodPost, "/v1/queues/q/nack", SettleRequest{Lease: p.Lease, IDs: ids, DelayMs: ptr[int64](0), Reason: "db down"}, &res)
	require.Equal(t, []IDResult{{ids[0], "ok"}}, res.Results)
	p = b.poll("q", PollRequest{})
	require.Len(t, p.Items, 1)
	require.EqualValues(t, 2, p.Items[0].Attempts)
	require.Equal(t, "db down", p.Items[0].LastError)
	// Out of attempts: dead, with the reason.
	b.call(http.MethodPost, "/v1/queues/q/nack", SettleRequest{Lease: p.Lease, IDs: ids, Reason: "still down"}, &res)
	require.Equal(t, "ok", res.Results[0].Code)

	var dead PageResponse
	b.call(http.MethodGet, "/v1/queues/q/dlq", nil, &dead)
	require.Len(t, dead.Items, 1)
	require.Equal(t, "nack: still down", dead.Items[0].Reason)
	require.Equal(t, "dead", dead.Items[0].State)
	require.Equal(t, "2026-11-22T01:00:00.000Z", dead.Items[0].DeadAt)
	require.Empty(t, dead.NextAfter)

	var dr DeadResponse
	other := strings.Repeat("0", 32)
	b.call(http.MethodPost, "/v1/queues/q/dlq/redrive", DeadRequest{IDs: []string{ids[0], other}}, &dr)
	require.Equal(t, DeadResponse{Count: 1, Results: []IDResult{{ids[0], "ok"}, {other, "notFound"}}}, dr)
	p = b.poll("q", PollRequest{})
	require.Len(t, p.Items, 1)
	require.EqualValues(t, 1, p.Items[0].Attempts, "redrive resets attempts")
	b.call(http.MethodPost, "/v1/queues/q/nack", SettleRequest{Lease: p.Lease, IDs: ids, DelayMs: ptr[int64](0)}, nil)
	p = b.poll("q", PollRequest{})
	b.call(http.MethodPost, "/v1/queues/q/nack", SettleRequest{Lease: p.Lease, IDs: ids}, nil)

	b.call(http.MethodDelete, "/v1/queues/q/dlq", DeadRequest{All: true}, &dr)
	require.Equal(t, DeadResponse{Count: 1}, dr)
	b.call(http.MethodGet, "/v1/queues/q/dlq", nil, &dead)
	require.Empty(t, dead.Items)

	b.fails(http.MethodPost, "/v1/queues/q/dlq/redrive", "application/json", DeadRequest{}, 400, "invalidArgument", `give ids, or "all": true`)
	b.fails(http.MethodDelete, "/v1/queues/q/dlq", "", nil, 400, "invalidArgument", `give ids, or "all": true`)
	b.fails(http.MethodPost, "/v1/queues/q/dlq/redrive", "application/json", DeadRequest{All: true, IDs: ids}, 400, "invalidArgument", "not both")
	b.fails(http.MethodPost, "/v1/queues/q/dlq/redrive", "application/json", DeadRequest{IDs: ids, Limit: 3}, 400, "invalidArgument", "limit goes with all")
	b.fails(http.MethodPost, "/v1/queues/q/dlq/redrive", "application/json", DeadRequest{All: true, Limit: 1001}, 400, "invalidArgument", "limit must be 1-1000")
	b.fails(http.MethodPost, "/v1/queues/q/nack", "application/json", SettleRequest{Lease: p.Lease, IDs: ids, DelayMs: ptr[int64](-5)}, 400, "invalidArgument", "delay -5ms outside")
	b.fails(http.MethodPost, "/v1/queues/q/ack", "application/json", SettleRequest{Lease: p.Lease, IDs: ids, Reason: "x"}, 400, "invalidArgument", "ack takes no reason")
}

// TestHTTP_LeaseRules: the lease-token rules reach the client as per-id
// codes (ack, nack) or as 409/410 (extend), as in RPC.
func TestHTTP_LeaseRules(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ids := b.enqueueTexts("q", "a", "b")
	b.enqueueTexts("other", "c")
	p := b.poll("q", PollRequest{Max: ptr[int64](1), LeaseMs: 1000})
	require.Equal(t, ids[0], p.Items[0].ID)
	foreign := b.poll("other", PollRequest{LeaseMs: 1000})

	var res SettleResponse
	// The live lease does not list ids[1]; a stranger's item is not found.
	b.call(http.MethodPost, "/v1/queues/q/ack", SettleRequest{Lease: p.Lease, IDs: []string{ids[1], foreign.Items[0].ID}}, &res)
	require.Equal(t, []IDResult{{ids[1], "leaseMismatch"}, {foreign.Items[0].ID, "notFound"}}, res.Results)

	var ext ExtendResponse
	b.call(http.MethodPost, "/v1/queues/q/extend", SettleRequest{Lease: p.Lease, LeaseMs: 5000}, &ext)
	require.Equal(t, ExtendResponse{ExpiresAt: "2026-11-22T01:00:05.000Z"}, ext)
	b.fails(http.MethodPost, "/v1/queues/q/extend", "application/json", SettleRequest{Lease: foreign.Lease, LeaseMs: 5000}, 409, "leaseMismatch", "lease")
	b.call(http.MethodPost, "/v1/queues/q/extend", SettleRequest{Lease: foreign.Lease, LeaseMs: 5000, IDs: ids[:1]}, &ext)
	require.Equal(t, ExtendResponse{Results: []IDResult{{ids[0], "leaseMismatch"}}}, ext, "with ids: the lease's outcome per id")
	b.fails(http.MethodPost, "/v1/queues/q/extend", "application/json", SettleRequest{Lease: p.Lease}, 400, "invalidArgument", "lease_ms must be given")
	tooMany := make([]string, storage.DefaultLimits.MaxBatch+1)
	for i := range tooMany {
		tooMany[i] = ids[0]
	}
	b.fails(http.MethodPost, "/v1/queues/q/ack", "application/json", SettleRequest{Lease: p.Lease, IDs: tooMany}, 400, "invalidArgument", "batch of 1001 exceeds the limit of 1000")
	b.fails(http.MethodPost, "/v1/queues/q/extend", "application/json", SettleRequest{Lease: p.Lease, LeaseMs: 1}, 400, "invalidArgument", "lease 1ms outside [100ms, 12h0m0s]")

	// Past its expiry (by the node's clock, before any sweep) the lease is
	// dead everywhere.
	b.clock.Add(5 * time.Second)
	b.call(http.MethodPost, "/v1/queues/q/ack", SettleRequest{Lease: p.Lease, IDs: ids[:1]}, &res)
	require.Equal(t, []IDResult{{ids[0], "leaseExpired"}}, res.Results)
	b.fails(http.MethodPost, "/v1/queues/q/extend", "application/json", SettleRequest{Lease: p.Lease, LeaseMs: 5000}, 410, "leaseExpired", "lease expired")
	b.call(http.MethodPost, "/v1/queues/q/extend", SettleRequest{Lease: p.Lease, LeaseMs: 5000, IDs: ids[:1]}, &ext)
	require.Equal(t, ExtendResponse{Results: []IDResult{{ids[0], "leaseExpired"}}}, ext)
}

// leaseLog records what a LeaseObserver is told.
type leaseLog struct {
	settled  chan []storage.Code
	extended chan error
}

func (l *leaseLog) LeaseSettled(_ storage.LeaseID, codes []storage.Code) { l.settled <- codes }
func (l *leaseLog) LeaseExtended(_ storage.LeaseID, _ time.Time, err error) {
	l.extended <- err
}

func TestHTTP_LeaseObserverIsTold(t *testing.T) {
	t.Parallel()
	obs := &leaseLog{settled: make(chan []storage.Code, 4), extended: make(chan error, 4)}
	b := setup(t, func(c *Config) { c.Leases = obs })
	ids := b.enqueueTexts("q", "a", "b")
	p := b.poll("q", PollRequest{Max: ptr[int64](2)})
	b.call(http.MethodPost, "/v1/queues/q/extend", SettleRequest{Lease: p.Lease, LeaseMs: 1000}, nil)
	require.NoError(t, <-obs.extended)
	b.call(http.MethodPost, "/v1/queues/q/ack", SettleRequest{Lease: p.Lease, IDs: ids[:1]}, nil)
	require.Equal(t, []storage.Code{storage.CodeOK}, <-obs.settled)
	b.call(http.MethodPost, "/v1/queues/q/nack", SettleRequest{Lease: p.Lease, IDs: ids[1:]}, nil)
	require.Equal(t, []storage.Code{storage.CodeOK}, <-obs.settled)
}

// Found by review (session 73): a poll's answer is built whole in memory
// (writeJSON), and with encoding/json's default HTML escaping each '<',
// '>' or '&' of a payload that is valid UTF-8 took six bytes in "text"
// ("\u003c"), on top of the payload's base64: one item of 1 MiB of '<' was
// a 7.3 MiB answer, and a poll of the default MaxBatch (1000) such items a
// 7.3 GiB buffer. An item now takes its base64 (4/3), its text (1) and a
// little framing.
func TestPoll_AnswerIsNotHTMLEscaped(t *testing.T) {
	const n = 1 << 20
	for _, c := range []byte{'a', '<', '&'} {
		it := storage.Item{Queue: "q", Payload: bytes.Repeat([]byte{c}, n)}
		rec := httptest.NewRecorder()
		require.NoError(t, writeJSON(rec, http.StatusOK, &pollAnswer{PollResponse: PollResponse{Items: toItems([]storage.Item{it})}}))
		got := rec.Body.Len()
		require.LessOrEqualf(t, got, n*4/3+n+1024,
			"a poll answer of one item of %d bytes of %q takes %d bytes (x%.1f): HTML escaping of \"text\"", n, c, got, float64(got)/n)
	}
}

// Found by review (session 73): nothing but MaxBatch bounded a poll
// answer, where the RPC server bounds every reply (rpc.trimPoll). The
// items past DefaultMaxAnswerBytes (lowered here) are given back at once,
// ready with no attempt counted, and an item larger than the bound alone
// is still served alone.
func TestPoll_AnswerIsCutToItsBound(t *testing.T) {
	t.Parallel()
	const bound = 10_000
	b := setupWith(t, nil, func(s *Server) { s.maxAnswer = bound })
	b.enqueueTexts("q", strings.Repeat("x", 1000), strings.Repeat("x", 1000), strings.Repeat("x", 1000),
		strings.Repeat("x", 1000), strings.Repeat("x", 1000))
	status, raw := b.request(http.MethodPost, "/v1/queues/q/poll", "application/json", PollRequest{Max: ptr[int64](5), LeaseMs: 60000})
	require.Equal(t, http.StatusOK, status, "%s", raw)
	var p PollResponse
	require.NoError(t, json.Unmarshal(raw, &p))
	require.LessOrEqual(t, len(raw), bound)
	require.Less(t, len(p.Items), 5, "a poll answer of 5 items of ~2.9 KB of JSON each is over %d bytes", bound)
	require.Greater(t, len(p.Items), 1, "as many as fit are served")
	var st QueueStats
	b.call(http.MethodGet, "/v1/queues/q", nil, &st)
	require.EqualValues(t, len(p.Items), st.Inflight)
	require.EqualValues(t, 5-len(p.Items), st.Ready, "the items left out are ready again at once")
	var page PageResponse
	b.call(http.MethodGet, "/v1/queues/q/items?state=ready", nil, &page)
	require.Len(t, page.Items, 5-len(p.Items))
	for _, it := range page.Items {
		require.EqualValues(t, 0, it.Attempts, "an item left out of the answer counts no attempt")
	}

	// An item larger than the bound is served alone.
	big := strings.Repeat("y", 2*bound)
	b.enqueueTexts("big", big, big)
	p = b.poll("big", PollRequest{Max: ptr[int64](5)})
	require.Len(t, p.Items, 1)
	require.Equal(t, big, *p.Items[0].Text)
	b.call(http.MethodGet, "/v1/queues/big", nil, &st)
	require.EqualValues(t, 1, st.Ready)
}

// Found by review (session 73), with TestPoll_AnswerIsCutToItsBound: the
// size a poll answer is cut by (itemAnswerBytes) is never less than the
// item's JSON, for every kind of character encoding/json escapes.
func TestPoll_ItemAnswerBytesBoundsTheJSON(t *testing.T) {
	for _, payload := range []string{
		"", "plain", strings.Repeat("<>&", 100), "\x00\x01\x1f\b\f\n\r\t", `"quoted\\"`,
		"\u2028\u2029 line separators", "caf\u00e9 \U0001f600", "\xff\xfe not UTF-8", "ok \xe2\x80 cut",
	} {
		it := storage.Item{Queue: "q<&>", DedupKey: "k\x01\"", LastError: "bad \xff <reason>", Payload: []byte(payload),
			Attempts: 4294967295, MaxAttempts: 4294967295, Priority: 255, EnqueuedAt: testStart, VisibleAt: testStart, State: storage.StateInflight}
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		require.NoError(t, enc.Encode(toItem(&it)))
		require.GreaterOrEqualf(t, itemAnswerBytes(&it), int64(buf.Len()), "payload %q: %s", payload, buf.Bytes())
	}
}

// TestPages_CutToTheAnswerBound: a peek page and a dead-letter page are
// cut, as a poll answer is, to what fits in the answer bound (at least
// one item), with next_after set so the client pages on; paging on
// reaches every item once. Found by review (session 73): only polls were
// bound; a page of --max-batch items at --max-payload each was built
// whole (about 2.3 GiB of JSON with the default limits).
func TestPages_CutToTheAnswerBound(t *testing.T) {
	t.Parallel()
	const bound = 10_000
	b := setupWith(t, nil, func(s *Server) { s.maxAnswer = bound })
	x := strings.Repeat("x", 1000)
	ids := b.enqueueTexts("q", x, x, x, x, x)
	b.call(http.MethodPut, "/v1/queues/q/config", ConfigUpdate{MaxAttempts: ptr[int64](1)}, nil)

	pageAll := func(path string) []string {
		var seen []string
		after := ""
		for range 10 {
			status, raw := b.request(http.MethodGet, path+"?limit=5&after="+after, "", nil)
			require.Equal(t, http.StatusOK, status, "%s", raw)
			require.LessOrEqual(t, len(raw), bound, "%s: a page over the answer bound", path)
			var page PageResponse
			require.NoError(t, json.Unmarshal(raw, &page))
			for _, it := range page.Items {
				seen = append(seen, it.ID)
			}
			if page.NextAfter == "" {
				return seen
			}
			require.Less(t, len(page.Items), 5, "%s: the page was not cut", path)
			after = page.NextAfter
		}
		t.Fatalf("%s: paging did not end", path)
		return nil
	}
	require.Equal(t, ids, pageAll("/v1/queues/q/items"))

	// Dead, with their reasons: the dead-letter list is cut the same way.
	for dead := 0; dead < len(ids); {
		// A poll answer is cut to the bound too: several polls.
		p := b.poll("q", PollRequest{Max: ptr[int64](5)})
		require.NotEmpty(t, p.Items)
		var got []string
		for _, it := range p.Items {
			got = append(got, it.ID)
		}
		var res SettleResponse
		b.call(http.MethodPost, "/v1/queues/q/nack", SettleRequest{Lease: p.Lease, IDs: got, Reason: "no"}, &res)
		dead += len(got)
	}
	require.Equal(t, ids, pageAll("/v1/queues/q/dlq"))
}
