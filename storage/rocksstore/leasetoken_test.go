package rocksstore

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// Lease tokens count up in their first 8 bytes, so the keys of new leases
// sort after the ones before them (newToken), and keep 8 random bytes:
// two stores, or one reopened, do not hand out the same sequence of
// tokens.
func TestRocksStore_LeaseTokensCountUp(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueueN("q", at(0), 8)
	var tokens []storage.LeaseID
	var items []storage.ItemID
	for i := range 4 {
		res := b.poll("q", 1, time.Minute, at(time.Duration(i+1)*time.Second))
		require.Len(t, res.Items, 1)
		tokens = append(tokens, res.Lease)
		items = append(items, res.Items[0].ID)
	}
	for i := 1; i < len(tokens); i++ {
		prev, cur := tokens[i-1], tokens[i]
		require.Equal(t, binary.BigEndian.Uint64(prev[:8])+1, binary.BigEndian.Uint64(cur[:8]), "token %d counts on from %d", i, i-1)
		require.Negative(t, bytes.Compare(prev[:], cur[:]), "token %d sorts after %d", i, i-1)
		require.NotEqual(t, prev[8:], cur[8:], "random halves")
	}

	// Reopened, the store starts counting from a new random start, and
	// the leases made before are still served by their tokens.
	b.reopen()
	res := b.poll("q", 1, time.Minute, at(10*time.Second))
	require.Len(t, res.Items, 1)
	for _, tok := range tokens {
		require.NotEqual(t, tok, res.Lease)
	}
	for i, tok := range tokens {
		require.Equal(t, []storage.Code{storage.CodeOK}, b.ack("q", tok, at(11*time.Second), items[i]), "lease %d", i)
	}
}
