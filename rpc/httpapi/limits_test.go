package httpapi

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// A node run with --max-batch under DefaultPageLimit (100): a listing or
// redrive that names no limit takes MaxBatch (found by review, session 70:
// the store refused them, "limit must be 1-50, got 100").
func TestLimits_DefaultPageLimitOverMaxBatch(t *testing.T) {
	lim := storage.Limits{MaxBatch: 50}
	s, err := rocksstore.Open(t.TempDir(), rocksstore.Options{Sync: rocksstore.SyncNone, Limits: lim})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	b := setup(t, func(c *Config) { c.Store, c.Limits = s, lim })
	b.store = s
	b.enqueueTexts("q", "a", "b")
	var page PageResponse
	b.call(http.MethodGet, "/v1/queues/q/items", nil, &page)
	require.Len(t, page.Items, 2)
	b.call(http.MethodGet, "/v1/queues/q/dlq", nil, &page)
	require.Empty(t, page.Items)
	var dr DeadResponse
	b.call(http.MethodPost, "/v1/queues/q/dlq/redrive", DeadRequest{All: true}, &dr)
}
