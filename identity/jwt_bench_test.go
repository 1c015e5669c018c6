package identity

import (
	"context"
	"testing"

	"github.com/golang-jwt/jwt/v5"
)

// BenchmarkJWTAuthenticate measures Authenticate of a valid token in its
// Authorization header (issuer, audience, exp, nbf and iat checked; the
// consumer from sub), for an HMAC, an ECDSA and an RSA key.
func BenchmarkJWTAuthenticate(b *testing.B) {
	k := keys(b)
	for _, c := range []struct {
		name string
		m    jwt.SigningMethod
		sign any
		key  JWTKey
	}{
		{"HS256", jwt.SigningMethodHS256, k.secret, SecretKey("", k.secret)},
		{"ES256", jwt.SigningMethodES256, k.p256, JWTKey{Key: &k.p256.PublicKey}},
		{"RS256", jwt.SigningMethodRS256, k.rsa, JWTKey{Key: &k.rsa.PublicKey}},
	} {
		b.Run(c.name, func(b *testing.B) {
			j, err := NewJWT(JWTOptions{Algorithms: []string{c.m.Alg()}, Keys: []JWTKey{c.key}, Issuer: "https://issuer.example", Audience: []string{"api"}, Now: nowFunc})
			if err != nil {
				b.Fatal(err)
			}
			r := newReq("192.0.2.1:1234").with("Authorization", "Bearer "+sign(b, c.m, c.sign, "", claims("alice", nil)))
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if cons, err := j.Authenticate(ctx, r); err != nil || cons.ID != "jwt:alice" {
					b.Fatal(cons, err)
				}
			}
		})
	}
}

// BenchmarkCheckJSON measures the checks Authenticate makes on a token's
// header and claims before golang-jwt parses them (checkJSON).
func BenchmarkCheckJSON(b *testing.B) {
	k := keys(b)
	tok := sign(b, jwt.SigningMethodHS256, k.secret, "key-1", claims("alice", jwt.MapClaims{"scope": "read write", "roles": []string{"a", "b"}, "user": map[string]any{"id": 42, "org": "acme"}}))
	b.ReportAllocs()
	for b.Loop() {
		if r := checkJSON(tok); r != "" {
			b.Fatal(r)
		}
	}
}
