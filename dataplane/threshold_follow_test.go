package dataplane_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/dataplane/threshold"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/spec"
)

// TestFollowCostHeaderAndThresholds: two replicas of a service on one
// redis-server follow a control plane whose API "orders" names the cost
// header X-Cost (bound 5) and whose policy has a quota of 10 with
// thresholds [50, 100], each replica with a threshold webhook to one
// real receiver. Cost 5 on one replica and 5 on the other: exactly 2
// admitted, the 3rd refused; the receiver gets exactly one event for
// 50 % and one for 100 %. The API changed at the control plane to
// X-Units (bound 1): the replicas read that header at their next
// request (X-Units 2 is 400 naming it).
func TestFollowCostHeaderAndThresholds(t *testing.T) {
	secret := []byte("follow-webhook-secret-0123456789abcdef")
	var mu sync.Mutex
	var got []string
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var e threshold.Event
		if r.Header.Get(threshold.SignatureHeader) != threshold.Sign(secret, body) || json.Unmarshal(body, &e) != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		got = append(got, fmt.Sprintf("%s %s %d%% used=%d/%d dp=%s", e.API, e.Policy, e.Threshold, e.Used, e.Quota, e.DataPlane))
	}))
	defer rcv.Close()

	five := int64(5)
	cp := newControlPlane(t, &spec.Snapshot{
		Policies: []spec.Policy{{ID: "p", Quota: perHour(10), Thresholds: []int64{50, 100}}},
		APIs:     []spec.API{{ID: "orders", CostHeader: "X-Cost", MaxCost: &five}},
	})
	call := admin(t, cp)
	if st, body := call("POST", "/api/keys", `{"key": "orders-key-1", "policies": ["p"]}`); st != 201 {
		t.Fatalf("POST /api/keys: %d %s", st, body)
	}
	srv := redistest.Start(t)
	var urls []string
	for i := range 2 {
		store, err := redisstore.New(srv.Client(t, nil), redisstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		f := follow(t, cp, dataplane.FollowOptions{ID: fmt.Sprint("svc-", i+1), Store: store,
			ThresholdWebhook: &threshold.Options{URL: rcv.URL, Secret: secret}})
		waitFor(t, "the key applied", func() bool { return f.Revision() >= 2 })
		limit := nethttp.Middleware(f.Limiter("orders"), f.Authenticator("orders"), nethttp.Options{API: "orders"})
		s := httptest.NewServer(limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "orders") })))
		t.Cleanup(s.Close)
		urls = append(urls, s.URL)
	}
	send := func(url, header, value string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, url+"/orders", nil)
		req.Header.Set("X-API-Key", "orders-key-1")
		req.Header.Set(header, value)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var st []int
	for _, u := range []string{urls[0], urls[1], urls[0]} {
		c, _ := send(u, "X-Cost", "5")
		st = append(st, c)
	}
	if fmt.Sprint(st) != "[200 200 429]" {
		t.Fatalf("X-Cost 5 on a quota of 10 over two replicas: %v", st)
	}
	events := func() []string {
		mu.Lock()
		defer mu.Unlock()
		out := append([]string(nil), got...)
		sort.Strings(out)
		return out
	}
	waitFor(t, "2 events", func() bool { return len(events()) >= 2 })
	want := "[orders p 100% used=10/10 dp=dp1 orders p 50% used=5/10 dp=dp1]"
	if g := fmt.Sprint(events()); g != want {
		t.Fatalf("events %s, want %s", g, want)
	}

	if st, body := call("PUT", "/api/apis/orders", `{"id": "orders", "cost_header": "X-Units", "max_cost": 1}`); st != 200 {
		t.Fatalf("PUT /api/apis/orders: %d %s", st, body)
	}
	for _, u := range urls {
		waitFor(t, "the API change", func() bool {
			c, body := send(u, "X-Units", "2")
			return c == 400 && strings.Contains(body, "malformed X-Units header: want a whole number from 1 to 1")
		})
	}
	if g := fmt.Sprint(events()); g != want {
		t.Fatalf("events after: %s, want %s", g, want)
	}
}

// TestThresholdUsageAtTheControlPlane: a replica on a redis-server made
// with FollowsControlPlane (so its data plane's quota runner runs)
// reaches thresholds 50 and 100 of a quota of 4; the runner reports the
// events with its lease batches and the control plane's GET
// /api/usage/keys/{hash} shows both, in one period, once each.
func TestThresholdUsageAtTheControlPlane(t *testing.T) {
	cp := newControlPlane(t, &spec.Snapshot{
		Policies: []spec.Policy{{ID: "p", Quota: perHour(4), Thresholds: []int64{50, 100}}},
		APIs:     []spec.API{{ID: "orders"}},
	})
	qs, err := controlplane.NewQuotaServer(controlplane.QuotaOptions{Store: cp.store,
		Tokens: []controlplane.DataPlaneToken{{Hash: controlplane.HashToken(testToken), Group: testGroup}}})
	if err != nil {
		t.Fatal(err)
	}
	cp.Stop()
	cp.quota = qs
	cp.Start(t)
	call := admin(t, cp)
	if st, body := call("POST", "/api/keys", `{"key": "orders-key-1", "policies": ["p"]}`); st != 201 {
		t.Fatalf("POST /api/keys: %d %s", st, body)
	}
	rcv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer rcv.Close()
	srv := redistest.Start(t)
	store, err := redisstore.New(srv.Client(t, nil), redisstore.Options{FollowsControlPlane: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	f := follow(t, cp, dataplane.FollowOptions{Store: store, ThresholdWebhook: &threshold.Options{URL: rcv.URL, Secret: []byte("x")}})
	waitFor(t, "the key applied", func() bool { return f.Revision() >= 2 })
	url := service(t, f)
	if got := orders(t, url, "orders-key-1", 5); got != "OK, OK, OK, OK, Too Many Requests" {
		t.Fatalf("quota of 4: %s", got)
	}
	var body string
	waitFor(t, "the usage to show both", func() bool {
		var st int
		st, body = call("GET", "/api/usage/keys/"+hash("orders-key-1"), "")
		return st == 200 && strings.Contains(body, `"reached":[50,100]`)
	})
	var u controlplane.Usage
	if err := json.Unmarshal([]byte(body), &u); err != nil {
		t.Fatal(err)
	}
	if len(u.Thresholds) != 1 || len(u.Thresholds[0].Events) != 2 || u.Thresholds[0].API != "orders" || u.Thresholds[0].Policy != "p" ||
		u.Thresholds[0].Events[0].DataPlane != testGroup || !u.Thresholds[0].PeriodEnd.Equal(u.Thresholds[0].PeriodStart.Add(time.Hour)) {
		t.Fatalf("usage: %s", body)
	}
	waitFor(t, "both delivered", func() bool {
		_, m := get(t, url+"/metrics", "")
		return strings.Contains(m, "\n"+`limitplane_threshold_events_total{outcome="delivered"} 2`+"\n")
	})
	_, m := get(t, url+"/metrics", "")
	for _, line := range []string{`limitplane_threshold_events_total{outcome="queued"} 2`, `limitplane_threshold_events_total{outcome="dropped"} 0`,
		`limitplane_threshold_events_total{outcome="duplicate"} 0`, `limitplane_threshold_events_total{outcome="failed"} 0`} {
		if !strings.Contains(m, "\n"+line+"\n") {
			t.Errorf("/metrics has no line %q", line)
		}
	}
}
