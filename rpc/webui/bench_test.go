package webui

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// benchQueues is the node size the dashboard's pages are measured at.
const benchQueues = 1000

// benchSetup builds a UI over a RocksDB store holding benchQueues queues,
// each with a few ready items and one dead one, and rate samples a minute
// apart, so every column of the queue list has something to format.
func benchSetup(b *testing.B) *testBundle {
	b.Helper()
	tb := setup(b, nil)
	ctx := context.Background()
	for i := range benchQueues {
		q := fmt.Sprintf("queue-%04d", i)
		tb.kill(q, "handler failed", `{"n":0}`)
		require.NoError(b, tb.store.SetQueueConfig(ctx, q, storage.DefaultQueueConfig()))
		tb.enqueue(q, `{"n":1}`, `{"n":2}`, `{"n":3}`)
	}
	_, _ = tb.get("/ui/")
	for i := range benchQueues {
		tb.enqueue(fmt.Sprintf("queue-%04d", i), `{"n":4}`)
	}
	tb.clock.Add(time.Minute)
	return tb
}

// benchPage serves GET target b.N times and reports the page size.
func benchPage(b *testing.B, tb *testBundle, target string, want string) {
	b.Helper()
	res, body := tb.get(target)
	require.Equal(b, http.StatusOK, res.StatusCode)
	require.Contains(b, body, want)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		w := httptest.NewRecorder()
		tb.h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://node.test"+target, nil))
		if w.Code != http.StatusOK {
			b.Fatalf("status %d", w.Code)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(len(body))/1024, "KiB/page")
}

// BenchmarkQueueList renders the queue list of a node with 1,000 queues:
// one Store.Stats call for all of them, the rate rings, the template. The
// target is well under 50 ms per page.
func BenchmarkQueueList(b *testing.B) {
	tb := benchSetup(b)
	benchPage(b, tb, "/ui/", "queue-0999")
}

// BenchmarkQueuePage renders one queue's page (a Peek of 50 items) on the
// same node.
func BenchmarkQueuePage(b *testing.B) {
	tb := benchSetup(b)
	benchPage(b, tb, "/ui/queues/queue-0500", "queue-0500")
}

// BenchmarkDeadPage renders one queue's dead-letter page on the same node.
func BenchmarkDeadPage(b *testing.B) {
	tb := benchSetup(b)
	benchPage(b, tb, "/ui/queues/queue-0500/dead", "nack: handler failed")
}
