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
				{Method: "GET", Path: "/orders", Policies: []string{"get-orders"}, Cost: ptr(int64(1))},
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
		spec.Endpoint{Method: "any", Cost: ptr(int64(-2))},
		spec.Endpoint{Method: "PUT", Path: "/z", Cost: ptr(int64(0))},
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
		`apis[0].endpoints[8].cost: 0: a cost is 1 to 2^53 − 1 (left out: the request's own)`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestValidatePolicyEndpoints(t *testing.T) {
	s := shop()
	min := func(n int64) *spec.Rate { return &spec.Rate{Requests: n, Per: spec.Duration(time.Minute)} }
	s.Policies = append(s.Policies,
		spec.Policy{ID: "gold", Endpoints: []spec.PolicyEndpoint{
			{API: "shop", Method: "post", Path: "/orders/", Rate: min(100)},
			{API: "shop", Method: "GET", Path: "/orders", Quota: &spec.Quota{Max: 1000, Renewal: spec.Duration(time.Hour)}},
		}},
		spec.Policy{ID: "bad", APIs: []string{"other"}, Endpoints: []spec.PolicyEndpoint{
			{API: "shop", Path: "/orders", Rate: min(1)},
			{API: "other", Path: "/x", Rate: min(1)},
			{API: "nope", Path: "/x", Rate: min(1)},
			{Path: "/x"},
		}},
		spec.Policy{ID: "dup", Endpoints: []spec.PolicyEndpoint{
			{API: "shop", Method: "POST", Path: "/orders", Rate: min(1)},
			{API: "shop", Method: "post", Path: "/orders", Rate: min(2)},
			{API: "shop", Method: "FETCH", Path: "/{a", Rate: &spec.Rate{Requests: 0, Per: spec.Duration(time.Minute)}},
		}},
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
		`policies[5].endpoints[0].api: the policy does not cover API "shop" (its apis list leaves it out)`,
		`policies[5].endpoints[0].path: API "shop" has no endpoint * /orders (list it in its endpoints first)`,
		`policies[5].endpoints[1].path: API "other" has no endpoint * /x (list it in its endpoints first)`,
		`policies[5].endpoints[2].api: unknown API "nope"`,
		`policies[5].endpoints[3]: needs rate or quota`,
		`policies[5].endpoints[3].api: missing (the id of the API whose endpoint this limits)`,
		`policies[6].endpoints[1].path: the policy already limits POST /orders of API "shop" (at policies[6].endpoints[0].path)`,
		`policies[6].endpoints[2].rate.requests: 0 must be > 0 (or -1 for unlimited)`,
		`policies[6].endpoints[2].method: unknown method "FETCH" (want GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE, or any)`,
		`policies[6].endpoints[2].path: "/{a": a {param} must be a whole segment, like /orders/{id}`,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	s.Policies = s.Policies[:5]
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(s.Policies[4])
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"id":"gold","endpoints":[{"api":"shop","method":"post","path":"/orders/","rate":{"requests":100,"per":"1m0s"}},{"api":"shop","method":"GET","path":"/orders","quota":{"max":1000,"renewal":"1h0m0s"}}]}`; string(b) != want {
		t.Fatalf("JSON %s\nwant %s", b, want)
	}
	c := s.Policies[4].Core()
	if len(c.Endpoints) != 2 || c.Endpoints[0].Rate != core.PerMinute(100) || c.Endpoints[1].Quota.Max != 1000 {
		t.Fatalf("Core: %+v", c.Endpoints)
	}
}
