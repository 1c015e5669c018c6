package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/golang-jwt/jwt/v5"
	"github.com/limitplane/limitplane/internal/redistest"
	"github.com/limitplane/limitplane/spec"

	"github.com/limitplane/limitplane/gateway"
)

// jwtIssuer is the issuer of the test tokens.
const jwtIssuer = "https://idp.example/"

// jwtKeys are the signing keys of the JWT tests: an RSA key whose public
// half is written to a PEM file, and an HMAC secret given through an
// environment variable.
type jwtKeys struct {
	rsa     *rsa.PrivateKey
	pemFile string
	secret  []byte
}

// newJWTKeys generates the keys, writes k1.pem into a temporary directory
// and sets LP_JWT_SECRET for the test.
func newJWTKeys(t *testing.T) *jwtKeys {
	t.Helper()
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&rk.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	k := &jwtKeys{rsa: rk, pemFile: filepath.Join(t.TempDir(), "k1.pem"), secret: []byte(strings.Repeat("0123456789abcdef", 3))}
	if err := os.WriteFile(k.pemFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("LP_JWT_SECRET", string(k.secret))
	return k
}

// claims are the standard claims of a valid token for sub at the frozen
// wall clock, with extra added (a nil value removes a claim).
func claims(sub string, extra jwt.MapClaims) jwt.MapClaims {
	c := jwt.MapClaims{"sub": sub, "iss": jwtIssuer, "aud": "echo", "iat": epoch, "exp": epoch + 3600}
	for k, v := range extra {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	return c
}

// sign signs c with method m and key, naming kid.
func sign(t *testing.T, m jwt.SigningMethod, key any, kid string, c jwt.MapClaims) string {
	t.Helper()
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

// jwtConfig is a Redis-backed gateway with one jwt API: RS256 tokens
// checked with a PEM key (kid k1), HS256 tokens with a secret from
// LP_JWT_SECRET (kid h1); basic (2 a minute) by default, gold (5 a minute)
// by policy claim.
func jwtConfig(redisAddr, pemFile string) string {
	return fmt.Sprintf(`
store: redis://%s/0
redis: {timeout: 10s}
policies:
  - {id: basic, rate: {requests: 2, per: 1m}}
  - {id: gold, rate: {requests: 5, per: 1m}}
  - {id: other, rate: {requests: 100, per: 1m}, apis: [elsewhere]}
apis:
  - id: echo
    listen_path: /echo/
    target: builtin:echo
    auth: jwt
    jwt:
      algorithms: [RS256, HS256]
      keys:
        - {id: k1, pem_file: %s}
        - {id: h1, secret_env: LP_JWT_SECRET}
      issuer: %s
      audience: [echo]
      leeway: 30s
      policy_claim: pol
      default_policies: [basic]
  - {id: elsewhere, listen_path: /elsewhere/, target: "builtin:echo", auth: keyless, policies: [other]}
`, redisAddr, pemFile, jwtIssuer)
}

// TestJWT runs a JWT-protected API through the real gateway on Redis: bad
// tokens get a 401 JSON answer and leave Redis empty; two different
// tokens (even signed with different keys) with the same sub share one
// limit; a policy claim selects a bigger limit; the counters in Redis are
// exactly those of the tokens' subjects.
func TestJWT(t *testing.T) {
	k := newJWTKeys(t)
	srv := redistest.Start(t)
	rc := srv.Client(t, nil)
	gw := start(t, frozen(), "-config", writeConfig(t, jwtConfig(srv.Addr, k.pemFile)))
	if want := "  /echo/ -> builtin:echo (jwt)\n"; !strings.Contains(gw.stdout.String(), want) {
		t.Errorf("banner %q lacks %q", gw.stdout, want)
	}
	pemBytes, err := os.ReadFile(k.pemFile)
	if err != nil {
		t.Fatal(err)
	}
	call := func(tok string) reply {
		t.Helper()
		if tok == "" {
			return get(t, nil, gw.base+"/echo/x")
		}
		return get(t, nil, gw.base+"/echo/x", "Authorization", "Bearer "+tok)
	}

	rs := func(c jwt.MapClaims) string { return sign(t, jwt.SigningMethodRS256, k.rsa, "k1", c) }
	for _, tc := range []struct{ name, tok, status, body string }{
		{"alg none", sign(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, "k1", claims("alice", nil)), "401", "invalid token"},
		{"HS256 signed with the RSA public key's PEM", sign(t, jwt.SigningMethodHS256, pemBytes, "k1", claims("alice", nil)), "401", "invalid token"},
		{"RS256 naming the HMAC key", sign(t, jwt.SigningMethodRS256, k.rsa, "h1", claims("alice", nil)), "401", "invalid token"},
		{"unknown kid", sign(t, jwt.SigningMethodRS256, k.rsa, "k9", claims("alice", nil)), "401", "invalid token"},
		{"no kid", sign(t, jwt.SigningMethodRS256, k.rsa, "", claims("alice", nil)), "401", "invalid token"},
		{"wrong secret", sign(t, jwt.SigningMethodHS256, []byte(strings.Repeat("x", 48)), "h1", claims("alice", nil)), "401", "invalid token"},
		{"expired beyond the leeway", rs(claims("alice", jwt.MapClaims{"exp": epoch - 31})), "401", "token expired"},
		{"no exp", rs(claims("alice", jwt.MapClaims{"exp": nil})), "401", "token lacks a required claim: exp"},
		{"nbf in the future", rs(claims("alice", jwt.MapClaims{"nbf": epoch + 60})), "401", "token not valid yet"},
		{"wrong iss", rs(claims("alice", jwt.MapClaims{"iss": "https://evil.example/"})), "401", "invalid token issuer"},
		{"wrong aud", rs(claims("alice", jwt.MapClaims{"aud": "billing"})), "401", "invalid token audience"},
		{"no sub", rs(claims("alice", jwt.MapClaims{"sub": nil})), "401", "token names no consumer"},
		{"garbage", "garbage", "401", "invalid token"},
		{"3 dots", "a.b.c.d", "401", "invalid token"},
		{"16 KB", strings.Repeat("eyJh", 4<<10), "401", "token too large"},
		{"no token", "", "401", "no token"},
		{"policy the gateway lacks", rs(claims("alice", jwt.MapClaims{"pol": "platinum"})), "403", "access to this API is not allowed"},
		{"policy for another API", rs(claims("alice", jwt.MapClaims{"pol": "other"})), "403", "access to this API is not allowed"},
	} {
		r := call(tc.tok)
		if fmt.Sprint(r.status) != tc.status || r.body != `{"error":"`+tc.body+`"}`+"\n" {
			t.Errorf("%s: %d %q, want %s %q", tc.name, r.status, r.body, tc.status, tc.body)
		}
		checkHeaders(t, tc.name, r.header, map[string]string{"Content-Type": "application/json", "RateLimit": "", "Retry-After": ""})
	}
	checkKeys(t, rc) // nobody was charged

	// alice: an RS256 and an HS256 token, different jti and exp, one
	// limit of 2 a minute. A token expired 10s ago is within the leeway.
	t1 := rs(claims("alice", jwt.MapClaims{"jti": "one"}))
	t2 := sign(t, jwt.SigningMethodHS256, k.secret, "h1", claims("alice", jwt.MapClaims{"jti": "two", "exp": epoch - 10}))
	for i, want := range []struct {
		tok            string
		status         int
		rl, retryAfter string
	}{
		{t1, 200, `"basic";r=1;t=30`, ""},
		{t2, 200, `"basic";r=0;t=60`, ""},
		{t1, 429, `"basic";r=0;t=30`, "30"},
		{t2, 429, `"basic";r=0;t=30`, "30"},
	} {
		r := call(want.tok)
		if r.status != want.status {
			t.Fatalf("alice request %d: status %d %s, want %d", i+1, r.status, r.body, want.status)
		}
		checkHeaders(t, fmt.Sprintf("alice %d", i+1), r.header, map[string]string{
			"RateLimit": want.rl, "RateLimit-Policy": `"basic";q=2;w=60`, "Retry-After": want.retryAfter,
		})
		if want.status == 200 {
			var e gateway.EchoReply
			err := json.Unmarshal([]byte(r.body), &e)
			if _, sent := e.Headers["Authorization"]; err != nil || sent {
				t.Errorf("echo body %q (%v)", r.body, err)
			}
		}
	}

	// bob names gold in his policy claim (a string, then a list with the
	// smaller basic too: the most generous wins): 5 a minute.
	gold := []string{rs(claims("bob", jwt.MapClaims{"pol": "gold"})), rs(claims("bob", jwt.MapClaims{"pol": []string{"basic", "gold"}}))}
	for i := 0; i < 5; i++ {
		r := call(gold[i%2])
		if r.status != 200 || r.header.Get("RateLimit") != fmt.Sprintf(`"gold";r=%d;t=%d`, 4-i, 12*(i+1)) {
			t.Fatalf("bob request %d: %d RateLimit %q", i+1, r.status, r.header.Get("RateLimit"))
		}
	}
	if r := call(gold[0]); r.status != 429 || r.header.Get("Retry-After") != "12" {
		t.Fatalf("bob request 6: %d Retry-After %q, want 429 after 12", r.status, r.header.Get("Retry-After"))
	}

	prefix := spec.JWTIDPrefix(jwtIssuer, "echo")
	checkKeys(t, rc, redisKey("limitplane:", prefix+"alice", "gcra"), redisKey("limitplane:", prefix+"bob", "gcra"))
}

// TestJWTFailureLimit: failed authentications are charged per client
// address to the failure_limit policy, shared by the two APIs naming it
// (one jwt, one api_key); over budget, even a valid token from that
// address waits, while another address is unaffected.
func TestJWTFailureLimit(t *testing.T) {
	k := newJWTKeys(t)
	gw := start(t, frozen(), "-config", writeConfig(t, fmt.Sprintf(`
policies:
  - {id: basic, rate: {requests: 10, per: 1m}}
  - {id: authfail, rate: {requests: 3, per: 1m}}
keys:
  - {key: good-key, policies: [basic]}
apis:
  - id: echo
    listen_path: /echo/
    target: builtin:echo
    auth: jwt
    jwt: {algorithms: [RS256], keys: [{pem_file: %s}], default_policies: [basic]}
    failure_limit: {policy: authfail}
  - {id: keyed, listen_path: /keyed/, target: "builtin:echo", failure_limit: {policy: authfail}}
`, k.pemFile)))
	if want := "  /echo/ -> builtin:echo (jwt, failed attempts limited by policy authfail per client IP)\n"; !strings.Contains(gw.stdout.String(), want) {
		t.Errorf("banner %q lacks %q", gw.stdout, want)
	}
	valid := sign(t, jwt.SigningMethodRS256, k.rsa, "", claims("alice", jwt.MapClaims{"iss": nil, "aud": nil}))
	one, two := clientFrom("127.0.0.1"), clientFrom("127.0.0.2")

	for i, tc := range []struct {
		path, name, value string
		status            int
		body              string
	}{
		{"/echo/", "Authorization", "Bearer guess-1", 401, `{"error":"invalid token"}`},
		{"/keyed/", "X-API-Key", "guess-2", 403, `{"error":"unknown API key"}`},
		{"/echo/", "Authorization", "Bearer " + valid, 200, ""}, // success costs nothing
		{"/echo/", "", "", 401, `{"error":"no token"}`},
	} {
		var r reply
		if tc.name == "" {
			r = get(t, one, gw.base+tc.path)
		} else {
			r = get(t, one, gw.base+tc.path, tc.name, tc.value)
		}
		if r.status != tc.status || tc.body != "" && r.body != tc.body+"\n" {
			t.Fatalf("attempt %d: %d %q, want %d %s", i+1, r.status, r.body, tc.status, tc.body)
		}
	}
	over := `{"error":"too many failed authentication attempts","retry_after_ms":20000}` + "\n"
	for _, tc := range [][]string{{"/echo/", "Authorization", "Bearer " + valid}, {"/keyed/", "X-API-Key", "good-key"}, {"/echo/", "Authorization", "Bearer guess-4"}} {
		r := get(t, one, gw.base+tc[0], tc[1], tc[2])
		if r.status != 429 || r.body != over {
			t.Fatalf("over budget, %s: %d %q, want 429 %q", tc[0], r.status, r.body, over)
		}
		checkHeaders(t, "over budget", r.header, map[string]string{
			"Retry-After": "20", "RateLimit-Policy": `"authfail";q=3;w=60`, "RateLimit": `"authfail";r=0;t=20`,
		})
	}
	r := get(t, two, gw.base+"/echo/", "Authorization", "Bearer "+valid)
	if r.status != 200 || r.header.Get("RateLimit") != `"basic";r=8;t=12` {
		t.Fatalf("from 127.0.0.2: %d RateLimit %q, want 200 with alice's second unit spent", r.status, r.header.Get("RateLimit"))
	}
}

// jwksServer serves a JSON Web Key Set and counts the fetches.
type jwksServer struct {
	*httptest.Server
	fetches atomic.Int32
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// TestJWTJWKS: a jwt API takes its keys from a JWKS served by a local
// server: RS256 and ES256 tokens for one sub share a limit, a token signed
// by a key not in the set is refused; a gateway whose JWKS cannot be
// fetched does not start.
func TestJWTJWKS(t *testing.T) {
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	set, err := json.Marshal(map[string]any{"keys": []map[string]string{
		{"kty": "RSA", "kid": "r1", "use": "sig", "alg": "RS256", "n": b64(rk.N.Bytes()), "e": b64(big.NewInt(int64(rk.E)).Bytes())},
		{"kty": "EC", "kid": "e1", "use": "sig", "alg": "ES256", "crv": "P-256", "x": b64(ek.X.FillBytes(make([]byte, 32))), "y": b64(ek.Y.FillBytes(make([]byte, 32)))},
	}})
	if err != nil {
		t.Fatal(err)
	}
	js := &jwksServer{}
	js.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		js.fetches.Add(1)
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.Write(set)
	}))
	defer js.Close()

	cfg := func(url string) string {
		return fmt.Sprintf(`
policies: [{id: basic, rate: {requests: 2, per: 1m}}]
apis:
  - id: ext
    listen_path: /ext/
    target: builtin:echo
    auth: jwt
    jwt:
      algorithms: [RS256, ES256]
      jwks: {url: %q, refresh_interval: 1h}
      issuer: %s
      audience: [echo]
      default_policies: [basic]
`, url, jwtIssuer)
	}
	gw := start(t, frozen(), "-config", writeConfig(t, cfg(js.URL+"/jwks.json")))
	if n := js.fetches.Load(); n != 1 {
		t.Errorf("%d fetches at startup, want 1", n)
	}
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		tok    string
		status int
		rl     string
	}{
		{sign(t, jwt.SigningMethodRS256, rk, "r1", claims("carol", nil)), 200, `"basic";r=1;t=30`},
		{sign(t, jwt.SigningMethodES256, ek, "e1", claims("carol", nil)), 200, `"basic";r=0;t=60`},
		{sign(t, jwt.SigningMethodES256, ek, "e1", claims("carol", nil)), 429, `"basic";r=0;t=30`},
		{sign(t, jwt.SigningMethodES256, other, "e1", claims("dave", nil)), 401, ""},
		{sign(t, jwt.SigningMethodRS256, rk, "e1", claims("dave", nil)), 401, ""},
	} {
		r := get(t, nil, gw.base+"/ext/", "Authorization", "Bearer "+tc.tok)
		if r.status != tc.status || r.header.Get("RateLimit") != tc.rl {
			t.Fatalf("request %d: %d RateLimit %q %s, want %d %q", i+1, r.status, r.header.Get("RateLimit"), r.body, tc.status, tc.rl)
		}
	}

	// Nothing serves the key set: the gateway refuses to start.
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	err = run(t.Context(), []string{"-listen", "127.0.0.1:0", "-config", writeConfig(t, cfg(dead.URL+"/jwks.json"))}, env{stdout: newOutput(), stderr: newOutput()})
	if want := `live: API "ext": identity: JWKS ` + dead.URL + "/jwks.json: "; err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("dead JWKS: err = %v, want %s...connection refused", err, want)
	}
}
