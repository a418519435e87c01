package kv_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/fdbsync/kv"
)

func TestKV_RetryPredicates(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		code                    int
		retryable, maybe, confl bool
	}{
		{kv.CodeNotCommitted, true, false, true},
		{kv.CodeTransactionTooOld, true, false, false},
		{kv.CodeFutureVersion, true, false, false},
		{kv.CodeCommitUnknownResult, true, true, false},
		{kv.CodeClusterVersionChanged, true, true, false},
		{kv.CodeProcessBehind, true, false, false},
		{kv.CodeTagThrottled, true, false, false},
		{kv.CodeTransactionTimedOut, false, false, false},
		{kv.CodeTransactionTooLarge, false, false, false},
		{kv.CodeValueTooLarge, false, false, false},
		{kv.CodeTransactionCancelled, false, false, false},
	} {
		t.Run(fmt.Sprint(c.code), func(t *testing.T) {
			t.Parallel()
			err := fmt.Errorf("op: %w", kv.Error{Code: c.code})
			require.Equal(t, c.code, kv.CodeOf(err), "found through wrapping")
			require.Equal(t, c.retryable, kv.IsRetryable(err))
			require.Equal(t, c.maybe, kv.IsMaybeCommitted(err))
			require.Equal(t, c.confl, kv.IsConflict(err))
		})
	}
	require.Zero(t, kv.CodeOf(errors.New("plain")))
	require.False(t, kv.IsRetryable(nil))
	require.Contains(t, kv.Error{Code: kv.CodeNotCommitted}.Error(), "not_committed")
}

func TestKV_KeyHelpers(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ in, end []byte }{
		{[]byte("a"), []byte("b")},
		{[]byte{'a', 0xff}, []byte("b")},
		{[]byte{0x01, 0xff, 0xff}, []byte{0x02}},
		{[]byte{0xff, 0xff}, nil},
	} {
		require.Equal(t, c.end, kv.PrefixEnd(c.in), "%x", c.in)
	}
	in := []byte("k")
	after := kv.KeyAfter(in)
	require.Equal(t, []byte("k\x00"), after)
	require.Equal(t, []byte("k"), in, "the input is not modified")
}
