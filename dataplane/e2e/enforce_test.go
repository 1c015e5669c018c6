package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/spec"
)

// TestQuotaPerDataPlane is Tyk MDCB's documented behaviour: counters never
// cross data planes, so a key with a quota of 1,000 a day whose traffic is
// split over two data planes (each its own redis-server and two gateways)
// gets exactly 1,000 on each, 2,000 in all; and a rate limit of 50 an hour
// holds in full on each data plane (exactly 50 of 80 on each). Consumer
// affinity: a key whose traffic all goes to dp1 gets exactly 1,000 of
// 1,100 there; moved to dp2 it gets exactly 1,000 more (the bound is the
// quota times the data planes a consumer visits).
func TestQuotaPerDataPlane(t *testing.T) {
	t.Parallel()
	cp, dp1, dp2 := twoDataPlanes(t, cpOptions{})
	cp.putPolicy(t, quotaPolicy("day1000", 1000))
	cp.putPolicy(t, spec.Policy{ID: "hour50", Rate: &spec.Rate{Requests: 50, Per: spec.Duration(time.Hour)}})
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	cp.postKey(t, "quota-key", spec.Key{Policies: []string{"day1000"}})
	cp.postKey(t, "rate-key", spec.Key{Policies: []string{"hour50"}})
	cp.postKey(t, "affinity-key", spec.Key{Policies: []string{"day1000"}})
	waitSynced(t, cp, all(dp1, dp2)...)

	c1, c2 := sendBoth(t, dp1.gws, "/echo/q", dp2.gws, "/echo/q", "quota-key", 1300, 8)
	t.Logf("quota 1,000/day: dp1 admitted %d (by gateway %v), dp2 admitted %d (by gateway %v)", c1.admitted, c1.byGateway, c2.admitted, c2.byGateway)
	if c1.admitted != 1000 || c1.denied != 300 || c2.admitted != 1000 || c2.denied != 300 {
		t.Errorf("quota: dp1 %d admitted %d denied, dp2 %d admitted %d denied; want exactly 1000 and 300 on each (2000 in all)", c1.admitted, c1.denied, c2.admitted, c2.denied)
	}
	for _, g := range all(dp1, dp2) {
		if c1.byGateway[g.id]+c2.byGateway[g.id] == 0 {
			t.Errorf("gateway %s admitted nothing: the traffic was not split", g.id)
		}
	}

	r1, r2 := sendBoth(t, dp1.gws, "/echo/r", dp2.gws, "/echo/r", "rate-key", 80, 8)
	if r1.admitted != 50 || r2.admitted != 50 {
		t.Errorf("rate 50/h: dp1 admitted %d, dp2 %d; want exactly 50 on each", r1.admitted, r2.admitted)
	}

	// Consumer affinity: a consumer whose traffic all goes to one data
	// plane gets exactly its quota there; moved to the other data plane
	// (a failover), it gets that data plane's count afresh, so the bound
	// is the quota times the data planes it visits.
	a1 := send(t, dp1.gws, "/echo/a", "affinity-key", 1100, 8)
	a2 := send(t, dp2.gws, "/echo/a", "affinity-key", 1100, 8)
	if a1.admitted != 1000 || a2.admitted != 1000 {
		t.Errorf("affinity: dp1 admitted %d of 1100, then dp2 %d of 1100; want exactly 1000 and 1000", a1.admitted, a2.admitted)
	}
}

// TestAllocationPerDataPlane splits one global quota of 1,000 between two
// data planes: the API is defined once per data plane, by tags (each data
// plane loads only its own copy), and the key's api_limits give dp1's copy
// a quota of 600 and dp2's 400. Under concurrent load (16 goroutines per
// gateway, 800 requests per gateway) exactly 600 pass on dp1 and 400 on
// dp2: 1,000 in all. Both copies have the same listen path (the control
// plane allows it for APIs with disjoint tags, spec.ValidateSharded), and
// each data plane serves its own copy there.
func TestAllocationPerDataPlane(t *testing.T) {
	t.Parallel()
	cp, dp1, dp2 := twoDataPlanes(t, cpOptions{})
	cp.putAPI(t, echoAPI("orders-dp1", "/orders/", "dp1"))
	cp.putAPI(t, echoAPI("orders-dp2", "/orders/", "dp2"))
	day := spec.Duration(24 * time.Hour)
	cp.postKey(t, "global-key", spec.Key{APILimits: map[string]spec.Limits{
		"orders-dp1": {Quota: &spec.Quota{Max: 600, Renewal: day}},
		"orders-dp2": {Quota: &spec.Quota{Max: 400, Renewal: day}},
	}})
	waitSynced(t, cp, all(dp1, dp2)...)

	for _, dp := range []*dataPlane{dp1, dp2} {
		for _, g := range dp.gws {
			want := `"api": "orders-` + dp.group + `"`
			if status, body := sendOne(t, g, "/orders/x", "global-key"); status != http.StatusOK || !strings.Contains(body, want) {
				t.Fatalf("gateway %s of %s: %d %s, want 200 from its own copy (%s)", g.id, dp.group, status, body, want)
			}
		}
	}
	c1, c2 := sendBoth(t, dp1.gws, "/orders/x", dp2.gws, "/orders/x", "global-key", 1600, 16)
	t.Logf("allocation 600+400: dp1 admitted %d %v, dp2 admitted %d %v", c1.admitted, c1.byGateway, c2.admitted, c2.byGateway)
	// Each data plane's two probes above spent 2 of its share.
	if c1.admitted != 598 || c2.admitted != 398 || c1.admitted+c2.admitted+4 != 1000 {
		t.Errorf("dp1 admitted %d, dp2 %d after 2 probes each (total %d); want exactly 598, 398 and 1000 with the probes", c1.admitted, c2.admitted, c1.admitted+c2.admitted+4)
	}
}

// TestSharedRedis puts two data planes (groups dp1 and dp2, two gateways
// each) on one redis-server: they share the counters, so a key with a
// quota of 1,000 gets exactly 1,000 in all under concurrent load on the
// four gateways (2,400 requests).
func TestSharedRedis(t *testing.T) {
	t.Parallel()
	tk1 := dpToken{group: "dp1", tags: []string{"dp1"}, token: "shared-token-1"}
	tk2 := dpToken{group: "dp2", tags: []string{"dp2"}, token: "shared-token-2"}
	cp := startControlPlane(t, []dpToken{tk1, tk2}, cpOptions{})
	redis := redistest.Start(t)
	dp1 := startDataPlane(t, cp, tk1, 2, redis)
	dp2 := startDataPlane(t, cp, tk2, 2, redis)
	cp.putPolicy(t, quotaPolicy("day1000", 1000))
	cp.putAPI(t, echoAPI("echo", "/echo/"))
	cp.postKey(t, "shared-key", spec.Key{Policies: []string{"day1000"}})
	waitSynced(t, cp, all(dp1, dp2)...)

	c1, c2 := sendBoth(t, dp1.gws, "/echo/s", dp2.gws, "/echo/s", "shared-key", 1200, 16)
	t.Logf("shared Redis, quota 1,000: dp1 admitted %d, dp2 %d", c1.admitted, c2.admitted)
	if total := c1.admitted + c2.admitted; total != 1000 || c1.denied+c2.denied != 1400 {
		t.Errorf("admitted %d (dp1 %d, dp2 %d), denied %d; want exactly 1000 and 1400", total, c1.admitted, c2.admitted, c1.denied+c2.denied)
	}
}
