package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// A row's data directory is named after the harness process that made it
// (dataDirPrefix, its pid, the system), so that a later run can tell the
// directories of a harness that was killed before it could remove them
// (SIGKILL, a crash) from those of one still running. -keep-data
// directories are named without a pid (keptDirPrefix) and never removed.
const (
	dataDirPrefix = "leaseq-bench-"
	keptDirPrefix = dataDirPrefix + "kept-"
)

// newDataDir makes a fresh, empty data directory for one row of system
// under parent ("" for the system's temporary directory).
func newDataDir(parent, system string, keep bool) (string, error) {
	pattern := fmt.Sprintf("%s%d-%s-", dataDirPrefix, os.Getpid(), system)
	if keep {
		pattern = keptDirPrefix + system + "-"
	}
	return os.MkdirTemp(parent, pattern)
}

// removeStaleDataDirs removes the data directories under parent ("": the
// system's temporary directory) left by harness processes that no longer
// run, and returns how many it removed and the bytes they held. A
// directory whose pid is alive (this harness, another one, or a process
// that reused the pid), or whose name is not a pid-named one of
// newDataDir's (-keep-data's, an older harness's), is left alone.
func removeStaleDataDirs(parent string) (n int, bytes int64, err error) {
	if parent == "" {
		parent = os.TempDir()
	}
	ents, err := os.ReadDir(parent)
	if err != nil {
		return 0, 0, err
	}
	var errs []error
	for _, e := range ents {
		pid, ok := dataDirPID(e.Name())
		if !ok || !e.IsDir() || processAlive(pid) {
			continue
		}
		dir := filepath.Join(parent, e.Name())
		size := dirBytes(dir)
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
		bytes += size
	}
	return n, bytes, errors.Join(errs...)
}

// dataDirPID returns the harness pid in a name newDataDir made.
func dataDirPID(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, dataDirPrefix)
	if !ok {
		return 0, false
	}
	digits, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(digits)
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, true
}

// processAlive reports whether a process with pid exists (signal 0: EPERM
// means it exists but is not ours) and is not a zombie: a killed harness
// whose parent has not reaped it yet runs no more.
func processAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true // no /proc: trust the signal
	}
	// "pid (comm) S ...": the state follows the last ')'.
	if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

// dirBytes is the size of the regular files under dir, best effort.
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
