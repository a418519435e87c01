package rocksstore

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/dbkeys"
)

// TestBatchIO checks the batched C calls against grocksdb's own: writes
// applied through applyWrites read back through grocksdb from the key's
// column family, and getManyForUpdate returns what grocksdb's Get does,
// for present, missing, empty and large values (larger than its first
// output buffer). It fails (or crashes) if grocksdb's structs stop holding
// their C handle first.
func TestBatchIO(t *testing.T) {
	s, err := Open(t.TempDir(), Options{Sync: SyncNone, Now: time.Now})
	require.NoError(t, err)
	defer s.Close()

	big := bytes.Repeat([]byte("x"), 5000)
	var keys, want [][]byte
	var w writeBuf
	for i := range 40 {
		// Keys of three namespaces, so of three column families.
		ns := []byte{dbkeys.NsAvailable, dbkeys.NsLeases, dbkeys.NsPayload}[i%3]
		k := append([]byte{ns}, fmt.Sprintf("test/%03d", i)...)
		var v []byte
		switch i % 4 {
		case 0:
			v = []byte(fmt.Sprintf("value %d", i))
		case 1:
			v = nil // never written: missing
		case 2:
			v = []byte{}
		case 3:
			v = append(big[:i:i], big...)
		}
		if i%4 != 1 {
			w.put(k, v)
		}
		keys, want = append(keys, k), append(want, v)
	}
	// A put then a delete of the same key in one batch leaves it missing.
	gone := []byte("\x05test/gone")
	w.put(gone, []byte("soon deleted"))
	w.del(gone)
	keys, want = append(keys, gone), append(want, nil)

	txn := s.db.TransactionBegin(s.wo, s.txo, nil)
	defer txn.Destroy()
	applyWrites(txn.GetWriteBatchWI(), s.fams, &w)
	require.NoError(t, txn.Commit())

	for i, k := range keys {
		sl, err := s.db.GetCF(s.ro, s.fams.of(k), k)
		require.NoError(t, err)
		require.Equal(t, want[i] != nil, sl.Exists(), "key %q", k)
		if want[i] != nil {
			require.Equal(t, want[i], sl.Data(), "key %q", k)
		}
		sl.Free()
		// Nothing lands in another family.
		other := s.fams.byNs[dbkeys.NsDLQ]
		sl, err = s.db.GetCF(s.ro, other, k)
		require.NoError(t, err)
		require.False(t, sl.Exists(), "key %q in the dlq family", k)
		sl.Free()
	}

	rtx := s.db.TransactionBegin(s.wo, s.txo, nil)
	defer rtx.Destroy()
	got, err := getManyForUpdate(rtx, s.ro, s.fams, keys)
	require.NoError(t, err)
	require.Len(t, got, len(keys))
	for i := range keys {
		if want[i] == nil {
			require.Nil(t, got[i], "key %q", keys[i])
			continue
		}
		require.NotNil(t, got[i], "key %q", keys[i])
		require.Equal(t, want[i], got[i], "key %q", keys[i])
	}
	require.NoError(t, rtx.Rollback())

	got, err = getManyForUpdate(rtx, s.ro, s.fams, nil)
	require.NoError(t, err)
	require.Empty(t, got)
}
