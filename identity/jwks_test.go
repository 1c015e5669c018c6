package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// jwk returns the public JWK (RFC 7517, RFC 8037) of pub.
func jwk(t testing.TB, kid, alg string, pub any) map[string]string {
	t.Helper()
	b64 := base64.RawURLEncoding.EncodeToString
	m := map[string]string{"kid": kid}
	if alg != "" {
		m["alg"] = alg
	}
	switch k := pub.(type) {
	case *rsa.PublicKey:
		m["kty"], m["n"], m["e"] = "RSA", b64(k.N.Bytes()), b64(big.NewInt(int64(k.E)).Bytes())
	case *ecdsa.PublicKey:
		e, err := k.ECDH()
		if err != nil {
			t.Fatal(err)
		}
		pt := e.Bytes()[1:] // 0x04 || X || Y
		m["kty"], m["crv"], m["x"], m["y"] = "EC", k.Curve.Params().Name, b64(pt[:len(pt)/2]), b64(pt[len(pt)/2:])
	case ed25519.PublicKey:
		m["kty"], m["crv"], m["x"] = "OKP", "Ed25519", b64(k)
	case []byte:
		m["kty"], m["k"] = "oct", b64(k)
	default:
		t.Fatalf("jwk: %T", pub)
	}
	return m
}

// jwksServer serves a JWK Set that tests swap, counting fetches.
type jwksServer struct {
	*httptest.Server
	mu     sync.Mutex
	body   []byte
	status int
	hits   atomic.Int64
}

func newJWKSServer(t testing.TB, keys ...map[string]string) *jwksServer {
	t.Helper()
	s := &jwksServer{status: 200}
	s.set(t, keys...)
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		s.mu.Lock()
		body, status := s.body, s.status
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write(body)
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *jwksServer) set(t testing.TB, keys ...map[string]string) {
	t.Helper()
	if keys == nil {
		keys = []map[string]string{}
	}
	b, err := json.Marshal(map[string]any{"keys": keys})
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.body = b
	s.mu.Unlock()
}

func mustJWKS(t testing.TB, o JWKSOptions) *JWKS {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s, err := NewJWKS(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestJWKS(t *testing.T) {
	k := keys(t)
	srv := newJWKSServer(t,
		jwk(t, "r1", "RS256", &k.rsa.PublicKey),
		jwk(t, "e1", "", &k.p256.PublicKey),
		jwk(t, "d1", "EdDSA", k.ed.Public()),
		jwk(t, "h1", "HS256", k.secret), // a published secret must never verify anything
		map[string]string{"kid": "enc", "kty": "RSA", "use": "enc", "n": base64.RawURLEncoding.EncodeToString(k.rsa2.N.Bytes()), "e": "AQAB"},
	)
	set := mustJWKS(t, JWKSOptions{URL: srv.URL, UnknownKIDRefresh: -1})
	if n := set.Len(context.Background()); n != 5 {
		t.Fatalf("cached %d keys, want 5", n)
	}
	j := mustJWT(t, JWTOptions{Algorithms: []string{"RS256", "ES256", "EdDSA"}, JWKS: set, Audience: []string{"api"}})
	ok := []struct {
		kid string
		m   jwt.SigningMethod
		key any
	}{{"r1", jwt.SigningMethodRS256, k.rsa}, {"e1", jwt.SigningMethodES256, k.p256}, {"d1", jwt.SigningMethodEdDSA, k.ed}}
	for _, c := range ok {
		cons, err := j.Authenticate(context.Background(), bearer(sign(t, c.m, c.key, c.kid, claims("u-"+c.kid, nil))))
		if err != nil || cons.ID != "jwt:u-"+c.kid {
			t.Fatalf("kid %s: %v %+v", c.kid, err, cons)
		}
	}
	j = mustJWT(t, JWTOptions{Algorithms: []string{"RS256", "PS256", "ES256", "EdDSA"}, JWKS: set})
	bad := map[string]string{
		"unknown kid":                sign(t, jwt.SigningMethodRS256, k.rsa, "nope", claims("x", nil)),
		"no kid, several keys":       sign(t, jwt.SigningMethodRS256, k.rsa, "", claims("x", nil)),
		"kid of an EC key, RS256":    sign(t, jwt.SigningMethodRS256, k.rsa, "e1", claims("x", nil)),
		"JWK alg RS256, token PS256": sign(t, jwt.SigningMethodPS256, k.rsa, "r1", claims("x", nil)),
		"use=enc key":                sign(t, jwt.SigningMethodRS256, k.rsa2, "enc", claims("x", nil)),
	}
	for name, tok := range bad {
		_, err := j.Authenticate(context.Background(), bearer(tok))
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		authErr(t, err, 401, ErrInvalidCredentials, reasonInvalid)
	}
	if hits := srv.hits.Load(); hits != 1 {
		t.Fatalf("%d fetches, want 1 (unknown-kid refresh disabled)", hits)
	}
	// The published HMAC secret: HS256 cannot even be configured with a
	// JWKS, and the key function refuses symmetric keys regardless.
	if _, err := NewJWT(JWTOptions{Algorithms: []string{"HS256"}, JWKS: set}); err == nil {
		t.Fatal("HS256 with a JWKS configured")
	}
	hs := sign(t, jwt.SigningMethodHS256, k.secret, "h1", claims("x", nil))
	tok, _, _ := jwt.NewParser().ParseUnverified(hs, jwt.MapClaims{})
	if _, err := set.key(context.Background(), tok, true); err == nil || !strings.Contains(err.Error(), "symmetric") {
		t.Fatalf("symmetric JWK: %v", err)
	}
}

// TestJWKSSingleKeyNoKID: a token without kid is accepted only when the set
// has exactly one key.
func TestJWKSSingleKeyNoKID(t *testing.T) {
	k := keys(t)
	srv := newJWKSServer(t, jwk(t, "only", "", &k.p256.PublicKey))
	j := mustJWT(t, JWTOptions{Algorithms: []string{"ES256"}, JWKS: mustJWKS(t, JWKSOptions{URL: srv.URL})})
	if c, err := j.Authenticate(context.Background(), bearer(sign(t, jwt.SigningMethodES256, k.p256, "", claims("a", nil)))); err != nil || c.ID != "jwt:a" {
		t.Fatalf("%v %+v", err, c)
	}
}

// TestJWKSRotation: a token naming a new kid triggers one (rate-limited)
// fetch; keys gone from the set stop working.
func TestJWKSRotation(t *testing.T) {
	k := keys(t)
	srv := newJWKSServer(t, jwk(t, "old", "RS256", &k.rsa.PublicKey))
	set := mustJWKS(t, JWKSOptions{URL: srv.URL, UnknownKIDRefresh: time.Hour})
	j := mustJWT(t, JWTOptions{Algorithms: []string{"RS256"}, JWKS: set})
	auth := func(key *rsa.PrivateKey, kid string) error {
		_, err := j.Authenticate(context.Background(), bearer(sign(t, jwt.SigningMethodRS256, key, kid, claims("alice", nil))))
		return err
	}
	if err := auth(k.rsa, "old"); err != nil {
		t.Fatal(err)
	}
	srv.set(t, jwk(t, "new", "RS256", &k.rsa2.PublicKey))
	if err := auth(k.rsa2, "new"); err != nil {
		t.Fatalf("rotated-in key: %v", err)
	}
	if h := srv.hits.Load(); h != 2 {
		t.Fatalf("%d fetches, want 2", h)
	}
	if err := auth(k.rsa, "old"); err == nil {
		t.Fatal("rotated-out key still accepted")
	}
	// Random kids do not make more fetches within UnknownKIDRefresh.
	for i := range 20 {
		if err := auth(k.rsa2, "rand-"+string(rune('a'+i))); err == nil {
			t.Fatal("unknown kid accepted")
		}
	}
	if h := srv.hits.Load(); h != 2 {
		t.Fatalf("%d fetches after unknown kids, want 2", h)
	}
}

// roundTripFunc is an http.RoundTripper from a function.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestJWKSBackgroundRefreshStops: the refresh goroutine picks up new keys;
// stopping the JWKS (Close, or the context given to NewJWKS) while a fetch
// is halfway through its response body is a clean shutdown: OnError hears
// nothing, the cached keys stay, and nothing more is fetched. The server
// stalls mid-body until the client goes away, and the test stops the JWKS
// only once the client holds the response headers, so the fetch is cut
// short mid-body every time.
func TestJWKSBackgroundRefreshStops(t *testing.T) {
	k := keys(t)
	one, err := json.Marshal(map[string]any{"keys": []map[string]string{jwk(t, "a", "", &k.p256.PublicKey)}})
	if err != nil {
		t.Fatal(err)
	}
	two, err := json.Marshal(map[string]any{"keys": []map[string]string{jwk(t, "a", "", &k.p256.PublicKey), jwk(t, "b", "", k.ed.Public())}})
	if err != nil {
		t.Fatal(err)
	}
	for _, stop := range []string{"Close", "context"} {
		t.Run(stop, func(t *testing.T) {
			var (
				mu      sync.Mutex
				phase   int // 0: serve one key; 1: serve two, once; 2: stall halfway
				hits    atomic.Int64
				once    sync.Once
				stalled = make(chan struct{})
			)
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				mu.Lock()
				p := phase
				if p == 1 {
					phase = 2
				}
				mu.Unlock()
				w.Header().Set("Content-Type", "application/json")
				switch p {
				case 0:
					w.Write(one)
				case 1:
					w.Write(two)
				default:
					w.Header().Set("X-Stall", "1")
					w.Write(two[:len(two)/2])
					w.(http.Flusher).Flush()
					<-r.Context().Done() // until the client goes away
				}
			}))
			defer srv.Close()
			client := &http.Client{Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
				resp, err := http.DefaultTransport.RoundTrip(r)
				if err == nil && resp.Header.Get("X-Stall") != "" {
					once.Do(func() { close(stalled) })
				}
				return resp, err
			})}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			errs := make(chan error, 16)
			failed := make(chan struct{}, 16)
			set, err := NewJWKS(ctx, JWKSOptions{URL: srv.URL, Client: client, RefreshInterval: time.Millisecond, UnknownKIDRefresh: -1,
				OnError:     func(err error) { errs <- err },
				fetchFailed: func() { failed <- struct{}{} },
			})
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			phase = 1
			mu.Unlock()
			<-stalled // the fetch after the one that served two keys
			if n := set.Len(context.Background()); n != 2 {
				t.Fatalf("cached %d keys, want 2 (the refresh picked up the new key)", n)
			}
			h := hits.Load()
			if stop == "Close" {
				set.Close()
			} else {
				cancel()
			}
			<-failed // the stalled fetch has ended and been handled
			select {
			case err := <-errs:
				t.Fatalf("stopping reported %v", err)
			default:
			}
			if h2 := hits.Load(); h2 != h {
				t.Fatalf("%d fetches after stop, want none", h2-h)
			}
			if n := set.Len(context.Background()); n != 2 {
				t.Fatalf("cached %d keys after stop, want 2", n)
			}
		})
	}
}

func TestJWKSErrors(t *testing.T) {
	k := keys(t)
	srv := newJWKSServer(t, jwk(t, "a", "", &k.p256.PublicKey))
	srv.mu.Lock()
	srv.status = 500
	srv.mu.Unlock()
	ctx := context.Background()
	if _, err := NewJWKS(ctx, JWKSOptions{URL: srv.URL}); err == nil || !strings.Contains(err.Error(), "500") {
		t.Fatalf("failed first fetch: %v", err)
	}
	// AllowStartWithoutKeys: starts empty, refuses tokens, reports errors.
	var errs atomic.Int64
	set := mustJWKS(t, JWKSOptions{URL: srv.URL, AllowStartWithoutKeys: true, UnknownKIDRefresh: -1, OnError: func(error) { errs.Add(1) }})
	if set.Len(ctx) != 0 || errs.Load() != 1 {
		t.Fatalf("len %d, errors %d", set.Len(ctx), errs.Load())
	}
	j := mustJWT(t, JWTOptions{Algorithms: []string{"ES256"}, JWKS: set})
	_, err := j.Authenticate(ctx, bearer(sign(t, jwt.SigningMethodES256, k.p256, "a", claims("x", nil))))
	authErr(t, err, 401, ErrInvalidCredentials, reasonInvalid)

	big := newJWKSServer(t)
	big.mu.Lock()
	big.body = []byte(`{"keys":[` + strings.Repeat(" ", 4096) + `]}`)
	big.mu.Unlock()
	if _, err := NewJWKS(ctx, JWKSOptions{URL: big.URL, MaxBytes: 1024}); err == nil || !strings.Contains(err.Error(), "too large") {
		t.Fatalf("oversized JWKS: %v", err)
	}
	if _, err := NewJWKS(ctx, JWKSOptions{URL: big.URL}); err != nil {
		t.Fatalf("default MaxBytes: %v", err)
	}

	redirect := httptest.NewServer(http.RedirectHandler(srv.URL, http.StatusFound))
	defer redirect.Close()
	if _, err := NewJWKS(ctx, JWKSOptions{URL: redirect.URL}); err == nil {
		t.Fatal("redirect followed")
	}
	for _, u := range []string{"http://idp.example/jwks", "ftp://127.0.0.1/jwks", "/jwks", "::"} {
		if _, err := NewJWKS(ctx, JWKSOptions{URL: u}); err == nil {
			t.Errorf("URL %q accepted", u)
		}
	}
	if _, err := NewJWKS(ctx, JWKSOptions{URL: srv.URL, Timeout: -1}); err == nil {
		t.Error("negative timeout accepted")
	}
}

// TestJWKSConcurrentUnknownKID: many requests naming a new kid at once
// cause one fetch; the one that fetched is accepted (run with -race).
func TestJWKSConcurrentUnknownKID(t *testing.T) {
	k := keys(t)
	srv := newJWKSServer(t, jwk(t, "old", "", &k.p256.PublicKey))
	j := mustJWT(t, JWTOptions{Algorithms: []string{"EdDSA", "ES256"}, JWKS: mustJWKS(t, JWKSOptions{URL: srv.URL})})
	srv.set(t, jwk(t, "old", "", &k.p256.PublicKey), jwk(t, "new", "", k.ed.Public()))
	tok := sign(t, jwt.SigningMethodEdDSA, k.ed, "new", claims("a", nil))
	var ok atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := j.Authenticate(context.Background(), bearer(tok)); err == nil {
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	if srv.hits.Load() != 2 || ok.Load() < 1 {
		t.Fatalf("fetches %d, accepted %d", srv.hits.Load(), ok.Load())
	}
	if _, err := j.Authenticate(context.Background(), bearer(tok)); err != nil {
		t.Fatalf("after the fetch: %v", err)
	}
}

func TestIsLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"localhost": true, "127.0.0.1": true, "127.8.9.10": true, "::1": true,
		"": false, "10.0.0.1": false, "::": false, "idp.example": false, "localhost.example": false, "[::1]": false,
	} {
		if got := IsLoopbackHost(host); got != want {
			t.Errorf("IsLoopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}
