package spec

import (
	"errors"
	"fmt"
	"net/url"
	"path"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/identity"
)

// Error is one problem in a Snapshot.
type Error struct {
	// Path is the offending field, as the YAML file and the JSON form
	// name it: "policies[1].rate.per", "keys[0].api_limits.orders".
	Path string
	// Problem says what is wrong, without the path.
	Problem string
	// Missing marks a problem that something required is left out (a
	// field, an entry or one of several alternatives).
	Missing bool
	// Unknown is set on a reference to an id that names nothing: the
	// list the id was looked up in, "policies" or "apis".
	Unknown string
	// First is set on a problem that repeats an earlier field (a
	// duplicate id, key or listen path): that field's path, which
	// Problem names too.
	First string
}

// Error returns "spec: path: problem".
func (e *Error) Error() string { return "spec: " + e.Path + ": " + e.Problem }

// Errors is every problem Validate found: the policies', then the APIs',
// then the policies' references to APIs, then the keys', each part in
// order. It is never empty when returned as an error.
type Errors []*Error

// Error returns the problems one per line.
func (es Errors) Error() string {
	s := make([]string, len(es))
	for i, e := range es {
		s[i] = e.Error()
	}
	return strings.Join(s, "\n")
}

// Validate checks the snapshot as a whole: that every policy, key and API
// can be enforced, that IDs, key hashes and listen paths are unique, and
// that every reference (a key's policies, a policy's APIs, a keyless API's
// policies, JWT default policies, failure limits, api_limits) names
// something that exists and fits. It returns nil or an Errors listing
// every problem, each with its path. It reads no file and no environment
// variable: secret references are checked only for their form (see
// Resolver).
func (s *Snapshot) Validate() error {
	v := &validator{}
	v.snapshot(s)
	if len(v.errs) == 0 {
		return nil
	}
	return v.errs
}

// ValidateSharded is Validate for a control plane's whole state, which no
// gateway runs as a whole: each data plane receives the APIs its tags
// select (API sharding). It differs in one rule: two APIs may have the
// same listen path when both have tags and they share none, so that one
// API can be defined once per data plane, each copy with its own share of
// a limit (per-data-plane allocation). A data plane whose tags select
// both copies receives both, and its gateways refuse that snapshot with
// Validate's "same path" error.
func (s *Snapshot) ValidateSharded() error {
	v := &validator{sharded: true}
	v.snapshot(s)
	if len(v.errs) == 0 {
		return nil
	}
	return v.errs
}

type validator struct {
	errs Errors
	// sharded: the snapshot is a control plane's whole state
	// (ValidateSharded).
	sharded bool
}

func (v *validator) fail(path, format string, args ...any) *Error {
	e := &Error{Path: path, Problem: fmt.Sprintf(format, args...)}
	v.errs = append(v.errs, e)
	return e
}

// missing records that something required at path is left out.
func (v *validator) missing(path, format string, args ...any) {
	v.fail(path, format, args...).Missing = true
}

// unknown records a reference at path to an id that is not in list
// ("policies" or "apis").
func (v *validator) unknown(path, list, format string, args ...any) {
	v.fail(path, format, args...).Unknown = list
}

// repeats records that path repeats the field first.
func (v *validator) repeats(path, first, format string, args ...any) {
	v.fail(path, format, args...).First = first
}

func (v *validator) snapshot(s *Snapshot) {
	policies := map[string]*Policy{}
	first := map[string]string{}
	for i := range s.Policies {
		p := &s.Policies[i]
		at := fmt.Sprintf("policies[%d]", i)
		switch f, dup := first[p.ID]; {
		case p.ID == "":
			v.missing(at+".id", "missing")
		case !validID(p.ID):
			v.fail(at+".id", "%q: %s", p.ID, idRule)
		case dup:
			v.repeats(at+".id", f, "duplicate policy id %q (first at %s)", p.ID, f)
		default:
			first[p.ID] = at + ".id"
			policies[p.ID] = p
		}
		v.rate(at+".rate", p.Rate)
		v.quota(at+".quota", p.Quota)
		if p.InFlight < 0 || p.InFlight > core.MaxCount {
			v.fail(at+".in_flight", "%d must be in [0, 2^53) (0: no in-flight limit)", p.InFlight)
		}
		switch {
		case p.Settle && p.Quota == nil:
			v.fail(at+".settle", "settles the quota's charge after the response, but the policy has no quota: give it one")
		case p.Settle && p.Quota.Max == core.Unlimited:
			v.fail(at+".settle", "settles the quota's charge after the response, but the quota is unlimited (max: -1) and charges nothing: give it a max")
		}
	}

	apis := map[string]*API{}
	firstAPI := map[string]string{}
	paths := map[string][]int{} // clean listen path → indexes of the APIs on it
	for i := range s.APIs {
		a := &s.APIs[i]
		at := fmt.Sprintf("apis[%d]", i)
		switch f, dup := firstAPI[a.ID]; {
		case a.ID == "":
			v.missing(at+".id", "missing")
		case !validID(a.ID):
			v.fail(at+".id", "%q: %s", a.ID, idRule)
		case dup:
			v.repeats(at+".id", f, "duplicate API id %q (first at %s)", a.ID, f)
		default:
			firstAPI[a.ID] = at + ".id"
			apis[a.ID] = a
		}
		if a.ServiceSide() {
			// A service's own API: no route, no upstream.
		} else if a.ListenPath == "" || a.Target == "" {
			field, other := "listen_path", "target"
			if a.Target == "" {
				field, other = "target", "listen_path"
			}
			v.missing(at+"."+field, "missing: an API served by a gateway has both listen_path and target; one served by a service (dataplane.Follow) has neither (%s is set)", other)
		} else if lp, err := CleanListenPath(a.ListenPath); err != nil {
			v.fail(at+".listen_path", "%s", problem(err))
		} else if j, dup := v.samePath(s.APIs, paths[lp], a); dup {
			v.repeats(at+".listen_path", fmt.Sprintf("apis[%d].listen_path", j), "%q is the same path as apis[%d].listen_path", a.ListenPath, j)
		} else {
			paths[lp] = append(paths[lp], i)
		}
		v.api(at, a, policies)
	}
	for i, p := range s.Policies {
		for j, id := range p.APIs {
			if apis[id] == nil {
				v.unknown(fmt.Sprintf("policies[%d].apis[%d]", i, j), "apis", "unknown API %q", id)
			}
		}
	}
	for i := range s.Policies {
		v.policyEndpoints(fmt.Sprintf("policies[%d]", i), &s.Policies[i], apis)
		v.thresholds(fmt.Sprintf("policies[%d]", i), &s.Policies[i])
	}

	// A snapshot may hold a million keys: a key's path is written only
	// when it has a problem.
	keyAt := func(i int) string { return "keys[" + strconv.Itoa(i) + "]" }
	firstKey := make(map[identity.KeyHash]int, len(s.Keys))
	for i := range s.Keys {
		k := &s.Keys[i]
		if h, err := identity.ParseKeyHash(k.KeyHash); err != nil {
			v.keyHash(keyAt(i), k)
		} else if f, dup := firstKey[h]; dup {
			v.repeats(keyAt(i)+".key_hash", keyAt(f), "same key as %s", keyAt(f))
		} else {
			firstKey[h] = i
		}
		if len(k.APILimits) > 0 || !knownPolicies(k.Policies, policies) {
			v.key(keyAt(i), k, policies, apis)
		}
	}
}

// knownPolicies reports whether ids is not empty and policies holds each
// (then key finds nothing wrong with a key without api_limits).
func knownPolicies(ids []string, policies map[string]*Policy) bool {
	for _, id := range ids {
		if policies[id] == nil {
			return false
		}
	}
	return len(ids) > 0
}

// idRule says what validID accepts.
const idRule = "an id is 1 to 128 letters, digits, '.', '_', ':' or '-', and not \".\" or \"..\""

// validID reports whether id may name a policy or an API: 1 to 128 ASCII
// letters, digits, '.', '_', ':' and '-', but not "." or ".." (a URL
// path segment that means the directory itself or its parent, so no
// admin API URL could name the object). Policy IDs become names in the
// RateLimit header fields (a quota's is the ID and "/quota", so a "/" in an
// ID could name two limits alike) and both appear in URLs of the admin
// APIs and in metric labels.
func validID(id string) bool {
	if len(id) == 0 || len(id) > 128 || id == "." || id == ".." {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == ':' || c == '-') {
			return false
		}
	}
	return true
}

// samePath returns the first API among on (indexes into apis) whose
// listen path a may not share: any of them, or under ValidateSharded only
// one that has no tags or a tag in common with a.
func (v *validator) samePath(apis []API, on []int, a *API) (int, bool) {
	for _, j := range on {
		if !v.sharded || !disjointTags(apis[j].Tags, a.Tags) {
			return j, true
		}
	}
	return 0, false
}

// disjointTags reports whether a and b both have tags and share none.
func disjointTags(a, b []string) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	for _, t := range a {
		if slices.Contains(b, t) {
			return false
		}
	}
	return true
}

// ValidateKey checks one key as Validate checks each of a snapshot's keys,
// against the policies and APIs it may refer to (by ID): a valid key hash,
// policies or api_limits, every policy known, every api_limits entry an
// API that is not keyless, with a valid rate or quota. Uniqueness of the
// hash, which needs the whole key list, is the caller's to check. at
// prefixes every path ("keys[3]" gives "keys[3].policies[0]"). It returns
// nil or an Errors listing every problem.
func ValidateKey(at string, k *Key, policies map[string]*Policy, apis map[string]*API) error {
	v := &validator{}
	v.keyHash(at, k)
	v.key(at, k, policies, apis)
	if len(v.errs) == 0 {
		return nil
	}
	return v.errs
}

// keyHash checks and parses k's hash.
func (v *validator) keyHash(at string, k *Key) (identity.KeyHash, bool) {
	h, err := identity.ParseKeyHash(k.KeyHash)
	switch {
	case k.KeyHash == "":
		v.missing(at+".key_hash", "missing (sha256:<64 hex digits>)")
	case err != nil:
		v.fail(at+".key_hash", "%q is not sha256:<64 hex digits>", k.KeyHash)
	}
	return h, err == nil
}

// key checks k's references and limits (everything but its hash).
func (v *validator) key(at string, k *Key, policies map[string]*Policy, apis map[string]*API) {
	for j, id := range k.Policies {
		if policies[id] == nil {
			v.unknown(fmt.Sprintf("%s.policies[%d]", at, j), "policies", "unknown policy %q", id)
		}
	}
	if len(k.Policies) == 0 && len(k.APILimits) == 0 {
		v.missing(at+".policies", "a key needs at least one policy (or api_limits)")
	}
	ids := make([]string, 0, len(k.APILimits))
	for id := range k.APILimits {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		lat := at + ".api_limits." + id
		l := k.APILimits[id]
		switch a := apis[id]; {
		case a == nil:
			v.unknown(lat, "apis", "unknown API %q", id)
		case a.Auth == AuthKeyless:
			v.fail(lat, "API %q is keyless; api_limits only apply to api_key APIs", id)
		}
		if l.Rate == nil && l.Quota == nil {
			v.missing(lat, "needs rate or quota")
		}
		v.rate(lat+".rate", l.Rate)
		v.quota(lat+".quota", l.Quota)
	}
}

// rate checks a rate block; nil is absent and valid.
func (v *validator) rate(at string, r *Rate) {
	if r == nil {
		return
	}
	n0 := len(v.errs)
	unlimited := r.Requests == core.Unlimited
	if !unlimited {
		v.count(at+".requests", r.Requests, r.noRequests, "requests per period")
	}
	v.period(at+".per", r.Per, r.zeroPer, unlimited, "1s, 1m or 24h")
	if unlimited && (r.Burst != 0 || r.zeroBurst) {
		v.fail(at+".burst", "an unlimited rate (requests -1) has no burst; leave burst out")
	}
	if r.Burst < 0 || r.zeroBurst {
		v.fail(at+".burst", "%d must be > 0 (leave it out to use requests)", r.Burst)
	}
	alg, err := core.ParseAlgorithm(r.Algorithm)
	switch {
	case err != nil:
		v.fail(at+".algorithm", "unknown algorithm %q (want gcra, sliding_window, fixed_window or sliding_log)", r.Algorithm)
	case alg != core.GCRA && (r.Burst != 0 || r.zeroBurst):
		v.fail(at+".burst", "%s has no burst (it counts up to requests per per); leave burst out", alg)
	}
	if len(v.errs) > n0 || unlimited {
		return
	}
	if err := r.Limit().Validate(); err != nil {
		v.fail(at, "%s", strings.TrimPrefix(err.Error(), core.ErrInvalidLimit.Error()+": "))
	}
}

// count checks a limit's count (a rate's requests, a quota's max) other
// than -1, unlimited; missing reports it left out; what is what it counts.
// The count and the period are checked apart, so that a block wrong in
// both is told both.
func (v *validator) count(at string, n int64, missing bool, what string) {
	switch {
	case missing:
		v.missing(at, "missing (%s, or -1 for unlimited)", what)
	case n <= 0:
		v.fail(at, "%d must be > 0 (or -1 for unlimited)", n)
	}
}

// period checks a limit's period (a rate's per, a quota's renewal); zero
// reports a 0 written out, optional a period that may be left out (that of
// an unlimited limit), like the examples given when one must not be.
func (v *validator) period(at string, d Duration, zero, optional bool, like string) {
	switch {
	case d < 0 || zero:
		v.fail(at, "%s must be > 0", d)
	case d == 0 && !optional:
		v.missing(at, "missing (the period, like %s)", like)
	}
}

// quota checks a quota block; nil is absent and valid.
func (v *validator) quota(at string, q *Quota) {
	if q == nil {
		return
	}
	unlimited := q.Max == core.Unlimited
	n0 := len(v.errs)
	if !unlimited {
		v.count(at+".max", q.Max, q.noMax, "requests per renewal period")
	}
	v.period(at+".renewal", q.Renewal, q.zeroRenewal, unlimited, "1h or 720h")
	if unlimited {
		if q.Global != nil {
			v.fail(at+".global", "an unlimited quota (max -1) cannot be global")
		}
		return
	}
	valid := len(v.errs) == n0
	if valid {
		if err := q.Quota().Validate(); err != nil {
			v.fail(at, "%s", strings.TrimPrefix(err.Error(), core.ErrInvalidLimit.Error()+": "))
		}
	}
	v.global(at+".global", q, valid)
}

// global checks a quota's global block; nil is absent and valid. Its
// floor and lease are compared with the quota's max and renewal only when
// those are valid (counted).
func (v *validator) global(at string, q *Quota, counted bool) {
	g := q.Global
	if g == nil {
		return
	}
	switch {
	case g.Mode == "":
		v.missing(at+".mode", "missing (strict, reserved or optimistic)")
	case !slices.Contains(globalModes, g.Mode):
		v.fail(at+".mode", "%q is not a mode (strict, reserved or optimistic)", g.Mode)
	case g.Mode == "strict" && g.Floor != 0:
		v.fail(at+".floor", "a strict quota has no floor (use reserved or optimistic)")
	}
	switch {
	case g.Floor < 0:
		v.fail(at+".floor", "%d must be ≥ 0", g.Floor)
	case counted && g.Floor > q.Max:
		v.fail(at+".floor", "%d is above the quota's max %d", g.Floor, q.Max)
	}
	switch {
	case g.LeaseDuration < 0:
		v.fail(at+".lease_duration", "%s must be > 0", g.LeaseDuration)
	case counted && g.LeaseDuration > q.Renewal:
		v.fail(at+".lease_duration", "%s is longer than the quota's renewal %s", g.LeaseDuration, q.Renewal)
	}
}

func (v *validator) api(at string, a *API, policies map[string]*Policy) {
	if a.Target != "" {
		if _, err := ParseTarget(a.Target); err != nil {
			v.fail(at+".target", "%s", problem(err))
		}
	}
	knownAuth := true
	switch a.Auth {
	case "", AuthAPIKey, AuthKeyless, AuthJWT:
	default:
		knownAuth = false
		v.fail(at+".auth", "unknown auth %q (want api_key, keyless or jwt)", a.Auth)
	}
	keyless := a.Auth == AuthKeyless
	if a.StripAuthData != nil && keyless {
		v.fail(at+".strip_auth_data", "a keyless API reads no credentials, so there are none to strip")
	}
	switch {
	case !knownAuth:
	case a.Auth == AuthJWT && len(a.Policies) > 0:
		v.fail(at+".policies", "only keyless APIs take policies; a jwt API takes them from the token's policy claim or jwt.default_policies")
	case !keyless && len(a.Policies) > 0:
		v.fail(at+".policies", "only keyless APIs take policies; an api_key API applies each key's own policies")
	case keyless && len(a.Policies) == 0:
		v.missing(at+".policies", "a keyless API needs at least one policy (applied per client IP)")
	}
	if keyless {
		for j, id := range a.Policies {
			v.policyFor(fmt.Sprintf("%s.policies[%d]", at, j), id, a.ID, policies)
		}
	}
	switch {
	case a.Auth == AuthJWT && a.JWT == nil:
		v.missing(at+".jwt", "missing (auth: jwt needs algorithms, and keys or jwks)")
	case a.Auth == AuthJWT:
		v.jwt(at+".jwt", a.ID, a.JWT, policies)
	case a.JWT != nil && knownAuth:
		v.fail(at+".jwt", "only used with auth: jwt")
	}
	if fl := a.FailureLimit; fl != nil {
		fat := at + ".failure_limit"
		p := policies[fl.Policy]
		switch {
		case keyless:
			v.fail(fat, "a keyless API asks for no credentials, so no attempt can fail")
		case fl.Policy == "":
			v.missing(fat+".policy", "missing (the policy failed attempts are charged to, per client IP)")
		case p == nil:
			v.unknown(fat+".policy", "policies", "unknown policy %q", fl.Policy)
		case len(p.APIs) > 0:
			v.fail(fat+".policy", "policy %q has an apis list; failures are charged outside any API, so a failure_limit policy must leave apis out", fl.Policy)
		case p.Idle():
			v.fail(fat+".policy", "policy %q limits nothing (give it a rate or a quota)", fl.Policy)
		}
	}
	v.endpoints(at, a, policies)
	v.costHeader(at, a)
	switch h := a.SettleHeader; {
	case h == "":
	case !headerName(h):
		v.fail(at+".settle_header", "%q is not an HTTP field name", h)
	case hopByHop(h):
		v.fail(at+".settle_header", "%q is a hop-by-hop field, which a proxy drops before anything reads it: a field of its own, like X-Usage-Tokens", h)
	case strings.EqualFold(h, "Set-Cookie"):
		v.fail(at+".settle_header", "%q carries credentials (cookies): a field of its own, like X-Usage-Tokens", h)
	}
	seen := map[string]bool{}
	for j, t := range a.Tags {
		tat := fmt.Sprintf("%s.tags[%d]", at, j)
		switch {
		case t == "":
			v.fail(tat, "empty tag")
		case seen[t]:
			v.fail(tat, "tag %q is listed twice", t)
		}
		seen[t] = true
	}
}

// thresholds checks a policy's quota thresholds.
func (v *validator) thresholds(at string, p *Policy) {
	if len(p.Thresholds) == 0 {
		return
	}
	switch {
	case p.Quota == nil || p.Quota.Max == core.Unlimited:
		v.fail(at+".thresholds", "thresholds are percentages of the policy's quota: give it a quota (not -1)")
	case p.Quota.Global != nil:
		v.fail(at+".thresholds", "not counted for a global quota (a data plane sees only its leases, not what every data plane spent)")
	}
	first := map[int64]int{}
	for j, t := range p.Thresholds {
		tat := fmt.Sprintf("%s.thresholds[%d]", at, j)
		switch f, dup := first[t]; {
		case t < 1 || t > 100:
			v.fail(tat, "%d: a threshold is a percentage of the quota, 1 to 100", t)
		case dup:
			v.repeats(tat, fmt.Sprintf("%s.thresholds[%d]", at, f), "%d%% is listed twice (first at %s.thresholds[%d])", t, at, f)
		default:
			first[t] = j
		}
	}
}

// costHeader checks an API's cost_header and max_cost.
func (v *validator) costHeader(at string, a *API) {
	switch {
	case a.CostHeader == "" && a.MaxCost != nil:
		v.fail(at+".max_cost", "only used with cost_header")
	case a.CostHeader == "":
	case !validHeaderName(a.CostHeader):
		v.fail(at+".cost_header", "%q is not a header name (letters, digits and !#$%%&'*+-.^_`|~)", a.CostHeader)
	case credentialHeader(a.CostHeader):
		v.fail(at+".cost_header", "%q carries credentials (API keys, tokens, cookies): a cost header of its own, like X-Cost", a.CostHeader)
	case a.MaxCost == nil:
		v.missing(at+".max_cost", "missing (the largest cost cost_header may ask, 1 to 2^53 − 1)")
	case *a.MaxCost < 1 || *a.MaxCost > core.MaxCost:
		v.fail(at+".max_cost", "%d: a cost is 1 to 2^53 − 1", *a.MaxCost)
	}
}

// hopByHop reports whether name (in any case) is a hop-by-hop field
// (RFC 9110 section 7.6.1, and Keep-Alive, Proxy-Connection and
// Proxy-Authenticate, which proxies drop too): the gateway's proxy
// removes it from the upstream's response, so a settle header by that
// name would never be read.
func hopByHop(name string) bool {
	for _, h := range []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection", "TE", "Trailer", "Transfer-Encoding", "Upgrade"} {
		if strings.EqualFold(h, name) {
			return true
		}
	}
	return false
}

// credentialHeader reports whether name (in any case) is a header a
// limitplane authenticator reads credentials from (identity's default
// sources for API keys and JWTs) or Cookie: a cost read from it would
// refuse every valid key that is not a number, and count a numeric one.
func credentialHeader(name string) bool {
	if strings.EqualFold(name, "Cookie") {
		return true
	}
	for _, src := range [][]identity.Source{identity.DefaultKeySources(), identity.DefaultJWTSources()} {
		for _, s := range src {
			if s.In == identity.InHeader && strings.EqualFold(s.Name, name) {
				return true
			}
		}
	}
	return false
}

// validHeaderName reports whether s is an HTTP field name (RFC 9110's
// token) of at most 128 bytes.
func validHeaderName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// endpoints checks an API's endpoints: method, path, no two alike,
// policies that exist, cover the API and count per data plane, a cost in
// range.
func (v *validator) endpoints(at string, a *API, policies map[string]*Policy) {
	first := map[string]string{}
	for j, ep := range a.Endpoints {
		eat := fmt.Sprintf("%s.endpoints[%d]", at, j)
		ok := true
		trim := func(err error) string { return strings.TrimPrefix(err.Error(), core.ErrInvalidEndpoint.Error()+": ") }
		if err := core.CheckEndpointMethod(ep.Method); err != nil {
			ok = false
			v.fail(eat+".method", "%s", trim(err))
		}
		if err := core.CheckEndpointPath(ep.Path); err != nil {
			ok = false
			if ep.Path == "" {
				v.missing(eat+".path", "%s", trim(err))
			} else {
				v.fail(eat+".path", "%s", trim(err))
			}
		}
		if ok {
			key := core.EndpointKey(ep.Method, ep.Path)
			if f, dup := first[key]; dup {
				v.repeats(eat+".path", f, "duplicate endpoint %s (first at %s)", key, f)
			} else {
				first[key] = eat + ".path"
			}
		}
		for k, id := range ep.Policies {
			pat := fmt.Sprintf("%s.policies[%d]", eat, k)
			v.policyFor(pat, id, a.ID, policies)
			if p := policies[id]; p != nil && p.Quota != nil && p.Quota.Global != nil {
				v.fail(pat, "policy %q has a global quota; an endpoint's quotas are counted per data plane (leave global out, or put the quota on the key's policies)", id)
			}
		}
		switch {
		case ep.Cost != nil && (*ep.Cost < 1 || *ep.Cost > core.MaxCost):
			v.fail(eat+".cost", "%d: a cost is 1 to 2^53 − 1 (left out: the request's own)", *ep.Cost)
		case len(ep.Policies) == 0 && ep.Cost == nil:
			v.missing(eat+".policies", "missing (an endpoint needs policies, a cost, or both)")
		}
	}
}

// policyEndpoints checks a policy's own endpoint limits (at is the
// policy's path): each names an endpoint of an API the policy covers,
// once, with a rate or a quota that is valid and not global.
func (v *validator) policyEndpoints(at string, p *Policy, apis map[string]*API) {
	seen := map[string]string{}
	for j, pe := range p.Endpoints {
		eat := fmt.Sprintf("%s.endpoints[%d]", at, j)
		v.rate(eat+".rate", pe.Rate)
		v.quota(eat+".quota", pe.Quota)
		switch {
		case pe.Rate == nil && pe.Quota == nil:
			v.missing(eat, "needs rate or quota")
		case pe.Quota != nil && pe.Quota.Global != nil:
			v.fail(eat+".quota.global", "an endpoint's quotas are counted per data plane; leave global out")
		}
		a := apis[pe.API]
		switch {
		case pe.API == "":
			v.missing(eat+".api", "missing (the id of the API whose endpoint this limits)")
			continue
		case a == nil:
			v.unknown(eat+".api", "apis", "unknown API %q", pe.API)
			continue
		case len(p.APIs) > 0 && !slices.Contains(p.APIs, pe.API):
			v.fail(eat+".api", "the policy does not cover API %q (its apis list leaves it out)", pe.API)
		}
		ok := true
		if err := core.CheckEndpointMethod(pe.Method); err != nil {
			ok = false
			v.fail(eat+".method", "%s", strings.TrimPrefix(err.Error(), core.ErrInvalidEndpoint.Error()+": "))
		}
		if err := core.CheckEndpointPath(pe.Path); err != nil {
			ok = false
			if pe.Path == "" {
				v.missing(eat+".path", "%s", strings.TrimPrefix(err.Error(), core.ErrInvalidEndpoint.Error()+": "))
			} else {
				v.fail(eat+".path", "%s", strings.TrimPrefix(err.Error(), core.ErrInvalidEndpoint.Error()+": "))
			}
		}
		if !ok {
			continue
		}
		key := core.EndpointKey(pe.Method, pe.Path)
		if !slices.ContainsFunc(a.Endpoints, func(ep Endpoint) bool {
			return core.CheckEndpoint(ep.Method, ep.Path) == nil && core.EndpointKey(ep.Method, ep.Path) == key
		}) {
			v.fail(eat+".path", "API %q has no endpoint %s (list it in its endpoints first)", pe.API, key)
			continue
		}
		if f, dup := seen[pe.API+" "+key]; dup {
			v.repeats(eat+".path", f, "the policy already limits %s of API %q (at %s)", key, pe.API, f)
		} else {
			seen[pe.API+" "+key] = eat + ".path"
		}
	}
}

// policyFor checks that the policy id, named at path for the API apiID,
// exists and covers that API.
func (v *validator) policyFor(path, id, apiID string, policies map[string]*Policy) {
	p := policies[id]
	switch {
	case p == nil:
		v.unknown(path, "policies", "unknown policy %q", id)
	case len(p.APIs) > 0 && apiID != "" && !slices.Contains(p.APIs, apiID):
		v.fail(path, "policy %q does not cover API %q (its apis list leaves it out)", id, apiID)
	}
}

func (v *validator) jwt(at, apiID string, j *JWT, policies map[string]*Policy) {
	if len(j.Algorithms) == 0 {
		v.missing(at+".algorithms", "missing (pin the accepted algorithms, like [RS256])")
	}
	var algs []string
	for i, alg := range j.Algorithms {
		f := fmt.Sprintf("%s.algorithms[%d]", at, i)
		if p := JWTAlgorithmProblem(alg, algs, j.JWKS != nil); p != "" {
			v.fail(f, "%s", p)
		} else {
			algs = append(algs, alg)
		}
	}
	switch {
	case len(j.Keys) > 0 && j.JWKS != nil:
		v.fail(at, "set keys or jwks, not both")
	case len(j.Keys) == 0 && j.JWKS == nil:
		v.missing(at, "needs keys (pem_file, secret_env or secret_file) or jwks (url)")
	case j.JWKS != nil:
		if err := CheckJWKSURL(j.JWKS.URL); err != nil {
			v.fail(at+".jwks.url", "%s", problem(err))
		}
		if j.JWKS.RefreshInterval < 0 || j.JWKS.zeroRefresh {
			v.fail(at+".jwks.refresh_interval", "%s must be > 0", j.JWKS.RefreshInterval)
		}
	default:
		first := map[string]string{}
		for i, k := range j.Keys {
			kat := fmt.Sprintf("%s.keys[%d]", at, i)
			n := 0
			for _, s := range []string{k.PEMFile, k.SecretEnv, k.SecretFile, k.PEM, k.Secret} {
				if s != "" {
					n++
				}
			}
			switch {
			case n == 0:
				v.missing(kat, "needs pem_file, secret_env or secret_file")
			case n > 1:
				v.fail(kat, "set one of pem_file, secret_env or secret_file")
			case k.Secret != "" && len(k.Secret) < identity.MinHMACKeySize:
				v.fail(kat+".secret", "the inline secret holds %d bytes; an HMAC secret needs at least %d", len(k.Secret), identity.MinHMACKeySize)
			case k.PEM != "":
				key, err := identity.ParseJWTKeyPEM(k.ID, []byte(k.PEM))
				if err != nil {
					v.fail(kat+".pem", "%s", strings.TrimPrefix(err.Error(), "identity: "))
				} else {
					v.keyFits(kat, key.Key, algs, len(algs) == len(j.Algorithms))
				}
			}
			if n == 1 && (k.SecretEnv != "" || k.SecretFile != "" || k.Secret != "") {
				// Whatever the host holds, a secret is an HMAC key.
				v.keyFits(kat, []byte(nil), algs, len(algs) == len(j.Algorithms))
			}
			switch f, dup := first[k.ID]; {
			case k.ID == "" && len(j.Keys) > 1:
				v.missing(kat+".id", "missing (with several keys each needs an id, matched against the token's kid)")
			case dup && k.ID != "":
				v.repeats(kat+".id", f, "duplicate key id %q (first at %s)", k.ID, f)
			default:
				first[k.ID] = kat + ".id"
			}
		}
	}
	if j.Leeway < 0 {
		v.fail(at+".leeway", "%s must be >= 0", j.Leeway)
	}
	if j.PolicyClaim == "" && len(j.DefaultPolicies) == 0 {
		v.missing(at, "needs policy_claim or default_policies (a token without policies would be refused with 403)")
	}
	for i, id := range j.DefaultPolicies {
		v.policyFor(fmt.Sprintf("%s.default_policies[%d]", at, i), id, apiID, policies)
	}
}

// keyFits checks that a JWT key (an identity.JWTKey's Key) verifies one
// of algs, the API's valid algorithms; complete says none was invalid (an
// invalid list has its own error, and this one would only add noise).
// The gateway's file words the same problem of a key it read alike.
func (v *validator) keyFits(at string, key any, algs []string, complete bool) {
	what, fits := KeyAlgorithms(key)
	if len(algs) == 0 || !complete || slices.ContainsFunc(algs, func(a string) bool { return slices.Contains(fits, a) }) {
		return
	}
	v.fail(at, "%s fits none of the algorithms [%s] (it verifies %s)", what, strings.Join(algs, ", "), orList(fits))
}

// problem returns err's text without the "spec: " prefix.
func problem(err error) string { return strings.TrimPrefix(err.Error(), "spec: ") }

// jwtAlgorithms are the JWS algorithms an API can pin, in the order
// messages list them. "none" is never among them.
var jwtAlgorithms = []string{
	"HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
	"ES256", "ES384", "ES512", "EdDSA",
}

// JWTAlgorithms returns the JWS algorithms a JWT may pin, in a fixed
// order: HS*, RS*, PS*, ES* and EdDSA. "none" is never among them.
func JWTAlgorithms() []string { return slices.Clone(jwtAlgorithms) }

// orList writes items as "a, b or c".
// JWTAlgorithmProblem says what is wrong with alg as an entry of a jwt's
// algorithms list, or returns "" when it is accepted. valid are the
// accepted entries before it; jwks says the keys come from a JWK Set,
// which publishes public keys only. The gateway's file and Validate word
// their problems with it.
func JWTAlgorithmProblem(alg string, valid []string, jwks bool) string {
	switch {
	case strings.EqualFold(alg, "none"):
		return fmt.Sprintf("%q is never accepted: every token must be signed", alg)
	case !slices.Contains(jwtAlgorithms, alg):
		return fmt.Sprintf("unknown algorithm %q (want %s)", alg, orList(jwtAlgorithms))
	case slices.Contains(valid, alg):
		return fmt.Sprintf("%s is listed twice", alg)
	case jwks && strings.HasPrefix(alg, "HS"):
		return fmt.Sprintf("%s needs a shared secret in keys; a JWKS publishes public keys only", alg)
	}
	return ""
}

func orList(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}

// CleanListenPath returns a listen path ending in "/" ("/orders" gives
// "/orders/"), or an error (starting "spec: ") when s is empty, does not
// start with "/", holds a character other than letters, digits and
// "-._~/", or is not clean ("/a//b/", "/a/../b/").
func CleanListenPath(s string) (string, error) {
	switch {
	case s == "":
		return "", errors.New(`spec: missing (a path prefix like "/orders/")`)
	case !strings.HasPrefix(s, "/"):
		return "", fmt.Errorf("spec: %q must start with \"/\"", s)
	case strings.IndexFunc(s, func(c rune) bool {
		return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-._~/", c))
	}) >= 0:
		return "", fmt.Errorf("spec: %q may only contain letters, digits, \"-\", \".\", \"_\", \"~\" and \"/\"", s)
	}
	clean := path.Clean(s)
	if clean != "/" {
		clean += "/"
	}
	if s != clean && s+"/" != clean {
		return "", fmt.Errorf("spec: %q is not a clean path (want %q)", s, clean)
	}
	return clean, nil
}

// ParseTarget parses an API's target: BuiltinEcho gives a nil URL, an
// http or https base URL (host required; no credentials, query or
// fragment) gives the URL. Anything else is an error starting "spec: ".
func ParseTarget(s string) (*url.URL, error) {
	if s == "" {
		return nil, errors.New("spec: missing (builtin:echo or an http:// or https:// URL)")
	}
	if strings.HasPrefix(s, "builtin:") {
		if s != BuiltinEcho {
			return nil, fmt.Errorf("spec: unknown builtin %q (want builtin:echo)", s)
		}
		return nil, nil
	}
	u, err := url.Parse(s)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Opaque != "":
		return nil, fmt.Errorf("spec: %q is not builtin:echo or an http:// or https:// URL", s)
	case u.Host == "" || u.Hostname() == "":
		return nil, fmt.Errorf("spec: %q has no host", s)
	case u.User != nil:
		return nil, fmt.Errorf("spec: %q must not carry credentials", s)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return nil, fmt.Errorf("spec: %q must not have a query or fragment", s)
	}
	return u, nil
}

// CheckJWKSURL reports why s is not a JWK Set URL a gateway fetches: it
// must be https, or http to localhost or a loopback address. The error
// starts with "spec: ".
func CheckJWKSURL(s string) error {
	u, err := url.Parse(s)
	switch {
	case s == "":
		return errors.New("spec: missing (the identity provider's JWK Set, like https://idp.example/.well-known/jwks.json)")
	case err != nil || u.Host == "" || u.Scheme != "https" && u.Scheme != "http":
		return fmt.Errorf("spec: %q is not an https:// URL", s)
	case u.Scheme == "http" && !identity.IsLoopbackHost(u.Hostname()):
		return fmt.Errorf("spec: %q must be https (plain http only to a loopback address)", s)
	}
	return nil
}

// Idle reports whether the policy limits nothing: it has no rate and no
// quota, or both are unlimited.
func (p *Policy) Idle() bool {
	rateOff := p.Rate == nil || p.Rate.Requests == core.Unlimited
	quotaOff := p.Quota == nil || p.Quota.Max == core.Unlimited
	return rateOff && quotaOff
}

// durationOr returns d, or def when d is 0.
func durationOr(d Duration, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return time.Duration(d)
}

// headerName reports whether s is an HTTP field name (RFC 9110's token).
func headerName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return s != ""
}
