package rocksstore

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// benchDirs are databases built once and shared by benchmark runs; TestMain
// removes them.
var benchDirs struct {
	sync.Mutex
	dirs   []string
	stores []*Store
}

func benchDir(b *testing.B, pattern string) string {
	dir, err := os.MkdirTemp("", pattern)
	require.NoError(b, err)
	benchDirs.Lock()
	benchDirs.dirs = append(benchDirs.dirs, dir)
	benchDirs.Unlock()
	return dir
}

func keepStore(s *Store) *Store {
	benchDirs.Lock()
	benchDirs.stores = append(benchDirs.stores, s)
	benchDirs.Unlock()
	return s
}

// TestMain removes the shared benchmark databases and fails the run if any
// goroutine outlives the tests (the poll combiner must not leak waiters).
func TestMain(m *testing.M) {
	if dir := os.Getenv(openProbeEnv); dir != "" {
		os.Exit(openProbe(dir))
	}
	if mode := os.Getenv(allocProbeEnv); mode != "" {
		os.Exit(allocProbe(mode))
	}
	code := m.Run()
	for _, s := range benchDirs.stores {
		_ = s.Close()
	}
	for _, d := range benchDirs.dirs {
		_ = os.RemoveAll(d)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// openProbeEnv makes the test binary open the database in the named
// directory, poll once, print "open_ns rss_kib" and exit: BenchmarkOpenBacklog
// runs it in a fresh process so the RSS reflects only the open store, not
// the garbage of building the backlog.
const openProbeEnv = "ROCKSSTORE_OPEN_PROBE"

func openProbe(dir string) int {
	start := time.Now()
	s, err := Open(dir, Options{Sync: SyncNone})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	elapsed := time.Since(start)
	ctx := context.Background()
	r, err := s.Poll(ctx, storagePoll())
	if err != nil || len(r.Items) == 0 {
		fmt.Fprintln(os.Stderr, "probe poll:", err, len(r.Items))
		return 1
	}
	rss, err := readRSS()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := s.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(elapsed.Nanoseconds(), rss)
	return 0
}
