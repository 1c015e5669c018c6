package identity_test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/identity"
)

// e2e is a real HTTP server: nethttp middleware, a JWT authenticator
// (RS256, policy claim "pol", default policy "basic") optionally wrapped in
// FailureLimited, an engine over an in-process store with a frozen clock.
type e2e struct {
	srv    *httptest.Server
	store  *memory.Store
	engine *core.Engine
	key    *rsa.PrivateKey
}

func newE2E(t *testing.T, failureLimited bool) *e2e {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	pub, err := identity.ParseJWTKeyPEM("k1", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	if err != nil {
		t.Fatal(err)
	}
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{
		{ID: "basic", Rate: core.PerMinute(2)},
		{ID: "gold", Rate: core.PerMinute(5)},
		{ID: "authfail", Rate: core.PerMinute(3)},
	}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var auth identity.Authenticator
	auth, err = identity.NewJWT(identity.JWTOptions{
		Algorithms:      []string{"RS256"},
		Keys:            []identity.JWTKey{pub},
		Issuer:          "https://issuer.example",
		Audience:        []string{"echo"},
		PolicyClaim:     "pol",
		DefaultPolicies: []string{"basic"},
	})
	if err != nil {
		t.Fatal(err)
	}
	if failureLimited {
		auth = &identity.FailureLimited{Auth: auth, Limiter: eng, Policy: "authfail"}
	}
	h := nethttp.Middleware(eng, auth, nethttp.Options{API: "echo"})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &e2e{srv: srv, store: store, engine: eng, key: key}
}

func (e *e2e) token(t *testing.T, sub string, extra jwt.MapClaims) string {
	t.Helper()
	c := jwt.MapClaims{"sub": sub, "iss": "https://issuer.example", "aud": "echo", "exp": time.Now().Add(time.Hour).Unix()}
	for k, v := range extra {
		c[k] = v
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodRS256, c)
	tok.Header["kid"] = "k1"
	s, err := tok.SignedString(e.key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type answer struct {
	status          int
	body            string
	policy, current string
	retryAfter      string
}

func (e *e2e) get(t *testing.T, tok string) answer {
	t.Helper()
	req, _ := http.NewRequest("GET", e.srv.URL+"/x", nil)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, string(b), resp.Header.Get("RateLimit-Policy"), resp.Header.Get("RateLimit"), resp.Header.Get("Retry-After")}
}

// TestE2EJWTSharedSubAndPolicyClaim: two tokens with the same sub share
// one limit; a policy claim selects a bigger one.
func TestE2EJWTSharedSubAndPolicyClaim(t *testing.T) {
	e := newE2E(t, true)
	t1 := e.token(t, "alice", jwt.MapClaims{"jti": "one"})
	t2 := e.token(t, "alice", jwt.MapClaims{"jti": "two", "exp": time.Now().Add(2 * time.Hour).Unix()})
	want := []answer{
		{200, "ok", `"basic";q=2;w=60`, `"basic";r=1;t=30`, ""},
		{200, "ok", `"basic";q=2;w=60`, `"basic";r=0;t=60`, ""},
		{429, `{"error":"rate limit exceeded","retry_after_ms":30000}` + "\n", `"basic";q=2;w=60`, `"basic";r=0;t=30`, "30"},
	}
	for i, tok := range []string{t1, t2, t1} {
		if got := e.get(t, tok); got != want[i] {
			t.Fatalf("alice request %d: %+v, want %+v", i+1, got, want[i])
		}
	}
	gold := e.token(t, "bob", jwt.MapClaims{"pol": []string{"gold"}})
	for i := range 5 {
		if got := e.get(t, gold); got.status != 200 || got.policy != `"gold";q=5;w=60` {
			t.Fatalf("bob request %d: %+v", i+1, got)
		}
	}
	if got := e.get(t, gold); got.status != 429 || got.retryAfter != "12" {
		t.Fatalf("bob request 6: %+v", got)
	}
	if n := e.store.Len(); n != 2 {
		t.Fatalf("store len %d, want 2 (alice, bob)", n)
	}
}

// TestE2EJWTRefusedChargesNobody: every bad token is a 401 JSON answer and
// leaves the store empty.
func TestE2EJWTRefusedChargesNobody(t *testing.T) {
	e := newE2E(t, false)
	other, _ := rsa.GenerateKey(rand.Reader, 2048)
	der, _ := x509.MarshalPKIXPublicKey(&e.key.PublicKey)
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	signWith := func(m jwt.SigningMethod, key any, kid string, c jwt.MapClaims) string {
		tok := jwt.NewWithClaims(m, c)
		if kid != "" {
			tok.Header["kid"] = kid
		}
		s, err := tok.SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	std := func(extra jwt.MapClaims) jwt.MapClaims {
		c := jwt.MapClaims{"sub": "alice", "iss": "https://issuer.example", "aud": "echo", "exp": time.Now().Add(time.Hour).Unix()}
		for k, v := range extra {
			if v == nil {
				delete(c, k)
			} else {
				c[k] = v
			}
		}
		return c
	}
	none := signWith(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, "k1", std(nil))
	cases := map[string]struct{ tok, body string }{
		"alg none":            {none, "invalid token"},
		"HS256 with RSA PEM":  {signWith(jwt.SigningMethodHS256, pemBytes, "k1", std(nil)), "invalid token"},
		"no exp":              {signWith(jwt.SigningMethodRS256, e.key, "k1", std(jwt.MapClaims{"exp": nil})), "token lacks a required claim: exp"},
		"expired":             {signWith(jwt.SigningMethodRS256, e.key, "k1", std(jwt.MapClaims{"exp": time.Now().Add(-time.Minute).Unix()})), "token expired"},
		"nbf in the future":   {signWith(jwt.SigningMethodRS256, e.key, "k1", std(jwt.MapClaims{"nbf": time.Now().Add(time.Hour).Unix()})), "token not valid yet"},
		"wrong iss":           {signWith(jwt.SigningMethodRS256, e.key, "k1", std(jwt.MapClaims{"iss": "https://evil.example"})), "invalid token issuer"},
		"wrong aud":           {signWith(jwt.SigningMethodRS256, e.key, "k1", std(jwt.MapClaims{"aud": "other"})), "invalid token audience"},
		"unknown kid":         {signWith(jwt.SigningMethodRS256, e.key, "k2", std(nil)), "invalid token"},
		"other signer":        {signWith(jwt.SigningMethodRS256, other, "k1", std(nil)), "invalid token"},
		"garbage":             {"garbage", "invalid token"},
		"empty":               {"", "no token"},
		"3 dots":              {"a.b.c.d", "invalid token"},
		"16 KB":               {strings.Repeat("eyJh", 4<<10), "token too large"},
		"unknown policy name": {signWith(jwt.SigningMethodRS256, e.key, "k1", std(jwt.MapClaims{"pol": "platinum"})), ""},
	}
	for name, c := range cases {
		got := e.get(t, c.tok)
		want := answer{status: 401, body: `{"error":"` + c.body + `"}` + "\n"}
		if c.body == "" { // the engine refuses a policy it lacks: 403
			want = answer{status: 403, body: `{"error":"access to this API is not allowed"}` + "\n"}
		}
		if got != want {
			t.Errorf("%s: %+v, want %+v", name, got, want)
		}
	}
	if n := e.store.Len(); n != 0 {
		t.Fatalf("store len %d after refused tokens, want 0", n)
	}
}

// TestE2EBruteForce: failed attempts from one client are limited by the
// authfail policy; once over, even a valid token from that client waits.
func TestE2EBruteForce(t *testing.T) {
	e := newE2E(t, true)
	for i := range 3 {
		if got := e.get(t, "guess"); got.status != 401 || got.body != `{"error":"invalid token"}`+"\n" {
			t.Fatalf("attempt %d: %+v", i+1, got)
		}
	}
	want := answer{429, `{"error":"too many failed authentication attempts","retry_after_ms":20000}` + "\n",
		`"authfail";q=3;w=60`, `"authfail";r=0;t=20`, "20"}
	for _, tok := range []string{"guess", e.token(t, "alice", nil)} {
		if got := e.get(t, tok); got != want {
			t.Fatalf("over budget: %+v, want %+v", got, want)
		}
	}
	if n := e.store.Len(); n != 1 {
		t.Fatalf("store len %d, want 1 (authfail:ip:127.0.0.1)", n)
	}
}

// TestE2ECredentialRules sends the ambiguous and malformed requests of the
// tests above over real HTTP, through the net/http middleware (repeated
// header lines as a client writes them), and checks the exact 401 answers;
// only the one good request is charged.
func TestE2ECredentialRules(t *testing.T) {
	e := newE2E(t, false)
	ks, err := identity.NewKeys([]identity.KeyRecord{{Hash: identity.HashKey("k2"), Policies: []string{"basic"}}})
	if err != nil {
		t.Fatal(err)
	}
	h := nethttp.Middleware(e.engine, identity.NewAPIKey(ks, identity.APIKeyOptions{}), nethttp.Options{API: "echo"})(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	keySrv := httptest.NewServer(h)
	defer keySrv.Close()

	tok := e.token(t, "alice", nil)
	dup := identity.SignRaw(t, jwt.SigningMethodRS256, e.key, `{"alg":"RS256","kid":"k1"}`,
		`{"sub":"alice","sub":"bob","iss":"https://issuer.example","aud":"echo","exp":`+strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)+`}`)
	huge := identity.SignRaw(t, jwt.SigningMethodRS256, e.key, `{"alg":"RS256","kid":"k1"}`,
		`{"sub":"alice","iss":"https://issuer.example","aud":"echo","exp":1e300}`)
	type hdr = [2]string
	for _, tc := range []struct {
		name   string
		url    string
		hdrs   []hdr
		status int
		body   string
	}{
		{"key: X-API-Key k2 then wrong", keySrv.URL + "/x", []hdr{{"X-API-Key", "k2"}, {"X-API-Key", "wrong"}}, 401, "ambiguous credentials: more than one X-API-Key header"},
		{"key: X-API-Key wrong then k2", keySrv.URL + "/x", []hdr{{"X-API-Key", "wrong"}, {"X-API-Key", "k2"}}, 401, "ambiguous credentials: more than one X-API-Key header"},
		{"key: Authorization and X-API-Key differ", keySrv.URL + "/x", []hdr{{"Authorization", "Bearer k2"}, {"X-API-Key", "wrong"}}, 401, "ambiguous credentials: Authorization header and X-API-Key header differ"},
		{"key: X-API-Key and query differ", keySrv.URL + "/x?api_key=wrong", []hdr{{"X-API-Key", "k2"}}, 401, "ambiguous credentials: X-API-Key header and api_key query parameter differ"},
		{"key: api_key twice", keySrv.URL + "/x?api_key=k2&api_key=wrong", nil, 401, "ambiguous credentials: more than one api_key query parameter"},
		{"key: api_key twice, same key, with a header", keySrv.URL + "/x?api_key=k2&api_key=k2", []hdr{{"X-API-Key", "k2"}}, 401, "ambiguous credentials: more than one api_key query parameter"},
		{"key: one key in two places", keySrv.URL + "/x?api_key=k2", []hdr{{"X-API-Key", "k2"}}, 200, "ok"},
		{"jwt: two Authorization lines", e.srv.URL + "/x", []hdr{{"Authorization", "Bearer " + tok}, {"Authorization", "Bearer garbage"}}, 401, "ambiguous credentials: more than one Authorization header"},
		{"jwt: no Bearer scheme", e.srv.URL + "/x", []hdr{{"Authorization", tok}}, 401, "Authorization scheme is not Bearer"},
		{"jwt: duplicate sub", e.srv.URL + "/x", []hdr{{"Authorization", "Bearer " + dup}}, 401, "token repeats a claim"},
		{"jwt: exp 1e300", e.srv.URL + "/x", []hdr{{"Authorization", "Bearer " + huge}}, 401, "token exp out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest("GET", tc.url, nil)
			for _, h := range tc.hdrs {
				req.Header.Add(h[0], h[1])
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			want := tc.body
			if tc.status != 200 {
				want = `{"error":"` + tc.body + `"}` + "\n"
			}
			if resp.StatusCode != tc.status || string(b) != want {
				t.Fatalf("%d %q, want %d %q", resp.StatusCode, b, tc.status, want)
			}
			if tc.status != 200 && (resp.Header.Get("Content-Type") != "application/json" || resp.Header.Get("RateLimit") != "") {
				t.Errorf("header %v", resp.Header)
			}
		})
	}
	if n := e.store.Len(); n != 1 {
		t.Fatalf("store len %d, want 1 (k2's one allowed request)", n)
	}
}

// TestE2EJWTNumericConsumerIsItsText: a numeric consumer claim is the
// consumer its JSON text names, as the token writes it: "sub":1 and
// "sub":"1" share counters, but 1.0 and 1e0 are consumers of their own.
func TestE2EJWTNumericConsumerIsItsText(t *testing.T) {
	e := newE2E(t, false)
	exp := strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)
	tok := func(sub string) string {
		return identity.SignRaw(t, jwt.SigningMethodRS256, e.key, `{"alg":"RS256","kid":"k1"}`,
			`{"sub":`+sub+`,"iss":"https://issuer.example","aud":"echo","exp":`+exp+`}`)
	}
	for i, tc := range []struct{ sub, ratelimit string }{
		{`1`, `"basic";r=1;t=30`},
		{`"1"`, `"basic";r=0;t=60`}, // the same consumer as 1
		{`1.0`, `"basic";r=1;t=30`},
		{`1e0`, `"basic";r=1;t=30`},
		{`1.0`, `"basic";r=0;t=60`},
	} {
		if got := e.get(t, tok(tc.sub)); got.status != 200 || got.current != tc.ratelimit {
			t.Fatalf("request %d, sub %s: %+v, want 200 and RateLimit %s", i+1, tc.sub, got, tc.ratelimit)
		}
	}
	if n := e.store.Len(); n != 3 {
		t.Fatalf("store len %d, want 3 (1, 1.0, 1e0)", n)
	}
}
