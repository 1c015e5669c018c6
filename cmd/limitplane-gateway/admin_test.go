package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/redistest"
)

// testAdminToken is the admin token the tests' files name.
const testAdminToken = "admin-token-0123456789"

var adminRE = regexp.MustCompile(`admin endpoint at (http://\S+) `)

// adminURL returns where r's admin endpoint listens, from its banner.
func adminURL(t *testing.T, r *running) string {
	t.Helper()
	m := adminRE.FindStringSubmatch(r.stdout.String())
	if m == nil {
		t.Fatalf("no admin line in the banner:\n%s", r.stdout)
	}
	return m[1]
}

// adminConfig is a file with the admin endpoint on a free loopback port,
// its token in a file beside it, one key k-ops (5 a minute, burst 5, and a
// quota of 3 a day for k-quota) on the echo API. head goes first (store,
// failure_policy).
func adminConfig(t *testing.T, head string) string {
	t.Helper()
	p := writeConfig(t, head+`
admin:
  listen: 127.0.0.1:0
  token_file: admin.token
policies:
  - id: default
    rate: {requests: 5, per: 1m}
  - id: small
    quota: {max: 3, renewal: 24h}
keys:
  - {key: k-ops, policies: [default]}
  - {key: k-quota, policies: [small]}
apis:
  - {id: echo, listen_path: /echo/, target: "builtin:echo"}
`)
	if err := os.WriteFile(filepath.Join(filepath.Dir(p), "admin.token"), []byte(testAdminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// send sends method url with header fields hdr (name, value pairs).
func send(t *testing.T, method, url string, hdr ...string) reply {
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
	return reply{resp.StatusCode, resp.Header, string(b)}
}

var withToken = []string{"Authorization", "Bearer " + testAdminToken}

// codes sends n GETs to url with hdr and returns the statuses.
func codes(t *testing.T, n int, url string, hdr ...string) string {
	t.Helper()
	out := make([]int, n)
	for i := range out {
		out[i] = get(t, nil, url, hdr...).status
	}
	return fmt.Sprint(out)
}

// metricValues fetches admin's /metrics and parses it with the Prometheus
// text parser.
func metricValues(t *testing.T, admin string) map[string]*dto.MetricFamily {
	t.Helper()
	r := send(t, "GET", admin+"/metrics")
	if r.status != 200 {
		t.Fatalf("GET /metrics: %d %s", r.status, r.body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mf, err := p.TextToMetricFamilies(strings.NewReader(r.body))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return mf
}

// series returns the value of family name's series with exactly labels.
func series(t *testing.T, mf map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	f := mf[name]
	if f == nil {
		t.Fatalf("no metric family %s", name)
	}
	want := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
next:
	for _, m := range f.Metric {
		if len(m.Label) != len(want) {
			continue
		}
		for _, l := range m.Label {
			if want[l.GetName()] != l.GetValue() {
				continue next
			}
		}
		if m.Counter != nil {
			return m.Counter.GetValue()
		}
		return m.Gauge.GetValue()
	}
	t.Fatalf("no series %s%v", name, labels)
	return 0
}

// TestAdminEndpoint runs the program with an admin section: the banner
// names the endpoint; /metrics has exactly 5 allowed and 2 denied
// decisions, revision 0, one applied configuration and the memory store's
// one key; ten status calls
// leave a fresh key its whole burst; POST /reload needs the token, refuses
// a broken file with its problems (422, counted as refused) and applies a
// good one; a quota reset lets the next request through.
func TestAdminEndpoint(t *testing.T) {
	file := adminConfig(t, "")
	gw := start(t, frozen(), "-config", file)
	admin := adminURL(t, gw)
	if !strings.Contains(gw.stdout.String(), "(/metrics, /healthz, /readyz, /consumers/{id}, /reload; token required for changes)\n") {
		t.Errorf("banner:\n%s", gw.stdout)
	}

	if got := codes(t, 7, gw.base+"/echo/x", "X-API-Key", "k-ops"); got != "[200 200 200 200 200 429 429]" {
		t.Fatalf("k-ops: %s", got)
	}
	mf := metricValues(t, admin)
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"limitplane_decisions_total", []string{"api", "echo", "policy", "default", "limit", "rate", "result", "allowed"}, 5},
		{"limitplane_decisions_total", []string{"api", "echo", "policy", "default", "limit", "rate", "result", "denied"}, 2},
		{"limitplane_config_revision", nil, 0},
		{"limitplane_config_applies_total", []string{"result", "ok"}, 1},
		{"limitplane_config_applies_total", []string{"result", "refused"}, 0},
		{"limitplane_store_errors_total", nil, 0},
		// The memory store's keys (a trial found them missing): k-ops's
		// one counter; no memory.max_keys, so no cap and no refusal.
		{"limitplane_keys", nil, 1},
		{"limitplane_keys_max", nil, 0},
		{"limitplane_keys_refused_total", nil, 0},
	} {
		if v := series(t, mf, c.name, c.labels...); v != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, v, c.want)
		}
	}
	if mf["go_goroutines"] == nil || mf["process_cpu_seconds_total"] == nil {
		t.Error("the Go runtime and process collectors are missing")
	}

	// Status calls spend nothing.
	h := identity.HashKey("k-quota")
	for range 10 {
		if r := send(t, "GET", admin+"/consumers/"+h.ConsumerID()); r.status != 200 {
			t.Fatalf("status: %d %s", r.status, r.body)
		}
	}
	if got := codes(t, 4, gw.base+"/echo/x", "X-API-Key", "k-quota"); got != "[200 200 200 429]" {
		t.Fatalf("k-quota after 10 status calls: %s, want its whole quota of 3", got)
	}
	// Quota exhausted → 429; reset → the next request passes.
	if r := send(t, "POST", admin+"/consumers/"+h.String()+"/reset-quota"); r.status != 401 || r.header.Get("WWW-Authenticate") != `Bearer realm="limitplane-admin"` {
		t.Errorf("reset without token: %d %v %s", r.status, r.header, r.body)
	}
	if got := codes(t, 1, gw.base+"/echo/x", "X-API-Key", "k-quota"); got != "[429]" {
		t.Fatalf("k-quota before the reset: %s", got)
	}
	r := send(t, "POST", admin+"/consumers/"+h.String()+"/reset-quota", withToken...)
	if want := fmt.Sprintf(`{"consumer":%q,"key_hash":%q,"policies":["small"],"quota_reset":true,"rate":null,"quota":{"limit":3,"remaining":3,"reset_after_ms":86400000,"window_ms":86400000,"policy":"small"}}`, h.ConsumerID(), h.String()); r.status != 200 || strings.TrimSpace(r.body) != want {
		t.Errorf("reset: %d %s\nwant 200 %s", r.status, r.body, want)
	}
	if got := codes(t, 1, gw.base+"/echo/x", "X-API-Key", "k-quota"); got != "[200]" {
		t.Fatalf("k-quota after the reset: %s", got)
	}

	// Reload: the token is required; a broken file is refused with its
	// problems; a good one applies.
	if r := send(t, "POST", admin+"/reload"); r.status != 401 {
		t.Errorf("reload without token: %d %s", r.status, r.body)
	}
	good, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	broken := strings.Replace(string(good), "per: 1m", "per: 1 minute", 1)
	if err := os.WriteFile(file, []byte(broken), 0o600); err != nil {
		t.Fatal(err)
	}
	r = send(t, "POST", admin+"/reload", withToken...)
	var refused struct {
		Error    string   `json:"error"`
		Problems []string `json:"problems"`
	}
	if err := json.Unmarshal([]byte(r.body), &refused); err != nil {
		t.Fatalf("reload answer %q: %v", r.body, err)
	}
	wantProblem := file + `:7:30: policies[0].rate.per: "1 minute" is not a duration (like 500ms, 10s, 1m or 24h)`
	if r.status != 422 || refused.Error != "reload refused; the running configuration stays" || fmt.Sprint(refused.Problems) != "["+wantProblem+"]" {
		t.Errorf("broken reload: %d %s\nwant 422 with %s", r.status, r.body, wantProblem)
	}
	if err := os.WriteFile(file, []byte(strings.Replace(string(good), "requests: 5", "requests: 9", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := send(t, "POST", admin+"/reload", withToken...); r.status != 200 || strings.TrimSpace(r.body) != `{"reloaded":true,"revision":0}` {
		t.Errorf("good reload: %d %s", r.status, r.body)
	}
	// The new policy runs: 9 a minute, of whose burst of 9 the 5 requests
	// k-ops made in the frozen minute are spent (a limit change keeps the
	// units spent, not the time: 4 left, full again after 5 of the new
	// emission intervals, 5 × 6.667 s).
	k := identity.HashKey("k-ops")
	r = send(t, "GET", admin+"/consumers/"+k.String())
	if want := fmt.Sprintf(`{"consumer":%q,"key_hash":%q,"policies":["default"],"rate":{"limit":9,"remaining":4,"reset_after_ms":33334,"window_ms":60000,"policy":"default"},"quota":null}`, k.ConsumerID(), k.String()); r.status != 200 || strings.TrimSpace(r.body) != want {
		t.Errorf("k-ops after the reload: %d %s\nwant %s", r.status, r.body, want)
	}
	mf = metricValues(t, admin)
	if ok, no := series(t, mf, "limitplane_config_applies_total", "result", "ok"), series(t, mf, "limitplane_config_applies_total", "result", "refused"); ok != 2 || no != 1 {
		t.Errorf("applies ok %v refused %v, want 2 and 1", ok, no)
	}
}

// TestAdminPublicNeedsToken: an admin endpoint on every interface is
// refused without a token (at its line and column); with one, even reads
// need it there.
func TestAdminPublicNeedsToken(t *testing.T) {
	file := writeConfig(t, "admin: {listen: \"0.0.0.0:0\"}\n"+"apis:\n  - {id: open, listen_path: /open/, target: \"builtin:echo\", auth: keyless, policies: [p]}\npolicies:\n  - {id: p, rate: {requests: 1, per: 1s}}\n")
	err := run(t.Context(), []string{"-listen", "127.0.0.1:0", "-config", file}, env{stdout: newOutput(), stderr: newOutput()})
	want := "invalid configuration, not starting:\n" + file + `:1:17: admin.listen: "0.0.0.0:0" is not a loopback address: set admin.token_env or admin.token_file, since every call there needs the token`
	if err == nil || err.Error() != want {
		t.Fatalf("run: %v\nwant %s", err, want)
	}

	t.Setenv("LP_TEST_ADMIN_TOKEN", testAdminToken)
	file = writeConfig(t, "admin: {listen: \"0.0.0.0:0\", token_env: LP_TEST_ADMIN_TOKEN}\n"+"apis:\n  - {id: open, listen_path: /open/, target: \"builtin:echo\", auth: keyless, policies: [p]}\npolicies:\n  - {id: p, rate: {requests: 1, per: 1s}}\n")
	gw := start(t, frozen(), "-config", file)
	if !strings.Contains(gw.stdout.String(), "; token required)\n") {
		t.Errorf("banner:\n%s", gw.stdout)
	}
	admin := adminURL(t, gw)
	for _, path := range []string{"/metrics", "/healthz", "/readyz", "/consumers/ip:127.0.0.1?api=open"} {
		if r := send(t, "GET", admin+path); r.status != 401 || r.header.Get("WWW-Authenticate") == "" {
			t.Errorf("GET %s without token: %d %s", path, r.status, r.body)
		}
		if r := send(t, "GET", admin+path, withToken...); r.status != 200 {
			t.Errorf("GET %s with token: %d %s", path, r.status, r.body)
		}
	}
}

// TestAdminRedisResetAcrossGateways: two gateways share a Redis started
// for the test; a key's quota of 3 is spent through both, a quota reset
// through the first gateway's admin endpoint lets the next request
// through the second.
func TestAdminRedisResetAcrossGateways(t *testing.T) {
	srv := redistest.Start(t)
	file := adminConfig(t, "store: redis://"+srv.Addr+"/0\n")
	gw1, gw2 := start(t, env{}, "-config", file), start(t, env{}, "-config", file)
	a1, a2 := adminURL(t, gw1), adminURL(t, gw2)
	got := []int{
		get(t, nil, gw1.base+"/echo/x", "X-API-Key", "k-quota").status,
		get(t, nil, gw2.base+"/echo/x", "X-API-Key", "k-quota").status,
		get(t, nil, gw1.base+"/echo/x", "X-API-Key", "k-quota").status,
		get(t, nil, gw2.base+"/echo/x", "X-API-Key", "k-quota").status,
	}
	if fmt.Sprint(got) != "[200 200 200 429]" {
		t.Fatalf("shared quota of 3: %v", got)
	}
	h := identity.HashKey("k-quota")
	// The second gateway sees the quota the first spent.
	r := send(t, "GET", a2+"/consumers/"+h.String())
	var st struct {
		Quota struct {
			Limit     int64 `json:"limit"`
			Remaining int64 `json:"remaining"`
		} `json:"quota"`
	}
	if err := json.Unmarshal([]byte(r.body), &st); err != nil || r.status != 200 || st.Quota.Limit != 3 || st.Quota.Remaining != 0 {
		t.Fatalf("status through gateway 2: %d %s", r.status, r.body)
	}
	if r := send(t, "POST", a1+"/consumers/"+h.ConsumerID()+"/reset-quota", withToken...); r.status != 200 {
		t.Fatalf("reset through gateway 1: %d %s", r.status, r.body)
	}
	if got := codes(t, 1, gw2.base+"/echo/x", "X-API-Key", "k-quota"); got != "[200]" {
		t.Fatalf("through gateway 2 after the reset on gateway 1: %s", got)
	}
}

// TestAdminReadyzRedis: with failure_policy closed, /readyz is 200 while
// Redis answers, 503 while it is down, and 200 once it is back; with
// failure_policy open it stays 200, the store marked unreachable.
func TestAdminReadyzRedis(t *testing.T) {
	srv := redistest.Start(t)
	closed := start(t, env{}, "-config", adminConfig(t, "store: redis://"+srv.Addr+"/0\nfailure_policy: closed\nredis: {timeout: 1s}\n"))
	open := start(t, env{}, "-config", adminConfig(t, "store: redis://"+srv.Addr+"/0\nfailure_policy: open\nredis: {timeout: 1s}\n"))
	ac, ao := adminURL(t, closed), adminURL(t, open)
	if r := send(t, "GET", ac+"/readyz"); r.status != 200 || strings.TrimSpace(r.body) != `{"ready":true,"revision":0,"store":"ok","failure_policy":"closed"}` {
		t.Fatalf("closed, Redis up: %d %s", r.status, r.body)
	}
	srv.Kill()
	var body struct {
		Ready bool   `json:"ready"`
		Store string `json:"store"`
	}
	r := send(t, "GET", ac+"/readyz")
	if err := json.Unmarshal([]byte(r.body), &body); err != nil || r.status != 503 || body.Ready || body.Store != "unreachable" {
		t.Errorf("closed, Redis down: %d %s", r.status, r.body)
	}
	r = send(t, "GET", ao+"/readyz")
	if err := json.Unmarshal([]byte(r.body), &body); err != nil || r.status != 200 || !body.Ready || body.Store != "unreachable" {
		t.Errorf("open, Redis down: %d %s", r.status, r.body)
	}
	srv.Restart(t)
	if r := send(t, "GET", ac+"/readyz"); r.status != 200 || strings.TrimSpace(r.body) != `{"ready":true,"revision":0,"store":"ok","failure_policy":"closed"}` {
		t.Errorf("closed, Redis back: %d %s", r.status, r.body)
	}
}
