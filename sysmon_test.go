package main

import (
	"bytes"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSysmonEnv(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   []string
		want []string // nil: no re-execution
	}{
		{[]string{"HOME=/root"}, []string{"HOME=/root", "GODEBUG=" + sysmonSchedtrace}},
		{[]string{"GODEBUG=", "A=b"}, []string{"GODEBUG=" + sysmonSchedtrace, "A=b"}},
		{[]string{"GODEBUG=madvdontneed=1"}, []string{"GODEBUG=madvdontneed=1," + sysmonSchedtrace}},
		{[]string{"GODEBUG=schedtrace=0"}, nil},
		{[]string{"GODEBUG=gctrace=1,schedtrace=1000"}, nil},
	} {
		got, ok := sysmonEnv(tc.in)
		require.Equal(t, tc.want != nil, ok, "%q", tc.in)
		require.Equal(t, tc.want, got, "%q", tc.in)
	}
}

// A real `leaseq serve` runs with sysmon kept from its deep sleep: it
// re-executed itself with GODEBUG's schedtrace set, same pid.
func TestServe_SysmonSchedtrace(t *testing.T) {
	t.Parallel()
	n := startNode(t, t.TempDir())
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", n.cmd.Process.Pid))
	require.NoError(t, err)
	var godebug []byte
	for _, kv := range bytes.Split(environ, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("GODEBUG=")); ok {
			godebug = v
		}
	}
	require.Contains(t, string(godebug), sysmonSchedtrace)
	up, err := os.ReadFile("/proc/uptime")
	require.NoError(t, err)
	var secs float64
	_, err = fmt.Sscan(string(up), &secs)
	require.NoError(t, err)
	if secs < 24*86400 {
		require.NotContains(t, n.logs.String(), "SCHED", "no scheduler trace on a host up for less than 24 days")
	}
}
