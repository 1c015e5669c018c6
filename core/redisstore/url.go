package redisstore

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// NewClientFromURL returns the go-redis client a `store:` URL names, for the
// gateway's configuration. The forms are:
//
//	redis://[user:password@]host[:port][/db][?options]    one server (port 6379)
//	rediss://...                                          the same over TLS
//	unix://[user:password@]/path/to/redis.sock[?db=N]     a unix socket
//	redis+cluster://[user:password@]h1[:port],h2[:port]... a Cluster, seeded by these nodes
//	rediss+cluster://...                                  the same over TLS
//	redis+sentinel://master@h1[:port],h2[:port]...[/db]   Sentinel: master is the
//	                                                      monitored master's name
//	                                                      (sentinels default to port
//	                                                      26379); ?password=... is
//	                                                      the master's password
//
// Options are go-redis's URL query parameters (dial_timeout=3s, pool_size=64,
// ... see redis.ParseURL, redis.ParseClusterURL, redis.ParseFailoverURL).
// The client has ContextTimeoutEnabled set, so a context deadline (the
// store's Options.Timeout) really bounds each call's socket reads and
// writes. The caller closes the client.
//
// The client fails fast when Redis refuses connections (it is down, or
// restarting): it dials each new connection once (DialerRetries 1, where
// go-redis's default makes 5 attempts 100 ms apart) and retries a failed
// command without pausing (MinRetryBackoff −1, where go-redis's default
// sleeps 10 ms to 1 s before each of its MaxRetries retries). So a Take
// against a refused port returns the "connection refused" error in about a
// millisecond, instead of retrying until Options.Timeout ends it, and the
// circuit breaker opens after BreakerFailures quick failures. A host that
// does not answer at all still costs dial_timeout or Options.Timeout,
// whichever is shorter. A URL that sets min_retry_backoff, or (Cluster and
// Sentinel forms, the only ones go-redis parses it for) dialer_retries,
// keeps its own value.
func NewClientFromURL(rawURL string) (redis.UniversalClient, error) {
	if err := CheckURL(rawURL); err != nil {
		return nil, err
	}
	scheme, rest, _ := strings.Cut(rawURL, "://") // CheckURL found one
	// Schemes are case-insensitive (RFC 3986 §3.1); go-redis wants them
	// lower-case.
	scheme = strings.ToLower(scheme)
	rawURL = scheme + "://" + rest
	switch scheme {
	case "redis", "rediss", "unix":
		o, err := redis.ParseURL(rawURL)
		if err == nil {
			err = checkPool(o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns)
		}
		if err != nil {
			return nil, fmt.Errorf("redisstore: store URL %q: %w", RedactURL(rawURL), err)
		}
		o.ContextTimeoutEnabled = true
		failFast(query(rawURL), &o.DialerRetries, &o.MinRetryBackoff)
		return redis.NewClient(o), nil
	case "redis+cluster", "rediss+cluster":
		base := strings.TrimSuffix(scheme, "+cluster")
		u, hosts, err := splitHosts(base+"://"+rest, "6379")
		if err != nil {
			return nil, err
		}
		q := u.Query()
		for _, h := range hosts[1:] {
			q.Add("addr", h)
		}
		u.Host, u.RawQuery = hosts[0], q.Encode()
		o, err := redis.ParseClusterURL(u.String())
		if err == nil {
			err = checkPool(o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns)
		}
		if err != nil {
			return nil, fmt.Errorf("redisstore: store URL %q: %w", RedactURL(rawURL), err)
		}
		o.ContextTimeoutEnabled = true
		failFast(q, &o.DialerRetries, &o.MinRetryBackoff)
		return redis.NewClusterClient(o), nil
	case "redis+sentinel", "rediss+sentinel":
		o, err := failoverOptions(strings.TrimSuffix(scheme, "+sentinel"), rest)
		if err == nil {
			err = checkPool(o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns)
		}
		if err != nil {
			return nil, fmt.Errorf("redisstore: store URL %q: %w", RedactURL(rawURL), err)
		}
		o.ContextTimeoutEnabled = true
		failFast(query(scheme+"://"+rest), &o.DialerRetries, &o.MinRetryBackoff)
		return redis.NewFailoverClient(o), nil
	}
	return nil, fmt.Errorf("redisstore: store URL %q: unknown scheme %q (want redis, rediss, unix, redis+cluster, redis+sentinel)", RedactURL(rawURL), scheme)
}

// URLError is what CheckURL finds wrong with a store URL.
type URLError struct {
	// Problem says what is wrong, quoting the URL with its password
	// replaced by "xxxxx" (RedactURL).
	Problem string
}

// Error returns the problem with the package's prefix.
func (e *URLError) Error() string { return "redisstore: " + e.Problem }

// urlProblem returns a URLError.
func urlProblem(format string, args ...any) error {
	return &URLError{Problem: fmt.Sprintf(format, args...)}
}

// CheckURL reports, as a *URLError, why rawURL is not a store URL
// NewClientFromURL can use, as far as that needs no connection: its
// scheme (in any case), that it parses, names a socket path (unix://) or
// hosts with ports from 1 to 65535, the master's name (the Sentinel
// forms), a pool_size go-redis would not panic on, and go-redis's own
// option parsing for the one-server forms. NewClientFromURL checks with it
// first; a configuration loader calls it to report the URL's problems
// before anything starts.
func CheckURL(rawURL string) error {
	shown := RedactURL(rawURL)
	scheme := Scheme(rawURL)
	if scheme == "" {
		given, _, ok := strings.Cut(rawURL, "://")
		if !ok {
			return urlProblem("store URL %q has no scheme", shown)
		}
		return urlProblem("store URL %q: unknown scheme %q (want redis, rediss, unix, redis+cluster, redis+sentinel)", shown, strings.ToLower(given))
	}
	client := scheme + rawURL[len(scheme):]
	u, err := url.Parse(client)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		if shown != rawURL {
			// The parser's reason may quote part of the password.
			return urlProblem("%q is not a URL", shown)
		}
		return urlProblem("%q is not a URL: %v", rawURL, err)
	}
	switch {
	case scheme == "unix" && u.Path == "":
		return urlProblem("%q names no socket path (like unix:///run/redis.sock)", shown)
	case scheme != "unix" && strings.Trim(u.Host, ",") == "":
		return urlProblem("%q names no host", shown)
	case strings.HasSuffix(scheme, "+sentinel") && u.User.Username() == "":
		return urlProblem("%q needs the master's name: redis+sentinel://master@host:26379,...", shown)
	}
	if scheme != "unix" {
		for _, h := range strings.Split(u.Host, ",") {
			if port, ok := hostPort(h); ok && !validPort(port) {
				return urlProblem("host %q: port %q is not a number from 1 to 65535", h, port)
			}
		}
	}
	if ps, ok := u.Query()["pool_size"]; ok {
		if n, err := strconv.Atoi(ps[0]); err != nil || n < 0 || n > math.MaxInt32 {
			return urlProblem("pool_size=%s: want 0 (go-redis's default) to %d", ps[0], math.MaxInt32)
		}
	}
	if scheme == "redis" || scheme == "rediss" || scheme == "unix" {
		if _, err := redis.ParseURL(client); err != nil {
			return urlProblem("%s", strings.TrimPrefix(err.Error(), "redis: "))
		}
	}
	return nil
}

// WithPassword returns the store URL rawURL, its scheme in lower case,
// with password where NewClientFromURL takes it: for the Sentinel forms,
// whose user part names the master, the password query parameter (the
// master's password); for the others, the user information's. It fails
// only when rawURL does not parse (CheckURL says why).
func WithPassword(rawURL, password string) (string, error) {
	scheme := Scheme(rawURL)
	u, err := url.Parse(scheme + rawURL[len(scheme):])
	if err != nil {
		return "", fmt.Errorf("redisstore: %q is not a URL", RedactURL(rawURL))
	}
	if strings.HasSuffix(scheme, "+sentinel") {
		q := u.Query()
		q.Set("password", password)
		u.RawQuery = q.Encode()
	} else {
		u.User = url.UserPassword(u.User.Username(), password)
	}
	return u.String(), nil
}

// schemes are the URL schemes NewClientFromURL takes.
var schemes = []string{"redis", "rediss", "unix", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel"}

// Scheme returns rawURL's scheme in lower case when it is one of a store
// URL (see NewClientFromURL), else "". Schemes are case-insensitive
// (RFC 3986 §3.1).
func Scheme(rawURL string) string {
	scheme, _, ok := strings.Cut(rawURL, "://")
	for _, s := range schemes {
		if ok && strings.EqualFold(scheme, s) {
			return s
		}
	}
	return ""
}

// hostPort returns the port of one host of a store URL's host list
// ("host:port", "[v6]:port"), and whether it names one. An IPv6 address
// without brackets names none. An empty port ("host:") is go-redis's
// default port and passes.
func hostPort(h string) (string, bool) {
	if strings.HasPrefix(h, "[") {
		_, port, ok := strings.Cut(h, "]:")
		return port, ok && port != ""
	}
	if strings.Count(h, ":") != 1 {
		return "", false
	}
	_, port, _ := strings.Cut(h, ":")
	return port, port != ""
}

// validPort reports whether port is a decimal TCP port, 1 to 65535.
func validPort(port string) bool {
	n, err := strconv.Atoi(port)
	return err == nil && n >= 1 && n <= 65535 && strings.TrimLeft(port, "0123456789") == ""
}

// failFast sets the dial and retry options that make a refused connection
// fail at once (see NewClientFromURL), unless the URL's query q names them.
func failFast(q url.Values, dialerRetries *int, minRetryBackoff *time.Duration) {
	if !q.Has("dialer_retries") {
		*dialerRetries = 1
	}
	if !q.Has("min_retry_backoff") {
		*minRetryBackoff = -1 // go-redis: no backoff
	}
}

// query returns raw's query parameters; the URL has already been parsed
// successfully by go-redis, so an error here only leaves them empty.
func query(raw string) url.Values {
	u, err := url.Parse(raw)
	if err != nil {
		return nil
	}
	return u.Query()
}

// splitHosts parses u and splits its comma-separated host list, adding
// defPort where a host has none.
func splitHosts(raw, defPort string) (*url.URL, []string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("redisstore: store URL %q: %w", RedactURL(raw), err)
	}
	var hosts []string
	for _, h := range strings.Split(u.Host, ",") {
		if h == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(h); err != nil {
			h = net.JoinHostPort(h, defPort)
		}
		hosts = append(hosts, h)
	}
	if len(hosts) == 0 {
		return nil, nil, fmt.Errorf("redisstore: store URL %q names no host", RedactURL(raw))
	}
	return u, hosts, nil
}

// maxPoolSize bounds the connection-pool sizes a URL may ask for; go-redis
// panics on negative or huge ones.
const maxPoolSize = 1 << 16

// checkPool refuses pool sizes go-redis cannot use.
func checkPool(sizes ...int) error {
	for _, n := range sizes {
		if n < 0 || n > maxPoolSize {
			return fmt.Errorf("connection pool size %d out of range [0, %d]", n, maxPoolSize)
		}
	}
	return nil
}

// RedactURL returns the store URL s as written, with the password in its
// user information and the value of every password query parameter (the
// Sentinel form's; the name is matched case-insensitively) replaced by
// "xxxxx", for logs and error messages. It works on the text, so it hides
// them even in a URL that does not parse; text without "://" is returned
// unchanged.
func RedactURL(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return s
	}
	q := strings.IndexAny(rest, "?#")
	if q < 0 {
		q = len(rest)
	}
	// The user information ends at the last "@" before the query, so a
	// password with an unescaped "/" is hidden whole.
	if at := strings.LastIndexByte(rest[:q], '@'); at >= 0 {
		if user, _, hasPW := strings.Cut(rest[:at], ":"); hasPW {
			rest = user + ":xxxxx" + rest[at:]
		}
	}
	base, query, hasQuery := strings.Cut(rest, "?")
	if !hasQuery {
		return scheme + "://" + base
	}
	query, fragment, hasFragment := strings.Cut(query, "#")
	params := strings.Split(query, "&")
	for i, p := range params {
		if name, _, _ := strings.Cut(p, "="); strings.EqualFold(name, "password") {
			params[i] = name + "=xxxxx"
		}
	}
	out := scheme + "://" + base + "?" + strings.Join(params, "&")
	if hasFragment {
		out += "#" + fragment
	}
	return out
}

// failoverOptions parses the part after "redis+sentinel://" (base is
// "redis" or "rediss").
func failoverOptions(base, rest string) (*redis.FailoverOptions, error) {
	u, hosts, err := splitHosts(base+"://"+rest, "26379")
	if err != nil {
		return nil, err
	}
	if u.User == nil || u.User.Username() == "" {
		return nil, fmt.Errorf("sentinel form needs master@hosts")
	}
	q := u.Query()
	pw := q.Get("password")
	q.Del("password")
	for _, h := range hosts[1:] {
		q.Add("addr", h)
	}
	q.Set("master_name", u.User.Username())
	if db := strings.Trim(u.Path, "/"); db != "" {
		q.Set("db", db)
	}
	u.User, u.Host, u.Path, u.RawQuery = nil, hosts[0], "", q.Encode()
	o, err := redis.ParseFailoverURL(u.String())
	if err != nil {
		return nil, err
	}
	o.Password = pw
	return o, nil
}
