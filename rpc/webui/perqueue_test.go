package webui

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// Short-lived per-job queues seen by the queue list: the rate rings of
// deleted queues are dropped at the next list, and the queue pages of
// deleted queues keep nothing.
func TestPerQueue_RatesForgetDeletedQueues(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	b.enqueueN("keep", 1)
	res, _ := b.get("/ui/")
	require.Equal(t, http.StatusOK, res.StatusCode)
	base := b.ui.rates.tracked()
	for round := 0; round < 10; round++ {
		var names []string
		for k := 0; k < 200; k++ {
			q := fmt.Sprintf("job-%d-%d", round, k)
			names = append(names, q)
			b.enqueueN(q, 1)
		}
		res, _ := b.get("/ui/")
		require.Equal(t, http.StatusOK, res.StatusCode)
		res, _ = b.get("/ui/queues/" + names[0])
		require.Equal(t, http.StatusOK, res.StatusCode)
		b.clock.Add(time.Second)
		for _, q := range names {
			_, err := b.store.DeleteQueue(context.Background(), storage.DeleteQueueParams{Queue: q, Force: true, Now: b.clock.Now()})
			require.NoError(t, err)
		}
		// A deleted queue's own page, too.
		b.get("/ui/queues/" + names[1])
	}
	res, _ = b.get("/ui/")
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.Equal(t, base, b.ui.rates.tracked())
}
