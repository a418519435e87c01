package rpc

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/rpc/errcode"
	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// TestErrors_CodesMirrorSchema: errcode's codes and item code names are
// the schema's enums, value for value and name for name, so the one table
// in errcode is the wire mapping too.
func TestErrors_CodesMirrorSchema(t *testing.T) {
	t.Parallel()
	codes := append([]errcode.Code{errcode.None}, errcode.All()...)
	for _, c := range codes {
		require.Equal(t, schema.ErrorCode(c).String(), c.String(), "errcode.Code(%d)", c)
	}
	require.Equal(t, "", schema.ErrorCode(len(codes)).String(), "the schema has a code errcode lacks")
	for c := storage.CodeOK; c <= storage.CodeInvalid; c++ {
		require.Equal(t, wireCode(c).String(), errcode.ItemCodeName(c))
	}
	require.Equal(t, "", schema.ResultCode(storage.CodeInvalid+1).String(), "the schema has a result code errcode lacks")
}

func TestErrors_Table(t *testing.T) {
	t.Parallel()
	cases := []struct {
		err  error
		code schema.ErrorCode
	}{
		{nil, schema.ErrorCode_none},
		{storage.ErrInvalidArgument, schema.ErrorCode_invalidArgument},
		{storage.ErrNotFound, schema.ErrorCode_notFound},
		{storage.ErrLeaseMismatch, schema.ErrorCode_leaseMismatch},
		{storage.ErrLeaseExpired, schema.ErrorCode_leaseExpired},
		{storage.ErrClosed, schema.ErrorCode_unavailable},
		{ErrUnavailable, schema.ErrorCode_unavailable},
		{ErrTooManyWaiters, schema.ErrorCode_tooManyWaiters},
		{storage.ErrCorrupt, schema.ErrorCode_internal},
		{storage.ErrNoSpace, schema.ErrorCode_unavailable},
		{storage.ErrUnavailable, schema.ErrorCode_unavailable},
		{errors.New("disk on fire"), schema.ErrorCode_internal},
	}
	for _, c := range cases {
		require.Equal(t, c.code, codeOf(c.err), "%v", c.err)
	}
	// Every code the server can send maps back to a sentinel the client
	// can match, and round-trips to the same code.
	for _, sentinel := range errcode.Sentinels() {
		code := codeOf(sentinel)
		back := errorOf("op", code, "detail")
		require.Error(t, back)
		require.Equal(t, code, codeOf(back), "%v", sentinel)
		var se *StatusError
		require.True(t, errors.As(back, &se))
		require.Equal(t, "detail", se.Message)
	}
	require.NoError(t, errorOf("op", schema.ErrorCode_none, ""))
	// A code from a newer server is internal, not silently success.
	require.ErrorIs(t, errorOf("op", schema.ErrorCode(999), "x"), ErrInternal)
}

func TestErrors_ResultCodesMirrorStorage(t *testing.T) {
	t.Parallel()
	pairs := map[storage.Code]schema.ResultCode{
		storage.CodeOK:            schema.ResultCode_ok,
		storage.CodeNotFound:      schema.ResultCode_notFound,
		storage.CodeLeaseMismatch: schema.ResultCode_leaseMismatch,
		storage.CodeLeaseExpired:  schema.ResultCode_leaseExpired,
		storage.CodeInvalid:       schema.ResultCode_invalid,
	}
	for sc, wc := range pairs {
		require.Equal(t, wc, wireCode(sc))
		require.Equal(t, sc, storageCode(wc))
		require.Equal(t, sc.String(), map[schema.ResultCode]string{
			schema.ResultCode_ok: "ok", schema.ResultCode_notFound: "not_found",
			schema.ResultCode_leaseMismatch: "lease_mismatch", schema.ResultCode_leaseExpired: "lease_expired",
			schema.ResultCode_invalid: "invalid",
		}[wc])
	}
	require.Equal(t, storage.CodeInvalid, storageCode(schema.ResultCode(77)))
	// ItemState mirrors storage.State.
	for s := storage.StateUnknown; s <= storage.StateDead; s++ {
		require.Equal(t, s.String(), map[schema.ItemState]string{
			schema.ItemState_unknown: "unknown", schema.ItemState_ready: "ready", schema.ItemState_delayed: "delayed",
			schema.ItemState_inflight: "inflight", schema.ItemState_dead: "dead",
		}[schema.ItemState(s)])
	}
}

// pathStore fails every Stats with an error naming a server file.
type pathStore struct{ storage.Store }

func (pathStore) Stats(context.Context, storage.StatsParams) ([]storage.QueueStats, error) {
	return nil, errors.New("rocksstore: stats: rocksdb: IO error: /srv/leaseq/data/000123.sst: No space left on device")
}

func TestErrors_InternalReasonHidesCause(t *testing.T) {
	t.Parallel()
	b := setup(t, bundleOpts{factory: storeFactory{"path", func(t *testing.T) storage.Store {
		return pathStore{memFactory().open(t)}
	}}})
	c := b.dial()
	_, err := c.Stats(ctxT(t), "q")
	require.ErrorIs(t, err, ErrInternal)
	require.NotContains(t, err.Error(), "/srv/leaseq")
	require.NotContains(t, err.Error(), "rocksdb")
	require.Contains(t, err.Error(), "ref=1")
}

func TestErrors_Overloaded(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("x: %w", storage.ErrClosed), true},
		{fmt.Errorf("x: %w", storage.ErrNoSpace), true},
		{fmt.Errorf("x: %w", ErrUnavailable), true},
		{fmt.Errorf("x: %w", ErrTooManyWaiters), true},
		{context.Canceled, true},
		{fmt.Errorf("x: %w", storage.ErrInvalidArgument), false},
		{fmt.Errorf("x: %w", storage.ErrLeaseExpired), false},
		{fmt.Errorf("x: %w", storage.ErrCorrupt), false},
		{errors.New("disk on fire"), false},
		{nil, false},
	} {
		require.Equal(t, c.want, Overloaded(c.err), "%v", c.err)
	}
}
