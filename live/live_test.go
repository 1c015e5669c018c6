package live_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/seams"
	"github.com/limitplane/limitplane/live"
	"github.com/limitplane/limitplane/spec"
)

// now is the wall clock of every Config here (Options.Now): key expiry
// and JWT validation are decided against it.
var now = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

// newConfig returns a Config over an in-process store with a frozen
// clock (so counts are exact), closed at the end of the test.
func newConfig(t *testing.T) *live.Config {
	t.Helper()
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	t.Cleanup(func() { store.Close() })
	cfg, err := live.New(live.Options{Store: store, Seams: &seams.Seams{Now: func() time.Time { return now }}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cfg.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return cfg
}

// hash is the snapshot form of a plaintext key.
func hash(raw string) string { return identity.HashKey(raw).String() }

// perMinute is a rate of n requests a minute (GCRA, a burst of n).
func perMinute(n int64) *spec.Rate { return &spec.Rate{Requests: n, Per: spec.Duration(time.Minute)} }

// perHour is a quota of n requests an hour.
func perHour(n int64) *spec.Quota { return &spec.Quota{Max: n, Renewal: spec.Duration(time.Hour)} }

// request is a GET of a service from 192.0.2.1 (httptest's client
// address) with the header fields given as name, value pairs.
func request(hdr ...string) identity.Request {
	r := httptest.NewRequest(http.MethodGet, "http://service.test/orders", nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header.Set(hdr[i], hdr[i+1])
	}
	return nethttp.Request{R: r}
}

// withKey is a request carrying an API key.
func withKey(key string) identity.Request { return request("X-API-Key", key) }

// decide authenticates r through cfg.Authenticator(api) and limits it
// through cfg.Limiter(api), as a service's middleware does, and returns
// the outcome: "200" or "429", or the authentication error's status and
// reason ("403 unknown API key").
func decide(t *testing.T, cfg *live.Config, api string, r identity.Request) string {
	t.Helper()
	c, err := cfg.Authenticator(api).Authenticate(context.Background(), r)
	if err != nil {
		var ie *identity.Error
		if !errors.As(err, &ie) {
			t.Fatalf("Authenticate: %v, not an *identity.Error", err)
		}
		return fmt.Sprintf("%d %s", ie.Status, ie.Reason)
	}
	d, err := cfg.Limiter(api).Decide(context.Background(), c, api, 1)
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	if d.Allowed {
		return "200"
	}
	return "429"
}

// outcomes is decide n times.
func outcomes(t *testing.T, cfg *live.Config, api string, r identity.Request, n int) string {
	t.Helper()
	var out []string
	for range n {
		out = append(out, decide(t, cfg, api, r))
	}
	return strings.Join(out, ", ")
}

// wantNotReady checks that err is the 503 *identity.Error of Kind
// live.ErrNotReady with reason.
func wantNotReady(t *testing.T, what string, err error, reason string) {
	t.Helper()
	var ie *identity.Error
	if !errors.As(err, &ie) {
		t.Fatalf("%s: %v (%T), want an *identity.Error", what, err, err)
	}
	if ie.Status != http.StatusServiceUnavailable || ie.Kind != live.ErrNotReady || ie.Reason != reason || !errors.Is(err, live.ErrNotReady) {
		t.Fatalf("%s: %+v, want {Status: 503, Kind: ErrNotReady, Reason: %q}", what, *ie, reason)
	}
	if err.Error() != "service unavailable: "+reason {
		t.Fatalf("%s: Error() %q", what, err.Error())
	}
}

// unsetEnv makes sure the environment variable name is not set during
// the test (and restores it after).
func unsetEnv(t *testing.T, name string) {
	t.Helper()
	t.Setenv(name, "")
	if err := os.Unsetenv(name); err != nil {
		t.Fatal(err)
	}
}

// jwtSecretEnv holds the HMAC secret of the JWT APIs here.
const jwtSecretEnv = "LP_LIVE_TEST_JWT_SECRET"

// jwtAPI is a service-side JWT API verifying HS256 tokens with the
// secret in the environment variable env, its tokens charged to policy.
func jwtAPI(id, env, policy string) spec.API {
	return spec.API{ID: id, Auth: spec.AuthJWT, JWT: &spec.JWT{
		Algorithms:      []string{"HS256"},
		Keys:            []spec.JWTKey{{SecretEnv: env}},
		DefaultPolicies: []string{policy},
	}}
}

// TestNotReady: Authenticator(api) answers a 503 *identity.Error of Kind
// ErrNotReady, naming why, before the first Apply, for an API the
// configuration lacks, for one ApplyPartial could not build (a secret_env
// that is unset; NotBuilt lists it and its problem; Apply refuses the
// snapshot instead), and for every API while SetUnavailable holds; lifting
// it serves as before, counters kept. Limiter(api) answers the same 503
// before the first Apply and under SetUnavailable.
func TestNotReady(t *testing.T) {
	unsetEnv(t, "LP_LIVE_TEST_UNSET")
	cfg := newConfig(t)
	auth := cfg.Authenticator("orders")
	_, err := auth.Authenticate(context.Background(), withKey("k1"))
	wantNotReady(t, "before Apply", err, "no configuration applied yet")
	_, err = cfg.Limiter("orders").Decide(context.Background(), &core.Consumer{ID: "c", Policies: []string{"p"}}, "orders", 1)
	wantNotReady(t, "Limiter before Apply", err, "no configuration applied yet")
	if cfg.State() != nil || cfg.Snapshot() != nil || cfg.Revision() != 0 || cfg.NotBuilt() != nil {
		t.Fatalf("before Apply: state %v, snapshot %v, revision %d, not built %v", cfg.State(), cfg.Snapshot(), cfg.Revision(), cfg.NotBuilt())
	}

	snap := &spec.Snapshot{
		Revision: 4,
		Policies: []spec.Policy{{ID: "p", Quota: perHour(3)}},
		Keys:     []spec.Key{{KeyHash: hash("k1"), Policies: []string{"p"}}},
		APIs:     []spec.API{{ID: "orders"}, jwtAPI("tokens", "LP_LIVE_TEST_UNSET", "p")},
	}
	err = cfg.Apply(context.Background(), snap)
	if want := `live: API "tokens": spec: keys[0].secret_env: environment variable LP_LIVE_TEST_UNSET is not set`; err == nil || err.Error() != want {
		t.Fatalf("Apply with an unset secret_env: %v, want %s", err, want)
	}
	if cfg.State() != nil {
		t.Fatal("a refused Apply left a state")
	}
	if err := cfg.ApplyPartial(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	want := []live.NotBuilt{{API: "tokens", Problem: "spec: keys[0].secret_env: environment variable LP_LIVE_TEST_UNSET is not set"}}
	if got := cfg.NotBuilt(); !slices.Equal(got, want) {
		t.Fatalf("NotBuilt %+v, want %+v", got, want)
	}
	if a := cfg.State().API("tokens"); a == nil || a.Problem() != want[0].Problem || a.Handler() != nil {
		t.Fatalf("State().API(tokens): %+v", a)
	}
	if _, built := cfg.State().API("tokens").Built(); built {
		t.Fatal("tokens is built")
	}
	_, err = cfg.Authenticator("tokens").Authenticate(context.Background(), request("Authorization", "Bearer x.y.z"))
	wantNotReady(t, "an API not built", err, `API "tokens" is not built on this service; its operators see why in its readiness`)
	_, err = cfg.Authenticator("billing").Authenticate(context.Background(), withKey("k1"))
	wantNotReady(t, "an API not in the configuration", err, `API "billing" is not in the running configuration`)
	if got := decide(t, cfg, "orders", withKey("k1")); got != "200" {
		t.Fatalf("orders beside an API not built: %s", got)
	}

	cfg.SetUnavailable("dataplane: failing closed")
	if got := cfg.Unavailable(); got != "dataplane: failing closed" {
		t.Fatalf("Unavailable %q", got)
	}
	for _, api := range []string{"orders", "tokens", "billing"} {
		_, err := cfg.Authenticator(api).Authenticate(context.Background(), withKey("k1"))
		wantNotReady(t, api+" under SetUnavailable", err, "dataplane: failing closed")
	}
	// Limiter alone (consumers of the caller's own) is held too.
	_, err = cfg.Limiter("orders").Decide(context.Background(), &core.Consumer{ID: "c", Policies: []string{"p"}}, "orders", 1)
	wantNotReady(t, "Limiter under SetUnavailable", err, "dataplane: failing closed")
	cfg.SetUnavailable("")
	if got := cfg.Unavailable(); got != "" {
		t.Fatalf("Unavailable after lifting: %q", got)
	}
	// One of 3 spent before: 2 more.
	if got := outcomes(t, cfg, "orders", withKey("k1"), 3); got != "200, 200, 429" {
		t.Fatalf("orders after lifting: %s", got)
	}
}

// TestEachAuthKind: an API-key API, a JWT API (a real HS256 token) and a
// keyless API, none routed (no listen_path, no target), authenticate
// through Authenticator(api) and are limited through Limiter(api): a rate
// of 3 a minute admits exactly 3 of 5 for each consumer, each API's
// consumers counted apart. Missing and wrong credentials get 401/403.
func TestEachAuthKind(t *testing.T) {
	secret := strings.Repeat("s3cret-", 6)
	t.Setenv(jwtSecretEnv, secret)
	cfg := newConfig(t)
	snap := &spec.Snapshot{
		Revision: 1,
		Policies: []spec.Policy{{ID: "per-min", Rate: perMinute(3)}},
		Keys:     []spec.Key{{KeyHash: hash("k1"), Policies: []string{"per-min"}}, {KeyHash: hash("k2"), Policies: []string{"per-min"}}},
		APIs: []spec.API{
			{ID: "orders"},
			jwtAPI("reports", jwtSecretEnv, "per-min"),
			{ID: "status", Auth: spec.AuthKeyless, Policies: []string{"per-min"}},
		},
	}
	if err := cfg.ApplyPartial(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	if nb := cfg.NotBuilt(); nb != nil {
		t.Fatalf("NotBuilt %+v", nb)
	}
	signWith := func(secret, sub string) string {
		tok, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
			"sub": sub, "iat": now.Add(-time.Minute).Unix(), "exp": now.Add(time.Hour).Unix(),
		}).SignedString([]byte(secret))
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	sign := func(sub string) string { return signWith(secret, sub) }
	for _, c := range []struct {
		api string
		r   identity.Request
		id  string // the consumer's id
	}{
		{"orders", withKey("k1"), identity.HashKey("k1").ConsumerID()},
		{"orders", withKey("k2"), identity.HashKey("k2").ConsumerID()},
		{"reports", request("Authorization", "Bearer "+sign("alice")), `jwt:api="reports":alice`},
		{"reports", request("Authorization", "Bearer "+sign("bob")), `jwt:api="reports":bob`},
		{"status", request(), "ip:192.0.2.1@status"},
	} {
		consumer, err := cfg.Authenticator(c.api).Authenticate(context.Background(), c.r)
		if err != nil {
			t.Fatalf("%s: %v", c.api, err)
		}
		if consumer.ID != c.id || !slices.Equal(consumer.Policies, []string{"per-min"}) {
			t.Fatalf("%s: consumer %+v, want id %q, policies [per-min]", c.api, consumer, c.id)
		}
		var remaining []int64
		var got []string
		for range 5 {
			d, err := cfg.Limiter(c.api).Decide(context.Background(), consumer, c.api, 1)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, fmt.Sprint(d.Allowed))
			remaining = append(remaining, d.Remaining)
			if d.Policy != "per-min" || d.Limit != 3 {
				t.Fatalf("%s: decision %+v, want policy per-min, limit 3", c.api, d)
			}
		}
		if fmt.Sprint(got, remaining) != "[true true true false false] [2 1 0 0 0]" {
			t.Errorf("%s (%s): admitted %v, remaining %v; want exactly 3 of 5", c.api, consumer.ID, got, remaining)
		}
	}
	// JWT consumers are apart from each other and from the keys; a
	// third subject has its own 3.
	if got := outcomes(t, cfg, "reports", request("Authorization", "Bearer "+sign("carol")), 5); got != "200, 200, 200, 429, 429" {
		t.Errorf("carol: %s", got)
	}
	for _, c := range []struct {
		api  string
		r    identity.Request
		want string
	}{
		{"orders", request(), "401 no API key"},
		{"orders", withKey("k9"), "403 unknown API key"},
		{"reports", request(), "401 no token"},
		{"reports", request("Authorization", "Bearer "+signWith("another-"+secret, "alice")), "401 invalid token"},
	} {
		if got := decide(t, cfg, c.api, c.r); got != c.want {
			t.Errorf("%s: %s, want %s", c.api, got, c.want)
		}
	}
	// A key authenticates on the JWT API with nothing: the API decides
	// how its consumers are known.
	if got := decide(t, cfg, "reports", withKey("k1")); got != "401 no token" {
		t.Errorf("an API key on the JWT API: %s", got)
	}
}

// TestUpdateKeysAtOnce: keys deleted by UpdateKeys, made inactive or
// given an expiry already past are refused by the next request (403),
// with no new Apply (the state and engine stay); a key put by it is
// admitted at once; the revision is UpdateKeys's. UpdateKeys before Apply
// is ErrNotApplied, and with a revision not above the running one
// ErrStaleRevision, changing nothing.
func TestUpdateKeysAtOnce(t *testing.T) {
	cfg := newConfig(t)
	ctx := context.Background()
	if err := cfg.UpdateKeys(ctx, 1, nil, nil); !errors.Is(err, live.ErrNotApplied) {
		t.Fatalf("UpdateKeys before Apply: %v, want ErrNotApplied", err)
	}
	snap := &spec.Snapshot{
		Revision: 10,
		Policies: []spec.Policy{{ID: "p", Quota: perHour(5)}},
		APIs:     []spec.API{{ID: "orders"}},
	}
	for _, k := range []string{"deleted", "inactive", "expired", "kept"} {
		snap.Keys = append(snap.Keys, spec.Key{KeyHash: hash(k), Policies: []string{"p"}})
	}
	if err := cfg.Apply(ctx, snap); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"deleted", "inactive", "expired", "kept"} {
		if got := decide(t, cfg, "orders", withKey(k)); got != "200" {
			t.Fatalf("%s before the update: %s", k, got)
		}
	}
	st, engine := cfg.State(), cfg.Engine()
	past := now.Add(-time.Second)
	later := now.Add(time.Hour)
	put := []spec.Key{
		{KeyHash: hash("inactive"), Policies: []string{"p"}, Inactive: true},
		{KeyHash: hash("expired"), Policies: []string{"p"}, Expires: &past},
		{KeyHash: hash("new"), Policies: []string{"p"}, Expires: &later},
	}
	if err := cfg.UpdateKeys(ctx, 10, put, []string{hash("deleted")}); !errors.Is(err, live.ErrStaleRevision) ||
		err.Error() != "live: snapshot revision is older than the running one (10 <= 10)" {
		t.Fatalf("UpdateKeys at the running revision: %v", err)
	}
	if err := cfg.UpdateKeys(ctx, 11, put, []string{hash("deleted")}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ key, want string }{
		{"deleted", "403 unknown API key"},
		{"inactive", "403 unknown API key"},
		{"expired", "403 API key expired"},
		{"kept", "200"},
		{"new", "200"},
	} {
		if got := decide(t, cfg, "orders", withKey(c.key)); got != c.want {
			t.Errorf("%s after the update: %s, want %s", c.key, got, c.want)
		}
	}
	if cfg.State() != st || cfg.Engine() != engine || cfg.Revision() != 11 || st.Revision() != 11 {
		t.Fatalf("after UpdateKeys: state or engine replaced, or revision %d (state %d), want 11", cfg.Revision(), st.Revision())
	}
	if k := cfg.Key(hash("deleted")); k != nil {
		t.Fatalf("Key(deleted) = %+v", k)
	}
	if k := cfg.Key(hash("inactive")); k == nil || !k.Inactive {
		t.Fatalf("Key(inactive) = %+v", k)
	}
	got := cfg.Snapshot()
	var hashes []string
	for _, k := range got.Keys {
		hashes = append(hashes, k.KeyHash)
	}
	if want := []string{hash("inactive"), hash("expired"), hash("kept"), hash("new")}; got.Revision != 11 || !slices.Equal(hashes, want) {
		t.Fatalf("Snapshot: revision %d, keys %v; want 11, %v", got.Revision, hashes, want)
	}
	// Made active again, the key's spent request is still spent: 4 of 5
	// left.
	if err := cfg.UpdateKeys(ctx, 12, []spec.Key{{KeyHash: hash("inactive"), Policies: []string{"p"}}}, nil); err != nil {
		t.Fatal(err)
	}
	if got := outcomes(t, cfg, "orders", withKey("inactive"), 5); got != "200, 200, 200, 200, 429" {
		t.Errorf("inactive made active again: %s", got)
	}
}

// TestApplyKeepsCounters: an Apply that changes a policy (a quota of 5 an
// hour raised to 8) builds a new engine over the same store and keeps
// what consumers have spent (3 of 5 spent leaves 5 of 8); a snapshot of a
// lower revision is refused with ErrStaleRevision and changes nothing.
func TestApplyKeepsCounters(t *testing.T) {
	cfg := newConfig(t)
	ctx := context.Background()
	snap := func(rev uint64, max int64) *spec.Snapshot {
		return &spec.Snapshot{
			Revision: rev,
			Policies: []spec.Policy{{ID: "p", Quota: perHour(max)}},
			Keys:     []spec.Key{{KeyHash: hash("k1"), Policies: []string{"p"}}},
			APIs:     []spec.API{{ID: "orders"}},
		}
	}
	if err := cfg.Apply(ctx, snap(2, 5)); err != nil {
		t.Fatal(err)
	}
	if got := outcomes(t, cfg, "orders", withKey("k1"), 3); got != "200, 200, 200" {
		t.Fatalf("under 5 an hour: %s", got)
	}
	engine := cfg.Engine()
	if err := cfg.Apply(ctx, snap(1, 100)); !errors.Is(err, live.ErrStaleRevision) ||
		err.Error() != "live: snapshot revision is older than the running one (1 < 2)" {
		t.Fatalf("Apply of revision 1 over 2: %v", err)
	}
	if cfg.Revision() != 2 || cfg.Engine() != engine {
		t.Fatal("a stale Apply changed the configuration")
	}
	if err := cfg.Apply(ctx, snap(3, 8)); err != nil {
		t.Fatal(err)
	}
	if cfg.Engine() == engine || cfg.Revision() != 3 {
		t.Fatalf("after the Apply: same engine %v, revision %d", cfg.Engine() == engine, cfg.Revision())
	}
	if got := outcomes(t, cfg, "orders", withKey("k1"), 6); got != "200, 200, 200, 200, 200, 429" {
		t.Fatalf("under 8 an hour, 3 spent: %s, want exactly 5 more", got)
	}
	// Lowered again below what is spent: nothing more.
	if err := cfg.Apply(ctx, snap(4, 6)); err != nil {
		t.Fatal(err)
	}
	if got := outcomes(t, cfg, "orders", withKey("k1"), 1); got != "429" {
		t.Fatalf("under 6 an hour, 8 spent: %s", got)
	}
}

// TestRoutes: State().Routes() holds the APIs with a listen path, longest
// first and in the snapshot's order among equal lengths, without the
// service-side ones (no listen_path, no target); APIs() holds every API
// in the snapshot's order, and API(id) finds each.
func TestRoutes(t *testing.T) {
	cfg := newConfig(t)
	snap := &spec.Snapshot{
		Revision: 1,
		Policies: []spec.Policy{{ID: "p", Quota: perHour(5)}},
		APIs: []spec.API{
			{ID: "svc"},
			{ID: "root", ListenPath: "/", Target: spec.BuiltinEcho},
			{ID: "a", ListenPath: "/a/", Target: spec.BuiltinEcho},
			{ID: "svc2", Auth: spec.AuthKeyless, Policies: []string{"p"}},
			{ID: "ab", ListenPath: "/a/b/", Target: spec.BuiltinEcho},
			{ID: "x", ListenPath: "/x/", Target: spec.BuiltinEcho},
			{ID: "cde", ListenPath: "/c/d/e/", Target: "http://127.0.0.1:1"},
		},
	}
	if err := cfg.Apply(context.Background(), snap); err != nil {
		t.Fatal(err)
	}
	st := cfg.State()
	var routes, prefixes, apis []string
	for _, a := range st.Routes() {
		routes = append(routes, a.ID())
		prefixes = append(prefixes, a.Prefix())
	}
	for _, a := range st.APIs() {
		apis = append(apis, a.ID())
	}
	if got := fmt.Sprintf("%q %q %q", routes, prefixes, apis); got != `["cde" "ab" "a" "x" "root"] ["/c/d/e" "/a/b" "/a" "/x" ""] ["svc" "root" "a" "svc2" "ab" "x" "cde"]` {
		t.Fatalf("routes, prefixes, APIs: %s", got)
	}
	for _, id := range apis {
		if a := st.API(id); a == nil || a.ID() != id || a.Spec().ID != id {
			t.Fatalf("API(%s) = %v", id, a)
		}
		if _, built := st.API(id).Built(); !built || st.API(id).Problem() != "" {
			t.Fatalf("%s is not built: %s", id, st.API(id).Problem())
		}
	}
	if !st.API("svc").Spec().ServiceSide() || st.API("a").Spec().ServiceSide() {
		t.Fatal("ServiceSide is wrong")
	}
	if st.API("nope") != nil {
		t.Fatal("API(nope) is not nil")
	}
	if st.Revision() != 1 || st.Base().Revision != 1 || len(st.Base().APIs) != 7 || st.Base().Keys != nil {
		t.Fatalf("Base: %+v", st.Base())
	}
}

// ExampleConfig enforces a configuration in a plain net/http service:
// the middleware takes Limiter and Authenticator of the API "orders",
// and every request is decided under the configuration running when it
// arrives: 503 before the first Apply, then the key's quota of 2.
func ExampleConfig() {
	store := memory.New(memory.Options{})
	defer store.Close()
	cfg, err := live.New(live.Options{Store: store})
	if err != nil {
		panic(err)
	}
	defer cfg.Close()

	limit := nethttp.Middleware(cfg.Limiter("orders"), cfg.Authenticator("orders"), nethttp.Options{API: "orders"})
	srv := httptest.NewServer(limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "order list\n")
	})))
	defer srv.Close()
	get := func() {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/orders", nil)
		req.Header.Set("X-API-Key", "secret-key")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			fmt.Printf("%d %s", resp.StatusCode, b)
			return
		}
		var answer struct{ Error string }
		json.NewDecoder(resp.Body).Decode(&answer)
		fmt.Printf("%d %s\n", resp.StatusCode, answer.Error)
	}

	get()
	// A data plane's agent (dataplane.Follow) applies what its control
	// plane sends; a service may also apply a snapshot of its own.
	err = cfg.Apply(context.Background(), &spec.Snapshot{
		Policies: []spec.Policy{{ID: "default", Quota: &spec.Quota{Max: 2, Renewal: spec.Duration(time.Hour)}}},
		Keys:     []spec.Key{{KeyHash: identity.HashKey("secret-key").String(), Policies: []string{"default"}}},
		APIs:     []spec.API{{ID: "orders"}}, // enforced by the service itself: no listen_path, no target
	})
	if err != nil {
		panic(err)
	}
	for range 3 {
		get()
	}
	// Output:
	// 503 no configuration applied yet
	// 200 order list
	// 200 order list
	// 429 quota exceeded
}
