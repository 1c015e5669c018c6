package config_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/gateway/config"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// keyFiles writes PEM files to a temporary directory: rsa.pem (an RSA
// 2048 public key), weak.pem (RSA 1024), ec.pem (P-256), private.pem (a
// private key), garbage.pem, short.secret (10 bytes) and good.secret (32
// bytes and a newline). It returns the directory.
func keyFiles(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	pub := func(name string, key any) {
		der, err := x509.MarshalPKIXPublicKey(key)
		if err != nil {
			t.Fatal(err)
		}
		write(name, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	}
	rk, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub("rsa.pem", &rk.PublicKey)
	weak, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	pub("weak.pem", &weak.PublicKey)
	ek, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pub("ec.pem", &ek.PublicKey)
	der, err := x509.MarshalPKCS8PrivateKey(ek)
	if err != nil {
		t.Fatal(err)
	}
	write("private.pem", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
	write("garbage.pem", []byte("not a key\n"))
	write("short.secret", []byte("0123456789"))
	write("good.secret", []byte(strings.Repeat("s", 32)+"\n"))
	return dir
}

// TestJWTRefusals checks the exact message for every kind of bad jwt and
// failure_limit section.
func TestJWTRefusals(t *testing.T) {
	dir := keyFiles(t)
	t.Setenv("LP_SHORT", "0123456789")
	t.Setenv("LP_EMPTY", "")
	t.Setenv("LP_GOOD", strings.Repeat("g", 32))
	os.Unsetenv("LP_UNSET")

	// head declares policies p (for API a) and other (for API b only);
	// jwtAPI(settings) is API a with auth: jwt and the given jwt mapping
	// (on line 6).
	const head = "policies:\n  - {id: p, rate: {requests: 5, per: 1s}}\n  - {id: other, rate: {requests: 5, per: 1s}, apis: [b]}\n" +
		"  - {id: free, rate: {requests: -1}}\napis:\n"
	jwtAPI := func(settings string) string {
		return head + "  - {id: a, listen_path: /a/, target: \"builtin:echo\", auth: jwt, jwt: {" + settings + "}}\n" +
			"  - {id: b, listen_path: /b/, target: \"builtin:echo\"}\n"
	}
	const b = "  - {id: b, listen_path: /b/, target: \"builtin:echo\"}\n"
	const pol = ", default_policies: [p]"
	rsaKey := "keys: [{pem_file: " + dir + "/rsa.pem}]"
	// col is the column where settings start on line 6.
	const col = len("  - {id: a, listen_path: /a/, target: \"builtin:echo\", auth: jwt, jwt: {") + 1
	at := func(offset int) string { return "t.yaml:6:" + strconv.Itoa(col+offset) + ": " }

	cases := []struct {
		name, yaml, want string
	}{
		{"algorithms missing", jwtAPI(rsaKey + pol),
			at(-1) + "apis[0].jwt.algorithms: missing (pin the accepted algorithms, like [RS256])"},
		{"unknown algorithm", jwtAPI("algorithms: [RS256, XS256], " + rsaKey + pol),
			at(20) + `apis[0].jwt.algorithms[1]: unknown algorithm "XS256" (want HS256, HS384, HS512, RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512 or EdDSA)`},
		{"alg none", jwtAPI("algorithms: [none], " + rsaKey + pol),
			at(13) + `apis[0].jwt.algorithms[0]: "none" is never accepted: every token must be signed`},
		{"alg None", jwtAPI("algorithms: [RS256, None], " + rsaKey + pol),
			at(20) + `apis[0].jwt.algorithms[1]: "None" is never accepted: every token must be signed`},
		{"algorithm twice", jwtAPI("algorithms: [RS256, RS256], " + rsaKey + pol),
			at(20) + `apis[0].jwt.algorithms[1]: RS256 is listed twice`},
		{"HMAC with a JWKS", jwtAPI("algorithms: [HS256], jwks: {url: \"https://idp.example/jwks\"}" + pol),
			at(13) + `apis[0].jwt.algorithms[0]: HS256 needs a shared secret in keys; a JWKS publishes public keys only`},
		{"keys and jwks", jwtAPI("algorithms: [RS256], " + rsaKey + ", jwks: {url: \"https://idp.example/jwks\"}" + pol),
			at(-1) + `apis[0].jwt: set keys or jwks, not both`},
		{"neither keys nor jwks", jwtAPI("algorithms: [RS256]" + pol),
			at(-1) + `apis[0].jwt: needs keys (pem_file, secret_env or secret_file) or jwks (url)`},
		{"key without a source", jwtAPI("algorithms: [RS256], keys: [{id: k1}]" + pol),
			at(28) + `apis[0].jwt.keys[0]: needs pem_file, secret_env or secret_file`},
		{"key with two sources", jwtAPI("algorithms: [HS256], keys: [{secret_env: LP_GOOD, secret_file: x}]" + pol),
			at(28) + `apis[0].jwt.keys[0]: set one of pem_file, secret_env or secret_file`},
		{"missing secret env var", jwtAPI("algorithms: [HS256], keys: [{secret_env: LP_UNSET}]" + pol),
			at(41) + `apis[0].jwt.keys[0].secret_env: environment variable LP_UNSET is not set`},
		{"empty secret env var", jwtAPI("algorithms: [HS256], keys: [{secret_env: LP_EMPTY}]" + pol),
			at(41) + `apis[0].jwt.keys[0].secret_env: environment variable LP_EMPTY is empty`},
		{"short HMAC secret", jwtAPI("algorithms: [HS256], keys: [{secret_env: LP_SHORT}]" + pol),
			at(41) + `apis[0].jwt.keys[0].secret_env: environment variable LP_SHORT holds 10 bytes; an HMAC secret needs at least 32`},
		{"short HMAC secret file", jwtAPI("algorithms: [HS256], keys: [{secret_file: " + dir + "/short.secret}]" + pol),
			at(42) + `apis[0].jwt.keys[0].secret_file: ` + dir + `/short.secret holds 10 bytes; an HMAC secret needs at least 32`},
		{"unreadable PEM", jwtAPI("algorithms: [RS256], keys: [{pem_file: " + dir + "/missing.pem}]" + pol),
			at(39) + `apis[0].jwt.keys[0].pem_file: cannot read ` + dir + `/missing.pem: no such file or directory`},
		{"PEM is a directory", jwtAPI("algorithms: [RS256], keys: [{pem_file: " + dir + "}]" + pol),
			at(39) + `apis[0].jwt.keys[0].pem_file: cannot read ` + dir + `: not a regular file`},
		{"relative PEM path", jwtAPI("algorithms: [RS256], keys: [{pem_file: missing.pem}]" + pol),
			at(39) + `apis[0].jwt.keys[0].pem_file: cannot read missing.pem: no such file or directory`},
		{"not a PEM file", jwtAPI("algorithms: [RS256], keys: [{pem_file: " + dir + "/garbage.pem}]" + pol),
			at(39) + `apis[0].jwt.keys[0].pem_file: ` + dir + `/garbage.pem: no PEM block found`},
		{"private key PEM", jwtAPI("algorithms: [ES256], keys: [{pem_file: " + dir + "/private.pem}]" + pol),
			at(39) + `apis[0].jwt.keys[0].pem_file: ` + dir + `/private.pem: PEM block "PRIVATE KEY": want PUBLIC KEY, RSA PUBLIC KEY or CERTIFICATE`},
		{"weak RSA key", jwtAPI("algorithms: [RS256], keys: [{id: k1, pem_file: " + dir + "/weak.pem}]" + pol),
			at(47) + `apis[0].jwt.keys[0].pem_file: ` + dir + `/weak.pem: JWT key "k1": RSA key under 2048 bits`},
		{"key fits no algorithm", jwtAPI("algorithms: [RS256, PS256], keys: [{pem_file: " + dir + "/ec.pem}]" + pol),
			at(35) + `apis[0].jwt.keys[0]: an ECDSA P-256 key fits none of the algorithms [RS256, PS256] (it verifies ES256)`},
		{"secret with RSA algorithms", jwtAPI("algorithms: [RS256], keys: [{secret_env: LP_GOOD}]" + pol),
			at(28) + `apis[0].jwt.keys[0]: an HMAC secret fits none of the algorithms [RS256] (it verifies HS256, HS384 or HS512)`},
		{"two keys without ids", jwtAPI("algorithms: [RS256, HS256], keys: [{pem_file: " + dir + "/rsa.pem}, {id: h, secret_env: LP_GOOD}]" + pol),
			at(35) + `apis[0].jwt.keys[0].id: missing (with several keys each needs an id, matched against the token's kid)`},
		{"duplicate key id", jwtAPI("algorithms: [RS256, HS256], keys: [{id: k, pem_file: " + dir + "/rsa.pem}, {id: k, secret_env: LP_GOOD}]" + pol),
			at(len("algorithms: [RS256, HS256], keys: [{id: k, pem_file: "+dir+"/rsa.pem}, {id: ")) + `apis[0].jwt.keys[1].id: duplicate key id "k" (first at apis[0].jwt.keys[0].id on line 6)`},
		{"jwks url missing", jwtAPI("algorithms: [RS256], jwks: {refresh_interval: 1h}" + pol),
			at(27) + `apis[0].jwt.jwks.url: missing (the identity provider's JWK Set, like https://idp.example/.well-known/jwks.json)`},
		{"jwks url plain http", jwtAPI("algorithms: [RS256], jwks: {url: \"http://idp.example/jwks\"}" + pol),
			at(33) + `apis[0].jwt.jwks.url: "http://idp.example/jwks" must be https (plain http only to a loopback address)`},
		{"jwks url not a URL", jwtAPI("algorithms: [RS256], jwks: {url: idp.example}" + pol),
			at(33) + `apis[0].jwt.jwks.url: "idp.example" is not an https:// URL`},
		{"jwks refresh zero", jwtAPI("algorithms: [RS256], jwks: {url: \"https://idp/jwks\", refresh_interval: 0s}" + pol),
			at(71) + `apis[0].jwt.jwks.refresh_interval: 0s must be > 0`},
		{"negative leeway", jwtAPI("algorithms: [RS256], " + rsaKey + ", leeway: -5s" + pol),
			at(len("algorithms: [RS256], "+rsaKey+", leeway: ")) + `apis[0].jwt.leeway: -5s must be >= 0`},
		{"leeway not a duration", jwtAPI("algorithms: [RS256], " + rsaKey + ", leeway: 30" + pol),
			at(len("algorithms: [RS256], "+rsaKey+", leeway: ")) + `apis[0].jwt.leeway: "30" is not a duration (like 30s or 1m)`},
		{"leeway out of range", jwtAPI("algorithms: [RS256], " + rsaKey + ", leeway: 9999999999h" + pol),
			at(len("algorithms: [RS256], "+rsaKey+", leeway: ")) + `apis[0].jwt.leeway: "9999999999h" is out of range (durations go up to 2562047h47m16.854775807s, about 292 years)`},
		{"no policies at all", jwtAPI("algorithms: [RS256], " + rsaKey),
			at(-1) + `apis[0].jwt: needs policy_claim or default_policies (a token without policies would be refused with 403)`},
		{"unknown default policy", jwtAPI("algorithms: [RS256], " + rsaKey + ", default_policies: [p, basic]"),
			at(len("algorithms: [RS256], "+rsaKey+", default_policies: [p, ")) + `apis[0].jwt.default_policies[1]: unknown policy "basic"`},
		{"default policy for another API", jwtAPI("algorithms: [RS256], " + rsaKey + ", default_policies: [other]"),
			at(len("algorithms: [RS256], "+rsaKey+", default_policies: [")) + `apis[0].jwt.default_policies[0]: policy "other" does not cover API "a" (its apis list leaves it out)`},
		{"auth jwt without jwt", head + "  - {id: a, listen_path: /a/, target: \"builtin:echo\", auth: jwt}\n" + b,
			`t.yaml:6:5: apis[0].jwt: missing (auth: jwt needs algorithms, and keys or jwks)`},
		{"jwt on an api_key API", head + "  - {id: a, listen_path: /a/, target: \"builtin:echo\", jwt: {algorithms: [RS256]}}\n" + b,
			`t.yaml:6:60: apis[0].jwt: only used with auth: jwt`},
		{"jwt API with policies", head + "  - {id: a, listen_path: /a/, target: \"builtin:echo\", auth: jwt, policies: [p], jwt: {algorithms: [RS256], " + rsaKey + pol + "}}\n" + b,
			`t.yaml:6:76: apis[0].policies: only keyless APIs take policies; a jwt API takes them from the token's policy claim or jwt.default_policies`},

		// failure_limit, on an api_key API.
		{"failure_limit without policy", head + "  - {id: a, listen_path: /a/, target: \"builtin:echo\", failure_limit: {}}\n" + b,
			`t.yaml:6:70: apis[0].failure_limit.policy: missing (the policy failed attempts are charged to, per client IP)`},
		{"failure_limit unknown policy", head + "  - {id: a, listen_path: /a/, target: \"builtin:echo\", failure_limit: {policy: authfail}}\n" + b,
			`t.yaml:6:79: apis[0].failure_limit.policy: unknown policy "authfail"`},
		{"failure_limit policy with apis", head + "  - {id: a, listen_path: /a/, target: \"builtin:echo\", failure_limit: {policy: other}}\n" + b,
			`t.yaml:6:79: apis[0].failure_limit.policy: policy "other" has an apis list; failures are charged outside any API, so a failure_limit policy must leave apis out`},
		{"failure_limit policy that limits nothing", head + "  - {id: a, listen_path: /a/, target: \"builtin:echo\", failure_limit: {policy: free}}\n" + b,
			`t.yaml:6:79: apis[0].failure_limit.policy: policy "free" limits nothing (give it a rate or a quota)`},
		{"failure_limit on a keyless API", head + "  - {id: a, listen_path: /a/, target: \"builtin:echo\", auth: keyless, policies: [p], failure_limit: {policy: p}}\n" + b,
			`t.yaml:6:100: apis[0].failure_limit: a keyless API asks for no credentials, so no attempt can fail`},
		{"unknown jwt field", jwtAPI("algorithms: [HS256], keys: [{secret: abc}]" + pol),
			at(29) + `apis[0].jwt.keys[0].secret: unknown field (known here: id, pem_file, secret_env, secret_file)`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse("t.yaml", []byte(tc.yaml))
			if err == nil {
				t.Fatalf("Parse accepted it: %+v", cfg)
			}
			if got := err.Error(); got != tc.want {
				t.Errorf("error:\n got: %s\nwant: %s", got, tc.want)
			}
			var errs config.Errors
			if !errors.As(err, &errs) || len(errs) != 1 {
				t.Errorf("error is %T with %d entries, want config.Errors with one", err, len(errs))
			}
		})
	}
}

// TestJWTConfig parses jwt APIs with every setting and checks the options
// handed to identity: keys loaded from a PEM file, an environment variable
// and a file (its final newline dropped), JWKS settings, failure_limit.
func TestJWTConfig(t *testing.T) {
	dir := keyFiles(t)
	t.Setenv("LP_SECRET", strings.Repeat("e", 40))
	doc := `
policies:
  - {id: basic, rate: {requests: 10, per: 1m}}
  - {id: gold, rate: {requests: 100, per: 1m}}
  - {id: authfail, rate: {requests: 5, per: 1m}}
apis:
  - id: echo
    listen_path: /echo/
    target: builtin:echo
    auth: jwt
    jwt:
      algorithms: [RS256, HS256, HS512]
      keys:
        - {id: k1, pem_file: ` + dir + `/rsa.pem}
        - {id: h1, secret_env: LP_SECRET}
        - {id: h2, secret_file: good.secret}
      issuer: https://idp.example/
      audience: [echo, all]
      leeway: 30s
      consumer_claim: user.id
      policy_claim: pol
      default_policies: [basic]
    failure_limit: {policy: authfail}
  - id: ext
    listen_path: /ext/
    target: builtin:echo
    auth: jwt
    jwt:
      algorithms: [ES256]
      jwks: {url: "https://idp.example/.well-known/jwks.json", refresh_interval: 10m}
      policy_claim: plan
  - id: local
    listen_path: /local/
    target: builtin:echo
    auth: jwt
    jwt:
      algorithms: [EdDSA]
      jwks: {url: "http://127.0.0.1:9999/jwks"}
      default_policies: [gold]
`
	cfg, err := config.Parse(filepath.Join(dir, "gw.yaml"), []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	rsaKey, err := identity.LoadJWTKeyPEM("k1", filepath.Join(dir, "rsa.pem"))
	if err != nil {
		t.Fatal(err)
	}
	// What the gateway builds each API's authenticator from.
	type jwtAPI struct {
		route
		JWT          *identity.JWTOptions
		JWKS         *identity.JWKSOptions
		FailureLimit string
	}
	want := []jwtAPI{
		{
			route: route{ID: "echo", ListenPath: "/echo/", Target: spec.BuiltinEcho, Auth: "jwt", StripListenPath: true, StripAuthData: true},
			JWT: &identity.JWTOptions{
				Algorithms: []string{"RS256", "HS256", "HS512"},
				Keys: []identity.JWTKey{rsaKey,
					identity.SecretKey("h1", []byte(strings.Repeat("e", 40))),
					identity.SecretKey("h2", []byte(strings.Repeat("s", 32)))},
				Issuer: "https://idp.example/", Audience: []string{"echo", "all"}, Leeway: 30 * time.Second,
				ConsumerClaim: "user.id", PolicyClaim: "pol", DefaultPolicies: []string{"basic"},
				IDPrefix: `jwt:iss="https://idp.example/":`,
			},
			FailureLimit: "authfail",
		},
		{
			route: route{ID: "ext", ListenPath: "/ext/", Target: spec.BuiltinEcho, Auth: "jwt", StripListenPath: true, StripAuthData: true},
			JWT: &identity.JWTOptions{
				Algorithms: []string{"ES256"}, ConsumerClaim: "sub", PolicyClaim: "plan", IDPrefix: `jwt:api="ext":`,
			},
			JWKS: &identity.JWKSOptions{URL: "https://idp.example/.well-known/jwks.json", RefreshInterval: 10 * time.Minute},
		},
		{
			route: route{ID: "local", ListenPath: "/local/", Target: spec.BuiltinEcho, Auth: "jwt", StripListenPath: true, StripAuthData: true},
			JWT: &identity.JWTOptions{
				Algorithms: []string{"EdDSA"}, ConsumerClaim: "sub", DefaultPolicies: []string{"gold"}, IDPrefix: `jwt:api="local":`,
			},
			JWKS: &identity.JWKSOptions{URL: "http://127.0.0.1:9999/jwks", RefreshInterval: time.Hour},
		},
	}
	var got []jwtAPI
	for _, a := range cfg.Snapshot.APIs {
		o, jwks, err := a.JWT.Options(a.ID, cfg.Resolver)
		if err != nil {
			t.Fatalf("API %s: %v", a.ID, err)
		}
		g := jwtAPI{route: route{a.ID, a.ListenPath, a.Target, a.AuthOrDefault(), a.Policies, a.StripsListenPath(), a.StripsAuthData()}, JWT: &o, JWKS: jwks}
		if a.FailureLimit != nil {
			g.FailureLimit = a.FailureLimit.Policy
		}
		got = append(got, g)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("APIs:\n got %+v\nwant %+v", got, want)
		for i := range want {
			if i < len(got) && !reflect.DeepEqual(got[i].JWT, want[i].JWT) {
				t.Errorf("API %d JWT:\n got %+v\nwant %+v", i, got[i].JWT, want[i].JWT)
			}
		}
	}
	if _, err := identity.NewJWT(*got[0].JWT); err != nil {
		t.Errorf("identity refuses the loaded options: %v", err)
	}
}

// TestRedisConfig checks the Redis settings' defaults and values, and that
// a password from password_env or password_file reaches the client's URL
// but never the banner.
func TestRedisConfig(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "pw"), []byte("from file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("LP_REDIS_PW", "p@ss:word")
	for _, tc := range []struct {
		name, yaml string
		want       config.Redis
		shown      string // RedactedStore
	}{
		{"defaults", "store: redis://cache:6379/2\n",
			config.Redis{URL: "redis://cache:6379/2", Options: redisstore.Options{
				KeyPrefix: "limitplane:", Timeout: 250 * time.Millisecond, Pipeline: redisstore.DefaultPipeline, BreakerFailures: 5, BreakerCooldown: time.Second, InFlightLease: redisstore.DefaultInFlightLease}},
			"redis://cache:6379/2"},
		{"every setting", "store: rediss://app@cache:6380/1?dial_timeout=1s\nredis:\n  timeout: 100ms\n  key_prefix: \"gw:\"\n  pipeline: 64\n" +
			"  breaker_failures: 3\n  breaker_cooldown: 2s\n  in_flight_lease: 5s\n  sync_settle: true\n  password_env: LP_REDIS_PW\n",
			config.Redis{URL: "rediss://app:p%40ss%3Aword@cache:6380/1?dial_timeout=1s", Password: "p@ss:word", Options: redisstore.Options{
				KeyPrefix: "gw:", Timeout: 100 * time.Millisecond, Pipeline: 64, BreakerFailures: 3, BreakerCooldown: 2 * time.Second, InFlightLease: 5 * time.Second, SyncSettle: true}},
			"rediss://app@cache:6380/1?dial_timeout=1s"},
		{"batching off", "store: redis://cache:6379/2\nredis: {pipeline: 0}\n",
			config.Redis{URL: "redis://cache:6379/2", Options: redisstore.Options{
				KeyPrefix: "limitplane:", Timeout: 250 * time.Millisecond, Pipeline: -1, BreakerFailures: 5, BreakerCooldown: time.Second, InFlightLease: redisstore.DefaultInFlightLease}},
			"redis://cache:6379/2"},
		{"breaker off, password file", "store: redis+cluster://n1:7000,n2:7001\nredis: {breaker_failures: 0, password_file: " + dir + "/pw}\n",
			config.Redis{URL: "redis+cluster://:from%20file@n1:7000,n2:7001", Password: "from file", Options: redisstore.Options{
				KeyPrefix: "limitplane:", Timeout: 250 * time.Millisecond, Pipeline: redisstore.DefaultPipeline, BreakerFailures: -1, BreakerCooldown: time.Second, InFlightLease: redisstore.DefaultInFlightLease}},
			"redis+cluster://n1:7000,n2:7001"},
		{"sentinel password", "store: redis+sentinel://mymaster@s1,s2:26380/3\nredis: {password_env: LP_REDIS_PW}\n",
			config.Redis{URL: "redis+sentinel://mymaster@s1,s2:26380/3?password=p%40ss%3Aword", Password: "p@ss:word", Options: redisstore.Options{
				KeyPrefix: "limitplane:", Timeout: 250 * time.Millisecond, Pipeline: redisstore.DefaultPipeline, BreakerFailures: 5, BreakerCooldown: time.Second, InFlightLease: redisstore.DefaultInFlightLease}},
			"redis+sentinel://mymaster@s1,s2:26380/3"},
		{"scheme in upper case", "store: REDIS://Cache:6379/2\n",
			config.Redis{URL: "redis://Cache:6379/2", Options: redisstore.Options{
				KeyPrefix: "limitplane:", Timeout: 250 * time.Millisecond, Pipeline: redisstore.DefaultPipeline, BreakerFailures: 5, BreakerCooldown: time.Second, InFlightLease: redisstore.DefaultInFlightLease}},
			"REDIS://Cache:6379/2"},
		{"cluster scheme in mixed case, password", "store: Redis+Cluster://n1:7000,n2:7001\nredis: {password_env: LP_REDIS_PW}\n",
			config.Redis{URL: "redis+cluster://:p%40ss%3Aword@n1:7000,n2:7001", Password: "p@ss:word", Options: redisstore.Options{
				KeyPrefix: "limitplane:", Timeout: 250 * time.Millisecond, Pipeline: redisstore.DefaultPipeline, BreakerFailures: 5, BreakerCooldown: time.Second, InFlightLease: redisstore.DefaultInFlightLease}},
			"Redis+Cluster://n1:7000,n2:7001"},
		{"unix socket", "store: unix:///run/redis.sock?db=4\n",
			config.Redis{URL: "unix:///run/redis.sock?db=4", Options: redisstore.Options{
				KeyPrefix: "limitplane:", Timeout: 250 * time.Millisecond, Pipeline: redisstore.DefaultPipeline, BreakerFailures: 5, BreakerCooldown: time.Second, InFlightLease: redisstore.DefaultInFlightLease}},
			"unix:///run/redis.sock?db=4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse("t.yaml", []byte(tc.yaml+
				"policies: [{id: w, rate: {requests: 10, per: 1m, algorithm: sliding_window}}]\n"+api))
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Redis == nil || !reflect.DeepEqual(*cfg.Redis, tc.want) {
				t.Errorf("Redis:\n got %+v\nwant %+v", cfg.Redis, tc.want)
			}
			if got := cfg.RedactedStore(); got != tc.shown {
				t.Errorf("RedactedStore() = %q, want %q", got, tc.shown)
			}
		})
	}
}
