package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
	checkrules "github.com/leaseq/leaseq/storage/check"
)

// TestCheck_PrintReport: one line per listed violation with its kind, and
// a summary with the total, saying when the list was capped.
func TestCheck_PrintReport(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		rep     storage.CheckReport
		lines   int
		summary string
	}{
		{"Clean", storage.CheckReport{Items: 3, Leases: 1}, 1, "ok: /d: 3 items, 1 leases, all invariants hold"},
		{"Broken", storage.CheckReport{Items: 3, Leases: 1, Total: 2, Violations: []storage.Violation{
			{Kind: checkrules.KindCounterMismatch, Msg: `invariant 4: queue "q": ready counter is 2, a scan counts 1`},
			{Kind: checkrules.KindCorrupt, Msg: "available: bad key 02"},
		}}, 2, "/d: 2 invariant violations (3 items, 1 leases)"},
		{"Capped", storage.CheckReport{Items: 3, Total: 1500, Violations: []storage.Violation{
			{Kind: checkrules.KindCorrupt, Msg: "available: bad key 02"},
		}}, 1, "/d: 1500 invariant violations, the first 1 listed (3 items, 0 leases)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var out bytes.Buffer
			err := printReport(&env{stdout: &out}, tc.rep, nil, "/d")
			lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
			if tc.rep.OK() {
				require.NoError(t, err)
				require.Equal(t, []string{tc.summary}, lines)
				return
			}
			var x exitError
			require.True(t, errors.As(err, &x), "%v", err)
			require.Equal(t, exitFailure, x.code)
			require.Equal(t, tc.summary, err.Error())
			require.Len(t, lines, tc.lines)
			for i, v := range tc.rep.Violations {
				require.Equal(t, v.Msg+" ["+string(v.Kind)+"]", lines[i])
			}
		})
	}
}
