package rpc

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"runtime"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/schema"
	"github.com/leaseq/leaseq/storage"
)

// storageSentinels names every sentinel of storage/errors.go. The test
// below parses that file, so a new sentinel fails it until it is listed
// here and mapped in errorTable.
var storageSentinels = map[string]error{
	"ErrNotFound":        storage.ErrNotFound,
	"ErrLeaseMismatch":   storage.ErrLeaseMismatch,
	"ErrLeaseExpired":    storage.ErrLeaseExpired,
	"ErrInvalidArgument": storage.ErrInvalidArgument,
	"ErrClosed":          storage.ErrClosed,
	"ErrCorrupt":         storage.ErrCorrupt,
	"ErrNoSpace":         storage.ErrNoSpace,
	"ErrUnavailable":     storage.ErrUnavailable,
	"ErrNotEmpty":        storage.ErrNotEmpty,
}

func TestErrors_EveryStorageSentinelIsMapped(t *testing.T) {
	t.Parallel()
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(filepath.Dir(file), "..", "storage", "errors.go"), nil, 0)
	require.NoError(t, err)
	var names []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.VAR {
			continue
		}
		for _, spec := range g.Specs {
			for _, n := range spec.(*ast.ValueSpec).Names {
				if n.IsExported() {
					names = append(names, n.Name)
				}
			}
		}
	}
	sort.Strings(names)
	require.NotEmpty(t, names)
	for _, name := range names {
		sentinel, ok := storageSentinels[name]
		require.True(t, ok, "storage.%s is not listed in storageSentinels (and maybe not in errorTable)", name)
		mapped := false
		for _, e := range errorTable {
			if e.err == sentinel {
				mapped = true
			}
		}
		require.True(t, mapped, "storage.%s has no entry in errorTable", name)
		// Wrapped, as stores return them, it maps to its code.
		code := codeOf(fmt.Errorf("store: op: %w", sentinel))
		require.NotEqual(t, schema.ErrorCode_none, code)
	}
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
	for _, e := range errorTable {
		back := errorOf("op", e.code, "detail")
		require.Error(t, back)
		require.Equal(t, e.code, codeOf(back), "%v", e.err)
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
