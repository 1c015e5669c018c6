package gateway_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/spec"
)

// TestEndpointNeedsUnenforceablePolicy: a data plane's snapshot
// (ApplyPartial) whose endpoint names a policy the in-process store
// cannot enforce (sliding_window) is applied without it: requests to
// that endpoint answer 503 naming the policy and count nothing (not even
// the key's own limit), the API's other paths and endpoints are limited
// as ever; Apply refuses the snapshot whole.
func TestEndpointNeedsUnenforceablePolicy(t *testing.T) {
	up := upstream(t)
	g := newTestGateway(t)
	min := func(n int64) *spec.Rate { return &spec.Rate{Requests: n, Per: spec.Duration(time.Minute)} }
	sw := min(5)
	sw.Algorithm = "sliding_window"
	snap := &spec.Snapshot{
		Revision: 1,
		Policies: []spec.Policy{{ID: "p", Rate: min(3)}, {ID: "sw", Rate: sw}, {ID: "two", Rate: min(2)}},
		Keys:     []spec.Key{{KeyHash: keyHash("k1"), Policies: []string{"p"}}},
		APIs: []spec.API{{ID: "api", ListenPath: "/api/", Target: up.URL, Endpoints: []spec.Endpoint{
			{Path: "/window", Policies: []string{"sw"}},
			{Path: "/two", Policies: []string{"two"}},
		}}},
	}
	if err := g.gw.Apply(context.Background(), snap); err == nil || !strings.Contains(err.Error(), `policy "sw"`) {
		t.Fatalf("Apply: %v, want the policy's error", err)
	}
	if err := g.gw.ApplyPartial(context.Background(), snap); err != nil {
		t.Fatalf("ApplyPartial: %v", err)
	}
	body := fmt.Sprintf(`{"error":%q}`+"\n", `policy "sw" of this endpoint of API "api" is not built on this gateway: algorithm not supported by this store: sliding_window`)
	for range 4 {
		if a := g.mustGet(t, "/api/window/x", "k1"); a.status != 503 || a.body != body {
			t.Fatalf("/api/window/x: %d %q, want 503 %q", a.status, a.body, body)
		}
	}
	var two []int
	for range 3 {
		two = append(two, g.mustGet(t, "/api/two", "k1").status)
	}
	checkStatuses(t, "/api/two (2 a minute)", two, []int{200, 200, 429})
	// p's 3: the two admitted on /api/two, one more; the 503s and the
	// endpoint's refusal spent none.
	var rest []int
	for range 2 {
		rest = append(rest, g.mustGet(t, "/api/other", "k1").status)
	}
	checkStatuses(t, "/api/other (p: 3 a minute)", rest, []int{200, 429})
}

// TestPolicyEndpointLimitUnenforceable: a policy whose own limit at an
// endpoint the in-process store cannot enforce is left out by
// ApplyPartial (NotBuilt names it and why); its keys answer 503, others
// are limited as ever.
func TestPolicyEndpointLimitUnenforceable(t *testing.T) {
	up := upstream(t)
	g := newTestGateway(t)
	min := func(n int64) *spec.Rate { return &spec.Rate{Requests: n, Per: spec.Duration(time.Minute)} }
	sw := min(5)
	sw.Algorithm = "sliding_window"
	snap := &spec.Snapshot{
		Revision: 1,
		Policies: []spec.Policy{{ID: "p", Rate: min(3)}, {ID: "two", Rate: min(2)},
			{ID: "gold", Rate: min(100), Endpoints: []spec.PolicyEndpoint{{API: "api", Path: "/two", Rate: sw}}}},
		Keys: []spec.Key{{KeyHash: keyHash("k1"), Policies: []string{"p"}}, {KeyHash: keyHash("k-gold"), Policies: []string{"gold"}}},
		APIs: []spec.API{{ID: "api", ListenPath: "/api/", Target: up.URL, Endpoints: []spec.Endpoint{{Path: "/two", Policies: []string{"two"}}}}},
	}
	if err := g.gw.ApplyPartial(context.Background(), snap); err != nil {
		t.Fatalf("ApplyPartial: %v", err)
	}
	const problem = `its limit at endpoint * /two of API "api": algorithm not supported by this store: sliding_window`
	if got := g.gw.NotBuilt(); len(got) != 1 || got[0].Policy != "gold" || got[0].Problem != problem {
		t.Fatalf("NotBuilt() = %+v", got)
	}
	if a := g.mustGet(t, "/api/two", "k-gold"); a.status != 503 {
		t.Fatalf("k-gold: %d %s, want 503", a.status, a.body)
	}
	var two []int
	for range 3 {
		two = append(two, g.mustGet(t, "/api/two", "k1").status)
	}
	checkStatuses(t, "k1 on /api/two", two, []int{200, 200, 429})
}
