package gateway_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"time"
	"weak"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/dataplane/protocol"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/internal/seams"
	"github.com/limitplane/limitplane/spec"
)

// basic is a snapshot with one policy, one key ("k1") and one API at
// /api/ to target.
func basic(rev uint64, target string, rate *spec.Rate, quota *spec.Quota) *spec.Snapshot {
	return &spec.Snapshot{
		Revision: rev,
		Policies: []spec.Policy{{ID: "p", Rate: rate, Quota: quota}},
		Keys:     []spec.Key{{KeyHash: keyHash("k1"), Policies: []string{"p"}}},
		APIs:     []spec.API{{ID: "api", ListenPath: "/api/", Target: target}},
	}
}

func perMinute(n int64) *spec.Rate { return &spec.Rate{Requests: n, Per: spec.Duration(time.Minute)} }

// k1Statuses sends n requests with key k1 to /api/x and returns their
// statuses.
func k1Statuses(t *testing.T, g *testGateway, n int) []int {
	t.Helper()
	var s []int
	for range n {
		s = append(s, g.mustGet(t, "/api/x", "k1").status)
	}
	return s
}

func repeat(status, n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = status
	}
	return s
}

func checkStatuses(t *testing.T, what string, got, want []int) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s: statuses %v, want %v", what, got, want)
	}
}

// TestNotAppliedAnswers503 checks a gateway before its first Apply: every
// request gets 503 with a JSON body, and it has no snapshot or engine.
func TestNotAppliedAnswers503(t *testing.T) {
	g := newTestGateway(t)
	for _, path := range []string{"/", "/api/x"} {
		a := g.mustGet(t, path, "k1")
		if a.status != 503 || a.body != `{"error":"no configuration applied yet"}`+"\n" ||
			a.header.Get("Content-Type") != "application/json" || a.header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s before Apply: %d %v %q", path, a.status, a.header, a.body)
		}
	}
	if g.gw.Snapshot() != nil || g.gw.Engine() != nil {
		t.Error("Snapshot or Engine is not nil before Apply")
	}
}

// TestApplyRefusesInvalidSnapshot applies a snapshot with two problems
// over a running one: Apply returns both as spec.Errors, with their paths,
// and the running snapshot keeps serving with its counters.
func TestApplyRefusesInvalidSnapshot(t *testing.T) {
	up := upstream(t)
	g := newTestGateway(t)
	good := basic(1, up.URL, perMinute(3), nil)
	g.apply(t, good)
	checkStatuses(t, "before", k1Statuses(t, g, 1), []int{200})

	bad := basic(2, up.URL, perMinute(100), nil)
	bad.Keys[0].Policies = []string{"gold"}
	bad.APIs = append(bad.APIs, spec.API{ID: "api", ListenPath: "/other/", Target: spec.BuiltinEcho})
	err := g.gw.Apply(context.Background(), bad)
	var errs spec.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Apply(invalid) = %v, want spec.Errors", err)
	}
	var paths []string
	for _, e := range errs {
		paths = append(paths, e.Path)
	}
	if want := "[apis[1].id keys[0].policies[0]]"; fmt.Sprint(paths) != want {
		t.Errorf("problems at %v, want %s\n%v", paths, want, err)
	}
	if g.gw.Snapshot() != good {
		t.Error("the running snapshot changed")
	}
	// Still 3 a minute, one already spent.
	checkStatuses(t, "after", k1Statuses(t, g, 3), []int{200, 200, 429})
	if a := g.mustGet(t, "/other/x", "k1"); a.status != 404 {
		t.Errorf("/other/ of the refused snapshot: %d, want 404", a.status)
	}
}

// TestApplyRefusesUnbuildableSnapshot applies a valid snapshot whose JWT
// secret cannot be resolved: Apply fails naming the API, and the running
// snapshot stays.
func TestApplyRefusesUnbuildableSnapshot(t *testing.T) {
	up := upstream(t)
	g := newTestGateway(t)
	good := basic(1, up.URL, perMinute(3), nil)
	g.apply(t, good)
	bad := basic(2, up.URL, perMinute(3), nil)
	bad.APIs = append(bad.APIs, spec.API{ID: "jwt", ListenPath: "/jwt/", Target: spec.BuiltinEcho, Auth: spec.AuthJWT,
		JWT: &spec.JWT{Algorithms: []string{"HS256"}, Keys: []spec.JWTKey{{SecretEnv: "LP_GATEWAY_TEST_UNSET_SECRET"}}, DefaultPolicies: []string{"p"}}})
	err := g.gw.Apply(context.Background(), bad)
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte(`live: API "jwt": `)) {
		t.Fatalf("Apply(unresolvable secret) = %v, want an error naming API jwt", err)
	}
	if g.gw.Snapshot() != good {
		t.Error("the running snapshot changed")
	}
	checkStatuses(t, "after", k1Statuses(t, g, 4), []int{200, 200, 200, 429})
}

// TestApplyStaleRevision checks revision order: a lower revision is
// refused with ErrStaleRevision, the same one is applied again, and 0 (a
// local file's) is never stale.
func TestApplyStaleRevision(t *testing.T) {
	up := upstream(t)
	g := newTestGateway(t)
	g.apply(t, basic(5, up.URL, perMinute(3), nil))
	err := g.gw.Apply(context.Background(), basic(4, up.URL, perMinute(3), nil))
	if !errors.Is(err, gateway.ErrStaleRevision) {
		t.Fatalf("Apply(revision 4 over 5) = %v, want ErrStaleRevision", err)
	}
	if want := "live: snapshot revision is older than the running one (4 < 5)"; err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	if rev := g.gw.Snapshot().Revision; rev != 5 {
		t.Errorf("running revision %d, want 5", rev)
	}
	for _, rev := range []uint64{5, 0, 3} {
		if err := g.gw.Apply(context.Background(), basic(rev, up.URL, perMinute(3), nil)); err != nil {
			t.Errorf("Apply(revision %d): %v", rev, err)
		}
	}
}

// TestApplyKeepsCounters changes a key's policy under it. A quota of 5 an
// hour, spent, raised to 10 an hour gives exactly 5 more: the count is
// kept, not reset. A GCRA rate of 5 a minute, spent, raised to 10 a minute
// keeps the 5 units spent (issue 20: not the theoretical arrival time, which
// would leave nothing for the old minute), so exactly 5 more pass at once,
// and the new emission interval of 6 s lets one more through 6 s later.
func TestApplyKeepsCounters(t *testing.T) {
	up := upstream(t)
	hour := spec.Duration(time.Hour)

	t.Run("quota", func(t *testing.T) {
		g := newTestGateway(t)
		g.apply(t, basic(1, up.URL, nil, &spec.Quota{Max: 5, Renewal: hour}))
		checkStatuses(t, "5 an hour", k1Statuses(t, g, 6), append(repeat(200, 5), 429))
		g.apply(t, basic(2, up.URL, nil, &spec.Quota{Max: 10, Renewal: hour}))
		checkStatuses(t, "10 an hour", k1Statuses(t, g, 6), append(repeat(200, 5), 429))
	})
	t.Run("gcra", func(t *testing.T) {
		g := newTestGateway(t)
		g.apply(t, basic(1, up.URL, perMinute(5), nil))
		checkStatuses(t, "5 a minute", k1Statuses(t, g, 6), append(repeat(200, 5), 429))
		g.apply(t, basic(2, up.URL, perMinute(10), nil))
		// A limit change keeps the units spent, not the time: 5 of 10
		// spent, so exactly 5 more at once, then one per new emission
		// interval (6 s).
		checkStatuses(t, "raised to 10 a minute", k1Statuses(t, g, 5), repeat(200, 5))
		a := g.mustGet(t, "/api/x", "k1")
		if a.status != 429 || a.header.Get("Retry-After") != "6" || a.header.Get("RateLimit-Policy") != `"p";q=10;w=60` {
			t.Errorf("11th in the minute: %d Retry-After %q RateLimit-Policy %q, want 429, 6 and the new policy",
				a.status, a.header.Get("Retry-After"), a.header.Get("RateLimit-Policy"))
		}
		g.clock.Advance(6 * time.Second)
		checkStatuses(t, "6 s later", k1Statuses(t, g, 2), []int{200, 429})
	})
}

// TestInFlightRequestFinishesUnderOldSnapshot holds a request in its
// upstream while a snapshot without its API and key is applied: it
// finishes with 200 and the old policy's fields, and the next request is
// answered by the new snapshot.
func TestInFlightRequestFinishesUnderOldSnapshot(t *testing.T) {
	arrived, release := make(chan struct{}), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(arrived)
			<-release
		}
		io.WriteString(w, "upstream "+r.URL.Path)
	}))
	defer up.Close()
	g := newTestGateway(t)
	g.apply(t, basic(1, up.URL, perMinute(7), nil))

	done := make(chan answer, 1)
	go func() {
		a, err := g.get("/api/slow", "k1")
		if err != nil {
			a.body = err.Error()
		}
		done <- a
	}()
	<-arrived
	next := &spec.Snapshot{
		Revision: 2,
		Policies: []spec.Policy{{ID: "q", Rate: perMinute(100)}},
		Keys:     []spec.Key{{KeyHash: keyHash("k2"), Policies: []string{"q"}}},
		APIs:     []spec.API{{ID: "other", ListenPath: "/other/", Target: up.URL}},
	}
	g.apply(t, next)
	close(release)
	a := <-done
	if a.status != 200 || a.body != "upstream /slow" || a.header.Get("RateLimit-Policy") != `"p";q=7;w=60` {
		t.Errorf("request in flight: %d %q RateLimit-Policy %q, want 200 from the upstream under policy p",
			a.status, a.body, a.header.Get("RateLimit-Policy"))
	}
	if a := g.mustGet(t, "/api/slow", "k1"); a.status != 404 {
		t.Errorf("next request to the removed API: %d, want 404", a.status)
	}
	if a := g.mustGet(t, "/other/x", "k1"); a.status != 403 {
		t.Errorf("removed key on the new API: %d, want 403", a.status)
	}
	if a := g.mustGet(t, "/other/x", "k2"); a.status != 200 || a.header.Get("RateLimit-Policy") != `"q";q=100;w=60` {
		t.Errorf("new key on the new API: %d RateLimit-Policy %q", a.status, a.header.Get("RateLimit-Policy"))
	}
}

// jwksServer serves a JSON Web Key Set with one P-256 key.
func jwksServer(t *testing.T) *httptest.Server {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	b64 := base64.RawURLEncoding.EncodeToString
	pt, err := k.PublicKey.Bytes() // 0x04 || X || Y
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(map[string]any{"keys": []map[string]string{{
		"kty": "EC", "crv": "P-256", "kid": "k", "alg": "ES256", "x": b64(pt[1:33]), "y": b64(pt[33:]),
	}}})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestCloseStopsEverything runs a gateway with everything that starts a
// goroutine (a fallback store that sweeps, JWT APIs whose key sets refresh
// from a URL, one of them replaced by an Apply, upstream connections kept
// idle) and checks that a key set an Apply no longer uses stops, that
// after Close the goroutine count settles back to where it was before
// New, and that Apply is refused.
func TestCloseStopsEverything(t *testing.T) {
	up := upstream(t)
	jwks1, jwks2 := jwksServer(t), jwksServer(t)
	idle := func() {
		for _, s := range []*httptest.Server{up, jwks1, jwks2} {
			s.CloseClientConnections()
		}
	}
	before := settledGoroutines(t, 0, idle)

	clock := core.NewManualClock(int64(time.Hour))
	store := memory.New(memory.Options{Clock: clock})
	defer store.Close()
	gw, err := gateway.New(gateway.Options{Store: store, Seams: &seams.Seams{Clock: clock}, FailurePolicy: core.FailFallback})
	if err != nil {
		t.Fatal(err)
	}
	snap := func(rev uint64, jwksURL string) *spec.Snapshot {
		s := basic(rev, up.URL, perMinute(100), nil)
		s.APIs = append(s.APIs, spec.API{ID: "jwt", ListenPath: "/jwt/", Target: up.URL, Auth: spec.AuthJWT,
			JWT: &spec.JWT{Algorithms: []string{"ES256"}, JWKS: &spec.JWKS{URL: jwksURL, RefreshInterval: spec.Duration(time.Hour)},
				DefaultPolicies: []string{"p"}}})
		return s
	}
	if err := gw.Apply(context.Background(), snap(1, jwks1.URL)); err != nil {
		t.Fatal(err)
	}
	one := settledGoroutines(t, 0, idle)
	if err := gw.Apply(context.Background(), snap(2, jwks2.URL)); err != nil {
		t.Fatal(err)
	}
	// The first key set, no longer used, stops refreshing.
	if two := settledGoroutines(t, one, idle); two != one {
		t.Errorf("%d goroutines after replacing the JWKS URL, %d before", two, one)
	}
	for range 3 {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/api/x", nil)
		req.Header.Set("X-API-Key", "k1")
		gw.ServeHTTP(rec, req)
		if rec.Code != 200 {
			t.Fatalf("GET /api/x: %d %s", rec.Code, rec.Body)
		}
	}
	if n := runtime.NumGoroutine(); n <= before {
		t.Fatalf("%d goroutines while running, %d before: the test starts nothing", n, before)
	}
	if err := gw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gw.Apply(context.Background(), snap(3, jwks2.URL)); err == nil {
		t.Error("Apply after Close succeeded")
	}
	if after := settledGoroutines(t, before, idle); after > before {
		var b bytes.Buffer
		pprof.Lookup("goroutine").WriteTo(&b, 1)
		t.Errorf("%d goroutines after Close, %d before New:\n%s", after, before, b.String())
	}
}

// settledGoroutines waits up to 10 s for the goroutine count to reach want
// (or, for want 0, to stop changing), calling idle before each look, and
// returns it.
func settledGoroutines(t *testing.T, want int, idle func()) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	last := -1
	for {
		idle()
		runtime.GC()
		n := runtime.NumGoroutine()
		if (want > 0 && n <= want) || (want == 0 && n == last) || time.Now().After(deadline) {
			return n
		}
		last = n
		// Goroutines that were told to stop need to be scheduled to
		// return; nothing can be waited on for that.
		time.Sleep(20 * time.Millisecond)
	}
}

// TestApplyKeepsNoKeyList: the gateway does not hold the applied
// snapshot's keys: once the caller drops the snapshot it is collected,
// and Snapshot makes the configuration again from the key registry, equal
// to what was applied (reflect.DeepEqual, and the same digest), also for
// keys the registry's records alone cannot give back (an upper-case hash,
// per-API limits, an empty policy list, a zero expiry). It is made once
// while a caller holds it, and again, equal, after. An update of one key
// leaves the others, which shared its policy list, as they were.
func TestApplyKeepsNoKeyList(t *testing.T) {
	g := newTestGateway(t)
	zone := time.FixedZone("UTC+1", 3600)
	mk := func() *spec.Snapshot {
		s := basic(3, spec.BuiltinEcho, nil, perHour(2))
		s.Policies = append(s.Policies, spec.Policy{ID: "gold", Quota: perHour(4)})
		upper := "sha256:" + strings.ToUpper(strings.TrimPrefix(keyHash("k2"), "sha256:"))
		expires := time.Date(2030, 1, 2, 3, 4, 5, 6, zone)
		s.Keys = append(s.Keys,
			spec.Key{KeyHash: upper, Policies: []string{"p"}, Inactive: true},
			spec.Key{KeyHash: keyHash("k3"), Policies: []string{"p"}, Expires: &expires, QuotaEpoch: 4},
			spec.Key{KeyHash: keyHash("k4"), Policies: []string{"p"}, Expires: &time.Time{}},
			spec.Key{KeyHash: keyHash("k5"), Policies: []string{}, APILimits: map[string]spec.Limits{"api": {Quota: perHour(5), QuotaEpoch: 3}}},
			spec.Key{KeyHash: keyHash("k6"), APILimits: map[string]spec.Limits{"api": {Rate: perMinute(9)}}},
			spec.Key{KeyHash: keyHash("k7"), Policies: []string{"p"}},
		)
		return s
	}
	s := mk()
	applied, keys := weak.Make(s), weak.Make(&s.Keys[0])
	g.apply(t, s)
	s = nil
	runtime.GC()
	if applied.Value() != nil || keys.Value() != nil {
		t.Fatal("the gateway holds the applied snapshot or its keys")
	}
	want := mk()
	got := g.gw.Snapshot()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Snapshot:\n%+v\nwant\n%+v", got, want)
	}
	if protocol.Digest(got) != protocol.Digest(want) {
		t.Error("digests differ")
	}
	if g.gw.Snapshot() != got {
		t.Error("a second Snapshot made the snapshot again")
	}
	checkStatuses(t, "k1", keyStatuses(t, g, "k1", 3), []int{200, 200, 429})
	checkStatuses(t, "k2 (inactive)", keyStatuses(t, g, "k2", 1), []int{403})
	checkStatuses(t, "k5 (own quota)", keyStatuses(t, g, "k5", 6), []int{200, 200, 200, 200, 200, 429})
	got = nil
	runtime.GC()
	if again := g.gw.Snapshot(); !reflect.DeepEqual(again, want) {
		t.Errorf("Snapshot made again:\n%+v\nwant\n%+v", again, want)
	}

	// k3 and k7 had k1's policy list; k1 changes.
	g.updateKeys(t, 4, []spec.Key{{KeyHash: keyHash("k1"), Policies: []string{"gold"}}}, nil)
	want.Revision = 4
	want.Keys[0].Policies = []string{"gold"}
	if got := g.gw.Snapshot(); !reflect.DeepEqual(got, want) {
		t.Errorf("Snapshot after UpdateKeys:\n%+v\nwant\n%+v", got, want)
	}
}
