package config

import (
	"fmt"
	"slices"
	"strings"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// orList writes items as "a, b or c".
func orList(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}

// JWTIDPrefix returns the consumer-ID prefix of a jwt API's consumers
// (spec.JWTIDPrefix, where the rule lives so that every gateway applying
// a snapshot names a consumer's counters alike).
func JWTIDPrefix(issuer, apiID string) string { return spec.JWTIDPrefix(issuer, apiID) }

// jwt validates a jwt API's jwt section. It returns the authenticator's
// options (keys loaded) and, for a key set fetched from a URL, the JWKS
// options.
func (v *validator) jwt(at, apiID string, r *rawJWT, policies map[string]*core.Policy) (*identity.JWTOptions, *identity.JWKSOptions) {
	n0 := len(v.errs)
	o := &identity.JWTOptions{
		Issuer:          r.Issuer,
		Audience:        r.Audience,
		ConsumerClaim:   r.ConsumerClaim,
		PolicyClaim:     r.PolicyClaim,
		DefaultPolicies: r.DefaultPolicies,
		IDPrefix:        JWTIDPrefix(r.Issuer, apiID),
	}
	if o.ConsumerClaim == "" {
		o.ConsumerClaim = identity.DefaultConsumerClaim
	}

	if len(r.Algorithms) == 0 {
		v.require(at+".algorithms", "missing (pin the accepted algorithms, like [RS256])")
	}
	var algs []string // the valid ones
	for j, alg := range r.Algorithms {
		f := fmt.Sprintf("%s.algorithms[%d]", at, j)
		if p := spec.JWTAlgorithmProblem(alg, algs, r.JWKS != nil); p != "" {
			v.fail(f, "%s", p)
		} else {
			algs = append(algs, alg)
		}
	}
	o.Algorithms = r.Algorithms

	var jwks *identity.JWKSOptions
	switch {
	case len(r.Keys) > 0 && r.JWKS != nil:
		v.fail(at, "set keys or jwks, not both")
	case len(r.Keys) == 0 && r.JWKS == nil:
		v.require(at, "needs keys (pem_file, secret_env or secret_file) or jwks (url)")
	case r.JWKS != nil:
		jwks = v.jwks(at+".jwks", r.JWKS)
	default:
		o.Keys = v.jwtKeys(at+".keys", r.Keys, algs)
	}

	if r.Leeway != "" {
		d, problem := parseDuration(r.Leeway, "30s or 1m")
		switch {
		case problem != "":
			v.fail(at+".leeway", "%s", problem)
		case d < 0:
			v.fail(at+".leeway", "%s must be >= 0", r.Leeway)
		default:
			o.Leeway = d
		}
	}
	if r.PolicyClaim == "" && len(r.DefaultPolicies) == 0 {
		v.require(at, "needs policy_claim or default_policies (a token without policies would be refused with 403)")
	}
	for j, id := range r.DefaultPolicies {
		v.policyFor(fmt.Sprintf("%s.default_policies[%d]", at, j), id, apiID, policies)
	}

	// identity has the last word on what it accepts; the checks above
	// give its refusals a line and a field.
	if len(v.errs) == n0 && jwks == nil {
		if _, err := identity.NewJWT(*o); err != nil {
			v.fail(at, "%s", strings.TrimPrefix(strings.TrimPrefix(err.Error(), "identity: "), "JWT: "))
		}
	}
	return o, jwks
}

// jwtKeys loads a jwt section's keys; algs are its valid algorithms.
func (v *validator) jwtKeys(at string, raw []rawJWTKey, algs []string) []identity.JWTKey {
	var keys []identity.JWTKey
	first := map[string]string{} // key id → field path
	for j, k := range raw {
		kat := fmt.Sprintf("%s[%d]", at, j)
		sources := 0
		for _, s := range []string{k.PEMFile, k.SecretEnv, k.SecretFile} {
			if s != "" {
				sources++
			}
		}
		switch {
		case sources == 0:
			v.require(kat, "needs pem_file, secret_env or secret_file")
			continue
		case sources > 1:
			v.fail(kat, "set one of pem_file, secret_env or secret_file")
			continue
		}
		switch f, dup := first[k.ID]; {
		case k.ID == "" && len(raw) > 1:
			v.require(kat+".id", "missing (with several keys each needs an id, matched against the token's kid)")
		case dup && k.ID != "":
			v.fail(kat+".id", "duplicate key id %q (first at line %d)", k.ID, v.line(f))
		default:
			first[k.ID] = kat + ".id"
		}

		key, err := (&spec.JWTKey{ID: k.ID, PEMFile: k.PEMFile, SecretEnv: k.SecretEnv, SecretFile: k.SecretFile}).Resolve(resolver{v})
		if err != nil {
			e := err.(*spec.Error)
			v.fail(kat+"."+e.Path, "%s", e.Problem)
			continue
		}
		what, fits := spec.KeyAlgorithms(key.Key)
		if len(algs) > 0 && !slices.ContainsFunc(algs, func(a string) bool { return slices.Contains(fits, a) }) {
			v.fail(kat, "%s fits none of the algorithms [%s] (it verifies %s)", what, strings.Join(algs, ", "), orList(fits))
			continue
		}
		keys = append(keys, key)
	}
	return keys
}

// jwks validates a jwt section's jwks block.
func (v *validator) jwks(at string, r *rawJWKS) *identity.JWKSOptions {
	o := &identity.JWKSOptions{
		URL:             r.URL,
		RefreshInterval: v.duration(at+".refresh_interval", r.RefreshInterval, identity.DefaultJWKSRefresh),
	}
	switch err := spec.CheckJWKSURL(r.URL); {
	case r.URL == "":
		v.require(at+".url", "missing (the identity provider's JWK Set, like https://idp.example/.well-known/jwks.json)")
	case err != nil:
		v.fail(at+".url", "%s", strings.TrimPrefix(err.Error(), "spec: "))
	}
	return o
}
