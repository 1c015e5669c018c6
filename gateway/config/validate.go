package config

import (
	"cmp"
	"fmt"
	"net"
	"reflect"
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

// fail records a problem with the field at path.
func (v *loader) fail(path, format string, args ...any) {
	v.Report(path, fmt.Sprintf(format, args...), false, "")
}

// require records that something required is missing at path.
func (v *loader) require(path, format string, args ...any) {
	v.Report(path, fmt.Sprintf(format, args...), true, "")
}

func (v *loader) config(raw *rawConfig) *Config {
	cfg := &Config{Listen: cmp.Or(raw.Listen, DefaultListen), Store: "memory", Shadow: raw.Shadow}
	if err := CheckListen(cfg.Listen); err != nil {
		v.fail("listen", "%v", err)
	}
	switch s := raw.Store; {
	case s == "" || s == "memory":
		v.memory = !v.Refused("store")
		if raw.Redis != nil && v.memory {
			v.fail("redis", "only used with a redis store (store: redis://host:port/db)")
		}
	case redisstore.Scheme(s) != "":
		cfg.Store = s
		cfg.Redis = v.redis(s, raw.Redis)
	default:
		v.fail("store", "unknown store %q (want memory, or a redis://, rediss://, unix://, redis+cluster:// or redis+sentinel:// URL)", redisstore.RedactURL(s))
	}
	cfg.FailurePolicy = oneOf(v, "failure_policy", "policy", raw.FailurePolicy,
		[]string{"open", "closed", "fallback"}, core.FailOpen, core.FailClosed, core.FailFallback)
	cfg.Memory = v.memoryStore(cfg, raw.Memory)
	cfg.StoreTimeout = number(v, "store_timeout", raw.StoreTimeout, 0, positive, mustBePositive)
	cfg.ClientIP = v.clientIP(raw.ClientIP)
	cfg.Server = v.server(raw.Server)
	cfg.Response = v.response(raw.Response)
	if raw.Admin != nil {
		cfg.Admin = v.admin(raw.Admin)
	}
	if raw.DRL != nil {
		cfg.DRL = v.drl(raw, cfg)
	}
	if raw.Webhook != nil {
		cfg.ThresholdWebhook = v.thresholdWebhook(raw.Webhook)
	}
	// Secret files named in the snapshot, the file's or the control
	// plane's, are read relative to the file.
	cfg.Resolver = v.files
	if raw.ControlPlane != nil {
		cfg.ControlPlane = v.controlPlane(raw.ControlPlane, raw)
		// The rest is the control plane's.
		return cfg
	}
	cfg.Snapshot = v.travelling(raw)
	return cfg
}

// CheckListen reports why addr is not a "host:port" listen address.
func CheckListen(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port (like 127.0.0.1:8080 or :8080)", addr)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("%q: port %q is not a number from 0 to 65535", addr, port)
	}
	return nil
}

// admin validates the admin section: a listen address that is not
// loopback needs a token, and the token's source must give one.
func (v *loader) admin(r *fileAdmin) *Admin {
	a := &r.Admin
	a.Listen = cmp.Or(a.Listen, DefaultAdminListen)
	if err := CheckListen(a.Listen); err != nil {
		v.fail("admin.listen", "%v", err)
		return a
	}
	host, _, _ := net.SplitHostPort(a.Listen)
	a.Loopback = identity.IsLoopbackHost(host)
	if token, set := v.secret("admin", "token", r.TokenEnv, r.TokenFile); set {
		a.Token = token
	} else if !a.Loopback {
		v.fail("admin.listen", "%q is not a loopback address: set admin.token_env or admin.token_file, since every call there needs the token", a.Listen)
	}
	return a
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

// number returns the number or duration given at path, def when it is
// left out; one that ok refuses is reported as the file wrote it and then
// bad.
func number[T int | float64 | time.Duration](v *loader, path string, n *T, def T, ok func(T) bool, bad string) T {
	if n == nil {
		return def
	}
	if !ok(*n) {
		v.bad(path, bad)
	}
	return *n
}

// bad reports the value at path, as the file wrote it, and then words.
func (v *loader) bad(path, words string) {
	pl, _ := v.Place(path)
	v.fail(path, "%s%s", pl.Text.Value, words)
}

// The checks number uses most, and their words.
func positive(d time.Duration) bool { return d > 0 }
func nonNegative(n int) bool        { return n >= 0 }

// within returns the check of lo ≤ n ≤ hi; wantWithin words it.
func within(lo, hi int) func(int) bool { return func(n int) bool { return n >= lo && n <= hi } }
func wantWithin(lo, hi int) string     { return fmt.Sprintf(": want %d to %d", lo, hi) }

// mustBePositive words positive.
const mustBePositive = " must be > 0"

// oneOf returns the value of the name s among names ("" is the first),
// reporting another as "unknown <what> "s" (want a, b or c)".
func oneOf[T any](v *loader, path, what, s string, names []string, values ...T) T {
	i := slices.Index(names, s)
	if s == "" {
		i = 0
	}
	if i < 0 {
		want := strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
		v.fail(path, "unknown %s %q (want %s)", what, s, want)
		var zero T
		return zero
	}
	return values[i]
}

func (v *loader) clientIP(r rawClientIP) identity.ClientIPOptions {
	var o identity.ClientIPOptions
	for i, spec := range r.TrustedProxies {
		p, err := identity.ParseTrustedProxies([]string{spec})
		if err != nil {
			v.fail(fmt.Sprintf("client_ip.trusted_proxies[%d]", i), "%q is not an address or CIDR", spec)
			continue
		}
		o.TrustedProxies = append(o.TrustedProxies, p...)
	}
	h := r.Header
	if l := strings.ToLower(h); l == "x-forwarded-for" || l == "forwarded" {
		h = l
	}
	o.Header = oneOf(v, "client_ip.header", "header", h, []string{"x-forwarded-for", "forwarded"}, identity.XForwardedFor, identity.Forwarded)
	o.IPv4PrefixLen = number(v, "client_ip.ipv4_prefix_len", r.IPv4PrefixLen, 0, within(1, 32), wantWithin(1, 32))
	o.IPv6PrefixLen = number(v, "client_ip.ipv6_prefix_len", r.IPv6PrefixLen, 0, within(1, 128), wantWithin(1, 128))
	return o
}

// server checks the server section, decoded over the defaults: the
// engine must be one the gateway has, each number > 0.
func (v *loader) server(s Server) Server {
	s.Engine = oneOf(v, "server.engine", "engine", s.Engine,
		[]string{EngineNetHTTP, EngineFastHTTP}, EngineNetHTTP, EngineFastHTTP)
	sv := reflect.ValueOf(s)
	for i := range sv.NumField() {
		if sv.Field(i).Kind() == reflect.String {
			continue
		}
		if sv.Field(i).Int() <= 0 {
			v.bad("server."+sv.Type().Field(i).Tag.Get("json"), mustBePositive)
		}
	}
	return s
}

func (v *loader) response(r rawResponse) response.Options {
	o := response.Options{XRateLimit: r.XRateLimit, NoRateLimitFields: r.RateLimitHeaders != nil && !*r.RateLimitHeaders}
	o.XRateLimitReset = oneOf(v, "response.x_ratelimit_reset", "format", r.XRateLimitReset,
		[]string{"epoch", "seconds"}, response.ResetEpoch, response.ResetSeconds)
	o.QuotaExceededStatus = number(v, "response.quota_status", r.QuotaStatus, 429,
		func(s int) bool { return s == 429 || s == 403 }, ": want 429 or 403")
	o.StoreFailureStatus = number(v, "response.store_failure_status", r.StoreFailureStatus, 503, within(500, 599), ": want a 5xx status")
	return o
}
