package server

import (
	"context"
	"errors"
	"github.com/limitplane/limitplane/dataplane/threshold"
	"log/slog"
	"reflect"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/drl"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/core/redisstore"
	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/gateway/config"
	"github.com/limitplane/limitplane/internal/seams"
	"github.com/limitplane/limitplane/metrics"
)

// open opens the store cfg names, makes the gateway over it, reporting
// to m, and applies cfg's snapshot, unless the configuration comes from a
// control plane (the gateway then answers 503 until the agent applies
// one). It returns the store too. With a drl section the Redis store is
// wrapped in the Distributed Rate Limiter (drl.Store), whose metrics go
// to m. The returned function closes the gateway, then the store: the
// DRL first (it leaves its group at once: its report and, if it is the
// allocator, its lease are deleted), then the Redis store and client. It
// runs after the HTTP server has drained, so no request is decided
// against a share once the gateway has left. Under failure_policy
// fallback with Redis, the fallback store is made here and seeded by the
// Redis store (gateway.NewFallback), and closed last.
func open(ctx context.Context, cfg *config.Config, o Options, m *opsMetrics) (*gateway.Gateway, core.Store, func() error, error) {
	log := o.Logger
	clock := o.Seams.Or().Clock // nil: the system clock
	so := gateway.StoreOptions{
		URL:           "memory",
		Memory:        memory.Options{Clock: clock, MaxKeys: cfg.Memory.MaxKeys},
		FailurePolicy: cfg.FailurePolicy,
		Logger:        log,
	}
	if r := cfg.Redis; r != nil {
		so.URL, so.Password, so.Name, so.Redis = r.URL, r.Password, cfg.RedactedStore(), r.Options
		if clock != nil {
			// A test froze the clock: the scripts take its time instead
			// of Redis TIME, and keys outlive the frozen instant in real
			// time.
			so.Redis.Seams, so.Redis.TTLMargin = &seams.Seams{Clock: clock}, time.Minute
		}
	}
	if cfg.ControlPlane != nil && cfg.Redis != nil {
		// Global quotas are spent from the leases the data plane's
		// quota runner (started beside the agent) holds in this Redis.
		so.Redis.FollowsControlPlane = true
	}
	// Under failure_policy fallback the gateway decides in an in-process
	// store while Redis fails; every Redis decision seeds it, so it
	// carries on from the counts this gateway last saw.
	var fallback *memory.Store
	if cfg.FailurePolicy == core.FailFallback && cfg.Redis != nil {
		fallback = gateway.NewFallback(clock, cfg.Memory.MaxKeys)
		so.Redis.Seed = fallback
	}
	if d := cfg.DRL; d != nil && cfg.Redis != nil {
		do := drlOptions(d, o)
		so.DRL = &do
	} else if cfg.DRL == nil {
		for _, p := range cfg.Snapshot.Policies {
			if p.Distributed {
				log.Warn("policies marked distributed are enforced exactly by the store: the file has no drl section", "policy", p.ID)
				break
			}
		}
	}
	store, closeStore, err := gateway.OpenStore(ctx, so)
	if err != nil {
		if fallback != nil {
			fallback.Close()
		}
		return nil, nil, nil, err
	}
	if s, ok := store.(*drl.Store); ok {
		d := cfg.DRL
		m.registerDRL(s)
		log.Info("distributed rate limiter on", "group", d.Group, "gateway", s.GatewayID(), "interval", d.Interval,
			"max_gateways", d.MaxGateways, "join_reserve", d.JoinReserve, "headroom", d.Headroom)
	}
	if fallback != nil {
		closeRedis := closeStore
		closeStore = func() error { return errors.Join(closeRedis(), fallback.Close()) }
	}
	var notifier *threshold.Notifier
	if cfg.ThresholdWebhook == nil && log != nil {
		// As distributed without drl: a setting that does nothing here
		// is said, not ignored.
		var with []string
		for _, p := range cfg.Snapshot.Policies {
			if len(p.Thresholds) > 0 {
				with = append(with, p.ID)
			}
		}
		if len(with) > 0 {
			log.Warn("policies name thresholds but there is no threshold_webhook section: no threshold events are sent", "policies", with)
		}
	}
	if log != nil {
		// Settling policies need an API that names where the actual cost
		// comes from; without one every request keeps its estimate.
		var settle []string
		for _, p := range cfg.Snapshot.Policies {
			if p.Settle {
				settle = append(settle, p.ID)
			}
		}
		named := false
		for _, a := range cfg.Snapshot.APIs {
			named = named || a.SettleHeader != ""
		}
		if len(settle) > 0 && !named && cfg.ControlPlane == nil {
			log.Warn("policies settle but no API names a settle_header: every request keeps its estimate", "policies", settle)
		}
	}
	if w := cfg.ThresholdWebhook; w != nil {
		var claimer threshold.Claimer
		exact := store
		if ds, ok := exact.(*drl.Store); ok {
			exact = ds.Exact()
		}
		if rs, ok := exact.(*redisstore.Store); ok {
			rc := threshold.NewRedisClaimer(rs.Client(), rs.KeyPrefix())
			// The data plane's quota runner (beside the agent) reports
			// them to the control plane's usage.
			rc.Reports = cfg.ControlPlane != nil
			claimer = rc
		}
		dp := ""
		if cfg.ControlPlane != nil {
			dp = cfg.ControlPlane.Group
		}
		notifier, err = threshold.New(threshold.Options{URL: w.URL, Secret: []byte(w.Secret), Timeout: w.Timeout, Queue: w.Queue,
			RetryFor: w.RetryFor, Claimer: claimer, DataPlane: dp, Logger: log})
		if err != nil {
			closeStore()
			return nil, nil, nil, err
		}
		m.registerThresholds(notifier)
		closeStoreOnly := closeStore
		closeStore = func() error { return errors.Join(notifier.Close(), closeStoreOnly()) }
	}
	opts := gateway.Options{
		Store:           store,
		FallbackMaxKeys: cfg.Memory.MaxKeys,
		FailurePolicy:   cfg.FailurePolicy,
		StoreTimeout:    cfg.StoreTimeout,
		Shadow:          cfg.Shadow,
		Observer:        m.decisions,
		OnStoreError:    m.decisions.ObserveStoreError,
		OnApply:         m.gateway.ObserveApply,
		ClientIP:        cfg.ClientIP,
		Response:        cfg.Response,
		Resolver:        cfg.Resolver,
		Logger:          log,
		Seams:           o.Seams,
	}
	if fallback != nil {
		opts.Fallback = fallback
	}
	if notifier != nil {
		opts.QuotaObserver = notifier
	}
	gw, err := gateway.New(opts)
	if err != nil {
		closeStore()
		return nil, nil, nil, err
	}
	closeAll := func() error { return errors.Join(gw.Close(), closeStore()) }
	if cfg.ControlPlane != nil {
		return gw, store, closeAll, nil
	}
	if err := gw.Apply(ctx, &cfg.Snapshot); err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	return gw, store, closeAll, nil
}

// newAgent makes the data-plane agent of cfg's control_plane section for
// gw: it persists in the store's Redis when the store is Redis, else in
// the state file.
func newAgent(cfg *config.Config, gw *gateway.Gateway, store core.Store, o Options) (*dataplane.Agent, string, error) {
	cp := cfg.ControlPlane
	var persister dataplane.Persister = dataplane.FilePersister{Path: cp.StateFile}
	where := "state file " + cp.StateFile
	if ds, ok := store.(*drl.Store); ok {
		store = ds.Exact()
	}
	if rs, ok := store.(*redisstore.Store); ok {
		persister = dataplane.NewRedisPersister(rs.Client(), cp.Group)
		where = "redis key " + dataplane.RedisConfigKey(cp.Group)
	}
	a, err := dataplane.New(dataplane.AgentOptions{
		Target:       gw,
		Address:      cp.Address,
		TLS:          cp.TLS,
		Group:        cp.Group,
		Tags:         cp.Tags,
		Token:        cp.Token,
		GatewayID:    cp.GatewayID,
		Version:      "cmd/limitplane-gateway",
		Persister:    persister,
		MaxStale:     cp.MaxStale,
		OnStale:      cp.OnStale,
		StartTimeout: o.StartTimeout,
		Now:          o.Seams.Or().Now,
		Logger:       o.Logger,
	})
	if err != nil {
		return nil, "", err
	}
	return a, where, nil
}

// newQuotaRunner makes the data plane's global-quota runner for a
// gateway with a control plane and a Redis store (nil otherwise): every
// gateway of the data plane runs one and one is elected.
func newQuotaRunner(cfg *config.Config, store core.Store, o Options) (*dataplane.QuotaRunner, error) {
	if ds, ok := store.(*drl.Store); ok {
		store = ds.Exact()
	}
	rs, ok := store.(*redisstore.Store)
	cp := cfg.ControlPlane
	log := o.Logger
	if cp != nil && !ok && log != nil {
		// Info, not a warning: nothing is wrong unless the control plane
		// marks a quota global, which this gateway cannot know yet.
		log.Info("should the control plane mark a quota global: with the in-process store this gateway counts it as its own quota (global quotas need a Redis store)",
			"store", cfg.RedactedStore())
	}
	if !ok || cp == nil || !rs.FollowsControlPlane() {
		return nil, nil
	}
	return dataplane.NewQuotaRunner(dataplane.QuotaRunnerOptions{
		Client: rs.Client(), KeyPrefix: rs.KeyPrefix(), Group: cp.Group, Token: cp.Token,
		Address: cp.Address, TLS: cp.TLS,
		OnError: func(err error) { log.Debug("global quotas", "err", err) },
	})
}

// reloader reads the configuration file again and applies it, on SIGHUP
// and on the admin endpoint's POST /reload.
type reloader struct {
	gw *gateway.Gateway
	// running is the configuration the gateway started with, fileListen
	// its file's listen address (before a -listen flag), file its name
	// ("" when the configuration was not read from a file).
	running          *config.Config
	fileListen, file string
	log              *slog.Logger
	// stats counts the files that do not load as refused (Apply counts
	// the rest itself).
	stats *metrics.Gateway
}

// reload reads the configuration file again and applies its policies,
// keys and APIs. A file with problems is refused, each problem logged with
// its line and column, and the running configuration stays; the error
// returned says why (a config.Errors lists one problem per line). Local
// settings (listen address, store, failure policy, timeouts, response
// format, client IP, admin, control_plane) take effect only at a restart:
// each one the file changed is logged as such and the running value is
// kept. A gateway whose configuration comes from a control plane applies
// nothing: it checks the file and logs the local settings it changed (a
// file that drops or adds the control_plane section is refused: that
// takes a restart).
func (r *reloader) reload(ctx context.Context) error {
	log, file := r.log, r.file
	if file == "" {
		err := errors.New("the configuration was not read from a file; there is no file to read again")
		log.Warn("reload: " + err.Error())
		r.stats.ObserveApply(0, err)
		return err
	}
	cfg, err := config.Load(file)
	if errs := (config.Errors{}); errors.As(err, &errs) {
		for _, e := range errs {
			log.Error("reload refused: "+e.Error(), "file", file)
		}
		log.Error("reload refused; the running configuration stays", "file", file, "problems", len(errs))
		r.stats.ObserveApply(0, err)
		return err
	} else if err != nil {
		log.Error("reload refused; the running configuration stays", "file", file, "err", err)
		r.stats.ObserveApply(0, err)
		return err
	}
	for _, name := range restartOnly(r.running, r.fileListen, cfg) {
		log.Warn("reload: "+name+" changed in the file; it takes effect only when the gateway restarts", "file", file)
	}
	if r.running.ControlPlane != nil {
		if cfg.ControlPlane == nil {
			err := errors.New("the file no longer has a control_plane section; restart the gateway to take its configuration from the file")
			log.Error("reload refused; the running configuration stays", "file", file, "err", err)
			r.stats.ObserveApply(0, err)
			return err
		}
		// Policies, keys and APIs are the control plane's: nothing to
		// apply.
		log.Info("reloaded: the configuration comes from the control plane; local settings take effect at a restart", "file", file)
		return nil
	}
	if cfg.ControlPlane != nil {
		err := errors.New("the file now has a control_plane section; restart the gateway to take its configuration from the control plane")
		log.Error("reload refused; the running configuration stays", "file", file, "err", err)
		r.stats.ObserveApply(0, err)
		return err
	}
	if err := r.gw.Apply(ctx, &cfg.Snapshot); err != nil {
		log.Error("reload refused; the running configuration stays", "file", file, "err", err)
		return err
	}
	s := &cfg.Snapshot
	log.Info("reloaded", "file", file, "policies", len(s.Policies), "keys", len(s.Keys), "apis", len(s.APIs))
	return nil
}

// restartOnly names the local settings whose value differs between the
// running configuration and next.
func restartOnly(running *config.Config, fileListen string, next *config.Config) []string {
	var changed []string
	check := func(name string, a, b any) {
		if !reflect.DeepEqual(a, b) {
			changed = append(changed, name)
		}
	}
	check("listen", fileListen, next.Listen)
	check("store", running.Store, next.Store)
	check("redis", running.Redis, next.Redis)
	check("failure_policy", running.FailurePolicy, next.FailurePolicy)
	check("store_timeout", running.StoreTimeout, next.StoreTimeout)
	check("shadow", running.Shadow, next.Shadow)
	check("client_ip", running.ClientIP, next.ClientIP)
	check("server", running.Server, next.Server)
	check("response", running.Response, next.Response)
	check("admin", running.Admin, next.Admin)
	check("control_plane", controlPlaneSettings(running.ControlPlane), controlPlaneSettings(next.ControlPlane))
	check("drl", running.DRL, next.DRL)
	return changed
}

// controlPlaneSettings is a control_plane section in a comparable form
// (its TLS configuration holds parsed certificates and pools).
func controlPlaneSettings(cp *config.ControlPlane) any {
	if cp == nil {
		return nil
	}
	c := *cp
	tlsOn := c.TLS != nil
	var serverName string
	var certs int
	if tlsOn {
		serverName, certs = c.TLS.ServerName, len(c.TLS.Certificates)
	}
	c.TLS = nil
	return struct {
		config.ControlPlane
		TLS        bool
		ServerName string
		Certs      int
	}{c, tlsOn, serverName, certs}
}

// drlOptions are the drl section's options (config.DRL is drl.Options)
// with the gateway's logger. The DRL reads the system clock, whatever
// o.Clock says: its clock is no option (a test of the DRL on a manual
// clock is core/drl's own).
func drlOptions(d *config.DRL, o Options) drl.Options {
	do := *d
	do.Logger = o.Logger
	return do
}
