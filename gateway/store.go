package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/drl"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/internal/failurelog"
	"github.com/limitplane/limitplane/live"
	"github.com/redis/go-redis/v9"
)

// startupPingTimeout bounds the PING that checks Redis at startup.
const startupPingTimeout = 5 * time.Second

// StoreOptions say which counter store OpenStore opens.
type StoreOptions struct {
	// URL is "memory" (or "") for the in-process store, or a Redis URL as
	// redisstore.NewClientFromURL takes it (redis://, rediss://, unix://,
	// redis+cluster://, redis+sentinel://), its password filled in.
	URL string
	// Password is the password inside URL, if any: messages hide it.
	Password string
	// Name is how messages call the store; "" means URL with Password
	// replaced by "xxxxx".
	Name string
	// Redis are the Redis store's options.
	Redis redisstore.Options
	// Memory are the in-process store's options; a zero SweepInterval
	// means one minute.
	Memory memory.Options
	// FailurePolicy decides what a Redis that does not answer at startup
	// means (see OpenStore).
	FailurePolicy core.FailurePolicy
	// Logger receives warnings (Redis unreachable at startup, circuit
	// breaker changes, go-redis's own pool messages, at most one line per
	// 5 s with counts as for store failures); nil means slog.Default().
	Logger *slog.Logger
	// DRL, when set, puts the Distributed Rate Limiter (core/drl) with
	// these options in front of a Redis store: OpenStore returns the
	// drl.Store, over the Redis store and on its client, once the store is
	// open (after the startup PING, whatever it answered). Closing closes
	// it first (it leaves its group), while the client still works. An
	// error from drl.New closes the store and fails OpenStore. A nil
	// Logger in it means Logger. It is not used for the in-process store.
	DRL *drl.Options
}

// OpenStore opens the store o names and returns it with the function that
// closes it (and its Redis client). For Redis it creates the client and
// PINGs it.
//
// A Redis that answers but refuses the gateway (a wrong or missing
// password, a database number out of range) is a configuration error:
// OpenStore fails, whatever FailurePolicy says, since waiting would not
// mend it. When Redis does not answer, FailurePolicy decides, as it does
// for every request later: core.FailClosed fails (every request would get
// 503, and a mistyped address should not look like an outage); FailOpen
// and FailFallback return the store with a warning, and it limits through
// Redis as soon as Redis answers.
func OpenStore(ctx context.Context, o StoreOptions) (core.Store, func() error, error) {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	if o.URL == "" || o.URL == "memory" {
		mo := o.Memory
		if mo.SweepInterval == 0 {
			mo.SweepInterval = time.Minute
		}
		s := memory.New(mo)
		return s, s.Close, nil
	}
	name := o.Name
	if name == "" {
		name = hideIn(o.URL, o.Password)
	}
	client, err := redisstore.NewClientFromURL(o.URL)
	if err != nil {
		return nil, nil, fmt.Errorf("gateway: store %s: %s", name, hide(err, o.Password))
	}
	ro := o.Redis
	if ro.OnBreakerChange == nil {
		// One line when the breaker opens and one when it closes: while
		// Redis stays down the breaker goes open → half-open → open every
		// cooldown, which would write two lines a second.
		ro.OnBreakerChange = func(from, to string) {
			switch {
			case from == "closed" && to == "open":
				log.Warn("redis circuit breaker opened: deciding by failure_policy until Redis answers", "from", from, "to", to)
			case to == "closed":
				log.Info("redis circuit breaker closed: Redis answers again", "from", from, "to", to)
			default:
				log.Debug("redis circuit breaker", "from", from, "to", to)
			}
		}
	}
	s, err := redisstore.New(client, ro)
	if err != nil {
		client.Close()
		return nil, nil, fmt.Errorf("gateway: store %s: %w", name, err)
	}
	closeAll := func() error { return errors.Join(s.Close(), client.Close()) }

	pctx, cancel := context.WithTimeout(ctx, startupPingTimeout)
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		kind, refused := pingFailure(err)
		msg := kind + ": " + hide(err, o.Password)
		switch {
		case refused:
			closeAll()
			return nil, nil, fmt.Errorf("gateway: store %s: %s (not starting, whatever failure_policy says)", name, msg)
		case o.FailurePolicy == core.FailClosed:
			closeAll()
			return nil, nil, fmt.Errorf("gateway: store %s: %s (failure_policy closed: not starting)", name, msg)
		}
		log.Warn("redis is unreachable; starting degraded until it answers",
			"store", name, "failure_policy", policyName(o.FailurePolicy), "err", msg)
	}
	if o.DRL == nil {
		return s, closeAll, nil
	}
	do := *o.DRL
	if do.Logger == nil {
		do.Logger = log
	}
	d, err := drl.New(client, s, do)
	if err != nil {
		closeAll()
		return nil, nil, fmt.Errorf("gateway: store %s: %w", name, err)
	}
	return d, func() error { return errors.Join(d.Close(), closeAll()) }, nil
}

// pingFailure words what a failed startup PING means, and reports whether
// Redis refused the gateway (a configuration error) rather than failed to
// answer. go-redis authenticates and selects the database when it opens a
// connection, so those errors come back from the PING.
func pingFailure(err error) (kind string, refused bool) {
	var re redis.Error
	switch {
	case !errors.As(err, &re):
		return "redis is unreachable", false
	case redis.IsAuthError(err), redis.IsPermissionError(err),
		// "ERR AUTH <password> called without any password configured"
		// (Redis 6 and later), "ERR Client sent AUTH, but no password is
		// set" (before).
		redis.HasErrorPrefix(err, "AUTH "), redis.HasErrorPrefix(err, "Client sent AUTH"):
		return "redis authentication failed", true
	case redis.HasErrorPrefix(err, "DB index is out of range"), redis.HasErrorPrefix(err, "invalid DB index"),
		redis.HasErrorPrefix(err, "SELECT is not allowed in cluster mode"):
		return "redis refused the database number", true
	}
	// Any other error reply (LOADING, BUSY, ...) should pass.
	return "redis answered with an error", false
}

// policyName returns a failure policy's config name.
func policyName(p core.FailurePolicy) string {
	switch p {
	case core.FailClosed:
		return "closed"
	case core.FailFallback:
		return "fallback"
	}
	return "open"
}

// hide returns err's text with password (as given and URL-escaped)
// replaced by "xxxxx": go-redis and URL errors may quote the URL.
func hide(err error, password string) string { return hideIn(err.Error(), password) }

// hideIn returns msg with password (as given and URL-escaped) replaced by
// "xxxxx".
func hideIn(msg, password string) string {
	if password == "" {
		return msg
	}
	for _, p := range []string{password, url.QueryEscape(password), url.PathEscape(password)} {
		msg = strings.ReplaceAll(msg, p, "xxxxx")
	}
	return msg
}

// RedisLogger sends go-redis's own log lines (pool trouble: a failed dial
// each time it dials while Redis is down) to a slog.Logger as failures,
// "redis client failed" with component=go-redis, at most one line per
// StoreFailureLogInterval as for store failures. go-redis's logger is
// process-wide, so no library call installs it: a program does, once,
// by giving NewRedisLogger(log, nil) to go-redis's SetLogger, and closes it
// at exit (cmd/limitplane-gateway does).
// Sentinel's news (the master it found, a failover, another sentinel
// discovered) is no failure: it goes to the log at INFO, each line as it
// comes ("redis sentinel" with component=go-redis).
type RedisLogger struct {
	log *slog.Logger
	f   *failurelog.Log
}

// NewRedisLogger returns a RedisLogger writing to log; afterFunc times
// its intervals (nil: time.AfterFunc).
func NewRedisLogger(log *slog.Logger, afterFunc AfterFunc) *RedisLogger {
	return &RedisLogger{log: log, f: failurelog.New(log, failurelog.Options{Msg: "redis client failed", Attrs: []any{"component", "go-redis"}, AfterFunc: afterFunc})}
}

// sentinelNews reports whether msg is one of go-redis's (v9) Sentinel
// lines that tell what it found, not what failed.
func sentinelNews(msg string) bool {
	return strings.HasPrefix(msg, "sentinel: selected ") || strings.HasPrefix(msg, "sentinel: new master") ||
		strings.HasPrefix(msg, "sentinel: discovered new sentinel") || strings.HasPrefix(msg, "sentinel: ignore addr for master")
}

// Printf implements go-redis's internal.Logging.
func (r *RedisLogger) Printf(_ context.Context, format string, v ...any) {
	msg := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	if sentinelNews(msg) {
		r.log.Info("redis sentinel", "news", msg, "component", "go-redis")
		return
	}
	r.f.Failed(errors.New(msg))
}

// Close writes the last interval's count, if any, and stops the timer.
func (r *RedisLogger) Close() error { return r.f.Close() }

// NewFallback returns the in-process fallback store of failure_policy
// fallback (live.NewFallback): a memory store on clock (nil: the system
// clock) holding at most maxKeys keys (0: unbounded), enforcing window
// limits as GCRA (memory.Options.WindowsAsGCRA), that the Redis store can
// seed. Give it to Options.Fallback and, for a Redis store, to
// StoreOptions.Redis.Seed; Close stops its sweeps.
func NewFallback(clock core.Clock, maxKeys int) *memory.Store {
	return live.NewFallback(clock, maxKeys)
}
