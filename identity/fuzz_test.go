package identity

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/golang-jwt/jwt/v5"
)

// FuzzAPIKeyExtract: the key extractor and authenticator never panic; an
// extracted key is trimmed, comes from one of the sources, and every other
// source is empty or presents the same key; failures are 401/403 *Error
// values.
func FuzzAPIKeyExtract(f *testing.F) {
	f.Add("Bearer right", "", "", "")
	f.Add("bearer", " right ", "", "")
	f.Add("BEARER\tright", "", "q", "c")
	f.Add("", "", "right", "")
	f.Add("", "", "", "right")
	f.Add("Basic dXNlcjpwYXNz", "x", "", "")
	f.Add("Bearer right", "right", "right", "")
	f.Add("Bearer right", "wrong", "", "")
	f.Add("", "right", "", "wrong")
	ks, err := NewKeys([]KeyRecord{{Hash: HashKey("right"), Policies: []string{"basic"}}})
	if err != nil {
		f.Fatal(err)
	}
	a := NewAPIKey(ks, APIKeyOptions{Sources: []Source{{InHeader, "Authorization"}, {InHeader, "X-API-Key"}, {InQuery, "api_key"}, {InCookie, "k"}}, MaxKeyLength: 64})
	f.Fuzz(func(t *testing.T, authz, xkey, query, cookie string) {
		r := &testReq{h: map[string][]string{"Authorization": {authz}, "X-Api-Key": {xkey}}, q: map[string][]string{"api_key": {query}}, c: map[string]string{"k": cookie}, peer: "192.0.2.1:1"}
		k, xerr := a.Extract(r)
		if xerr != nil {
			var e *Error
			if !errors.As(xerr, &e) || e.Status != 401 || e.Kind != ErrInvalidCredentials || k != "" {
				t.Fatalf("Extract = %q, %v", k, xerr)
			}
			if _, err := a.Authenticate(context.Background(), r); err == nil || err.Error() != xerr.Error() {
				t.Fatalf("Authenticate: %v, Extract: %v", err, xerr)
			}
			return
		}
		for _, v := range []string{xkey, query, cookie} {
			if v = strings.TrimSpace(v); v != "" && v != k {
				t.Fatalf("key %q accepted while another source presents %q", k, v)
			}
		}
		if k != strings.TrimSpace(k) {
			t.Fatalf("untrimmed key %q", k)
		}
		if k != "" && !strings.Contains(authz, k) && !strings.Contains(xkey, k) && !strings.Contains(query, k) && !strings.Contains(cookie, k) {
			t.Fatalf("key %q from nowhere", k)
		}
		c, err := a.Authenticate(context.Background(), r)
		if err == nil {
			if k != "right" || c.ID != HashKey("right").ConsumerID() {
				t.Fatalf("accepted %q as %q", k, c.ID)
			}
			return
		}
		var e *Error
		if !errors.As(err, &e) || (e.Status != 401 && e.Status != 403) {
			t.Fatalf("error %v", err)
		}
	})
}

var (
	fuzzJWTOnce sync.Once
	fuzzJWT     *JWT
	fuzzSeeds   map[string]bool
)

// FuzzJWT: the JWT authenticator never panics, refuses with a 401 *Error,
// and accepts only the validly signed seed tokens (no mutation of a token
// keeps its signature valid).
func FuzzJWT(f *testing.F) {
	k := keys(f)
	fuzzJWTOnce.Do(func() {
		var err error
		fuzzJWT, err = NewJWT(JWTOptions{
			Algorithms: []string{"HS256", "RS256", "ES256", "EdDSA"},
			Keys: []JWTKey{SecretKey("h", k.secret), {ID: "r", Key: &k.rsa.PublicKey},
				{ID: "e", Key: &k.p256.PublicKey}, {ID: "d", Key: k.ed.Public()}},
			PolicyClaim: "pol", ConsumerClaim: "user.id", Now: nowFunc,
		})
		if err != nil {
			panic(err)
		}
		fuzzSeeds = map[string]bool{}
		c := claims("", jwt.MapClaims{"user": map[string]any{"id": "u1"}, "pol": []string{"gold"}})
		for _, s := range []string{
			sign(f, jwt.SigningMethodHS256, k.secret, "h", c),
			sign(f, jwt.SigningMethodRS256, k.rsa, "r", c),
			sign(f, jwt.SigningMethodES256, k.p256, "e", c),
			sign(f, jwt.SigningMethodEdDSA, k.ed, "d", c),
		} {
			fuzzSeeds[s] = true
		}
	})
	for s := range fuzzSeeds {
		f.Add(s)
		f.Add(s[:len(s)-2])
		f.Add(strings.Replace(s, ".", "..", 1))
	}
	f.Add("")
	f.Add("a.b.c")
	f.Add("eyJhbGciOiJub25lIn0.e30.")
	f.Add("eyJhbGciOiJIUzI1NiIsImtpZCI6WzFdfQ.e30.AAAA")
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := fuzzJWT.authenticate(context.Background(), tok)
		if err == nil {
			if !fuzzSeeds[tok] {
				t.Fatalf("accepted a token that is not a seed: %q", tok)
			}
			if c.ID != "jwt:u1" || len(c.Policies) != 1 || c.Policies[0] != "gold" {
				t.Fatalf("consumer %+v", c)
			}
			return
		}
		var e *Error
		if !errors.As(err, &e) || e.Status != 401 || e.Kind != ErrInvalidCredentials || len(e.Reason) > 40 {
			t.Fatalf("error %v", err)
		}
	})
}

// FuzzClientIP: the forwarding-header parsers never panic; the result is
// a valid, unmapped, unzoned address; an untrusted peer is always the
// client; Key works whenever Addr does.
func FuzzClientIP(f *testing.F) {
	f.Add("10.0.0.1:443", "203.0.113.9, 10.0.0.2", "", `for="[2001:db8::1]:80";proto=https, for=10.0.0.2`)
	f.Add("10.0.0.1:443", "garbage", "::ffff:198.51.100.1", `for="_x"`)
	f.Add("198.51.100.7:1", "203.0.113.9", "", "for=203.0.113.9")
	f.Add("[::ffff:10.0.0.1]:1", " , ,", "[fe80::1%eth0]:80", `for="\`)
	f.Add("10.0.0.1", "10.0.0.3,10.0.0.4", "", `x="a,b;c";for=unknown`)
	f.Add("@", "", "", "")
	prefixes := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	xff, _ := NewClientIP(ClientIPOptions{TrustedProxies: prefixes, IPv6PrefixLen: 56})
	fwd, _ := NewClientIP(ClientIPOptions{TrustedProxies: prefixes, Header: Forwarded, IPv4PrefixLen: 24})
	f.Fuzz(func(t *testing.T, peer, xff1, xff2, forwarded string) {
		r := &testReq{h: map[string][]string{"X-Forwarded-For": {xff1, xff2}, "Forwarded": {forwarded}}, peer: peer}
		p, perr := PeerAddr(r)
		for _, c := range []*ClientIP{xff, fwd} {
			a, err := c.Addr(r)
			if (err != nil) != (perr != nil) {
				t.Fatalf("Addr error %v, peer error %v", err, perr)
			}
			if err != nil {
				continue
			}
			if !a.IsValid() || a.Zone() != "" || a.Is4In6() {
				t.Fatalf("bad address %v", a)
			}
			if !c.isTrusted(p) && a != p {
				t.Fatalf("untrusted peer %v, client %v", p, a)
			}
			if key, err := c.Key(r); err != nil || key == "" {
				t.Fatalf("Key = %q, %v", key, err)
			}
		}
	})
}

// FuzzCheckJSONFast holds checkJSON's fast path to the encoding/json token
// stream it stands in for: wherever fastJSON answers, scanJSON gives the
// same answer (a repeated member name at any depth, data after the first
// value, exp, nbf or iat out of range, an escaped lone surrogate, or
// none). The lone surrogates inside the first value are found by each
// path its own way (fastJSON's string reader, scanJSON's loneSurrogate);
// those after it by loneSurrogate in both, which TestJWTRawJSON's cases
// check on their own.
func FuzzCheckJSONFast(f *testing.F) {
	for _, s := range []string{
		`{"sub":"alice","exp":1700003600,"nbf":1700000000,"iat":1700000000,"aud":["api"],"user":{"id":42,"org":"acme"}}`,
		`{"alg":"HS256","typ":"JWT","kid":"k1"}`,
		`{"sub":"a","sub":"b"}`,
		`{"a":{"x":1,"y":{"x":2},"x":3}}`,
		`{"a":[{"x":1},{"x":1}]}`,
		`{"exp":1e300}`, `{"exp":-253402300800}`, `{"exp":253402300799.0}`, `{"nbf":1E+3,"iat":-0.5e-3}`,
		`{"a":{"exp":1e300}}`, `{"exp":[1e300]}`, `{"exp":"1e300"}`,
		`{"sub":"a"}{"sub":"b"}`, `{"sub":"a"} x`, `{"sub":"a"}  `, `{"sub":"a"}]`, `1 2`, `"s"`, `[]`, `null`,
		`{"s\u0075b":"a","sub":"b"}`, `{"a":"\ud800","b":"\n\"\\\/"}`, `{"a":"x` + "\x01" + `"}`,
		`{"a":01}`, `{"a":1.}`, `{"a":-}`, `{"a":1e}`, `{"a":tru}`, `{"a":true,"b":false,"c":null}`,
		`{"a":1,}`, `[1,]`, `{,}`, `{"a" 1}`, `{"a":1 "b":2}`, "\t{ \"a\" :\r\n1 }\n",
		`[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]`,
		`{"a":"\ud83d\ude00"}`, `{"a":"\udc00"}`, `{"a":"\ud800\u0041"}`, `{"a":"\ud800\ud800"}`,
		`{"a":"\ud800\"}`, `{"a":"\\ud800"}`, `{"a":"\ud800","a":1}`, `{"exp":1e300,"a":"\udfff"}`,
		`{"a":"\uDBFF\uDFFF"}`, `{"a":"\ud800\u"}`, `{"a":"\ud800\uzzzz"}`,
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, b []byte, claims bool) {
		if !utf8.Valid(b) {
			return // checkJSON refuses it before either scan
		}
		got, ok := fastJSON(b, claims)
		if !ok {
			return
		}
		if want := scanJSON(b, claims); got != want {
			t.Fatalf("%q (claims %v): fast path %q, encoding/json %q", b, claims, got, want)
		}
	})
}
