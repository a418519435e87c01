package httpapi

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/benbjohnson/clock"
)

// bodyStallTimeout: a request body that makes no progress for this long,
// on the injected clock, ends its request, which gives back what it held
// of the in-flight budget. Found by review (session 69): a body announced
// by Content-Length and never sent held its length of the budget (shared
// with the RPC server's messages) until net/http's ReadTimeout, minutes
// of wall time, and every other body waited. The RPC server's rule
// (FirstMessageTimeout's default).
const bodyStallTimeout = 10 * time.Second

// bodyWatch watches one request's body while it is read.
type bodyWatch struct {
	mu   sync.Mutex
	t    *clock.Timer
	read atomic.Int64 // bytes read so far
	last int64        // read when last looked at
	done bool
}

// watchBody starts watching c's body; stop ends it. When the body stalls
// it sets the connection's read deadline to now, on the injected clock
// (the past, for a test's mock clock), so that the read waiting for the
// body fails.
func (c *call) watchBody() *bodyWatch {
	w := &bodyWatch{}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t = c.s.cfg.Clock.AfterFunc(bodyStallTimeout, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.done {
			return
		}
		if n := w.read.Load(); n != w.last {
			w.last = n
			w.t.Reset(bodyStallTimeout)
			return
		}
		w.done = true
		c.s.log.Debug("request body stalled; ending the request", "remote", c.r.RemoteAddr, "timeout", bodyStallTimeout)
		_ = http.NewResponseController(c.w).SetReadDeadline(c.s.cfg.Clock.Now())
	})
	return w
}

func (w *bodyWatch) stop() {
	w.mu.Lock()
	w.done = true
	w.t.Stop()
	w.mu.Unlock()
}
