package webui

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/httpapi"
	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// reviewNode is the node's --http listener as startHTTP builds it: the
// HTTP API with the dashboard mounted at /ui/, served on a real loopback
// listener (127.0.0.1, the default bind of a node).
type reviewNode struct {
	*testBundle
	addr   string // 127.0.0.1:port
	client *http.Client
}

func guardSetup(t *testing.T) *reviewNode {
	t.Helper()
	b := setup(t, nil)
	api, err := httpapi.New(httpapi.Config{Store: b.store, Clock: b.clock, Logger: rpctest.Logger(t)})
	require.NoError(t, err)
	t.Cleanup(api.Stop)
	require.NoError(t, api.Mount("/ui/", b.ui.Handler()))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, api.Start(context.Background(), ln))
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &reviewNode{
		testBundle: b,
		addr:       ln.Addr().String(),
		client: &http.Client{
			Transport: tr,
			// A browser following a 303 is not what these tests look at.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

// send sends method target to the node's real listener with the Host
// header host (what a browser puts there: the name in the page's URL)
// and the given headers, and returns the status and body.
func (n *reviewNode) send(method, target, host string, body io.Reader, headers map[string]string) (int, string) {
	n.t.Helper()
	r, err := http.NewRequest(method, "http://"+n.addr+target, body)
	require.NoError(n.t, err)
	r.Host = host
	for k, v := range headers {
		r.Header.Set(k, v)
	}
	res, err := n.client.Do(r)
	require.NoError(n.t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(n.t, err)
	return res.StatusCode, string(b)
}

// TestGuard_DNSRebinding: a page of http://evil.test:PORT whose name
// the attacker re-points at 127.0.0.1 is, to the browser, same-origin with
// itself: its requests reach the node with Host evil.test:PORT,
// Sec-Fetch-Site same-origin and Origin http://evil.test:PORT. They get
// 421 (httpapi's hostGuard). Found by review (session 70): nothing
// checked that the Host is a name the node is reached by, and the page
// could read every payload (dashboard and API) and purge the dead
// letters.
func TestGuard_DNSRebinding(t *testing.T) {
	n := guardSetup(t)
	n.kill("jobs", "boom", "secret-dead-payload-1", "secret-dead-payload-2")
	n.enqueue("orders", "secret-ready-payload")
	_, port, err := net.SplitHostPort(n.addr)
	require.NoError(t, err)
	evilHost := "evil.test:" + port
	evilOrigin := "http://" + evilHost
	browser := map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": evilOrigin}

	t.Run("Control", func(t *testing.T) {
		// The node's own name works, as it should.
		status, body := n.send(http.MethodGet, "/ui/queues/jobs/dead", n.addr, nil, nil)
		require.Equal(t, http.StatusOK, status)
		require.Contains(t, body, "secret-dead-payload-1")
	})
	t.Run("DashboardPurge", func(t *testing.T) {
		before := n.stats("jobs").Dead
		form := url.Values{"all": {"1"}}
		h := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
		for k, v := range browser {
			h[k] = v
		}
		status, _ := n.send(http.MethodPost, "/ui/queues/jobs/dead/purge", evilHost, strings.NewReader(form.Encode()), h)
		after := n.stats("jobs").Dead
		require.Equal(t, before, after, "a page of another site (rebound to 127.0.0.1) purged the dead letters (status %d)", status)
		require.NotEqual(t, http.StatusSeeOther, status)
	})
	t.Run("DashboardReadsPayloads", func(t *testing.T) {
		status, body := n.send(http.MethodGet, "/ui/queues/orders", evilHost, nil, map[string]string{"Sec-Fetch-Site": "same-origin"})
		require.NotContains(t, body, "secret-ready-payload", "a page of another site read a payload through the dashboard (status %d)", status)
	})
	t.Run("APIReadsPayloads", func(t *testing.T) {
		status, body := n.send(http.MethodGet, "/v1/queues/orders/items", evilHost, nil, map[string]string{"Sec-Fetch-Site": "same-origin"})
		// JSON payloads are base64: "secret-ready-payload".
		require.NotContains(t, body, "c2VjcmV0LXJlYWR5LXBheWxvYWQ", "a page of another site read a payload through the API (status %d)", status)
	})
}

// TestGuard_APICrossSitePoll: the HTTP API on the same listener refuses
// a cross-site POST (403), such as one with no body and no Content-Type,
// which any web page can send without a CORS preflight (fetch(url,
// {method: "POST", mode: "no-cors"})). Found by review (session 70): on
// /v1/queues/Q/poll it leased an item; the page could not read the
// answer, but each such request took a delivery attempt, and a page left
// open drove the queue's items into the dead-letter queue.
func TestGuard_APICrossSitePoll(t *testing.T) {
	n := guardSetup(t)
	cfg := storage.DefaultQueueConfig()
	cfg.MaxAttempts = 2
	require.NoError(t, n.store.SetQueueConfig(context.Background(), "jobs", cfg))
	n.enqueue("jobs", "work")
	crossSite := map[string]string{
		"Origin":         "http://evil.test",
		"Sec-Fetch-Site": "cross-site",
		"Sec-Fetch-Mode": "no-cors",
	}
	// What a page left open does: poll once per lease period.
	var first string
	for i := range cfg.MaxAttempts + 1 {
		status, body := n.send(http.MethodPost, "/v1/queues/jobs/poll", n.addr, nil, crossSite)
		if i == 0 {
			first = body
			assert.Zero(t, n.stats("jobs").Inflight, "a cross-site no-cors POST leased an item (status %d: %s)", status, body)
		}
		// The node's sweeper: the lease expires, the item waits out its
		// backoff, and is ready again (or dead, after its last attempt).
		for _, d := range []time.Duration{cfg.LeaseDuration, cfg.BackoffMax} {
			n.clock.Add(d + time.Second)
			_, err := n.store.Sweep(context.Background(), storage.SweepParams{Now: n.clock.Now(), Limit: 100})
			require.NoError(t, err)
		}
	}
	st := n.stats("jobs")
	require.Zero(t, st.Dead, "cross-site requests alone dead-lettered the item (first answer: %s)", first)
	require.EqualValues(t, 1, st.Ready)
}

// TestGuard_FilterAmplification: the queue list's filter (?q=) is
// lower-cased once per request. Found by review (session 70): it was
// lower-cased again for every queue, so a q of the 64 KiB the listener's
// headers allow made one GET allocate 64 KiB per queue: with 300 queues
// ~20 MB, with the 10,000 queues a node allows ~640 MB.
func TestGuard_FilterAmplification(t *testing.T) {
	b := setup(t, nil)
	const queues = 300
	items := []storage.EnqueueItem{{Payload: []byte("x")}}
	for i := range queues {
		_, err := b.store.Enqueue(context.Background(), storage.EnqueueParams{
			Queue: "q-" + strings.Repeat("0", 3-len(itoa(i))) + itoa(i), Items: items, Now: b.clock.Now(),
		})
		require.NoError(t, err)
	}
	allocs := func(filter string) uint64 {
		target := "/ui/?q=" + filter
		b.get(target) // warm up: rates ring, pools
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		res, _ := b.get(target)
		runtime.ReadMemStats(&m1)
		require.Equal(t, http.StatusOK, res.StatusCode)
		return m1.TotalAlloc - m0.TotalAlloc
	}
	short := allocs("A")
	long := allocs(strings.Repeat("A", 60<<10)) // upper case: ToLower must copy
	// The long filter is echoed in the page a few times: a few hundred
	// KB more than the short one, not 60 KiB a queue (18 MB). Measured
	// against the short filter's page, not as a total: the process's
	// other goroutines allocate meanwhile (2.2 MB in all in a clean-clone
	// run).
	require.Less(t, long, short+4<<20, "one queue-list GET with a 60 KiB filter allocated %d bytes, one with a 1-byte filter %d (%d queues)", long, short, queues)
}

func itoa(i int) string {
	if i == 0 {
		return "0"
	}
	var b []byte
	for ; i > 0; i /= 10 {
		b = append([]byte{byte('0' + i%10)}, b...)
	}
	return string(b)
}

// TestGuard_DuplicateIDs: a form naming one dead item twice (two
// ticks of the same box cannot, but a replayed or hand-made form can)
// must purge it once and say so.
func TestGuard_DuplicateIDs(t *testing.T) {
	b := setup(t, nil)
	ids := b.kill("jobs", "boom", "a", "b")
	res, _ := b.post("/ui/queues/jobs/dead/purge", url.Values{"id": {ids[0].String(), ids[0].String()}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	_, page := b.follow(res)
	st := b.stats("jobs")
	require.EqualValues(t, 1, st.Dead)
	require.EqualValues(t, 1, st.Purged, "lifetime purged counter")
	require.Contains(t, page, "Purged 1 item.")
}

// TestGuard_Headers: every dashboard answer, the error pages and
// the redirects after an action included, forbids framing and caching of
// pages that show payloads.
func TestGuard_Headers(t *testing.T) {
	b := setup(t, nil)
	b.kill("jobs", "<script>alert(1)</script>", "<img src=x onerror=alert(1)>")
	for _, target := range []string{"/ui/", "/ui/queues/jobs", "/ui/queues/jobs/dead", "/ui/queues/nope", "/ui/nowhere"} {
		res, body := b.get(target)
		require.Equal(t, "DENY", res.Header.Get("X-Frame-Options"), target)
		require.Contains(t, res.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'", target)
		require.Equal(t, "no-store", res.Header.Get("Cache-Control"), target)
		require.NotContains(t, body, "<script>alert", target)
		require.NotContains(t, body, "<img src=x", target)
	}
	res, _ := b.post("/ui/queues/jobs/dead/redrive", url.Values{"all": {"1"}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "DENY", res.Header.Get("X-Frame-Options"))
}

// TestGuard_CrossSiteVariants: forms and fetches another site can
// make a browser send, beyond TestWebUI_SameOrigin's cases.
func TestGuard_CrossSiteVariants(t *testing.T) {
	b := setup(t, nil)
	ids := b.kill("jobs", "boom", "a")
	for _, tc := range []struct {
		name, method, ctype string
		headers             map[string]string
	}{
		{"TextPlainNoOrigin", http.MethodPost, "text/plain", map[string]string{}},
		{"MultipartCrossSite", http.MethodPost, "multipart/form-data; boundary=x", map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.test"}},
		{"SecFetchNoneOriginNull", http.MethodPost, "application/x-www-form-urlencoded", map[string]string{"Sec-Fetch-Site": "none", "Origin": "null"}},
		{"RefererUserinfo", http.MethodPost, "application/x-www-form-urlencoded", map[string]string{"Referer": "http://node.test@evil.test/"}},
		{"OriginWithPath", http.MethodPost, "application/x-www-form-urlencoded", map[string]string{"Origin": "http://evil.test/node.test"}},
		{"MethodOverridePUT", http.MethodPut, "application/x-www-form-urlencoded", map[string]string{"Origin": "http://evil.test", "X-HTTP-Method-Override": "POST"}},
		{"GETWithQuery", http.MethodGet, "", map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			form := url.Values{"one": {ids[0].String()}}
			target := "http://node.test/ui/queues/jobs/dead/purge"
			var body io.Reader = strings.NewReader(form.Encode())
			if tc.method == http.MethodGet {
				target += "?" + form.Encode()
				body = nil
			}
			r, err := http.NewRequest(tc.method, target, body)
			require.NoError(t, err)
			if tc.ctype != "" {
				r.Header.Set("Content-Type", tc.ctype)
			}
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			res, _ := b.do(r)
			require.NotEqual(t, http.StatusSeeOther, res.StatusCode)
			require.EqualValues(t, 1, b.stats("jobs").Dead)
		})
	}
}
