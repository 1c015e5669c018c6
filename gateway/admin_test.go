package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/redis/go-redis/v9"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/internal/seams"
	"github.com/limitplane/limitplane/metrics"
	"github.com/limitplane/limitplane/spec"
)

// adminToken is the tests' admin token.
const adminToken = "s3cret-admin-token-for-tests"

// adminSnapshot: key k-admin has policy default (5 a minute), key k-quota
// policy small (a quota of 3 a day), and the keyless API open policy anon
// (4 a minute per client).
func adminSnapshot(t *testing.T, revision uint64) *spec.Snapshot {
	t.Helper()
	var s spec.Snapshot
	err := json.Unmarshal(fmt.Appendf(nil, `{
		"revision": %d,
		"policies": [
			{"id": "default", "rate": {"requests": 5, "per": "1m"}},
			{"id": "small", "quota": {"max": 3, "renewal": "24h"}},
			{"id": "anon", "rate": {"requests": 4, "per": "1m"}}
		],
		"keys": [
			{"key_hash": %q, "policies": ["default"]},
			{"key_hash": %q, "policies": ["small"]}
		],
		"apis": [
			{"id": "echo", "listen_path": "/echo/", "target": "builtin:echo"},
			{"id": "open", "listen_path": "/open/", "target": "builtin:echo", "auth": "keyless", "policies": ["anon"]}
		]
	}`, revision, identity.HashKey("k-admin").String(), identity.HashKey("k-quota").String()), &s)
	if err != nil {
		t.Fatal(err)
	}
	return &s
}

// adminRig is a gateway with its admin endpoint, both served over real
// HTTP on the loopback, a frozen clock and Prometheus metrics.
type adminRig struct {
	gw    *gateway.Gateway
	base  string // the gateway
	admin string // the admin endpoint
	reg   *prometheus.Registry
}

type rigOptions struct {
	store  core.Store
	policy core.FailurePolicy
	admin  gateway.AdminOptions
	apply  *spec.Snapshot // nil: none
}

func newRig(t *testing.T, o rigOptions) *adminRig {
	t.Helper()
	if o.store == nil {
		m := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
		t.Cleanup(func() { m.Close() })
		o.store = m
	}
	reg := prometheus.NewRegistry()
	decisions := metrics.New(metrics.Options{})
	gm := metrics.NewGateway(metrics.Options{})
	reg.MustRegister(decisions, gm, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	gw, err := gateway.New(gateway.Options{
		Store:         o.store,
		FailurePolicy: o.policy,
		Observer:      decisions,
		OnStoreError:  decisions.ObserveStoreError,
		OnApply:       gm.ObserveApply,
		Seams:         &seams.Seams{Now: func() time.Time { return time.Unix(1_700_000_000, 0) }},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	if o.apply != nil {
		if err := gw.Apply(context.Background(), o.apply); err != nil {
			t.Fatal(err)
		}
	}
	if o.admin.Gatherer == nil {
		o.admin.Gatherer = reg
	}
	srv := gateway.ServeTest(t, gw)
	t.Cleanup(srv.Close)
	adm := httptest.NewServer(gw.AdminHandler(o.admin))
	t.Cleanup(adm.Close)
	return &adminRig{gw: gw, base: srv.URL, admin: adm.URL, reg: reg}
}

// call sends method url with the given header fields (name, value
// pairs).
func call(t *testing.T, method, url string, hdr ...string) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Add(hdr[i], hdr[i+1])
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
	return answer{resp.StatusCode, resp.Header, string(b)}
}

// bearer is the Authorization field with the tests' token.
var bearer = []string{"Authorization", "Bearer " + adminToken}

// want checks an answer's status and exact JSON body.
func want(t *testing.T, what string, a answer, status int, body string) {
	t.Helper()
	if a.status != status {
		t.Errorf("%s: status %d, want %d (body %s)", what, a.status, status, a.body)
	}
	if ct := a.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q, want application/json", what, ct)
	}
	if strings.TrimSpace(a.body) != body {
		t.Errorf("%s: body\n%s\nwant\n%s", what, strings.TrimSpace(a.body), body)
	}
}

// statuses sends n requests to url with header fields hdr and returns
// the statuses in order.
func statuses(t *testing.T, n int, url string, hdr ...string) []int {
	t.Helper()
	out := make([]int, n)
	for i := range out {
		out[i] = call(t, http.MethodGet, url, hdr...).status
	}
	return out
}

// scrape fetches /metrics and parses it with the Prometheus text parser.
func scrape(t *testing.T, url string, hdr ...string) map[string]*dto.MetricFamily {
	t.Helper()
	a := call(t, http.MethodGet, url+"/metrics", hdr...)
	if a.status != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", a.status, a.body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mf, err := p.TextToMetricFamilies(strings.NewReader(a.body))
	if err != nil {
		t.Fatalf("parse /metrics: %v\n%s", err, a.body)
	}
	return mf
}

// value returns the value of the series of family name whose labels are
// exactly labels (name, value pairs); it fails the test when there is no
// such series.
func value(t *testing.T, mf map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	f := mf[name]
	if f == nil {
		t.Fatalf("no metric family %s", name)
	}
	for _, m := range f.Metric {
		if len(m.Label)*2 != len(labels) {
			continue
		}
		match := true
		for _, l := range m.Label {
			found := false
			for i := 0; i+1 < len(labels); i += 2 {
				if labels[i] == l.GetName() && labels[i+1] == l.GetValue() {
					found = true
				}
			}
			match = match && found
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Untyped != nil:
			return m.Untyped.GetValue()
		}
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}

// TestAdminMetricsExactCounts: after 5 allowed and 2 denied requests of
// one key, a refused stale snapshot and ten status calls, /metrics
// (parsed with the Prometheus text parser) has exactly those decisions
// (status calls are not decisions), the revision applied, one apply ok and
// one refused, no store error, and the Go and process collectors.
func TestAdminMetricsExactCounts(t *testing.T) {
	rig := newRig(t, rigOptions{apply: adminSnapshot(t, 7), admin: gateway.AdminOptions{Token: adminToken, ReadsWithoutToken: true}})
	if err := rig.gw.Apply(context.Background(), adminSnapshot(t, 3)); !errors.Is(err, gateway.ErrStaleRevision) {
		t.Fatalf("stale Apply: %v", err)
	}
	got := statuses(t, 7, rig.base+"/echo/x", "X-API-Key", "k-admin")
	if fmt.Sprint(got) != "[200 200 200 200 200 429 429]" {
		t.Fatalf("statuses %v", got)
	}
	for range 10 {
		if a := call(t, http.MethodGet, rig.admin+"/consumers/"+identity.HashKey("k-admin").String()+"?api=echo"); a.status != 200 {
			t.Fatalf("status call: %d %s", a.status, a.body)
		}
	}
	mf := scrape(t, rig.admin)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"limitplane_decisions_total", []string{"api", "echo", "policy", "default", "limit", "rate", "result", "allowed"}, 5},
		{"limitplane_decisions_total", []string{"api", "echo", "policy", "default", "limit", "rate", "result", "denied"}, 2},
		{"limitplane_config_revision", nil, 7},
		{"limitplane_config_applies_total", []string{"result", "ok"}, 1},
		{"limitplane_config_applies_total", []string{"result", "refused"}, 1},
		{"limitplane_store_errors_total", nil, 0},
	} {
		if v := value(t, mf, c.name, c.labels...); v != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, v, c.want)
		}
	}
	if n := len(mf["limitplane_decisions_total"].Metric); n != 2 {
		t.Errorf("%d decision series, want 2 (status calls must not be counted)", n)
	}
	for _, name := range []string{"go_goroutines", "process_open_fds"} {
		if mf[name] == nil {
			t.Errorf("no %s: the Go and process collectors are missing", name)
		}
	}
}

// TestAdminStatusDoesNotSpend: ten status calls, by hash and by consumer
// ID, leave the key its whole burst: 5 pass, the 6th is denied; the status
// after that shows 0 remaining.
func TestAdminStatusDoesNotSpend(t *testing.T) {
	rig := newRig(t, rigOptions{apply: adminSnapshot(t, 0), admin: gateway.AdminOptions{ReadsWithoutToken: true}})
	h := identity.HashKey("k-admin")
	full := fmt.Sprintf(`{"consumer":%q,"key_hash":%q,"api":"echo","policies":["default"],"rate":{"limit":5,"remaining":5,"reset_after_ms":0,"window_ms":60000,"policy":"default"},"quota":null}`,
		h.ConsumerID(), h.String())
	for i := range 10 {
		id := h.String()
		if i%2 == 1 {
			id = h.ConsumerID()
		}
		want(t, "status "+id, call(t, http.MethodGet, rig.admin+"/consumers/"+id+"?api=echo"), 200, full)
	}
	if got := statuses(t, 6, rig.base+"/echo/x", "X-API-Key", "k-admin"); fmt.Sprint(got) != "[200 200 200 200 200 429]" {
		t.Fatalf("after 10 status calls: %v, want the full burst of 5 then 429", got)
	}
	want(t, "status when empty", call(t, http.MethodGet, rig.admin+"/consumers/"+h.ConsumerID()), 200,
		fmt.Sprintf(`{"consumer":%q,"key_hash":%q,"policies":["default"],"rate":{"limit":5,"remaining":0,"reset_after_ms":60000,"window_ms":60000,"policy":"default"},"quota":null}`,
			h.ConsumerID(), h.String()))
}

// TestAdminResetQuota: a quota of 3 is spent, the 4th request is denied
// with 429, POST reset-quota answers the fresh state, and the next request
// passes.
func TestAdminResetQuota(t *testing.T) {
	rig := newRig(t, rigOptions{apply: adminSnapshot(t, 0), admin: gateway.AdminOptions{Token: adminToken, ReadsWithoutToken: true}})
	if got := statuses(t, 4, rig.base+"/echo/x", "X-API-Key", "k-quota"); fmt.Sprint(got) != "[200 200 200 429]" {
		t.Fatalf("statuses %v", got)
	}
	h := identity.HashKey("k-quota")
	want(t, "reset", call(t, http.MethodPost, rig.admin+"/consumers/"+h.String()+"/reset-quota", bearer...), 200,
		fmt.Sprintf(`{"consumer":%q,"key_hash":%q,"policies":["small"],"quota_reset":true,"rate":null,"quota":{"limit":3,"remaining":3,"reset_after_ms":86400000,"window_ms":86400000,"policy":"small"}}`,
			h.ConsumerID(), h.String()))
	if got := statuses(t, 4, rig.base+"/echo/x", "X-API-Key", "k-quota"); fmt.Sprint(got) != "[200 200 200 429]" {
		t.Fatalf("after the reset: %v, want a new quota of 3", got)
	}
}

// TestAdminKeyless: a keyless client's state is read by its address with
// the API named; IPv6 addresses are grouped by /64 as the gateway groups
// them, and each keyless API counts apart.
func TestAdminKeyless(t *testing.T) {
	rig := newRig(t, rigOptions{apply: adminSnapshot(t, 0), admin: gateway.AdminOptions{ReadsWithoutToken: true}})
	statuses(t, 3, rig.base+"/open/x")
	want(t, "ip", call(t, http.MethodGet, rig.admin+"/consumers/ip:127.0.0.1?api=open"), 200,
		`{"consumer":"ip:127.0.0.1@open","api":"open","policies":["anon"],"rate":{"limit":4,"remaining":1,"reset_after_ms":45000,"window_ms":60000,"policy":"anon"},"quota":null}`)
	want(t, "ipv6", call(t, http.MethodGet, rig.admin+"/consumers/ip:2001:db8::7?api=open"), 200,
		`{"consumer":"ip:2001:db8::/64@open","api":"open","policies":["anon"],"rate":{"limit":4,"remaining":4,"reset_after_ms":0,"window_ms":60000,"policy":"anon"},"quota":null}`)
	want(t, "ipv6 group", call(t, http.MethodGet, rig.admin+"/consumers/ip:2001:db8::%2F64?api=open"), 200,
		`{"consumer":"ip:2001:db8::/64@open","api":"open","policies":["anon"],"rate":{"limit":4,"remaining":4,"reset_after_ms":0,"window_ms":60000,"policy":"anon"},"quota":null}`)
}

// TestAdminErrors: every error is JSON with the status the handler
// documents.
func TestAdminErrors(t *testing.T) {
	rig := newRig(t, rigOptions{apply: adminSnapshot(t, 0), admin: gateway.AdminOptions{Token: adminToken, ReadsWithoutToken: true}})
	unknown := identity.HashKey("nobody")
	for _, c := range []struct {
		method, path string
		status       int
		body, allow  string
	}{
		{"GET", "/consumers/" + unknown.String() + "?api=echo", 404, `{"error":"unknown consumer \"` + unknown.String() + `\""}`, ""},
		{"GET", "/consumers/" + unknown.ConsumerID(), 404, `{"error":"unknown consumer \"` + unknown.ConsumerID() + `\""}`, ""},
		{"GET", "/consumers/sha256:abc", 400, `{"error":"consumer \"sha256:abc\": want sha256: and 64 hex digits"}`, ""},
		{"GET", "/consumers/key:xyz", 400, `{"error":"consumer \"key:xyz\": want key: and 32 hex digits"}`, ""},
		{"GET", "/consumers/bob", 400, `{"error":"consumer \"bob\": want sha256: and a key hash, key: and 32 hex digits, ip: and an address, or jwt: and a token's consumer claim"}`, ""},
		{"GET", "/consumers/ip:127.0.0.1", 400, `{"error":"api is required for an ip: consumer (the keyless API whose policies apply)"}`, ""},
		{"GET", "/consumers/ip:127.0.0.1?api=echo", 400, `{"error":"API \"echo\" is not keyless: its consumers are not client addresses"}`, ""},
		{"GET", "/consumers/ip:nowhere?api=open", 400, `{"error":"consumer \"ip:nowhere\": want an IP address or a client group prefix"}`, ""},
		{"GET", "/consumers/ip:2001:db8::%2F48?api=open", 400, `{"error":"consumer \"ip:2001:db8::/48\": 2001:db8::/48 is not a client group of this gateway (groups are /32 for IPv4, /64 for IPv6)"}`, ""},
		{"GET", "/consumers/" + unknown.String() + "?api=nope", 400, `{"error":"unknown API \"nope\""}`, ""},
		// Overlong ids and APIs are refused without being echoed back.
		{"GET", "/consumers/ip:" + strings.Repeat("x", 3000), 400, `{"error":"consumer id of 3003 bytes: too long (at most 256)"}`, ""},
		{"GET", "/consumers/" + unknown.String() + "?api=" + strings.Repeat("a", 257), 400, `{"error":"api of 257 bytes: too long (at most 256)"}`, ""},
		{"GET", "/consumers/" + identity.HashKey("k-admin").String() + "?api=open", 400, `{"error":"API \"open\" is keyless: API keys are not its consumers"}`, ""},
		{"POST", "/consumers/" + identity.HashKey("k-admin").String(), 405, `{"error":"method POST is not allowed; use GET"}`, "GET, HEAD"},
		{"GET", "/consumers/" + identity.HashKey("k-admin").String() + "/reset-quota", 405, `{"error":"method GET is not allowed; use POST"}`, "POST"},
		{"DELETE", "/metrics", 405, `{"error":"method DELETE is not allowed; use GET"}`, ""},
		{"GET", "/reload", 405, `{"error":"method GET is not allowed; use POST"}`, "POST"},
		{"POST", "/reload", 501, `{"error":"reload is not available"}`, ""},
		{"GET", "/nothing", 404, `{"error":"no such admin endpoint"}`, ""},
		{"GET", "/healthz", 200, `{"status":"alive"}`, ""},
	} {
		a := call(t, c.method, rig.admin+c.path, bearer...)
		want(t, c.method+" "+c.path, a, c.status, c.body)
		if c.allow != "" && a.header.Get("Allow") != c.allow {
			t.Errorf("%s %s: Allow %q, want %q", c.method, c.path, a.header.Get("Allow"), c.allow)
		}
	}
}

// TestAdminToken: on the loopback, reads pass without the token when
// ReadsWithoutToken is set; state-changing calls need it (401 with
// WWW-Authenticate: Bearer when missing or wrong); without
// ReadsWithoutToken every call needs it; with no token configured,
// calls that need one get 403.
func TestAdminToken(t *testing.T) {
	key := "/consumers/" + identity.HashKey("k-quota").String() + "/reset-quota"
	reload := func(context.Context) error { return nil }
	open := newRig(t, rigOptions{apply: adminSnapshot(t, 0), admin: gateway.AdminOptions{Token: adminToken, ReadsWithoutToken: true, Reload: reload}})
	locked := newRig(t, rigOptions{apply: adminSnapshot(t, 0), admin: gateway.AdminOptions{Token: adminToken, Reload: reload}})
	none := newRig(t, rigOptions{apply: adminSnapshot(t, 0), admin: gateway.AdminOptions{ReadsWithoutToken: true, Reload: reload}})
	missing := `{"error":"missing admin token: send Authorization: Bearer and the token"}`
	wrong := `{"error":"wrong admin token"}`
	for _, c := range []struct {
		rig          *adminRig
		method, path string
		hdr          []string
		status       int
		body, auth   string
	}{
		{open, "GET", "/healthz", nil, 200, `{"status":"alive"}`, ""},
		{open, "GET", "/readyz", nil, 200, `{"ready":true,"revision":0,"store":"in-process","failure_policy":"open"}`, ""},
		{open, "POST", "/reload", nil, 401, missing, `Bearer realm="limitplane-admin"`},
		{open, "POST", "/reload", []string{"Authorization", "Bearer nope"}, 401, wrong, `Bearer realm="limitplane-admin", error="invalid_token"`},
		{open, "POST", "/reload", []string{"Authorization", "Basic " + adminToken}, 401, missing, `Bearer realm="limitplane-admin"`},
		{open, "POST", "/reload", []string{"Authorization", "Bearer " + adminToken + "x"}, 401, wrong, `Bearer realm="limitplane-admin", error="invalid_token"`},
		{open, "POST", key, nil, 401, missing, `Bearer realm="limitplane-admin"`},
		{open, "POST", "/reload", bearer, 200, `{"reloaded":true,"revision":0}`, ""},
		{open, "POST", "/reload", []string{"Authorization", "bearer " + adminToken}, 200, `{"reloaded":true,"revision":0}`, ""},
		{locked, "GET", "/healthz", nil, 401, missing, `Bearer realm="limitplane-admin"`},
		{locked, "GET", "/consumers/" + identity.HashKey("k-quota").String(), []string{"Authorization", "Bearer wrong"}, 401, wrong, `Bearer realm="limitplane-admin", error="invalid_token"`},
		{locked, "GET", "/healthz", bearer, 200, `{"status":"alive"}`, ""},
		{none, "GET", "/healthz", nil, 200, `{"status":"alive"}`, ""},
		{none, "POST", "/reload", bearer, 403, `{"error":"this call needs the admin token, and none is configured"}`, ""},
		{none, "POST", key, nil, 403, `{"error":"this call needs the admin token, and none is configured"}`, ""},
	} {
		a := call(t, c.method, c.rig.admin+c.path, c.hdr...)
		want(t, c.method+" "+c.path, a, c.status, c.body)
		if got := a.header.Get("WWW-Authenticate"); got != c.auth {
			t.Errorf("%s %s: WWW-Authenticate %q, want %q", c.method, c.path, got, c.auth)
		}
	}
	if a := call(t, "GET", locked.admin+"/metrics"); a.status != 401 {
		t.Errorf("GET /metrics without token on a locked endpoint: %d", a.status)
	}
}

// TestAdminReadsNeedTokenOffLoopback: the same handler served on a
// non-loopback address of this host wants the token for reads too, even
// with ReadsWithoutToken.
func TestAdminReadsNeedTokenOffLoopback(t *testing.T) {
	rig := newRig(t, rigOptions{apply: adminSnapshot(t, 0), admin: gateway.AdminOptions{Token: adminToken, ReadsWithoutToken: true}})
	// A request not from an http.Server carries no local address: it
	// is not known to have arrived on the loopback.
	h := rig.gw.AdminHandler(gateway.AdminOptions{Token: adminToken, ReadsWithoutToken: true})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != 401 {
		t.Errorf("GET /healthz with no local address: %d, want 401", rec.Code)
	}
	rec = httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/healthz", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	h.ServeHTTP(rec, req)
	if rec.Code != 200 {
		t.Errorf("GET /healthz with the token: %d, want 200", rec.Code)
	}
}

// TestAdminReload: POST /reload answers 200 with the revision now running
// when Reload applies, and 422 with one problem per line of its error
// when it refuses; apply outcomes are counted either way.
func TestAdminReload(t *testing.T) {
	var rig *adminRig
	next := adminSnapshot(t, 9)
	reload := func(ctx context.Context) error {
		if next == nil {
			return errors.New("gateway.yaml:3:5: policies[0].id: missing\ngateway.yaml:9:1: apis: missing")
		}
		err := rig.gw.Apply(ctx, next)
		next = nil
		return err
	}
	rig = newRig(t, rigOptions{apply: adminSnapshot(t, 2), admin: gateway.AdminOptions{Token: adminToken, Reload: reload}})
	want(t, "reload", call(t, "POST", rig.admin+"/reload", bearer...), 200, `{"reloaded":true,"revision":9}`)
	want(t, "refused reload", call(t, "POST", rig.admin+"/reload", bearer...), 422,
		`{"error":"reload refused; the running configuration stays","problems":["gateway.yaml:3:5: policies[0].id: missing","gateway.yaml:9:1: apis: missing"]}`)
	mf := scrape(t, rig.admin, bearer...)
	if v := value(t, mf, "limitplane_config_revision"); v != 9 {
		t.Errorf("revision %v, want 9", v)
	}
	// Two Applies succeeded; the refusal above never reached Apply, so
	// only the program that read the file can count it.
	if v := value(t, mf, "limitplane_config_applies_total", "result", "ok"); v != 2 {
		t.Errorf("applies ok %v, want 2", v)
	}
}

// TestAdminReadyzMemory: 503 before the first Apply, 200 after.
func TestAdminReadyzMemory(t *testing.T) {
	rig := newRig(t, rigOptions{admin: gateway.AdminOptions{ReadsWithoutToken: true}})
	want(t, "before Apply", call(t, "GET", rig.admin+"/readyz"), 503, `{"ready":false,"revision":0,"failure_policy":"open","error":"no configuration applied yet"}`)
	want(t, "consumer before Apply", call(t, "GET", rig.admin+"/consumers/ip:127.0.0.1?api=open"), 503, `{"error":"no configuration applied yet"}`)
	if err := rig.gw.Apply(context.Background(), adminSnapshot(t, 4)); err != nil {
		t.Fatal(err)
	}
	want(t, "after Apply", call(t, "GET", rig.admin+"/readyz"), 200, `{"ready":true,"revision":4,"store":"in-process","failure_policy":"open"}`)
}

// TestAdminReadyzRedis: on a Redis store, /readyz is 200 while Redis
// answers; when it is down, 503 under failure_policy closed and 200 under
// open (the gateway serves anyway); 200 again once Redis is back. While
// it is down, a status call answers 503 and store errors are counted.
func TestAdminReadyzRedis(t *testing.T) {
	srv := redistest.Start(t)
	newStore := func() core.Store {
		c := srv.Client(t, &redis.Options{MaxRetries: -1})
		s, err := redisstore.New(c, redisstore.Options{Timeout: time.Second, BreakerFailures: -1})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	closed := newRig(t, rigOptions{store: newStore(), policy: core.FailClosed, apply: adminSnapshot(t, 1), admin: gateway.AdminOptions{ReadsWithoutToken: true}})
	open := newRig(t, rigOptions{store: newStore(), policy: core.FailOpen, apply: adminSnapshot(t, 1), admin: gateway.AdminOptions{ReadsWithoutToken: true}})
	want(t, "closed, up", call(t, "GET", closed.admin+"/readyz"), 200, `{"ready":true,"revision":1,"store":"ok","failure_policy":"closed"}`)
	want(t, "open, up", call(t, "GET", open.admin+"/readyz"), 200, `{"ready":true,"revision":1,"store":"ok","failure_policy":"open"}`)

	srv.Kill()
	a := call(t, "GET", closed.admin+"/readyz")
	var r struct {
		Ready bool   `json:"ready"`
		Store string `json:"store"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(a.body), &r); err != nil {
		t.Fatal(err)
	}
	if a.status != 503 || r.Ready || r.Store != "unreachable" || !strings.HasPrefix(r.Error, "redisstore: ping: ") {
		t.Errorf("closed, down: %d %s", a.status, a.body)
	}
	a = call(t, "GET", open.admin+"/readyz")
	if err := json.Unmarshal([]byte(a.body), &r); err != nil {
		t.Fatal(err)
	}
	if a.status != 200 || !r.Ready || r.Store != "unreachable" {
		t.Errorf("open, down: %d %s", a.status, a.body)
	}
	a = call(t, "GET", open.admin+"/consumers/"+identity.HashKey("k-admin").String()+"?api=echo")
	if a.status != 503 || !strings.HasPrefix(a.body, `{"error":"limit store unavailable: `) {
		t.Errorf("status call with Redis down: %d %s", a.status, a.body)
	}
	if got := statuses(t, 2, open.base+"/echo/x", "X-API-Key", "k-admin"); fmt.Sprint(got) != "[200 200]" {
		t.Errorf("failure_policy open with Redis down: %v", got)
	}
	// The status call and the two requests: three store errors.
	if v := value(t, scrape(t, open.admin), "limitplane_store_errors_total"); v != 3 {
		t.Errorf("store errors %v, want 3", v)
	}

	srv.Restart(t)
	want(t, "closed, back", call(t, "GET", closed.admin+"/readyz"), 200, `{"ready":true,"revision":1,"store":"ok","failure_policy":"closed"}`)
}

// TestAdminEndpointQuotas: a key's quota at an endpoint (3 a day at GET
// /reports of the echo API, apart from the API's own) is reset by POST
// reset-quota with the API named, as README says, and GET shows it
// under "endpoints".
func TestAdminEndpointQuotas(t *testing.T) {
	snap := adminSnapshot(t, 0)
	snap.Policies = append(snap.Policies, spec.Policy{ID: "reports", Quota: &spec.Quota{Max: 3, Renewal: spec.Duration(24 * time.Hour)}})
	snap.APIs[0].Endpoints = []spec.Endpoint{{Method: "GET", Path: "/reports", Policies: []string{"reports"}}}
	rig := newRig(t, rigOptions{apply: snap, admin: gateway.AdminOptions{Token: adminToken, ReadsWithoutToken: true}})
	if got := statuses(t, 4, rig.base+"/echo/reports", "X-API-Key", "k-admin"); fmt.Sprint(got) != "[200 200 200 429]" {
		t.Fatalf("statuses %v, want 3 of the endpoint's quota then 429", got)
	}
	h := identity.HashKey("k-admin")
	want(t, "state", call(t, http.MethodGet, rig.admin+"/consumers/"+h.String()+"?api=echo"), 200,
		fmt.Sprintf(`{"consumer":%q,"key_hash":%q,"api":"echo","policies":["default"],"rate":{"limit":5,"remaining":2,"reset_after_ms":36000,"window_ms":60000,"policy":"default"},"quota":null,"endpoints":[{"method":"GET","path":"/reports","rate":null,"quota":{"limit":3,"remaining":0,"reset_after_ms":86400000,"window_ms":86400000,"policy":"reports"}}]}`,
			h.ConsumerID(), h.String()))
	call(t, http.MethodPost, rig.admin+"/consumers/"+h.String()+"/reset-quota?api=echo", bearer...)
	if got := statuses(t, 1, rig.base+"/echo/reports", "X-API-Key", "k-admin"); fmt.Sprint(got) != "[200]" {
		t.Fatalf("after the reset: %v, want the endpoint's quota back", got)
	}
}

// TestAdminJWT: a jwt API's consumer is read and reset by its consumer
// claim (jwt:<value>), its counters named as the API names them (per API,
// or per issuer; a value beyond printable ASCII hashed), with the API's
// default policies, or on an API that reads policies from a claim, the
// ones the call names.
func TestAdminJWT(t *testing.T) {
	secret := "0123456789abcdef0123456789abcdef"
	var snap spec.Snapshot
	if err := json.Unmarshal([]byte(`{
		"policies": [
			{"id": "small", "quota": {"max": 3, "renewal": "24h"}},
			{"id": "gold", "quota": {"max": 5, "renewal": "24h"}}
		],
		"apis": [
			{"id": "echo", "listen_path": "/echo/", "target": "builtin:echo"},
			{"id": "j", "listen_path": "/j/", "target": "builtin:echo", "auth": "jwt",
			 "jwt": {"algorithms": ["HS256"], "keys": [{"secret": "`+secret+`"}], "default_policies": ["small"]}},
			{"id": "jc", "listen_path": "/jc/", "target": "builtin:echo", "auth": "jwt",
			 "jwt": {"algorithms": ["HS256"], "keys": [{"secret": "`+secret+`"}], "issuer": "https://issuer.example", "policy_claim": "plan"}}
		]
	}`), &snap); err != nil {
		t.Fatal(err)
	}
	rig := newRig(t, rigOptions{apply: &snap, admin: gateway.AdminOptions{Token: adminToken, ReadsWithoutToken: true}})
	token := func(claims jwt.MapClaims) []string {
		claims["exp"] = 1_700_003_600 // an hour after the rig's frozen clock
		s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(secret))
		if err != nil {
			t.Fatal(err)
		}
		return []string{"Authorization", "Bearer " + s}
	}
	alice := token(jwt.MapClaims{"sub": "alice"})
	if got := statuses(t, 4, rig.base+"/j/x", alice...); fmt.Sprint(got) != "[200 200 200 429]" {
		t.Fatalf("alice: %v", got)
	}
	quota := func(remaining int64) string {
		return fmt.Sprintf(`"rate":null,"quota":{"limit":3,"remaining":%d,"reset_after_ms":86400000,"window_ms":86400000,"policy":"small"}`, remaining)
	}
	want(t, "alice", call(t, http.MethodGet, rig.admin+"/consumers/jwt:alice?api=j"), 200,
		`{"consumer":"jwt:api=\"j\":alice","api":"j","policies":["small"],`+quota(0)+`}`)
	want(t, "bob", call(t, http.MethodGet, rig.admin+"/consumers/jwt:bob?api=j"), 200,
		`{"consumer":"jwt:api=\"j\":bob","api":"j","policies":["small"],`+quota(3)+`}`)
	want(t, "alice reset", call(t, http.MethodPost, rig.admin+"/consumers/jwt:alice/reset-quota?api=j", bearer...), 200,
		`{"consumer":"jwt:api=\"j\":alice","api":"j","policies":["small"],"quota_reset":true,`+quota(3)+`}`)
	if got := statuses(t, 4, rig.base+"/j/x", alice...); fmt.Sprint(got) != "[200 200 200 429]" {
		t.Fatalf("alice after the reset: %v, want a new quota of 3", got)
	}
	// A subject beyond printable ASCII: its counters are under its hash.
	if got := statuses(t, 1, rig.base+"/j/x", token(jwt.MapClaims{"sub": "Zoë"})...); fmt.Sprint(got) != "[200]" {
		t.Fatalf("Zoë: %v", got)
	}
	want(t, "Zoë", call(t, http.MethodGet, rig.admin+"/consumers/jwt:Zo%C3%AB?api=j"), 200,
		`{"consumer":"`+strings.ReplaceAll(identity.JWTConsumerID(`jwt:api="j":`, "Zoë"), `"`, `\"`)+`","api":"j","policies":["small"],`+quota(2)+`}`)
	// Policies from a claim: the call names them.
	if got := statuses(t, 2, rig.base+"/jc/x", token(jwt.MapClaims{"sub": "alice", "plan": "gold", "iss": "https://issuer.example"})...); fmt.Sprint(got) != "[200 200]" {
		t.Fatalf("alice on jc: %v", got)
	}
	want(t, "alice on jc", call(t, http.MethodGet, rig.admin+"/consumers/jwt:alice?api=jc&policies=gold"), 200,
		`{"consumer":"jwt:iss=\"https://issuer.example\":alice","api":"jc","policies":["gold"],"rate":null,"quota":{"limit":5,"remaining":3,"reset_after_ms":86400000,"window_ms":86400000,"policy":"gold"}}`)
	for _, c := range []struct{ path, body string }{
		{"/consumers/jwt:alice", `{"error":"api is required for a jwt: consumer (the jwt API whose tokens name it)"}`},
		{"/consumers/jwt:alice?api=echo", `{"error":"API \"echo\" is not a jwt API: its consumers are not token subjects"}`},
		{"/consumers/jwt:alice?api=jc", `{"error":"API \"jc\" reads each token's policies from its \"plan\" claim: name them with policies=ID,ID"}`},
		{"/consumers/jwt:alice?api=jc&policies=nope", `{"error":"policies: no policy \"nope\""}`},
		{"/consumers/jwt:alice?api=jc&policies=gold,,small", `{"error":"policies: want policy IDs separated by commas"}`},
		{"/consumers/jwt:alice?api=jc&policies=gold&policies=small", `{"error":"policies is given more than once"}`},
		{"/consumers/ip:127.0.0.1?api=j&policies=gold", `{"error":"policies applies only to a jwt: consumer (others' policies are known)"}`},
	} {
		want(t, c.path, call(t, http.MethodGet, rig.admin+c.path), 400, c.body)
	}
	// A refused call resets nothing.
	want(t, "reset refused", call(t, http.MethodPost, rig.admin+"/consumers/jwt:alice/reset-quota?api=jc&policies=nope", bearer...), 400, `{"error":"policies: no policy \"nope\""}`)
	want(t, "alice on jc after", call(t, http.MethodGet, rig.admin+"/consumers/jwt:alice?api=jc&policies=gold"), 200,
		`{"consumer":"jwt:iss=\"https://issuer.example\":alice","api":"jc","policies":["gold"],"rate":null,"quota":{"limit":5,"remaining":3,"reset_after_ms":86400000,"window_ms":86400000,"policy":"gold"}}`)
}
