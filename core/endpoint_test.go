package core_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// shopConfig is issue 23's example: POST /orders 2/min and GET /orders
// 10/min on the shop API, the key's own policy api (its rate given).
func shopConfig(api core.Limit) core.Config {
	return core.Config{
		Policies: []core.Policy{
			{ID: "api", Rate: api},
			{ID: "post-orders", Rate: core.Limit{Rate: 2, Period: time.Minute}},
			{ID: "get-orders", Rate: core.Limit{Rate: 10, Period: time.Minute}},
		},
		Endpoints: map[string][]core.Endpoint{"shop": {
			{Method: "POST", Path: "/orders", Policies: []string{"post-orders"}},
			{Method: "GET", Path: "/orders", Policies: []string{"get-orders"}, Cost: 1},
		}},
	}
}

// admitted counts the requests of n admitted to method /orders.
func admitted(t *testing.T, e *core.Engine, c *core.Consumer, method string, n int) int {
	t.Helper()
	ok := 0
	for range n {
		d, err := e.DecideRoute(context.Background(), c, "shop", core.Route{Method: method, Path: "/orders"}, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			ok++
		}
	}
	return ok
}

func TestEndpointsCountApart(t *testing.T) {
	e, _ := newEngine(t, shopConfig(core.Limit{Rate: 1000, Period: time.Minute}), core.Options{})
	c := &core.Consumer{ID: "k1", Policies: []string{"api"}}
	if got := admitted(t, e, c, "POST", 5); got != 2 {
		t.Fatalf("POST /orders: %d admitted, want 2", got)
	}
	if got := admitted(t, e, c, "GET", 15); got != 10 {
		t.Fatalf("GET /orders: %d admitted, want 10", got)
	}
	// A path no endpoint matches is the API's alone: 1000/min.
	d, err := e.DecideRoute(context.Background(), c, "shop", core.Route{Method: "GET", Path: "/items"}, 1)
	if err != nil || !d.Allowed || d.Policy != "api" || d.Remaining != 1000-2-10-1 {
		t.Fatalf("GET /items: %+v, %v: want allowed by api with %d left (the endpoints' requests spent the API's units)", d, err, 1000-13)
	}
	// Another consumer has counters of its own.
	if got := admitted(t, e, &core.Consumer{ID: "k2", Policies: []string{"api"}}, "POST", 3); got != 2 {
		t.Fatalf("k2 POST: %d admitted, want 2", got)
	}
}

func TestEndpointAndAPIBothApply(t *testing.T) {
	e, _ := newEngine(t, shopConfig(core.Limit{Rate: 11, Period: time.Minute}), core.Options{})
	c := &core.Consumer{ID: "k1", Policies: []string{"api"}}
	if got := admitted(t, e, c, "POST", 5); got != 2 {
		t.Fatalf("POST: %d admitted, want 2", got)
	}
	// The endpoint admits 10 GETs, the API 9 more (11 in all).
	if got := admitted(t, e, c, "GET", 15); got != 9 {
		t.Fatalf("GET: %d admitted, want 9 (API-wide 11/min across both)", got)
	}
	d, err := e.DecideRoute(context.Background(), c, "shop", core.Route{Method: "GET", Path: "/orders"}, 1)
	if err != nil || d.Allowed {
		t.Fatalf("12th: %+v, %v: want refused", d, err)
	}
	// The 3 refused POSTs spent nothing of the API's 11; the 10th GET
	// spent the endpoint's 10th unit, then the API refused it.
	if d.Policy != "get-orders" {
		t.Fatalf("after the 10th GET: decided by %q, want get-orders (its 10 are spent)", d.Policy)
	}
}

func TestEndpointDecisionNamesTighterLimit(t *testing.T) {
	e, _ := newEngine(t, shopConfig(core.Limit{Rate: 100, Period: time.Minute}), core.Options{})
	c := &core.Consumer{ID: "k1", Policies: []string{"api"}}
	d, err := e.DecideRoute(context.Background(), c, "shop", core.Route{Method: "POST", Path: "/orders/"}, 1)
	if err != nil || !d.Allowed || d.Policy != "post-orders" || d.Remaining != 1 || d.Rate.Policy != "post-orders" {
		t.Fatalf("%+v, %v: want allowed, post-orders with 1 left", d, err)
	}
}

func TestEndpointCost(t *testing.T) {
	e, _ := newEngine(t, core.Config{
		Policies:  []core.Policy{{ID: "api", Rate: core.Limit{Rate: 100, Period: time.Minute}}},
		Endpoints: map[string][]core.Endpoint{"shop": {{Path: "/reports", Cost: 30}}},
	}, core.Options{})
	c := &core.Consumer{ID: "k1", Policies: []string{"api"}}
	for i, want := range []int64{70, 40, 10} {
		d, err := e.DecideRoute(context.Background(), c, "shop", core.Route{Method: "GET", Path: "/reports/2026"}, 1)
		if err != nil || !d.Allowed || d.Remaining != want {
			t.Fatalf("report %d: %+v, %v: want allowed with %d left", i, d, err, want)
		}
	}
	if d, _ := e.DecideRoute(context.Background(), c, "shop", core.Route{Method: "GET", Path: "/reports"}, 1); d.Allowed {
		t.Fatalf("4th report: allowed with 10 left, want refused (cost 30)")
	}
}

func TestEndpointPolicyNotForConsumerNoPolicy(t *testing.T) {
	cfg := shopConfig(core.Limit{Rate: 100, Period: time.Minute})
	cfg.Policies[0].APIs = []string{"other"}
	e, _ := newEngine(t, cfg, core.Options{})
	c := &core.Consumer{ID: "k1", Policies: []string{"api"}}
	for range 3 {
		if _, err := e.DecideRoute(context.Background(), c, "shop", core.Route{Method: "POST", Path: "/orders"}, 1); !errors.Is(err, core.ErrNoPolicy) {
			t.Fatalf("err %v, want ErrNoPolicy", err)
		}
	}
	// Nothing was spent on the endpoint meanwhile.
	cfg.Policies[0].APIs = nil
	if err := e.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if got := admitted(t, e, c, "POST", 3); got != 2 {
		t.Fatalf("POST after the refusals: %d admitted, want 2", got)
	}
}

func TestEndpointScopes(t *testing.T) {
	rs := &recordingStore{Store: memory.New(memory.Options{})}
	if _, err := core.NewEngine(rs, shopConfig(core.Limit{Rate: 5, Period: time.Second}), core.Options{}); err != nil {
		t.Fatal(err)
	}
	var scopes []string
	for _, ls := range rs.since(0) {
		if ls.Scope != "" {
			scopes = append(scopes, ls.Scope)
		}
	}
	if got, want := strings.Join(scopes, "|"), "shop POST /orders|shop GET /orders"; got != want {
		t.Fatalf("endpoint scopes %q, want %q", got, want)
	}
	if got := core.EndpointScope("shop", core.Endpoint{Method: "any", Path: "/orders/{id}/"}); got != "shop * /orders/{}" {
		t.Fatalf("EndpointScope: %q", got)
	}
}

func TestEndpointConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		ep   core.Endpoint
		want string
	}{
		{core.Endpoint{Method: "FETCH", Path: "/a"}, `unknown method "FETCH"`},
		{core.Endpoint{Path: "orders"}, `must start with "/"`},
		{core.Endpoint{Path: "/a/{id"}, "a {param} must be a whole segment"},
		{core.Endpoint{Path: "/a/x{id}"}, "a {param} must be a whole segment"},
		{core.Endpoint{Path: "/a/{id}/{id}"}, "{id} is named twice"},
		{core.Endpoint{Path: "/a//b"}, "empty segment"},
		{core.Endpoint{Path: "/a/{1x}"}, "is not a parameter"},
		{core.Endpoint{Path: "/a", Policies: []string{"nope"}}, `unknown policy "nope"`},
		{core.Endpoint{Path: "/a", Cost: -1}, "cost -1"},
	} {
		_, err := core.NewEngine(memory.New(memory.Options{}), core.Config{
			Endpoints: map[string][]core.Endpoint{"shop": {tc.ep}},
		}, core.Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one containing %q", tc.ep, err, tc.want)
		}
	}
	_, err := core.NewEngine(memory.New(memory.Options{}), core.Config{
		Policies:  []core.Policy{{ID: "g", Quota: core.Quota{Max: 10, Renewal: time.Hour, Global: core.GlobalQuota{Mode: core.GlobalStrict}}}},
		Endpoints: map[string][]core.Endpoint{"shop": {{Path: "/a", Policies: []string{"g"}}}},
	}, core.Options{})
	if !errors.Is(err, core.ErrInvalidLimit) || !strings.Contains(err.Error(), "an endpoint's quota cannot be global") {
		t.Fatalf("global quota: %v", err)
	}
	_, err = core.NewEngine(memory.New(memory.Options{}), core.Config{Endpoints: map[string][]core.Endpoint{"shop": {
		{Method: "get", Path: "/orders/{id}"}, {Method: "GET", Path: "/orders/{name}/"},
	}}}, core.Options{})
	if !errors.Is(err, core.ErrInvalidEndpoint) || !strings.Contains(err.Error(), "GET /orders/{} is listed twice") {
		t.Fatalf("duplicate: %v", err)
	}
}

func TestEndpointMostSpecific(t *testing.T) {
	policies := []core.Policy{{ID: "api", Rate: core.Limit{Rate: 1 << 30, Period: time.Minute}}}
	eps := []core.Endpoint{}
	for _, ep := range []struct{ name, method, path string }{
		{"root", "", "/"},
		{"orders-any", "", "/orders"},
		{"orders-get", "GET", "/orders"},
		{"order-any", "", "/orders/{id}"},
		{"order-items", "", "/orders/{id}/items"},
		{"order-special", "", "/orders/special"},
		{"x-items", "", "/{kind}/{id}/items"},
		{"lit-first", "", "/a/{x}"},
		{"lit-second", "", "/{x}/b"},
	} {
		policies = append(policies, core.Policy{ID: ep.name, Rate: core.Limit{Rate: 1000, Period: time.Minute}})
		eps = append(eps, core.Endpoint{Method: ep.method, Path: ep.path, Policies: []string{ep.name}})
	}
	e, _ := newEngine(t, core.Config{Policies: policies, Endpoints: map[string][]core.Endpoint{"shop": eps}}, core.Options{})
	c := &core.Consumer{ID: "k", Policies: []string{"api"}}
	for _, tc := range []struct{ method, path, want string }{
		{"GET", "/", "root"},
		{"GET", "/other/x", "root"},
		{"GET", "/orders", "orders-get"},
		{"HEAD", "/orders", "orders-get"},
		{"get", "/orders", "orders-get"}, // any case: "get" must not escape GET's endpoint
		{"Head", "/orders", "orders-get"},
		{"POST", "/orders", "orders-any"},
		{"POST", "//orders/", "orders-any"},
		{"GET", "/orders/42", "order-any"},
		{"GET", "/orders/special", "order-special"},
		{"GET", "/orders/special/items", "order-items"},
		{"GET", "/orders/42/items/7", "order-items"},
		{"GET", "/carts/42/items", "x-items"},
		{"GET", "/a/b", "lit-first"},
		{"GET", "/orders/{id}", "order-any"},
	} {
		d, err := e.DecideRoute(context.Background(), c, "shop", core.Route{Method: tc.method, Path: tc.path}, 1)
		if err != nil {
			t.Fatal(err)
		}
		// Every endpoint's rate is 1000/min, the API's 2^30: the
		// decision names the endpoint's.
		if d.Policy != tc.want {
			t.Errorf("%s %s: decided by %q, want %q", tc.method, tc.path, d.Policy, tc.want)
		}
	}
}

func TestEndpointRefuse(t *testing.T) {
	refuse := errors.New("policy not built")
	e, _ := newEngine(t, core.Config{
		Policies:  []core.Policy{{ID: "api", Rate: core.Limit{Rate: 2, Period: time.Minute}}},
		Endpoints: map[string][]core.Endpoint{"shop": {{Path: "/x", Refuse: refuse}}},
	}, core.Options{})
	c := &core.Consumer{ID: "k", Policies: []string{"api"}}
	for range 3 {
		if _, err := e.DecideRoute(context.Background(), c, "shop", core.Route{Method: "GET", Path: "/x"}, 1); !errors.Is(err, refuse) {
			t.Fatalf("err %v, want the endpoint's refusal", err)
		}
	}
	if d, _ := e.Decide(context.Background(), c, "shop", 1); !d.Allowed || d.Remaining != 1 {
		t.Fatalf("the refusals spent the API's units: %+v", d)
	}
}

// BenchmarkDecideRoute compares a decision with endpoint matching among
// 100 endpoints to one without (Decide), on the memory store: issue 23
// allows 100 ns between them. none-of-100 matches no endpoint;
// cost-only-of-100 matches one that only sets a cost (the matching, and
// no counter of its own); match-of-100 matches one with a policy, whose
// counter is a second store call.
func BenchmarkDecideRoute(b *testing.B) {
	policies := []core.Policy{{ID: "api", Rate: core.Limit{Rate: 1 << 29, Period: time.Second}}}
	var eps []core.Endpoint
	for i := range 100 {
		id := fmt.Sprintf("p%d", i)
		policies = append(policies, core.Policy{ID: id, Rate: core.Limit{Rate: 1 << 29, Period: time.Second}})
		method := []string{"GET", "POST", "PUT", "DELETE"}[i%4]
		eps = append(eps, core.Endpoint{Method: method, Path: fmt.Sprintf("/r%d/{id}/items", i/4), Policies: []string{id}})
	}
	// The 100th: an endpoint that only sets a cost, so a request to it
	// costs the matching and no store call of its own.
	eps[99] = core.Endpoint{Method: "DELETE", Path: "/cost/{id}", Cost: 1}
	e, err := core.NewEngine(memory.New(memory.Options{}), core.Config{Policies: policies, Endpoints: map[string][]core.Endpoint{"shop": eps}}, core.Options{})
	if err != nil {
		b.Fatal(err)
	}
	c := &core.Consumer{ID: "k1", Policies: []string{"api"}}
	ctx := context.Background()
	b.Run("Decide", func(b *testing.B) {
		for b.Loop() {
			if _, err := e.Decide(ctx, c, "shop", 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("DecideRoute/none-of-100", func(b *testing.B) {
		rt := core.Route{Method: "GET", Path: "/nothing/42/items"}
		for b.Loop() {
			if _, err := e.DecideRoute(ctx, c, "shop", rt, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("DecideRoute/cost-only-of-100", func(b *testing.B) {
		rt := core.Route{Method: "DELETE", Path: "/cost/42"}
		for b.Loop() {
			if _, err := e.DecideRoute(ctx, c, "shop", rt, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("DecideRoute/match-of-100", func(b *testing.B) {
		rt := core.Route{Method: "PUT", Path: "/r24/42/items"} // the 99th endpoint
		for b.Loop() {
			if _, err := e.DecideRoute(ctx, c, "shop", rt, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestEndpointShadow(t *testing.T) {
	cfg := shopConfig(core.Limit{Rate: 1000, Period: time.Minute})
	cfg.Policies[1].Shadow = true // post-orders
	e, _ := newEngine(t, cfg, core.Options{})
	c := &core.Consumer{ID: "k1", Policies: []string{"api"}}
	for i := range 4 {
		d, err := e.DecideRoute(context.Background(), c, "shop", core.Route{Method: "POST", Path: "/orders"}, 1)
		if err != nil || !d.Allowed || d.Shadowed != (i >= 2) {
			t.Fatalf("POST %d: %+v, %v: want allowed, shadowed from the 3rd", i, d, err)
		}
	}
}

// TestPolicyEndpointPlans: a policy's own limits at an endpoint replace
// the endpoint's own policies for its consumers (the most generous of
// theirs), on the same counters; others keep the endpoint's; the API's
// limit applies to all.
func TestPolicyEndpointPlans(t *testing.T) {
	cfg := shopConfig(core.PerMinute(1000))
	cfg.Policies = append(cfg.Policies,
		core.Policy{ID: "gold", Rate: core.PerMinute(1000), Endpoints: []core.PolicyEndpoint{
			{API: "shop", Method: "post", Path: "/orders/", Rate: core.PerMinute(5)},
		}},
		core.Policy{ID: "quota-plan", Endpoints: []core.PolicyEndpoint{
			{API: "shop", Method: "POST", Path: "/orders", Quota: core.Quota{Max: 4, Renewal: time.Hour}},
		}},
	)
	e, _ := newEngine(t, cfg, core.Options{})
	free := &core.Consumer{ID: "free", Policies: []string{"api"}}
	gold := &core.Consumer{ID: "gold", Policies: []string{"gold"}}
	both := &core.Consumer{ID: "both", Policies: []string{"api", "gold", "quota-plan"}}
	if got := admitted(t, e, free, "POST", 7); got != 2 {
		t.Fatalf("free POST: %d admitted, want 2 (the endpoint's post-orders)", got)
	}
	if got := admitted(t, e, gold, "POST", 7); got != 5 {
		t.Fatalf("gold POST: %d admitted, want 5 (gold's own limit there)", got)
	}
	if got := admitted(t, e, gold, "GET", 12); got != 10 {
		t.Fatalf("gold GET: %d admitted, want 10 (gold has no limit there)", got)
	}
	// gold's rate (5/min) with quota-plan's quota (4 an hour).
	d, err := e.DecideRoute(context.Background(), both, "shop", core.Route{Method: "POST", Path: "/orders"}, 1)
	if err != nil || !d.Allowed || d.Rate.Policy != "gold" || d.Quota.Policy != "quota-plan" || d.Quota.Remaining != 3 {
		t.Fatalf("both: %+v, %v: want gold's rate and quota-plan's quota", d, err)
	}
	if got := admitted(t, e, both, "POST", 5); got != 3 {
		t.Fatalf("both POST: %d more admitted, want 3 (a quota of 4)", got)
	}

	cfg.Policies[len(cfg.Policies)-1].Endpoints[0].Path = "/nowhere"
	if err := e.SetConfig(cfg); !errors.Is(err, core.ErrInvalidEndpoint) || !strings.Contains(err.Error(), `policy "quota-plan" has limits at POST /nowhere of API "shop", which is not one of the API's endpoints`) {
		t.Fatalf("SetConfig with a limit at no endpoint: %v", err)
	}
}

// TestEndpointQuotaReset: ResetQuota resets a consumer's quota counters
// at the API's endpoints too (every API's for api ""), the rate limits
// left alone.
func TestEndpointQuotaReset(t *testing.T) {
	e, _ := newEngine(t, core.Config{
		Policies: []core.Policy{
			{ID: "api", Rate: core.PerMinute(1000)},
			{ID: "three", Quota: core.Quota{Max: 3, Renewal: time.Hour}},
		},
		Endpoints: map[string][]core.Endpoint{"shop": {{Method: "POST", Path: "/orders", Policies: []string{"three"}}}},
	}, core.Options{})
	c := &core.Consumer{ID: "k1", Policies: []string{"api"}}
	for _, api := range []string{"shop", ""} {
		if got := admitted(t, e, c, "POST", 5); got != 3 {
			t.Fatalf("before the reset for %q: %d admitted, want 3", api, got)
		}
		if err := e.ResetQuota(context.Background(), c, api); err != nil {
			t.Fatal(err)
		}
	}
	if got := admitted(t, e, c, "POST", 5); got != 3 {
		t.Fatalf("after the resets: %d admitted, want 3", got)
	}
}
