package main

// Review (session 74) of `leaseq check`: a healthy database with every
// kind of record, in queues whose names are prefixes of each other,
// passes; a --data that holds no database is refused with one clear line
// and left as it was.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// TestReviewCheck_CleanStoreWithPrefixQueues: queues named "a", "a.b",
// "a.b.c", "a-", "ab" and "b" each hold a dead item, two items under a
// live lease, an item delayed by a nack, an item delayed at enqueue, and a
// ready item at priority 255 with a dedup key and an out-of-record
// payload; check finds every invariant holding and counts them all.
func TestReviewCheck_CleanStoreWithPrefixQueues(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "data")
	s, err := rocksstore.Open(dir, rocksstore.Options{})
	require.NoError(t, err)
	now := time.Date(2031, time.March, 4, 5, 6, 7, 0, time.UTC)
	queues := []string{"a", "a.b", "a.b.c", "a-", "ab", "b"}
	zero, later := time.Duration(0), 10*time.Minute
	for _, q := range queues {
		res, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: q, Now: now, Items: []storage.EnqueueItem{
			{Payload: []byte("dies"), MaxAttempts: 1},
			{Payload: []byte("held 1")},
			{Payload: []byte("held 2")},
			{Payload: []byte("nacked"), Priority: 1},
			{Payload: make([]byte, 6000), Priority: 255, DedupKey: "k-" + q},
			{Payload: []byte("later"), Delay: time.Hour},
		}})
		require.NoError(t, err)
		for _, r := range res {
			require.Equal(t, storage.CodeOK, r.Code, r.Err)
		}
		dup, err := s.Enqueue(ctx, storage.EnqueueParams{Queue: q, Now: now, Items: []storage.EnqueueItem{{Payload: []byte("again"), DedupKey: "k-" + q}}})
		require.NoError(t, err)
		require.True(t, dup[0].Duplicate)

		settle := func(max int, delay *time.Duration) storage.PollResult {
			p, err := s.Poll(ctx, storage.PollParams{Queue: q, Max: max, Now: now})
			require.NoError(t, err)
			require.Len(t, p.Items, max)
			if delay != nil {
				codes, err := s.Nack(ctx, storage.NackParams{Queue: q, Lease: p.Lease, IDs: []storage.ItemID{p.Items[0].ID}, Delay: delay, Reason: "no", Now: now})
				require.NoError(t, err)
				require.Equal(t, []storage.Code{storage.CodeOK}, codes)
			}
			return p
		}
		require.Equal(t, "dies", string(settle(1, &zero).Items[0].Payload))
		held := settle(2, nil)
		require.Equal(t, "held 1", string(held.Items[0].Payload))
		_, err = s.ExtendLease(ctx, storage.ExtendParams{Queue: q, Lease: held.Lease, Duration: time.Hour, Now: now})
		require.NoError(t, err)
		require.Equal(t, "nacked", string(settle(1, &later).Items[0].Payload))
	}
	sts, err := s.Stats(ctx, storage.StatsParams{Now: now})
	require.NoError(t, err)
	require.Len(t, sts, len(queues))
	for _, st := range sts {
		require.Equal(t, []int64{1, 2, 2, 1, 1}, []int64{st.Ready, st.Delayed, st.Inflight, st.Dead, st.Leases}, "%+v", st)
	}
	rep, err := s.Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK(), "%v", rep.Violations)
	require.NoError(t, s.Close())

	te := newTestEnv(nil)
	code := run(ctx, []string{"check", "--data", dir}, &te.env)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", te.out, te.errOut)
	want := fmt.Sprintf("ok: %s: %d items, %d leases, all invariants hold\n", dir, 6*len(queues), len(queues))
	require.Equal(t, want, te.out.String())
	require.Empty(t, te.errOut.String())
}

// TestReviewCheck_NoDatabaseIsRefusedClearly: a --data that exists but
// holds no database (an empty directory, a directory of other files, a
// regular file) fails with one line saying there is no database there,
// not RocksDB's "IO error ... CURRENT", and check leaves it unchanged.
func TestReviewCheck_NoDatabaseIsRefusedClearly(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	empty := filepath.Join(base, "empty")
	require.NoError(t, os.Mkdir(empty, 0o700))
	other := filepath.Join(base, "other")
	require.NoError(t, os.Mkdir(other, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(other, "notes.txt"), []byte("hi"), 0o600))
	file := filepath.Join(base, "file")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o600))
	list := func(p string) []string {
		var names []string
		require.NoError(t, filepath.WalkDir(p, func(path string, _ os.DirEntry, err error) error {
			names = append(names, path)
			return err
		}))
		return names
	}
	for _, data := range []string{empty, other, file} {
		t.Run(filepath.Base(data), func(t *testing.T) {
			before := list(base)
			te := newTestEnv(nil)
			code := run(context.Background(), []string{"check", "--data", data}, &te.env)
			require.Equal(t, exitFailure, code, "stdout:\n%s", te.out)
			stderr := te.errOut.String()
			require.Contains(t, stderr, "leaseq check: no database at "+data)
			require.NotContains(t, stderr, "IO error")
			require.Equal(t, 1, strings.Count(stderr, "\n"), "%q", stderr)
			require.Empty(t, te.out.String())
			require.Equal(t, before, list(base), "check changed the directory")
		})
	}
}
