package identity

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// TestAPIKeyAmbiguous: a request whose key sources disagree, or that
// repeats a header source, is refused with 401 and a reason naming the
// sources; agreeing sources are one key.
func TestAPIKeyAmbiguous(t *testing.T) {
	ks, err := NewKeys([]KeyRecord{{Hash: HashKey("k1"), Policies: []string{"basic"}}, {Hash: HashKey("k2"), Policies: []string{"basic"}}})
	if err != nil {
		t.Fatal(err)
	}
	a := NewAPIKey(ks, APIKeyOptions{Sources: append(DefaultKeySources(), Source{InCookie, "lp_key"})})
	type hdr = [2]string
	for _, tc := range []struct {
		name   string
		hdrs   []hdr
		query  []string // api_key values, in order
		cookie string
		reason string // "" means accepted as k1
	}{
		{"X-API-Key twice", []hdr{{"X-API-Key", "k2"}, {"X-API-Key", "wrong"}}, nil, "", "ambiguous credentials: more than one X-API-Key header"},
		{"X-API-Key twice, reversed", []hdr{{"X-API-Key", "wrong"}, {"X-API-Key", "k2"}}, nil, "", "ambiguous credentials: more than one X-API-Key header"},
		{"X-API-Key twice, same key", []hdr{{"X-API-Key", "k1"}, {"X-API-Key", "k1"}}, nil, "", "ambiguous credentials: more than one X-API-Key header"},
		{"X-API-Key twice, one empty", []hdr{{"X-API-Key", "k1"}, {"X-API-Key", ""}}, nil, "", "ambiguous credentials: more than one X-API-Key header"},
		{"Authorization twice", []hdr{{"Authorization", "Bearer k1"}, {"Authorization", "Bearer k2"}}, nil, "", "ambiguous credentials: more than one Authorization header"},
		{"Authorization and X-API-Key differ", []hdr{{"Authorization", "Bearer k1"}, {"X-API-Key", "k2"}}, nil, "", "ambiguous credentials: Authorization header and X-API-Key header differ"},
		{"X-API-Key and query differ", []hdr{{"X-API-Key", "k1"}}, []string{"k2"}, "", "ambiguous credentials: X-API-Key header and api_key query parameter differ"},
		{"query and cookie differ", nil, []string{"k1"}, "k2", "ambiguous credentials: api_key query parameter and lp_key cookie differ"},
		{"Authorization and X-API-Key agree", []hdr{{"Authorization", "Bearer k1"}, {"X-API-Key", " k1 "}}, nil, "", ""},
		{"every source agrees", []hdr{{"Authorization", "k1"}, {"X-API-Key", "k1"}}, []string{"k1"}, "k1", ""},
		{"api_key twice", nil, []string{"k2", "zzz"}, "", "ambiguous credentials: more than one api_key query parameter"},
		{"api_key twice, reversed", nil, []string{"zzz", "k2"}, "", "ambiguous credentials: more than one api_key query parameter"},
		{"api_key twice, same key", nil, []string{"k1", "k1"}, "", "ambiguous credentials: more than one api_key query parameter"},
		{"api_key twice, one empty", nil, []string{"k1", ""}, "", "ambiguous credentials: more than one api_key query parameter"},
		{"api_key twice and an agreeing header", []hdr{{"X-API-Key", "k1"}}, []string{"k1", "k1"}, "", "ambiguous credentials: more than one api_key query parameter"},
		{"empty Bearer and a key", []hdr{{"Authorization", "Bearer"}, {"X-API-Key", "k1"}}, nil, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newReq("192.0.2.1:1")
			for _, h := range tc.hdrs {
				r.with(h[0], h[1])
			}
			r.q["api_key"] = tc.query
			if tc.cookie != "" {
				r.c["lp_key"] = tc.cookie
			}
			k, xerr := a.Extract(r)
			c, err := a.Authenticate(context.Background(), r)
			if tc.reason == "" {
				if xerr != nil || k != "k1" || err != nil || c.ID != HashKey("k1").ConsumerID() {
					t.Fatalf("Extract = %q, %v; Authenticate = %+v, %v; want k1", k, xerr, c, err)
				}
				return
			}
			if k != "" {
				t.Errorf("Extract returned %q with its error", k)
			}
			authErr(t, xerr, 401, ErrInvalidCredentials, tc.reason)
			authErr(t, err, 401, ErrInvalidCredentials, tc.reason)
		})
	}
}

// TestJWTSources: the Authorization header needs the Bearer scheme (any
// case); a custom header carries the bare token; repeated or disagreeing
// sources are refused like API keys.
func TestJWTSources(t *testing.T) {
	k := keys(t)
	tok := sign(t, jwt.SigningMethodHS256, k.secret, "", claims("alice", nil))
	other := sign(t, jwt.SigningMethodHS256, k.secret, "", claims("bob", nil))
	std := mustJWT(t, JWTOptions{Algorithms: []string{"HS256"}, Keys: []JWTKey{SecretKey("", k.secret)}})
	custom := mustJWT(t, JWTOptions{Algorithms: []string{"HS256"}, Keys: []JWTKey{SecretKey("", k.secret)},
		Sources: []Source{{InHeader, "Authorization"}, {InHeader, "X-Token"}}})
	type hdr = [2]string
	for _, tc := range []struct {
		name   string
		auth   *JWT
		hdrs   []hdr
		reason string // "" means accepted as alice
	}{
		{"Bearer", std, []hdr{{"Authorization", "Bearer " + tok}}, ""},
		{"lower-case bearer", std, []hdr{{"Authorization", "bearer\t" + tok}}, ""},
		{"bare token in Authorization", std, []hdr{{"Authorization", tok}}, "Authorization scheme is not Bearer"},
		{"Basic scheme", std, []hdr{{"Authorization", "Basic YWxpY2U6cHc="}}, "Authorization scheme is not Bearer"},
		{"Bearer glued to the token", std, []hdr{{"Authorization", "Bearer" + tok}}, "Authorization scheme is not Bearer"},
		{"Authorization twice", std, []hdr{{"Authorization", "Bearer " + tok}, {"Authorization", "Bearer " + other}}, "ambiguous credentials: more than one Authorization header"},
		{"Authorization twice, same token", std, []hdr{{"Authorization", "Bearer " + tok}, {"Authorization", "Bearer " + tok}}, "ambiguous credentials: more than one Authorization header"},
		{"bare token in a custom header", custom, []hdr{{"X-Token", tok}}, ""},
		{"custom header twice", custom, []hdr{{"X-Token", tok}, {"X-Token", other}}, "ambiguous credentials: more than one X-Token header"},
		{"Authorization and custom header differ", custom, []hdr{{"Authorization", "Bearer " + tok}, {"X-Token", other}}, "ambiguous credentials: Authorization header and X-Token header differ"},
		{"Authorization and custom header agree", custom, []hdr{{"Authorization", "Bearer " + tok}, {"X-Token", tok}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newReq("192.0.2.1:1")
			for _, h := range tc.hdrs {
				r.with(h[0], h[1])
			}
			c, err := tc.auth.Authenticate(context.Background(), r)
			if tc.reason == "" {
				if err != nil || c.ID != "jwt:alice" {
					t.Fatalf("Authenticate = %+v, %v; want jwt:alice", c, err)
				}
				return
			}
			authErr(t, err, 401, ErrInvalidCredentials, tc.reason)
		})
	}
}

// signRaw signs the given header and claims JSON texts as they are, so a
// test can send JSON that encoding/json would never produce.
func signRaw(t testing.TB, m jwt.SigningMethod, key any, header, payload string) string {
	t.Helper()
	s := base64.RawURLEncoding.EncodeToString([]byte(header)) + "." + base64.RawURLEncoding.EncodeToString([]byte(payload))
	sig, err := m.Sign(s, key)
	if err != nil {
		t.Fatal(err)
	}
	return s + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// TestJWTRawJSON: correctly signed tokens whose header or claims repeat a
// member name (at any depth, however it is escaped), carry data after the
// claims, or hold exp, nbf or iat beyond MaxNumericDate are refused, and
// the store stays empty; the same tokens without the flaw pass.
func TestJWTRawJSON(t *testing.T) {
	k := keys(t)
	j := mustJWT(t, JWTOptions{Algorithms: []string{"RS256"}, Keys: []JWTKey{{ID: "r1", Key: &k.rsa.PublicKey}},
		ConsumerClaim: "user.id", DefaultPolicies: []string{"basic"}})
	const hdr = `{"alg":"RS256","kid":"r1","typ":"JWT"}`
	iat, exp := strconv.FormatInt(testNow.Unix(), 10), strconv.FormatInt(testNow.Add(time.Hour).Unix(), 10)
	body := func(user, dates string) string { return `{"user":` + user + `,` + dates + `}` }
	dates := `"iat":` + iat + `,"exp":` + exp
	for _, tc := range []struct {
		name, header, payload, reason string
	}{
		{"valid", hdr, body(`{"id":"alice"}`, dates), ""},
		{"nested objects and arrays", hdr, body(`{"id":"alice","roles":[{"id":1},{"id":2}],"meta":{"a":[1,[2]],"b":{}}}`, dates), ""},
		{"exp at the largest date", hdr, body(`{"id":"alice"}`, `"iat":`+iat+`,"exp":253402300799`), ""},
		{"duplicate top-level claim", hdr, `{"user":{"id":"alice"},"user":{"id":"bob"},` + dates + `}`, "token repeats a claim"},
		{"duplicate exp", hdr, body(`{"id":"alice"}`, dates+`,"exp":1`), "token repeats a claim"},
		{"duplicate nested claim", hdr, body(`{"id":"alice","id":"bob"}`, dates), "token repeats a claim"},
		{"duplicate deep in an array", hdr, body(`{"id":"alice","x":[{"a":1,"a":2}]}`, dates), "token repeats a claim"},
		{"duplicate spelled with an escape", hdr, body(`{"id":"alice","\u0069d":"bob"}`, dates), "token repeats a claim"},
		{"duplicate header parameter", `{"alg":"RS256","kid":"r1","kid":"r2"}`, body(`{"id":"alice"}`, dates), "invalid token"},
		{"data after the claims", hdr, body(`{"id":"alice"}`, dates) + ` {"user":{"id":"bob"}}`, "invalid token"},
		{"text after the claims", hdr, body(`{"id":"alice"}`, dates) + ` x`, "invalid token"},
		{"a bracket after the claims", hdr, body(`{"id":"alice"}`, dates) + `]`, "invalid token"},
		{"text after the header", hdr + `x`, body(`{"id":"alice"}`, dates), "invalid token"},
		// Beyond what checkJSON's fast path holds (32 levels, 64 names):
		// encoding/json's token stream decides.
		{"duplicate 40 levels deep", hdr, body(`{"id":"alice","n":`+strings.Repeat(`[`, 40)+`{"a":1,"a":2}`+strings.Repeat(`]`, 40)+`}`, dates), "token repeats a claim"},
		{"40 levels deep", hdr, body(`{"id":"alice","n":`+strings.Repeat(`[`, 40)+`{"a":1,"b":2}`+strings.Repeat(`]`, 40)+`}`, dates), ""},
		{"duplicate after 100 claims", hdr, body(`{"id":"alice"}`, dates+manyClaims(100)+`,"c7":0`), "token repeats a claim"},
		{"100 claims", hdr, body(`{"id":"alice"}`, dates+manyClaims(100)), ""},
		{"exp 1e300", hdr, body(`{"id":"alice"}`, `"iat":`+iat+`,"exp":1e300`), "token exp out of range"},
		{"exp 1e400", hdr, body(`{"id":"alice"}`, `"iat":`+iat+`,"exp":1e400`), "token exp out of range"},
		{"exp one past the largest date", hdr, body(`{"id":"alice"}`, `"iat":`+iat+`,"exp":253402300800`), "token exp out of range"},
		{"nbf -1e300", hdr, body(`{"id":"alice"}`, dates+`,"nbf":-1e300`), "token nbf out of range"},
		{"iat 1e19", hdr, body(`{"id":"alice"}`, `"exp":`+exp+`,"iat":1e19`), "token iat out of range"},
		// Claims that are not UTF-8 (RFC 7519 section 7.2): encoding/json
		// reads each bad byte as U+FFFD, so "alice\xff" and "alice\xfe"
		// were one consumer.
		{"consumer claim not UTF-8", hdr, body("{\"id\":\"alice\xff\"}", dates), "token is not UTF-8"},
		{"another claim not UTF-8", hdr, body("{\"id\":\"alice\",\"name\":\"\xc0\"}", dates), "token is not UTF-8"},
		{"header not UTF-8", "{\"alg\":\"RS256\",\"kid\":\"r1\",\"x\":\"\xfe\"}", body(`{"id":"alice"}`, dates), "token is not UTF-8"},
		{"UTF-8 beyond ASCII", hdr, body(`{"id":"alice","name":"Zoë 网"}`, dates), ""},
		// Escaped lone surrogates (RFC 8259 section 7): encoding/json reads
		// each as U+FFFD, so "alice\ud800" and "alice\ufffd" were one
		// consumer. A pair, U+FFFD itself and an escaped backslash before
		// a u are characters.
		{"consumer claim escapes a lone high surrogate", hdr, body(`{"id":"alice\ud800"}`, dates), "token is not UTF-8"},
		{"consumer claim escapes a lone low surrogate", hdr, body(`{"id":"alice\uDC00"}`, dates), "token is not UTF-8"},
		{"high surrogate, then a letter escaped", hdr, body(`{"id":"alice\ud800\u0041"}`, dates), "token is not UTF-8"},
		{"two high surrogates", hdr, body(`{"id":"alice\ud83d\ud83d"}`, dates), "token is not UTF-8"},
		{"a pair reversed", hdr, body(`{"id":"alice\ude00\ud83d"}`, dates), "token is not UTF-8"},
		{"another claim escapes a lone surrogate", hdr, body(`{"id":"alice","name":"\udfff"}`, dates), "token is not UTF-8"},
		{"a member name escapes a lone surrogate", hdr, body(`{"id":"alice","\ud800":1}`, dates), "token is not UTF-8"},
		{"lone surrogate 40 levels deep", hdr, body(`{"id":"alice","n":`+strings.Repeat(`[`, 40)+`"\ud800"`+strings.Repeat(`]`, 40)+`}`, dates), "token is not UTF-8"},
		{"lone surrogate beside a duplicate", hdr, body(`{"id":"alice","id":"\ud800"}`, dates), "token is not UTF-8"},
		{"header escapes a lone surrogate", `{"alg":"RS256","kid":"r1","x":"\ud800"}`, body(`{"id":"alice"}`, dates), "token is not UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng, store, _ := engine(t)
			tok := signRaw(t, jwt.SigningMethodRS256, k.rsa, tc.header, tc.payload)
			c, _, err := serve(context.Background(), j, eng, bearer(tok))
			if tc.reason == "" {
				if err != nil || c.ID != "jwt:alice" {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			authErr(t, err, 401, ErrInvalidCredentials, tc.reason)
			if store.Len() != 0 {
				t.Fatalf("store holds %d keys after a refused token", store.Len())
			}
		})
	}
	// Escapes that are characters name the consumer they spell (IDs
	// beyond printable ASCII are hashed: consumerID).
	for _, tc := range []struct{ name, id, want string }{
		{"a surrogate pair", `alice\ud83d\ude00`, consumerID("jwt:", "alice\U0001F600")},
		{"U+FFFD", `alice\ufffd`, consumerID("jwt:", "alice\ufffd")},
		{"an escaped backslash before u", `alice\\ud800`, `jwt:alice\ud800`},
		{"a pair in upper case", `alice\uD83D\uDE00`, consumerID("jwt:", "alice\U0001F600")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			eng, _, _ := engine(t)
			tok := signRaw(t, jwt.SigningMethodRS256, k.rsa, hdr, body(`{"id":"`+tc.id+`"}`, dates))
			c, _, err := serve(context.Background(), j, eng, bearer(tok))
			if err != nil || c.ID != tc.want {
				t.Fatalf("consumer %+v, %v; want %q", c, err, tc.want)
			}
		})
	}
}

// manyClaims returns `,"c0":0,"c1":0,…` for n claims.
func manyClaims(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(`,"c` + strconv.Itoa(i) + `":0`)
	}
	return b.String()
}

// firstQueryOnly is a Request that is not a QueryValuer: it offers only
// the first value of a query parameter.
type firstQueryOnly struct{ Request }

// TestAPIKeyQueryWithoutQueryValuer: a Request that cannot list a
// parameter's values is read as before, by its first value (so identity
// cannot see the repetition); one that can is refused.
func TestAPIKeyQueryWithoutQueryValuer(t *testing.T) {
	ks, err := NewKeys([]KeyRecord{{Hash: HashKey("k1"), Policies: []string{"basic"}}})
	if err != nil {
		t.Fatal(err)
	}
	a := NewAPIKey(ks, APIKeyOptions{})
	r := newReq("192.0.2.1:1")
	r.q["api_key"] = []string{"k1", "zzz"}
	if _, ok := Request(firstQueryOnly{r}).(QueryValuer); ok {
		t.Fatal("firstQueryOnly is a QueryValuer")
	}
	if k, err := a.Extract(firstQueryOnly{r}); k != "k1" || err != nil {
		t.Errorf("without QueryValues: Extract = %q, %v; want k1", k, err)
	}
	_, err = a.Authenticate(context.Background(), r)
	authErr(t, err, 401, ErrInvalidCredentials, "ambiguous credentials: more than one api_key query parameter")
}

func TestParseKeyHashErrors(t *testing.T) {
	for _, s := range []string{"", "SHA256:ab", "sha256:zz", "sha256:" + strings.Repeat("a", 62),
		"sha256:" + strings.Repeat("a", 65), "sha256:" + strings.Repeat("a", 63) + "g", "sha256:g" + strings.Repeat("a", 63)} {
		want := `identity: key hash "` + s + `": want sha256:<64 hex digits>`
		if _, err := ParseKeyHash(s); err == nil || err.Error() != want {
			t.Errorf("ParseKeyHash(%q): %v, want %s", s, err, want)
		}
	}
}

// TestParseKeyHashDigits: both cases of every hex digit decode as
// encoding/hex decodes them, and String gives the lower-case form back.
func TestParseKeyHashDigits(t *testing.T) {
	for _, hexpart := range []string{
		"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		"0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF",
		"ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff00",
	} {
		h, err := ParseKeyHash("sha256:" + hexpart)
		if err != nil {
			t.Fatalf("ParseKeyHash(%s): %v", hexpart, err)
		}
		want, _ := hex.DecodeString(hexpart)
		if !bytes.Equal(h[:], want) {
			t.Errorf("ParseKeyHash(%s) = %x, want %x", hexpart, h[:], want)
		}
		if got := h.String(); got != "sha256:"+strings.ToLower(hexpart) {
			t.Errorf("String() = %s, want sha256:%s", got, strings.ToLower(hexpart))
		}
	}
}

// TestBearerToken: the Authorization field lines are read as the
// gateway's JWT sources read them: one line, the Bearer scheme in any
// case, the token trimmed; none, an empty one or "Bearer" alone is
// missing; two lines or another scheme are invalid; all 401.
func TestBearerToken(t *testing.T) {
	for _, c := range []struct {
		vals   []string
		token  string
		kind   error
		reason string
	}{
		{[]string{"Bearer abc"}, "abc", nil, ""},
		{[]string{"bearer abc"}, "abc", nil, ""},
		{[]string{"BEARER \t abc  "}, "abc", nil, ""},
		{nil, "", ErrMissingCredentials, "no bearer token in the Authorization header"},
		{[]string{""}, "", ErrMissingCredentials, "no bearer token in the Authorization header"},
		{[]string{"Bearer"}, "", ErrMissingCredentials, "no bearer token in the Authorization header"},
		{[]string{"Bearer abc", "Bearer abc"}, "", ErrInvalidCredentials, "ambiguous credentials: more than one Authorization header"},
		{[]string{"Basic abc"}, "", ErrInvalidCredentials, reasonNotBearer},
		{[]string{"Bearerabc"}, "", ErrInvalidCredentials, reasonNotBearer},
		{[]string{"abc"}, "", ErrInvalidCredentials, reasonNotBearer},
	} {
		tok, err := BearerToken(c.vals)
		if c.kind == nil {
			if err != nil || tok != c.token {
				t.Errorf("BearerToken(%q) = %q, %v; want %q", c.vals, tok, err, c.token)
			}
			continue
		}
		e, ok := err.(*Error)
		if tok != "" || !ok || e.Status != 401 || e.Kind != c.kind || e.Reason != c.reason {
			t.Errorf("BearerToken(%q) = %q, %#v; want 401 %v %q", c.vals, tok, err, c.kind, c.reason)
		}
	}
}

// TestAPIKeyNilKeys: an authenticator over a nil registry refuses every
// key (403) and a request without one (401); it once panicked on the
// first request.
func TestAPIKeyNilKeys(t *testing.T) {
	a := NewAPIKey(nil, APIKeyOptions{})
	_, err := a.Authenticate(context.Background(), newReq("192.0.2.1:1").with("X-API-Key", "k1"))
	authErr(t, err, 403, ErrInvalidCredentials, "unknown API key")
	_, err = a.Authenticate(context.Background(), newReq("192.0.2.1:1"))
	authErr(t, err, 401, ErrMissingCredentials, "no API key")
}
