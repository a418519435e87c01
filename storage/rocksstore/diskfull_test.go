package rocksstore

import (
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// smallFS mounts a tmpfs of size bytes on a fresh directory for the test.
// It needs root (CI runs as root); elsewhere the test is skipped with the
// reason.
func smallFS(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	dir := t.TempDir()
	require.NoError(t, syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size+",mode=0700"), "mount tmpfs")
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// fillDisk writes a file until the filesystem is full and returns its path.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "filler")
	f, err := os.Create(p)
	require.NoError(t, err)
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		if _, err := f.Write(buf); err != nil {
			require.True(t, errors.Is(err, syscall.ENOSPC), "%v", err)
			return p
		}
	}
}

// bigItems are n items of size random (incompressible) bytes.
func bigItems(n, size int) []storage.EnqueueItem {
	items := make([]storage.EnqueueItem, n)
	for i := range items {
		p := make([]byte, size)
		_, _ = rand.Read(p)
		items[i] = storage.EnqueueItem{Payload: p}
	}
	return items
}

// TestRocksStore_DiskFullRefusesEnqueues: below MinFreeDisk enqueues fail
// with ErrNoSpace, and polls and acks keep working.
func TestRocksStore_DiskFullRefusesEnqueues(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(smallFS(t, "64m"), "data")
	b := setupDir(t, dir, func(o *Options) {
		o.Sync = SyncAlways
		// The reserve must cover flushing the memtables (3 x 4 MiB)
		// and compaction output, which transiently needs as much space
		// as the data it rewrites (here up to the ~24 MiB written).
		o.MinFreeDisk = 40 << 20
		o.memtable = 4 << 20
	})
	enqueued := 0
	var err error
	for i := 0; i < 200; i++ {
		_, err = b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: bigItems(8, 64<<10), Now: at(time.Duration(i) * time.Second)})
		if err != nil {
			break
		}
		enqueued += 8
	}
	require.ErrorIs(t, err, storage.ErrNoSpace, "after %d items", enqueued)
	require.ErrorContains(t, err, "--min-free-disk")
	require.Positive(t, enqueued)
	require.NoError(t, b.s.Failed(), "a refusal is not a failure")

	// Consumers drain: polls and acks work while enqueues are refused.
	now := at(time.Hour)
	res := b.poll("q", 8, time.Minute, now)
	require.Len(t, res.Items, 8)
	codes, err := b.s.Ack(b.ctx, storage.AckParams{Queue: "q", Lease: res.Lease, IDs: ids(res.Items), Now: now})
	require.NoError(t, err)
	for _, c := range codes {
		require.Equal(t, storage.CodeOK, c)
	}
	require.Equal(t, int64(enqueued-8), b.stats("q", now).Ready)
	b.check()
}

// TestRocksStore_DiskFullRecovers: a write that hits ENOSPC fails the
// store; Recover waits for MinFreeDisk to be free again, reopens, and
// every acknowledged item is there.
func TestRocksStore_DiskFullRecovers(t *testing.T) {
	t.Parallel()
	fsDir := smallFS(t, "40m")
	dir := filepath.Join(fsDir, "data")
	b := setupDir(t, dir, func(o *Options) {
		o.Sync = SyncAlways
		o.MinFreeDisk = 1 << 20
		o.memtable = 4 << 20
	})
	now := at(0)
	acked := 0
	for i := 0; i < 5; i++ {
		_, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: bigItems(8, 16<<10), Now: now})
		require.NoError(t, err)
		acked += 8
	}
	// Something else fills the disk; the cached free-space answer (same
	// caller instant) lets the next enqueue reach RocksDB.
	filler := fillDisk(t, fsDir)
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		var res []storage.EnqueueResult
		res, err = b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: bigItems(8, 64<<10), Now: now})
		if err == nil {
			acked += len(res)
		}
	}
	require.ErrorIs(t, err, storage.ErrUnavailable)
	require.Error(t, b.s.Failed())
	_, err = b.s.Ack(b.ctx, storage.AckParams{Queue: "q", Lease: storage.LeaseID{1}, IDs: []storage.ItemID{{1}}, Now: now})
	require.ErrorIs(t, err, storage.ErrUnavailable)

	ok, err := b.s.Recover()
	require.NoError(t, err)
	require.False(t, ok, "no space yet")
	require.NoError(t, os.Remove(filler))
	ok, err = b.s.Recover()
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, b.s.Failed())

	later := at(time.Minute)
	st := b.stats("q", later)
	require.GreaterOrEqual(t, st.Ready, int64(acked), "every acknowledged item survives")
	b.check()
	b.enqueue("q", later, storage.EnqueueItem{Payload: []byte("after recovery")})
}

func ids(items []storage.Item) []storage.ItemID {
	out := make([]storage.ItemID, len(items))
	for i, it := range items {
		out[i] = it.ID
	}
	return out
}

// TestRecover_MetricsNeverGoBackwardsAcrossRecover: Metrics says every
// field only increases (and Close keeps them so); a Recover after a failed
// write reopens the database, whose RocksDB statistics start again from
// zero, and CommitTime must not drop with them.
func TestRecover_MetricsNeverGoBackwardsAcrossRecover(t *testing.T) {
	b, failing := setupFailingSync(t)
	for i := 0; i < 300; i++ {
		b.enqueueN("q", at(0), 1)
	}
	before := b.s.Metrics()
	require.Positive(t, before.CommitTime)

	failing.Store(true)
	_, err := b.s.Enqueue(b.ctx, storage.EnqueueParams{Queue: "q", Items: []storage.EnqueueItem{{Payload: []byte("x")}}, Now: at(time.Second)})
	require.ErrorIs(t, err, storage.ErrUnavailable)
	failing.Store(false)
	ok, err := b.s.Recover()
	require.NoError(t, err)
	require.True(t, ok)

	after := b.s.Metrics()
	require.GreaterOrEqual(t, after.CommitTime, before.CommitTime,
		"CommitTime went backwards across Recover: %v before, %v after", before.CommitTime, after.CommitTime)
	require.GreaterOrEqual(t, after.Commits, before.Commits)
}

// TestFreeDisk_AsDfCountsIt: the free space MinFreeDisk is checked
// against is what df reports as available (statvfs: f_bavail in units
// of f_frsize), within what other processes may write meanwhile.
func TestFreeDisk_AsDfCountsIt(t *testing.T) {
	dir := t.TempDir()
	out, err := exec.Command("df", "-B1", "--output=avail", dir).Output()
	require.NoError(t, err, "df (coreutils)")
	fields := strings.Fields(string(out))
	require.NotEmpty(t, fields)
	df, err := strconv.ParseInt(fields[len(fields)-1], 10, 64)
	require.NoError(t, err, "df output %q", out)
	free, err := freeDisk(dir)
	require.NoError(t, err)
	require.InDelta(t, float64(df), float64(free), 64<<20, "freeDisk %d, df %d", free, df)
}
