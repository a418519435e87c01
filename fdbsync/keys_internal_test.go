package fdbsync

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

func TestFDBKeys_StringsKeepOrderAndAreNoPrefixTrap(t *testing.T) {
	t.Parallel()
	in := []string{"", "\x00", "\x00\x00", "\x00\x01", "\x01", "a", "a\x00", "a\x00b", "ab", "b", "\xff"}
	for i := range in {
		enc := appendStr(nil, in[i])
		got, rest, err := readStr(append(enc, 'X'))
		require.NoError(t, err)
		require.Equal(t, in[i], got)
		require.Equal(t, []byte("X"), rest)
		for j := range in {
			require.Equal(t, strings.Compare(in[i], in[j]), bytes.Compare(enc, appendStr(nil, in[j])), "%q vs %q", in[i], in[j])
		}
	}
	k := keys{prefix: []byte("p")}
	// Everything of queue "a" sorts apart from queue "ab".
	a := k.available("a", storage.ItemID{0xff})
	ab := k.available("ab", storage.ItemID{})
	require.True(t, bytes.HasPrefix(a, k.availablePrefix("a")))
	require.False(t, bytes.HasPrefix(ab, k.availablePrefix("a")))
	_, _, err := readStr([]byte("unterminated"))
	require.Error(t, err)
}

func TestFDBKeys_TimesKeepOrderAcrossTheEpoch(t *testing.T) {
	t.Parallel()
	ts := []time.Time{time.Unix(-5, 0), time.Unix(0, 0), time.Unix(0, 1), time.Unix(1<<32, 0)}
	for i := range ts {
		got, _, err := readTime(appendTime(nil, ts[i]))
		require.NoError(t, err)
		require.True(t, got.Equal(ts[i]))
		if i > 0 {
			require.Equal(t, -1, bytes.Compare(appendTime(nil, ts[i-1]), appendTime(nil, ts[i])))
		}
	}
}

func TestFDBRecords_RoundTrip(t *testing.T) {
	t.Parallel()
	r := record{prio: 3, delayed: true, attempts: 2, maxAttempts: 9, enqueuedAt: time.Unix(0, 0), visibleAt: time.Unix(7, 8),
		dedupKey: "k", lastError: "e", lease: storage.LeaseID{1}, reason: "nack: x", inline: []byte("payload")}
	got, err := decodeRecord(r.encode())
	require.NoError(t, err)
	require.Equal(t, r.encode(), got.encode())
	require.True(t, got.deadAt.IsZero(), "the zero time survives (it is not the epoch)")
	require.True(t, got.enqueuedAt.Equal(time.Unix(0, 0)), "the epoch survives (it is not the zero time)")
	c := record{chunked: true, pid: [16]byte{9}, size: 200_000, nchunks: 3}
	got, err = decodeRecord(c.encode())
	require.NoError(t, err)
	require.Equal(t, c.encode(), got.encode())
	_, err = decodeRecord([]byte{fmtItem, 0})
	require.ErrorIs(t, err, storage.ErrCorrupt)
	l := leaseRec{queue: "q", expiry: time.Unix(3, 4), ids: []storage.ItemID{{1}, {2}}}
	gl, err := decodeLease(l.encode())
	require.NoError(t, err)
	require.Equal(t, l.encode(), gl.encode())
	_, err = decodeLease([]byte{fmtLease, 0, 0, 0, 1, 'q', 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	require.ErrorIs(t, err, storage.ErrCorrupt, "an id count past the end is rejected, not allocated")
}
