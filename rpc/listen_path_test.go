package rpc

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestListen_UnixPathTooLong: a unix socket path longer than sun_path
// (108 bytes on Linux) cannot be bound or dialed; Listen and Dial say the
// path is too long. Found by review (session 70): they said "bind:
// invalid argument" and "connect: invalid argument", which the CLI turned
// into "is 'leaseq serve' running there?".
func TestListen_UnixPathTooLong(t *testing.T) {
	t.Parallel()
	dir, err := shortTempDir(t)
	require.NoError(t, err)
	long := filepath.Join(dir, strings.Repeat("d", 60), strings.Repeat("s", 60)+".sock")
	require.NoError(t, os.MkdirAll(filepath.Dir(long), 0o700))
	require.Greater(t, len(long), 108)

	ln, err := Listen("unix:" + long)
	if err == nil {
		_ = ln.Close()
		t.Fatalf("listen on a %d-byte path succeeded", len(long))
	}
	t.Logf("listen: %v", err)
	require.Contains(t, err.Error(), "too long", "listen error does not say the socket path is too long")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = Dial(ctx, "unix:"+long, ClientOptions{})
	require.Error(t, err)
	t.Logf("dial: %v", err)
	require.Contains(t, err.Error(), "too long", "dial error does not say the socket path is too long")
}
