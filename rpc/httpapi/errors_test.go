package httpapi

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/errcode"
	"github.com/leaseq/leaseq/storage"
)

// TestHTTP_EveryCodeHasAStatus: every code of the shared table has an HTTP
// status, and only internal is 500.
func TestHTTP_EveryCodeHasAStatus(t *testing.T) {
	t.Parallel()
	for _, c := range errcode.All() {
		st, ok := statusOf[c]
		require.True(t, ok, "%v has no HTTP status", c)
		require.Equal(t, c == errcode.Internal, st == http.StatusInternalServerError, "%v", c)
	}
	require.Len(t, statusOf, len(errcode.All()))
}

func TestHTTP_BadRequests(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *Config) { c.MaxBodyBytes = 1000 })
	b.enqueueTexts("q", "x")
	p := b.poll("q", PollRequest{})
	lease, id := p.Lease, p.Items[0].ID
	const j = "application/json"
	for _, tc := range []struct {
		name               string
		method, path, ct   string
		body               any
		status             int
		code, msgSubstring string
	}{
		{"BadQueueName", "POST", "/v1/queues/a%20b/items", j, `[]`, 400, "invalidArgument", `queue name "a b": byte 1`},
		{"QueueNameTooLong", "GET", "/v1/queues/" + strings.Repeat("q", 201), "", nil, 400, "invalidArgument", "queue name must be 1-200 bytes, got 201"},
		{"DotQueue", "GET", "/v1/queues/%2E%2E/items", "", nil, 400, "invalidArgument", "is reserved"},
		{"SlashInQueue", "DELETE", "/v1/queues/a%2Fb/items", "", nil, 400, "invalidArgument", "is not in [A-Za-z0-9._-]"},
		{"BadJSON", "POST", "/v1/queues/q/poll", j, `{"max": `, 400, "invalidArgument", "request body: unexpected EOF"},
		{"WrongJSONType", "POST", "/v1/queues/q/poll", j, `{"max": "ten"}`, 400, "invalidArgument", "cannot unmarshal string"},
		{"UnknownField", "POST", "/v1/queues/q/poll", j, `{"wait": 10}`, 400, "invalidArgument", `unknown field "wait"`},
		{"TrailingData", "POST", "/v1/queues/q/poll", j, `{} {}`, 400, "invalidArgument", "more data after the JSON value"},
		{"EnqueueNotAnArray", "POST", "/v1/queues/q/items", j, `{"text": "x"}`, 400, "invalidArgument", "want a JSON array of items"},
		{"EnqueueEmptyBody", "POST", "/v1/queues/q/items", j, nil, 400, "invalidArgument", "want a JSON array of items"},
		{"UnknownItemField", "POST", "/v1/queues/q/items", j, `[{"txt": "x"}]`, 400, "invalidArgument", `unknown field "txt"`},
		{"IDTooShort", "POST", "/v1/queues/q/ack", j, SettleRequest{Lease: lease, IDs: []string{id, "abcd"}}, 400, "invalidArgument", `ids[1]: storage: invalid argument: item id "abcd": want 32 hex digits, got 4 characters`},
		{"IDNotHex", "POST", "/v1/queues/q/nack", j, SettleRequest{Lease: lease, IDs: []string{strings.Repeat("z", 32)}}, 400, "invalidArgument", "ids[0]"},
		{"LeaseMissing", "POST", "/v1/queues/q/ack", j, SettleRequest{IDs: []string{id}}, 400, "invalidArgument", `lease "": want 32 hex digits`},
		{"LeaseTooLong", "POST", "/v1/queues/q/extend", j, SettleRequest{Lease: lease + "00", LeaseMs: 1000}, 400, "invalidArgument", "got 34 characters"},
		{"FormContentType", "POST", "/v1/queues/q/poll", "application/x-www-form-urlencoded", `{}`, 415, "invalidArgument", "Content-Type application/x-www-form-urlencoded: want application/json"},
		{"NoContentType", "POST", "/v1/queues/q/ack", "", `{}`, 415, "invalidArgument", "Content-Type none: want application/json"},
		{"BadContentType", "POST", "/v1/queues/q/ack", "application/", `{}`, 415, "invalidArgument", "Content-Type"},
		{"TextOnEnqueue", "POST", "/v1/queues/q/items", "text/plain", "hi", 415, "invalidArgument", "want application/json or application/octet-stream"},
		{"BodyTooLarge", "POST", "/v1/queues/q/items", j, `[{"text": "` + strings.Repeat("x", 1000) + `"}]`, 413, "invalidArgument", "request body exceeds the limit of 1000 bytes"},
		{"RawBodyTooLarge", "POST", "/v1/queues/q/items", "application/octet-stream", strings.Repeat("x", 1001), 413, "invalidArgument", "exceeds the limit of 1000 bytes"},
		{"UnknownQuery", "GET", "/v1/queues?verbose=1", "", nil, 400, "invalidArgument", `unknown query parameter "verbose" (this route takes none)`},
		{"FieldTwice", "POST", "/v1/queues/q/poll", j, `{"max": 1, "max": 1000}`, 400, "invalidArgument", `request body: field "max" given twice`},
		{"FieldTwiceOtherCase", "POST", "/v1/queues/q/poll", j, `{"max": 1, "MAX": 1000}`, 400, "invalidArgument", `field "MAX" given twice`},
		{"ItemFieldTwice", "POST", "/v1/queues/q/items", j, `[{"text": "a"}, {"text": "b", "priority": 1, "priority": 9}]`, 400, "invalidArgument", `field "priority" given twice`},
		{"QueryTwice", "GET", "/v1/queues/q/items?limit=1&limit=1000", "", nil, 400, "invalidArgument", `query parameter "limit" given 2 times`},
		{"RawQueryTwice", "POST", "/v1/queues/q/items?priority=1&priority=9", "application/octet-stream", "x", 400, "invalidArgument", `query parameter "priority" given 2 times`},
		{"MethodNotAllowed", "PATCH", "/v1/queues/q/config", "", nil, 405, "invalidArgument", "method PATCH not allowed on /v1/queues/q/config (allowed: PUT)"},
		{"NoRoute", "GET", "/v1/frobs", "", nil, 404, "notFound", "no route GET /v1/frobs"},
		{"TrailingSlash", "GET", "/v1/queues/q/", "", nil, 404, "notFound", "no route"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b.fails(tc.method, tc.path, tc.ct, tc.body, tc.status, tc.code, tc.msgSubstring)
		})
	}

	t.Run("AllowHeader", func(t *testing.T) {
		t.Parallel()
		resp, err := b.send(context.Background(), http.MethodPut, "/v1/queues/q/items", "", nil)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
		require.Equal(t, "GET, POST, DELETE", resp.Header.Get("Allow"))
	})

	t.Run("ChunkedBodyTooLarge", func(t *testing.T) {
		t.Parallel()
		// No Content-Length: the limit is found while reading.
		req, err := http.NewRequest(http.MethodPost, b.url+"/v1/queues/q/items", io.MultiReader(strings.NewReader(`[{"text":"`), strings.NewReader(strings.Repeat("y", 2000))))
		require.NoError(t, err)
		req.Header.Set("Content-Type", j)
		require.Zero(t, req.ContentLength, "unknown: sent chunked")
		resp, err := b.client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		requireError(t, resp.StatusCode, raw, 413, "invalidArgument", "request body exceeds the limit of 1000 bytes")
	})

	t.Run("ChunkedBodyWithinLimit", func(t *testing.T) {
		t.Parallel()
		req, err := http.NewRequest(http.MethodPost, b.url+"/v1/queues/chunked/items", io.MultiReader(strings.NewReader(`[{"text":`), strings.NewReader(`"ok"}]`)))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json; charset=utf-8")
		resp, err := b.client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
		require.Contains(t, string(raw), `"code":"ok"`)
	})
}

// failingStore fails chosen calls the way a stopped or broken store does.
type failingStore struct {
	storage.Store
	err error
}

func (f failingStore) Enqueue(context.Context, storage.EnqueueParams) ([]storage.EnqueueResult, error) {
	return nil, f.err
}

func (f failingStore) Stats(context.Context, storage.StatsParams) ([]storage.QueueStats, error) {
	return nil, f.err
}

func TestHTTP_StoreFailures(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		err    error
		status int
		code   string
		msg    string
		hidden string
	}{
		{"Closed", storage.ErrClosed, 503, "unavailable", "storage: closed", ""},
		{"Failed", errors.Join(storage.ErrUnavailable, errors.New("rocksstore: write failed: no space")), 503, "unavailable", "storage: unavailable", ""},
		{"NoSpace", storage.ErrNoSpace, 503, "unavailable", "not enough free disk space", ""},
		{"Corrupt", errors.Join(storage.ErrCorrupt, errors.New("/srv/data/000123.sst: bad block")), 500, "internal", "corrupt data (the node logged the cause as ref=", "/srv/data"},
		{"Unexpected", errors.New("rocksdb: IO error: /srv/data/LOCK"), 500, "internal", "rpc: internal error (the node logged the cause as ref=", "/srv/data"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, func(c *Config) { c.Store = failingStore{Store: c.Store, err: tc.err} })
			status, raw := b.request(http.MethodPost, "/v1/queues/q/items", "application/json", `[{"text":"x"}]`)
			requireError(t, status, raw, tc.status, tc.code, tc.msg)
			if tc.hidden != "" {
				require.NotContains(t, string(raw), tc.hidden, "the cause stays in the log")
			}
			resp, err := b.send(context.Background(), http.MethodGet, "/v1/queues", "", nil)
			require.NoError(t, err)
			defer resp.Body.Close()
			require.Equal(t, tc.status, resp.StatusCode)
			if tc.status == 503 {
				require.Equal(t, "1", resp.Header.Get("Retry-After"))
			}
		})
	}

	t.Run("StoreClosedUnderTheServer", func(t *testing.T) {
		t.Parallel()
		b := setup(t, nil)
		b.enqueueTexts("q", "x")
		require.NoError(t, b.store.Close())
		b.fails(http.MethodPost, "/v1/queues/q/poll", "", nil, 503, "unavailable", "closed")
		b.fails(http.MethodGet, "/v1/queues/q", "", nil, 503, "unavailable", "closed")
	})
}

func TestDecodeStrict(t *testing.T) {
	t.Parallel()
	var v struct{ A int }
	require.NoError(t, decodeStrict([]byte(` {"A": 1} `), &v))
	require.Equal(t, 1, v.A)
	require.ErrorIs(t, decodeStrict([]byte(`{"A": 1}x`), &v), storage.ErrInvalidArgument)
	require.ErrorIs(t, decodeStrict([]byte(`{"B": 1}`), &v), storage.ErrInvalidArgument)
	require.ErrorIs(t, decodeStrict(bytes.Repeat([]byte("["), 10), &v), storage.ErrInvalidArgument)
	// A name given once per object is fine however often it recurs in
	// others, and strings that are values are not names.
	var items []struct{ Text, Dedup string }
	require.NoError(t, decodeStrict([]byte(`[{"Text": "Text", "Dedup": "Text"}, {"Text": "Dedup"}, {}]`), &items))
	require.Len(t, items, 3)
	var nested struct{ A, B struct{ C []struct{ C int } } }
	require.NoError(t, decodeStrict([]byte(`{"A": {"C": [{"C": 1}, {"C": 2}]}, "B": {"C": []}}`), &nested))
	require.ErrorContains(t, decodeStrict([]byte(`{"A": {"C": [{"C": 1, "C": 2}]}}`), &nested), `field "C" given twice`)
	require.ErrorContains(t, decodeStrict([]byte(`{"A": {}, "B": {}, "a": {}}`), &nested), `field "a" given twice`)
	require.Equal(t, "a or b", joinOr([]string{"a", "b"}))
	require.Equal(t, "a, b or c", joinOr([]string{"a", "b", "c"}))
}
