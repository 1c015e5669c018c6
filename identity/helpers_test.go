package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/http"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
)

// testReq is an in-memory Request.
type testReq struct {
	h    http.Header
	q    url.Values
	c    map[string]string
	peer string
}

func newReq(peer string) *testReq {
	return &testReq{h: http.Header{}, q: url.Values{}, c: map[string]string{}, peer: peer}
}

func (r *testReq) with(name, value string) *testReq { r.h.Add(name, value); return r }

func (r *testReq) Header(name string) string         { return r.h.Get(name) }
func (r *testReq) HeaderValues(name string) []string { return r.h.Values(name) }
func (r *testReq) Query(name string) string          { return r.q.Get(name) }
func (r *testReq) QueryValues(name string) []string  { return r.q[name] }
func (r *testReq) Cookie(name string) string         { return r.c[name] }
func (r *testReq) RemoteAddr() string                { return r.peer }

// testNow is the frozen wall clock of the JWT tests.
var testNow = time.Unix(1_700_000_000, 0)

func nowFunc() time.Time { return testNow }

// testKeys holds the private keys generated once per test binary.
type testKeyset struct {
	rsa            *rsa.PrivateKey
	rsa2           *rsa.PrivateKey
	p256, p384, p5 *ecdsa.PrivateKey
	ed             ed25519.PrivateKey
	secret         []byte
}

var (
	keysOnce sync.Once
	tk       testKeyset
)

func keys(t testing.TB) *testKeyset {
	t.Helper()
	keysOnce.Do(func() {
		must := func(err error) {
			if err != nil {
				panic(err)
			}
		}
		var err error
		tk.rsa, err = rsa.GenerateKey(rand.Reader, 2048)
		must(err)
		tk.rsa2, err = rsa.GenerateKey(rand.Reader, 2048)
		must(err)
		tk.p256, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		must(err)
		tk.p384, err = ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
		must(err)
		tk.p5, err = ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
		must(err)
		_, tk.ed, err = ed25519.GenerateKey(rand.Reader)
		must(err)
		tk.secret = []byte("0123456789abcdef0123456789abcdef-hmac-secret-of-48b")
	})
	return &tk
}

// pubPEM returns the PKIX "PUBLIC KEY" PEM of a public key.
func pubPEM(t testing.TB, pub any) []byte {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

// sign signs claims with method and key, setting kid when not "".
func sign(t testing.TB, m jwt.SigningMethod, key any, kid string, claims jwt.MapClaims) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, claims)
	if kid != "" {
		tok.Header["kid"] = kid
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// claims returns a valid claim set for sub at testNow, with extra merged in
// (a nil value deletes the claim).
func claims(sub string, extra jwt.MapClaims) jwt.MapClaims {
	c := jwt.MapClaims{
		"sub": sub,
		"iss": "https://issuer.example",
		"aud": "api",
		"iat": testNow.Unix(),
		"nbf": testNow.Unix(),
		"exp": testNow.Add(time.Hour).Unix(),
	}
	for k, v := range extra {
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
	}
	return c
}

// engine returns an engine over a fresh memory store with policies:
// "basic" 2/min, "gold" 5/min, "authfail" 3/min (burst = rate).
func engine(t testing.TB) (*core.Engine, *memory.Store, *core.ManualClock) {
	t.Helper()
	clock := core.NewManualClock(int64(time.Hour))
	store := memory.New(memory.Options{Clock: clock})
	eng, err := core.NewEngine(store, core.Config{Policies: []core.Policy{
		{ID: "basic", Rate: core.PerMinute(2)},
		{ID: "gold", Rate: core.PerMinute(5)},
		{ID: "authfail", Rate: core.PerMinute(3)},
	}}, core.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return eng, store, clock
}

// serve is what every adapter does: authenticate, then (only on success)
// decide.
func serve(ctx context.Context, auth Authenticator, l core.Decider, r Request) (*core.Consumer, core.Decision, error) {
	c, err := auth.Authenticate(ctx, r)
	if err != nil {
		return nil, core.Decision{}, err
	}
	d, err := l.Decide(ctx, c, "", 1)
	return c, d, err
}

// authErr asserts err is a *Error with the given status, kind and reason.
func authErr(t testing.TB, err error, status int, kind error, reason string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T), want *identity.Error", err, err)
	}
	if e.Status != status || e.Kind != kind || e.Reason != reason || !errors.Is(err, kind) {
		t.Fatalf("error = {%d %v %q}, want {%d %v %q}", e.Status, e.Kind, e.Reason, status, kind, reason)
	}
}
