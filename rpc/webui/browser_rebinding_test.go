package webui

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBrowser_DNSRebindingRefused: a DNS rebinding attack as a real
// Chromium makes it, refused (421). Found by the review of session 70's
// first guard, which held only requests with a browser's headers to the
// Host rule. The attacker's page is at http://evil.test:PORT, a
// name the attacker re-points at 127.0.0.1 (here: Chromium's
// --host-resolver-rules). Its script fetches, same-origin, the node's
// dashboard page and API listing of ready items. For an origin that is
// not potentially trustworthy (plain http, not loopback by name),
// Chromium sends no Sec-Fetch-* headers, and a same-origin GET carries no
// Origin: so httpapi's hostGuard holds every request to the rule.
func TestBrowser_DNSRebindingRefused(t *testing.T) {
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("LEASEQ_SKIP_BROWSER") == "1" {
			t.Skipf("LEASEQ_SKIP_BROWSER=1 and no %s: browser test skipped", chromiumPath)
		}
		t.Fatalf("this test needs Debian's chromium at %s (%v): run `make deps`, or set LEASEQ_SKIP_BROWSER=1 to skip it", chromiumPath, err)
	}
	n := guardSetup(t)
	n.enqueue("orders", "secret-ready-payload")
	_, port, err := net.SplitHostPort(n.addr)
	require.NoError(t, err)

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		// The rebinding: evil.test resolves to the node's address.
		chromedp.Flag("host-resolver-rules", "MAP evil.test 127.0.0.1"),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	require.NoError(t, chromedp.Do(ctx)) // start the browser

	run := func(actions ...chromedp.Action[chromedp.Void]) {
		c, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		require.NoError(t, chromedp.Do(c, actions...))
	}
	// The attacker's page, now served by the node (any answer will do: the
	// document's origin is http://evil.test:PORT either way).
	run(chromedp.Navigate("http://evil.test:" + port + "/nowhere"))
	fetch := func(path string) string {
		c, cancel := context.WithTimeout(ctx, 15*time.Second)
		defer cancel()
		body, err := chromedp.Run(c, chromedp.Evaluate[string](
			`fetch("`+path+`").then(r => r.text().then(b => r.status + "\n" + b)).catch(e => "error " + e)`,
			chromedp.EvalAwaitPromise))
		require.NoError(t, err)
		t.Logf("GET %s from the rebound page: %.120q", path, body)
		return body
	}
	dash := fetch("/ui/queues/orders")
	api := fetch("/v1/queues/orders/items")
	// What Chromium sent with such a request: a server that echoes the
	// headers, reached by the rebound name.
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.Header.Write(w)
	}))
	t.Cleanup(echo.Close)
	_, eport, err := net.SplitHostPort(echo.Listener.Addr().String())
	require.NoError(t, err)
	run(chromedp.Navigate("http://evil.test:" + eport + "/page"))
	t.Logf("headers of a same-origin fetch from http://evil.test:%s:\n%s", eport, fetch("/echo"))

	// JSON payloads are base64: "secret-ready-payload".
	assert.False(t, strings.Contains(dash, "secret-ready-payload"),
		"a page of http://evil.test (rebound to 127.0.0.1) read a payload through the dashboard in a real Chromium: %.80q", dash)
	assert.False(t, strings.Contains(api, "c2VjcmV0LXJlYWR5LXBheWxvYWQ"),
		"a page of http://evil.test (rebound to 127.0.0.1) read a payload through the API in a real Chromium: %.80q", api)
}
