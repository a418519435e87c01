package webui

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testStart is the mock clock's starting instant: a real-looking date.
var testStart = time.Date(2026, 11, 22, 9, 30, 0, 0, time.UTC)

// openRocks opens a RocksDB store in a fresh temporary directory, closed
// at cleanup. sync=none: these tests are about the pages, not durability.
func openRocks(t testing.TB) *rocksstore.Store {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o700)) // as leaseq serve keeps it: no warning in the log
	s, err := rocksstore.Open(dir, rocksstore.Options{Sync: rocksstore.SyncNone, Logger: rpctest.Logger(t)})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// testBundle is a UI over a real RocksDB store, with a mock clock.
type testBundle struct {
	t     testing.TB
	store *rocksstore.Store
	clock *clock.Mock
	ui    *UI
	h     http.Handler

	mu    sync.Mutex
	woken []string // OnReady calls
}

// setup builds a bundle; mutate may change the Config before New. The
// ticker is off unless mutate sets SampleInterval.
func setup(t testing.TB, mutate func(*Config)) *testBundle {
	t.Helper()
	mock := clock.NewMock()
	// Before New: moving a mock clock fires its tickers once per period
	// passed.
	mock.Set(testStart)
	b := &testBundle{t: t, store: openRocks(t), clock: mock}
	cfg := Config{
		Store:          b.store,
		Clock:          mock,
		Logger:         rpctest.Logger(t),
		Prefix:         "/ui",
		SampleInterval: -1,
		OnReady: func(q []string) {
			b.mu.Lock()
			b.woken = append(b.woken, q...)
			b.mu.Unlock()
		},
	}
	if mutate != nil {
		mutate(&cfg)
	}
	ui, err := New(cfg)
	require.NoError(t, err)
	t.Cleanup(ui.Close)
	b.ui, b.h = ui, ui.Handler()
	return b
}

// enqueue adds payloads to queue.
func (b *testBundle) enqueue(queue string, payloads ...string) []storage.ItemID {
	b.t.Helper()
	if max := storage.DefaultLimits.MaxBatch; len(payloads) > max {
		return append(b.enqueue(queue, payloads[:max]...), b.enqueue(queue, payloads[max:]...)...)
	}
	items := make([]storage.EnqueueItem, len(payloads))
	for i, p := range payloads {
		items[i] = storage.EnqueueItem{Payload: []byte(p)}
	}
	res, err := b.store.Enqueue(context.Background(), storage.EnqueueParams{Queue: queue, Items: items, Now: b.clock.Now()})
	require.NoError(b.t, err)
	ids := make([]storage.ItemID, len(res))
	for i, r := range res {
		require.Equal(b.t, storage.CodeOK, r.Code, r.Err)
		ids[i] = r.ID
	}
	return ids
}

// enqueueN adds n items with payloads "item-0".. to queue.
func (b *testBundle) enqueueN(queue string, n int) []storage.ItemID {
	b.t.Helper()
	p := make([]string, n)
	for i := range p {
		p[i] = fmt.Sprintf("item-%d", i)
	}
	return b.enqueue(queue, p...)
}

// kill enqueues payloads into queue and sends them to the dead-letter
// queue: the queue's max attempts is set to 1, and one delivery is nacked
// with reason.
func (b *testBundle) kill(queue, reason string, payloads ...string) []storage.ItemID {
	b.t.Helper()
	ctx := context.Background()
	cfg := storage.DefaultQueueConfig()
	cfg.MaxAttempts = 1
	require.NoError(b.t, b.store.SetQueueConfig(ctx, queue, cfg))
	ids := b.enqueue(queue, payloads...)
	pr, err := b.store.Poll(ctx, storage.PollParams{Queue: queue, Max: len(ids), Now: b.clock.Now()})
	require.NoError(b.t, err)
	require.Len(b.t, pr.Items, len(ids))
	zero := time.Duration(0)
	codes, err := b.store.Nack(ctx, storage.NackParams{Queue: queue, Lease: pr.Lease, IDs: ids, Delay: &zero, Reason: reason, Now: b.clock.Now()})
	require.NoError(b.t, err)
	for _, c := range codes {
		require.Equal(b.t, storage.CodeOK, c)
	}
	return ids
}

// stats returns one queue's stats.
func (b *testBundle) stats(queue string) storage.QueueStats {
	b.t.Helper()
	st, err := b.store.Stats(context.Background(), storage.StatsParams{Queue: queue, Now: b.clock.Now()})
	require.NoError(b.t, err)
	require.Len(b.t, st, 1)
	return st[0]
}

// get serves a GET of target and returns the response and its body.
func (b *testBundle) get(target string) (*http.Response, string) {
	b.t.Helper()
	return b.do(httptest.NewRequest(http.MethodGet, "http://node.test"+target, nil))
}

// post serves a same-origin form POST (as Chromium sends it) of form to
// target.
func (b *testBundle) post(target string, form url.Values) (*http.Response, string) {
	b.t.Helper()
	return b.do(formRequest(target, form, map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://node.test"}))
}

// formRequest builds a form POST to http://node.test+target with headers.
func formRequest(target string, form url.Values, headers map[string]string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "http://node.test"+target, strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range headers {
		r.Header.Set(k, v)
	}
	return r
}

func (b *testBundle) do(r *http.Request) (*http.Response, string) {
	b.t.Helper()
	w := httptest.NewRecorder()
	b.h.ServeHTTP(w, r)
	res := w.Result()
	body, err := io.ReadAll(res.Body)
	require.NoError(b.t, err)
	return res, string(body)
}

// follow serves a GET of a redirect's Location carrying the cookies it set
// (the flash message), as a browser would.
func (b *testBundle) follow(res *http.Response) (*http.Response, string) {
	b.t.Helper()
	require.Equal(b.t, http.StatusSeeOther, res.StatusCode)
	r := httptest.NewRequest(http.MethodGet, "http://node.test"+res.Header.Get("Location"), nil)
	for _, c := range res.Cookies() {
		r.AddCookie(c)
	}
	return b.do(r)
}

// wokenQueues returns the queues passed to OnReady so far.
func (b *testBundle) wokenQueues() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.woken...)
}
