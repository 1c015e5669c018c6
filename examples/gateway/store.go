package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/examples/gateway/config"
	"github.com/redis/go-redis/v9"
)

// startupPingTimeout bounds the PING that checks Redis at startup.
const startupPingTimeout = 5 * time.Second

// openStore returns the store cfg names. For Redis it creates the client,
// PINGs it, and registers the store and client with g's closers.
//
// A Redis that answers but refuses the gateway (a wrong or missing
// password, a database number out of range) is a configuration error:
// the gateway does not start, whatever failure_policy says, since waiting
// would not mend it. When Redis does not answer at startup, failure_policy
// decides, as it does for every request later: closed refuses to start
// (every request would get 503, and a mistyped address should not look
// like an outage); open and fallback start degraded, with a warning, and
// begin limiting through Redis as soon as it answers.
func (g *gateway) openStore(ctx context.Context, cfg *config.Config, e env, log *slog.Logger) (core.Store, error) {
	if cfg.Redis == nil {
		s := memory.New(memory.Options{Clock: e.clock, SweepInterval: time.Minute, MaxKeys: cfg.Memory.MaxKeys})
		g.closers = append(g.closers, s.Close)
		return s, nil
	}
	name := cfg.RedactedStore()
	// go-redis logs pool trouble (a failed dial each time it dials while
	// Redis is down) with its own global logger; send it to the gateway's
	// log, at most a line per interval as for store failures. The logger
	// is process-wide: the last gateway started in a process gets it.
	rl := newFailureLog(log, failureLogOptions{Msg: "redis client failed", Attrs: []any{"component", "go-redis"}, AfterFunc: e.afterFunc})
	g.closers = append(g.closers, rl.Close)
	redis.SetLogger(redisLog{rl})
	client, err := redisstore.NewClientFromURL(cfg.Redis.URL)
	if err != nil {
		return nil, fmt.Errorf("store %s: %s", name, hide(err, cfg.Redis.Password))
	}
	g.closers = append(g.closers, client.Close)
	o := cfg.Redis.Options
	o.OnBreakerChange = func(from, to string) {
		log.Warn("redis circuit breaker", "from", from, "to", to)
	}
	if e.clock != nil {
		// A test froze the clock: the scripts take its time instead of
		// Redis TIME, and keys outlive the frozen instant in real time.
		o.Clock, o.TTLMargin = e.clock, time.Minute
	}
	s, err := redisstore.New(client, o)
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", name, err)
	}
	g.closers = append(g.closers, s.Close)

	pctx, cancel := context.WithTimeout(ctx, startupPingTimeout)
	defer cancel()
	if err := client.Ping(pctx).Err(); err != nil {
		kind, refused := pingFailure(err)
		msg := kind + ": " + hide(err, cfg.Redis.Password)
		switch {
		case refused:
			return nil, fmt.Errorf("store %s: %s (not starting, whatever failure_policy says)", name, msg)
		case cfg.FailurePolicy == core.FailClosed:
			return nil, fmt.Errorf("store %s: %s (failure_policy closed: not starting)", name, msg)
		}
		log.Warn("redis is unreachable; starting degraded until it answers",
			"store", name, "failure_policy", policyName(cfg.FailurePolicy), "err", msg)
	}
	return s, nil
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
func hide(err error, password string) string {
	msg := err.Error()
	if password == "" {
		return msg
	}
	for _, p := range []string{password, url.QueryEscape(password), url.PathEscape(password)} {
		msg = strings.ReplaceAll(msg, p, "xxxxx")
	}
	return msg
}

// redisLog adapts the gateway's logger to go-redis's: each message is a
// failure for a failureLog.
type redisLog struct{ f *failureLog }

// Printf implements go-redis's internal.Logging.
func (r redisLog) Printf(_ context.Context, format string, v ...any) {
	r.f.Failed(errors.New(strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")))
}

// windowsAsGCRA is the fallback store under failure_policy fallback. The
// in-process store implements only GCRA, so while Redis is down a window
// limit (fixed_window, sliding_window, sliding_log) of N per period is
// enforced as GCRA with the same N per period and a burst of N: the same
// long-run rate, without the fixed window's 2× burst at a boundary.
//
// The in-process store is a named field, not embedded: embedding would
// pass on its optional interfaces (core.AlgorithmSupporter,
// core.DecisionWriter), and the engine would see "GCRA only" and refuse
// window policies, or a caller would reach TakeInto past the conversion.
// Every method here is written out.
type windowsAsGCRA struct{ mem *memory.Store }

// Take implements core.Store: req's limit, converted to GCRA if it names
// a window algorithm, is applied to the in-process store.
func (s windowsAsGCRA) Take(ctx context.Context, req core.Request) (core.Decision, error) {
	if req.Rate.Algorithm != core.GCRA {
		req.Rate.Algorithm, req.Rate.Burst = core.GCRA, 0
	}
	return s.mem.Take(ctx, req)
}

// ResetQuota implements core.Store.
func (s windowsAsGCRA) ResetQuota(ctx context.Context, consumer, scope string) error {
	return s.mem.ResetQuota(ctx, consumer, scope)
}

// SupportsAlgorithm implements core.AlgorithmSupporter: every algorithm
// is enforced, the window ones as GCRA.
func (s windowsAsGCRA) SupportsAlgorithm(a core.Algorithm) bool {
	switch a {
	case core.GCRA, core.SlidingWindow, core.FixedWindow, core.SlidingLog:
		return true
	}
	return false
}

var _ core.AlgorithmSupporter = windowsAsGCRA{}
