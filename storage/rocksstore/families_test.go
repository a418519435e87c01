package rocksstore

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
)

// Every namespace of dbkeys (the bytes from NsMeta to NsPayload) has a
// column family of its own, and no two share a name: a namespace added to
// dbkeys without a family here would panic at its first write.
func TestFamilies_EveryNamespace(t *testing.T) {
	seen := map[string]byte{}
	for ns := dbkeys.NsMeta; ns <= dbkeys.NsPayload; ns++ {
		name, ok := familyNames[ns]
		require.True(t, ok, "namespace %#x has no column family", ns)
		require.NotEqual(t, defaultFamily, name)
		_, dup := seen[name]
		require.False(t, dup, "family %q named twice", name)
		seen[name] = ns
	}
	require.Len(t, familyNames, len(seen), "a family for a byte outside the namespaces")
	require.Equal(t, len(seen)+1, len(familyList()), "every family and default")
}
