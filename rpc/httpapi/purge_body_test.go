package httpapi

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// TestPurge_RefusesABody: DELETE .../items takes no body: one such as the
// {ids} that DELETE .../dlq reads is refused (400), as unknown fields are,
// not ignored into a purge of every live item (found by review).
func TestPurge_RefusesABody(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ids := b.enqueueTexts("q", "keep", "drop")
	st, raw := b.request(http.MethodDelete, "/v1/queues/q/items", "application/json", SettleRequest{IDs: ids[1:]})
	s, err := b.store.Stats(context.Background(), storage.StatsParams{Queue: "q", Now: b.clock.Now()})
	require.NoError(t, err)
	require.EqualValues(t, 2, s[0].Ready, "a DELETE with {ids} purged the whole queue: %d %s", st, raw)
	require.Equal(t, http.StatusBadRequest, st, "%s", raw)
}
