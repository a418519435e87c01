package main

import (
	"io"
	"log/slog"
	"os"
	"runtime"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// Review tests (session 74) of serve's startup watch (startupWatch):
// checked right, kept as proof of the edges.

// TestReviewServe74_StartupWatchLosesNoSignal: a signal taken by the
// watch is reported by end (serve then shuts down without waiting); one
// that comes once end has returned stays in the channel for
// awaitShutdown. Either way no signal is lost, and end returns once the
// watch's goroutine is gone, also when called again (serve's defer).
func TestReviewServe74_StartupWatchLosesNoSignal(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	exited := make(chan int, 1)
	e := &env{exit: func(code int) { exited <- code }}

	// Taken during startup: reported by signal() and end().
	sigs := make(chan os.Signal, 2)
	w := watchStartup(e, sigs, log)
	sigs <- syscall.SIGTERM
	for w.signal() == nil {
		// The watch takes it on its own goroutine.
		select {
		case code := <-exited:
			t.Fatalf("exit %d on a first signal", code)
		default:
		}
		runtimeGosched()
	}
	require.Equal(t, syscall.SIGTERM, w.end())
	require.Equal(t, syscall.SIGTERM, w.end(), "end may be called again")
	require.Empty(t, exited)

	// After end: left for awaitShutdown.
	sigs2 := make(chan os.Signal, 2)
	w2 := watchStartup(e, sigs2, log)
	require.Nil(t, w2.end())
	sigs2 <- syscall.SIGINT
	require.Len(t, sigs2, 1, "a signal after the watch ended is awaitShutdown's")
	require.Nil(t, w2.signal())
	require.Empty(t, exited)
}

// TestReviewServe74_SecondStartupSignalExits: a second signal while the
// startup stops (the undo under way) exits at once, with exitFailure.
func TestReviewServe74_SecondStartupSignalExits(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	exited := make(chan int, 1)
	e := &env{exit: func(code int) { exited <- code }}
	sigs := make(chan os.Signal, 2)
	w := watchStartup(e, sigs, log)
	sigs <- syscall.SIGTERM
	sigs <- syscall.SIGINT
	require.Equal(t, exitFailure, <-exited)
	require.Equal(t, syscall.SIGTERM, w.end())
}

func runtimeGosched() { runtime.Gosched() }
