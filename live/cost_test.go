package live_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/spec"
)

// TestLimiterFollowsCostHeader: a service's middleware given
// Limiter(api) and no cost header of its own reads the header the
// running API definition names: quota 10 at X-Cost 3 admits 3, then a
// revision that renames it to X-Units reads that one (a malformed
// X-Units is 400, X-Cost is no longer read), and one without it reads
// none.
func TestLimiterFollowsCostHeader(t *testing.T) {
	cfg := newConfig(t)
	snap := func(rev uint64, header string, max int64) *spec.Snapshot {
		a := spec.API{ID: "svc"}
		if header != "" {
			a.CostHeader, a.MaxCost = header, &max
		}
		return &spec.Snapshot{Revision: rev,
			Policies: []spec.Policy{{ID: "q", Quota: perHour(10)}},
			Keys:     []spec.Key{{KeyHash: hash("k1"), Policies: []string{"q"}}},
			APIs:     []spec.API{a}}
	}
	if err := cfg.Apply(context.Background(), snap(1, "X-Cost", 5)); err != nil {
		t.Fatal(err)
	}
	h := nethttp.Middleware(cfg.Limiter("svc"), cfg.Authenticator("svc"), nethttp.Options{API: "svc"})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	do := func(hdr ...string) (int, string) {
		r := httptest.NewRequest(http.MethodGet, "/orders", nil)
		r.Header.Set("X-API-Key", "k1")
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Add(hdr[i], hdr[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code, w.Body.String()
	}
	var got []int
	for range 4 {
		c, _ := do("X-Cost", "3")
		got = append(got, c)
	}
	if want := []int{200, 200, 200, 429}; len(got) != 4 || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] || got[3] != want[3] {
		t.Fatalf("X-Cost 3 on quota 10: %v, want %v", got, want)
	}
	if err := cfg.Apply(context.Background(), snap(2, "X-Units", 1)); err != nil {
		t.Fatal(err)
	}
	if c, b := do("X-Units", "2"); c != 400 || b != `{"error":"malformed X-Units header: want a whole number from 1 to 1"}`+"\n" {
		t.Fatalf("X-Units 2 (max 1): %d %q", c, b)
	}
	if c, b := do("X-Cost", "abc"); c != 200 {
		t.Fatalf("X-Cost no longer read: %d %q, want 200 (cost 1, the last unit)", c, b)
	}
	if err := cfg.Apply(context.Background(), snap(3, "", 0)); err != nil {
		t.Fatal(err)
	}
	if c, _ := do("X-Units", "abc"); c != 429 {
		t.Fatalf("no cost header: %d, want 429 (quota spent, the value unread)", c)
	}
}
