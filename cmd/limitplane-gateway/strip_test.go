package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"

	"github.com/limitplane/limitplane/gateway"
)

// upstreamSaw is what a test upstream received.
type upstreamSaw struct {
	query                                string
	authorization, apiKey, cookie, other []string
}

// capture returns a real upstream that reports each request it receives.
func capture(t *testing.T) (*httptest.Server, <-chan upstreamSaw) {
	t.Helper()
	saw := make(chan upstreamSaw, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		saw <- upstreamSaw{r.URL.RawQuery, r.Header.Values("Authorization"), r.Header.Values("X-Api-Key"),
			r.Header.Values("Cookie"), r.Header.Values("X-Other")}
	}))
	t.Cleanup(up.Close)
	return up, saw
}

// TestStripAuthData: by default an api_key API removes the key from every
// place it reads one (Authorization, X-API-Key, api_key, however escaped)
// and a jwt API the Authorization header, before the request goes
// upstream; everything else arrives as sent. With strip_auth_data: false
// the upstream receives the credential, and builtin:echo shows it
// redacted.
func TestStripAuthData(t *testing.T) {
	up, saw := capture(t)
	secret := strings.Repeat("0123456789abcdef", 3)
	t.Setenv("LP_JWT_SECRET", secret)
	gw := start(t, frozen(), "-config", writeConfig(t, fmt.Sprintf(`
policies:
  - {id: p, rate: {requests: 100, per: 1m}}
keys:
  - {key: k1, policies: [p]}
apis:
  - {id: keyed, listen_path: /keyed/, target: %[1]q}
  - {id: keep, listen_path: /keep/, target: %[1]q, strip_auth_data: false}
  - id: tokens
    listen_path: /tokens/
    target: %[1]q
    auth: jwt
    jwt: {algorithms: [HS256], keys: [{secret_env: LP_JWT_SECRET}], default_policies: [p]}
  - {id: echo, listen_path: /echo/, target: "builtin:echo", strip_auth_data: false}
`, up.URL)))
	tok := sign(t, jwt.SigningMethodHS256, []byte(secret), "", claims("alice", jwt.MapClaims{"iss": nil, "aud": nil}))

	for _, tc := range []struct {
		name string
		path string
		hdr  []string
		want upstreamSaw
	}{
		{"api_key parameter", "/keyed/a/b?api_key=k1&x=1&y=%20", []string{"Cookie", "s=1", "X-Other", "o"},
			upstreamSaw{query: "x=1&y=%20", cookie: []string{"s=1"}, other: []string{"o"}}},
		{"Authorization", "/keyed/a", []string{"Authorization", "Bearer k1", "X-Other", "o"}, upstreamSaw{other: []string{"o"}}},
		{"X-API-Key and an escaped parameter name", "/keyed/a?api%5Fkey=k1", []string{"X-API-Key", "k1"}, upstreamSaw{}},
		{"strip_auth_data: false", "/keep/a?api_key=k1", []string{"X-API-Key", "k1"},
			upstreamSaw{query: "api_key=k1", apiKey: []string{"k1"}}},
		{"jwt: only Authorization", "/tokens/a?api_key=zzz", []string{"Authorization", "Bearer " + tok, "X-API-Key", "other"},
			upstreamSaw{query: "api_key=zzz", apiKey: []string{"other"}}},
	} {
		r := get(t, nil, gw.base+tc.path, tc.hdr...)
		if r.status != 200 {
			t.Fatalf("%s: status %d %s", tc.name, r.status, r.body)
		}
		if got := <-saw; fmt.Sprintf("%q", got) != fmt.Sprintf("%q", tc.want) {
			t.Errorf("%s: upstream saw %q, want %q", tc.name, got, tc.want)
		}
	}

	// A key parameter given twice never reaches an upstream, which might
	// read the value the gateway did not check: not even one that
	// receives the credential (strip_auth_data: false).
	for _, path := range []string{"/keep/a?api_key=k1&api_key=zzz", "/keep/a?api_key=zzz&api_key=k1", "/keyed/a?api_key=k1&api_key=zzz"} {
		r := get(t, nil, gw.base+path)
		if want := `{"error":"ambiguous credentials: more than one api_key query parameter"}` + "\n"; r.status != 401 || r.body != want {
			t.Errorf("%s: %d %q, want 401 %q", path, r.status, r.body, want)
		}
		select {
		case got := <-saw:
			t.Errorf("%s: the upstream received %q", path, got)
		default:
		}
	}

	r := get(t, nil, gw.base+"/echo/x?api_key=k1&x=1", "X-API-Key", "k1")
	var e gateway.EchoReply
	if err := json.Unmarshal([]byte(r.body), &e); err != nil || r.status != 200 {
		t.Fatalf("echo: %d %q (%v)", r.status, r.body, err)
	}
	if e.Query != "api_key=[redacted]&x=1" || e.Headers["X-Api-Key"] != "[redacted]" {
		t.Errorf("echo shows query %q, X-Api-Key %q", e.Query, e.Headers["X-Api-Key"])
	}
}
