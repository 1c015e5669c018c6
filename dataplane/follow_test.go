package dataplane_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/controlplane"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/spec"
	"github.com/redis/go-redis/v9"
)

// adminToken is the control plane's admin token in the Follow tests.
const adminToken = "follow-test-admin-token-0123456789abcdef"

// ordersSnapshot is the control plane's state of the Follow tests: policy
// p (a quota of 3 an hour) and the service-side API "orders" (no
// listen_path, no target), no keys.
func ordersSnapshot() *spec.Snapshot {
	return &spec.Snapshot{
		Policies: []spec.Policy{{ID: "p", Quota: perHour(3)}},
		APIs:     []spec.API{{ID: "orders"}},
	}
}

// admin serves the control plane's admin API over cp's store and returns
// a function that calls it: method, path and JSON body ("" for none),
// giving the status and body.
func admin(t *testing.T, cp *controlPlane) func(method, path, body string) (int, string) {
	t.Helper()
	h, err := controlplane.Admin(controlplane.AdminOptions{Store: cp.store, Token: adminToken, DataPlanes: cp.dps, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return func(method, path, body string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+adminToken)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
}

// follow starts a Follower of cp with opts's store and timers and closes
// it at the end of the test.
func follow(t *testing.T, cp *controlPlane, opts dataplane.FollowOptions) *dataplane.Follower {
	t.Helper()
	opts.Address, opts.Group, opts.Token = cp.addr, testGroup, testToken
	if opts.ID == "" {
		opts.ID = "svc-1"
	}
	opts.Logger = slog.New(slog.DiscardHandler)
	f, err := dataplane.Follow(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return f
}

// service serves a net/http service enforcing the API "orders" with f
// (GET /orders behind the nethttp middleware, /readyz and /metrics
// beside it) and returns its URL.
func service(t *testing.T, f *dataplane.Follower) string {
	t.Helper()
	limit := nethttp.Middleware(f.Limiter("orders"), f.Authenticator("orders"), nethttp.Options{API: "orders"})
	mux := http.NewServeMux()
	mux.Handle("GET /orders", limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "orders") })))
	mux.Handle("GET /readyz", f.ReadyHandler())
	mux.Handle("GET /metrics", f.MetricsHandler())
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv.URL
}

// get GETs url with the API key key (none when "") and returns the
// status and body.
func get(t *testing.T, url, key string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// orders sends n GET /orders with key and returns their statuses.
func orders(t *testing.T, url, key string, n int) string {
	t.Helper()
	var out []string
	for range n {
		st, _ := get(t, url+"/orders", key)
		out = append(out, http.StatusText(st))
	}
	return strings.Join(out, ", ")
}

// TestFollowService runs a net/http service on a Follower of a real
// control plane: before the first configuration its requests and
// /readyz answer 503; once the control plane is up, /readyz answers 200
// with the revision and /metrics shows the link; a key created through
// the control plane's admin API is admitted (3 of a quota of 3), a quota
// reset lands (exactly 3 more), and a deleted key is refused (403), each
// as soon as the service runs the revision of the write.
func TestFollowService(t *testing.T) {
	cp := newControlPlane(t, ordersSnapshot())
	call := admin(t, cp)
	cp.Stop()
	f := follow(t, cp, dataplane.FollowOptions{})
	url := service(t, f)

	if st, body := get(t, url+"/orders", "k1"); st != 503 || body != `{"error":"no configuration applied yet"}`+"\n" {
		t.Fatalf("before the first configuration: %d %s", st, body)
	}
	st, body := get(t, url+"/readyz", "")
	var ready dataplane.Readiness
	if err := json.Unmarshal([]byte(body), &ready); err != nil {
		t.Fatal(err)
	}
	if st != 503 || !strings.HasPrefix(body, `{"ready":false,"revision":0,"error":"no configuration applied yet","control_plane":{"state":"`) ||
		ready.Ready || ready.Degraded || ready.NotBuilt != nil || ready.ControlPlane.AppliedRevision != 0 || ready.ControlPlane.Source != "none" {
		t.Fatalf("/readyz before the first configuration: %d %s", st, body)
	}

	cp.Start(t)
	waitFor(t, "revision 1 applied", func() bool { return f.Revision() == 1 && cp.applied("svc-1") == 1 })
	st, body = get(t, url+"/readyz", "")
	if st != 200 || !strings.HasPrefix(body, `{"ready":true,"revision":1,"store":"in-process","control_plane":{"state":"connected","applied_revision":1,`) {
		t.Fatalf("/readyz once applied: %d %s", st, body)
	}
	ready = dataplane.Readiness{}
	if err := json.Unmarshal([]byte(body), &ready); err != nil {
		t.Fatal(err)
	}
	if !ready.Ready || ready.Revision != 1 || ready.Error != "" || ready.ControlPlane.Source != "control_plane" || ready.ControlPlane.Deliveries != (dataplane.Deliveries{SnapshotsApplied: 1}) {
		t.Fatalf("/readyz once applied: %+v", ready)
	}
	_, metrics := get(t, url+"/metrics", "")
	for _, line := range []string{"limitplane_sync_connected 1", "limitplane_config_revision 1", "limitplane_sync_applied_revision 1",
		`limitplane_config_applies_total{result="ok"} 1`} {
		if !strings.Contains(metrics, "\n"+line+"\n") {
			t.Errorf("/metrics has no line %q:\n%s", line, metrics)
		}
	}

	if st, body := call("POST", "/api/keys", `{"key": "orders-key-1", "policies": ["p"]}`); st != 201 {
		t.Fatalf("POST /api/keys: %d %s", st, body)
	}
	waitFor(t, "revision 2 (the key)", func() bool { return f.Revision() == 2 })
	if got := orders(t, url, "orders-key-1", 4); got != "OK, OK, OK, Too Many Requests" {
		t.Fatalf("the new key: %s, want 3 of a quota of 3", got)
	}
	h := hash("orders-key-1")
	if st, body := call("POST", "/api/keys/"+h+"/reset-quota", ""); st != 200 {
		t.Fatalf("reset-quota: %d %s", st, body)
	}
	waitFor(t, "revision 3 (the reset)", func() bool { return f.Revision() == 3 })
	if got := orders(t, url, "orders-key-1", 4); got != "OK, OK, OK, Too Many Requests" {
		t.Fatalf("after the reset: %s, want exactly 3 more", got)
	}
	if st, body := call("DELETE", "/api/keys/"+h, ""); st != 200 {
		t.Fatalf("DELETE: %d %s", st, body)
	}
	waitFor(t, "revision 4 (the delete)", func() bool { return f.Revision() == 4 })
	if st, body := get(t, url+"/orders", "orders-key-1"); st != 403 || body != `{"error":"unknown API key"}`+"\n" {
		t.Fatalf("the deleted key: %d %s", st, body)
	}
	// The key changes came as Changes, applied in place.
	if s := f.Agent().Status(); s.AppliedRevision != 4 || s.Deliveries != (dataplane.Deliveries{SnapshotsApplied: 1, ChangesApplied: 3}) {
		t.Fatalf("status: %+v", s)
	}
	_, metrics = get(t, url+"/metrics", "")
	for _, line := range []string{"limitplane_config_revision 4", `limitplane_sync_deliveries_total{kind="changes",result="applied"} 3`,
		`limitplane_decisions_total{api="orders",limit="quota",policy="p",result="allowed"} 6`,
		`limitplane_decisions_total{api="orders",limit="quota",policy="p",result="denied"} 2`} {
		if !strings.Contains(metrics, "\n"+line+"\n") {
			t.Errorf("/metrics has no line %q:\n%s", line, metrics)
		}
	}
}

// TestFollowRedisPersisted: with a Redis store and no Persister, the
// Follower persists its configuration in that Redis; a second Follower
// started while the control plane is down answers 503 until
// StartTimeout, then enforces the persisted configuration, with the
// counters the first one left in Redis (1 of 3 spent: 2 more).
func TestFollowRedisPersisted(t *testing.T) {
	srv := redistest.Start(t)
	newStore := func() *redisstore.Store {
		s, err := redisstore.New(srv.Client(t, nil), redisstore.Options{Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	snap := ordersSnapshot()
	snap.Keys = []spec.Key{{KeyHash: hash("orders-key-1"), Policies: []string{"p"}}}
	cp := newControlPlane(t, snap)
	f1 := follow(t, cp, dataplane.FollowOptions{Store: newStore()})
	url1 := service(t, f1)
	waitFor(t, "revision 1 persisted", func() bool { return f1.Agent().Status().PersistedRevision == 1 })
	if got := orders(t, url1, "orders-key-1", 1); got != "OK" {
		t.Fatalf("the first follower: %s", got)
	}
	if err := f1.Close(); err != nil {
		t.Fatal(err)
	}
	cp.Stop()
	// In the data plane's Redis, under its group's key.
	fields, err := srv.Client(t, nil).HKeys(context.Background(), dataplane.RedisConfigKey(testGroup)).Result()
	if err != nil || !slices.Contains(fields, "snapshot") {
		t.Fatalf("Redis hash %s: fields %v, %v; want the persisted snapshot", dataplane.RedisConfigKey(testGroup), fields, err)
	}

	f2 := follow(t, cp, dataplane.FollowOptions{Store: newStore(), ID: "svc-2", StartTimeout: 200 * time.Millisecond})
	url2 := service(t, f2)
	if st, body := get(t, url2+"/orders", "orders-key-1"); st != 503 || body != `{"error":"no configuration applied yet"}`+"\n" {
		t.Fatalf("before StartTimeout: %d %s", st, body)
	}
	waitFor(t, "the persisted configuration", func() bool { return f2.Agent().Status().Source == "persisted" })
	if got := orders(t, url2, "orders-key-1", 3); got != "OK, OK, Too Many Requests" {
		t.Fatalf("under the persisted configuration: %s, want 2 more of 3", got)
	}
	if st, body := get(t, url2+"/readyz", ""); st != 200 || !strings.HasPrefix(body, `{"ready":true,"revision":1,"store":"ok","control_plane":{"state":"`) {
		t.Fatalf("/readyz under the persisted configuration: %d %s", st, body)
	}
	if s := f2.Agent().Status(); s.AppliedRevision != 1 || s.PersistedRevision != 1 || s.State == "connected" {
		t.Fatalf("status: %+v", s)
	}
}

// TestFollowRefuses: Follow names the option it lacks.
func TestFollowRefuses(t *testing.T) {
	good := dataplane.FollowOptions{Address: "127.0.0.1:1", Group: "g", Token: "t", Logger: slog.New(slog.DiscardHandler)}
	for _, c := range []struct {
		edit func(o *dataplane.FollowOptions)
		want string
	}{
		{func(o *dataplane.FollowOptions) { o.Address = "" }, "dataplane: FollowOptions.Address is empty"},
		{func(o *dataplane.FollowOptions) { o.Address = "dns:///%%%" }, `dataplane: FollowOptions.Address "dns:///%%%": dataplane: dial dns:///%%%: parse "dns:///dns:///%%%": invalid URL escape "%%%"`},
		{func(o *dataplane.FollowOptions) { o.Group = "" }, "dataplane: FollowOptions.Group is empty"},
		{func(o *dataplane.FollowOptions) { o.Token = "" }, "dataplane: FollowOptions.Token is empty"},
		{func(o *dataplane.FollowOptions) { o.OnStale = "panic" }, `dataplane: unknown OnStale "panic" (want keep or fail_closed)`},
		{func(o *dataplane.FollowOptions) { o.MaxStale = -time.Second }, "dataplane: MaxStale -1s is negative"},
	} {
		o := good
		c.edit(&o)
		f, err := dataplane.Follow(context.Background(), o)
		if f != nil || err == nil || err.Error() != c.want {
			t.Errorf("Follow: %v, %v; want %s", f, err, c.want)
		}
	}
	f, err := dataplane.Follow(context.Background(), good)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
}

// TestFollowDisableDecisionMetrics: with DisableDecisionMetrics,
// MetricsHandler serves the configuration and sync metrics and no
// decision metrics; without it, the decision collector's series are
// there from the start.
func TestFollowDisableDecisionMetrics(t *testing.T) {
	for _, disable := range []bool{false, true} {
		f, err := dataplane.Follow(context.Background(), dataplane.FollowOptions{
			Address: "127.0.0.1:1", Group: "g", Token: "t", DisableDecisionMetrics: disable,
			Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		f.MetricsHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		f.Close()
		body := rec.Body.String()
		if rec.Code != http.StatusOK || !strings.Contains(body, "limitplane_sync_connected 0\n") || !strings.Contains(body, `limitplane_config_applies_total{result="ok"} 0`+"\n") {
			t.Fatalf("disable=%v: %d\n%s", disable, rec.Code, body)
		}
		if got := strings.Contains(body, "limitplane_store_errors_total"); got == disable {
			t.Fatalf("disable=%v: store_errors_total present %v\n%s", disable, got, body)
		}
	}
}

// TestFollowReadinessNeedsOwnAPI: a service whose own API (the one given
// to Authenticator) is not in the running configuration is not ready,
// while the same configuration with it is.
func TestFollowReadinessNeedsOwnAPI(t *testing.T) {
	cp := newControlPlane(t, ordersSnapshot())
	f := follow(t, cp, dataplane.FollowOptions{})
	f.Authenticator("nosuch")
	waitFor(t, "revision 1 applied", func() bool { return f.Revision() == 1 })
	r := f.Readiness(context.Background())
	if want := `API "nosuch" is not in the running configuration (is it defined at the control plane, for this data plane's tags?)`; r.Ready || r.Error != want || r.Revision != 1 {
		t.Fatalf("readiness with a missing own API: %+v, want not ready: %s", r, want)
	}
	g := follow(t, cp, dataplane.FollowOptions{ID: "svc-2"})
	g.Authenticator("orders")
	waitFor(t, "revision 1 applied", func() bool { return g.Revision() == 1 })
	if r := g.Readiness(context.Background()); !r.Ready || r.Error != "" {
		t.Fatalf("readiness with its own API: %+v", r)
	}
}

// TestFollowReadinessPingsTheStore: on a Redis store, /readyz says
// "store":"ok" while the redis-server answers; paused (SIGSTOP), a
// service under core.FailClosed is not ready (503, "store":"unreachable")
// while one under FailOpen stays ready and says the store is unreachable;
// resumed, both are ready again. On the memory store, "in-process".
func TestFollowReadinessPingsTheStore(t *testing.T) {
	srv := redistest.Start(t)
	cp := newControlPlane(t, ordersSnapshot())
	urls := map[core.FailurePolicy]string{}
	for i, fp := range []core.FailurePolicy{core.FailClosed, core.FailOpen} {
		// ContextTimeoutEnabled: Timeout bounds the PING's read too.
		s, err := redisstore.New(srv.Client(t, &redis.Options{ContextTimeoutEnabled: true}), redisstore.Options{Timeout: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		f := follow(t, cp, dataplane.FollowOptions{Store: s, FailurePolicy: fp, ID: fmt.Sprintf("svc-%d", i)})
		f.Authenticator("orders")
		waitFor(t, "revision 1 applied", func() bool { return f.Revision() == 1 })
		urls[fp] = service(t, f)
	}
	ready := func(fp core.FailurePolicy) (int, map[string]any) {
		st, body := get(t, urls[fp]+"/readyz", "")
		var out map[string]any
		if err := json.Unmarshal([]byte(body), &out); err != nil {
			t.Fatalf("/readyz: %v: %s", err, body)
		}
		return st, out
	}
	for fp := range urls {
		if st, out := ready(fp); st != 200 || out["ready"] != true || out["store"] != "ok" || out["error"] != nil {
			t.Fatalf("policy %v, Redis up: %d %v; want 200, ready, store ok, no error", fp, st, out)
		}
	}
	srv.Pause()
	st, out := ready(core.FailClosed)
	if st != 503 || out["ready"] != false || out["store"] != "unreachable" || !strings.HasPrefix(fmt.Sprint(out["error"]), "limit store unreachable: ") {
		srv.Resume()
		t.Fatalf("fail closed, Redis paused: %d %v; want 503, not ready, store unreachable, limit store unreachable: …", st, out)
	}
	st, out = ready(core.FailOpen)
	srv.Resume()
	if st != 200 || out["ready"] != true || out["store"] != "unreachable" || !strings.HasPrefix(fmt.Sprint(out["error"]), "limit store unreachable: ") {
		t.Fatalf("fail open, Redis paused: %d %v; want 200, ready, store unreachable, limit store unreachable: …", st, out)
	}
	for fp := range urls {
		if st, out := ready(fp); st != 200 || out["ready"] != true || out["store"] != "ok" {
			t.Fatalf("policy %v, Redis resumed: %d %v; want 200, ready, store ok", fp, st, out)
		}
	}
	f := follow(t, cp, dataplane.FollowOptions{ID: "svc-mem"})
	waitFor(t, "revision 1 applied", func() bool { return f.Revision() == 1 })
	if r := f.Readiness(context.Background()); !r.Ready || r.Store != "in-process" || r.Error != "" {
		t.Fatalf("memory store: %+v; want ready, in-process", r)
	}
}
