package errcode

import (
	"context"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leaseq/leaseq/storage"
)

// storageSentinels names every sentinel of storage/errors.go. The test
// below parses that file, so a new sentinel fails it until it is listed
// here and mapped in table.
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

func TestErrcode_EveryStorageSentinelIsMapped(t *testing.T) {
	t.Parallel()
	_, file, _, ok := runtime.Caller(0)
	require.True(t, ok)
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(filepath.Dir(file), "..", "..", "storage", "errors.go"), nil, 0)
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
		require.True(t, ok, "storage.%s is not listed in storageSentinels (and maybe not in table)", name)
		require.True(t, slices.Contains(Sentinels(), sentinel), "storage.%s has no entry in table", name)
		// Wrapped, as stores return them, it maps to its code.
		require.NotEqual(t, None, Of(fmt.Errorf("store: op: %w", sentinel)))
	}
}

func TestErrcode_Table(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		code Code
	}{
		{nil, None},
		{storage.ErrInvalidArgument, InvalidArgument},
		{fmt.Errorf("queue: %w", storage.ErrInvalidArgument), InvalidArgument},
		{storage.ErrNotFound, NotFound},
		{storage.ErrLeaseMismatch, LeaseMismatch},
		{storage.ErrLeaseExpired, LeaseExpired},
		{storage.ErrNotEmpty, NotEmpty},
		{storage.ErrClosed, Unavailable},
		{ErrUnavailable, Unavailable},
		{context.Canceled, Unavailable},
		{ErrTooManyWaiters, TooManyWaiters},
		{storage.ErrCorrupt, Internal},
		{storage.ErrNoSpace, Unavailable},
		{storage.ErrUnavailable, Unavailable},
		{errors.New("disk on fire"), Internal},
	} {
		require.Equal(t, c.code, Of(c.err), "%v", c.err)
	}
	// Every code maps back to a sentinel that maps to it again.
	for _, c := range All() {
		require.Equal(t, c, Of(Sentinel(c)), "%v", c)
	}
	require.NoError(t, Sentinel(None))
	require.ErrorIs(t, Sentinel(Code(999)), ErrInternal, "a code from a newer server is internal")
	require.Equal(t, "code(999)", Code(999).String())
	require.Len(t, All(), 8)
}

func TestErrcode_ItemCodeNames(t *testing.T) {
	t.Parallel()
	require.Equal(t, "ok", ItemCodeName(storage.CodeOK))
	require.Equal(t, "notFound", ItemCodeName(storage.CodeNotFound))
	require.Equal(t, "leaseMismatch", ItemCodeName(storage.CodeLeaseMismatch))
	require.Equal(t, "leaseExpired", ItemCodeName(storage.CodeLeaseExpired))
	require.Equal(t, "invalid", ItemCodeName(storage.CodeInvalid))
	require.Equal(t, "invalid", ItemCodeName(storage.Code(77)))
}

func TestErrcode_InternalReasonHidesCause(t *testing.T) {
	t.Parallel()
	err := InternalReason(errors.New("rocksdb: IO error: /srv/data/000123.sst"), 7)
	require.ErrorIs(t, err, ErrInternal)
	require.NotContains(t, err.Error(), "/srv")
	require.Contains(t, err.Error(), "ref=7")
	require.ErrorIs(t, InternalReason(fmt.Errorf("x: %w", storage.ErrCorrupt), 8), storage.ErrCorrupt)
}
