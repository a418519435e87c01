// The check command: the offline invariant check of a database.

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"

	"github.com/leaseq/leaseq/fdbsync"
	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

var checkCommand = &command{
	name:    "check",
	summary: "verify the on-disk invariants of a stopped node's database",
	help: `
Open the database in --data read-only (it must exist; stop the node first)
and verify every invariant with a full scan: each item in exactly one state,
index entries match items, leases and their expiry entries match, counters
equal what the scan counts, attempts within max_attempts. Prints each
violation and exits 1 if there is any; otherwise prints a one-line summary.
A node that opened the database while the check ran also makes it exit 1,
without the report, which may be inconsistent.
Check never writes to the database. A write-ahead log damaged before its
end (not just a torn last record) fails the check, naming the file and the
bytes that 'leaseq serve --recover=point-in-time' would drop.

With --backend=fdb it checks a FoundationDB deployment's subspace
(--fdb-cluster-file, --fdb-subspace) in one consistent read, while the
nodes run; it needs a 'make build-fdb' binary.`,
	setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
		data := fs.String("data", "./data", "`dir`ectory of the RocksDB database")
		backend := newChoice("rocksdb", parseBackend)
		fs.Var(backend, "backend", "storage `backend`: rocksdb, or fdb (a consistent scan of the cluster's subspace; small deployments only, as one FDB transaction must finish within 5 s)")
		clusterFile := fs.String("fdb-cluster-file", "", "FoundationDB cluster `file` for --backend=fdb")
		subspace := newChoice("", parseSubspace)
		fs.Var(subspace, "fdb-subspace", "`name` of the deployment's subspace for --backend=fdb (as given to serve)")
		lf := addLogFlags(fs, "warn")
		return func(ctx context.Context, args []string) error {
			if len(args) > 0 {
				return usagef("unexpected argument %q", args[0])
			}
			if backend.val == "fdb" {
				return checkFDB(ctx, e, *clusterFile, subspace.val, lf.logger(e.stderr))
			}
			return check(ctx, e, *data, lf.logger(e.stderr))
		}
	},
}

func check(ctx context.Context, e *env, data string, log *slog.Logger) (err error) {
	// Open would create an empty database; a typo must not pass the check.
	fi, err := os.Stat(data)
	if err != nil {
		return fmt.Errorf("no database at %s: %w", data, err)
	}
	// Found by review (session 74): a --data that exists but holds no
	// database (an empty or wrong directory, a file) failed with RocksDB's
	// "IO error: While opening a file for sequentially reading: .../CURRENT".
	if !fi.IsDir() {
		return fmt.Errorf("no database at %s: not a directory", data)
	}
	if _, err := os.Stat(filepath.Join(data, "CURRENT")); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no database at %s: the directory has no RocksDB CURRENT file", data)
	}
	if pid, ok := lockHolder(data); ok {
		return fmt.Errorf("the database in %s is in use by %s: stop it first: check needs the database to itself", data, lockHolderText(pid, "a running 'leaseq serve'?"))
	}
	// Read-only: check never writes to the database (a replayed WAL stays
	// in memory), so it cannot make a damaged log's loss permanent.
	rep, err := rocksstore.CheckDir(ctx, data)
	if e.checkScanned != nil {
		e.checkScanned()
	}
	// Found by review (session 74): the read-only open takes no lock, so
	// a node that started during the scan went unnoticed, and its writes
	// could make the report say anything. Ask again.
	if pid, ok := lockHolder(data); ok {
		return exitError{exitFailure, fmt.Errorf("the database in %s was opened by %s during the check: the report may be inconsistent; stop the node and check again", data, lockHolderText(pid, "a 'leaseq serve' that started?"))}
	}
	return printReport(e, rep, err, data)
}

// lockHolderText names the holder of a database's lock for a message,
// with hint (what it likely is) in parentheses: "process PID (hint)".
// Found by review (session 74): F_GETLK reports pid 0 for a holder in
// another PID namespace, and "process 0" sent one looking for a process
// that is not there; that holder is "another process", most likely a
// node in another container.
func lockHolderText(pid int, hint string) string {
	if pid <= 0 {
		return "another process (a running 'leaseq serve' in another container?)"
	}
	return fmt.Sprintf("process %d (%s)", pid, hint)
}

// lockHolder reports the process holding RocksDB's lock on the database in
// dir, if any, so check can say "stop the node first" instead of passing
// on RocksDB's "IO error: While lock file". RocksDB locks DIR/LOCK with a
// POSIX record lock (fcntl F_SETLK); F_GETLK asks who holds it without
// taking it. Any failure to ask means "not known to be held": Open then
// reports what is wrong.
func lockHolder(dir string) (pid int, held bool) {
	f, err := os.Open(filepath.Join(dir, "LOCK"))
	if err != nil {
		return 0, false
	}
	defer f.Close()
	lk := syscall.Flock_t{Type: syscall.F_WRLCK, Whence: io.SeekStart}
	if err := syscall.FcntlFlock(f.Fd(), syscall.F_GETLK, &lk); err != nil || lk.Type == syscall.F_UNLCK {
		return 0, false
	}
	return int(lk.Pid), true
}

// checkFDB checks the subspace of a FoundationDB deployment; the nodes
// may keep running (the scan reads one consistent version).
func checkFDB(ctx context.Context, e *env, clusterFile, subspace string, log *slog.Logger) error {
	store, err := fdbsync.OpenCluster(clusterFile, fdbsync.Options{Prefix: fdbPrefix(subspace), Logger: log, Clock: e.clock})
	if err != nil {
		return fmt.Errorf("open FoundationDB cluster: %w", err)
	}
	name := "fdb:" + clusterFile
	if subspace != "" {
		name += "/" + subspace
	}
	return checkReport(ctx, e, store, name)
}

// checkReport runs store's invariant check, prints every violation and a
// summary, and closes store.
func checkReport(ctx context.Context, e *env, store storage.Store, data string) (err error) {
	defer func() { err = errors.Join(err, closeStore(store)) }()
	rep, err := store.Check(ctx)
	return printReport(e, rep, err, data)
}

// printReport prints a check's violations, one a line with its kind in
// brackets, and a summary; the report lists at most check.MaxViolations of
// them, and the summary says how many there are in all.
func printReport(e *env, rep storage.CheckReport, err error, data string) error {
	if err != nil {
		return fmt.Errorf("check %s: %w", data, err)
	}
	for _, v := range rep.Violations {
		fmt.Fprintln(e.stdout, v)
	}
	if !rep.OK() {
		listed := ""
		if n := len(rep.Violations); n < rep.Total {
			listed = fmt.Sprintf(", the first %d listed", n)
		}
		return exitError{exitFailure, fmt.Errorf("%s: %d invariant violations%s (%d items, %d leases)", data, rep.Total, listed, rep.Items, rep.Leases)}
	}
	fmt.Fprintf(e.stdout, "ok: %s: %d items, %d leases, all invariants hold\n", data, rep.Items, rep.Leases)
	return nil
}
