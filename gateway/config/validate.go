package config

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/limitplane/limitplane/adapters/response"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// validator turns a rawConfig into a Config, collecting every problem.
type validator struct {
	file string
	ix   *index
	errs Errors
	// decoding says which values did not decode: checks that relate one
	// field to another are skipped when the other was refused, so that a
	// value of the wrong type is not reported again as some other problem.
	decoding *decoding
	memory   bool // the store is the in-process one (GCRA only), for sure
	// idle holds the IDs of policies that limit nothing (no rate and no
	// quota, or both unlimited).
	idle map[string]bool
}

// fail records a problem with the field at path.
func (v *validator) fail(path, format string, args ...any) {
	line, col := v.ix.pos(path)
	v.errs = append(v.errs, &Error{File: v.file, Line: line, Column: col, Field: path, Problem: fmt.Sprintf(format, args...)})
}

// require records that something required is missing at path; Parse drops
// it when a decoding problem may explain it (see decoding.echo).
func (v *validator) require(path, format string, args ...any) {
	v.fail(path, format, args...)
	v.errs[len(v.errs)-1].requires = true
}

// refused reports whether the value at path, or one it is inside, did not
// decode.
func (v *validator) refused(path string) bool {
	return v.decoding != nil && v.decoding.covers(path)
}

// idsRefused reports whether an id in the list at path (policies, apis)
// did not decode, so that a reference to an unknown id may be to it.
func (v *validator) idsRefused(path string) bool {
	if v.decoding == nil {
		return false
	}
	for _, r := range v.decoding.refused {
		rest, ok := strings.CutPrefix(r, path)
		if r == "" || ok && rest == "" {
			return true
		}
		if i := strings.IndexByte(rest, ']'); ok && strings.HasPrefix(rest, "[") && i > 0 && (rest[i+1:] == "" || rest[i+1:] == ".id") {
			return true
		}
	}
	return false
}

// line returns the line a field's value is on, for "first at line N".
func (v *validator) line(path string) int {
	l, _ := v.ix.pos(path)
	return l
}

func (v *validator) config(raw *rawConfig) *Config {
	cfg := &Config{Listen: DefaultListen, Store: "memory", Shadow: raw.Shadow}
	if raw.Listen != "" {
		if err := CheckListen(raw.Listen); err != nil {
			v.fail("listen", "%v", err)
		}
		cfg.Listen = raw.Listen
	}
	switch s := raw.Store; {
	case s == "" || s == "memory":
		v.memory = !v.refused("store")
		if raw.Redis != nil && v.memory {
			v.fail("redis", "only used with a redis store (store: redis://host:port/db)")
		}
	case redisScheme(s) != "":
		cfg.Store = s
		cfg.Redis = v.redis(s, raw.Redis)
	default:
		v.fail("store", "unknown store %q (want memory, or a redis://, rediss://, unix://, redis+cluster:// or redis+sentinel:// URL)", redisstore.RedactURL(s))
	}
	switch raw.FailurePolicy {
	case "", "open":
		cfg.FailurePolicy = core.FailOpen
	case "closed":
		cfg.FailurePolicy = core.FailClosed
	case "fallback":
		cfg.FailurePolicy = core.FailFallback
	default:
		v.fail("failure_policy", "unknown policy %q (want open, closed or fallback)", raw.FailurePolicy)
	}
	cfg.Memory = v.memoryStore(cfg, raw.Memory)
	cfg.StoreTimeout = v.duration("store_timeout", raw.StoreTimeout, 0)
	cfg.ClientIP = v.clientIP(raw.ClientIP)
	cfg.Server = v.server(raw.Server)
	cfg.Response = v.response(raw.Response)
	if raw.Admin != nil {
		cfg.Admin = v.admin(raw.Admin)
	}
	if raw.DRL != nil {
		cfg.DRL = v.drl(raw, cfg)
	}
	if raw.ControlPlane != nil {
		cfg.ControlPlane = v.controlPlane(raw.ControlPlane, raw)
		// The rest is the control plane's.
		return cfg
	}

	policies := v.policies(raw.Policies)
	apis := v.apis(raw.APIs, policies)
	// A policy's apis list may only name APIs that exist.
	for i, p := range raw.Policies {
		for j, a := range p.APIs {
			if _, ok := apis[a]; !ok && !v.idsRefused("apis") {
				v.fail(fmt.Sprintf("policies[%d].apis[%d]", i, j), "unknown API %q", a)
			}
		}
	}
	cfg.Keys = v.keys(raw.Keys, policies, apis)
	listed := map[string]bool{}
	for _, p := range raw.Policies {
		if pol := policies[p.ID]; pol != nil && !listed[p.ID] {
			cfg.Policies = append(cfg.Policies, *pol)
			listed[p.ID] = true
		}
	}
	for i := range raw.APIs {
		if a := apis[raw.APIs[i].ID]; a != nil && a.idx == i {
			cfg.APIs = append(cfg.APIs, a.API)
		}
	}
	return cfg
}

// CheckListen reports why addr is not a "host:port" listen address.
func CheckListen(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = strconv.ParseUint(port, 10, 16)
	}
	if err != nil {
		return fmt.Errorf("%q is not host:port (like 127.0.0.1:8080 or :8080)", addr)
	}
	return nil
}

// admin validates the admin section: a listen address that is not
// loopback needs a token, and the token's source must give one.
func (v *validator) admin(r *rawAdmin) *Admin {
	a := &Admin{Listen: DefaultAdminListen}
	if r.Listen != "" {
		if err := CheckListen(r.Listen); err != nil {
			v.fail("admin.listen", "%v", err)
			return a
		}
		a.Listen = r.Listen
	}
	a.Loopback = loopbackListen(a.Listen)
	switch {
	case r.TokenEnv != "" && r.TokenFile != "":
		v.fail("admin", "set token_env or token_file, not both")
		return a
	case r.TokenEnv != "":
		a.Token = v.env("admin.token_env", r.TokenEnv)
	case r.TokenFile != "":
		a.Token = v.secretFile("admin.token_file", r.TokenFile)
	case !a.Loopback:
		v.fail("admin.listen", "%q is not a loopback address: set admin.token_env or admin.token_file, since every call there needs the token", a.Listen)
	}
	return a
}

// loopbackListen reports whether the listen address addr (already
// checked) is on the loopback only: "localhost" or a loopback IP. An empty
// host listens on every interface.
func loopbackListen(addr string) bool {
	host, _, _ := net.SplitHostPort(addr)
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// parseDuration is spec.ParseDuration with examples added to a "not a
// duration" problem.
func parseDuration(s, examples string) (time.Duration, string) {
	d, err := spec.ParseDuration(s)
	if err == nil {
		return d, ""
	}
	problem := specProblem(err)
	if strings.HasSuffix(problem, "is not a duration") {
		problem += " (like " + examples + ")"
	}
	return 0, problem
}

// specProblem returns a spec error's text without its "spec: " prefix.
func specProblem(err error) string { return strings.TrimPrefix(err.Error(), "spec: ") }

// duration parses an optional positive duration; "" gives def.
func (v *validator) duration(path, s string, def time.Duration) time.Duration {
	if s == "" {
		return def
	}
	d, problem := parseDuration(s, "500ms, 10s, 1m or 24h")
	if problem != "" {
		v.fail(path, "%s", problem)
		return def
	}
	if d <= 0 {
		v.fail(path, "%s must be > 0", s)
		return def
	}
	return d
}

func (v *validator) clientIP(r rawClientIP) identity.ClientIPOptions {
	var o identity.ClientIPOptions
	for i, spec := range r.TrustedProxies {
		p, err := identity.ParseTrustedProxies([]string{spec})
		if err != nil {
			v.fail(fmt.Sprintf("client_ip.trusted_proxies[%d]", i), "%q is not an address or CIDR", spec)
			continue
		}
		o.TrustedProxies = append(o.TrustedProxies, p...)
	}
	switch strings.ToLower(r.Header) {
	case "", "x-forwarded-for":
		o.Header = identity.XForwardedFor
	case "forwarded":
		o.Header = identity.Forwarded
	default:
		v.fail("client_ip.header", "unknown header %q (want x-forwarded-for or forwarded)", r.Header)
	}
	if n := r.IPv4PrefixLen; n != nil {
		if *n < 1 || *n > 32 {
			v.fail("client_ip.ipv4_prefix_len", "%d: want 1 to 32", *n)
		} else {
			o.IPv4PrefixLen = *n
		}
	}
	if n := r.IPv6PrefixLen; n != nil {
		if *n < 1 || *n > 128 {
			v.fail("client_ip.ipv6_prefix_len", "%d: want 1 to 128", *n)
		} else {
			o.IPv6PrefixLen = *n
		}
	}
	return o
}

func (v *validator) server(r rawServer) Server {
	s := Server{
		ReadHeaderTimeout: v.duration("server.read_header_timeout", r.ReadHeaderTimeout, DefaultReadHeaderTimeout),
		ReadTimeout:       v.duration("server.read_timeout", r.ReadTimeout, DefaultReadTimeout),
		WriteTimeout:      v.duration("server.write_timeout", r.WriteTimeout, DefaultWriteTimeout),
		IdleTimeout:       v.duration("server.idle_timeout", r.IdleTimeout, DefaultIdleTimeout),
		ShutdownTimeout:   v.duration("server.shutdown_timeout", r.ShutdownTimeout, DefaultShutdownTimeout),
		MaxHeaderBytes:    DefaultMaxHeaderBytes,
	}
	if r.MaxHeaderBytes != nil {
		if *r.MaxHeaderBytes <= 0 {
			v.fail("server.max_header_bytes", "%d must be > 0", *r.MaxHeaderBytes)
		} else {
			s.MaxHeaderBytes = *r.MaxHeaderBytes
		}
	}
	return s
}

func (v *validator) response(r rawResponse) response.Options {
	o := response.Options{XRateLimit: r.XRateLimit}
	if r.RateLimitHeaders != nil {
		o.NoRateLimitFields = !*r.RateLimitHeaders
	}
	switch r.XRateLimitReset {
	case "", "epoch":
		o.XRateLimitReset = response.ResetEpoch
	case "seconds":
		o.XRateLimitReset = response.ResetSeconds
	default:
		v.fail("response.x_ratelimit_reset", "unknown format %q (want epoch or seconds)", r.XRateLimitReset)
	}
	o.QuotaExceededStatus = 429
	if s := r.QuotaStatus; s != nil {
		if *s != 429 && *s != 403 {
			v.fail("response.quota_status", "%d: want 429 or 403", *s)
		} else {
			o.QuotaExceededStatus = *s
		}
	}
	o.StoreFailureStatus = 503
	if s := r.StoreFailureStatus; s != nil {
		if *s < 500 || *s > 599 {
			v.fail("response.store_failure_status", "%d: want a 5xx status", *s)
		} else {
			o.StoreFailureStatus = *s
		}
	}
	return o
}

// policies validates the policy list and returns the valid ones by ID.
// Policies with problems are still returned (so references to them are not
// reported as unknown), but Parse fails anyway.
func (v *validator) policies(raw []rawPolicy) map[string]*core.Policy {
	m := make(map[string]*core.Policy, len(raw))
	first := map[string]string{}
	for i, p := range raw {
		at := fmt.Sprintf("policies[%d]", i)
		switch f, dup := first[p.ID]; {
		case p.ID == "":
			v.require(at+".id", "missing")
		case dup:
			v.fail(at+".id", "duplicate policy id %q (first at line %d)", p.ID, v.line(f+".id"))
		default:
			first[p.ID] = at
		}
		rateOff := p.Rate == nil || p.Rate.Requests != nil && *p.Rate.Requests == core.Unlimited
		quotaOff := p.Quota == nil || p.Quota.Max != nil && *p.Quota.Max == core.Unlimited
		if rateOff && quotaOff && !v.refused(at+".rate") && !v.refused(at+".quota") {
			if v.idle == nil {
				v.idle = map[string]bool{}
			}
			v.idle[p.ID] = true
		}
		pol := &core.Policy{
			ID:          p.ID,
			Rate:        v.rate(at+".rate", p.Rate),
			Quota:       v.quota(at+".quota", p.Quota),
			APIs:        p.APIs,
			Shadow:      p.Shadow,
			Distributed: p.Distributed,
		}
		if _, dup := m[p.ID]; !dup && p.ID != "" {
			m[p.ID] = pol
		}
	}
	return m
}

// count validates a limit's count: positive, or core.Unlimited (-1). It
// returns 0 after reporting a problem.
func (v *validator) count(path string, n *int64, what string) int64 {
	switch {
	case n == nil:
		v.require(path, "missing (%s, or -1 for unlimited)", what)
		return 0
	case *n == core.Unlimited:
		return core.Unlimited
	case *n <= 0:
		v.fail(path, "%d must be > 0 (or -1 for unlimited)", *n)
		return 0
	}
	return *n
}

// period validates the period of a limit whose count is n: required when
// n is positive.
func (v *validator) period(path, raw string, n int64, examples string) time.Duration {
	if raw == "" && n > 0 {
		v.require(path, "missing (the period, like %s)", examples)
		return 0
	}
	return v.duration(path, raw, 0)
}

// rate validates a rate block; nil means none.
func (v *validator) rate(at string, r *rawRate) core.Limit {
	if r == nil {
		return core.Limit{}
	}
	n0 := len(v.errs)
	var l core.Limit
	l.Rate = v.count(at+".requests", r.Requests, "requests per period")
	l.Period = v.period(at+".per", r.Per, l.Rate, "1s, 1m or 24h")
	if r.Burst != nil {
		if *r.Burst <= 0 {
			v.fail(at+".burst", "%d must be > 0 (leave it out to use requests)", *r.Burst)
		} else {
			l.Burst = *r.Burst
		}
	}
	alg, err := core.ParseAlgorithm(r.Algorithm)
	switch {
	case err != nil:
		v.fail(at+".algorithm", "unknown algorithm %q (want gcra, sliding_window, fixed_window or sliding_log)", r.Algorithm)
	case alg != core.GCRA && v.memory:
		v.fail(at+".algorithm", "%s is not supported by the memory store (only gcra)", alg)
	case alg != core.GCRA && r.Burst != nil:
		v.fail(at+".burst", "%s has no burst (it counts up to requests per per); leave burst out", alg)
	}
	l.Algorithm = alg
	if len(v.errs) > n0 {
		return core.Limit{}
	}
	if l.Rate == core.Unlimited {
		return core.Limit{Rate: core.Unlimited}
	}
	if err := l.Validate(); err != nil {
		v.fail(at, "%s", strings.TrimPrefix(err.Error(), core.ErrInvalidLimit.Error()+": "))
		return core.Limit{}
	}
	return l
}

// quota validates a quota block; nil means none.
func (v *validator) quota(at string, q *rawQuota) core.Quota {
	if q == nil {
		return core.Quota{}
	}
	n0 := len(v.errs)
	var out core.Quota
	out.Max = v.count(at+".max", q.Max, "requests per renewal period")
	out.Renewal = v.period(at+".renewal", q.Renewal, out.Max, "1h or 720h")
	if len(v.errs) > n0 {
		return core.Quota{}
	}
	if out.Max == core.Unlimited {
		return core.Quota{Max: core.Unlimited}
	}
	if err := out.Validate(); err != nil {
		v.fail(at, "%s", strings.TrimPrefix(err.Error(), core.ErrInvalidLimit.Error()+": "))
		return core.Quota{}
	}
	return out
}

// apiEntry is a validated API and its position in the file.
type apiEntry struct {
	API
	idx int
}

func (v *validator) apis(raw []rawAPI, policies map[string]*core.Policy) map[string]*apiEntry {
	if len(raw) == 0 {
		v.require("apis", "at least one API is required")
	}
	m := make(map[string]*apiEntry, len(raw))
	paths := map[string]string{} // normalised listen path → field path
	for i, r := range raw {
		at := fmt.Sprintf("apis[%d]", i)
		a := &apiEntry{idx: i, API: API{ID: r.ID, StripListenPath: true}}
		switch f, dup := m[r.ID]; {
		case r.ID == "":
			v.require(at+".id", "missing")
		case dup:
			v.fail(at+".id", "duplicate API id %q (first at line %d)", r.ID, v.line(fmt.Sprintf("apis[%d].id", f.idx)))
		default:
			m[r.ID] = a
		}
		if lp, ok := v.listenPath(at+".listen_path", r.ListenPath); ok {
			if f, dup := paths[lp]; dup {
				v.fail(at+".listen_path", "%q is the same path as %s (line %d)", r.ListenPath, f, v.line(f))
			} else {
				paths[lp] = at + ".listen_path"
			}
			a.ListenPath = lp
		}
		a.Target = v.target(at+".target", r.Target)
		// The checks below that depend on auth are skipped when it is
		// unknown or did not decode: what was meant is not known.
		knownAuth := !v.refused(at + ".auth")
		switch r.Auth {
		case "", "api_key":
			a.Auth = AuthAPIKey
		case "keyless":
			a.Auth = AuthKeyless
		case "jwt":
			a.Auth = AuthJWT
		default:
			knownAuth = false
			v.fail(at+".auth", "unknown auth %q (want api_key, keyless or jwt)", r.Auth)
		}
		if r.StripListenPath != nil {
			a.StripListenPath = *r.StripListenPath
		}
		a.StripAuthData = r.Auth != "keyless"
		if r.StripAuthData != nil {
			if r.Auth == "keyless" {
				v.fail(at+".strip_auth_data", "a keyless API reads no credentials, so there are none to strip")
			}
			a.StripAuthData = *r.StripAuthData
		}
		switch {
		case !knownAuth:
		case r.Auth == "jwt" && len(r.Policies) > 0:
			v.fail(at+".policies", "only keyless APIs take policies; a jwt API takes them from the token's policy claim or jwt.default_policies")
		case r.Auth != "keyless" && len(r.Policies) > 0:
			v.fail(at+".policies", "only keyless APIs take policies; an api_key API applies each key's own policies")
		case r.Auth == "keyless" && len(r.Policies) == 0:
			v.require(at+".policies", "a keyless API needs at least one policy (applied per client IP)")
		}
		if r.Auth == "keyless" {
			for j, id := range r.Policies {
				v.policyFor(fmt.Sprintf("%s.policies[%d]", at, j), id, r.ID, policies)
			}
			a.Policies = r.Policies
		}
		switch {
		case r.Auth == "jwt" && r.JWT == nil:
			v.require(at+".jwt", "missing (auth: jwt needs algorithms, and keys or jwks)")
		case r.Auth == "jwt":
			a.JWT, a.JWKS = v.jwt(at+".jwt", r.ID, r.JWT, policies)
		case r.JWT != nil && knownAuth:
			v.fail(at+".jwt", "only used with auth: jwt")
		}
		if fl := r.FailureLimit; fl != nil {
			a.FailureLimit = v.failureLimit(at+".failure_limit", r.Auth, fl, policies)
		}
	}
	return m
}

// policyFor checks that the policy id, named at path for the API apiID,
// exists and covers that API.
func (v *validator) policyFor(path, id, apiID string, policies map[string]*core.Policy) {
	p := policies[id]
	switch {
	case p == nil && v.idsRefused("policies"):
	case p == nil:
		v.fail(path, "unknown policy %q", id)
	case len(p.APIs) > 0 && apiID != "" && !slices.Contains(p.APIs, apiID):
		v.fail(path, "policy %q does not cover API %q (its apis list leaves it out)", id, apiID)
	}
}

// failureLimit validates an API's failure_limit and returns its policy.
func (v *validator) failureLimit(at, auth string, fl *rawFailureLimit, policies map[string]*core.Policy) string {
	if auth == "keyless" {
		v.fail(at, "a keyless API asks for no credentials, so no attempt can fail")
		return ""
	}
	id := fl.Policy
	p := policies[id]
	switch {
	case id == "":
		v.require(at+".policy", "missing (the policy failed attempts are charged to, per client IP)")
	case p == nil && v.idsRefused("policies"):
	case p == nil:
		v.fail(at+".policy", "unknown policy %q", id)
	case len(p.APIs) > 0:
		v.fail(at+".policy", "policy %q has an apis list; failures are charged outside any API, so a failure_limit policy must leave apis out", id)
	case v.idle[id]:
		v.fail(at+".policy", "policy %q limits nothing (give it a rate or a quota)", id)
	}
	return id
}

// listenPath normalises a listen path to end in "/" (spec.CleanListenPath).
func (v *validator) listenPath(at, s string) (string, bool) {
	clean, err := spec.CleanListenPath(s)
	switch {
	case s == "":
		v.require(at, "%s", specProblem(err))
		return "", false
	case err != nil:
		v.fail(at, "%s", specProblem(err))
		return "", false
	}
	return clean, true
}

// target parses builtin:echo or an http(s) base URL (spec.ParseTarget).
func (v *validator) target(at, s string) Target {
	u, err := spec.ParseTarget(s)
	switch {
	case s == "":
		v.require(at, "%s", specProblem(err))
	case err != nil:
		v.fail(at, "%s", specProblem(err))
	case u == nil:
		return Target{Builtin: s}
	default:
		return Target{URL: u}
	}
	if strings.HasPrefix(s, "builtin:") {
		return Target{Builtin: s}
	}
	return Target{}
}

func (v *validator) keys(raw []rawKey, policies map[string]*core.Policy, apis map[string]*apiEntry) []identity.KeyRecord {
	out := make([]identity.KeyRecord, 0, len(raw))
	first := map[identity.KeyHash]string{}
	for i, k := range raw {
		at := fmt.Sprintf("keys[%d]", i)
		n0 := len(v.errs)
		var rec identity.KeyRecord
		field := ""
		switch {
		case k.Key != "" && k.KeyHash != "":
			v.fail(at, "set key or key_hash, not both")
		case k.Key != "":
			field = at + ".key"
			if err := identity.CheckKey(k.Key); err != nil {
				v.fail(field, "%s", strings.TrimPrefix(err.Error(), "identity: "))
			}
			rec.Hash = identity.HashKey(k.Key)
		case k.KeyHash != "":
			field = at + ".key_hash"
			h, err := identity.ParseKeyHash(k.KeyHash)
			if err != nil {
				v.fail(field, "%q is not sha256:<64 hex digits>", k.KeyHash)
			}
			rec.Hash = h
		default:
			v.require(at, "needs key (plaintext) or key_hash (sha256:<hex>)")
		}
		if len(v.errs) == n0 {
			if f, dup := first[rec.Hash]; dup {
				v.fail(field, "same key as %s (line %d)", parent(f), v.line(f))
			} else {
				first[rec.Hash] = field
			}
		}
		for j, id := range k.Policies {
			if policies[id] == nil && !v.idsRefused("policies") {
				v.fail(fmt.Sprintf("%s.policies[%d]", at, j), "unknown policy %q", id)
			}
		}
		if len(k.Policies) == 0 && len(k.APILimits) == 0 {
			v.require(at+".policies", "a key needs at least one policy (or api_limits)")
		}
		rec.Policies = k.Policies
		if k.Expires != "" {
			t, err := time.Parse(time.RFC3339, k.Expires)
			if err != nil {
				v.fail(at+".expires", "%q is not an RFC 3339 time (like 2027-01-31T00:00:00Z)", k.Expires)
			}
			rec.Expires = t
		}
		rec.Inactive = k.Inactive
		rec.QuotaEpoch = k.QuotaEpoch
		ids := make([]string, 0, len(k.APILimits))
		for id := range k.APILimits {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			lat := at + ".api_limits." + id
			a := apis[id]
			switch {
			case a == nil && v.idsRefused("apis"):
			case a == nil:
				v.fail(lat, "unknown API %q", id)
			case a.Auth == AuthKeyless:
				v.fail(lat, "API %q is keyless; api_limits only apply to api_key APIs", id)
			}
			l := k.APILimits[id]
			if l.Rate == nil && l.Quota == nil {
				v.require(lat, "needs rate or quota")
			}
			if rec.APILimits == nil {
				rec.APILimits = map[string]core.Limits{}
			}
			rec.APILimits[id] = core.Limits{Rate: v.rate(lat+".rate", l.Rate), Quota: v.quota(lat+".quota", l.Quota), QuotaEpoch: l.QuotaEpoch}
		}
		out = append(out, rec)
	}
	return out
}
