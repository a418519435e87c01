package webui

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

var updateScreenshots = flag.Bool("update-screenshots", false, "write docs/ui-*.png from TestBrowser_Dashboard")

// chromiumPath is where Debian's chromium package (make deps) puts the
// browser.
const chromiumPath = "/usr/bin/chromium"

// screenshotWidth and screenshotHeight are a laptop's browser viewport.
const screenshotWidth, screenshotHeight = 1280, 820

// newBrowser starts a headless Chromium with a fresh profile and returns a
// tab context; everything is torn down at cleanup. Without Chromium the
// test fails (it must not pass by skipping under make test), unless
// LEASEQ_SKIP_BROWSER=1 asks to skip it.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("LEASEQ_SKIP_BROWSER") == "1" {
			t.Skipf("LEASEQ_SKIP_BROWSER=1 and no %s: browser test skipped", chromiumPath)
		}
		t.Fatalf("the browser test needs Debian's chromium at %s (%v): run `make deps` to install it "+
			"(or set LEASEQ_SKIP_BROWSER=1 to skip this test)", chromiumPath, err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox, // root in CI containers
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		// Without these Chromium reaches out to Google's services at start,
		// which this network refuses, and its connections to the test
		// server are refused too.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(screenshotWidth, screenshotHeight),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf), chromedp.WithErrorf(t.Logf))
	t.Cleanup(func() {
		cancelTab()
		cancelAlloc() // waits for the browser process to exit
	})
	// Start the browser on the tab's own context (not one with a timeout:
	// the browser lives as long as the context of the first Run).
	require.NoError(t, chromedp.Do(ctx, chromedp.EmulateViewport(screenshotWidth, screenshotHeight)))
	return ctx
}

// step runs browser actions with a timeout, so a broken page fails the
// test in seconds instead of hanging it.
func step(t *testing.T, ctx context.Context, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, chromedp.Do(ctx, actions...))
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	require.NoError(t, err, "evaluating %s", expr)
	return v
}

// waitFor waits until a JavaScript predicate is true in the page.
func waitFor(t *testing.T, ctx context.Context, predicate string) {
	t.Helper()
	step(t, ctx, func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		_, err := chromedp.Poll[bool](predicate, chromedp.WithPollingTimeout(8*time.Second))(ctx, tg)
		return chromedp.Void{}, err
	})
}

// screenshot writes the viewport to docs/name when -update-screenshots is
// set.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if !*updateScreenshots {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	require.NoError(t, err)
	path := filepath.Join("..", "..", "docs", name)
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("wrote %s (%d bytes)", path, len(png))
}

// phoneScreenshot is screenshot at a phone's viewport (mobile emulation),
// to check the narrow layout; the laptop viewport is restored after.
func phoneScreenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if !*updateScreenshots {
		return
	}
	step(t, ctx, chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulateTouch, chromedp.EmulatePortrait))
	screenshot(t, ctx, name)
	step(t, ctx, chromedp.EmulateViewport(screenshotWidth, screenshotHeight))
}

// seedDemo fills the store with a node's worth of queues in every state,
// as the screenshots show them, and takes the rate samples a minute apart.
// It returns the dead item ids of emails.welcome.
func seedDemo(t *testing.T, b *testBundle) []storage.ItemID {
	t.Helper()
	ctx := context.Background()
	js := func(v any) string {
		out, err := json.Marshal(v)
		require.NoError(t, err)
		return string(out)
	}
	orders := func(from, n int) []string {
		p := make([]string, n)
		for i := range p {
			p[i] = js(map[string]any{"order_id": 48210 + from + i, "sku": fmt.Sprintf("SKU-%04d", (from+i)*37%9000), "qty": 1 + (from+i)%4, "currency": "EUR"})
		}
		return p
	}
	poll := func(queue string, n int, lease time.Duration) storage.PollResult {
		pr, err := b.store.Poll(ctx, storage.PollParams{Queue: queue, Max: n, Lease: lease, Now: b.clock.Now()})
		require.NoError(t, err)
		return pr
	}
	ack := func(queue string, pr storage.PollResult, n int) {
		ids := make([]storage.ItemID, 0, n)
		for _, it := range pr.Items[:n] {
			ids = append(ids, it.ID)
		}
		_, err := b.store.Ack(ctx, storage.AckParams{Queue: queue, Lease: pr.Lease, IDs: ids, Now: b.clock.Now()})
		require.NoError(t, err)
	}

	b.enqueue("orders", orders(0, 1300)...)
	b.clock.Add(4 * time.Second)
	dead := b.kill("emails.welcome", "smtp 421: too many connections, try again later",
		js(map[string]any{"to": "ana@example.com", "template": "welcome", "locale": "pt-BR"}),
		js(map[string]any{"to": "li.wei@example.com", "template": "welcome", "locale": "zh-CN"}),
		js(map[string]any{"to": "sam@example.org", "template": "welcome", "locale": "en-GB"}))
	// A lease that runs out twice on a queue with max attempts 2: the
	// item dies with "lease expired".
	cfg := storage.DefaultQueueConfig()
	cfg.MaxAttempts = 2
	require.NoError(t, b.store.SetQueueConfig(ctx, "emails.welcome", cfg))
	lost := b.enqueue("emails.welcome", js(map[string]any{"to": "ops@example.com", "template": "digest"}))
	for range 2 {
		require.Len(t, poll("emails.welcome", 1, time.Second).Items, 1)
		b.clock.Add(2 * time.Second)
		_, err := b.store.Sweep(ctx, storage.SweepParams{Now: b.clock.Now(), Limit: 100})
		require.NoError(t, err)
	}
	dead = append(dead, lost...)
	require.EqualValues(t, 4, b.stats("emails.welcome").Dead)
	b.enqueue("emails.welcome", js(map[string]any{"to": "noor@example.net", "template": "welcome", "locale": "ar"}))
	cfg.MaxAttempts = storage.DefaultMaxAttempts
	b.kill("webhooks-out", "POST https://hooks.example.com/leaseq: 502 Bad Gateway",
		js(map[string]any{"event": "invoice.paid", "invoice": "in_7781"}),
		js(map[string]any{"event": "invoice.paid", "invoice": "in_7782"}))
	require.NoError(t, b.store.SetQueueConfig(ctx, "webhooks-out", cfg))
	for i := range 212 {
		b.enqueue("webhooks-out", js(map[string]any{"event": "customer.updated", "customer": fmt.Sprintf("cus_%05d", 3100+i)}))
	}
	thumbs := make([]string, 7)
	for i := range thumbs {
		thumbs[i] = fmt.Sprintf("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR%c", i)
	}
	b.enqueue("thumbnails", thumbs...)
	poll("thumbnails", 5, time.Minute)
	b.enqueue("payments.refunds", js(map[string]any{"refund": "re_19", "amount_cents": 2599}))
	res, err := b.store.Enqueue(ctx, storage.EnqueueParams{Queue: "reports.nightly", Now: b.clock.Now(), Items: []storage.EnqueueItem{
		{Payload: []byte(js(map[string]any{"report": "daily-sales", "date": "2026-11-22"})), Delay: 6 * time.Hour},
	}})
	require.NoError(t, err)
	require.Equal(t, storage.CodeOK, res[0].Code)

	// The first rate sample; a minute of traffic; the second.
	_, _ = b.get("/ui/")
	b.enqueue("orders", orders(1300, 600)...)
	ack("orders", poll("orders", 500, time.Minute), 480)
	ack("orders", poll("orders", 500, time.Minute), 460)
	poll("orders", 12, time.Minute)
	for i := range 6 {
		b.enqueue("payments.refunds", js(map[string]any{"refund": fmt.Sprintf("re_%d", 20+i), "amount_cents": 1000 + 137*i}))
	}
	ack("payments.refunds", poll("payments.refunds", 3, time.Minute), 3)
	b.enqueue("webhooks-out", js(map[string]any{"event": "customer.created", "customer": "cus_09001"}))
	b.clock.Add(time.Minute)
	return dead
}

// TestBrowser_Dashboard drives the dashboard in a real headless Chromium:
// every page loads and shows the store's figures, a redrive clicked on the
// dead-letter page moves the item, the page refreshes itself, the filter
// filters, and payloads cannot run script. With -update-screenshots it
// writes docs/ui-queues.png, docs/ui-queue.png and docs/ui-dead.png (a
// laptop's viewport) and docs/ui-phone-dead.png (a phone's).
func TestBrowser_Dashboard(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	b := setup(t, func(c *Config) { c.RefreshInterval = time.Second; c.PageSize = 25 })
	dead := seedDemo(t, b)
	srv := httptest.NewServer(b.h)
	t.Cleanup(srv.Close)
	base := srv.URL + "/ui/"

	// Queue list.
	step(t, ctx, chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS("#queue-table tbody tr")))
	require.Equal(t, "Queues · leaseq", eval[string](t, ctx, `document.title`))
	require.Equal(t, 6, eval[int](t, ctx, `document.querySelectorAll("#queue-table tbody tr").length`))
	cellJS := func(queue string, col int) string {
		return fmt.Sprintf(`[...document.querySelectorAll("#queue-table tbody tr")].find(r => r.cells[0].textContent === %q).cells[%d].textContent`, queue, col)
	}
	orders := b.stats("orders")
	require.Equal(t, count(orders.Ready), eval[string](t, ctx, cellJS("orders", 1)), "orders ready")
	require.Equal(t, count(orders.Inflight), eval[string](t, ctx, cellJS("orders", 3)), "orders inflight")
	require.Equal(t, "4", eval[string](t, ctx, cellJS("emails.welcome", 4)), "emails dead")
	require.Equal(t, "10.0/s", eval[string](t, ctx, cellJS("orders", 6)), "orders enqueue rate: 600 in a minute")
	require.Equal(t, "15.7/s", eval[string](t, ctx, cellJS("orders", 7)), "orders ack rate: 940 in a minute")
	require.Equal(t, "1", eval[string](t, ctx, cellJS("emails.welcome", 1)), "emails ready")
	screenshot(t, ctx, "ui-queues.png")

	// Queue page.
	step(t, ctx, chromedp.Click(chromedp.CSS(`#queue-table a[href="/ui/queues/orders"]`)),
		chromedp.WaitVisible(chromedp.CSS("#items table")))
	require.Equal(t, "orders · leaseq", eval[string](t, ctx, `document.title`))
	require.Equal(t, 25, eval[int](t, ctx, `document.querySelectorAll("#items tbody tr").length`), "one page")
	require.Contains(t, eval[string](t, ctx, `document.querySelector("#items tbody tr .payload code").textContent`), `"currency":"EUR"`)
	require.Equal(t, count(orders.Ready), eval[string](t, ctx, `document.querySelector("#qstats .card .value").textContent`))
	screenshot(t, ctx, "ui-queue.png")
	next := eval[string](t, ctx, `document.querySelector(".pager a").href`)
	require.Contains(t, next, "?after=")
	step(t, ctx, chromedp.Navigate(next), chromedp.WaitVisible(chromedp.CSS("#items table")))
	require.Equal(t, 25, eval[int](t, ctx, `document.querySelectorAll("#items tbody tr").length`), "page two")

	// Dead-letter page: click Redrive on one row.
	step(t, ctx, chromedp.Navigate(base+"queues/emails.welcome/dead"), chromedp.WaitVisible(chromedp.CSS("#items table")))
	require.Equal(t, 4, eval[int](t, ctx, `document.querySelectorAll("#items tbody tr").length`))
	require.Contains(t, eval[string](t, ctx, `document.querySelector("#items tbody").textContent`), "lease expired")
	require.True(t, eval[bool](t, ctx, `document.querySelector("[data-needs-selection]").disabled`), "nothing ticked yet")
	screenshot(t, ctx, "ui-dead.png")
	phoneScreenshot(t, ctx, "ui-phone-dead.png")
	victim := dead[1].String()
	step(t, ctx, chromedp.Click(chromedp.CSS(`#dead-`+victim+` button[data-action=redrive]`)),
		chromedp.WaitVisible(chromedp.CSS(".flash-ok")))
	require.Equal(t, "Redrove 1 item.", eval[string](t, ctx, `document.querySelector(".flash").textContent`))
	require.False(t, eval[bool](t, ctx, `!!document.getElementById("dead-`+victim+`")`), "the item left the dead list")
	require.Equal(t, 3, eval[int](t, ctx, `document.querySelectorAll("#items tbody tr").length`))
	require.EqualValues(t, 3, b.stats("emails.welcome").Dead)
	require.Equal(t, []string{"emails.welcome"}, b.wokenQueues())

	// Purge all, cancelled at the confirmation, then confirmed.
	eval[bool](t, ctx, `(window.confirm = m => { window.asked = m; return false }, true)`)
	step(t, ctx, chromedp.Click(chromedp.CSS(`button[name=all][formaction$="/purge"]`)))
	require.Equal(t, "Delete all 3 dead items of emails.welcome for good?", eval[string](t, ctx, `window.asked`))
	require.EqualValues(t, 3, b.stats("emails.welcome").Dead, "cancelled: nothing purged")
	// Drop the redrive's flash, so the wait below is for the purge's.
	eval[bool](t, ctx, `(window.confirm = () => true, document.querySelector(".flash").remove(), true)`)
	step(t, ctx, chromedp.Click(chromedp.CSS(`button[name=all][formaction$="/purge"]`)),
		chromedp.WaitVisible(chromedp.CSS(".flash-ok")))
	require.Equal(t, "Purged 3 items.", eval[string](t, ctx, `document.querySelector(".flash").textContent`))
	require.Zero(t, b.stats("emails.welcome").Dead)

	// Back on the queue list the redriven item counts as ready.
	step(t, ctx, chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS("#queue-table tbody tr")))
	require.Equal(t, "2", eval[string](t, ctx, cellJS("emails.welcome", 1)), "the queue's ready count went up")
	require.Equal(t, "0", eval[string](t, ctx, cellJS("emails.welcome", 4)))

	// A click on a heading sorts by that column, largest first; again,
	// smallest first.
	firstRow := `document.querySelector("#queue-table tbody tr").cells[0].textContent`
	step(t, ctx, chromedp.Click(chromedp.CSS(`#queue-table th:nth-child(2)`)))
	require.Equal(t, "orders", eval[string](t, ctx, firstRow), "most ready first")
	step(t, ctx, chromedp.Click(chromedp.CSS(`#queue-table th:nth-child(2)`)))
	require.Equal(t, "reports.nightly", eval[string](t, ctx, firstRow), "fewest ready first")

	// The page refreshes itself: items enqueued now appear without a reload.
	b.enqueue("payments.refunds", "one more")
	waitFor(t, ctx, cellJS("payments.refunds", 1)+` === "5"`)

	// The filter hides the other rows as one types.
	step(t, ctx, chromedp.SendKeys(chromedp.ID("filter"), "pay"))
	waitFor(t, ctx, `[...document.querySelectorAll("#queue-table tbody tr")].filter(r => !r.hidden).length === 1`)
	require.Contains(t, eval[string](t, ctx, `location.search`), "q=pay")
	require.Equal(t, "1 of 6 queues shown", eval[string](t, ctx, `document.getElementById("shown").textContent`))
	typeFilter := func(v string) {
		eval[bool](t, ctx, fmt.Sprintf(`(f => (f.value = %q, f.dispatchEvent(new Event("input")), true))(document.getElementById("filter"))`, v))
	}
	typeFilter("ts")
	require.Equal(t, "2 of 6 queues shown", eval[string](t, ctx, `document.getElementById("shown").textContent`), "payments, reports")
	typeFilter("")
	require.Equal(t, "6 of 6 queues", eval[string](t, ctx, `document.getElementById("shown").textContent`))
	require.Equal(t, 6, eval[int](t, ctx, `[...document.querySelectorAll("#queue-table tbody tr")].filter(r => !r.hidden).length`))
	require.NotContains(t, eval[string](t, ctx, `location.search`), "q=")

	// Payloads are text, never markup, whatever they hold.
	b.enqueue("escaping", `<img src=x onerror="window.pwned=1">`, `</code><script>window.pwned=2</script>`)
	step(t, ctx, chromedp.Navigate(base+"queues/escaping"), chromedp.WaitVisible(chromedp.CSS("#items table")))
	require.False(t, eval[bool](t, ctx, `"pwned" in window`))
	require.Zero(t, eval[int](t, ctx, `document.querySelectorAll("#items img, #items script").length`))
	require.True(t, eval[bool](t, ctx, `[...document.querySelectorAll("#items .payload code")].some(c => c.textContent.startsWith("<img src=x"))`))

	// Unknown queues get the 404 page.
	step(t, ctx, chromedp.Navigate(base+"queues/nope"), chromedp.WaitVisible(chromedp.CSS(".error-page")))
	require.Equal(t, "Queue not found", eval[string](t, ctx, `document.querySelector(".error-page h1").textContent`))
	require.False(t, strings.Contains(eval[string](t, ctx, `document.body.textContent`), "panic"))
}
