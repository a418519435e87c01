package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/leaseq/leaseq/bench/target"
)

// errNoRoundTrip is returned by the roundtrip row for a system whose
// client has no call without queue work (target.Pinger): the row is left
// out for that system rather than reported as failed.
var errNoRoundTrip = errors.New("no call without queue work to time (in-process systems have no wire; beanstalkd has no such command)")

// roundTripWarmup is how many calls run before the measured window: the
// connection, buffers and the server's first calls.
const roundTripWarmup = 100

// roundTripOut is what the roundtrip row measured.
type roundTripOut struct {
	calls       int64
	window      time.Duration
	lat         *hdrhistogram.Histogram
	interrupted bool // a drain request ended the window early
}

// runRoundTrip makes calls that do no queue work (nodeInfo, PING) one at
// a time from one client for d, or until a drain request: the cost of the
// wire and of the server's connection handling per call, with no store
// behind it. The server's CPU per call is the row's CPU per item.
func runRoundTrip(ctx context.Context, e *env, in target.Instance, d time.Duration) (roundTripOut, error) {
	var out roundTripOut
	c, err := in.Connect(ctx)
	if err != nil {
		return out, err
	}
	p, ok := c.(target.Pinger)
	if !ok {
		return out, errors.Join(errNoRoundTrip, c.Close())
	}
	for range roundTripWarmup {
		if err := p.Ping(ctx); err != nil {
			return out, errors.Join(fmt.Errorf("warm-up: %w", err), c.Close())
		}
	}
	out.lat = newHist()
	start := e.clk.Now()
	end := start.Add(d)
	for t := start; t.Before(end); t = e.clk.Now() {
		if out.calls%256 == 0 && drainRequested(e.drain) {
			out.interrupted = true // stop now; the window is what ran
			break
		}
		if err := p.Ping(ctx); err != nil {
			out.window = e.clk.Since(start)
			return out, errors.Join(err, c.Close())
		}
		recordDur(out.lat, e.clk.Since(t))
		out.calls++
	}
	out.window = e.clk.Since(start)
	return out, c.Close()
}

// drainRequested reports, without waiting, whether drain is closed.
// untilDrained returns ctx ended also by a drain request, for the
// workloads that have no window to end early (drain, storm): they stop
// where they are, and their row is reported interrupted. stop releases
// the watch.
func untilDrained(ctx context.Context, drain <-chan struct{}) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-drain:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func drainRequested(drain <-chan struct{}) bool {
	select {
	case <-drain:
		return true
	default:
		return false
	}
}
