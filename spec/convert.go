package spec

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/identity"
)

// The conversions below turn a valid snapshot into the values the engine,
// the key registry and the JWT authenticator take. On a snapshot that
// Validate refused their results are unspecified.

// Limit returns the rate as a core.Limit: the zero Limit (absent) for a
// nil Rate, {Rate: core.Unlimited} for Requests -1. An unknown algorithm
// gives GCRA (Validate refuses it).
func (r *Rate) Limit() core.Limit {
	if r == nil {
		return core.Limit{}
	}
	if r.Requests == core.Unlimited {
		return core.Limit{Rate: core.Unlimited}
	}
	alg, _ := core.ParseAlgorithm(r.Algorithm)
	return core.Limit{Rate: r.Requests, Period: time.Duration(r.Per), Burst: r.Burst, Algorithm: alg}
}

// Quota returns the quota as a core.Quota: the zero Quota (absent) for a
// nil Quota, {Max: core.Unlimited} for Max -1; Global becomes
// core.Quota.Global (its Policy is the engine's to fill in).
func (q *Quota) Quota() core.Quota {
	if q == nil {
		return core.Quota{}
	}
	if q.Max == core.Unlimited {
		return core.Quota{Max: core.Unlimited}
	}
	cq := core.Quota{Max: q.Max, Renewal: time.Duration(q.Renewal)}
	if g := q.Global; g != nil {
		cq.Global = core.GlobalQuota{Mode: globalMode(g.Mode), Floor: g.Floor, LeaseDuration: time.Duration(g.LeaseDuration)}
	}
	return cq
}

// globalMode maps GlobalQuota.Mode (validated) to core's.
func globalMode(m string) core.GlobalMode {
	switch m {
	case "reserved":
		return core.GlobalReserved
	case "optimistic":
		return core.GlobalOptimistic
	}
	return core.GlobalStrict
}

// Limits returns l as core.Limits, with its quota epoch.
func (l Limits) Limits() core.Limits {
	return core.Limits{Rate: l.Rate.Limit(), Quota: l.Quota.Quota(), QuotaEpoch: l.QuotaEpoch}
}

// Core returns the policy as a core.Policy. Its APIs slice is a copy.
func (p *Policy) Core() core.Policy {
	return core.Policy{
		ID:          p.ID,
		Rate:        p.Rate.Limit(),
		Quota:       p.Quota.Quota(),
		APIs:        slices.Clone(p.APIs),
		Shadow:      p.Shadow,
		Distributed: p.Distributed,
		Endpoints:   p.coreEndpoints(),
		Thresholds:  slices.Clone(p.Thresholds),
		InFlight:    p.InFlight,
		Settle:      p.Settle,
	}
}

// coreEndpoints returns the policy's endpoint limits as core's, nil for
// none.
func (p *Policy) coreEndpoints() []core.PolicyEndpoint {
	if len(p.Endpoints) == 0 {
		return nil
	}
	out := make([]core.PolicyEndpoint, len(p.Endpoints))
	for i, pe := range p.Endpoints {
		out[i] = core.PolicyEndpoint{API: pe.API, Method: pe.Method, Path: pe.Path, Rate: pe.Rate.Limit(), Quota: pe.Quota.Quota()}
	}
	return out
}

// CorePolicies returns the snapshot's policies as core.Policy values, in
// order.
func (s *Snapshot) CorePolicies() []core.Policy {
	out := make([]core.Policy, len(s.Policies))
	for i := range s.Policies {
		out[i] = s.Policies[i].Core()
	}
	return out
}

// CoreEndpoints returns the endpoints of the snapshot's APIs as
// core.Config.Endpoints takes them, by API id; nil when no API has any.
func (s *Snapshot) CoreEndpoints() map[string][]core.Endpoint {
	var out map[string][]core.Endpoint
	for i := range s.APIs {
		a := &s.APIs[i]
		if len(a.Endpoints) == 0 {
			continue
		}
		if out == nil {
			out = map[string][]core.Endpoint{}
		}
		eps := make([]core.Endpoint, len(a.Endpoints))
		for j, ep := range a.Endpoints {
			eps[j] = core.Endpoint{Method: ep.Method, Path: ep.Path, Policies: slices.Clone(ep.Policies)}
			if ep.Cost != nil {
				eps[j].Cost = *ep.Cost
			}
		}
		out[a.ID] = eps
	}
	return out
}

// Record returns the key as an identity.KeyRecord, or an error (starting
// "spec: ") when KeyHash is not a valid hash. Slices and maps are copies.
func (k *Key) Record() (identity.KeyRecord, error) {
	h, err := identity.ParseKeyHash(k.KeyHash)
	if err != nil {
		return identity.KeyRecord{}, fmt.Errorf("spec: key_hash %q: %w", k.KeyHash, err)
	}
	rec := identity.KeyRecord{Hash: h, Policies: slices.Clone(k.Policies), Inactive: k.Inactive, QuotaEpoch: k.QuotaEpoch}
	if k.Expires != nil {
		rec.Expires = *k.Expires
		if rec.Expires.IsZero() {
			// 0001-01-01T00:00:00Z, Go's zero time, is a time like any
			// other here (the key expired long ago), but identity reads
			// a zero Expires as never: the next instant says the same.
			rec.Expires = rec.Expires.Add(time.Nanosecond)
		}
	}
	if len(k.APILimits) > 0 {
		rec.APILimits = make(map[string]core.Limits, len(k.APILimits))
		for id, l := range k.APILimits {
			rec.APILimits[id] = l.Limits()
		}
	}
	return rec, nil
}

// KeyRecords returns the snapshot's keys as identity.KeyRecord values, in
// order, or the first key's error.
func (s *Snapshot) KeyRecords() ([]identity.KeyRecord, error) {
	out := make([]identity.KeyRecord, len(s.Keys))
	for i := range s.Keys {
		rec, err := s.Keys[i].Record()
		if err != nil {
			return nil, fmt.Errorf("spec: keys[%d]: %w", i, err)
		}
		out[i] = rec
	}
	return out, nil
}

// AuthOrDefault returns Auth, or AuthAPIKey when it is empty.
func (a *API) AuthOrDefault() string {
	if a.Auth == "" {
		return AuthAPIKey
	}
	return a.Auth
}

// ServiceSide reports whether a is a service's own API (one that
// dataplane.Follow enforces in a service's middleware): it has neither a
// listen path nor a target. A gateway does not route it.
func (a *API) ServiceSide() bool { return a.ListenPath == "" && a.Target == "" }

// StripsListenPath reports whether the listen path is removed before a
// request goes upstream: StripListenPath, true when nil.
func (a *API) StripsListenPath() bool { return a.StripListenPath == nil || *a.StripListenPath }

// StripsAuthData reports whether credentials are removed before a request
// goes upstream: StripAuthData, or when nil true for api_key and jwt APIs
// and false for keyless ones.
func (a *API) StripsAuthData() bool {
	if a.StripAuthData != nil {
		return *a.StripAuthData
	}
	return a.Auth != AuthKeyless
}

// JWTIDPrefix returns the consumer-ID prefix of a jwt API's consumers:
// tokens from one issuer are one namespace, so jwt APIs with the same
// issuer share a consumer's counters (as API keys share theirs across
// APIs), while an API without an issuer keeps its consumers to itself.
// The quoted part keeps the prefixes of different issuers and APIs from
// ever running into each other. Every gateway must agree on it, since it
// names counters.
func JWTIDPrefix(issuer, apiID string) string {
	if issuer != "" {
		return "jwt:iss=" + strconv.Quote(issuer) + ":"
	}
	return "jwt:api=" + strconv.Quote(apiID) + ":"
}

// Resolver reads what a snapshot refers to on the gateway that applies
// it: the files named by pem_file and secret_file and the environment
// variables named by secret_env. spec itself reads neither files nor the
// environment.
type Resolver interface {
	// ReadFile returns the contents of the named file (a relative name is
	// the gateway's to interpret). Its error is reported as the problem
	// of the field naming the file, as is.
	ReadFile(name string) ([]byte, error)
	// LookupEnv returns the named environment variable and whether it is
	// set (os.LookupEnv).
	LookupEnv(name string) (string, bool)
}

// Resolve loads the key k refers to with r. On failure the error is an
// *Error whose Path is the field of k at fault ("pem_file", "secret_env",
// "secret_file", "pem", "secret") or "" for the key as a whole.
func (k *JWTKey) Resolve(r Resolver) (identity.JWTKey, error) {
	fail := func(field, format string, args ...any) (identity.JWTKey, error) {
		return identity.JWTKey{}, &Error{Path: field, Problem: fmt.Sprintf(format, args...)}
	}
	pem := func(field, name string, data []byte) (identity.JWTKey, error) {
		key, err := identity.ParseJWTKeyPEM(k.ID, data)
		if err != nil {
			if name != "" {
				return fail(field, "%s: %s", name, strings.TrimPrefix(err.Error(), "identity: "))
			}
			return fail(field, "%s", strings.TrimPrefix(err.Error(), "identity: "))
		}
		return key, nil
	}
	var field, from, secret string
	switch {
	case k.PEMFile != "":
		data, err := r.ReadFile(k.PEMFile)
		if err != nil {
			return fail("pem_file", "%v", err)
		}
		return pem("pem_file", k.PEMFile, data)
	case k.PEM != "":
		return pem("pem", "", []byte(k.PEM))
	case k.SecretEnv != "" || k.SecretFile != "":
		field, from = "secret_file", k.SecretFile
		if k.SecretEnv != "" {
			field, from = "secret_env", "environment variable "+k.SecretEnv
		}
		var err error
		if secret, err = Secret(r, k.SecretEnv, k.SecretFile); err != nil {
			return fail(field, "%v", err)
		}
	case k.Secret != "":
		field, from, secret = "secret", "the inline secret", k.Secret
	default:
		return fail("", "needs pem_file, secret_env or secret_file")
	}
	if len(secret) < identity.MinHMACKeySize {
		return fail(field, "%s holds %d bytes; an HMAC secret needs at least %d", from, len(secret), identity.MinHMACKeySize)
	}
	return identity.SecretKey(k.ID, []byte(secret)), nil
}

// Secret reads the secret that env, an environment variable's name, or
// else file, a file's name, refers to with r; a file's final line ending
// is dropped (files written by echo or editors have one). It fails when
// the variable is not set or is empty, when the file cannot be read (r's
// error as is) or is empty; the error's text is the problem to report at
// the field naming the variable or the file.
func Secret(r Resolver, env, file string) (string, error) {
	if env != "" {
		val, ok := r.LookupEnv(env)
		switch {
		case !ok:
			return "", fmt.Errorf("environment variable %s is not set", env)
		case val == "":
			return "", fmt.Errorf("environment variable %s is empty", env)
		}
		return val, nil
	}
	data, err := r.ReadFile(file)
	if err != nil {
		return "", err
	}
	secret := strings.TrimRight(string(data), "\r\n")
	if secret == "" {
		return "", fmt.Errorf("%s is empty", file)
	}
	return secret, nil
}

// KeyAlgorithms describes a verification key (an identity.JWTKey's Key)
// and lists the JWS algorithms it can verify; the list is empty for a
// type no algorithm takes.
func KeyAlgorithms(key any) (string, []string) {
	switch k := key.(type) {
	case []byte:
		return "an HMAC secret", []string{"HS256", "HS384", "HS512"}
	case *rsa.PublicKey:
		return "an RSA key", []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return "an ECDSA P-256 key", []string{"ES256"}
		case elliptic.P384():
			return "an ECDSA P-384 key", []string{"ES384"}
		case elliptic.P521():
			return "an ECDSA P-521 key", []string{"ES512"}
		}
	case ed25519.PublicKey:
		return "an Ed25519 key", []string{"EdDSA"}
	}
	return fmt.Sprintf("a %T", key), nil
}

// Options returns the authenticator's options for the jwt API apiID, its
// static keys resolved with r, and for a key set fetched from a URL the
// JWKS options (the caller starts identity.NewJWKS and sets
// JWTOptions.JWKS; Now is left for it too). On failure the error is an
// Errors with paths relative to the jwt section ("keys[0].secret_env").
// A key that fits none of the algorithms is refused.
func (j *JWT) Options(apiID string, r Resolver) (identity.JWTOptions, *identity.JWKSOptions, error) {
	o := identity.JWTOptions{
		Algorithms:      slices.Clone(j.Algorithms),
		Issuer:          j.Issuer,
		Audience:        slices.Clone(j.Audience),
		Leeway:          time.Duration(j.Leeway),
		ConsumerClaim:   j.ConsumerClaim,
		PolicyClaim:     j.PolicyClaim,
		DefaultPolicies: slices.Clone(j.DefaultPolicies),
		IDPrefix:        JWTIDPrefix(j.Issuer, apiID),
	}
	if o.ConsumerClaim == "" {
		o.ConsumerClaim = identity.DefaultConsumerClaim
	}
	if j.JWKS != nil {
		return o, &identity.JWKSOptions{
			URL:             j.JWKS.URL,
			RefreshInterval: durationOr(j.JWKS.RefreshInterval, identity.DefaultJWKSRefresh),
		}, nil
	}
	var errs Errors
	for i := range j.Keys {
		at := fmt.Sprintf("keys[%d]", i)
		key, err := j.Keys[i].Resolve(r)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				e = &Error{Problem: err.Error()}
			}
			if e.Path != "" {
				e.Path = at + "." + e.Path
			} else {
				e.Path = at
			}
			errs = append(errs, e)
			continue
		}
		what, fits := KeyAlgorithms(key.Key)
		if !slices.ContainsFunc(j.Algorithms, func(a string) bool { return slices.Contains(fits, a) }) {
			errs = append(errs, &Error{Path: at, Problem: fmt.Sprintf("%s fits none of the algorithms [%s] (it verifies %s)",
				what, strings.Join(j.Algorithms, ", "), orList(fits))})
			continue
		}
		o.Keys = append(o.Keys, key)
	}
	if len(errs) > 0 {
		return o, nil, errs
	}
	return o, nil, nil
}

// CoreCostHeader returns the API's cost header as core's; a zero
// core.CostHeader when it has none.
func (a *API) CoreCostHeader() core.CostHeader {
	if a.CostHeader == "" || a.MaxCost == nil {
		return core.CostHeader{}
	}
	return core.CostHeader{Name: a.CostHeader, Max: *a.MaxCost}
}
