package fdbsync

import (
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync/kv"
	"github.com/leaseq/leaseq/storage"
)

// The on-cluster encoding is frozen like dbkeys': records and keys are
// never renumbered or reshaped. TestFDBGolden pins every encoder's output;
// FuzzFDBDecode checks that decoders never panic and that what decodes
// re-encodes to the same bytes.

var updateGolden = flag.Bool("update-fdb-golden", false, "rewrite testdata/golden.txt from the current encoders")

var (
	gt0  = time.Unix(1_700_000_000, 123_456_789).UTC()
	gid  = storage.ItemID{0, 0, 0, 0, 0, 0, 0, 1, 0x17, 0x9b, 0x4a, 0, 0, 0, 0, 7}
	glid = storage.LeaseID{0xaa, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 0xbb}
)

func goldenRecords() []record {
	return []record{
		{prio: 0, enqueuedAt: gt0, visibleAt: gt0, inline: []byte("payload")},
		{prio: 7, delayed: true, attempts: 2, maxAttempts: 5, enqueuedAt: gt0, visibleAt: gt0.Add(time.Minute),
			dedupKey: "order-1", lastError: "db down", lease: glid, inline: []byte{}},
		{prio: 255, attempts: 5, enqueuedAt: gt0, visibleAt: gt0, reason: "nack: gone", deadAt: gt0.Add(time.Hour),
			chunked: true, pid: [16]byte{9, 9}, size: 300000, nchunks: 3},
	}
}

func goldenFDBEntries() []string {
	var lines []string
	add := func(name string, b []byte) { lines = append(lines, name+" "+hex.EncodeToString(b)) }
	for i, r := range goldenRecords() {
		add(fmt.Sprintf("value/record/%d", i), r.encode())
	}
	l := leaseRec{queue: "q", expiry: gt0, ids: []storage.ItemID{gid, {1}}}
	add("value/lease", l.encode())
	add("value/config", encodeConfig(goldenConfig, kv.Versionstamp{0, 0, 0, 0, 0, 0, 0, 7, 0, 1}))
	add("value/dedup", dedupRec{id: gid, expires: gt0}.encode())
	add("value/dedup_seen", dedupRec{id: gid, expires: gt0, seen: gt0.Add(-time.Minute)}.encode())
	k := keys{prefix: []byte("lq")}
	add("key/queue", k.queue("jobs"))
	add("key/counter", k.counter("jobs", 'r'))
	add("key/wake", k.wake("jobs"))
	add("key/available", k.available("jobs", gid))
	add("key/ready", k.ready("jobs", 3, gt0, gid))
	add("key/delayed", k.delayed("jobs", gt0, gid))
	add("key/delay_all", k.delayAll(gt0, "jobs", gid))
	add("key/inflight", k.inflight("jobs", gid))
	add("key/lease", k.lease(glid))
	add("key/expiry", k.expiry(gt0, glid))
	add("key/dead", k.dead("jobs", gid))
	add("key/dedup", k.dedup("jobs", "order-1"))
	add("key/dedup_exp", k.dedupExp(gt0, "jobs", "order-1"))
	add("key/chunk", k.chunk([16]byte{9, 9}, 2))
	add("key/upload", k.upload(gt0, [16]byte{9, 9}))
	add("key/marker", k.marker(1_234_567_890_123, [16]byte{1}))
	add("key/poller", k.poller("jobs", [16]byte{2}))
	add("key/time_bound", k.timeBound(nsLease, gt0))
	return lines
}

var goldenConfig = storage.QueueConfig{MaxAttempts: 5, LeaseDuration: 30 * time.Second, DedupWindow: 5 * time.Minute, BackoffBase: 500 * time.Millisecond, BackoffMax: 30 * time.Second}

// TestFDBConfig_WithoutIncarnation: a config written before queues kept
// their incarnation (the golden value of then) still decodes, with a zero
// incarnation, before which no dedup record counts as written.
func TestFDBConfig_WithoutIncarnation(t *testing.T) {
	t.Parallel()
	b, err := hex.DecodeString("010000000500000006fc23ac0000000045d964b800000000001dcd650000000006fc23ac00")
	require.NoError(t, err)
	c, err := decodeConfig(b)
	require.NoError(t, err)
	require.Equal(t, goldenConfig, c)
	require.Equal(t, kv.Versionstamp{}, configCreated(b))
	require.False(t, dedupBefore(dedupRec{id: gid}, configCreated(b)))
	created := kv.Versionstamp{0, 0, 0, 0, 0, 0, 0, 7, 0, 1}
	require.Equal(t, created, configCreated(encodeConfig(goldenConfig, created)))
	var older storage.ItemID
	older[7] = 6
	require.True(t, dedupBefore(dedupRec{id: older}, created))
	require.False(t, dedupBefore(dedupRec{id: stampID(created, 0)}, created), "written by the commit that created the queue")
}

func TestFDBGolden(t *testing.T) {
	t.Parallel()
	path := filepath.Join("testdata", "golden.txt")
	got := strings.Join(goldenFDBEntries(), "\n") + "\n"
	if *updateGolden {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test ./fdbsync -run TestFDBGolden -update-fdb-golden to create it")
	require.Equal(t, string(want), got, "on-cluster encoding changed: existing clusters would misread their data")
}

func TestFDBGoldenRecords_RoundTrip(t *testing.T) {
	t.Parallel()
	for i, r := range goldenRecords() {
		got, err := decodeRecord(r.encode())
		require.NoError(t, err, "record %d", i)
		require.Equal(t, r.encode(), got.encode(), "record %d", i)
	}
	l := leaseRec{queue: "q", expiry: gt0, ids: []storage.ItemID{gid}}
	gl, err := decodeLease(l.encode())
	require.NoError(t, err)
	require.Equal(t, l.encode(), gl.encode())
	for _, d := range []dedupRec{{id: gid, expires: gt0}, {id: gid, expires: gt0, seen: gt0.Add(-time.Minute)}} {
		gd, err := decodeDedup(d.encode())
		require.NoError(t, err)
		require.Equal(t, d.encode(), gd.encode())
		require.True(t, d.seen.Equal(gd.seen))
	}
}

// TestFDBDedup_SeenIsOptional: a dedup record written before records
// kept when their key was seen (the golden value of then) still decodes,
// with no seen, and is judged by its expiry alone; a newer record is
// judged by the queue's current window from seen too. Window 0 turns
// dedup off for both.
func TestFDBDedup_SeenIsOptional(t *testing.T) {
	t.Parallel()
	b, err := hex.DecodeString("010000000000000001179b4a000000000717979cfe3d85cd15")
	require.NoError(t, err)
	old, err := decodeDedup(b)
	require.NoError(t, err)
	require.Equal(t, dedupRec{id: gid, expires: gt0}.encode(), old.encode())
	require.True(t, old.seen.IsZero())
	seen := gt0.Add(-5 * time.Minute)
	cur := dedupRec{id: gid, expires: gt0, seen: seen}
	for _, c := range []struct {
		now          time.Time
		window       time.Duration
		oldDup, newD bool
	}{
		{seen.Add(time.Minute), 5 * time.Minute, true, true},
		{seen.Add(time.Minute), time.Second, true, false},
		{seen.Add(time.Second - 1), time.Second, true, true},
		{seen.Add(time.Minute), 0, false, false},
		{gt0.Add(-1), time.Hour, true, true},
		{gt0, time.Hour, false, false},
	} {
		require.Equal(t, c.oldDup, old.holds(c.now, c.window), "old record at %v, window %v", c.now.Sub(seen), c.window)
		require.Equal(t, c.newD, cur.holds(c.now, c.window), "new record at %v, window %v", c.now.Sub(seen), c.window)
	}
}

func FuzzFDBDecode(f *testing.F) {
	for _, r := range goldenRecords() {
		f.Add(r.encode())
	}
	f.Add((&leaseRec{queue: "q", expiry: gt0, ids: []storage.ItemID{gid}}).encode())
	f.Add(dedupRec{id: gid, expires: gt0}.encode())
	f.Add(dedupRec{id: gid, expires: gt0, seen: gt0}.encode())
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := decodeRecord(b); err == nil {
			again, err := decodeRecord(r.encode())
			require.NoError(t, err)
			require.Equal(t, r.encode(), again.encode())
		}
		if l, err := decodeLease(b); err == nil {
			again, err := decodeLease(l.encode())
			require.NoError(t, err)
			require.Equal(t, l.encode(), again.encode())
		}
		if d, err := decodeDedup(b); err == nil {
			require.Equal(t, d.encode(), dedupRec{id: d.id, expires: d.expires, seen: d.seen}.encode())
		}
		_, _ = decodeConfig(b)
	})
}
