package rocksstore

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/benbjohnson/clock"
	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/sweeper"
)

// Found by review (session 70): a sweep's expiry step gives back a held
// batch claimed ahead whose lease is due (claimed, after the sweep gave
// back the stale ones, by an ack at an instant earlier than the sweep's
// by more than the lease) and counts it against the sweep's limit, but
// as no lease expired. A Sweep whose limit went on such give-backs alone
// reported More with nothing expired, promoted or dropped, and the
// sweeper took that for a stuck store (ErrNoProgress) and backed off,
// leaving the expired lease behind them unreturned until its retry.
func TestSweep_HeldGiveBacksAreProgress(t *testing.T) {
	t.Parallel()
	const held = maxPrefetched
	b, _ := prefetchStore(t)
	// The lease to expire, due after the held batches' leases.
	b.enqueueN("r", at(0), 1)
	expiring := b.poll("r", 1, 2*time.Minute, at(0))
	require.Len(t, expiring.Items, 1)
	// held consumers of a batch of one under a one-minute lease.
	b.enqueueN("q", at(0), 2*held+2)
	var leases []storage.PollResult
	for range held {
		leases = append(leases, b.poll("q", 1, time.Minute, at(0)))
	}
	// Their acks, at the instant of their polls, land in the first Sweep
	// between its give-back of stale batches and its expiry step: each
	// claims the next batch ahead, due a minute after the acks' instant.
	// (On the sweeper's goroutine: errors are kept for the test's.)
	sweeps := 0
	var ackErrs []error
	b.s.afterSweepAhead = func() {
		if sweeps++; sweeps > 1 {
			return
		}
		for _, r := range leases {
			codes, err := b.s.Ack(b.ctx, storage.AckParams{Queue: "q", Lease: r.Lease, IDs: itemIDs(r.Items), Now: at(0)})
			if err == nil && codes[0] != storage.CodeOK {
				err = fmt.Errorf("ack: code %v", codes[0])
			}
			ackErrs = append(ackErrs, err)
		}
	}

	now := at(3 * time.Minute) // every lease is due
	mock := clock.NewMock()
	mock.Set(now)
	type pass struct {
		res storage.SweepResult
		err error
	}
	passes := make(chan pass, 1)
	sw, err := sweeper.New(sweeper.Config{
		Store: b.s, Clock: mock, Logger: slog.New(slog.DiscardHandler), BatchLimit: held,
		TestSignals: sweeper.TestSignals{PassDone: func(res storage.SweepResult, err error) {
			select {
			case passes <- pass{res, err}:
			default: // only the first pass is looked at
			}
		}},
	})
	require.NoError(t, err)
	require.NoError(t, sw.Start(context.Background()))
	first := <-passes
	sw.Stop()
	for _, err := range ackErrs {
		require.NoError(t, err)
	}
	require.Len(t, ackErrs, held)
	require.EqualValues(t, held, b.s.Metrics().Prefetched, "batches claimed ahead")
	require.NoError(t, first.err, "the first pass")
	require.Equal(t, 1, first.res.LeasesExpired, "the first pass expires the lease behind the held batches")
	require.Equal(t, []string{"q", "r"}, first.res.ReadyQueues)
	require.Equal(t, int64(1), b.stats("r", now).Ready, "the expired lease's item is ready again")
	require.Equal(t, int64(2*held+2-held), b.stats("q", now).Ready, "the held batches are given back")
}
