package rocksstore

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// allocProbeEnv makes the test binary churn malloc in a fresh process, with
// KeepFreedMemory called first when the variable is "keep", print the bytes
// malloc kept and exit (TestMain): glibc's thresholds move with what a
// process has allocated before, so only a fresh process tells.
const allocProbeEnv = "ROCKSSTORE_ALLOC_PROBE"

// The probe churns memtable-like blocks: 24 of RocksDB's 1 MiB arena blocks.
const (
	probeBlocks    = 24
	probeBlockSize = 1 << 20
)

func allocProbe(mode string) int {
	if mode == "keep" && !KeepFreedMemory() {
		fmt.Fprintln(os.Stderr, "KeepFreedMemory changed nothing")
		return 1
	}
	fmt.Println(mallocChurnKept(probeBlocks, probeBlockSize))
	return 0
}

// allocProbeCmd runs the probe in mode in a fresh process, with env added
// to the environment.
func allocProbeCmd(mode string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), allocProbeEnv+"="+mode), env...)
	return cmd
}

func runAllocProbe(t *testing.T, mode string) int64 {
	t.Helper()
	out, err := allocProbeCmd(mode).CombinedOutput()
	require.NoError(t, err, "probe: %s", out)
	kept, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64)
	require.NoError(t, err, "probe output %q", out)
	return kept
}

// TestKeepFreedMemory_KeepsMemtableBlocks: with glibc's own settings the
// freed blocks go back to the kernel (the next memtable faults its pages in
// again); after KeepFreedMemory malloc keeps them (all but what the churn
// took from free chunks already there). Where the C library
// is not glibc, KeepFreedMemory has nothing to set and says so.
func TestKeepFreedMemory_KeepsMemtableBlocks(t *testing.T) {
	if mallocChurnKept(0, 0) < 0 {
		require.False(t, keepFreedMemory(""), "not glibc: nothing to set")
		return
	}
	total := int64(probeBlocks * probeBlockSize)
	kept := runAllocProbe(t, "default")
	require.Less(t, kept, total/4, "glibc's defaults kept %d of %d freed bytes", kept, total)
	kept = runAllocProbe(t, "keep")
	// The probe counts malloc's free bytes after the churn less those
	// before it; free chunks the churn's first blocks reused (left by the
	// process's start) come off the count, so "all" is all but a little
	// (25,034,752 of 25,165,824 seen once under a busy make test).
	require.GreaterOrEqual(t, kept, total-total/16, "KeepFreedMemory kept %d of %d freed bytes", kept, total)
}

// TestKeepFreedMemory_OperatorTunablesWin: malloc settings an operator
// made through GLIBC_TUNABLES are left alone.
func TestKeepFreedMemory_OperatorTunablesWin(t *testing.T) {
	for v, want := range map[string]bool{
		"":                                    false,
		"glibc.malloc.arena_max=2":            true,
		"glibc.malloc.tcache_count=0":         false,
		"glibc.malloc.trim_threshold=1048576": true,
		"glibc.malloc.mmap_threshold=65536":   true,
		"glibc.malloc.tcache_count=0:glibc.malloc.trim_threshold=0": true,
		"glibc.malloc.trim_threshold_x=1":                           false,
	} {
		require.Equal(t, want, tunablesSetMalloc(v), "%q", v)
	}
	if mallocChurnKept(0, 0) < 0 {
		return
	}
	// In a fresh process whose GLIBC_TUNABLES sets the trim threshold, the
	// probe's KeepFreedMemory reports that it changed nothing.
	out, err := allocProbeCmd("keep", "GLIBC_TUNABLES=glibc.malloc.trim_threshold=131072").CombinedOutput()
	require.Error(t, err, "probe: %s", out)
	require.Contains(t, string(out), "KeepFreedMemory changed nothing")
}
