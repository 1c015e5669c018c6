package controlplane_test

import (
	"testing"
	"time"

	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/spec"
)

// TestAdminEndpoints: the admin API takes an API's endpoints, gives them
// back as written, refuses bad ones with their field paths (nothing
// changed), and refuses to delete a policy an endpoint names.
func TestAdminEndpoints(t *testing.T) {
	_, base := server(t, controlplane.BoltOptions{}, nil)
	expect(t, call(t, "PUT", base+"/api/policies/post-orders", `{"rate":{"requests":2,"per":"1m"}}`), 200, `{"revision":1}`)
	expect(t, call(t, "PUT", base+"/api/policies/get-orders", `{"rate":{"requests":10,"per":"1m"}}`), 200, `{"revision":2}`)
	const shop = `{"id":"shop","listen_path":"/shop/","target":"builtin:echo","endpoints":[` +
		`{"method":"POST","path":"/orders","policies":["post-orders"]},` +
		`{"method":"GET","path":"/orders","policies":["get-orders"],"cost":1},` +
		`{"path":"/reports/{year}","cost":5}]}`
	expect(t, call(t, "PUT", base+"/api/apis/shop", shop), 200, `{"revision":3}`)
	expect(t, call(t, "GET", base+"/api/apis/shop", ""), 200, shop)

	expect(t, call(t, "PUT", base+"/api/apis/shop", `{"listen_path":"/shop/","target":"builtin:echo","endpoints":[`+
		`{"method":"FETCH","path":"/orders","policies":["post-orders"]},`+
		`{"method":"GET","path":"/orders/{id","policies":["get-orders"]},`+
		`{"method":"get","path":"/orders/","policies":["nope"]},`+
		`{"method":"GET","path":"/orders","policies":["get-orders"]}]}`), 422,
		`{"error":"the change would leave an invalid configuration; nothing was changed","problems":[`+
			`{"path":"apis[\"shop\"].endpoints[0].method","problem":"unknown method \"FETCH\" (want GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE, or any)"},`+
			`{"path":"apis[\"shop\"].endpoints[1].path","problem":"\"/orders/{id\": a {param} must be a whole segment, like /orders/{id}"},`+
			`{"path":"apis[\"shop\"].endpoints[2].policies[0]","problem":"unknown policy \"nope\""},`+
			`{"path":"apis[\"shop\"].endpoints[3].path","problem":"duplicate endpoint GET /orders (first at apis[\"shop\"].endpoints[2].path)"}]}`)
	expect(t, call(t, "DELETE", base+"/api/policies/post-orders", ""), 422,
		`{"error":"the change would leave an invalid configuration; nothing was changed","problems":[{"path":"apis[\"shop\"].endpoints[0].policies[0]","problem":"unknown policy \"post-orders\""}]}`)
	expect(t, call(t, "GET", base+"/api/apis/shop", ""), 200, shop)
	expect(t, call(t, "GET", base+"/api/revision", ""), 200, `{"revision":3}`)

	const gold = `{"id":"gold","rate":{"requests":1000,"per":"1m0s"},"endpoints":[{"api":"shop","method":"POST","path":"/orders","rate":{"requests":100,"per":"1m0s"}}]}`
	expect(t, call(t, "PUT", base+"/api/policies/gold", gold), 200, `{"revision":4}`)
	expect(t, call(t, "GET", base+"/api/policies/gold", ""), 200, gold)
	expect(t, call(t, "PUT", base+"/api/policies/gold", `{"endpoints":[{"api":"shop","method":"PUT","path":"/orders","rate":{"requests":100,"per":"1m"}}]}`), 422,
		`{"error":"the change would leave an invalid configuration; nothing was changed","problems":[{"path":"policies[\"gold\"].endpoints[0].path","problem":"API \"shop\" has no endpoint PUT /orders (list it in its endpoints first)"}]}`)
}

// TestSelectPolicyEndpoints: a data plane whose tags leave an API out
// receives the policies without their limits at that API's endpoints,
// and the view is valid.
func TestSelectPolicyEndpoints(t *testing.T) {
	min := func(n int64) *spec.Rate { return &spec.Rate{Requests: n, Per: spec.Duration(time.Minute)} }
	full := &spec.Snapshot{
		Policies: []spec.Policy{{ID: "gold", Rate: min(100), Endpoints: []spec.PolicyEndpoint{
			{API: "eu-shop", Path: "/orders", Rate: min(5)},
			{API: "us-shop", Path: "/orders", Rate: min(6)},
		}}},
		APIs: []spec.API{
			{ID: "eu-shop", ListenPath: "/eu/", Target: spec.BuiltinEcho, Tags: []string{"eu"}, Endpoints: []spec.Endpoint{{Path: "/orders", Cost: new(int64(2))}}},
			{ID: "us-shop", ListenPath: "/us/", Target: spec.BuiltinEcho, Tags: []string{"us"}, Endpoints: []spec.Endpoint{{Path: "/orders", Cost: new(int64(2))}}},
		},
	}
	if err := full.ValidateSharded(); err != nil {
		t.Fatal(err)
	}
	eu := controlplane.Select(full, []string{"eu"})
	if err := eu.Validate(); err != nil {
		t.Fatalf("the eu view: %v", err)
	}
	if got := eu.Policies[0].Endpoints; len(got) != 1 || got[0].API != "eu-shop" {
		t.Fatalf("the eu view's gold endpoints: %+v", got)
	}
	if len(full.Policies[0].Endpoints) != 2 {
		t.Fatal("Select changed the state")
	}
}
