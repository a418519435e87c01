package httpapi

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHTTP_QueuesStatsConfig(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var qs QueuesResponse
	b.call(http.MethodGet, "/v1/queues", nil, &qs)
	require.Empty(t, qs.Queues)
	require.NotNil(t, qs.Queues, "an empty list, not null")

	b.enqueueTexts("b", "x")
	b.enqueueTexts("a", "y", "z")
	b.call(http.MethodGet, "/v1/queues", nil, &qs)
	require.Len(t, qs.Queues, 2)
	require.Equal(t, "a", qs.Queues[0].Queue)
	require.EqualValues(t, 2, qs.Queues[0].Ready)
	require.Equal(t, QueueConfig{MaxAttempts: 5, LeaseMs: 30000, DedupWindowMs: 300000, BackoffBaseMs: 500, BackoffMaxMs: 30000}, qs.Queues[0].Config)

	// PUT changes the fields given and keeps the others.
	var c QueueConfig
	b.call(http.MethodPut, "/v1/queues/a/config", ConfigUpdate{MaxAttempts: ptr[int64](2), LeaseMs: ptr[int64](60000)}, &c)
	require.Equal(t, QueueConfig{MaxAttempts: 2, LeaseMs: 60000, DedupWindowMs: 300000, BackoffBaseMs: 500, BackoffMaxMs: 30000}, c)
	var st QueueStats
	b.call(http.MethodGet, "/v1/queues/a", nil, &st)
	require.Equal(t, c, st.Config)
	// A queue that does not exist yet is created with the defaults and the change.
	b.call(http.MethodPut, "/v1/queues/new/config", ConfigUpdate{BackoffMaxMs: ptr[int64](1000), BackoffBaseMs: ptr[int64](10)}, &c)
	require.Equal(t, QueueConfig{MaxAttempts: 5, LeaseMs: 30000, DedupWindowMs: 300000, BackoffBaseMs: 10, BackoffMaxMs: 1000}, c)
	b.call(http.MethodGet, "/v1/queues/new", nil, &st)
	require.Equal(t, "new", st.Queue)

	b.fails(http.MethodGet, "/v1/queues/nope", "", nil, 404, "notFound", "not found")
	b.fails(http.MethodPut, "/v1/queues/a/config", "application/json", ConfigUpdate{MaxAttempts: ptr[int64](0)}, 400, "invalidArgument", "max_attempts must be >= 1")
	b.fails(http.MethodPut, "/v1/queues/a/config", "application/json", ConfigUpdate{LeaseMs: ptr[int64](10)}, 400, "invalidArgument", "default lease 10ms outside")
	b.fails(http.MethodPut, "/v1/queues/a/config", "application/json", ConfigUpdate{MaxAttempts: ptr[int64](1 << 40)}, 400, "invalidArgument", "max_attempts 1099511627776 outside")
	b.fails(http.MethodPut, "/v1/queues/a/config", "application/json", `{"max_attempt": 3}`, 400, "invalidArgument", `unknown field "max_attempt"`)
}

func TestHTTP_PeekPagesPurge(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ids := b.enqueueTexts("q", "1", "2", "3", "4", "5")
	p := b.poll("q", PollRequest{Max: ptr[int64](2)})

	var page PageResponse
	b.call(http.MethodGet, "/v1/queues/q/items?limit=2", nil, &page)
	require.Equal(t, []string{ids[2], ids[3]}, []string{page.Items[0].ID, page.Items[1].ID})
	require.Equal(t, ids[3], page.NextAfter)
	b.call(http.MethodGet, "/v1/queues/q/items?limit=2&after="+page.NextAfter, nil, &page)
	require.Len(t, page.Items, 1)
	require.Equal(t, ids[4], page.Items[0].ID)
	require.Empty(t, page.NextAfter, "a page that is not full is the last")
	b.call(http.MethodGet, "/v1/queues/q/items?state=inflight", nil, &page)
	require.Len(t, page.Items, 2)
	require.Equal(t, "inflight", page.Items[0].State)
	require.Equal(t, p.Items[0].ID, page.Items[0].ID)
	b.call(http.MethodGet, "/v1/queues/nope/items", nil, &page)
	require.Empty(t, page.Items, "peeking at a queue that does not exist shows nothing")

	b.fails(http.MethodGet, "/v1/queues/q/items?state=dead", "", nil, 400, "invalidArgument", "want ready")
	b.fails(http.MethodGet, "/v1/queues/q/items?after=xyz", "", nil, 400, "invalidArgument", "after: storage: invalid argument: item id")
	b.fails(http.MethodGet, "/v1/queues/q/items?limit=0x10", "", nil, 400, "invalidArgument", "want an integer")
	b.fails(http.MethodGet, "/v1/queues/q/items?limit=-1", "", nil, 400, "invalidArgument", "limit must be 1-1000")
	b.fails(http.MethodGet, "/v1/queues/q/dlq?limit=5000", "", nil, 400, "invalidArgument", "limit must be 1-1000")

	var pr PurgeResponse
	b.call(http.MethodDelete, "/v1/queues/q/items", nil, &pr)
	require.Equal(t, 5, pr.Purged)
	b.call(http.MethodGet, "/v1/queues/q/items", nil, &page)
	require.Empty(t, page.Items)
}

func TestHTTP_DeleteQueue(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.enqueueTexts("q", "1", "2")
	b.fails(http.MethodDelete, "/v1/queues/q", "", nil, http.StatusConflict, "notEmpty", "queue not empty")
	b.fails(http.MethodDelete, "/v1/queues/q?force=yes", "", nil, http.StatusBadRequest, "invalidArgument", "want true or false")
	b.fails(http.MethodDelete, "/v1/queues/q?forse=true", "", nil, http.StatusBadRequest, "invalidArgument", "unknown query parameter")
	var dr DeleteQueueResponse
	b.call(http.MethodDelete, "/v1/queues/q?force=true", nil, &dr)
	require.Equal(t, 2, dr.Deleted)
	var qs QueuesResponse
	b.call(http.MethodGet, "/v1/queues", nil, &qs)
	require.Empty(t, qs.Queues)
	b.fails(http.MethodDelete, "/v1/queues/q", "", nil, http.StatusNotFound, "notFound", "not found")
}
