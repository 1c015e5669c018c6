package gateway_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/limitplane/limitplane/spec"
)

// getCost sends GET path with key and the X-Cost values given (none when
// nil).
func (g *testGateway) getCost(t *testing.T, path, key string, costs ...string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, g.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", key)
	for _, c := range costs {
		req.Header.Add("X-Cost", c)
	}
	resp, err := g.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, resp.Header, string(b)}
}

func costSnapshot(rev uint64, upURL, header string, max *int64) *spec.Snapshot {
	one := int64(1)
	return &spec.Snapshot{
		Revision: rev,
		Policies: []spec.Policy{{ID: "q", Quota: &spec.Quota{Max: 10, Renewal: spec.Duration(time.Hour)}}},
		Keys:     []spec.Key{{KeyHash: keyHash("k1"), Policies: []string{"q"}}, {KeyHash: keyHash("k2"), Policies: []string{"q"}}},
		APIs: []spec.API{{ID: "api", ListenPath: "/api/", Target: upURL, CostHeader: header, MaxCost: max,
			Endpoints: []spec.Endpoint{{Path: "/fixed", Cost: &one}}}},
	}
}

// TestCostHeader: an API's cost_header charges each request its value:
// quota 10, cost 3 admits exactly 3 requests, the 4th is refused; every
// malformed value is 400 naming the header and counts nothing; a
// request without it costs 1; an endpoint's fixed cost wins over the
// header; a new definition without the header counts 1 again.
func TestCostHeader(t *testing.T) {
	up := upstream(t)
	g := newTestGateway(t)
	five := int64(5)
	g.apply(t, costSnapshot(1, up.URL, "X-Cost", &five))

	const bad = `{"error":"malformed X-Cost header: want a whole number from 1 to 5"}` + "\n"
	const twice = `{"error":"malformed X-Cost header: given more than once"}` + "\n"
	for _, v := range [][]string{{"abc"}, {"-1"}, {"0"}, {"6"}, {"1.5"}, {""}, {"3", "3"}, {"3,3"}} {
		a := g.getCost(t, "/api/x", "k1", v...)
		want := bad
		if len(v) == 2 || v[0] == "3,3" {
			want = twice
		}
		if a.status != 400 || a.body != want || a.header.Get("Ratelimit") != "" {
			t.Fatalf("X-Cost %q: %d %q %v, want 400 %q", v, a.status, a.body, a.header, want)
		}
	}
	// The malformed ones counted nothing: 10 units left.
	var st []int
	for range 4 {
		st = append(st, g.getCost(t, "/api/x", "k1", "3").status)
	}
	checkStatuses(t, "k1 at cost 3, quota 10", st, []int{200, 200, 200, 429})
	// 1 unit left: a request without the header costs 1.
	if a := g.getCost(t, "/api/x", "k1"); a.status != 200 || a.header.Get("Ratelimit") != `"q/quota";r=0;t=3600` {
		t.Fatalf("k1 without the header: %d %v", a.status, a.header)
	}

	// An endpoint's fixed cost (1) wins over the header's 5.
	st = nil
	for range 11 {
		st = append(st, g.getCost(t, "/api/fixed", "k2", "5").status)
	}
	checkStatuses(t, "k2 at /fixed (cost 1) with X-Cost 5", st, []int{200, 200, 200, 200, 200, 200, 200, 200, 200, 200, 429})

	// A definition without the header: its values are not read.
	g.apply(t, costSnapshot(2, up.URL, "", nil))
	if a := g.getCost(t, "/api/x", "k1", "abc"); a.status != 429 {
		t.Fatalf("no cost header, k1 spent: %d %q, want 429", a.status, a.body)
	}
	if err := g.gw.Apply(context.Background(), costSnapshot(3, up.URL, "X-Cost", nil)); err == nil {
		t.Fatal("cost_header without max_cost applied")
	}
}
