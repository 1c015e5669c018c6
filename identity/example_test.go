package identity_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/limitplane/limitplane/adapters/nethttp"
	"github.com/limitplane/limitplane/identity"
)

// A JWT authenticator pinned to HS256, charging tokens to their "sub" and
// taking policies from the "pol" claim.
func ExampleNewJWT() {
	secret := []byte("an HMAC secret of at least 32 bytes!")
	auth, err := identity.NewJWT(identity.JWTOptions{
		Algorithms:      []string{"HS256"},
		Keys:            []identity.JWTKey{identity.SecretKey("", secret)},
		Issuer:          "https://issuer.example",
		Leeway:          30 * time.Second,
		PolicyClaim:     "pol",
		DefaultPolicies: []string{"basic"},
	})
	if err != nil {
		panic(err)
	}
	tok, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{
		"sub": "alice", "iss": "https://issuer.example", "pol": "gold",
		"exp": time.Now().Add(time.Hour).Unix(),
	}).SignedString(secret)

	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("Authorization", "Bearer "+tok)
	c, err := auth.Authenticate(context.Background(), nethttp.Request{R: r})
	fmt.Println(c.ID, c.Policies, err)

	r.Header.Set("Authorization", "Bearer "+tok[:len(tok)-4]+"AAAA")
	_, err = auth.Authenticate(context.Background(), nethttp.Request{R: r})
	fmt.Println(err)
	// Output:
	// jwt:alice [gold] <nil>
	// invalid credentials: invalid token
}

// Behind a load balancer at 10.0.0.0/8, the client is the rightmost
// X-Forwarded-For address that is not a proxy; what the client wrote to
// the left of it is ignored.
func ExampleClientIP() {
	proxies, _ := identity.ParseTrustedProxies([]string{"10.0.0.0/8"})
	cip, _ := identity.NewClientIP(identity.ClientIPOptions{TrustedProxies: proxies})

	r := httptest.NewRequest("GET", "/", nil)
	r.RemoteAddr = "10.0.0.7:51000"
	r.Header.Add("X-Forwarded-For", "1.2.3.4, 203.0.113.9")
	r.Header.Add("X-Forwarded-For", "10.0.0.3")
	k, _ := cip.Key(nethttp.Request{R: r})
	fmt.Println(k)

	r.RemoteAddr = "[2001:db8:1:2::99]:443" // not a proxy: its /64 is the client
	k, _ = cip.Key(nethttp.Request{R: r})
	fmt.Println(k)
	// Output:
	// 203.0.113.9
	// 2001:db8:1:2::/64
}
