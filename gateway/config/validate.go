package config

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/limitplane/limitplane/adapters/response"
	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/identity"
	"github.com/limitplane/limitplane/spec"
)

// validator turns a rawConfig into a Config, collecting every problem but
// those that echo the decoder's.
type validator struct {
	file   string
	errs   Errors
	seen   map[reported]bool
	dec    *decoder
	memory bool // the store is the in-process one (GCRA only), for sure
}

// fail records a problem with the field at path.
func (v *validator) fail(path, format string, args ...any) {
	v.add(path, fmt.Sprintf(format, args...), false, "")
}

// require records that something required is missing at path.
func (v *validator) require(path, format string, args ...any) {
	v.add(path, fmt.Sprintf(format, args...), true, "")
}

// add records a problem unless it echoes one the decoder reported (see
// decoder.echo).
func (v *validator) add(path, problem string, missing bool, unknown string) {
	// A problem reached again through an alias is reported once.
	n, rest := v.dec.text(path)
	k := reported{n, rest + ": " + problem}
	if v.dec.echo(path, missing, unknown) || v.seen[k] {
		return
	}
	v.seen[k] = true
	line, col := v.dec.pos(path)
	v.errs = append(v.errs, &Error{File: v.file, Line: line, Column: col, Field: path, Problem: problem})
}

// refused reports whether the value at path, or one it is inside, did not
// decode.
func (v *validator) refused(path string) bool { return v.dec.covers(path) }

// line returns the line a field's value is on, for "on line N".
func (v *validator) line(path string) int {
	l, _ := v.dec.pos(path)
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
	// Secret files named in the snapshot, the file's or the control
	// plane's, are read relative to the file.
	cfg.Resolver = FileResolver{Dir: filepath.Dir(v.file)}
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
