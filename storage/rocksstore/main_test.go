package rocksstore

import (
	"fmt"
	"os"
	"sync"
	"testing"

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
