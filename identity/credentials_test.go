package identity

import (
	"context"
	"testing"

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
		query  string
		cookie string
		reason string // "" means accepted as k1
	}{
		{"X-API-Key twice", []hdr{{"X-API-Key", "k2"}, {"X-API-Key", "wrong"}}, "", "", "ambiguous credentials: more than one X-API-Key header"},
		{"X-API-Key twice, reversed", []hdr{{"X-API-Key", "wrong"}, {"X-API-Key", "k2"}}, "", "", "ambiguous credentials: more than one X-API-Key header"},
		{"X-API-Key twice, same key", []hdr{{"X-API-Key", "k1"}, {"X-API-Key", "k1"}}, "", "", "ambiguous credentials: more than one X-API-Key header"},
		{"X-API-Key twice, one empty", []hdr{{"X-API-Key", "k1"}, {"X-API-Key", ""}}, "", "", "ambiguous credentials: more than one X-API-Key header"},
		{"Authorization twice", []hdr{{"Authorization", "Bearer k1"}, {"Authorization", "Bearer k2"}}, "", "", "ambiguous credentials: more than one Authorization header"},
		{"Authorization and X-API-Key differ", []hdr{{"Authorization", "Bearer k1"}, {"X-API-Key", "k2"}}, "", "", "ambiguous credentials: Authorization header and X-API-Key header differ"},
		{"X-API-Key and query differ", []hdr{{"X-API-Key", "k1"}}, "k2", "", "ambiguous credentials: X-API-Key header and api_key query parameter differ"},
		{"query and cookie differ", nil, "k1", "k2", "ambiguous credentials: api_key query parameter and lp_key cookie differ"},
		{"Authorization and X-API-Key agree", []hdr{{"Authorization", "Bearer k1"}, {"X-API-Key", " k1 "}}, "", "", ""},
		{"every source agrees", []hdr{{"Authorization", "k1"}, {"X-API-Key", "k1"}}, "k1", "k1", ""},
		{"empty Bearer and a key", []hdr{{"Authorization", "Bearer"}, {"X-API-Key", "k1"}}, "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newReq("192.0.2.1:1")
			for _, h := range tc.hdrs {
				r.with(h[0], h[1])
			}
			if tc.query != "" {
				r.q.Set("api_key", tc.query)
			}
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
