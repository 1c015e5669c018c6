package server

import (
	"github.com/limitplane/limitplane/dataplane/threshold"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/drl"
	"github.com/limitplane/limitplane/dataplane"
	"github.com/limitplane/limitplane/gateway"
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

// newOpsMetrics makes the metrics and their registry.
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

// registerKeys adds the in-process store's keys to the metrics
// (limitplane_keys, and limitplane_keys_max and
// limitplane_keys_refused_total): the memory store's; a Redis store holds
// no keys in process.
func (m *opsMetrics) registerKeys(store core.Store) {
	var o metrics.Options
	if ks, ok := store.(interface{ Len() int }); ok {
		o.Keys = ks
	}
	if kc, ok := store.(interface {
		MaxKeys() int
		KeysRefused() uint64
	}); ok {
		o.KeyCap = kc
	}
	if o.Keys != nil || o.KeyCap != nil {
		m.registry.MustRegister(metrics.NewKeys(o))
	}
}

// listenAdmin listens on the admin section's address and makes the
// operations endpoint's server for s's gateway, with s's metrics, Reload
// for POST /reload and, for a data-plane gateway, its agent's status in
// /readyz. It makes nothing when the file has no admin section.
func (s *Server) listenAdmin() error {
	a := s.cfg.Admin
	if a == nil {
		return nil
	}
	ln, err := net.Listen("tcp", a.Listen)
	if err != nil {
		return err
	}
	s.adminLn = ln
	var cp func() any
	if agent := s.agent; agent != nil {
		cp = func() any { return agent.Status() }
	}
	s.admin = s.newHTTPServer(s.gw.AdminHandler(gateway.AdminOptions{
		Token:             a.Token,
		ReadsWithoutToken: a.Loopback,
		Reload:            s.Reload,
		Gatherer:          s.metrics.registry,
		ControlPlane:      cp,
	}))
	return nil
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
	m.registry.MustRegister(metrics.NewDRL(metrics.Options{}, s.Stats))
}

// registerThresholds adds limitplane_threshold_events_total{outcome}
// (metrics.Thresholds) for the threshold webhook's notifier.
func (m *opsMetrics) registerThresholds(n *threshold.Notifier) {
	m.registry.MustRegister(metrics.NewThresholds(metrics.Options{}, n.MetricStats))
}
