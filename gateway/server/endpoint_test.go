package server_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/limitplane/limitplane/gateway/config"
	"github.com/limitplane/limitplane/gateway/server"
	"github.com/limitplane/limitplane/internal/redistest"
)

// shopYAML is issue 23's example behind a real upstream: POST /orders
// 2/min and GET /orders 10/min on the shop API, the key's own policy
// apiRate a minute across the API.
func shopYAML(store, target string, apiRate int) string {
	return fmt.Sprintf(`listen: 127.0.0.1:0
store: %s
policies:
  - {id: api, rate: {requests: %d, per: 1m}}
  - {id: post-orders, rate: {requests: 2, per: 1m}}
  - {id: get-orders, rate: {requests: 10, per: 1m}}
keys:
  - {key: k1, policies: [api]}
apis:
  - id: shop
    listen_path: /shop/
    target: %s
    endpoints:
      - {method: POST, path: /orders, policies: [post-orders]}
      - {method: GET, path: /orders, policies: [get-orders], cost: 1}
      - {method: any, path: "/reports/{year}", cost: 5}
`, store, apiRate, target)
}

// send sends n requests of method to url with key k1 and returns how many
// the gateway admitted (200) and how many it refused (429); anything else
// fails the test.
func send(t *testing.T, method, url string, n int) (ok, refused int) {
	t.Helper()
	for range n {
		req, _ := http.NewRequest(method, url, nil)
		req.Header.Set("X-API-Key", "k1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			refused++
		default:
			t.Fatalf("%s %s: status %d", method, url, resp.StatusCode)
		}
	}
	return ok, refused
}

// upstream counts the requests it receives by method and path.
type upstream struct {
	mu  sync.Mutex
	got map[string]int
}

func newUpstream(t *testing.T) (*upstream, string) {
	u := &upstream{got: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.got[r.Method+" "+r.URL.Path]++
		u.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	return u, srv.URL
}

func (u *upstream) count(what string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.got[what]
}

// TestGatewayEndpoints: a gateway from a YAML file admits exactly 2 POST
// /orders and 10 GET /orders of one key a minute, the API-wide limit
// still applies across both (11/min stops the 12th), and an endpoint's
// cost is charged to the API's limit; on the in-process store and on
// Redis, where the key's counters for the API, POST /orders and GET
// /orders are three keys.
func TestGatewayEndpoints(t *testing.T) {
	forEngines(t, func(t *testing.T, engine string) {
		rs := redistest.Start(t)
		for _, store := range []string{"memory", "redis://" + rs.Addr} {
			t.Run(strings.SplitN(store, ":", 2)[0], func(t *testing.T) {
				if store != "memory" {
					rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
					defer rdb.Close()
					if err := rdb.FlushAll(t.Context()).Err(); err != nil {
						t.Fatal(err)
					}
				}
				up, target := newUpstream(t)
				dir := t.TempDir()
				file := filepath.Join(dir, "gateway.yaml")
				writeFile(t, file, onEngine(shopYAML(store, target, 1000), engine))
				srv, _ := serve(t, server.Options{ConfigPath: file})
				base := srv.URL() + "/shop"

				if ok, no := send(t, "POST", base+"/orders", 5); ok != 2 || no != 3 {
					t.Fatalf("POST /orders: %d admitted, %d refused; want 2 and 3", ok, no)
				}
				// A method in another case counts against the same endpoint
				// (an upstream may take "post" for POST): it does not escape.
				for _, m := range []string{"post", "Post"} {
					if ok, no := send(t, m, base+"/orders", 2); ok != 0 || no != 2 {
						t.Fatalf("%s /orders after POST's 2: %d admitted, %d refused; want 0 and 2", m, ok, no)
					}
				}
				if ok, no := send(t, "GET", base+"/orders", 15); ok != 10 || no != 5 {
					t.Fatalf("GET /orders: %d admitted, %d refused; want 10 and 5", ok, no)
				}
				if got := up.count("POST /orders") + up.count("GET /orders"); got != 12 {
					t.Fatalf("upstream got %d requests to /orders, want 12", got)
				}
				// Other paths are the API's alone.
				if ok, _ := send(t, "DELETE", base+"/orders-archive", 3); ok != 3 {
					t.Fatalf("DELETE /orders-archive: %d admitted, want 3", ok)
				}
				if store != "memory" {
					rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
					defer rdb.Close()
					keys, err := rdb.Keys(t.Context(), "*").Result()
					if err != nil {
						t.Fatal(err)
					}
					slices.Sort(keys)
					// The consumer's hash, then the kind and scope (spaces
					// escaped).
					var scopes []string
					for _, k := range keys {
						_, rest, _ := strings.Cut(k, "}:")
						scopes = append(scopes, rest)
					}
					if got := strings.Join(scopes, " | "); got != "gcra: | gcra:shop%20GET%20/orders | gcra:shop%20POST%20/orders" {
						t.Fatalf("Redis keys %q (%q), want the API's and one per endpoint", got, keys)
					}
				}
			})
		}
	})
}

// TestGatewayEndpointsBothApply: with the API's own limit at 11 a
// minute, POST /orders and GET /orders together get 11 through.
func TestGatewayEndpointsBothApply(t *testing.T) {
	forEngines(t, func(t *testing.T, engine string) {
		up, target := newUpstream(t)
		file := filepath.Join(t.TempDir(), "gateway.yaml")
		writeFile(t, file, onEngine(shopYAML("memory", target, 11), engine))
		srv, _ := serve(t, server.Options{ConfigPath: file})
		base := srv.URL() + "/shop"
		if ok, _ := send(t, "POST", base+"/orders", 4); ok != 2 {
			t.Fatalf("POST: %d admitted, want 2", ok)
		}
		if ok, _ := send(t, "GET", base+"/orders", 12); ok != 9 {
			t.Fatalf("GET: %d admitted, want 9 (11 across both)", ok)
		}
		if got := up.count("POST /orders") + up.count("GET /orders"); got != 11 {
			t.Fatalf("upstream got %d, want 11", got)
		}
	})
}

// TestGatewayEndpointCost: an endpoint's cost is what each request
// spends of the API's limit.
func TestGatewayEndpointCost(t *testing.T) {
	forEngines(t, func(t *testing.T, engine string) {
		_, target := newUpstream(t)
		file := filepath.Join(t.TempDir(), "gateway.yaml")
		writeFile(t, file, onEngine(shopYAML("memory", target, 12), engine))
		srv, _ := serve(t, server.Options{ConfigPath: file})
		base := srv.URL() + "/shop"
		if ok, no := send(t, "GET", base+"/reports/2026", 3); ok != 2 || no != 1 {
			t.Fatalf("reports: %d admitted, %d refused; want 2 and 1 (cost 5 of 12)", ok, no)
		}
		if ok, no := send(t, "GET", base+"/other", 3); ok != 2 || no != 1 {
			t.Fatalf("other: %d admitted, %d refused; want 2 and 1 (2 of 12 left)", ok, no)
		}
	})
}

// TestGatewayEndpointConfigErrors: the file's endpoint problems are
// reported at their line and column.
func TestGatewayEndpointConfigErrors(t *testing.T) {
	file := filepath.Join(t.TempDir(), "gateway.yaml")
	writeFile(t, file, `listen: 127.0.0.1:0
policies:
  - {id: p, rate: {requests: 2, per: 1m}}
keys: [{key: k1, policies: [p]}]
apis:
  - id: shop
    listen_path: /shop/
    target: builtin:echo
    endpoints:
      - {method: FETCH, path: /orders, policies: [p]}
      - {method: GET, path: "/orders/{id", policies: [p]}
      - {method: GET, path: "/a/{x}", policies: [p]}
      - {method: get, path: "/a/{y}/", policies: [p]}
      - {path: /b, policies: [nope]}
      - {path: /c, policies: [p], cost: 1.5}
      - {path: /d, cost: 0}
`)
	_, err := config.Load(file)
	var errs config.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Load: %v, want config.Errors", err)
	}
	want := strings.Join([]string{
		file + `:10:18: apis[0].endpoints[0].method: unknown method "FETCH" (want GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS, TRACE, or any)`,
		file + `:11:29: apis[0].endpoints[1].path: "/orders/{id": a {param} must be a whole segment, like /orders/{id}`,
		file + `:13:29: apis[0].endpoints[3].path: duplicate endpoint GET /a/{} (first at apis[0].endpoints[2].path on line 12)`,
		file + `:14:31: apis[0].endpoints[4].policies[0]: unknown policy "nope"`,
		file + `:15:41: apis[0].endpoints[5].cost: want an integer, got 1.5`,
		file + `:16:26: apis[0].endpoints[6].cost: 0: a cost is 1 to 2^53 − 1 (left out: the request's own)`,
	}, "\n")
	if err.Error() != want {
		t.Fatalf("errors:\n%v\nwant:\n%s", err, want)
	}
}

// TestGatewayPolicyEndpointPlans: a policy's own limit at an endpoint
// (policies[].endpoints) replaces the endpoint's policies for its keys:
// a gold key POSTs 5 orders a minute, a free key 2; a sliding window
// there is refused on the in-process store at its line.
func TestGatewayPolicyEndpointPlans(t *testing.T) {
	_, target := newUpstream(t)
	file := filepath.Join(t.TempDir(), "gateway.yaml")
	plans := strings.Replace(shopYAML("memory", target, 1000), "keys:\n", `  - id: gold
    rate: {requests: 1000, per: 1m}
    endpoints:
      - {api: shop, method: POST, path: /orders, rate: {requests: 5, per: 1m}}
keys:
  - {key: gold-1, policies: [gold]}
`, 1)
	writeFile(t, file, plans)
	srv, _ := serve(t, server.Options{ConfigPath: file})
	count := func(key string) int {
		n := 0
		for range 7 {
			req, _ := http.NewRequest("POST", srv.URL()+"/shop/orders", nil)
			req.Header.Set("X-API-Key", key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				n++
			}
		}
		return n
	}
	if got := count("gold-1"); got != 5 {
		t.Errorf("gold POST /orders: %d admitted, want 5", got)
	}
	if got := count("k1"); got != 2 {
		t.Errorf("free POST /orders: %d admitted, want 2", got)
	}

	writeFile(t, file, strings.Replace(plans, "rate: {requests: 5, per: 1m}}", "rate: {requests: 5, per: 1m, algorithm: sliding_window}}", 1))
	_, err := config.Load(file)
	if want := file + ":10:90: policies[3].endpoints[0].rate.algorithm: sliding_window is not supported by the memory store (only gcra)"; err == nil || err.Error() != want {
		t.Fatalf("Load: %v\nwant %s", err, want)
	}
}

// TestGatewayEndpointEscapedSegments: an encoded "/" inside a {param}
// segment does not take a request out of its endpoint. The upstream is
// a ServeMux with the pattern "GET /o/{id}/items", which splits the
// escaped path, so it serves "/o/1%2F2/items" as id "1/2"; the gateway
// must count those requests against the endpoint "/o/{id}/items" too (1
// an hour): once the first is admitted, every other id is refused, with
// or without an encoded slash, and a literal spelled with escapes
// ("/%6F/") is the same endpoint. The upstream gets exactly one request.
func TestGatewayEndpointEscapedSegments(t *testing.T) {
	forEngines(t, func(t *testing.T, engine string) {
		var mu sync.Mutex
		var ids []string
		mux := http.NewServeMux()
		mux.HandleFunc("GET /o/{id}/items", func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			ids = append(ids, r.PathValue("id"))
			mu.Unlock()
		})
		up := httptest.NewServer(mux)
		t.Cleanup(up.Close)
		file := filepath.Join(t.TempDir(), "gateway.yaml")
		writeFile(t, file, onEngine(fmt.Sprintf(`listen: 127.0.0.1:0
policies:
  - {id: api, rate: {requests: 1000, per: 1m}}
  - {id: one, rate: {requests: 1, per: 1h}}
keys:
  - {key: k1, policies: [api]}
apis:
  - id: shop
    listen_path: /shop/
    target: %s
    endpoints:
      - {method: GET, path: "/o/{id}/items", policies: [one]}
`, up.URL), engine))
		srv, _ := serve(t, server.Options{ConfigPath: file})
		base := srv.URL() + "/shop"
		if ok, no := send(t, "GET", base+"/o/1/items", 1); ok != 1 || no != 0 {
			t.Fatalf("GET /o/1/items: %d admitted, %d refused; want 1 and 0", ok, no)
		}
		for _, p := range []string{"/o/1%2F2/items", "/o/1%2f3/items", "/%6F/4/items", "/o/5%2F/items", "/o/%2F6/items"} {
			if ok, no := send(t, "GET", base+p, 1); ok != 0 || no != 1 {
				t.Errorf("GET %s: %d admitted, %d refused; want the endpoint's refusal", p, ok, no)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if fmt.Sprint(ids) != "[1]" {
			t.Fatalf("the upstream served ids %q, want only [1]", ids)
		}
	})
}

// TestGatewayListenPathEscapedSlash: a listen path matches whole segments
// of the path as the client escaped it. "/shop%2Freports" is one segment,
// "shop/reports", so it is not under "/shop/": it gets the gateway's 404
// and never reaches the shop API's upstream, which (as WSGI and many
// routers do) would decode it to "/shop/reports" and serve the endpoint
// "/reports" (1 an hour) past its limit; likewise "/open%2Fhello" is not
// under "/open/". A listen path spelled with escapes ("/sh%6Fp/") is the
// same listen path: the endpoint's refusal, and the open API's upstream
// gets "/a%2Fb" after "/%6Fpen" as the client escaped it. On both
// engines; the upstream gets exactly the two requests admitted.
func TestGatewayListenPathEscapedSlash(t *testing.T) {
	forEngines(t, func(t *testing.T, engine string) {
		var mu sync.Mutex
		var got []string
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			got = append(got, r.URL.EscapedPath())
			mu.Unlock()
		}))
		t.Cleanup(up.Close)
		file := filepath.Join(t.TempDir(), "gateway.yaml")
		writeFile(t, file, onEngine(fmt.Sprintf(`listen: 127.0.0.1:0
policies:
  - {id: api, rate: {requests: 1000, per: 1m}}
  - {id: strict, rate: {requests: 1, per: 1h}}
keys:
  - {key: k1, policies: [api]}
apis:
  - id: shop
    listen_path: /shop/
    target: %[1]s
    strip_listen_path: false
    endpoints: [{path: /reports, policies: [strict]}]
  - {id: open, listen_path: /open/, target: %[1]s, auth: keyless, policies: [api]}
`, up.URL), engine))
		srv, _ := serve(t, server.Options{ConfigPath: file})
		if ok, no := send(t, "GET", srv.URL()+"/shop/reports", 1); ok != 1 || no != 0 {
			t.Fatalf("GET /shop/reports: %d admitted, %d refused; want 1 and 0", ok, no)
		}
		for _, p := range []string{"/shop%2Freports", "/shop%2freports", "/sh%6Fp%2Freports", "/open%2Fhello"} {
			req, _ := http.NewRequest("GET", srv.URL()+p, nil)
			req.Header.Set("X-API-Key", "k1")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if want := `{"error":"no API is served at this path"}`; resp.StatusCode != http.StatusNotFound || strings.TrimSpace(string(body)) != want {
				t.Errorf("GET %s: %d %s; want 404 %s", p, resp.StatusCode, body, want)
			}
		}
		if ok, no := send(t, "GET", srv.URL()+"/sh%6Fp/reports", 1); ok != 0 || no != 1 {
			t.Errorf("GET /sh%%6Fp/reports: %d admitted, %d refused; want the endpoint's refusal", ok, no)
		}
		if ok, no := send(t, "GET", srv.URL()+"/%6Fpen/a%2Fb", 1); ok != 1 || no != 0 {
			t.Errorf("GET /%%6Fpen/a%%2Fb: %d admitted, %d refused; want 1 and 0", ok, no)
		}
		mu.Lock()
		defer mu.Unlock()
		if want := []string{"/shop/reports", "/a%2Fb"}; !slices.Equal(got, want) {
			t.Fatalf("the upstream got %q, want %q", got, want)
		}
	})
}
