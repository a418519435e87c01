package webui

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// rowOf returns the HTML of queue's row in the queue list.
func rowOf(t *testing.T, body, queue string) string {
	t.Helper()
	re := regexp.MustCompile(`<tr><td class="name"><a href="/ui/queues/` + regexp.QuoteMeta(queue) + `">.*?</tr>`)
	row := re.FindString(body)
	require.NotEmpty(t, row, "no row for queue %q in:\n%s", queue, body)
	return row
}

func TestWebUI_QueueList(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.enqueueN("orders", 3)
	b.kill("emails", "smtp down", "a", "b")
	b.enqueueN("emails", 1234)
	b.clock.Add(90 * time.Second)

	res, body := b.get("/ui/")
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, "text/html; charset=utf-8", res.Header.Get("Content-Type"))
	require.Contains(t, body, "<title>Queues · leaseq</title>")

	orders := rowOf(t, body, "orders")
	require.Contains(t, orders, `data-v="3">3</td>`, "ready")
	require.Contains(t, orders, `>1m30s<`, "oldest ready age")
	emails := rowOf(t, body, "emails")
	require.Contains(t, emails, `data-v="1234">1,234</td>`, "ready, with a thousands separator")
	require.Contains(t, emails, `<td class="num warn" data-v="2"><a href="/ui/queues/emails/dead">2</a>`, "dead links to the DLQ")
	// Totals over all queues.
	require.Contains(t, body, `<span class="label">Queues</span><span class="value">2</span>`)
	require.Contains(t, body, `<span class="label">Ready</span><span class="value">1,237</span>`)
	require.Contains(t, body, `<div class="card warn"><span class="label">Dead</span><span class="value">2</span>`)
	require.Contains(t, body, "as of 09:31:30Z")
	require.Contains(t, body, `data-refresh="5"`)

	t.Run("Filter", func(t *testing.T) {
		t.Parallel()
		_, body := b.get("/ui/?q=ORD")
		rowOf(t, body, "orders")
		require.NotContains(t, body, `/ui/queues/emails"`)
		require.Contains(t, body, "1 of 2 queues")
		_, body = b.get("/ui/?q=nothing-like-it")
		require.Contains(t, body, "No queue name contains “nothing-like-it”")
	})
}

func TestWebUI_QueueListEmpty(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	res, body := b.get("/ui/")
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, "No queues yet")
}

func TestWebUI_QueueListPages(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.QueuesPerPage = 2 })
	for _, q := range []string{"q1", "q2", "q3", "q4", "q5"} {
		b.enqueueN(q, 1)
	}
	_, body := b.get("/ui/")
	rowOf(t, body, "q1")
	rowOf(t, body, "q2")
	require.NotContains(t, body, "/ui/queues/q3")
	require.Contains(t, body, `<a href="/ui/?after=q2">Next page »</a>`)
	_, body = b.get("/ui/?after=q2")
	rowOf(t, body, "q3")
	rowOf(t, body, "q4")
	require.NotContains(t, body, "/ui/queues/q2\"")
	require.Contains(t, body, `<a href="/ui/">« First page</a>`)
	require.Contains(t, body, `<a href="/ui/?after=q4">Next page »</a>`)
	_, body = b.get("/ui/?after=q4")
	rowOf(t, body, "q5")
	require.NotContains(t, body, "Next page")
}

func TestWebUI_QueueListRates(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.enqueueN("jobs", 1)
	_, body := b.get("/ui/") // the first sample
	require.Contains(t, rowOf(t, body, "jobs"), `<td class="num zero" data-v="0">—</td>`, "no rate before a second sample")
	require.Contains(t, body, "rates appear after a few seconds")

	b.enqueueN("jobs", 60)
	pr, err := b.store.Poll(context.Background(), storage.PollParams{Queue: "jobs", Max: 15, Now: b.clock.Now()})
	require.NoError(t, err)
	ids := make([]storage.ItemID, len(pr.Items))
	for i, it := range pr.Items {
		ids[i] = it.ID
	}
	_, err = b.store.Ack(context.Background(), storage.AckParams{Queue: "jobs", Lease: pr.Lease, IDs: ids, Now: b.clock.Now()})
	require.NoError(t, err)
	b.clock.Add(30 * time.Second)

	_, body = b.get("/ui/")
	row := rowOf(t, body, "jobs")
	require.Contains(t, row, `>2.00/s</td>`, "60 enqueued in 30 s")
	require.Contains(t, row, `>0.50/s</td>`, "15 acked in 30 s")
	require.Contains(t, body, `<span class="label">Enqueue rate</span><span class="value">2.00/s</span>`)

	// Past the window with no sample in it: no rate rather than a wrong one.
	b.clock.Add(2 * time.Minute)
	_, body = b.get("/ui/")
	require.Contains(t, rowOf(t, body, "jobs"), `<td class="num zero" data-v="0">—</td>`)
}

func TestWebUI_RateSamplerTicker(t *testing.T) {
	t.Parallel()
	sampled := make(chan int, 16)
	b := setup(t, func(c *Config) {
		c.SampleInterval = 5 * time.Second
		c.TestSignals.Sampled = func(n int, err error) {
			if err == nil {
				sampled <- n
			}
		}
	})
	b.enqueueN("a", 1)
	b.enqueueN("b", 10)
	b.clock.Add(5 * time.Second)
	require.Equal(t, 2, <-sampled)
	require.Equal(t, 2, b.ui.rates.tracked())

	b.enqueueN("b", 50)
	b.clock.Add(5 * time.Second)
	require.Equal(t, 2, <-sampled)
	// Viewed without a request-time sample older than the ticker's: the
	// rate comes from the ticker's samples.
	b.clock.Add(5 * time.Second)
	require.Equal(t, 2, <-sampled)
	_, body := b.get("/ui/")
	require.Contains(t, rowOf(t, body, "b"), `>5.00/s</td>`, "50 items over the 10 s since the first tick")
}

func TestWebUI_QueuePage(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.PageSize = 3 })
	hostile := `<script>alert("x")</script>`
	bidi := "invoice\u202Efdp.exe"
	ids := b.enqueue("jobs", hostile, "line one\nline two", "\x00\x01\xffbinary", strings.Repeat("long ", 100), bidi)
	cfg := storage.DefaultQueueConfig()
	cfg.MaxAttempts = 7
	cfg.LeaseDuration = 90 * time.Second
	require.NoError(t, b.store.SetQueueConfig(context.Background(), "jobs", cfg))
	b.clock.Add(12 * time.Second)

	res, body := b.get("/ui/queues/jobs")
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, "<title>jobs · leaseq</title>")
	require.NotContains(t, body, hostile, "payloads are escaped")
	require.Contains(t, body, `&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;`)
	require.Contains(t, body, "line one↵ line two", "line breaks are made visible")
	require.Contains(t, body, ids[0].String())
	require.Contains(t, body, "12s ago")
	require.Contains(t, body, `<span class="badge ready">ready</span>`)
	require.Contains(t, body, "0 / 7", "attempts / max attempts")
	require.Contains(t, body, "<dt>Default lease</dt><dd>1m30s</dd>")
	require.Contains(t, body, "<dt>Max attempts</dt><dd>7</dd>")
	require.Contains(t, body, "<dt>Enqueued</dt><dd>5</dd>")
	require.NotContains(t, body, ids[3].String(), "page size 3")
	next := "/ui/queues/jobs?after=" + ids[2].String()
	require.Contains(t, body, `<a href="`+next+`">Next page »</a>`)

	_, body = b.get("/ui/queues/jobs?after=" + ids[2].String())
	require.Contains(t, body, ids[3].String())
	require.Contains(t, body, ids[4].String())
	require.NotContains(t, body, ids[2].String())
	cell := regexp.MustCompile(`<code title="long [^"]*">(long [^<]*)</code>`).FindStringSubmatch(body)
	require.NotNil(t, cell, "the long payload's cell")
	require.LessOrEqual(t, len(cell[1]), previewBytes+len("…"), "long payloads are cut")
	require.True(t, strings.HasSuffix(cell[1], "…"))
	require.NotContains(t, body, "\u202E", "bidirectional overrides are replaced")
	require.Contains(t, body, "invoice\uFFFDfdp.exe")
	require.Contains(t, body, `« First page`)

	t.Run("Binary", func(t *testing.T) {
		t.Parallel()
		_, body := b.get("/ui/queues/jobs")
		require.Contains(t, body, `<code class="bin" title="binary payload, 9 B">00 01 ff 62 69 6e 61 72 79</code>`)
	})

	t.Run("Inflight", func(t *testing.T) {
		t.Parallel()
		_, body := b.get("/ui/queues/jobs?view=inflight")
		require.Contains(t, body, "No inflight items")
	})
}

func TestWebUI_QueuePageInflight(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ids := b.enqueue("jobs", "one", "two")
	_, err := b.store.Poll(context.Background(), storage.PollParams{Queue: "jobs", Max: 1, Now: b.clock.Now()})
	require.NoError(t, err)
	_, body := b.get("/ui/queues/jobs?view=inflight")
	require.Contains(t, body, ids[0].String())
	require.NotContains(t, body, ids[1].String())
	require.Contains(t, body, `<span class="badge inflight">inflight</span>`)
	require.Contains(t, body, "1 / 5")
	require.Contains(t, body, `href="/ui/queues/jobs?view=inflight" aria-current="page"`)
	_, body = b.get("/ui/queues/jobs")
	require.Contains(t, body, ids[1].String())
	require.NotContains(t, body, ids[0].String())
}

// Queue names may hold dots, dashes and underscores: they are path
// segments as they are.
func TestWebUI_DottedQueueNames(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.enqueue("v1.orders-eu_2", "up")
	b.kill("...", "why", "x")
	_, body := b.get("/ui/")
	require.Contains(t, body, `href="/ui/queues/v1.orders-eu_2">v1.<wbr>orders-<wbr>eu_<wbr>2</a>`)
	res, body := b.get("/ui/queues/v1.orders-eu_2")
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, "up")
	res, body = b.get("/ui/queues/.../dead")
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, "nack: why")
}

func TestWebUI_NotFound(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.enqueue("jobs", "x")
	for _, tc := range []struct {
		target string
		status int
		want   string
	}{
		{"/ui/queues/nope", http.StatusNotFound, `There is no queue named &#34;nope&#34; on this node.`},
		{"/ui/queues/nope/dead", http.StatusNotFound, "Queue not found"},
		{"/ui/queues/" + url.PathEscape("<b>bad name</b>"), http.StatusNotFound, "&lt;b&gt;bad name&lt;/b&gt;"},
		{"/ui/queues/", http.StatusNotFound, "Page not found"},
		{"/ui/queues/jobs?after=zz", http.StatusBadRequest, "Bad page link"},
		{"/ui/no/such/page", http.StatusNotFound, "Page not found"},
	} {
		t.Run(tc.target, func(t *testing.T) {
			t.Parallel()
			res, body := b.get(tc.target)
			require.Equal(t, tc.status, res.StatusCode)
			require.Contains(t, body, tc.want)
			require.Contains(t, body, `<a href="/ui/">← All queues</a>`)
		})
	}
	t.Run("PostUnknownQueue", func(t *testing.T) {
		t.Parallel()
		res, body := b.post("/ui/queues/nope/dead/redrive", url.Values{"all": {"1"}})
		require.Equal(t, http.StatusNotFound, res.StatusCode)
		require.Contains(t, body, "Queue not found")
	})
	t.Run("RootRedirect", func(t *testing.T) {
		t.Parallel()
		res, _ := b.get("/ui")
		require.Equal(t, http.StatusMovedPermanently, res.StatusCode)
		require.Equal(t, "/ui/", res.Header.Get("Location"))
	})
}

func TestWebUI_DeadPage(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ids := b.kill("mail", `smtp said <550> "no"`, "hello", "world")
	b.clock.Add(3 * time.Minute)
	res, body := b.get("/ui/queues/mail/dead")
	require.Equal(t, http.StatusOK, res.StatusCode)
	for _, id := range ids {
		require.Contains(t, body, `<tr id="dead-`+id.String()+`">`)
	}
	require.Contains(t, body, `nack: smtp said &lt;550&gt; &#34;no&#34;`)
	require.Contains(t, body, "3m00s ago")
	require.Contains(t, body, `formaction="/ui/queues/mail/dead/redrive"`)
	require.Contains(t, body, `data-confirm="Delete all 2 dead items of mail for good?"`)

	_, body = b.get("/ui/queues/mail/dead?after=" + ids[1].String())
	require.Contains(t, body, "No dead items after this point")
}

func TestWebUI_Redrive(t *testing.T) {
	t.Parallel()
	t.Run("One", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		ids := b.kill("jobs", "boom", "a", "b", "c")
		res, _ := b.post("/ui/queues/jobs/dead/redrive", url.Values{"one": {ids[1].String()}, "id": {ids[0].String()}})
		require.Equal(t, http.StatusSeeOther, res.StatusCode)
		require.Equal(t, "/ui/queues/jobs/dead", res.Header.Get("Location"))
		st := b.stats("jobs")
		require.EqualValues(t, 2, st.Dead, "only the row's item, not the ticked one")
		require.EqualValues(t, 1, st.Ready)
		require.Equal(t, []string{"jobs"}, b.wokenQueues(), "parked polls are woken")

		res, body := b.follow(res)
		require.Equal(t, http.StatusOK, res.StatusCode)
		require.Contains(t, body, `<div class="flash flash-ok" role="status">Redrove 1 item.</div>`)
		require.NotContains(t, body, `id="dead-`+ids[1].String())
		require.Contains(t, body, `id="dead-`+ids[0].String())
		var cleared bool
		for _, c := range res.Cookies() {
			cleared = cleared || (c.Name == flashCookie && c.MaxAge < 0)
		}
		require.True(t, cleared, "the flash is shown once")

		// The same item again: it is no longer dead.
		res, _ = b.post("/ui/queues/jobs/dead/redrive", url.Values{"one": {ids[1].String()}})
		_, body = b.follow(res)
		require.Contains(t, body, "Redrove 0 items. 1 item no longer in the dead-letter queue")
	})
	t.Run("Selected", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		ids := b.kill("jobs", "boom", "a", "b", "c")
		res, _ := b.post("/ui/queues/jobs/dead/redrive", url.Values{"id": {ids[0].String(), ids[2].String()}, "after": {ids[0].String()}})
		require.Equal(t, "/ui/queues/jobs/dead?after="+ids[0].String(), res.Header.Get("Location"), "back to the page the form was on")
		st := b.stats("jobs")
		require.EqualValues(t, 1, st.Dead)
		require.EqualValues(t, 2, st.Ready)
		require.EqualValues(t, 2, st.Redriven)
		items, err := b.store.Peek(context.Background(), storage.PeekParams{Queue: "jobs", Limit: 10, Now: b.clock.Now()})
		require.NoError(t, err)
		require.Len(t, items, 2)
		require.Zero(t, items[0].Attempts, "redrive resets attempts")
	})
	t.Run("NothingSelected", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.kill("jobs", "boom", "a")
		res, _ := b.post("/ui/queues/jobs/dead/redrive", url.Values{})
		_, body := b.follow(res)
		require.Contains(t, body, `<div class="flash flash-warn" role="status">Nothing selected: tick the items to redrive first.</div>`)
		require.EqualValues(t, 1, b.stats("jobs").Dead)
		require.Empty(t, b.wokenQueues())
	})
	t.Run("All", func(t *testing.T) {
		t.Parallel()
		// MaxBatch 4: redrive all runs in batches.
		b := setup(t, func(c *Config) { c.Limits.MaxBatch = 4 })
		p := make([]string, 10)
		for i := range p {
			p[i] = fmt.Sprint(i)
		}
		b.kill("jobs", "boom", p[:4]...)
		b.kill("jobs", "boom", p[4:8]...)
		b.kill("jobs", "boom", p[8:]...)
		form := b.allForm("jobs")
		res, _ := b.post("/ui/queues/jobs/dead/redrive", form)
		st := b.stats("jobs")
		require.Zero(t, st.Dead)
		require.EqualValues(t, 10, st.Ready)
		_, body := b.follow(res)
		require.Contains(t, body, "Redrove 10 items.")
		require.Contains(t, body, "No dead items")

		res, _ = b.post("/ui/queues/jobs/dead/redrive", form)
		_, body = b.follow(res)
		require.Contains(t, body, "The dead-letter queue was empty: nothing to redrive.")
	})
	t.Run("BadID", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.kill("jobs", "boom", "a")
		res, body := b.post("/ui/queues/jobs/dead/redrive", url.Values{"id": {"not-an-id"}})
		require.Equal(t, http.StatusBadRequest, res.StatusCode)
		require.Contains(t, body, "Bad item id")
		require.EqualValues(t, 1, b.stats("jobs").Dead)
	})
}

func TestWebUI_Purge(t *testing.T) {
	t.Parallel()
	t.Run("One", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		ids := b.kill("jobs", "boom", "a", "b")
		res, _ := b.post("/ui/queues/jobs/dead/purge", url.Values{"one": {ids[0].String()}})
		st := b.stats("jobs")
		require.EqualValues(t, 1, st.Dead)
		require.Zero(t, st.Ready, "purged, not redriven")
		require.EqualValues(t, 1, st.Purged)
		require.Empty(t, b.wokenQueues(), "a purge makes nothing ready")
		_, body := b.follow(res)
		require.Contains(t, body, "Purged 1 item.")
		require.NotContains(t, body, `id="dead-`+ids[0].String())
	})
	t.Run("All", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.kill("jobs", "boom", "a", "b", "c")
		b.enqueue("jobs", "live")
		res, _ := b.post("/ui/queues/jobs/dead/purge", b.allForm("jobs"))
		st := b.stats("jobs")
		require.Zero(t, st.Dead)
		require.EqualValues(t, 1, st.Ready, "live items are untouched")
		_, body := b.follow(res)
		require.Contains(t, body, "Purged 3 items.")
		rep, err := b.store.Check(context.Background())
		require.NoError(t, err)
		require.True(t, rep.OK(), "%v", rep.Violations)
	})
}

// allForm returns the form the dead-letter page of queue posts for its
// "Redrive all" and "Purge all" buttons: all=1 and the page's hidden
// fields, as a browser sends them.
func (b *testBundle) allForm(queue string) url.Values {
	b.t.Helper()
	res, body := b.get("/ui/queues/" + queue + "/dead")
	require.Equal(b.t, http.StatusOK, res.StatusCode)
	form := url.Values{"all": {"1"}}
	for _, m := range regexp.MustCompile(`<input type="hidden" name="(seen|asof)" value="([^"]*)">`).FindAllStringSubmatch(body, -1) {
		form.Set(m[1], m[2])
	}
	require.Len(b.t, form, 3, "the page has no seen/asof fields:\n%s", body)
	return form
}

// TestWebUI_PurgeAllStopsAtWhatWasShown: "Purge all" deletes the dead
// items the page showed when the user confirmed, not items that died
// between the page and the click. Found by review (session 70): the purge
// took every item dead when the form arrived (the count read then), so an
// item dead-lettered after the page was rendered, whatever its id, was
// deleted unseen. A bound on the count alone would not do: an old item
// (a lower id) that dies late would be deleted in place of one shown.
func TestWebUI_PurgeAllStopsAtWhatWasShown(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.PageSize = 2; c.Limits.MaxBatch = 3 }) // pages and batches of the scan
	ctx := context.Background()
	res0, err := b.store.Enqueue(ctx, storage.EnqueueParams{Queue: "jobs", Items: []storage.EnqueueItem{{Payload: []byte("early"), Delay: time.Minute}}, Now: b.clock.Now()})
	require.NoError(t, err)
	early := res0[0].ID
	shown := b.kill("jobs", "boom", "a", "b", "c", "d", "e")
	form := b.allForm("jobs")
	require.Equal(t, "5", form.Get("seen"))

	// Between the page and the click: the early item (a lower id than those
	// shown) and a new one die.
	b.clock.Add(2 * time.Minute)
	late := b.enqueue("jobs", "late")[0]
	pr, err := b.store.Poll(ctx, storage.PollParams{Queue: "jobs", Max: 10, Now: b.clock.Now()})
	require.NoError(t, err)
	require.Len(t, pr.Items, 2)
	zero := time.Duration(0)
	codes, err := b.store.Nack(ctx, storage.NackParams{Queue: "jobs", Lease: pr.Lease, IDs: []storage.ItemID{early, late}, Delay: &zero, Reason: "late", Now: b.clock.Now()})
	require.NoError(t, err)
	require.Equal(t, []storage.Code{storage.CodeOK, storage.CodeOK}, codes)
	require.EqualValues(t, 7, b.stats("jobs").Dead)

	res, _ := b.post("/ui/queues/jobs/dead/purge", form)
	st := b.stats("jobs")
	require.EqualValues(t, 5, st.Purged, "purged what the page showed, no more")
	require.EqualValues(t, 2, st.Dead)
	dead, err := b.store.DeadList(ctx, storage.DeadListParams{Queue: "jobs", Limit: 10})
	require.NoError(t, err)
	require.Len(t, dead, 2)
	require.Equal(t, early, dead[0].ID, "an item that died after the page was shown stays")
	require.Equal(t, late, dead[1].ID, "an item that died after the page was shown stays")
	_, body := b.follow(res)
	require.Contains(t, body, `<div class="flash flash-warn" role="status">Purged 5 items. 2 items died after the page was shown and were left.</div>`)
	for _, id := range shown {
		require.NotContains(t, body, `id="dead-`+id.String())
	}

	// A form from a page without the fields (or a hand-made all=1) does
	// nothing: it cannot say what the user saw.
	res, _ = b.post("/ui/queues/jobs/dead/purge", url.Values{"all": {"1"}})
	_, body = b.follow(res)
	require.Contains(t, body, "nothing was purged")
	require.EqualValues(t, 2, b.stats("jobs").Dead)

	// Redrive all is bounded the same way.
	form = b.allForm("jobs")
	b.clock.Add(time.Second)
	b.kill("jobs", "boom", "f")
	res, _ = b.post("/ui/queues/jobs/dead/redrive", form)
	st = b.stats("jobs")
	require.EqualValues(t, 2, st.Redriven)
	require.EqualValues(t, 1, st.Dead)
	_, body = b.follow(res)
	require.Contains(t, body, "Redrove 2 items. 1 item died after the page was shown and was left.")
}

func TestWebUI_SameOrigin(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ids := b.kill("jobs", "boom", strings.Split("abcdefghijkl", "")...)
	form := func(i int) url.Values { return url.Values{"one": {ids[i].String()}} }
	for i, tc := range []struct {
		name    string
		headers map[string]string
		ok      bool
	}{
		{"SecFetchSameOrigin", map[string]string{"Sec-Fetch-Site": "same-origin"}, true},
		{"SecFetchCrossSite", map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "http://node.test"}, false},
		{"SecFetchSameSite", map[string]string{"Sec-Fetch-Site": "same-site", "Origin": "http://other.node.test"}, false},
		{"OriginMatches", map[string]string{"Origin": "http://NODE.test"}, true},
		{"OriginOtherHost", map[string]string{"Origin": "http://evil.test"}, false},
		{"OriginOtherPort", map[string]string{"Origin": "http://node.test:8080"}, false},
		{"OriginNull", map[string]string{"Origin": "null", "Referer": "http://node.test/ui/"}, false},
		{"RefererMatches", map[string]string{"Referer": "http://node.test/ui/queues/jobs/dead"}, true},
		{"RefererOtherHost", map[string]string{"Referer": "https://evil.test/node.test"}, false},
		{"RefererRelative", map[string]string{"Referer": "/ui/queues/jobs/dead"}, false},
		{"NoHeaders", map[string]string{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Not parallel: each case redrives its own item and checks
			// the dead count moved by exactly that.
			before := b.stats("jobs").Dead
			res, body := b.do(formRequest("/ui/queues/jobs/dead/redrive", form(i), tc.headers))
			after := b.stats("jobs").Dead
			if tc.ok {
				require.Equal(t, http.StatusSeeOther, res.StatusCode)
				require.Equal(t, before-1, after)
				return
			}
			require.Equal(t, http.StatusForbidden, res.StatusCode)
			require.Contains(t, body, "Changes are accepted only from the dashboard&#39;s own pages")
			require.Equal(t, before, after, "a refused request changes nothing")
		})
	}
	t.Run("PurgeToo", func(t *testing.T) {
		before := b.stats("jobs").Dead
		res, _ := b.do(formRequest("/ui/queues/jobs/dead/purge", url.Values{"all": {"1"}}, map[string]string{"Origin": "http://evil.test"}))
		require.Equal(t, http.StatusForbidden, res.StatusCode)
		require.Equal(t, before, b.stats("jobs").Dead)
	})
}

func TestWebUI_ClientCert(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.RequireClientCert = true })
	b.kill("jobs", "boom", "a")
	cert := &x509.Certificate{}
	for _, tc := range []struct {
		name  string
		state *tls.ConnectionState
		ok    bool
	}{
		{"PlainHTTP", nil, false},
		{"TLSWithoutCert", &tls.ConnectionState{}, false},
		{"CertNotVerified", &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}, false},
		{"Verified", &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}, VerifiedChains: [][]*x509.Certificate{{cert}}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			get := httptest.NewRequest(http.MethodGet, "http://node.test/ui/queues/jobs/dead", nil)
			get.TLS = tc.state
			res, body := b.do(get)
			post := formRequest("/ui/queues/jobs/dead/purge", url.Values{"all": {"1"}}, map[string]string{"Sec-Fetch-Site": "same-origin"})
			post.TLS = tc.state
			if tc.ok {
				require.Equal(t, http.StatusOK, res.StatusCode)
				require.Contains(t, body, "nack: boom")
				return
			}
			require.Equal(t, http.StatusForbidden, res.StatusCode)
			require.Contains(t, body, "Client certificate required")
			res, _ = b.do(post)
			require.Equal(t, http.StatusForbidden, res.StatusCode)
			require.EqualValues(t, 1, b.stats("jobs").Dead)
		})
	}
}

func TestWebUI_HeadersAndAssets(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	res, body := b.get("/ui/")
	h := res.Header
	require.Contains(t, h.Get("Content-Security-Policy"), "script-src 'self'")
	require.Contains(t, h.Get("Content-Security-Policy"), "frame-ancestors 'none'")
	require.Equal(t, "DENY", h.Get("X-Frame-Options"))
	require.Equal(t, "nosniff", h.Get("X-Content-Type-Options"))
	require.Equal(t, "same-origin", h.Get("Referrer-Policy"))
	require.Equal(t, "no-store", h.Get("Cache-Control"))
	require.NotContains(t, body, "<script>", "no inline script")

	css := regexp.MustCompile(`href="(/ui/static/style\.css\?v=[0-9a-f]+)"`).FindStringSubmatch(body)
	require.NotNil(t, css)
	js := regexp.MustCompile(`src="(/ui/static/app\.js\?v=[0-9a-f]+)"`).FindStringSubmatch(body)
	require.NotNil(t, js)
	res, body = b.get(css[1])
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, "text/css; charset=utf-8", res.Header.Get("Content-Type"))
	require.Contains(t, res.Header.Get("Cache-Control"), "immutable")
	require.Contains(t, body, "@media (max-width")

	res, _ = b.get(js[1])
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, res.Header.Get("Content-Type"), "javascript")

	res, _ = b.get("/ui/static/app.js")
	require.Equal(t, "no-cache", res.Header.Get("Cache-Control"), "an unversioned link is revalidated")
	res, _ = b.get("/ui/static/nope.css")
	require.Equal(t, http.StatusNotFound, res.StatusCode)
}

func TestWebUI_StoreClosed(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.enqueue("jobs", "x")
	require.NoError(t, b.store.Close())
	res, body := b.get("/ui/")
	require.Equal(t, http.StatusServiceUnavailable, res.StatusCode)
	require.Contains(t, body, "Store unavailable")
	res, _ = b.get("/ui/queues/jobs")
	require.Equal(t, http.StatusServiceUnavailable, res.StatusCode)
}

func TestWebUI_NewErrors(t *testing.T) {
	t.Parallel()
	s := openRocks(t)
	mock := clock.NewMock()
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"NoStore", Config{Clock: mock}},
		{"NoClock", Config{Store: s}},
		{"PrefixWithoutSlash", Config{Store: s, Clock: mock, Prefix: "ui"}},
		{"PrefixTrailingSlash", Config{Store: s, Clock: mock, Prefix: "/ui/"}},
		{"PrefixPattern", Config{Store: s, Clock: mock, Prefix: "/{x}"}},
		{"NegativePageSize", Config{Store: s, Clock: mock, PageSize: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := New(tc.cfg)
			require.Error(t, err)
		})
	}
}

// TestWebUI_RootPrefix mounts the dashboard at the root.
func TestWebUI_RootPrefix(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.Prefix = "" })
	b.enqueue("jobs", "x")
	res, body := b.get("/")
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, `href="/queues/jobs"`)
	require.Contains(t, body, `href="/static/style.css?v=`)
	res, _ = b.get("/queues/jobs")
	require.Equal(t, http.StatusOK, res.StatusCode)
}

// Close stops the sampler (goleak in TestMain checks the goroutine is
// gone), is idempotent, and leaves the pages working.
func TestWebUI_Close(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.SampleInterval = time.Second })
	b.enqueue("jobs", "x")
	b.ui.Close()
	b.ui.Close()
	b.clock.Add(5 * time.Second) // a stopped ticker fires nothing
	res, body := b.get("/ui/")
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Contains(t, body, `href="/ui/queues/jobs"`)
}
