package main

import (
	"context"
	"log/slog"
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/dataplane/drl"
	"github.com/limitplane/limitplane/gateway"
	"github.com/limitplane/limitplane/gateway/config"
	"github.com/limitplane/limitplane/metrics"
)

// opsMetrics are the gateway's Prometheus metrics, served by the admin
// endpoint's GET /metrics: decisions, the gateway's own counters, and the
// Go runtime and process collectors, in a registry of their own.
type opsMetrics struct {
	registry  *prometheus.Registry
	decisions *metrics.Collector
	gateway   *metrics.Gateway
}

func newOpsMetrics() *opsMetrics {
	m := &opsMetrics{
		registry:  prometheus.NewRegistry(),
		decisions: metrics.New(metrics.Options{}),
		gateway:   metrics.NewGateway(metrics.Options{}),
	}
	m.registry.MustRegister(m.decisions, m.gateway,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// adminServer is the operations endpoint's HTTP server.
type adminServer struct {
	srv    *http.Server
	base   string     // http://host:port
	served chan error // Serve's result
}

// startAdmin listens on cfg.Admin's address and serves gw's operations
// endpoint there, with m's metrics, reload for POST /reload and, for a
// data-plane gateway, its agent's status in /readyz (agent nil: none). It
// returns nil when the file has no admin section.
func startAdmin(cfg *config.Config, gw *gateway.Gateway, m *opsMetrics, reload func(context.Context) error, agent *dataplane.Agent, log *slog.Logger) (*adminServer, error) {
	a := cfg.Admin
	if a == nil {
		return nil, nil
	}
	ln, err := net.Listen("tcp", a.Listen)
	if err != nil {
		return nil, err
	}
	s := &adminServer{base: baseURL(ln.Addr()), served: make(chan error, 1)}
	var cp func() any
	if agent != nil {
		cp = func() any { return agent.Status() }
	}
	s.srv = &http.Server{
		Handler: gw.AdminHandler(gateway.AdminOptions{
			Token:             a.Token,
			ReadsWithoutToken: a.Loopback,
			Reload:            reload,
			Gatherer:          m.registry,
			ControlPlane:      cp,
		}),
		ReadHeaderTimeout: cfg.Server.ReadHeaderTimeout,
		ReadTimeout:       cfg.Server.ReadTimeout,
		WriteTimeout:      cfg.Server.WriteTimeout,
		IdleTimeout:       cfg.Server.IdleTimeout,
		MaxHeaderBytes:    cfg.Server.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	go func() { s.served <- s.srv.Serve(ln) }()
	return s, nil
}

// registerSync adds the agent's sync metrics to m.
func (m *opsMetrics) registerSync(agent *dataplane.Agent) {
	m.registry.MustRegister(metrics.NewSync(metrics.Options{}, func() metrics.SyncState {
		s := agent.Status()
		d := s.Deliveries
		return metrics.SyncState{
			Connected: s.State == "connected", AppliedRevision: s.AppliedRevision, Staleness: s.Staleness,
			SnapshotsApplied: d.SnapshotsApplied, SnapshotsRejected: d.SnapshotsRejected,
			ChangesApplied: d.ChangesApplied, ChangesRejected: d.ChangesRejected, Reconnects: s.Reconnects,
		}
	}))
}

// registerDRL adds the Distributed Rate Limiter's metrics to m.
func (m *opsMetrics) registerDRL(s *drl.Store) {
	m.registry.MustRegister(metrics.NewDRL(metrics.Options{}, func() metrics.DRLState {
		st := s.Stats()
		return metrics.DRLState{Epoch: st.Epoch, HotKeys: st.HotKeys, ShareRate: st.ShareRate, Allocator: st.Allocator,
			Fallbacks: st.Fallbacks, Tables: st.Tables}
	}))
}
