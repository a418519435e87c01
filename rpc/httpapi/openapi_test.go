package httpapi

import (
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOpenAPI_MatchesRoutes keeps openapi.json in step with the routes:
// every registered method and path is described, with the route's name as
// operationId, and nothing else is; every $ref resolves.
func TestOpenAPI_MatchesRoutes(t *testing.T) {
	t.Parallel()
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	require.NoError(t, json.Unmarshal(openAPI, &doc))
	require.True(t, strings.HasPrefix(doc.OpenAPI, "3."), "an OpenAPI 3 document")

	srv, err := New(Config{Store: openRocks(t), Clock: testClock()})
	require.NoError(t, err)
	defer srv.Stop()
	var registered, described []string
	ops := map[string]string{}
	for _, rt := range srv.Routes() {
		key := rt.Method + " " + rt.Path
		registered = append(registered, key)
		ops[key] = rt.op
	}
	for path, methods := range doc.Paths {
		for method, raw := range methods {
			if method == "parameters" {
				continue
			}
			key := strings.ToUpper(method) + " " + path
			described = append(described, key)
			var o struct {
				OperationID string `json:"operationId"`
			}
			require.NoError(t, json.Unmarshal(raw, &o))
			if op, ok := ops[key]; ok {
				require.Equal(t, op, o.OperationID, "operationId of %s", key)
			}
		}
	}
	sort.Strings(registered)
	sort.Strings(described)
	require.Equal(t, registered, described, "routes registered vs described in openapi.json")

	var all any
	require.NoError(t, json.Unmarshal(openAPI, &all))
	var walk func(v any)
	refs := 0
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if ref, ok := v["$ref"].(string); ok {
				refs++
				require.True(t, strings.HasPrefix(ref, "#/"), ref)
				var cur any = all
				for _, part := range strings.Split(ref[2:], "/") {
					m, ok := cur.(map[string]any)
					require.True(t, ok, "%s", ref)
					cur, ok = m[part]
					require.True(t, ok, "%s does not resolve", ref)
				}
			}
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(all)
	require.Positive(t, refs)
}

func TestOpenAPI_Served(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	var doc map[string]any
	b.call(http.MethodGet, "/v1/openapi.json", nil, &doc)
	require.Equal(t, "leaseq HTTP API", doc["info"].(map[string]any)["title"])
}
