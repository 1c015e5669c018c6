package spec_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io/fs"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

func ptr[T any](v T) *T { return &v }

// full returns a valid snapshot that sets every field at least once.
func full() spec.Snapshot {
	exp := time.Date(2027, 1, 31, 0, 0, 0, 0, time.UTC)
	return spec.Snapshot{
		Revision: 42,
		Policies: []spec.Policy{
			{ID: "default", Rate: &spec.Rate{Requests: 5, Per: spec.Duration(time.Minute), Burst: 5}, Quota: &spec.Quota{Max: 100, Renewal: spec.Duration(24 * time.Hour)}, Distributed: true},
			{ID: "gold", Rate: &spec.Rate{Requests: -1}, Quota: &spec.Quota{Max: 10000, Renewal: spec.Duration(24 * time.Hour)}, APIs: []string{"echo", "tokens"}, Shadow: true},
			{ID: "anon", Rate: &spec.Rate{Requests: 10, Per: spec.Duration(time.Minute), Algorithm: "sliding_window"}},
			{ID: "logins", Rate: &spec.Rate{Requests: 3, Per: spec.Duration(time.Minute)}},
		},
		Keys: []spec.Key{
			{KeyHash: identity.HashKey("demo-key-1").String(), Policies: []string{"default"}, Expires: &exp},
			{KeyHash: identity.HashKey("demo-key-2").String(), Policies: []string{"gold"}, Inactive: true, QuotaEpoch: 3,
				APILimits: map[string]spec.Limits{"echo": {Rate: &spec.Rate{Requests: 1, Per: spec.Duration(time.Second)}, Quota: &spec.Quota{Max: -1}, QuotaEpoch: 5}}},
		},
		APIs: []spec.API{
			{ID: "echo", ListenPath: "/echo/", Target: spec.BuiltinEcho, Auth: spec.AuthAPIKey, StripListenPath: ptr(false), StripAuthData: ptr(true),
				FailureLimit: &spec.FailureLimit{Policy: "logins"}, Tags: []string{"eu", "edge"}},
			{ID: "open", ListenPath: "/open/", Target: "https://upstream.example/v1", Auth: spec.AuthKeyless, Policies: []string{"anon"}},
			{ID: "tokens", ListenPath: "/tokens/", Target: spec.BuiltinEcho, Auth: spec.AuthJWT, JWT: &spec.JWT{
				Algorithms: []string{"HS256"}, Keys: []spec.JWTKey{{ID: "a", SecretEnv: "JWT_A"}, {ID: "b", SecretFile: "b.secret"}},
				Issuer: "https://idp.example", Audience: []string{"gw"}, Leeway: spec.Duration(30 * time.Second),
				ConsumerClaim: "user.id", PolicyClaim: "pol", DefaultPolicies: []string{"gold"}}},
			{ID: "idp", ListenPath: "/idp/", Target: spec.BuiltinEcho, Auth: spec.AuthJWT, JWT: &spec.JWT{
				Algorithms: []string{"RS256"}, JWKS: &spec.JWKS{URL: "https://idp.example/jwks.json", RefreshInterval: spec.Duration(time.Hour)},
				PolicyClaim: "pol"}},
		},
	}
}

func TestFullSnapshotIsValid(t *testing.T) {
	s := full()
	if err := s.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
}

func TestJSONRoundTrip(t *testing.T) {
	in := full()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out spec.Snapshot
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("round trip changed the snapshot:\n in: %+v\nout: %+v\njson: %s", in, out, b)
	}
}

func TestJSONForm(t *testing.T) {
	s := spec.Snapshot{
		Revision: 7,
		Policies: []spec.Policy{
			{ID: "p", Rate: &spec.Rate{Requests: 5, Per: spec.Duration(time.Minute)}, Quota: &spec.Quota{Max: -1}, Distributed: true},
		},
		Keys: []spec.Key{{KeyHash: "sha256:" + strings.Repeat("ab", 32), Policies: []string{"p"},
			Expires: ptr(time.Date(2027, 1, 31, 0, 0, 0, 0, time.UTC))}},
		APIs: []spec.API{{ID: "a", ListenPath: "/a/", Target: spec.BuiltinEcho, Tags: []string{"eu"}}},
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"revision":7,` +
		`"policies":[{"id":"p","rate":{"requests":5,"per":"1m0s"},"quota":{"max":-1},"distributed":true}],` +
		`"keys":[{"key_hash":"sha256:` + strings.Repeat("ab", 32) + `","policies":["p"],"expires":"2027-01-31T00:00:00Z"}],` +
		`"apis":[{"id":"a","listen_path":"/a/","target":"builtin:echo","tags":["eu"]}]}`
	if string(b) != want {
		t.Fatalf("JSON:\n got %s\nwant %s", b, want)
	}
}

func TestDurationJSON(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  string
	}{
		{in: `"1m"`, want: time.Minute},
		{in: `"24h"`, want: 24 * time.Hour},
		{in: `"1.5s"`, want: 1500 * time.Millisecond},
		// A bare number has no unit: refused, not read as nanoseconds.
		{in: `1000`, err: `json: cannot unmarshal number 1000 into Go value of type spec.Duration`},
		{in: `3600`, err: `json: cannot unmarshal number 3600 into Go value of type spec.Duration`},
		{in: `"soon"`, err: `json: cannot unmarshal string "soon" (not a duration) into Go value of type spec.Duration`},
		{in: `"3000000h"`, err: `json: cannot unmarshal string "3000000h" (out of range) into Go value of type spec.Duration`},
		{in: `true`, err: `json: cannot unmarshal bool into Go value of type spec.Duration`},
	} {
		var d spec.Duration
		err := json.Unmarshal([]byte(tc.in), &d)
		switch {
		case tc.err != "" && (err == nil || err.Error() != tc.err):
			t.Errorf("%s: error %v, want %q", tc.in, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%s: %v", tc.in, err)
		case tc.err == "" && time.Duration(d) != tc.want:
			t.Errorf("%s: %v, want %v", tc.in, time.Duration(d), tc.want)
		}
	}
}

func TestValidateReportsEveryProblemWithItsPath(t *testing.T) {
	s := spec.Snapshot{
		Policies: []spec.Policy{
			{ID: "p", Rate: &spec.Rate{Requests: 5}},
			{ID: "p", Quota: &spec.Quota{Max: 0, Renewal: spec.Duration(time.Hour)}},
			{ID: "", Rate: &spec.Rate{Requests: 2, Per: spec.Duration(time.Second), Burst: 3, Algorithm: "fixed_window"}},
			{ID: "q", APIs: []string{"nope"}},
			{ID: "fast", Rate: &spec.Rate{Requests: 2, Per: 1}},
			{ID: "both", Rate: &spec.Rate{Requests: -5, Per: spec.Duration(-time.Minute)}, Quota: &spec.Quota{Max: 0, Renewal: spec.Duration(-time.Hour)}},
			{ID: "global", Quota: &spec.Quota{Max: -3, Renewal: spec.Duration(time.Hour), Global: &spec.GlobalQuota{Mode: "bogus", Floor: -1, LeaseDuration: spec.Duration(2 * time.Hour)}}},
		},
		Keys: []spec.Key{
			{KeyHash: "sha256:zz", Policies: []string{"missing"}},
			{KeyHash: identity.HashKey("k").String()},
			{KeyHash: identity.HashKey("k").String(), Policies: []string{"p"},
				APILimits: map[string]spec.Limits{"open": {}, "ghost": {Rate: &spec.Rate{Requests: 1, Per: spec.Duration(time.Second)}}}},
		},
		APIs: []spec.API{
			{ID: "a", ListenPath: "/a/", Target: "ftp://x", FailureLimit: &spec.FailureLimit{Policy: "q"}},
			{ID: "a", ListenPath: "/a", Target: spec.BuiltinEcho, Auth: "basic"},
			{ID: "open", ListenPath: "/o//", Target: "http://user:pw@h/", Auth: spec.AuthKeyless, StripAuthData: ptr(false), Tags: []string{"eu", "eu", ""}},
			{ID: "j", ListenPath: "/j/", Target: spec.BuiltinEcho, Auth: spec.AuthJWT, JWT: &spec.JWT{
				Algorithms: []string{"none", "HS256", "HS256"},
				Keys:       []spec.JWTKey{{SecretEnv: "A", SecretFile: "b"}, {Secret: "short"}},
				Leeway:     spec.Duration(-time.Second)}},
		},
	}
	err := s.Validate()
	var errs spec.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Validate = %v, want spec.Errors", err)
	}
	want := []string{
		"policies[0].rate.per: missing (the period, like 1s, 1m or 24h)",
		`policies[1].id: duplicate policy id "p" (first at policies[0].id)`,
		"policies[1].quota.max: 0 must be > 0 (or -1 for unlimited)",
		"policies[2].id: missing",
		"policies[2].rate.burst: fixed_window has no burst (it counts up to requests per per); leave burst out",
		"policies[4].rate: rate 2 per 1ns is finer than one event per nanosecond",
		"policies[5].rate.requests: -5 must be > 0 (or -1 for unlimited)",
		"policies[5].rate.per: -1m0s must be > 0",
		"policies[5].quota.max: 0 must be > 0 (or -1 for unlimited)",
		"policies[5].quota.renewal: -1h0m0s must be > 0",
		"policies[6].quota.max: -3 must be > 0 (or -1 for unlimited)",
		`policies[6].quota.global.mode: "bogus" is not a mode (strict, reserved or optimistic)`,
		"policies[6].quota.global.floor: -1 must be ≥ 0",
		`apis[0].target: "ftp://x" is not builtin:echo or an http:// or https:// URL`,
		`apis[0].failure_limit.policy: policy "q" has an apis list; failures are charged outside any API, so a failure_limit policy must leave apis out`,
		`apis[1].id: duplicate API id "a" (first at apis[0].id)`,
		`apis[1].listen_path: "/a" is the same path as apis[0].listen_path`,
		`apis[1].auth: unknown auth "basic" (want api_key, keyless or jwt)`,
		`apis[2].listen_path: "/o//" is not a clean path (want "/o/")`,
		`apis[2].target: "http://user:pw@h/" must not carry credentials`,
		"apis[2].strip_auth_data: a keyless API reads no credentials, so there are none to strip",
		"apis[2].policies: a keyless API needs at least one policy (applied per client IP)",
		`apis[2].tags[1]: tag "eu" is listed twice`,
		"apis[2].tags[2]: empty tag",
		`apis[3].jwt.algorithms[0]: "none" is never accepted: every token must be signed`,
		"apis[3].jwt.algorithms[2]: HS256 is listed twice",
		"apis[3].jwt.keys[0]: set one of pem_file, secret_env or secret_file",
		"apis[3].jwt.keys[0].id: missing (with several keys each needs an id, matched against the token's kid)",
		"apis[3].jwt.keys[1].secret: the inline secret holds 5 bytes; an HMAC secret needs at least 32",
		"apis[3].jwt.keys[1].id: missing (with several keys each needs an id, matched against the token's kid)",
		"apis[3].jwt.leeway: -1s must be >= 0",
		"apis[3].jwt: needs policy_claim or default_policies (a token without policies would be refused with 403)",
		`policies[3].apis[0]: unknown API "nope"`,
		`keys[0].key_hash: "sha256:zz" is not sha256:<64 hex digits>`,
		`keys[0].policies[0]: unknown policy "missing"`,
		"keys[1].policies: a key needs at least one policy (or api_limits)",
		"keys[2].key_hash: same key as keys[1]",
		`keys[2].api_limits.ghost: unknown API "ghost"`,
		`keys[2].api_limits.open: API "open" is keyless; api_limits only apply to api_key APIs`,
		"keys[2].api_limits.open: needs rate or quota",
	}
	got := make([]string, len(errs))
	for i, e := range errs {
		got[i] = e.Path + ": " + e.Problem
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if first := errs[0].Error(); first != "spec: policies[0].rate.per: missing (the period, like 1s, 1m or 24h)" {
		t.Fatalf("Error() = %q", first)
	}
}

func TestConversionsKeepAbsentAndUnlimitedApart(t *testing.T) {
	s := full()
	got := s.CorePolicies()
	want := []core.Policy{
		{ID: "default", Rate: core.Limit{Rate: 5, Period: time.Minute, Burst: 5}, Quota: core.Quota{Max: 100, Renewal: 24 * time.Hour}, Distributed: true},
		{ID: "gold", Rate: core.Limit{Rate: core.Unlimited}, Quota: core.Quota{Max: 10000, Renewal: 24 * time.Hour}, APIs: []string{"echo", "tokens"}, Shadow: true},
		{ID: "anon", Rate: core.Limit{Rate: 10, Period: time.Minute, Algorithm: core.SlidingWindow}},
		{ID: "logins", Rate: core.Limit{Rate: 3, Period: time.Minute}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("CorePolicies:\n got %+v\nwant %+v", got, want)
	}
	recs, err := s.KeyRecords()
	if err != nil {
		t.Fatal(err)
	}
	if recs[0].Hash != identity.HashKey("demo-key-1") || !recs[0].Expires.Equal(time.Date(2027, 1, 31, 0, 0, 0, 0, time.UTC)) || recs[0].Inactive || recs[0].QuotaEpoch != 0 {
		t.Fatalf("record 0: %+v", recs[0])
	}
	wantLimits := map[string]core.Limits{"echo": {Rate: core.Limit{Rate: 1, Period: time.Second}, Quota: core.Quota{Max: core.Unlimited}, QuotaEpoch: 5}}
	if !recs[1].Inactive || !reflect.DeepEqual(recs[1].APILimits, wantLimits) || !recs[1].Expires.IsZero() || recs[1].QuotaEpoch != 3 {
		t.Fatalf("record 1: %+v", recs[1])
	}
	bad := spec.Snapshot{Keys: []spec.Key{{KeyHash: "sha256:00"}}}
	if _, err := bad.KeyRecords(); err == nil || !strings.HasPrefix(err.Error(), `spec: keys[0]: spec: key_hash "sha256:00": `) {
		t.Fatalf("KeyRecords on a bad hash: %v", err)
	}
}

func TestAPIDefaults(t *testing.T) {
	keyless := spec.API{Auth: spec.AuthKeyless}
	plain := spec.API{}
	if keyless.StripsAuthData() || !plain.StripsAuthData() || !plain.StripsListenPath() || plain.AuthOrDefault() != spec.AuthAPIKey {
		t.Fatalf("defaults: keyless strips auth %v, api_key strips auth %v, strips path %v, auth %q",
			keyless.StripsAuthData(), plain.StripsAuthData(), plain.StripsListenPath(), plain.AuthOrDefault())
	}
	no := spec.API{StripListenPath: ptr(false), StripAuthData: ptr(false)}
	if no.StripsAuthData() || no.StripsListenPath() {
		t.Fatal("explicit false ignored")
	}
}

// resolver is a Resolver over maps, standing in for a gateway's files and
// environment.
type resolver struct {
	files map[string][]byte
	env   map[string]string
}

func (r resolver) ReadFile(name string) ([]byte, error) {
	b, ok := r.files[name]
	if !ok {
		return nil, &fs.PathError{Op: "open", Path: name, Err: fs.ErrNotExist}
	}
	return b, nil
}

func (r resolver) LookupEnv(name string) (string, bool) {
	v, ok := r.env[name]
	return v, ok
}

func TestJWTOptionsResolveReferences(t *testing.T) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&priv.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	pemData := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	secret := strings.Repeat("s", 32)
	r := resolver{
		files: map[string][]byte{"ec.pem": pemData, "hs.secret": []byte(secret + "\n"), "empty": []byte("\n")},
		env:   map[string]string{"HS": secret, "SHORT": "abc", "EMPTY": ""},
	}

	j := &spec.JWT{Algorithms: []string{"HS256", "ES256"}, Issuer: "iss", PolicyClaim: "pol", Keys: []spec.JWTKey{
		{ID: "env", SecretEnv: "HS"}, {ID: "file", SecretFile: "hs.secret"}, {ID: "ec", PEMFile: "ec.pem"},
		{ID: "inline", Secret: secret}, {ID: "pem", PEM: string(pemData)},
	}}
	o, jwks, err := j.Options("tokens", r)
	if err != nil || jwks != nil {
		t.Fatalf("Options: %v, jwks %v", err, jwks)
	}
	if o.IDPrefix != `jwt:iss="iss":` || o.ConsumerClaim != "sub" || len(o.Keys) != 5 {
		t.Fatalf("options: prefix %q, consumer claim %q, %d keys", o.IDPrefix, o.ConsumerClaim, len(o.Keys))
	}
	if string(o.Keys[0].Key.([]byte)) != secret || string(o.Keys[1].Key.([]byte)) != secret || !o.Keys[2].Key.(*ecdsa.PublicKey).Equal(&priv.PublicKey) {
		t.Fatalf("keys not loaded: %+v", o.Keys)
	}
	if _, err := identity.NewJWT(o); err != nil {
		t.Fatalf("identity.NewJWT refuses the options: %v", err)
	}

	bad := &spec.JWT{Algorithms: []string{"ES256"}, PolicyClaim: "pol", Keys: []spec.JWTKey{
		{ID: "1", SecretEnv: "NOPE"}, {ID: "2", SecretEnv: "EMPTY"}, {ID: "3", SecretEnv: "SHORT"},
		{ID: "4", SecretFile: "empty"}, {ID: "5", PEMFile: "missing.pem"}, {ID: "6", PEMFile: "hs.secret"}, {ID: "7", SecretEnv: "HS"},
	}}
	_, _, err = bad.Options("x", r)
	var errs spec.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Options = %v, want spec.Errors", err)
	}
	want := "spec: keys[0].secret_env: environment variable NOPE is not set\n" +
		"spec: keys[1].secret_env: environment variable EMPTY is empty\n" +
		"spec: keys[2].secret_env: environment variable SHORT holds 3 bytes; an HMAC secret needs at least 32\n" +
		"spec: keys[3].secret_file: empty is empty\n" +
		"spec: keys[4].pem_file: open missing.pem: file does not exist\n" +
		"spec: keys[5].pem_file: hs.secret: no PEM block found\n" +
		"spec: keys[6]: an HMAC secret fits none of the algorithms [ES256] (it verifies HS256, HS384 or HS512)"
	if err.Error() != want {
		t.Fatalf("errors:\n%s\nwant:\n%s", err, want)
	}

	jw := &spec.JWT{Algorithms: []string{"RS256"}, JWKS: &spec.JWKS{URL: "https://idp.example/jwks"}}
	o, jwks, err = jw.Options("idp", r)
	if err != nil || jwks == nil || jwks.URL != "https://idp.example/jwks" || jwks.RefreshInterval != identity.DefaultJWKSRefresh || o.IDPrefix != `jwt:api="idp":` {
		t.Fatalf("JWKS options: %+v, %v, %v", jwks, o.IDPrefix, err)
	}
}

func TestHelpers(t *testing.T) {
	if p, err := spec.CleanListenPath("/orders"); err != nil || p != "/orders/" {
		t.Fatalf("CleanListenPath(/orders) = %q, %v", p, err)
	}
	if _, err := spec.CleanListenPath("orders"); err == nil || err.Error() != `spec: "orders" must start with "/"` {
		t.Fatalf("CleanListenPath(orders): %v", err)
	}
	if u, err := spec.ParseTarget("https://up.example/base"); err != nil || u.Host != "up.example" || u.Path != "/base" {
		t.Fatalf("ParseTarget: %v, %v", u, err)
	}
	if u, err := spec.ParseTarget(spec.BuiltinEcho); err != nil || u != nil {
		t.Fatalf("ParseTarget(builtin:echo): %v, %v", u, err)
	}
	if err := spec.CheckJWKSURL("http://127.0.0.1:9/jwks"); err != nil {
		t.Fatalf("loopback http: %v", err)
	}
	if err := spec.CheckJWKSURL("http://idp.example/jwks"); err == nil || err.Error() != `spec: "http://idp.example/jwks" must be https (plain http only to a loopback address)` {
		t.Fatalf("plain http: %v", err)
	}
	algs := spec.JWTAlgorithms()
	algs[0] = "changed"
	if spec.JWTAlgorithms()[0] != "HS256" {
		t.Fatal("JWTAlgorithms returned its own slice")
	}
}

// TestImportsNoYAMLGRPCRedisOrAdapters keeps spec importable by anything:
// no YAML decoder, gRPC, Redis client or adapter among its dependencies.
func TestImportsNoYAMLGRPCRedisOrAdapters(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "github.com/limitplane/limitplane/spec").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list printed %d packages: %q", len(deps), out)
	}
	var bad []string
	for _, d := range deps {
		if strings.Contains(d, "yaml") || strings.Contains(d, "grpc") || strings.Contains(d, "redis") || strings.Contains(d, "/adapters") ||
			strings.HasPrefix(d, "github.com/limitplane/limitplane/") && d != "github.com/limitplane/limitplane/core" && d != "github.com/limitplane/limitplane/identity" && d != "github.com/limitplane/limitplane/spec" {
			bad = append(bad, d)
		}
	}
	if len(bad) > 0 {
		t.Fatalf("spec depends on %v", bad)
	}
}

// TestQuotaEpochJSON: quota epochs are written quota_epoch, on a key and on
// each of its api_limits, left out when 0, and reach the engine's consumer
// through Record (identity.KeyRecord.Consumer).
func TestQuotaEpochJSON(t *testing.T) {
	hash := identity.HashKey("k").String()
	in := `{"key_hash":"` + hash + `","policies":["p"],"api_limits":{"a":{"quota":{"max":5,"renewal":"1h0m0s"},"quota_epoch":9}},"quota_epoch":18446744073709551615}`
	var k spec.Key
	if err := json.Unmarshal([]byte(in), &k); err != nil {
		t.Fatal(err)
	}
	if k.QuotaEpoch != 1<<64-1 || k.APILimits["a"].QuotaEpoch != 9 {
		t.Fatalf("decoded epochs %d, %d; want 2^64-1, 9", k.QuotaEpoch, k.APILimits["a"].QuotaEpoch)
	}
	out, err := json.Marshal(k)
	if err != nil || string(out) != in {
		t.Fatalf("Marshal = %s, %v; want %s", out, err, in)
	}
	k.QuotaEpoch, k.APILimits["a"] = 0, spec.Limits{Quota: &spec.Quota{Max: 5, Renewal: spec.Duration(time.Hour)}}
	out, _ = json.Marshal(k)
	if want := `{"key_hash":"` + hash + `","policies":["p"],"api_limits":{"a":{"quota":{"max":5,"renewal":"1h0m0s"}}}}`; string(out) != want {
		t.Fatalf("epoch 0: %s, want %s", out, want)
	}
	k.QuotaEpoch, k.APILimits["a"] = 4, spec.Limits{Quota: &spec.Quota{Max: 5, Renewal: spec.Duration(time.Hour)}, QuotaEpoch: 2}
	c := registryOf(t, k).Lookup(identity.HashKey("k")).Consumer()
	if c.QuotaEpoch != 4 || c.APILimits["a"].QuotaEpoch != 2 {
		t.Fatalf("consumer epochs %d, %d; want 4, 2", c.QuotaEpoch, c.APILimits["a"].QuotaEpoch)
	}
}

// TestValidateKey checks one key against given policies and APIs, with
// every problem at its path, and agrees with Validate on a snapshot
// holding the same key.
func TestValidateKey(t *testing.T) {
	policies := map[string]*spec.Policy{"p": {ID: "p", Rate: &spec.Rate{Requests: 1, Per: spec.Duration(time.Second)}}}
	apis := map[string]*spec.API{"a": {ID: "a"}, "open": {ID: "open", Auth: spec.AuthKeyless}}
	good := &spec.Key{KeyHash: identity.HashKey("k").String(), Policies: []string{"p"},
		APILimits: map[string]spec.Limits{"a": {Quota: &spec.Quota{Max: 5, Renewal: spec.Duration(time.Hour)}}}}
	if err := spec.ValidateKey("put[0]", good, policies, apis); err != nil {
		t.Errorf("ValidateKey(good) = %v", err)
	}
	bad := &spec.Key{KeyHash: "sha256:00", Policies: []string{"p", "gold"},
		APILimits: map[string]spec.Limits{"open": {Rate: &spec.Rate{Requests: 0, Per: spec.Duration(time.Second)}}, "b": {}}}
	want := "spec: put[1].key_hash: \"sha256:00\" is not sha256:<64 hex digits>\n" +
		"spec: put[1].policies[1]: unknown policy \"gold\"\n" +
		"spec: put[1].api_limits.b: unknown API \"b\"\n" +
		"spec: put[1].api_limits.b: needs rate or quota\n" +
		"spec: put[1].api_limits.open: API \"open\" is keyless; api_limits only apply to api_key APIs\n" +
		"spec: put[1].api_limits.open.rate.requests: 0 must be > 0 (or -1 for unlimited)"
	err := spec.ValidateKey("put[1]", bad, policies, apis)
	if _, ok := err.(spec.Errors); !ok || err.Error() != want {
		t.Errorf("ValidateKey(bad) =\n%v\nwant\n%s", err, want)
	}
	snap := &spec.Snapshot{Policies: []spec.Policy{*policies["p"]}, APIs: []spec.API{{ID: "a", ListenPath: "/a/", Target: spec.BuiltinEcho},
		{ID: "open", ListenPath: "/open/", Target: spec.BuiltinEcho, Auth: spec.AuthKeyless, Policies: []string{"p"}}}, Keys: []spec.Key{*bad}}
	if got, want := snap.Validate().Error(), strings.ReplaceAll(want, "put[1]", "keys[0]"); got != want {
		t.Errorf("Validate =\n%s\nwant\n%s", got, want)
	}
}

// TestValidateShardedListenPaths: a control plane's state may define one
// API per data plane on the same listen path (disjoint tags); a gateway's
// snapshot may not hold two, and neither may two copies a data plane's
// tags could both select.
func TestValidateShardedListenPaths(t *testing.T) {
	api := func(id string, tags ...string) spec.API {
		return spec.API{ID: id, ListenPath: "/orders/", Target: spec.BuiltinEcho, Auth: spec.AuthKeyless, Policies: []string{"p"}, Tags: tags}
	}
	snap := func(apis ...spec.API) *spec.Snapshot {
		return &spec.Snapshot{
			Policies: []spec.Policy{{ID: "p", Rate: &spec.Rate{Requests: 1, Per: spec.Duration(time.Second)}}},
			APIs:     apis,
		}
	}
	const same = `spec: apis[1].listen_path: "/orders/" is the same path as apis[0].listen_path`
	for _, c := range []struct {
		name             string
		s                *spec.Snapshot
		validate, shared string // "" means valid
	}{
		{"disjoint tags", snap(api("a", "dp1"), api("b", "dp2", "dp3")), same, ""},
		{"a common tag", snap(api("a", "dp1", "eu"), api("b", "dp2", "eu")), same, same},
		{"one untagged", snap(api("a"), api("b", "dp2")), same, same},
		{"both untagged", snap(api("a"), api("b")), same, same},
	} {
		t.Run(c.name, func(t *testing.T) {
			check := func(what string, err error, want string) {
				t.Helper()
				got := ""
				if err != nil {
					got = err.Error()
				}
				if got != want {
					t.Errorf("%s: got %q, want %q", what, got, want)
				}
			}
			check("Validate", c.s.Validate(), c.validate)
			check("ValidateSharded", c.s.ValidateSharded(), c.shared)
		})
	}
	// Three copies: the third clashes with the first it shares a tag with.
	s := snap(api("a", "dp1"), api("b", "dp2"), api("c", "dp2"))
	want := `spec: apis[2].listen_path: "/orders/" is the same path as apis[1].listen_path`
	if err := s.ValidateSharded(); err == nil || err.Error() != want {
		t.Errorf("ValidateSharded: got %v, want %q", err, want)
	}
}

// TestIDs: policy and API IDs are 1 to 128 letters, digits, '.', '_',
// ':' or '-'; a "/" could make a policy's rate name its neighbour's quota
// ("x/quota") in the RateLimit header fields.
func TestIDs(t *testing.T) {
	rate := &spec.Rate{Requests: 1, Per: spec.Duration(time.Second)}
	for _, c := range []struct {
		id   string
		want string // "" means valid
	}{
		{"gold", ""},
		{"Team_A-1.v2:eu", ""},
		{strings.Repeat("p", 128), ""},
		{strings.Repeat("p", 129), `spec: policies[0].id: "` + strings.Repeat("p", 129) + `": an id is 1 to 128 letters, digits, '.', '_', ':' or '-', and not "." or ".."`},
		{"x/quota", `spec: policies[0].id: "x/quota": an id is 1 to 128 letters, digits, '.', '_', ':' or '-', and not "." or ".."`},
		{" ", `spec: policies[0].id: " ": an id is 1 to 128 letters, digits, '.', '_', ':' or '-', and not "." or ".."`},
		{".", `spec: policies[0].id: ".": an id is 1 to 128 letters, digits, '.', '_', ':' or '-', and not "." or ".."`},
		{"..", `spec: policies[0].id: "..": an id is 1 to 128 letters, digits, '.', '_', ':' or '-', and not "." or ".."`},
		{"...", ""},
		{"é", `spec: policies[0].id: "é": an id is 1 to 128 letters, digits, '.', '_', ':' or '-', and not "." or ".."`},
	} {
		s := &spec.Snapshot{Policies: []spec.Policy{{ID: c.id, Rate: rate}}}
		got := ""
		if err := s.Validate(); err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("policy %q: got %q, want %q", c.id, got, c.want)
		}
	}
	s := &spec.Snapshot{APIs: []spec.API{{ID: "a b", ListenPath: "/a/", Target: spec.BuiltinEcho}}}
	want := `spec: apis[0].id: "a b": an id is 1 to 128 letters, digits, '.', '_', ':' or '-', and not "." or ".."`
	if err := s.Validate(); err == nil || err.Error() != want {
		t.Errorf("API \"a b\": got %v, want %q", err, want)
	}
}

// TestSnapshotRefusesNumberDurations: every duration of a snapshot's JSON
// is a string; a number (which once read as nanoseconds, "per": 3600
// giving 3.6 µs, no limit at all) is refused with the field's path, and
// so is a string that is not a duration.
func TestSnapshotRefusesNumberDurations(t *testing.T) {
	for _, tc := range []struct{ in, path, problem string }{
		{`{"policies":[{"id":"p","rate":{"requests":5,"per":3600}}]}`, "policies.rate.per", `number 3600: a duration is a string with its unit, like "1h" or "500ms"`},
		{`{"policies":[{"id":"p","quota":{"max":5,"renewal":86400}}]}`, "policies.quota.renewal", `number 86400: a duration is a string with its unit, like "1h" or "500ms"`},
		{`{"apis":[{"id":"a","jwt":{"leeway":30}}]}`, "apis.jwt.leeway", `number 30: a duration is a string with its unit, like "1h" or "500ms"`},
		{`{"apis":[{"id":"a","jwt":{"jwks":{"url":"https://x","refresh_interval":1e9}}}]}`, "apis.jwt.jwks.refresh_interval", `number 1e9: a duration is a string with its unit, like "1h" or "500ms"`},
		{`{"keys":[{"key_hash":"h","api_limits":{"a":{"rate":{"requests":1,"per":true}}}}]}`, "keys.api_limits.rate.per", `bool: a duration is a string with its unit, like "1h" or "500ms"`},
		// A string that is no duration: at its path too, as ParseDuration
		// words it.
		{`{"policies":[{"id":"p","rate":{"requests":5,"per":"100000000h"}}]}`, "policies.rate.per", `"100000000h" is out of range (durations go up to 2562047h47m16.854775807s, about 292 years)`},
		{`{"policies":[{"id":"p","quota":{"max":5,"renewal":"1d"}}]}`, "policies.quota.renewal", `"1d" is not a duration`},
		{`{"apis":[{"id":"a","jwt":{"leeway":"\"(x) y\u0001"}}]}`, "apis.jwt.leeway", `"\"(x) y\x01" is not a duration`},
	} {
		var s spec.Snapshot
		err := json.Unmarshal([]byte(tc.in), &s)
		path, problem, ok := spec.DurationTypeProblem(err)
		if !ok || path != tc.path || problem != tc.problem {
			t.Errorf("%s: error %v: got (%q, %q, %v), want (%q, %q)", tc.in, err, path, problem, ok, tc.path, tc.problem)
		}
		if got, want := spec.RefusedDurationString(err), strings.HasPrefix(tc.problem, `"`); got != want {
			t.Errorf("%s: RefusedDurationString = %v, want %v", tc.in, got, want)
		}
	}
	if _, _, ok := spec.DurationTypeProblem(errors.New("other")); ok {
		t.Error("DurationTypeProblem took another error")
	}
	var s spec.Snapshot
	if err := json.Unmarshal([]byte(`{"policies":[{"id":"p","rate":{"requests":"5","per":"1h"}}]}`), &s); spec.RefusedDurationString(err) {
		t.Errorf("RefusedDurationString took a string refused for an integer field: %v", err)
	}
}

// TestTypeProblem: any value of the wrong type is named at its path with
// what the field takes; a duration as DurationTypeProblem words it, which
// takes no other type's error.
func TestTypeProblem(t *testing.T) {
	for _, tc := range []struct{ in, path, problem string }{
		{`{"policies":[{"id":"p","in_flight":1e18}]}`, "policies.in_flight", "number 1e18: want an integer"},
		{`{"policies":[{"id":"p","rate":{"requests":"10","per":"1h"}}]}`, "policies.rate.requests", "string: want an integer"},
		{`{"policies":[{"id":7}]}`, "policies.id", "number: want a string"},
		{`{"policies":[{"id":"p","rate":{"requests":5,"per":3600}}]}`, "policies.rate.per", `number 3600: a duration is a string with its unit, like "1h" or "500ms"`},
	} {
		var s spec.Snapshot
		err := json.Unmarshal([]byte(tc.in), &s)
		path, problem, ok := spec.TypeProblem(err)
		if !ok || path != tc.path || problem != tc.problem {
			t.Errorf("%s: error %v: got (%q, %q, %v), want (%q, %q)", tc.in, err, path, problem, ok, tc.path, tc.problem)
		}
		if _, _, dur := spec.DurationTypeProblem(err); dur != strings.Contains(tc.problem, "duration") {
			t.Errorf("%s: DurationTypeProblem ok = %v", tc.in, dur)
		}
	}
	if _, _, ok := spec.TypeProblem(errors.New("other")); ok {
		t.Error("TypeProblem took another error")
	}
}

// TestExplicitZeroBurst: "burst": 0 written out is refused as the
// gateway's file refuses it (left out, it means requests), and it
// survives a JSON round trip so a stored rate is refused too.
func TestExplicitZeroBurst(t *testing.T) {
	in := `{"policies":[{"id":"p","rate":{"requests":5,"per":"1m","burst":0}},` +
		`{"id":"q","rate":{"requests":5,"per":"1m","burst":0,"algorithm":"fixed_window"}},` +
		`{"id":"r","rate":{"requests":5,"per":"1m"}}]}`
	want := "spec: policies[0].rate.burst: 0 must be > 0 (leave it out to use requests)\n" +
		"spec: policies[1].rate.burst: 0 must be > 0 (leave it out to use requests)\n" +
		"spec: policies[1].rate.burst: fixed_window has no burst (it counts up to requests per per); leave burst out"
	var s spec.Snapshot
	if err := json.Unmarshal([]byte(in), &s); err != nil {
		t.Fatal(err)
	}
	if err := s.Validate(); err == nil || err.Error() != want {
		t.Fatalf("Validate: %v\nwant %s", err, want)
	}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"revision":0,"policies":[{"id":"p","rate":{"requests":5,"per":"1m0s","burst":0}},{"id":"q","rate":{"requests":5,"per":"1m0s","burst":0,"algorithm":"fixed_window"}},{"id":"r","rate":{"requests":5,"per":"1m0s"}}]}` {
		t.Fatalf("JSON %s", b)
	}
	var again spec.Snapshot
	if err := json.Unmarshal(b, &again); err != nil {
		t.Fatal(err)
	}
	if err := again.Validate(); err == nil || err.Error() != want {
		t.Fatalf("Validate after a round trip: %v", err)
	}
	var r spec.Rate
	if err := json.Unmarshal([]byte(`{"requests":1,"per":"1s","brust":2}`), &r); err == nil || err.Error() != `json: unknown field "brust"` {
		t.Fatalf("unknown field in a rate: %v", err)
	}
}

// TestExplicitZeroRefreshInterval: a JWKS refresh_interval of "0s"
// written out is refused as the gateway's file refuses it (left out, it
// means the default), through a JSON round trip too.
func TestExplicitZeroRefreshInterval(t *testing.T) {
	api := func(jwks string) string {
		return `{"policies":[{"id":"p"}],"apis":[{"id":"a","listen_path":"/a/","target":"builtin:echo","auth":"jwt","jwt":{"algorithms":["RS256"],"jwks":` + jwks + `,"default_policies":["p"]}}]}`
	}
	for _, c := range []struct{ jwks, want string }{
		{`{"url":"https://idp.example/jwks.json","refresh_interval":"0s"}`, "spec: apis[0].jwt.jwks.refresh_interval: 0s must be > 0"},
		{`{"url":"https://idp.example/jwks.json","refresh_interval":"-1s"}`, "spec: apis[0].jwt.jwks.refresh_interval: -1s must be > 0"},
		{`{"url":"https://idp.example/jwks.json"}`, ""},
		{`{"url":"https://idp.example/jwks.json","refresh_interval":"1m"}`, ""},
	} {
		var s spec.Snapshot
		if err := json.Unmarshal([]byte(api(c.jwks)), &s); err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var again spec.Snapshot
		if err := json.Unmarshal(b, &again); err != nil {
			t.Fatal(err)
		}
		for _, v := range []*spec.Snapshot{&s, &again} {
			got := ""
			if err := v.Validate(); err != nil {
				got = err.Error()
			}
			if got != c.want {
				t.Errorf("%s: %q, want %q (JSON %s)", c.jwks, got, c.want, b)
			}
		}
	}
	var j spec.JWKS
	if err := json.Unmarshal([]byte(`{"url":"https://x","refresh":"1m"}`), &j); err == nil || err.Error() != `json: unknown field "refresh"` {
		t.Fatalf("unknown field in jwks: %v", err)
	}
}

// TestValidateJWTKeyFitsAlgorithms: a key that can verify none of the
// pinned algorithms is refused by Validate when that does not depend on
// the host (a secret from anywhere is an HMAC key; an inline PEM is
// parsed), in the gateway file's words, so a control plane refuses it at
// write time instead of every gateway failing to build it.
func TestValidateJWTKeyFitsAlgorithms(t *testing.T) {
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&ec.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	ecPEM := string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	for _, c := range []struct {
		name string
		algs []string
		key  spec.JWTKey
		want string // "" for valid
	}{
		{"secret_env with RS256", []string{"RS256"}, spec.JWTKey{SecretEnv: "HOME"},
			"apis[0].jwt.keys[0]: an HMAC secret fits none of the algorithms [RS256] (it verifies HS256, HS384 or HS512)"},
		{"secret_file with ES256, PS256", []string{"ES256", "PS256"}, spec.JWTKey{SecretFile: "s"},
			"apis[0].jwt.keys[0]: an HMAC secret fits none of the algorithms [ES256, PS256] (it verifies HS256, HS384 or HS512)"},
		{"inline P-256 PEM with RS256", []string{"RS256"}, spec.JWTKey{PEM: ecPEM},
			"apis[0].jwt.keys[0]: an ECDSA P-256 key fits none of the algorithms [RS256] (it verifies ES256)"},
		{"secret_env with HS512, RS256", []string{"HS512", "RS256"}, spec.JWTKey{SecretEnv: "HOME"}, ""},
		{"inline P-256 PEM with ES256", []string{"ES256"}, spec.JWTKey{PEM: ecPEM}, ""},
		// pem_file's key type is the host's to read: not judged here.
		{"pem_file with RS256", []string{"RS256"}, spec.JWTKey{PEMFile: "k.pem"}, ""},
	} {
		s := spec.Snapshot{
			Policies: []spec.Policy{{ID: "p", Rate: &spec.Rate{Requests: 1, Per: spec.Duration(time.Second)}}},
			APIs: []spec.API{{ID: "j", ListenPath: "/j/", Target: spec.BuiltinEcho, Auth: spec.AuthJWT,
				JWT: &spec.JWT{Algorithms: c.algs, Keys: []spec.JWTKey{c.key}, DefaultPolicies: []string{"p"}}}},
		}
		got := ""
		if err := s.Validate(); err != nil {
			got = strings.TrimPrefix(err.Error(), "spec: ")
		}
		if got != c.want {
			t.Errorf("%s: Validate = %q, want %q", c.name, got, c.want)
		}
	}
}

func TestGlobalQuotaValidateAndJSON(t *testing.T) {
	q := func(max int64, g *spec.GlobalQuota) *spec.Quota {
		return &spec.Quota{Max: max, Renewal: spec.Duration(time.Minute), Global: g}
	}
	s := spec.Snapshot{Policies: []spec.Policy{
		{ID: "ok", Quota: q(10000, &spec.GlobalQuota{Mode: "optimistic", Floor: 200, LeaseDuration: spec.Duration(5 * time.Second)})},
		{ID: "nomode", Quota: q(10, &spec.GlobalQuota{})},
		{ID: "badmode", Quota: q(10, &spec.GlobalQuota{Mode: "loose"})},
		{ID: "strictfloor", Quota: q(10, &spec.GlobalQuota{Mode: "strict", Floor: 1})},
		{ID: "bigfloor", Quota: q(10, &spec.GlobalQuota{Mode: "reserved", Floor: 11})},
		{ID: "neg", Quota: q(10, &spec.GlobalQuota{Mode: "reserved", Floor: -1, LeaseDuration: spec.Duration(-time.Second)})},
		{ID: "long", Quota: q(10, &spec.GlobalQuota{Mode: "strict", LeaseDuration: spec.Duration(2 * time.Minute)})},
		{ID: "unlimited", Quota: &spec.Quota{Max: -1, Global: &spec.GlobalQuota{Mode: "strict"}}},
	}}
	var errs spec.Errors
	if !errors.As(s.Validate(), &errs) {
		t.Fatalf("Validate = %v, want spec.Errors", s.Validate())
	}
	want := []string{
		"policies[1].quota.global.mode: missing (strict, reserved or optimistic)",
		`policies[2].quota.global.mode: "loose" is not a mode (strict, reserved or optimistic)`,
		"policies[3].quota.global.floor: a strict quota has no floor (use reserved or optimistic)",
		"policies[4].quota.global.floor: 11 is above the quota's max 10",
		"policies[5].quota.global.floor: -1 must be ≥ 0",
		"policies[5].quota.global.lease_duration: -1s must be > 0",
		"policies[6].quota.global.lease_duration: 2m0s is longer than the quota's renewal 1m0s",
		"policies[7].quota.global: an unlimited quota (max -1) cannot be global",
	}
	got := make([]string, len(errs))
	for i, e := range errs {
		got[i] = e.Path + ": " + e.Problem
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}

	b, err := json.Marshal(s.Policies[0])
	if err != nil {
		t.Fatal(err)
	}
	const wantJSON = `{"id":"ok","quota":{"max":10000,"renewal":"1m0s","global":{"mode":"optimistic","floor":200,"lease_duration":"5s"}}}`
	if string(b) != wantJSON {
		t.Fatalf("JSON = %s, want %s", b, wantJSON)
	}
	var back spec.Policy
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back.Quota.Global, s.Policies[0].Quota.Global) {
		t.Fatalf("round trip: global = %+v, want %+v", back.Quota.Global, s.Policies[0].Quota.Global)
	}
	if err := json.Unmarshal([]byte(`{"id":"x","quota":{"max":1,"renewal":"1m","global":{"mode":"strict","flor":1}}}`), &back); err == nil {
		t.Fatal("an unknown field in global was accepted")
	}
}

// TestSecret: a variable's value as it is, a file's without its final
// line ending; an unset or empty variable, an empty file and the
// resolver's own error (as is) are refused with the problem to report.
func TestSecret(t *testing.T) {
	r := resolver{
		files: map[string][]byte{"s.txt": []byte("file secret\r\n"), "empty.txt": []byte("\n")},
		env:   map[string]string{"SET": "env secret\n", "EMPTY": ""},
	}
	for _, tc := range []struct{ env, file, want, problem string }{
		{env: "SET", want: "env secret\n"},
		{env: "SET", file: "s.txt", want: "env secret\n"},
		{file: "s.txt", want: "file secret"},
		{env: "UNSET", problem: "environment variable UNSET is not set"},
		{env: "EMPTY", problem: "environment variable EMPTY is empty"},
		{file: "empty.txt", problem: "empty.txt is empty"},
		{file: "missing.txt", problem: "open missing.txt: file does not exist"},
	} {
		got, err := spec.Secret(r, tc.env, tc.file)
		if tc.problem != "" {
			if err == nil || err.Error() != tc.problem || got != "" {
				t.Errorf("Secret(%q, %q) = %q, %v; want the problem %q", tc.env, tc.file, got, err, tc.problem)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Secret(%q, %q) = %q, %v; want %q", tc.env, tc.file, got, err, tc.want)
		}
	}
}

// registryOf returns a key registry holding k's record.
func registryOf(t *testing.T, k spec.Key) *identity.Keys {
	t.Helper()
	rec, err := k.Record()
	if err != nil {
		t.Fatal(err)
	}
	keys, err := identity.NewKeys([]identity.KeyRecord{rec})
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// keyRequest presents an API key in X-API-Key and nothing else.
type keyRequest string

func (r keyRequest) Header(name string) string {
	if strings.EqualFold(name, "X-API-Key") {
		return string(r)
	}
	return ""
}

func (r keyRequest) HeaderValues(name string) []string {
	if v := r.Header(name); v != "" {
		return []string{v}
	}
	return nil
}
func (keyRequest) Query(string) string  { return "" }
func (keyRequest) Cookie(string) string { return "" }
func (keyRequest) RemoteAddr() string   { return "192.0.2.1:4000" }

// TestKeyExpiresZeroTime: "expires": "0001-01-01T00:00:00Z" (Go's zero
// time, which identity reads as never) is a time long past like any
// other: the key is refused as expired, as one expiring a day later is.
// It once never expired.
func TestKeyExpiresZeroTime(t *testing.T) {
	for _, tc := range []struct {
		expires string // "" for none
		want    string // Authenticate's error, "" for admitted
	}{
		{"0001-01-01T00:00:00Z", "API key expired"},
		{"0001-01-02T00:00:00Z", "API key expired"},
		{"2000-01-01T00:00:00Z", "API key expired"},
		{"2999-01-01T00:00:00Z", ""},
		{"", ""},
	} {
		doc := `{"key_hash":"` + identity.HashKey("k").String() + `","policies":["p"]`
		if tc.expires != "" {
			doc += `,"expires":"` + tc.expires + `"`
		}
		var k spec.Key
		if err := json.Unmarshal([]byte(doc+"}"), &k); err != nil {
			t.Fatal(err)
		}
		c, err := identity.NewAPIKey(registryOf(t, k), identity.APIKeyOptions{}).Authenticate(t.Context(), keyRequest("k"))
		switch {
		case tc.want == "" && (err != nil || c == nil):
			t.Errorf("expires %q: %v, want admitted", tc.expires, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("expires %q: %v, want %q", tc.expires, err, tc.want)
		}
	}
}
