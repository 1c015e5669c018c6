package dataplane_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/spec"
)

// TestFollowEndpoints: an API with endpoints written through the
// control plane's admin API reaches a Follow-ed net/http service, whose
// middleware (given PathRoute) enforces them: exactly 2 POST /orders and
// 10 GET /orders a minute for one key; once the key's own policy is
// lowered to 11 a minute, the 12th request across both is refused; and
// an endpoint added later is enforced at the next revision.
func TestFollowEndpoints(t *testing.T) {
	cp := newControlPlane(t, &spec.Snapshot{})
	call := admin(t, cp)
	for path, body := range map[string]string{
		"/api/policies/api":         `{"rate":{"requests":1000,"per":"1m"}}`,
		"/api/policies/post-orders": `{"rate":{"requests":2,"per":"1m"}}`,
		"/api/policies/get-orders":  `{"rate":{"requests":10,"per":"1m"}}`,
	} {
		if st, b := call("PUT", path, body); st != 200 {
			t.Fatalf("PUT %s: %d %s", path, st, b)
		}
	}
	if st, b := call("PUT", "/api/apis/shop", `{"endpoints":[`+
		`{"method":"POST","path":"/orders","policies":["post-orders"]},`+
		`{"method":"GET","path":"/orders","policies":["get-orders"]}]}`); st != 200 {
		t.Fatalf("PUT /api/apis/shop: %d %s", st, b)
	}
	if st, b := call("POST", "/api/keys", `{"key":"shop-key-1","policies":["api"]}`); st != 201 {
		t.Fatalf("POST /api/keys: %d %s", st, b)
	}
	// A frozen clock: counts are exact however slow the machine.
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	t.Cleanup(func() { store.Close() })
	f := follow(t, cp, dataplane.FollowOptions{Store: store})
	waitFor(t, "revision 5", func() bool { return f.Revision() == 5 })

	mw := nethttp.Middleware(f.Limiter("shop"), f.Authenticator("shop"), nethttp.Options{API: "shop", Route: nethttp.PathRoute})
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })))
	t.Cleanup(srv.Close)
	admitted := func(method, path string, n int) int {
		t.Helper()
		ok := 0
		for range n {
			req, _ := http.NewRequest(method, srv.URL+path, nil)
			req.Header.Set("X-API-Key", "shop-key-1")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			switch resp.StatusCode {
			case 200:
				ok++
			case 429:
			default:
				t.Fatalf("%s %s: %d", method, path, resp.StatusCode)
			}
		}
		return ok
	}
	if got := admitted("POST", "/orders", 5); got != 2 {
		t.Fatalf("POST /orders: %d admitted, want 2", got)
	}
	if got := admitted("GET", "/orders", 15); got != 10 {
		t.Fatalf("GET /orders: %d admitted, want 10", got)
	}

	// The key's own limit, lowered to 11 a minute, has counted the 12
	// admitted (a limit change keeps the units spent): nothing more
	// passes, on any path.
	if st, b := call("PUT", "/api/policies/api", `{"rate":{"requests":11,"per":"1m"}}`); st != 200 {
		t.Fatalf("PUT api: %d %s", st, b)
	}
	waitFor(t, "revision 6", func() bool { return f.Revision() == 6 })
	if got := admitted("GET", "/items", 2); got != 0 {
		t.Fatalf("GET /items after 12 of 11: %d admitted, want 0", got)
	}

	// A new endpoint reaches the service with its own counters.
	if st, b := call("PUT", "/api/policies/api", `{"rate":{"requests":1000,"per":"1m"}}`); st != 200 {
		t.Fatalf("PUT api: %d %s", st, b)
	}
	if st, b := call("PUT", "/api/apis/shop", `{"endpoints":[`+
		`{"method":"POST","path":"/orders","policies":["post-orders"]},`+
		`{"method":"GET","path":"/orders","policies":["get-orders"]},`+
		`{"method":"DELETE","path":"/orders/{id}","policies":["post-orders"]}]}`); st != 200 {
		t.Fatalf("PUT /api/apis/shop: %d %s", st, b)
	}
	waitFor(t, "revision 8", func() bool { return f.Revision() == 8 })
	if got := admitted("DELETE", "/orders/7", 3); got != 2 {
		t.Fatalf("DELETE /orders/{id}: %d admitted, want 2", got)
	}
	if got := admitted("POST", "/orders", 1); got != 0 {
		t.Fatalf("POST /orders: %d admitted, want 0 (its 2 are spent, counters kept across revisions)", got)
	}
}

// TestGatewayEndpointsFromControlPlane: an API with endpoints created
// through the admin API reaches a gateway kept in step by its agent,
// which enforces them on proxied requests: exactly 2 POST /shop/orders
// and 10 GET /shop/orders for one key.
func TestGatewayEndpointsFromControlPlane(t *testing.T) {
	cp := newControlPlane(t, &spec.Snapshot{})
	call := admin(t, cp)
	for _, w := range []struct{ method, path, body string }{
		{"PUT", "/api/policies/api", `{"rate":{"requests":1000,"per":"1m"}}`},
		{"PUT", "/api/policies/post-orders", `{"rate":{"requests":2,"per":"1m"}}`},
		{"PUT", "/api/policies/get-orders", `{"rate":{"requests":10,"per":"1m"}}`},
		{"PUT", "/api/apis/shop", `{"listen_path":"/shop/","target":"builtin:echo","endpoints":[` +
			`{"method":"POST","path":"/orders","policies":["post-orders"]},` +
			`{"method":"GET","path":"/orders","policies":["get-orders"]}]}`},
		{"POST", "/api/keys", `{"key":"shop-key-1","policies":["api"]}`},
	} {
		if st, b := call(w.method, w.path, w.body); st != 200 && st != 201 {
			t.Fatalf("%s %s: %d %s", w.method, w.path, st, b)
		}
	}
	g := newGateway(t)
	a, err := dataplane.New(agentOptions(g.tg, cp.addr, &lockedBuffer{}))
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, a)
	waitFor(t, "revision 5 applied", func() bool { return g.tg.Revision() == 5 })
	admitted := func(method string, n int) int {
		t.Helper()
		ok := 0
		for range n {
			req, _ := http.NewRequest(method, g.url+"/shop/orders", nil)
			req.Header.Set("X-API-Key", "shop-key-1")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				ok++
			} else if resp.StatusCode != 429 {
				t.Fatalf("%s: %d", method, resp.StatusCode)
			}
		}
		return ok
	}
	if got := admitted("POST", 5); got != 2 {
		t.Fatalf("POST /shop/orders: %d admitted, want 2", got)
	}
	if got := admitted("GET", 15); got != 10 {
		t.Fatalf("GET /shop/orders: %d admitted, want 10", got)
	}
}
