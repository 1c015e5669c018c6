package gateway_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/internal/seams"
	"github.com/limitplane/limitplane/spec"
)

// unsetSecretEnv is an environment variable no test sets.
const unsetSecretEnv = "LP_GATEWAY_TEST_UNSET_SECRET"

// hmacAPI is a jwt API at /<id>/ whose one HS256 key is k.
func hmacAPI(id string, k spec.JWTKey) spec.API {
	return spec.API{ID: id, ListenPath: "/" + id + "/", Target: spec.BuiltinEcho, Auth: spec.AuthJWT,
		JWT: &spec.JWT{Algorithms: []string{"HS256"}, Keys: []spec.JWTKey{k}, DefaultPolicies: []string{"p"}}}
}

// readyz is the gateway admin endpoint's GET /readyz, decoded.
type readyz struct {
	Ready    bool               `json:"ready"`
	Revision uint64             `json:"revision"`
	Degraded bool               `json:"degraded"`
	NotBuilt []gateway.NotBuilt `json:"not_built"`
}

func getReadyz(t *testing.T, gw *gateway.Gateway) (int, readyz) {
	t.Helper()
	srv := httptest.NewServer(gw.AdminHandler(gateway.AdminOptions{ReadsWithoutToken: true}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r readyz
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, r
}

// TestApplyWithoutUnbuildableAPIs applies (ApplyPartial) a valid snapshot
// with two JWT APIs this host cannot build (an unset secret_env, a
// missing secret_file). It succeeds without them: the new policy, key and API
// are in force, each unbuilt API answers 503 naming itself and its
// problem, both are listed by NotBuilt and /readyz (200, degraded), and
// key changes still apply. A later revision without them clears it all.
func TestApplyWithoutUnbuildableAPIs(t *testing.T) {
	up := upstream(t)
	g := newTestGateway(t)
	g.apply(t, basic(1, up.URL, perMinute(3), nil))
	missing := filepath.Join(t.TempDir(), "missing.secret")
	bad := basic(2, up.URL, perMinute(4), nil)
	bad.Keys = append(bad.Keys, spec.Key{KeyHash: keyHash("k2"), Policies: []string{"p"}})
	bad.APIs = append(bad.APIs, hmacAPI("jwt-env", spec.JWTKey{SecretEnv: unsetSecretEnv}), hmacAPI("jwt-file", spec.JWTKey{SecretFile: missing}))
	if err := g.gw.ApplyPartial(context.Background(), bad); err != nil {
		t.Fatalf("ApplyPartial with unbuildable APIs: %v, want it applied without them", err)
	}
	if rev := g.gw.Revision(); rev != 2 {
		t.Fatalf("running revision %d, want 2", rev)
	}
	envProblem := "spec: keys[0].secret_env: environment variable " + unsetSecretEnv + " is not set"
	fileProblem := "spec: keys[0].secret_file: open " + missing + ": no such file or directory"
	want := []gateway.NotBuilt{{API: "jwt-env", Problem: envProblem}, {API: "jwt-file", Problem: fileProblem}}
	if got := g.gw.NotBuilt(); !reflect.DeepEqual(got, want) {
		t.Errorf("NotBuilt() = %+v, want %+v", got, want)
	}
	checkStatuses(t, "revision 2 (4 a minute)", k1Statuses(t, g, 5), []int{200, 200, 200, 200, 429})
	if a := g.mustGet(t, "/api/x", "k2"); a.status != 200 {
		t.Errorf("the new key k2: %d %s", a.status, a.body)
	}
	for _, nb := range want {
		a := g.mustGet(t, "/"+nb.API+"/x", "")
		body := fmt.Sprintf(`{"error":%q}`+"\n", fmt.Sprintf("API %q is not built on this gateway; its operators see why in the gateway's /readyz", nb.API))
		if a.status != 503 || a.body != body {
			t.Errorf("/%s/x: %d %q, want 503 %q", nb.API, a.status, a.body, body)
		}
	}
	if status, r := getReadyz(t, g.gw); status != 200 || !r.Ready || !r.Degraded || r.Revision != 2 || !reflect.DeepEqual(r.NotBuilt, want) {
		t.Errorf("/readyz: %d %+v, want 200, ready, degraded, revision 2, not_built %+v", status, r, want)
	}
	// A key delete (a revocation) applies as ever.
	if err := g.gw.UpdateKeys(context.Background(), 3, nil, []string{keyHash("k2")}); err != nil {
		t.Fatalf("UpdateKeys: %v", err)
	}
	if a := g.mustGet(t, "/api/x", "k2"); a.status != 403 {
		t.Errorf("the deleted key k2: %d %s, want 403", a.status, a.body)
	}

	g.apply(t, basic(4, up.URL, perMinute(4), nil))
	if got := g.gw.NotBuilt(); got != nil {
		t.Errorf("NotBuilt() after a good revision = %+v, want nil", got)
	}
	if status, r := getReadyz(t, g.gw); status != 200 || !r.Ready || r.Degraded || r.NotBuilt != nil || r.Revision != 4 {
		t.Errorf("/readyz after a good revision: %d %+v, want 200, ready, not degraded", status, r)
	}
	if a := g.mustGet(t, "/jwt-env/x", ""); a.status != 404 {
		t.Errorf("/jwt-env/x after it was removed: %d %s, want 404", a.status, a.body)
	}
}

// TestNotBuiltAPIRetried fixes a missing secret_file after Apply: the
// gateway's own retry builds the API without another Apply, a token
// signed with the secret then passes, and OnNotBuilt is told each
// change of the list.
func TestNotBuiltAPIRetried(t *testing.T) {
	clock := core.NewManualClock(int64(time.Hour))
	store := memory.New(memory.Options{Clock: clock})
	t.Cleanup(func() { store.Close() })
	var mu sync.Mutex
	var told [][]gateway.NotBuilt
	gw, err := gateway.New(gateway.Options{Store: store, Seams: &seams.Seams{Clock: clock, Now: func() time.Time { return epoch }},
		RebuildInitial: 5 * time.Millisecond, RebuildMax: 20 * time.Millisecond,
		OnNotBuilt: func(nb []gateway.NotBuilt) {
			mu.Lock()
			told = append(told, nb)
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	srv := gateway.ServeTest(t, gw)
	t.Cleanup(srv.Close)

	secretFile := filepath.Join(t.TempDir(), "hmac.secret")
	snap := basic(1, spec.BuiltinEcho, perMinute(10), nil)
	snap.APIs = append(snap.APIs, hmacAPI("jwt", spec.JWTKey{SecretFile: secretFile}))
	if err := gw.ApplyPartial(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	problem := "spec: keys[0].secret_file: open " + secretFile + ": no such file or directory"
	if got, want := gw.NotBuilt(), []gateway.NotBuilt{{API: "jwt", Problem: problem}}; !reflect.DeepEqual(got, want) {
		t.Fatalf("NotBuilt() = %+v, want %+v", got, want)
	}
	secret := strings.Repeat("s", 32)
	token, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "alice", "exp": epoch.Add(time.Hour).Unix()}).SignedString([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	call := func() int {
		req, _ := http.NewRequest("GET", srv.URL+"/jwt/x", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if status := call(); status != 503 {
		t.Fatalf("before the fix: %d, want 503", status)
	}
	if err := os.WriteFile(secretFile, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for gw.NotBuilt() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("not built 5 s after the fix: %+v", gw.NotBuilt())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if status := call(); status != 200 {
		t.Errorf("after the fix: %d, want 200", status)
	}
	if status, r := getReadyz(t, gw); status != 200 || r.Degraded || r.NotBuilt != nil {
		t.Errorf("/readyz after the fix: %d %+v, want not degraded", status, r)
	}
	mu.Lock()
	defer mu.Unlock()
	want := [][]gateway.NotBuilt{{{API: "jwt", Problem: problem}}, nil}
	if !reflect.DeepEqual(told, want) {
		t.Errorf("OnNotBuilt was told %+v, want %+v", told, want)
	}
}

// TestUnresponsiveJWKSHoldsNothingUp applies (ApplyPartial) a JWT API
// whose JWKS host does not answer: it gives up on it after
// JWKSApplyTimeout and applies the rest, the next ApplyPartial does not wait for it again (the
// background retry goes on), and once the host answers the retry builds
// the API.
func TestUnresponsiveJWKSHoldsNothingUp(t *testing.T) {
	real := jwksServer(t)
	var mu sync.Mutex
	answer, fetches := false, 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		fetches++
		ok := answer
		mu.Unlock()
		if !ok {
			select { // the host does not answer
			case <-r.Context().Done():
			case <-t.Context().Done():
			}
			return
		}
		resp, err := http.Get(real.URL)
		if err != nil {
			w.WriteHeader(502)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", "application/json")
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(srv.Close)
	clock := core.NewManualClock(int64(time.Hour))
	store := memory.New(memory.Options{Clock: clock})
	t.Cleanup(func() { store.Close() })
	gw, err := gateway.New(gateway.Options{Store: store, Seams: &seams.Seams{Clock: clock}, JWKSApplyTimeout: 100 * time.Millisecond,
		RebuildInitial: 50 * time.Millisecond, RebuildMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { gw.Close() })
	snap := func(rev uint64) *spec.Snapshot {
		s := basic(rev, spec.BuiltinEcho, perMinute(10), nil)
		s.APIs = append(s.APIs, spec.API{ID: "idp", ListenPath: "/idp/", Target: spec.BuiltinEcho, Auth: spec.AuthJWT,
			JWT: &spec.JWT{Algorithms: []string{"ES256"}, JWKS: &spec.JWKS{URL: srv.URL}, DefaultPolicies: []string{"p"}}})
		return s
	}
	start := time.Now()
	if err := gw.ApplyPartial(context.Background(), snap(1)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Apply took %v with a JWKS host that does not answer", d)
	}
	if nb := gw.NotBuilt(); len(nb) != 1 || nb[0].API != "idp" {
		t.Fatalf("NotBuilt() = %+v, want idp", nb)
	}
	mu.Lock()
	before := fetches
	mu.Unlock()
	if err := gw.ApplyPartial(context.Background(), snap(2)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	after := fetches
	mu.Unlock()
	if after != before {
		t.Errorf("the second Apply fetched the failing JWKS again (%d fetches, %d before)", after, before)
	}
	if nb := gw.NotBuilt(); len(nb) != 1 || nb[0].API != "idp" {
		t.Fatalf("NotBuilt() after revision 2 = %+v, want idp", nb)
	}
	mu.Lock()
	answer = true
	mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for gw.NotBuilt() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("not built 10 s after the JWKS host answered: %+v", gw.NotBuilt())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if rev := gw.Revision(); rev != 2 {
		t.Errorf("revision %d, want 2", rev)
	}
}

// TestApplyWithoutUnenforceablePolicies applies (ApplyPartial) a snapshot
// with two policies the gateway's in-process store cannot enforce
// (sliding_window, sliding_log). It succeeds without them: a key under
// either answers 503 naming its policy and the problem (and is not
// counted), a key under the good policy is limited as ever, a key naming
// a bad policy for another API only is decided without it, a deleted key
// is refused, NotBuilt and /readyz list both policies; a later revision
// that changes them clears it. Apply refuses the same snapshot whole.
func TestApplyWithoutUnenforceablePolicies(t *testing.T) {
	up := upstream(t)
	g := newTestGateway(t)
	g.apply(t, basic(1, up.URL, perMinute(3), nil))
	bad := basic(2, up.URL, perMinute(4), nil)
	sw, sl := perMinute(5), perMinute(6)
	sw.Algorithm, sl.Algorithm = "sliding_window", "sliding_log"
	bad.Policies = append(bad.Policies,
		spec.Policy{ID: "sw", Rate: sw},
		spec.Policy{ID: "sl", Rate: sl, APIs: []string{"api"}},
		spec.Policy{ID: "sl-other", Rate: sl, APIs: []string{"other"}})
	bad.Keys = append(bad.Keys,
		spec.Key{KeyHash: keyHash("k-sw"), Policies: []string{"sw"}},
		spec.Key{KeyHash: keyHash("k-sl"), Policies: []string{"p", "sl"}},
		spec.Key{KeyHash: keyHash("k-other"), Policies: []string{"sl-other", "p"}},
		spec.Key{KeyHash: keyHash("k-gone"), Policies: []string{"p"}})
	bad.APIs = append(bad.APIs, spec.API{ID: "other", ListenPath: "/other/", Target: up.URL})
	if err := g.gw.Apply(context.Background(), bad); err == nil || !strings.Contains(err.Error(), `policy "sw"`) {
		t.Fatalf("Apply with unenforceable policies: %v, want the policy's error", err)
	}
	if err := g.gw.ApplyPartial(context.Background(), bad); err != nil {
		t.Fatalf("ApplyPartial with unenforceable policies: %v, want it applied without them", err)
	}
	if rev := g.gw.Revision(); rev != 2 {
		t.Fatalf("running revision %d, want 2", rev)
	}
	want := []gateway.NotBuilt{
		{Policy: "sw", Problem: "algorithm not supported by this store: sliding_window"},
		{Policy: "sl", Problem: "algorithm not supported by this store: sliding_log"},
		{Policy: "sl-other", Problem: "algorithm not supported by this store: sliding_log"},
	}
	if got := g.gw.NotBuilt(); !reflect.DeepEqual(got, want) {
		t.Errorf("NotBuilt() = %+v, want %+v", got, want)
	}
	for _, c := range []struct{ key, policy, problem string }{{"k-sw", "sw", want[0].Problem}, {"k-sl", "sl", want[1].Problem}} {
		body := fmt.Sprintf(`{"error":%q}`+"\n", fmt.Sprintf("policy %q is not built on this gateway: %s", c.policy, c.problem))
		for range 2 {
			if a := g.mustGet(t, "/api/x", c.key); a.status != 503 || a.body != body {
				t.Errorf("%s: %d %q, want 503 %q", c.key, a.status, a.body, body)
			}
		}
	}
	checkStatuses(t, "k1 under p (4 a minute)", k1Statuses(t, g, 5), []int{200, 200, 200, 200, 429})
	// k-other's bad policy covers another API only: p decides, and its
	// counter is k-other's own (4 a minute).
	var other []int
	for range 5 {
		other = append(other, g.mustGet(t, "/api/x", "k-other").status)
	}
	checkStatuses(t, "k-other under p", other, []int{200, 200, 200, 200, 429})
	otherBody := fmt.Sprintf(`{"error":%q}`+"\n", fmt.Sprintf("policy %q is not built on this gateway: %s", "sl-other", want[2].Problem))
	if a := g.mustGet(t, "/other/x", "k-other"); a.status != 503 || a.body != otherBody {
		t.Errorf("k-other on /other/: %d %q, want 503 %q", a.status, a.body, otherBody)
	}
	if status, r := getReadyz(t, g.gw); status != 200 || !r.Ready || !r.Degraded || r.Revision != 2 || !reflect.DeepEqual(r.NotBuilt, want) {
		t.Errorf("/readyz: %d %+v, want 200, ready, degraded, revision 2, not_built %+v", status, r, want)
	}
	if err := g.gw.UpdateKeys(context.Background(), 3, []spec.Key{{KeyHash: keyHash("k-new"), Policies: []string{"p"}}}, []string{keyHash("k-gone")}); err != nil {
		t.Fatalf("UpdateKeys: %v", err)
	}
	if a := g.mustGet(t, "/api/x", "k-gone"); a.status != 403 {
		t.Errorf("the deleted key: %d %s, want 403", a.status, a.body)
	}
	if a := g.mustGet(t, "/api/x", "k-new"); a.status != 200 {
		t.Errorf("the new key: %d %s, want 200", a.status, a.body)
	}

	// A later revision makes sw a GCRA policy and drops sl's algorithm:
	// both are built, and k-sw is limited by sw (5 a minute), from zero
	// since the 503s counted nothing.
	good := *bad
	good.Revision = 4
	good.Policies = slices.Clone(bad.Policies)
	good.Policies[1].Rate, good.Policies[2].Rate, good.Policies[3].Rate = perMinute(5), perMinute(6), perMinute(6)
	if err := g.gw.ApplyPartial(context.Background(), &good); err != nil {
		t.Fatalf("ApplyPartial of the fixed revision: %v", err)
	}
	if got := g.gw.NotBuilt(); got != nil {
		t.Errorf("NotBuilt() after a good revision = %+v, want nil", got)
	}
	if status, r := getReadyz(t, g.gw); status != 200 || r.Degraded || r.NotBuilt != nil || r.Revision != 4 {
		t.Errorf("/readyz after a good revision: %d %+v, want 200, not degraded", status, r)
	}
	var sws []int
	for range 6 {
		sws = append(sws, g.mustGet(t, "/api/x", "k-sw").status)
	}
	checkStatuses(t, "k-sw under the fixed sw (5 a minute)", sws, []int{200, 200, 200, 200, 200, 429})
}
