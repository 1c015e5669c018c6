package config

import (
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/limitplane/limitplane/spec"
)

// resolver resolves a file's secret references for spec (spec.Resolver):
// files relative to the configuration file's directory, with readFile's
// limits, and the process environment.
type resolver struct{ v *validator }

func (r resolver) ReadFile(name string) ([]byte, error) { return r.v.readFile(name) }

func (r resolver) LookupEnv(name string) (string, bool) { return os.LookupEnv(name) }

// snapshot builds, with slices of its own, the travelling part of a file that validated without a
// problem: its policies, keys (hashed: cfg.Keys holds the hashes of
// plaintext keys) and APIs, with listen paths normalised. It then checks
// the snapshot with spec's own Validate, so the file can never hold what
// a control plane would refuse; such a problem is reported at its field.
func (v *validator) snapshot(raw *rawConfig, cfg *Config) spec.Snapshot {
	var s spec.Snapshot
	for _, p := range raw.Policies {
		s.Policies = append(s.Policies, spec.Policy{ID: p.ID, Rate: specRate(p.Rate), Quota: specQuota(p.Quota), APIs: slices.Clone(p.APIs), Shadow: p.Shadow, Distributed: p.Distributed})
	}
	for i, k := range raw.Keys {
		sk := spec.Key{KeyHash: cfg.Keys[i].Hash.String(), Policies: slices.Clone(k.Policies), Inactive: k.Inactive, QuotaEpoch: k.QuotaEpoch}
		if k.Expires != "" {
			t := cfg.Keys[i].Expires
			sk.Expires = &t
		}
		for id, l := range k.APILimits {
			if sk.APILimits == nil {
				sk.APILimits = map[string]spec.Limits{}
			}
			sk.APILimits[id] = spec.Limits{Rate: specRate(l.Rate), Quota: specQuota(l.Quota), QuotaEpoch: l.QuotaEpoch}
		}
		s.Keys = append(s.Keys, sk)
	}
	for i, a := range raw.APIs {
		sa := spec.API{
			ID: a.ID, ListenPath: cfg.APIs[i].ListenPath, Target: a.Target, Auth: a.Auth, Policies: slices.Clone(a.Policies),
			StripListenPath: a.StripListenPath, StripAuthData: a.StripAuthData, Tags: slices.Clone(a.Tags),
		}
		if a.FailureLimit != nil {
			sa.FailureLimit = &spec.FailureLimit{Policy: a.FailureLimit.Policy}
		}
		if j := a.JWT; j != nil {
			sj := &spec.JWT{
				Algorithms: j.Algorithms, Issuer: j.Issuer, Audience: j.Audience, Leeway: specDuration(j.Leeway),
				ConsumerClaim: j.ConsumerClaim, PolicyClaim: j.PolicyClaim, DefaultPolicies: j.DefaultPolicies,
			}
			for _, k := range j.Keys {
				sj.Keys = append(sj.Keys, spec.JWTKey{ID: k.ID, PEMFile: k.PEMFile, SecretEnv: k.SecretEnv, SecretFile: k.SecretFile})
			}
			if j.JWKS != nil {
				sj.JWKS = &spec.JWKS{URL: j.JWKS.URL, RefreshInterval: specDuration(j.JWKS.RefreshInterval)}
			}
			sa.JWT = sj
		}
		s.APIs = append(s.APIs, sa)
	}
	if err := s.Validate(); err != nil {
		for _, e := range err.(spec.Errors) {
			path := e.Path
			if i, ok := plaintextKeyHash(path, raw); ok {
				path = fmt.Sprintf("keys[%d].key", i) // the file gave the key, not its hash
			}
			v.fail(path, "%s", e.Problem)
		}
	}
	return s
}

// plaintextKeyHash reports whether path is keys[i].key_hash of a key the
// file gave in plaintext, and i.
func plaintextKeyHash(path string, raw *rawConfig) (int, bool) {
	var i int
	if _, err := fmt.Sscanf(path, "keys[%d].key_hash", &i); err != nil || i < 0 || i >= len(raw.Keys) {
		return 0, false
	}
	return i, raw.Keys[i].KeyHash == "" && path == fmt.Sprintf("keys[%d].key_hash", i)
}

func specRate(r *rawRate) *spec.Rate {
	if r == nil {
		return nil
	}
	out := &spec.Rate{Per: specDuration(r.Per), Algorithm: r.Algorithm}
	if r.Requests != nil {
		out.Requests = *r.Requests
	}
	if r.Burst != nil {
		out.Burst = *r.Burst
	}
	return out
}

func specQuota(q *rawQuota) *spec.Quota {
	if q == nil {
		return nil
	}
	out := &spec.Quota{Renewal: specDuration(q.Renewal)}
	if q.Max != nil {
		out.Max = *q.Max
	}
	return out
}

// specDuration converts a duration the validator has accepted; "" is 0.
func specDuration(s string) spec.Duration {
	d, _ := time.ParseDuration(s)
	return spec.Duration(d)
}
