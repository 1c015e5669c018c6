package spec_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/spec"
)

func shop() spec.Snapshot {
	return spec.Snapshot{
		Policies: []spec.Policy{
			{ID: "post-orders", Rate: &spec.Rate{Requests: 2, Per: spec.Duration(time.Minute)}},
			{ID: "get-orders", Rate: &spec.Rate{Requests: 10, Per: spec.Duration(time.Minute)}},
			{ID: "elsewhere", Rate: &spec.Rate{Requests: 1, Per: spec.Duration(time.Minute)}, APIs: []string{"other"}},
			{ID: "global", Quota: &spec.Quota{Max: 10, Renewal: spec.Duration(time.Hour), Global: &spec.GlobalQuota{Mode: "strict"}}},
		},
		APIs: []spec.API{
			{ID: "shop", ListenPath: "/shop/", Target: spec.BuiltinEcho, Endpoints: []spec.Endpoint{
				{Method: "POST", Path: "/orders", Policies: []string{"post-orders"}},
				{Method: "GET", Path: "/orders", Policies: []string{"get-orders"}, Cost: 1},
			}},
			{ID: "other", ListenPath: "/other/", Target: spec.BuiltinEcho},
		},
	}
}

func TestEndpointsJSON(t *testing.T) {
	s := shop()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(s.APIs[0])
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":"shop","listen_path":"/shop/","target":"builtin:echo","endpoints":[{"method":"POST","path":"/orders","policies":["post-orders"]},{"method":"GET","path":"/orders","policies":["get-orders"],"cost":1}]}`
	if string(b) != want {
		t.Fatalf("JSON\n%s\nwant\n%s", b, want)
	}
	var back spec.API
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, s.APIs[0]) {
		t.Fatalf("round trip: %+v", back)
	}
	got := s.CoreEndpoints()
	wantCore := map[string][]core.Endpoint{"shop": {
		{Method: "POST", Path: "/orders", Policies: []string{"post-orders"}},
		{Method: "GET", Path: "/orders", Policies: []string{"get-orders"}, Cost: 1},
	}}
	if !reflect.DeepEqual(got, wantCore) {
		t.Fatalf("CoreEndpoints = %+v", got)
	}
}

func TestValidateEndpoints(t *testing.T) {
	s := shop()
	s.APIs[0].Endpoints = append(s.APIs[0].Endpoints,
		spec.Endpoint{Method: "FETCH", Path: "/a", Policies: []string{"get-orders"}},
		spec.Endpoint{Method: "get", Path: "/orders/", Policies: []string{"get-orders"}},
		spec.Endpoint{Path: "/orders/{id", Policies: []string{"nope"}},
		spec.Endpoint{Path: "/x", Policies: []string{"elsewhere", "global"}},
		spec.Endpoint{Path: "/y"},
		spec.Endpoint{Method: "any", Cost: -2},
	)
	var errs spec.Errors
	if !errors.As(s.Validate(), &errs) {
		t.Fatal("no spec.Errors")
	}
	got := make([]string, len(errs))
	for i, e := range errs {
		got[i] = e.Path + ": " + e.Problem
	}
	want := []string{
		`apis[0].endpoints[2].method: unknown method "FETCH" (want GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE, or any)`,
		`apis[0].endpoints[3].path: duplicate endpoint GET /orders (first at apis[0].endpoints[1].path)`,
		`apis[0].endpoints[4].path: "/orders/{id": a {param} must be a whole segment, like /orders/{id}`,
		`apis[0].endpoints[4].policies[0]: unknown policy "nope"`,
		`apis[0].endpoints[5].policies[0]: policy "elsewhere" does not cover API "shop" (its apis list leaves it out)`,
		`apis[0].endpoints[5].policies[1]: policy "global" has a global quota; an endpoint's quotas are counted per data plane (leave global out, or put the quota on the key's policies)`,
		`apis[0].endpoints[6].policies: missing (an endpoint needs policies, a cost, or both)`,
		`apis[0].endpoints[7].path: missing (a path like "/orders" or "/orders/{id}")`,
		`apis[0].endpoints[7].cost: -2: a cost is 1 to 2^53 − 1 (left out: the request's own)`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
