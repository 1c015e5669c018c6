package metrics

import "github.com/prometheus/client_golang/prometheus"

// Gateway counts what a gateway does besides deciding requests: the
// configurations it applies or refuses and the revision it runs. It is a
// prometheus.Collector; pass ObserveApply as gateway.Options.OnApply.
// (Store errors are counted by Collector.ObserveStoreError.)
//
// It exports, under Options.Namespace (default "limitplane"):
//
//   - <namespace>_config_revision: the revision of the running snapshot
//     (0 for a local file, which no control plane numbers); unchanged by a
//     refused one.
//   - <namespace>_config_applies_total{result}: configurations applied
//     (result="ok") or refused (result="refused": invalid, stale, or a
//     file that does not load). Both series are exported from the start,
//     at 0.
//
// Options.Keys and Options.Buckets are not used.
type Gateway struct {
	revision prometheus.Gauge
	applies  *prometheus.CounterVec
}

// NewGateway returns a Gateway collector for o.
func NewGateway(o Options) *Gateway {
	if o.Namespace == "" {
		o.Namespace = "limitplane"
	}
	g := &Gateway{
		revision: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: o.Namespace, Name: "config_revision",
			Help: "Revision of the running configuration snapshot (0 for a local file).",
		}),
		applies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: o.Namespace, Name: "config_applies_total",
			Help: "Configurations applied (ok) or refused (refused), by result.",
		}, []string{"result"}),
	}
	g.applies.WithLabelValues("ok")
	g.applies.WithLabelValues("refused")
	return g
}

// ObserveApply records one attempt to apply a configuration: with a nil
// err it counts result="ok" and sets the revision gauge to revision;
// otherwise it counts result="refused" and leaves the gauge alone. Safe
// for concurrent use.
func (g *Gateway) ObserveApply(revision uint64, err error) {
	if err != nil {
		g.applies.WithLabelValues("refused").Inc()
		return
	}
	g.revision.Set(float64(revision))
	g.applies.WithLabelValues("ok").Inc()
}

// Describe implements prometheus.Collector.
func (g *Gateway) Describe(ch chan<- *prometheus.Desc) {
	g.revision.Describe(ch)
	g.applies.Describe(ch)
}

// Collect implements prometheus.Collector.
func (g *Gateway) Collect(ch chan<- prometheus.Metric) {
	g.revision.Collect(ch)
	g.applies.Collect(ch)
}

var _ prometheus.Collector = (*Gateway)(nil)
