package main

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc"
	"github.com/leaseq/leaseq/rpc/rpctest"
	"github.com/leaseq/leaseq/storage"
)

// crashRounds is how many SIGKILLs TestCrash_KillRestart deals by default;
// the -crash-rounds test flag (go test -run TestCrash -crash-rounds 200 .)
// or LEASEQ_CRASH_ROUNDS asks for more (or fewer).
const crashRounds = 20

var crashRoundsFlag = flag.Int("crash-rounds", 0, "SIGKILL rounds of TestCrash_KillRestart (0: LEASEQ_CRASH_ROUNDS, else 20)")

// crashLedger is what the test's clients know for sure about every item.
type crashLedger struct {
	mu struct {
		sync.Mutex
		enqueued   map[storage.ItemID]bool // the node acknowledged the enqueue
		acked      map[storage.ItemID]bool // the node acknowledged the ack
		maybeAcked map[storage.ItemID]bool // an ack whose answer was lost in a crash
		violations []string
		enqCount   int
		ackCount   int
		nackCount  int
		deliveries int
	}
}

func newCrashLedger() *crashLedger {
	l := &crashLedger{}
	l.mu.enqueued = map[storage.ItemID]bool{}
	l.mu.acked = map[storage.ItemID]bool{}
	l.mu.maybeAcked = map[storage.ItemID]bool{}
	return l
}

func (l *crashLedger) violation(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.mu.violations) < 20 {
		l.mu.violations = append(l.mu.violations, fmt.Sprintf(format, args...))
	}
}

// delivered records a poll result: an item whose ack the node confirmed
// must never be delivered again.
func (l *crashLedger) delivered(round int, items []storage.Item) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.deliveries += len(items)
	for _, it := range items {
		if l.mu.acked[it.ID] {
			if len(l.mu.violations) < 20 {
				l.mu.violations = append(l.mu.violations, fmt.Sprintf("round %d: acked item %s delivered again (attempts %d)", round, it.ID, it.Attempts))
			}
		}
		// It came back, so the lost ack did not apply.
		delete(l.mu.maybeAcked, it.ID)
	}
}

// TestCrash_KillRestart runs a real `leaseq serve` (sync=always) under
// concurrent producers and consumers, SIGKILLs it at random moments, runs
// `leaseq check` on the directory it left, and restarts it on the same
// data, crashRounds times; as root, one round fills the data disk (a tmpfs)
// first, so the node is killed while refusing enqueues for lack of space
// (TestCrash_CorruptedWAL is the corrupted-WAL round, on a copy of such a
// directory). Afterwards every enqueue the node acknowledged
// is still there or was acked, and nothing whose ack was acknowledged came
// back (checked on every delivery, and against a final scan).
func TestCrash_KillRestart(t *testing.T) {
	t.Parallel()
	rounds := crashRounds
	if s := os.Getenv("LEASEQ_CRASH_ROUNDS"); s != "" {
		n, err := strconv.Atoi(s)
		require.NoError(t, err, "LEASEQ_CRASH_ROUNDS")
		rounds = n
	}
	if *crashRoundsFlag > 0 {
		rounds = *crashRoundsFlag
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("LEASEQ_CRASH_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "LEASEQ_CRASH_SEED")
		seed = n
	}
	t.Logf("rounds=%d seed=%d (-crash-rounds or LEASEQ_CRASH_ROUNDS, LEASEQ_CRASH_SEED)", rounds, seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))

	// As root, the data lives on a tmpfs of its own, and one round in the
	// middle fills that disk before the SIGKILL.
	dir := t.TempDir()
	fullRound := -1
	if os.Geteuid() == 0 {
		require.NoError(t, syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=384m,mode=0700"))
		t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
		fullRound = rounds / 2
	} else {
		t.Log("not root: no tmpfs, so no disk-full round")
	}
	data := filepath.Join(dir, "data")
	ledger := newCrashLedger()
	const queue = "crash"
	const producers, consumers = 3, 3

	for round := range rounds {
		n := startNode(t, data, "--sync", "always", "--min-free-disk", "32MiB")
		if round == 0 {
			// Short leases so items held by killed consumers come back in
			// later rounds; few attempts so some die and DLQ paths run.
			n.cli("config", queue, "--max-attempts", "4", "--lease", "500ms")
		}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for p := range producers {
			wg.Go(func() { crashProducer(ctx, n.addr, round, p, ledger) })
		}
		for range consumers {
			cseed := rng.Uint64()
			wg.Go(func() { crashConsumer(ctx, n.addr, queue, round, cseed, ledger) })
		}
		// Kill at a random moment: sometimes right away, sometimes with a
		// few hundred writes in flight.
		killAfter := time.Duration(rng.IntN(400)) * time.Millisecond
		time.Sleep(killAfter) // the random moment itself, not synchronisation
		var filler string
		if round == fullRound {
			filler = fillDisk(t, dir)
			// Enqueues are refused now; the consumers go on acking.
			// (The node reads the free space once a second.)
			c := dialNode(t, n.addr)
			var err error
			rpctest.Eventually(t, 10*time.Second, func() bool {
				_, err = c.Enqueue(context.Background(), queue, []storage.EnqueueItem{{Payload: []byte("x")}})
				return err != nil
			}, "enqueues still accepted on a full disk")
			require.ErrorIs(t, err, rpc.ErrUnavailable, "round %d", round)
			require.ErrorContains(t, err, "free", "round %d", round)
			time.Sleep(200 * time.Millisecond)
		}
		n.kill()
		cancel()
		wg.Wait()
		if filler != "" {
			require.NoError(t, os.Remove(filler))
		}

		r := runCLI(t, nil, "", "check", "--data", data)
		require.Equal(t, 0, r.code, "round %d: leaseq check after SIGKILL:\n%s%s", round, r.stdout, r.stderr)
		ledger.mu.Lock()
		v := ledger.mu.violations
		ledger.mu.Unlock()
		require.Empty(t, v, "round %d", round)
	}

	// Restart once more and account for every item.
	n := startNode(t, data)
	c := dialNode(t, n.addr)
	ctx := context.Background()
	// Let the leases of the last round's consumers run out and be swept
	// first: an item moving from inflight to ready between the two peeks
	// below would be seen by neither.
	rpctest.Eventually(t, time.Minute, func() bool {
		st, err := c.Stats(ctx, queue)
		require.NoError(t, err)
		return len(st) == 1 && st[0].Inflight == 0 && st[0].Leases == 0
	}, "leases of killed consumers never expired")
	scan := func() map[storage.ItemID]string { return scanCrashQueue(t, c, queue) }
	stats := func() storage.QueueStats {
		st, err := c.Stats(ctx, queue)
		require.NoError(t, err)
		require.Len(t, st, 1)
		return st[0]
	}
	// The node counts a batch's changes as it builds the batch, a moment
	// before the batch's writes can be read: the last sweep can show in
	// Stats before the scan sees its items. Scan again until the two
	// describe the same state (a node whose counters are wrong never
	// gets there, and fails the check below).
	present, s := scan(), stats()
	for try := 0; int64(len(present)) != s.Ready+s.Delayed+s.Inflight+s.Dead && try < 50; try++ {
		time.Sleep(20 * time.Millisecond)
		present, s = scan(), stats()
	}

	ledger.mu.Lock()
	defer ledger.mu.Unlock()
	for id := range ledger.mu.enqueued {
		_, here := present[id]
		if !here && !ledger.mu.acked[id] && !ledger.mu.maybeAcked[id] {
			t.Errorf("acknowledged enqueue %s lost: not in ready, delayed, inflight or dead, and never acked", id)
		}
	}
	for id := range ledger.mu.acked {
		if st, here := present[id]; here {
			t.Errorf("acked item %s is back (%s)", id, st)
		}
	}
	require.Equal(t, int64(len(present)), s.Ready+s.Delayed+s.Inflight+s.Dead, "stats agree with the scan")
	require.GreaterOrEqual(t, s.Acked, uint64(len(ledger.mu.acked)), "the node counted at least every confirmed ack")
	t.Logf("%d rounds: %d enqueues confirmed, %d acks confirmed (%d lost in crashes), %d nacks, %d deliveries; now %d present (%d ready, %d delayed, %d inflight, %d dead)",
		rounds, ledger.mu.enqCount, ledger.mu.ackCount, len(ledger.mu.maybeAcked), ledger.mu.nackCount, ledger.mu.deliveries,
		len(present), s.Ready, s.Delayed, s.Inflight, s.Dead)
	require.Positive(t, ledger.mu.enqCount, "producers got enqueues through")
	require.Positive(t, ledger.mu.ackCount, "consumers got acks through")
}

func dialNode(t *testing.T, addr string) *rpc.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := rpc.Dial(ctx, addr, rpc.ClientOptions{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// crashProducer enqueues small batches until the node dies or ctx ends.
// Only enqueues the node answered count; one interrupted by the kill may or
// may not have happened.
// fillDisk writes a file in dir until its filesystem is full and returns
// the file's path.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	require.NoError(t, err)
	chunk := make([]byte, 1<<20)
	for {
		if _, err := f.Write(chunk); err != nil {
			require.ErrorIs(t, err, syscall.ENOSPC)
			break
		}
	}
	require.NoError(t, f.Close())
	return path
}

func crashProducer(ctx context.Context, addr string, round, p int, l *crashLedger) {
	c, err := rpc.Dial(ctx, addr, rpc.ClientOptions{})
	if err != nil {
		return // killed before we connected
	}
	defer c.Close()
	payload := make([]byte, 256)
	for seq := 0; ctx.Err() == nil; seq++ {
		items := make([]storage.EnqueueItem, 1+seq%8)
		for i := range items {
			copy(payload, fmt.Sprintf("r%d p%d s%d i%d ", round, p, seq, i))
			items[i] = storage.EnqueueItem{Payload: append([]byte(nil), payload...)}
		}
		res, err := c.Enqueue(ctx, "crash", items)
		if err != nil {
			return
		}
		l.mu.Lock()
		for _, r := range res {
			if r.Code != storage.CodeOK {
				l.mu.Unlock()
				l.violation("round %d: enqueue rejected: %s", round, r.Err)
				return
			}
			l.mu.enqueued[r.ID] = true
			l.mu.enqCount++
		}
		l.mu.Unlock()
	}
}

// crashConsumer polls and mostly acks, sometimes nacks, sometimes drops a
// batch on the floor (its lease expires later).
func crashConsumer(ctx context.Context, addr, queue string, round int, seed uint64, l *crashLedger) {
	c, err := rpc.Dial(ctx, addr, rpc.ClientOptions{})
	if err != nil {
		return
	}
	defer c.Close()
	rng := rand.New(rand.NewPCG(seed, 1))
	zero := time.Duration(0)
	for ctx.Err() == nil {
		res, err := c.Poll(ctx, queue, 16, 500*time.Millisecond, 100*time.Millisecond)
		if err != nil {
			return
		}
		l.delivered(round, res.Items)
		if len(res.Items) == 0 {
			continue
		}
		ids := make([]storage.ItemID, len(res.Items))
		for i, it := range res.Items {
			ids[i] = it.ID
		}
		switch x := rng.IntN(10); {
		case x == 0: // abandon: the lease expires
		case x == 1:
			codes, err := c.Nack(ctx, queue, res.Lease, ids, &zero, "crash test")
			if err != nil {
				return
			}
			l.mu.Lock()
			for _, code := range codes {
				if code == storage.CodeOK {
					l.mu.nackCount++
				}
			}
			l.mu.Unlock()
		default:
			// Ack under a context that outlives the round, so the only way
			// to lose the answer is the kill itself.
			codes, err := c.Ack(context.WithoutCancel(ctx), queue, res.Lease, ids)
			l.mu.Lock()
			if err != nil {
				for _, id := range ids {
					l.mu.maybeAcked[id] = true
				}
				l.mu.Unlock()
				return
			}
			for i, code := range codes {
				switch code {
				case storage.CodeOK:
					l.mu.acked[ids[i]] = true
					l.mu.ackCount++
				case storage.CodeLeaseExpired, storage.CodeLeaseMismatch, storage.CodeNotFound:
					// The 500ms lease ran out on a busy machine: the item
					// is (or was) delivered again, maybe acked by another
					// consumer already.
				default:
					l.mu.Unlock()
					l.violation("round %d: ack of a just-polled item %s: %s", round, ids[i], code)
					return
				}
			}
			l.mu.Unlock()
		}
	}
}

// TestCrash_CorruptedWAL: synced items, SIGKILL, 16 bytes flipped in the
// middle of the live WAL. The node refuses to start and check fails, both
// naming the file, and check leaves the directory as it was; only
// `serve --recover=point-in-time` opens it, without the writes after the
// damage, and check then passes.
func TestCrash_CorruptedWAL(t *testing.T) {
	t.Parallel()
	data := filepath.Join(t.TempDir(), "data")
	n := startNode(t, data, "--sync", "always")
	c := dialNode(t, n.addr)
	ctx := context.Background()
	for i := 0; i < 3000; i += 100 {
		items := make([]storage.EnqueueItem, 100)
		for j := range items {
			items[j] = storage.EnqueueItem{Payload: []byte(fmt.Sprintf("synced item %d, padded to fill the log a little", i+j))}
		}
		_, err := c.Enqueue(ctx, "wal", items)
		require.NoError(t, err)
	}
	n.kill()

	logs, err := filepath.Glob(filepath.Join(data, "*.log"))
	require.NoError(t, err)
	require.NotEmpty(t, logs)
	wal := logs[len(logs)-1]
	b, err := os.ReadFile(wal)
	require.NoError(t, err)
	// The middle of its records: with --sync=always the log is made over
	// zeros (storage/rocksstore/zerowal.h), which follow the records.
	end := len(b)
	for end > 0 && b[end-1] == 0 {
		end--
	}
	for i := range 16 {
		b[end/2+i] ^= 0xff
	}
	require.NoError(t, os.WriteFile(wal, b, 0o600))
	before := hashDir(t, data)

	r := runCLI(t, nil, "", "check", "--data", data)
	require.Equal(t, 1, r.code, "check on a damaged WAL:\n%s%s", r.stdout, r.stderr)
	require.Contains(t, r.stderr, filepath.Base(wal))
	require.Contains(t, r.stderr, "write-ahead log damaged")
	require.Equal(t, before, hashDir(t, data), "check wrote to the database")

	r = runCLI(t, nil, "", "serve", "--data", data, "--listen", "unix:"+filepath.Join(t.TempDir(), "s.sock"))
	require.Equal(t, 1, r.code, "serve on a damaged WAL must refuse:\n%s%s", r.stdout, r.stderr)
	require.Contains(t, r.stderr, filepath.Base(wal))
	require.Contains(t, r.stderr, "--recover=point-in-time")

	n = startNode(t, data, "--recover=point-in-time")
	c = dialNode(t, n.addr)
	st, err := c.Stats(ctx, "wal")
	require.NoError(t, err)
	require.Len(t, st, 1)
	require.Less(t, st[0].Ready, int64(3000), "the writes after the damage are gone")
	require.Zero(t, n.stop())
	r = runCLI(t, nil, "", "check", "--data", data)
	require.Equal(t, 0, r.code, "check after point-in-time recovery:\n%s%s", r.stdout, r.stderr)
}

// hashDir maps every file under dir to a hash of its bytes.
func hashDir(t *testing.T, dir string) map[string][32]byte {
	t.Helper()
	m := map[string][32]byte{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		m[p] = sha256.Sum256(b)
		return nil
	}))
	return m
}

// scanCrashQueue lists every item of queue on the node c talks to,
// whatever its state (ready, delayed, inflight or dead).
func scanCrashQueue(t *testing.T, c *rpc.Client, queue string) map[storage.ItemID]string {
	t.Helper()
	ctx := context.Background()
	present := map[storage.ItemID]string{}
	for _, inflight := range []bool{false, true} {
		var after storage.ItemID
		for {
			items, err := c.Peek(ctx, storage.PeekParams{Queue: queue, Inflight: inflight, After: after, Limit: 1000})
			require.NoError(t, err)
			for _, it := range items {
				present[it.ID] = it.State.String()
			}
			if len(items) < 1000 {
				break
			}
			after = items[len(items)-1].ID
		}
	}
	var after storage.ItemID
	for {
		dead, err := c.DeadList(ctx, storage.DeadListParams{Queue: queue, After: after, Limit: 1000})
		require.NoError(t, err)
		for _, d := range dead {
			present[d.ID] = "dead"
		}
		if len(dead) < 1000 {
			break
		}
		after = dead[len(dead)-1].ID
	}
	return present
}
