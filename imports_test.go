package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The package dependency rules of STYLE.md §1, checked on the real package
// graph from `go list -deps`. Dependencies point one way:
// dbkeys <- storage <- {sweeper, rpc, fdbsync, bench} <- main.

const modulePath = "github.com/leaseq/leaseq"

// Third-party roots the rules talk about.
const (
	grocksdbPath = "github.com/linxGnu/grocksdb"
	fdbPath      = "github.com/apple/foundationdb"
	capnpPath    = "capnproto.org/go/capnp"
	clockPath    = "github.com/benbjohnson/clock"
	chromedpPath = "github.com/chromedp"
)

// listedPackage is the part of `go list -json` output the rules need.
type listedPackage struct {
	ImportPath string
	Standard   bool
	Imports    []string // direct, non-test
	Deps       []string // transitive, non-test
}

// graph is the module's packages plus everything they depend on.
type graph struct {
	pkgs map[string]*listedPackage
	// own are the module's packages, sorted.
	own []string
}

// importRules holds the rule tables, so the rule engine can be tested on a
// synthetic graph as well as run on the real one.
type importRules struct {
	// exclusive: a direct import of a package under key is allowed only
	// from packages under one of the listed prefixes (module-relative;
	// "." is the root package main). Prefixes cover sub-packages.
	exclusive map[string][]string
	// forbidden: a package under key (module-relative) must not depend,
	// even transitively, on any package under the listed paths (module-
	// relative or full import paths).
	forbidden map[string][]string
	// stdlibOnly: packages under these prefixes depend only on the
	// standard library (and the module's own packages allowed by the
	// other rules).
	stdlibOnly []string
	// directOnly: a package under key imports directly only the standard
	// library, the module's own packages, and the listed roots.
	directOnly map[string][]string
}

// leaseqRules are STYLE.md §1. fdbTag reports whether the graph was listed
// with -tags fdb (the only build in which apple/foundationdb may appear).
func leaseqRules(fdbTag bool) importRules {
	fdbImporters := []string{"fdbsync"}
	if !fdbTag {
		// The default build must not need libfdb_c: nobody imports fdb.
		fdbImporters = nil
	}
	return importRules{
		exclusive: map[string][]string{
			grocksdbPath:                        {"storage/rocksstore"},
			fdbPath:                             fdbImporters,
			capnpPath:                           {"schema", "rpc", "bench", "."},
			modulePath + "/bench":               {"bench", "."},
			modulePath + "/storage/storagetest": {"storage/storagetest"}, // only _test.go files import it
			modulePath + "/rpc/rpctest":         {"rpc/rpctest"},         // test helpers: only _test.go files import it
			// Queueber's protocol: its generated code is the business of its
			// server alone, and only main wires that server in.
			modulePath + "/schema/queueber": {"rpc/queueber"},
			modulePath + "/rpc/queueber":    {"."},
			// The headless-browser driver is for rpc/webui's _test.go files
			// only: no package of the binary imports it.
			chromedpPath: nil,
			// The invariant rules of Check: the backends feed them facts.
			modulePath + "/storage/check":           {"storage/check", "storage/rocksstore", "storage/memstore", "fdbsync"},
			modulePath + "/storage/check/checktest": {"storage/check/checktest"}, // only _test.go files import it
		},
		forbidden: map[string][]string{
			"dbkeys": {"storage", "sweeper", "rpc", "fdbsync", "bench", "schema", clockPath},
			// The root storage package: the contract. No clock, no backend.
			"storage!":            {clockPath, grocksdbPath, fdbPath, capnpPath, "storage/rocksstore", "storage/memstore", "storage/storagetest", "fdbsync"},
			"storage/rocksstore":  {clockPath, "sweeper", "rpc", "fdbsync", "bench", "schema", fdbPath, capnpPath},
			"storage/memstore":    {clockPath, "sweeper", "rpc", "fdbsync", "bench", "schema", "storage/rocksstore", grocksdbPath, fdbPath, capnpPath},
			"storage/storagetest": {"sweeper", "rpc", "fdbsync", "bench", "schema", capnpPath},
			"sweeper":             {"rpc", "schema", "fdbsync", "bench", "storage/rocksstore", grocksdbPath, fdbPath, capnpPath},
			"rpc":                 {"sweeper", "fdbsync", "bench", "storage/rocksstore", grocksdbPath, fdbPath},
			"rpc!":                {"rpc/queueber", "schema/queueber"}, // the Queue server knows nothing of Queueber's
			"rpc/errcode":         {capnpPath, "schema", "rpc!"},       // the error table every front end shares
			"rpc/httpapi":         {capnpPath, "schema", "rpc!"},       // HTTP/JSON shares errcode and dispatch, not Cap'n Proto
			"fdbsync":             {"sweeper", "rpc", "bench", "schema", "storage/rocksstore", grocksdbPath, capnpPath},
			"schema":              {"storage", "dbkeys", "sweeper", "rpc", "fdbsync", "bench", grocksdbPath, fdbPath},
			// The dashboard is HTML over a storage.Store: no Cap'n Proto, and
			// not the RPC server it sits beside (main wires both).
			"rpc/webui": {"rpc!", "rpc/dispatch", "schema", capnpPath, "storage/memstore", "storage/storagetest", chromedpPath},
			// Pure rules over facts: no backend, no database, no clock.
			"storage/check": {clockPath, grocksdbPath, fdbPath, capnpPath, "dbkeys", "storage/rocksstore", "storage/memstore", "storage/storagetest", "fdbsync", "sweeper", "rpc", "bench", "schema"},
		},
		stdlibOnly: []string{"dbkeys"},
		directOnly: map[string][]string{
			"schema": {capnpPath},
		},
	}
}

// rel returns p relative to the module ("." for the root), and whether p
// is in the module at all.
func rel(p string) (string, bool) {
	switch {
	case p == modulePath:
		return ".", true
	case strings.HasPrefix(p, modulePath+"/"):
		return p[len(modulePath)+1:], true
	}
	return "", false
}

// under reports whether path p is prefix or inside it. A prefix ending in
// "!" matches only itself, not sub-packages; so does "." (the root). Prefixes
// without a dot in the first element are module-relative.
func under(p, prefix string) bool {
	exact := strings.HasSuffix(prefix, "!")
	prefix = strings.TrimSuffix(prefix, "!")
	switch {
	case prefix == ".": // the root package main, never its sub-packages
		prefix, exact = modulePath, true
	case !strings.Contains(strings.Split(prefix, "/")[0], "."):
		prefix = modulePath + "/" + prefix
	}
	if exact {
		return p == prefix
	}
	return p == prefix || strings.HasPrefix(p, prefix+"/")
}

func (g *graph) isStd(p string) bool {
	if lp := g.pkgs[p]; lp != nil {
		return lp.Standard
	}
	return !strings.Contains(strings.Split(p, "/")[0], ".") && p != "C"
}

// check returns one line per violated rule, sorted.
func (r importRules) check(g *graph) []string {
	var bad []string
	for _, p := range g.own {
		lp := g.pkgs[p]
		relP, _ := rel(p)
		for _, imp := range lp.Imports {
			for target, allowed := range r.exclusive {
				if !under(imp, target) {
					continue
				}
				if !slices.ContainsFunc(allowed, func(a string) bool { return under(p, a) }) {
					bad = append(bad, fmt.Sprintf("%s imports %s: only %v may", relP, imp, allowed))
				}
			}
		}
		for pkgPrefix, forbidden := range r.forbidden {
			if !under(p, pkgPrefix) {
				continue
			}
			for _, dep := range lp.Deps {
				for _, f := range forbidden {
					if under(dep, f) {
						bad = append(bad, fmt.Sprintf("%s depends on %s (forbidden: %s)", relP, dep, f))
					}
				}
			}
		}
		for _, prefix := range r.stdlibOnly {
			if !under(p, prefix) {
				continue
			}
			for _, dep := range lp.Deps {
				if _, own := rel(dep); !own && !g.isStd(dep) {
					bad = append(bad, fmt.Sprintf("%s depends on %s: stdlib only", relP, dep))
				}
			}
		}
		for prefix, allowed := range r.directOnly {
			if !under(p, prefix) {
				continue
			}
			for _, imp := range lp.Imports {
				if _, own := rel(imp); own || g.isStd(imp) {
					continue
				}
				if !slices.ContainsFunc(allowed, func(a string) bool { return under(imp, a) }) {
					bad = append(bad, fmt.Sprintf("%s imports %s: only stdlib and %v", relP, imp, allowed))
				}
			}
		}
	}
	sort.Strings(bad)
	return slices.Compact(bad)
}

// loadGraph runs `go list -deps -json` over the whole module.
func loadGraph(t *testing.T, tags string) *graph {
	t.Helper()
	args := []string{"list", "-e", "-deps", "-json=ImportPath,Standard,Imports,Deps,Error"}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	args = append(args, "./...")
	cmd := exec.Command("go", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go %s: %s", strings.Join(args, " "), stderr.String())
	g := &graph{pkgs: map[string]*listedPackage{}}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var lp listedPackage
		err := dec.Decode(&lp)
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		g.pkgs[lp.ImportPath] = &lp
		if _, own := rel(lp.ImportPath); own {
			g.own = append(g.own, lp.ImportPath)
		}
	}
	sort.Strings(g.own)
	return g
}

func TestImports_Rules(t *testing.T) {
	t.Parallel()
	for _, tags := range []string{"", "fdb"} {
		t.Run("tags="+tags, func(t *testing.T) {
			t.Parallel()
			g := loadGraph(t, tags)
			require.Contains(t, g.own, modulePath, "the root package was listed")
			require.Contains(t, g.own, modulePath+"/storage", "the storage package was listed")
			bad := leaseqRules(tags == "fdb").check(g)
			require.Empty(t, bad, "forbidden package dependencies (STYLE.md §1):\n%s", strings.Join(bad, "\n"))
		})
	}
}

// TestImports_RulesCatchViolations runs the rule engine on a made-up graph
// with one violation of each kind, so a rule that silently matches nothing
// fails here instead of passing forever.
func TestImports_RulesCatchViolations(t *testing.T) {
	t.Parallel()
	m := func(s string) string { return modulePath + "/" + s }
	pkgs := []*listedPackage{
		{ImportPath: modulePath, Imports: []string{m("bench"), m("sweeper"), m("rpc/queueber")}, Deps: []string{m("bench"), m("sweeper"), m("storage"), m("rpc/queueber")}},
		{ImportPath: m("dbkeys"), Imports: []string{"bytes", "github.com/x/y"}, Deps: []string{"bytes", "github.com/x/y"}},
		{ImportPath: m("storage"), Imports: []string{clockPath}, Deps: []string{clockPath}},
		{ImportPath: m("storage/rocksstore"), Imports: []string{grocksdbPath, m("storage")}, Deps: []string{grocksdbPath, m("storage")}},
		{ImportPath: m("sweeper"), Imports: []string{m("storage/rocksstore")}, Deps: []string{m("storage/rocksstore"), grocksdbPath, m("storage")}},
		{ImportPath: m("rpc"), Imports: []string{m("bench"), capnpPath + "/v3", m("storage/check")}, Deps: []string{m("bench"), capnpPath + "/v3", m("storage/check")}},
		{ImportPath: m("storage/check"), Imports: []string{m("storage/memstore")}, Deps: []string{m("storage/memstore")}},
		{ImportPath: m("storage/memstore"), Imports: []string{m("storage/check")}, Deps: []string{m("storage/check")}},
		{ImportPath: m("schema"), Imports: []string{capnpPath + "/v3", "github.com/other/lib"}, Deps: []string{capnpPath + "/v3", "github.com/other/lib"}},
		{ImportPath: m("fdbsync"), Imports: []string{fdbPath + "/bindings/go/src/fdb", m("storage/storagetest")}, Deps: []string{fdbPath + "/bindings/go/src/fdb", m("storage/storagetest")}},
		{ImportPath: m("bench"), Imports: []string{m("rpc"), m("rpc/queueber")}, Deps: []string{m("rpc"), m("rpc/queueber")}},
		{ImportPath: m("rpc/queueber"), Imports: []string{m("rpc"), m("schema/queueber")}, Deps: []string{m("rpc"), m("schema/queueber")}},
		{ImportPath: m("schema/queueber"), Imports: []string{capnpPath + "/v3"}, Deps: []string{capnpPath + "/v3"}},
		{ImportPath: m("rpc/httpapi"), Imports: []string{m("rpc")}, Deps: []string{m("rpc"), m("schema"), capnpPath + "/v3"}},
		{ImportPath: m("rpc/webui"), Imports: []string{m("rpc"), chromedpPath + "/chromedp"}, Deps: []string{m("rpc"), chromedpPath + "/chromedp", capnpPath + "/v3"}},
		{ImportPath: "bytes", Standard: true},
		{ImportPath: "github.com/x/y"},
	}
	g := &graph{pkgs: map[string]*listedPackage{}}
	for _, p := range pkgs {
		g.pkgs[p.ImportPath] = p
		if _, own := rel(p.ImportPath); own {
			g.own = append(g.own, p.ImportPath)
		}
	}
	sort.Strings(g.own)

	bad := strings.Join(leaseqRules(false).check(g), "\n")
	for _, want := range []string{
		"dbkeys depends on github.com/x/y: stdlib only",
		"storage depends on github.com/benbjohnson/clock",
		"sweeper depends on github.com/leaseq/leaseq/storage/rocksstore",
		"sweeper depends on github.com/linxGnu/grocksdb",
		"rpc imports github.com/leaseq/leaseq/bench: only [bench .] may",
		"rpc depends on github.com/leaseq/leaseq/bench",
		"schema imports github.com/other/lib: only stdlib and [capnproto.org/go/capnp]",
		"fdbsync imports github.com/apple/foundationdb/bindings/go/src/fdb: only [] may",
		"fdbsync imports github.com/leaseq/leaseq/storage/storagetest",
		"bench imports github.com/leaseq/leaseq/rpc/queueber: only [.] may",
		"rpc/httpapi depends on github.com/leaseq/leaseq/rpc (forbidden: rpc!)",
		"rpc/httpapi depends on capnproto.org/go/capnp/v3",
		"rpc/webui depends on github.com/leaseq/leaseq/rpc (forbidden: rpc!)",
		"rpc/webui depends on capnproto.org/go/capnp/v3",
		"rpc/webui imports github.com/chromedp/chromedp: only [] may",
		"rpc imports github.com/leaseq/leaseq/storage/check: only [storage/check storage/rocksstore storage/memstore fdbsync] may",
		"storage/check depends on github.com/leaseq/leaseq/storage/memstore",
	} {
		require.Contains(t, bad, want)
	}
	for _, notWant := range []string{
		"storage/rocksstore imports github.com/linxGnu/grocksdb", // the one allowed importer
		". imports github.com/leaseq/leaseq/bench",               // main may import bench
		"rpc imports capnproto.org",                              // rpc may use capnp
		". imports github.com/leaseq/leaseq/rpc/queueber",        // main wires the Queueber server
		"rpc/queueber imports",                                   // its schema and rpc
		"storage/memstore imports",                               // a backend feeds the rules
	} {
		require.NotContains(t, bad, notWant)
	}
	// With the fdb tag, fdbsync may import the bindings.
	require.NotContains(t, strings.Join(leaseqRules(true).check(g), "\n"), "fdbsync imports github.com/apple")
}
