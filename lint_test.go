package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// forbiddenTime are the functions of package time that read or wait on the
// real clock. Outside main.go and tests, code takes a clock.Clock (or an
// instant in its Params) instead, so tests can drive time with a mock.
var forbiddenTime = map[string]bool{
	"Now": true, "Sleep": true, "After": true, "Tick": true, "NewTimer": true,
	"NewTicker": true, "AfterFunc": true, "Since": true, "Until": true,
}

// lintFile reports the clock and logger rules violated by one parsed file.
// The rules are applied to the syntax tree, so a mention in a comment or a
// string does not count, and an import under another name does.
func lintFile(fset *token.FileSet, f *ast.File) []string {
	timeNames := map[string]bool{}
	slogNames := map[string]bool{}
	var bad []string
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		if path != "time" && path != "log/slog" {
			continue
		}
		name := filepath.Base(path)
		if imp.Name != nil {
			name = imp.Name.Name
		}
		if name == "." {
			bad = append(bad, fmt.Sprintf("%s: dot import of %q hides clock and logger calls", fset.Position(imp.Pos()), path))
			continue
		}
		if path == "time" {
			timeNames[name] = true
		} else {
			slogNames[name] = true
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		pkg, ok := sel.X.(*ast.Ident)
		// Obj is nil for identifiers the parser could not resolve in the
		// file, which is how package names look; a local variable named
		// time has an Obj and is not the package.
		if !ok || pkg.Obj != nil {
			return true
		}
		switch {
		case timeNames[pkg.Name] && forbiddenTime[sel.Sel.Name]:
			bad = append(bad, fmt.Sprintf("%s: time.%s: take a clock.Clock (or an instant in Params) instead", fset.Position(sel.Pos()), sel.Sel.Name))
		case slogNames[pkg.Name] && sel.Sel.Name == "Default":
			bad = append(bad, fmt.Sprintf("%s: slog.Default: inject a *slog.Logger instead", fset.Position(sel.Pos())))
		}
		return true
	})
	return bad
}

// testOnlyDirs hold packages that only _test.go files may import (enforced
// by TestImports_Rules), so they never reach the binary: they are test code
// that happens to be importable, and may seed from or time with the real
// clock like any _test.go file.
var testOnlyDirs = []string{"storage/storagetest/", "rpc/rpctest/"}

// lintExempt reports whether a repo-relative path may use the real clock
// and the default logger: package main at the root (the wiring: main.go,
// serve.go, ...) and test code.
func lintExempt(relPath string) bool {
	if !strings.Contains(relPath, "/") || strings.HasSuffix(relPath, "_test.go") {
		return true
	}
	for _, d := range testOnlyDirs {
		if strings.HasPrefix(relPath, d) {
			return true
		}
	}
	return false
}

func TestLint_ClockAndLogger(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	var bad []string
	files := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor" || name == "data") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || lintExempt(filepath.ToSlash(path)) {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0) // object resolution on: lintFile relies on it
		if err != nil {
			return err
		}
		files++
		bad = append(bad, lintFile(fset, f)...)
		return nil
	})
	require.NoError(t, err)
	require.Positive(t, files, "no Go files checked")
	sort.Strings(bad)
	require.Empty(t, bad, "real clock or default logger outside main.go and tests (STYLE.md §5, §11):\n%s", strings.Join(bad, "\n"))
}

// TestLint_Rules runs lintFile on made-up sources, so a rule that silently
// matches nothing fails here.
func TestLint_Rules(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		src  string
		want []string // substrings, one per expected finding, in order
	}{
		{"CommentAndStringDoNotCount", `package p
import "time"
// time.Now() is not called here; neither is time.Sleep.
var s = "time.Now()"
var d = time.Second`, nil},
		{"EveryForbiddenFunc", `package p
import "time"
func f() {
	_ = time.Now(); time.Sleep(1); <-time.After(1); _ = time.Tick(1); _ = time.NewTimer(1)
	_ = time.NewTicker(1); _ = time.AfterFunc(1, nil); _ = time.Since(time.Time{}); _ = time.Until(time.Time{})
}`, []string{"time.Now", "time.Sleep", "time.After", "time.Tick", "time.NewTimer", "time.NewTicker", "time.AfterFunc", "time.Since", "time.Until"}},
		{"FuncValueCounts", `package p
import "time"
var now = time.Now`, []string{"time.Now"}},
		{"RenamedImport", `package p
import stdtime "time"
var t = stdtime.Now()`, []string{"time.Now"}},
		{"DotImport", `package p
import . "time"
var t = Now()`, []string{"dot import"}},
		{"LocalVariableNamedTime", `package p
type c struct{}
func (c) Now() int { return 0 }
func f() int { var time c; return time.Now() }`, nil},
		{"OtherPackageNow", `package p
import "github.com/benbjohnson/clock"
var t = clock.New().Now()`, nil},
		{"SlogDefault", `package p
import "log/slog"
var l = slog.Default()
var m = slog.New(nil)`, []string{"slog.Default"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, "x.go", tc.src, 0)
			require.NoError(t, err)
			got := lintFile(fset, f)
			require.Len(t, got, len(tc.want), "%v", got)
			for i, w := range tc.want {
				require.Contains(t, got[i], w)
			}
		})
	}
	require.True(t, lintExempt("main.go"))
	require.True(t, lintExempt("serve.go"), "every file of package main at the root is wiring")
	require.True(t, lintExempt("sweeper/sweeper_test.go"))
	require.False(t, lintExempt("sweeper/sweeper.go"))
	require.False(t, lintExempt("cmd/main.go"))
	require.True(t, lintExempt("storage/storagetest/bench.go"))
	require.False(t, lintExempt("storage/memstore/memstore.go"))
}
