package rocksstore

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Found by review (session 72): acknowledged writes were lost. The
// TransactionDB flushes the records it replays at Open into synced tables
// but keeps the logs it replayed, and reads them again at the next Open.
// A reopen can replay a log's last record whole from the page cache (a
// batch whose fsync failed, then Store.Recover; or a crash of the process
// and a quick restart) while the disk's copy of it is torn (the power
// fails before the kernel writes it back). The next Open then failed on
// that old tear, and walTornTail, taking the newer log as written after
// the torn record, cut it: every write the reopened store had acknowledged
// and not yet flushed was dropped. Open now empties the logs it replayed,
// so no old tear is read again.
func TestOpen_ReplayedLogTornOnDiskKeepsNewerAckedWrites(t *testing.T) {
	t.Parallel()
	b := setup(t, zeroedWALOptions)
	enqueueOneByOne(b, "q", 100, 100) // acknowledged, synced
	// The batch whose fsync failed: its record whole in the page cache,
	// which is all the reopen below reads.
	enqueueOneByOne(b, "q", 1, 100)
	cache := copyDir(t, b.dir)
	old, wal := newestLog(t, cache)

	c := setupDir(t, cache, zeroedWALOptions) // Store.Recover's reopen
	require.Equal(t, int64(101), c.stats("q", at(time.Second)).Ready)
	enqueueOneByOne(c, "q", 50, 100) // acknowledged in the new log

	// The power fails: the page cache is lost. Unless the reopen rewrote
	// and synced the old log, the disk holds it with the failed batch's
	// record torn (its last 8 bytes never reached the disk).
	crashed := copyDir(t, cache)
	path := filepath.Join(crashed, filepath.Base(old))
	if now, err := os.ReadFile(path); err == nil && bytes.Equal(now, wal) {
		end := recordsEnd(now)
		clear(now[end-8 : end])
		require.NoError(t, os.WriteFile(path, now, 0o600))
	}

	requireCheckDir(t, crashed, 151)
	d := setupDir(t, crashed, zeroedWALOptions)
	require.Equal(t, int64(151), d.stats("q", at(time.Second)).Ready, "acknowledged enqueues lost")

	// What keeps them: every log older than the reopen's own is empty
	// (or deleted by RocksDB since).
	logs, err := walFiles(cache)
	require.NoError(t, err)
	for _, l := range logs[:len(logs)-1] {
		if fi, err := os.Stat(l); err == nil {
			require.Zero(t, fi.Size(), "%s, replayed by the reopen, still holds records", l)
		}
	}
}
