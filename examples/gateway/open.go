package main

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"time"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/gateway/config"
)

// open opens the store cfg names, makes the gateway over it and applies
// cfg's snapshot. The returned function closes the gateway, then the
// store.
func open(ctx context.Context, cfg *config.Config, e env, log *slog.Logger) (*gateway.Gateway, func() error, error) {
	so := gateway.StoreOptions{
		URL:           "memory",
		Memory:        memory.Options{Clock: e.clock, MaxKeys: cfg.Memory.MaxKeys},
		FailurePolicy: cfg.FailurePolicy,
		Logger:        log,
		AfterFunc:     e.afterFunc,
	}
	if r := cfg.Redis; r != nil {
		so.URL, so.Password, so.Name, so.Redis = r.URL, r.Password, cfg.RedactedStore(), r.Options
		if e.clock != nil {
			// A test froze the clock: the scripts take its time instead
			// of Redis TIME, and keys outlive the frozen instant in real
			// time.
			so.Redis.Clock, so.Redis.TTLMargin = e.clock, time.Minute
		}
	}
	store, closeStore, err := gateway.OpenStore(ctx, so)
	if err != nil {
		return nil, nil, err
	}
	var fallback core.Store
	if cfg.FailurePolicy == core.FailFallback {
		fb := memory.New(memory.Options{Clock: e.clock, SweepInterval: time.Minute, MaxKeys: cfg.Memory.MaxKeys})
		fallback = gateway.NewWindowsAsGCRA(fb)
		closeRedis := closeStore
		closeStore = func() error { return errors.Join(closeRedis(), fb.Close()) }
	}
	gw, err := gateway.New(gateway.Options{
		Store:         store,
		Fallback:      fallback,
		FailurePolicy: cfg.FailurePolicy,
		StoreTimeout:  cfg.StoreTimeout,
		Shadow:        cfg.Shadow,
		ClientIP:      cfg.ClientIP,
		Response:      cfg.Response,
		Resolver:      cfg.Resolver,
		Logger:        log,
		Clock:         e.clock,
		Now:           e.now,
		AfterFunc:     e.afterFunc,
	})
	if err != nil {
		closeStore()
		return nil, nil, err
	}
	closeAll := func() error { return errors.Join(gw.Close(), closeStore()) }
	if err := gw.Apply(ctx, &cfg.Snapshot); err != nil {
		closeAll()
		return nil, nil, err
	}
	return gw, closeAll, nil
}

// reload reads the configuration file again and applies its policies,
// keys and APIs to gw. A file with problems is refused, each problem
// logged with its line and column, and the running configuration stays.
// Local settings (listen address, store, failure policy, timeouts,
// response format, client IP) take effect only at a restart: each one the
// file changed is logged as such and the running value is kept. running
// is the configuration the gateway started with, fileListen its file's
// listen address (before a -listen flag).
func reload(ctx context.Context, gw *gateway.Gateway, running *config.Config, fileListen, file string, log *slog.Logger) {
	if file == "" {
		log.Warn("reload: the gateway runs the built-in demo configuration; there is no file to read again")
		return
	}
	cfg, err := config.Load(file)
	if errs := (config.Errors{}); errors.As(err, &errs) {
		for _, e := range errs {
			log.Error("reload refused: "+e.Error(), "file", file)
		}
		log.Error("reload refused; the running configuration stays", "file", file, "problems", len(errs))
		return
	} else if err != nil {
		log.Error("reload refused; the running configuration stays", "file", file, "err", err)
		return
	}
	for _, name := range restartOnly(running, fileListen, cfg) {
		log.Warn("reload: "+name+" changed in the file; it takes effect only when the gateway restarts", "file", file)
	}
	if err := gw.Apply(ctx, &cfg.Snapshot); err != nil {
		log.Error("reload refused; the running configuration stays", "file", file, "err", err)
		return
	}
	s := &cfg.Snapshot
	log.Info("reloaded", "file", file, "policies", len(s.Policies), "keys", len(s.Keys), "apis", len(s.APIs))
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
	return changed
}
