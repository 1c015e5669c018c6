package identity

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

func mustJWT(t testing.TB, o JWTOptions) *JWT {
	t.Helper()
	if o.Now == nil {
		o.Now = nowFunc
	}
	j, err := NewJWT(o)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func bearer(tok string) *testReq {
	return newReq("192.0.2.1:1234").with("Authorization", "Bearer "+tok)
}

// TestJWTAlgorithmFamilies signs a token with every supported algorithm and
// checks it is charged to its sub.
func TestJWTAlgorithmFamilies(t *testing.T) {
	k := keys(t)
	cases := []struct {
		alg  string
		m    jwt.SigningMethod
		sign any
		pub  any
	}{
		{"HS256", jwt.SigningMethodHS256, k.secret, k.secret},
		{"HS384", jwt.SigningMethodHS384, k.secret, k.secret},
		{"HS512", jwt.SigningMethodHS512, k.secret, k.secret},
		{"RS256", jwt.SigningMethodRS256, k.rsa, &k.rsa.PublicKey},
		{"RS384", jwt.SigningMethodRS384, k.rsa, &k.rsa.PublicKey},
		{"RS512", jwt.SigningMethodRS512, k.rsa, &k.rsa.PublicKey},
		{"PS256", jwt.SigningMethodPS256, k.rsa, &k.rsa.PublicKey},
		{"PS384", jwt.SigningMethodPS384, k.rsa, &k.rsa.PublicKey},
		{"PS512", jwt.SigningMethodPS512, k.rsa, &k.rsa.PublicKey},
		{"ES256", jwt.SigningMethodES256, k.p256, &k.p256.PublicKey},
		{"ES384", jwt.SigningMethodES384, k.p384, &k.p384.PublicKey},
		{"ES512", jwt.SigningMethodES512, k.p5, &k.p5.PublicKey},
		{"EdDSA", jwt.SigningMethodEdDSA, k.ed, k.ed.Public()},
	}
	for _, c := range cases {
		t.Run(c.alg, func(t *testing.T) {
			eng, store, _ := engine(t)
			j := mustJWT(t, JWTOptions{Algorithms: []string{c.alg}, Keys: []JWTKey{{Key: c.pub}}, DefaultPolicies: []string{"basic"}})
			tok := sign(t, c.m, c.sign, "", claims("user-"+c.alg, nil))
			cons, d, err := serve(context.Background(), j, eng, bearer(tok))
			if err != nil {
				t.Fatal(err)
			}
			if cons.ID != "jwt:user-"+c.alg || !reflect.DeepEqual(cons.Policies, []string{"basic"}) {
				t.Fatalf("consumer = %+v", cons)
			}
			if !d.Allowed || d.Remaining != 1 || d.Policy != "basic" || store.Len() != 1 {
				t.Fatalf("decision = %+v, store len %d", d, store.Len())
			}
		})
	}
}

// TestJWTRefused: each bad token gets a 401 *Error and charges nobody.
func TestJWTRefused(t *testing.T) {
	k := keys(t)
	rsaPEM := pubPEM(t, &k.rsa.PublicKey)
	base := JWTOptions{
		Algorithms:      []string{"RS256", "ES256"},
		Keys:            []JWTKey{{ID: "r1", Key: &k.rsa.PublicKey}, {ID: "e1", Key: &k.p256.PublicKey}},
		Issuer:          "https://issuer.example",
		Audience:        []string{"api", "api2"},
		Leeway:          30 * time.Second,
		PolicyClaim:     "pol",
		DefaultPolicies: []string{"basic"},
	}
	strict := mustJWT(t, base)
	mixed := base
	mixed.Algorithms = []string{"HS256", "RS256", "ES256"}
	mixedJ := mustJWT(t, mixed)

	singleO := base
	singleO.Keys = base.Keys[:1]
	single := mustJWT(t, singleO)

	rs := func(kid string, extra jwt.MapClaims) string {
		return sign(t, jwt.SigningMethodRS256, k.rsa, kid, extra)
	}
	valid := rs("r1", claims("alice", nil))
	none := func() string {
		tok := jwt.NewWithClaims(jwt.SigningMethodNone, claims("alice", nil))
		tok.Header["kid"] = "r1"
		s, err := tok.SignedString(jwt.UnsafeAllowNoneSignatureType)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}()
	hsWithPEM := sign(t, jwt.SigningMethodHS256, rsaPEM, "r1", claims("alice", nil))
	crit := func() string {
		tok := jwt.NewWithClaims(jwt.SigningMethodRS256, claims("alice", nil))
		tok.Header["kid"], tok.Header["crit"] = "r1", []string{"exp"}
		s, _ := tok.SignedString(k.rsa)
		return s
	}()
	numKID := func() string {
		tok := jwt.NewWithClaims(jwt.SigningMethodRS256, claims("alice", nil))
		tok.Header["kid"] = 1
		s, _ := tok.SignedString(k.rsa)
		return s
	}()
	parts := strings.Split(valid, ".")
	tampered := parts[0] + "." + base64.RawURLEncoding.EncodeToString([]byte(`{"sub":"mallory","exp":1900000000,"iss":"https://issuer.example","aud":"api"}`)) + "." + parts[2]
	big := rs("r1", claims("alice", jwt.MapClaims{"pad": strings.Repeat("x", 16<<10)}))

	cases := []struct {
		name   string
		auth   *JWT
		tok    string
		kind   error
		reason string
	}{
		{"alg none", strict, none, ErrInvalidCredentials, reasonInvalid},
		{"alg none, unsigned with dot", strict, strings.TrimSuffix(none, ".") + ".", ErrInvalidCredentials, reasonInvalid},
		{"HS256 signed with the RSA public key PEM", strict, hsWithPEM, ErrInvalidCredentials, reasonInvalid},
		{"HS256 allowed, but kid names the RSA key", mixedJ, hsWithPEM, ErrInvalidCredentials, reasonInvalid},
		{"RS256 with kid naming the ECDSA key", strict, rs("e1", claims("alice", nil)), ErrInvalidCredentials, reasonInvalid},
		{"no exp", strict, rs("r1", claims("alice", jwt.MapClaims{"exp": nil})), ErrInvalidCredentials, reasonMissing + ": exp"},
		{"exp 0", strict, rs("r1", claims("alice", jwt.MapClaims{"exp": 0})), ErrInvalidCredentials, reasonExpired},
		{"expired beyond leeway", strict, rs("r1", claims("alice", jwt.MapClaims{"exp": testNow.Add(-31 * time.Second).Unix()})), ErrInvalidCredentials, reasonExpired},
		{"exp not a number", strict, rs("r1", claims("alice", jwt.MapClaims{"exp": "tomorrow"})), ErrInvalidCredentials, reasonInvalid},
		{"nbf in the future", strict, rs("r1", claims("alice", jwt.MapClaims{"nbf": testNow.Add(31 * time.Second).Unix()})), ErrInvalidCredentials, reasonNotYet},
		{"iat in the future", strict, rs("r1", claims("alice", jwt.MapClaims{"iat": testNow.Add(time.Hour).Unix()})), ErrInvalidCredentials, reasonNotYet},
		{"wrong iss", strict, rs("r1", claims("alice", jwt.MapClaims{"iss": "https://evil.example"})), ErrInvalidCredentials, reasonIssuer},
		{"no iss", strict, rs("r1", claims("alice", jwt.MapClaims{"iss": nil})), ErrInvalidCredentials, reasonMissing + ": iss"},
		{"empty iss", strict, rs("r1", claims("alice", jwt.MapClaims{"iss": ""})), ErrInvalidCredentials, reasonMissing + ": iss"},
		{"wrong aud", strict, rs("r1", claims("alice", jwt.MapClaims{"aud": []string{"other", "x"}})), ErrInvalidCredentials, reasonAudience},
		{"no aud", strict, rs("r1", claims("alice", jwt.MapClaims{"aud": nil})), ErrInvalidCredentials, reasonMissing + ": aud"},
		{"empty aud", strict, rs("r1", claims("alice", jwt.MapClaims{"aud": []string{}})), ErrInvalidCredentials, reasonMissing + ": aud"},
		{"no exp and no iss", strict, rs("r1", claims("alice", jwt.MapClaims{"exp": nil, "iss": nil})), ErrInvalidCredentials, reasonMissing + ": exp"},
		{"unknown kid", strict, rs("zz", claims("alice", nil)), ErrInvalidCredentials, reasonInvalid},
		{"lone key with ID, other kid", single, rs("r2", claims("alice", nil)), ErrInvalidCredentials, reasonInvalid},
		{"no kid with two keys", strict, rs("", claims("alice", nil)), ErrInvalidCredentials, reasonInvalid},
		{"numeric kid", strict, numKID, ErrInvalidCredentials, reasonInvalid},
		{"crit header", strict, crit, ErrInvalidCredentials, reasonInvalid},
		{"signed by another RSA key", strict, sign(t, jwt.SigningMethodRS256, k.rsa2, "r1", claims("alice", nil)), ErrInvalidCredentials, reasonInvalid},
		{"tampered payload", strict, tampered, ErrInvalidCredentials, reasonInvalid},
		{"no sub", strict, rs("r1", claims("alice", jwt.MapClaims{"sub": nil})), ErrInvalidCredentials, reasonNoSubject},
		{"empty sub", strict, rs("r1", claims("", nil)), ErrInvalidCredentials, reasonNoSubject},
		{"sub is an object", strict, rs("r1", claims("x", jwt.MapClaims{"sub": map[string]any{"id": "a"}})), ErrInvalidCredentials, reasonNoSubject},
		{"policy claim a number", strict, rs("r1", claims("alice", jwt.MapClaims{"pol": 7})), ErrInvalidCredentials, reasonPolicies},
		{"policy claim array of numbers", strict, rs("r1", claims("alice", jwt.MapClaims{"pol": []any{"gold", 7}})), ErrInvalidCredentials, reasonPolicies},
		{"policy claim too many", strict, rs("r1", claims("alice", jwt.MapClaims{"pol": make([]string, 33)})), ErrInvalidCredentials, reasonPolicies},
		{"garbage", strict, "not-a-token", ErrInvalidCredentials, reasonInvalid},
		{"3 dots", strict, "a.b.c.d", ErrInvalidCredentials, reasonInvalid},
		{"valid token plus a segment", strict, valid + ".x", ErrInvalidCredentials, reasonInvalid},
		{"two dots only", strict, "..", ErrInvalidCredentials, reasonInvalid},
		{"padded base64", strict, parts[0] + "=." + parts[1] + "." + parts[2], ErrInvalidCredentials, reasonInvalid},
		{"JWE-like 5 segments", strict, "a.b.c.d.e", ErrInvalidCredentials, reasonInvalid},
		{"16 KB token", strict, big, ErrInvalidCredentials, reasonTooLarge},
		{"16 KB garbage", strict, strings.Repeat("A", 16<<10), ErrInvalidCredentials, reasonTooLarge},
		{"empty", strict, "", ErrMissingCredentials, "no token"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			eng, store, _ := engine(t)
			_, _, err := serve(context.Background(), c.auth, eng, bearer(c.tok))
			authErr(t, err, 401, c.kind, c.reason)
			if store.Len() != 0 {
				t.Fatalf("store holds %d keys after a refused token", store.Len())
			}
		})
	}
	for _, kid := range []string{"r1", ""} {
		if c, err := single.Authenticate(context.Background(), bearer(rs(kid, claims("alice", nil)))); err != nil || c.ID != "jwt:alice" {
			t.Fatalf("lone key, kid %q: %v", kid, err)
		}
	}
	// The big token is refused for its size alone: it is otherwise valid.
	if len(big) <= DefaultMaxTokenSize {
		t.Fatalf("big token is %d bytes", len(big))
	}
	loose := base
	loose.MaxTokenSize = 32 << 10
	if _, err := mustJWT(t, loose).Authenticate(context.Background(), bearer(big)); err != nil {
		t.Fatalf("big token with MaxTokenSize 32 KiB: %v", err)
	}
}

func TestJWTMissingCredentials(t *testing.T) {
	j := mustJWT(t, JWTOptions{Algorithms: []string{"HS256"}, Keys: []JWTKey{SecretKey("", keys(t).secret)}})
	for _, r := range []*testReq{
		newReq("192.0.2.1:1"),
		newReq("192.0.2.1:1").with("Authorization", "Bearer"),
		newReq("192.0.2.1:1").with("Authorization", "bearer   "),
		newReq("192.0.2.1:1").with("Authorization", "  "),
	} {
		_, err := j.Authenticate(context.Background(), r)
		authErr(t, err, 401, ErrMissingCredentials, "no token")
	}
}

// TestJWTAccepted covers leeway, consumer claim paths, ID hashing and the
// policy claim.
func TestJWTAccepted(t *testing.T) {
	k := keys(t)
	hs := func(c jwt.MapClaims) string { return sign(t, jwt.SigningMethodHS256, k.secret, "", c) }
	hashed := func(v string) string {
		h := sha256.Sum256([]byte(v))
		return "jwt:~" + hex.EncodeToString(h[:16])
	}
	base := JWTOptions{Algorithms: []string{"HS256"}, Keys: []JWTKey{SecretKey("", k.secret)},
		Leeway: 30 * time.Second, PolicyClaim: "ext.plan", DefaultPolicies: []string{"basic"}}
	nested := base
	nested.ConsumerClaim = "user.id"
	dotted := base
	dotted.ConsumerClaim = "https://example.com/uid"
	dotted.PolicyClaim = "https://example.com/plans"
	noexp := base
	noexp.AllowNoExpiry = true
	prefixed := base
	prefixed.IDPrefix = "idp1:"
	long := strings.Repeat("u", 129)

	cases := []struct {
		name string
		o    JWTOptions
		tok  string
		id   string
		pols []string
	}{
		{"sub", base, hs(claims("alice", nil)), "jwt:alice", []string{"basic"}},
		{"expired within leeway", base, hs(claims("alice", jwt.MapClaims{"exp": testNow.Add(-29 * time.Second).Unix()})), "jwt:alice", []string{"basic"}},
		{"nbf within leeway", base, hs(claims("alice", jwt.MapClaims{"nbf": testNow.Add(29 * time.Second).Unix()})), "jwt:alice", []string{"basic"}},
		{"no exp allowed", noexp, hs(claims("alice", jwt.MapClaims{"exp": nil})), "jwt:alice", []string{"basic"}},
		{"numeric sub", base, hs(claims("x", jwt.MapClaims{"sub": 12345678901234567})), "jwt:12345678901234567", []string{"basic"}},
		{"128-byte sub kept", base, hs(claims(long[:128], nil)), "jwt:" + long[:128], []string{"basic"}},
		{"129-byte sub hashed", base, hs(claims(long, nil)), hashed(long), []string{"basic"}},
		{"sub with a space hashed", base, hs(claims("a b", nil)), hashed("a b"), []string{"basic"}},
		{"non-ASCII sub hashed", base, hs(claims("zoë", nil)), hashed("zoë"), []string{"basic"}},
		{"sub starting with ~ hashed", base, hs(claims("~abc", nil)), hashed("~abc"), []string{"basic"}},
		{"nested consumer claim", nested, hs(claims("ignored", jwt.MapClaims{"user": map[string]any{"id": "u-7"}})), "jwt:u-7", []string{"basic"}},
		{"dotted top-level claim", dotted, hs(claims("ignored", jwt.MapClaims{"https://example.com/uid": "u-8", "https://example.com/plans": []string{"gold", "basic"}})), "jwt:u-8", []string{"gold", "basic"}},
		{"policy string", base, hs(claims("bob", jwt.MapClaims{"ext": map[string]any{"plan": "gold"}})), "jwt:bob", []string{"gold"}},
		{"policy array", base, hs(claims("bob", jwt.MapClaims{"ext": map[string]any{"plan": []string{"gold", "basic"}}})), "jwt:bob", []string{"gold", "basic"}},
		{"policy empty string: defaults", base, hs(claims("bob", jwt.MapClaims{"ext": map[string]any{"plan": ""}})), "jwt:bob", []string{"basic"}},
		{"policy empty array: defaults", base, hs(claims("bob", jwt.MapClaims{"ext": map[string]any{"plan": []string{}}})), "jwt:bob", []string{"basic"}},
		{"policy null: defaults", base, hs(claims("bob", jwt.MapClaims{"ext": map[string]any{"plan": nil}})), "jwt:bob", []string{"basic"}},
		{"ID prefix", prefixed, hs(claims("alice", nil)), "idp1:alice", []string{"basic"}},
		{"kid ignored for a lone key without ID", base, sign(t, jwt.SigningMethodHS256, k.secret, "whatever", claims("alice", nil)), "jwt:alice", []string{"basic"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cons, err := mustJWT(t, c.o).Authenticate(context.Background(), bearer(c.tok))
			if err != nil {
				t.Fatal(err)
			}
			if cons.ID != c.id || !reflect.DeepEqual(cons.Policies, c.pols) {
				t.Fatalf("consumer = {%q %q}, want {%q %q}", cons.ID, cons.Policies, c.id, c.pols)
			}
		})
	}
}

// TestJWTSameSubShares: two different tokens with the same sub are one
// consumer; a policy claim picks a bigger limit.
func TestJWTSameSubShares(t *testing.T) {
	k := keys(t)
	eng, store, _ := engine(t)
	j := mustJWT(t, JWTOptions{Algorithms: []string{"ES256"}, Keys: []JWTKey{{Key: &k.p256.PublicKey}},
		PolicyClaim: "pol", DefaultPolicies: []string{"basic"}})
	t1 := sign(t, jwt.SigningMethodES256, k.p256, "", claims("alice", jwt.MapClaims{"jti": "1"}))
	t2 := sign(t, jwt.SigningMethodES256, k.p256, "", claims("alice", jwt.MapClaims{"jti": "2", "exp": testNow.Add(2 * time.Hour).Unix()}))
	gold := sign(t, jwt.SigningMethodES256, k.p256, "", claims("bob", jwt.MapClaims{"pol": "gold"}))
	var got []bool
	for _, tok := range []string{t1, t2, t1, t2} {
		_, d, err := serve(context.Background(), j, eng, bearer(tok))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, d.Allowed)
	}
	if want := []bool{true, true, false, false}; !reflect.DeepEqual(got, want) {
		t.Fatalf("alice allowed = %v, want %v", got, want)
	}
	got = nil
	for range 6 {
		_, d, _ := serve(context.Background(), j, eng, bearer(gold))
		got = append(got, d.Allowed)
	}
	if want := []bool{true, true, true, true, true, false}; !reflect.DeepEqual(got, want) {
		t.Fatalf("bob (gold) allowed = %v, want %v", got, want)
	}
	if store.Len() != 2 {
		t.Fatalf("store len = %d, want 2", store.Len())
	}
}

func TestNewJWTErrors(t *testing.T) {
	k := keys(t)
	jwks := &JWKS{}
	small, _ := rsa.GenerateKey(rand.Reader, 1024)
	p224, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	cases := []struct {
		name string
		o    JWTOptions
		want string
	}{
		{"no algorithms", JWTOptions{Keys: []JWTKey{SecretKey("", k.secret)}}, "no algorithms"},
		{"none", JWTOptions{Algorithms: []string{"none"}, Keys: []JWTKey{SecretKey("", k.secret)}}, `unsupported algorithm "none"`},
		{"lower-case alg", JWTOptions{Algorithms: []string{"hs256"}, Keys: []JWTKey{SecretKey("", k.secret)}}, `unsupported algorithm "hs256"`},
		{"no keys", JWTOptions{Algorithms: []string{"RS256"}}, "exactly one of Keys and JWKS"},
		{"keys and JWKS", JWTOptions{Algorithms: []string{"RS256"}, Keys: []JWTKey{{Key: &k.rsa.PublicKey}}, JWKS: jwks}, "exactly one of Keys and JWKS"},
		{"HMAC with JWKS", JWTOptions{Algorithms: []string{"HS256"}, JWKS: jwks}, "HS256 needs a shared secret"},
		{"short secret", JWTOptions{Algorithms: []string{"HS256"}, Keys: []JWTKey{SecretKey("", []byte("short"))}}, "HMAC secret of 5 bytes"},
		{"small RSA", JWTOptions{Algorithms: []string{"RS256"}, Keys: []JWTKey{{Key: &small.PublicKey}}}, "RSA key under 2048 bits"},
		{"P-224", JWTOptions{Algorithms: []string{"ES256"}, Keys: []JWTKey{{Key: &p224.PublicKey}}}, "ECDSA curve"},
		{"private key", JWTOptions{Algorithms: []string{"RS256"}, Keys: []JWTKey{{Key: k.rsa}}}, "unsupported key type *rsa.PrivateKey"},
		{"key fits no algorithm", JWTOptions{Algorithms: []string{"RS256"}, Keys: []JWTKey{SecretKey("", k.secret)}}, "fits none of the algorithms"},
		{"P-384 key for ES256", JWTOptions{Algorithms: []string{"ES256"}, Keys: []JWTKey{{Key: &k.p384.PublicKey}}}, "fits none of the algorithms"},
		{"two keys, one without ID", JWTOptions{Algorithms: []string{"RS256"}, Keys: []JWTKey{{ID: "a", Key: &k.rsa.PublicKey}, {Key: &k.rsa2.PublicKey}}}, "every key needs an ID"},
		{"duplicate ID", JWTOptions{Algorithms: []string{"RS256"}, Keys: []JWTKey{{ID: "a", Key: &k.rsa.PublicKey}, {ID: "a", Key: &k.rsa2.PublicKey}}}, `duplicate key ID "a"`},
		{"negative leeway", JWTOptions{Algorithms: []string{"HS256"}, Keys: []JWTKey{SecretKey("", k.secret)}, Leeway: -1}, "negative leeway"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewJWT(c.o)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to contain %q", err, c.want)
			}
		})
	}
}

// TestNewJWTCopiesSecret: changing the caller's slice later changes nothing.
func TestNewJWTCopiesSecret(t *testing.T) {
	secret := append([]byte(nil), keys(t).secret...)
	j := mustJWT(t, JWTOptions{Algorithms: []string{"HS256"}, Keys: []JWTKey{{Key: secret}}})
	tok := sign(t, jwt.SigningMethodHS256, keys(t).secret, "", claims("alice", nil))
	secret[0] ^= 0xff
	if _, err := j.Authenticate(context.Background(), bearer(tok)); err != nil {
		t.Fatal(err)
	}
}

func TestJWTKeyPEM(t *testing.T) {
	k := keys(t)
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "issuer"},
		NotBefore: testNow.Add(-time.Hour), NotAfter: testNow.Add(time.Hour)}
	certDER, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.p256.PublicKey, k.p256)
	if err != nil {
		t.Fatal(err)
	}
	privDER, _ := x509.MarshalPKCS8PrivateKey(k.rsa)
	files := map[string]string{
		"rsa":   write("rsa.pem", pubPEM(t, &k.rsa.PublicKey)),
		"pkcs1": write("pkcs1.pem", pem.EncodeToMemory(&pem.Block{Type: "RSA PUBLIC KEY", Bytes: x509.MarshalPKCS1PublicKey(&k.rsa2.PublicKey)})),
		"ed":    write("ed.pem", pubPEM(t, k.ed.Public())),
		"cert":  write("cert.pem", pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certDER})),
	}
	var ks []JWTKey
	for _, id := range []string{"rsa", "pkcs1", "ed", "cert"} {
		key, err := LoadJWTKeyPEM(id, files[id])
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		ks = append(ks, key)
	}
	j := mustJWT(t, JWTOptions{Algorithms: []string{"RS256", "EdDSA", "ES256"}, Keys: ks})
	for _, c := range []struct {
		kid string
		m   jwt.SigningMethod
		key any
	}{{"rsa", jwt.SigningMethodRS256, k.rsa}, {"pkcs1", jwt.SigningMethodRS256, k.rsa2}, {"ed", jwt.SigningMethodEdDSA, k.ed}, {"cert", jwt.SigningMethodES256, k.p256}} {
		cons, err := j.Authenticate(context.Background(), bearer(sign(t, c.m, c.key, c.kid, claims("kid-"+c.kid, nil))))
		if err != nil || cons.ID != "jwt:kid-"+c.kid {
			t.Fatalf("kid %s: %v %+v", c.kid, err, cons)
		}
	}
	// rsa2's token under kid "rsa" (rsa's key) fails.
	_, err = j.Authenticate(context.Background(), bearer(sign(t, jwt.SigningMethodRS256, k.rsa2, "rsa", claims("x", nil))))
	authErr(t, err, 401, ErrInvalidCredentials, reasonInvalid)

	for name, data := range map[string][]byte{
		"private key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: privDER}),
		"no PEM":      []byte("hello"),
		"bad DER":     pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte{1, 2, 3}}),
	} {
		if _, err := ParseJWTKeyPEM(name, data); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := LoadJWTKeyPEM("x", filepath.Join(dir, "missing.pem")); err == nil {
		t.Error("missing file: no error")
	}
}

func TestJWTCustomSources(t *testing.T) {
	k := keys(t)
	j := mustJWT(t, JWTOptions{Algorithms: []string{"HS256"}, Keys: []JWTKey{SecretKey("", k.secret)},
		Sources: []Source{{InCookie, "session"}, {InQuery, "access_token"}}})
	tok := sign(t, jwt.SigningMethodHS256, k.secret, "", claims("alice", nil))
	r := newReq("192.0.2.1:1")
	r.q.Set("access_token", tok)
	if c, err := j.Authenticate(context.Background(), r); err != nil || c.ID != "jwt:alice" {
		t.Fatalf("query: %v %+v", err, c)
	}
	r = newReq("192.0.2.1:1").with("Authorization", "Bearer "+tok) // not a configured source
	_, err := j.Authenticate(context.Background(), r)
	authErr(t, err, 401, ErrMissingCredentials, "no token")
	r = newReq("192.0.2.1:1")
	r.c["session"] = tok
	if c, err := j.Authenticate(context.Background(), r); err != nil || c.ID != "jwt:alice" {
		t.Fatalf("cookie: %v %+v", err, c)
	}
}

// TestJWTUnknownPolicyCreatesNoState: a policy claim naming a policy the
// engine lacks fails in the engine and stores nothing.
func TestJWTUnknownPolicyCreatesNoState(t *testing.T) {
	k := keys(t)
	eng, store, _ := engine(t)
	j := mustJWT(t, JWTOptions{Algorithms: []string{"HS256"}, Keys: []JWTKey{SecretKey("", k.secret)}, PolicyClaim: "pol"})
	_, _, err := serve(context.Background(), j, eng, bearer(sign(t, jwt.SigningMethodHS256, k.secret, "", claims("alice", jwt.MapClaims{"pol": "platinum"}))))
	if err == nil || !strings.Contains(err.Error(), `unknown policy "platinum"`) || store.Len() != 0 {
		t.Fatalf("err = %v, store len %d", err, store.Len())
	}
}

// TestJWTConcurrent: one authenticator, many goroutines (run with -race).
func TestJWTConcurrent(t *testing.T) {
	k := keys(t)
	j := mustJWT(t, JWTOptions{Algorithms: []string{"HS256", "ES256"}, Keys: []JWTKey{SecretKey("h", k.secret), {ID: "e", Key: &k.p256.PublicKey}}})
	good := []string{
		sign(t, jwt.SigningMethodHS256, k.secret, "h", claims("a", nil)),
		sign(t, jwt.SigningMethodES256, k.p256, "e", claims("b", nil)),
	}
	bad := sign(t, jwt.SigningMethodHS256, k.secret, "e", claims("c", nil))
	done := make(chan error, 16)
	for g := range 16 {
		go func() {
			for i := range 50 {
				want := []string{"jwt:a", "jwt:b"}[(g+i)%2]
				c, err := j.Authenticate(context.Background(), bearer(good[(g+i)%2]))
				if err != nil || c.ID != want {
					done <- err
					return
				}
				if _, err := j.Authenticate(context.Background(), bearer(bad)); err == nil {
					done <- errKey
					return
				}
			}
			done <- nil
		}()
	}
	for range 16 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
