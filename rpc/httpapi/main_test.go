package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"reflect"
	"strings"
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

// testStart is the mock clock's starting instant.
var testStart = time.Date(2026, 11, 22, 1, 0, 0, 0, time.UTC)

// testBundle is one API server on a real RocksDB store and a real
// loopback listener, and a client for it.
type testBundle struct {
	t      *testing.T
	store  storage.Store
	clock  *clock.Mock
	srv    *Server
	url    string
	client *http.Client
}

// openRocks opens RocksDB with sync=none, or with sync=always (the
// node's default, where an enqueue claims for parked polls in its own
// commit) when LEASEQ_RPC_TEST_STORE=rocks; `make test` runs both.
func openRocks(t *testing.T) storage.Store {
	t.Helper()
	sync := rocksstore.SyncNone
	if os.Getenv("LEASEQ_RPC_TEST_STORE") == "rocks" {
		sync = rocksstore.SyncAlways
	}
	s, err := rocksstore.Open(t.TempDir(), rocksstore.Options{Sync: sync})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// setup starts a server; mutate may change its Config first.
func setup(t *testing.T, mutate func(*Config)) *testBundle {
	t.Helper()
	return setupWith(t, mutate, nil)
}

// setupWith is setup that lets before change the Server before it starts.
func setupWith(t *testing.T, mutate func(*Config), before func(*Server)) *testBundle {
	t.Helper()
	mock := clock.NewMock()
	mock.Set(testStart)
	b := &testBundle{t: t, store: openRocks(t), clock: mock}
	cfg := Config{Store: b.store, Clock: mock, Logger: rpctest.Logger(t)}
	if mutate != nil {
		mutate(&cfg)
	}
	srv, err := New(cfg)
	require.NoError(t, err)
	b.srv = srv
	t.Cleanup(srv.Stop)
	if before != nil {
		before(srv)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, srv.Start(context.Background(), ln))
	b.url = "http://" + ln.Addr().String()
	tr := &http.Transport{}
	b.client = &http.Client{Transport: tr, Timeout: time.Minute}
	t.Cleanup(tr.CloseIdleConnections)
	return b
}

// request sends body (a string or []byte as is, anything else as JSON)
// with content type ct ("" for none) and returns the status and body.
func (b *testBundle) request(method, path, ct string, body any) (int, []byte) {
	b.t.Helper()
	resp, err := b.send(context.Background(), method, path, ct, body)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	if resp.StatusCode == http.StatusOK {
		require.Equal(b.t, "application/json", resp.Header.Get("Content-Type"))
	}
	return resp.StatusCode, raw
}

func (b *testBundle) send(ctx context.Context, method, path, ct string, body any) (*http.Response, error) {
	var rd io.Reader
	switch v := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(v)
	case []byte:
		rd = bytes.NewReader(v)
	default:
		raw, err := json.Marshal(v)
		require.NoError(b.t, err)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, b.url+path, rd)
	require.NoError(b.t, err)
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	return b.client.Do(req)
}

// call sends a JSON body (nil: none), requires 200, and decodes the
// answer into out (nil: ignored).
func (b *testBundle) call(method, path string, body, out any) {
	b.t.Helper()
	ct := ""
	if body != nil {
		ct = "application/json"
	}
	status, raw := b.request(method, path, ct, body)
	require.Equal(b.t, http.StatusOK, status, "%s %s: %s", method, path, raw)
	if out != nil {
		reflect.ValueOf(out).Elem().SetZero() // fields absent from the answer stay zero
		require.NoError(b.t, json.Unmarshal(raw, out), "%s", raw)
	}
}

// fails sends a request and requires the error answer status/code, with
// msg in its message.
func (b *testBundle) fails(method, path, ct string, body any, status int, code, msg string) {
	b.t.Helper()
	got, raw := b.request(method, path, ct, body)
	requireError(b.t, got, raw, status, code, msg)
}

func requireError(t *testing.T, gotStatus int, raw []byte, status int, code, msg string) {
	t.Helper()
	require.Equal(t, status, gotStatus, "%s", raw)
	var e ErrorBody
	require.NoError(t, json.Unmarshal(raw, &e), "%s", raw)
	require.Equal(t, code, e.Error.Code, "%s", raw)
	require.Contains(t, e.Error.Message, msg)
}

// enqueueTexts enqueues text payloads to queue and returns their ids.
func (b *testBundle) enqueueTexts(queue string, texts ...string) []string {
	b.t.Helper()
	items := make([]EnqueueItem, len(texts))
	for i := range texts {
		items[i].Text = &texts[i]
	}
	var res EnqueueResponse
	b.call(http.MethodPost, "/v1/queues/"+queue+"/items", items, &res)
	ids := make([]string, len(res.IDs))
	for i, id := range res.IDs {
		require.NotNil(b.t, id, "item %d: %+v", i, res.Results[i])
		ids[i] = *id
	}
	return ids
}

func (b *testBundle) poll(queue string, req PollRequest) PollResponse {
	b.t.Helper()
	var res PollResponse
	b.call(http.MethodPost, "/v1/queues/"+queue+"/poll", req, &res)
	return res
}

func ptr[T any](v T) *T { return &v }
