package main

import (
	"context"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestServe_CheckConfigIsCommandLineOnly: a LEASEQ_CHECK_CONFIG left in
// the environment (set once to validate a deployment) turned every later
// `leaseq serve` into a dry run that printed the settings and exited 0
// without opening the store or listening, so a service manager saw a
// clean exit and the node never ran. --check-config is a mode switch, not
// a connection or output setting, and is command line only, like --all
// and --force (found by review).
func TestServe_CheckConfigIsCommandLineOnly(t *testing.T) {
	dir := t.TempDir()
	te := newTestEnv(map[string]string{"LEASEQ_CHECK_CONFIG": "true", "LEASEQ_SYNC": "none"})
	// With the variable taken as the flag, serve printed its settings
	// and exited 0 without handling signals.
	codes, sigc := startServeUnix(t, te, dir)
	sigc <- syscall.SIGINT
	select {
	case <-codes:
	case <-time.After(time.Minute):
		t.Fatal("serve did not stop")
	}
}

// TestServe_EnvConflictNamesTheVariable: serve's conflict checks
// (serveFlags.check) refuse a value that parseArgs took from a LEASEQ_*
// variable as they refuse the flag, and blamed the flag: with
// LEASEQ_SYNC=none exported, `leaseq serve --backend fdb` said "--sync
// applies to --backend=rocksdb only" though no --sync was typed, and
// nothing named the variable. The error names it now (found by review).
func TestServe_EnvConflictNamesTheVariable(t *testing.T) {
	for _, c := range []struct {
		vars map[string]string
		args []string
		name string
	}{
		{map[string]string{"LEASEQ_SYNC": "none"}, []string{"--backend", "fdb"}, "LEASEQ_SYNC"},
		{map[string]string{"LEASEQ_PREFETCH_HOLD": "0"}, []string{"--backend", "fdb"}, "LEASEQ_PREFETCH_HOLD"},
		{map[string]string{"LEASEQ_SOCKET_MODE": "0600"}, []string{"--listen", "127.0.0.1:0"}, "LEASEQ_SOCKET_MODE"},
	} {
		te := newTestEnv(c.vars)
		args := append([]string{"serve", "--check-config", "--data", filepath.Join(t.TempDir(), "d")}, c.args...)
		code := run(context.Background(), args, &te.env)
		if code == exitOK || !strings.Contains(te.errOut.String(), c.name+" (from the environment) applies to") {
			t.Errorf("%v with %v: exit %d, and the error does not name %s, the setting that caused it: %s",
				args, c.vars, code, c.name, te.errOut)
		}
		// The flag itself is still named as the flag.
		te = newTestEnv(nil)
		flagName := "--" + strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(c.name, "LEASEQ_"), "_", "-"))
		val := c.vars[c.name]
		code = run(context.Background(), append(args, flagName, val), &te.env)
		if code == exitOK || !strings.Contains(te.errOut.String(), flagName+" applies to") {
			t.Errorf("%v %s %s: exit %d: %s", args, flagName, val, code, te.errOut)
		}
	}
}

// TestServe_MetricsAddressOfItsOwn: --metrics on the address of --listen
// or --queueber-listen is a usage error, as --http and --pprof on another
// listener's are, not a failure to bind once the node has opened its
// store (found by review).
func TestServe_MetricsAddressOfItsOwn(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--listen", "127.0.0.1:7798", "--metrics", "127.0.0.1:7798"},
		{"--queueber-listen", "127.0.0.1:7797", "--queueber-queue", "q", "--metrics", "127.0.0.1:7797"},
	} {
		r := runCLI(t, nil, "", append([]string{"serve", "--check-config", "--data", filepath.Join(t.TempDir(), "d")}, args...)...)
		require.Equal(t, exitUsage, r.code, "%v: %s%s", args, r.stdout, r.stderr)
		require.Contains(t, r.stderr, "is also the address of --listen or --queueber-listen")
	}
}
