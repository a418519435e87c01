package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// deadPID returns the pid of a process that has exited and been reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	return cmd.Process.Pid
}

// A zombie (exited, not yet reaped by its parent) runs no more.
func TestProcessAlive(t *testing.T) {
	t.Parallel()
	require.True(t, processAlive(os.Getpid()))
	require.False(t, processAlive(deadPID(t)))
	cmd := exec.Command("true")
	require.NoError(t, cmd.Start())
	require.Eventually(t, func() bool { return !processAlive(cmd.Process.Pid) }, 10*time.Second, time.Millisecond, "a zombie is not alive")
	require.NoError(t, cmd.Wait())
}

func TestRemoveStaleDataDirs(t *testing.T) {
	t.Parallel()
	parent := t.TempDir()
	mk := func(name string, files ...string) string {
		dir := filepath.Join(parent, name)
		require.NoError(t, os.MkdirAll(filepath.Join(dir, "data"), 0o755))
		for _, f := range files {
			require.NoError(t, os.WriteFile(filepath.Join(dir, f), make([]byte, 1000), 0o644))
		}
		return dir
	}
	dead := strconv.Itoa(deadPID(t))
	stale := mk(dataDirPrefix+dead+"-leaseq-rpc-always-123", "data/000001.log")
	kept := mk(keptDirPrefix + "redis-always-456")
	live := mk(dataDirPrefix + strconv.Itoa(os.Getpid()) + "-leaseq-inproc-none-789")
	oldStyle := mk(dataDirPrefix + "leaseq-rpc-none-42")
	other := mk("unrelated-" + dead + "-x")

	n, bytes, err := removeStaleDataDirs(parent)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.EqualValues(t, 1000, bytes)
	require.NoDirExists(t, stale, "a dead harness's row is removed")
	for _, d := range []string{kept, live, oldStyle, other} {
		require.DirExists(t, d)
	}

	// newDataDir names directories so: this process's are left alone,
	// and -keep-data ones carry no pid.
	d, err := newDataDir(parent, "leaseq-rpc-none", false)
	require.NoError(t, err)
	pid, ok := dataDirPID(filepath.Base(d))
	require.True(t, ok)
	require.Equal(t, os.Getpid(), pid)
	k, err := newDataDir(parent, "leaseq-rpc-none", true)
	require.NoError(t, err)
	_, ok = dataDirPID(filepath.Base(k))
	require.False(t, ok, "a kept directory names no pid")
	ents, err := os.ReadDir(d)
	require.NoError(t, err)
	require.Empty(t, ents, "an instance gets an empty directory")
	n, _, err = removeStaleDataDirs(parent)
	require.NoError(t, err)
	require.Zero(t, n)
	require.DirExists(t, d)
	require.DirExists(t, k)
}
