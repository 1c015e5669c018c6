package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// SyncState is a data-plane gateway's link to its control plane as Sync
// exports it (dataplane.Agent.Status has it all).
type SyncState struct {
	// Connected: the control plane answered on the open stream.
	Connected bool
	// AppliedRevision is the revision the gateway runs.
	AppliedRevision uint64
	// Staleness is how long the gateway has been without its control
	// plane (0 while connected).
	Staleness time.Duration
	// Deliveries by kind and outcome, since start.
	SnapshotsApplied, SnapshotsRejected, ChangesApplied, ChangesRejected uint64
	// Reconnects counts streams opened after the first.
	Reconnects uint64
}

// Sync exports a data-plane gateway's sync state, read from a function
// at every scrape. It is a prometheus.Collector exporting, under
// Options.Namespace (default "limitplane"):
//
//   - <namespace>_sync_connected: 1 while connected, else 0.
//   - <namespace>_sync_applied_revision: the revision the gateway runs.
//   - <namespace>_sync_staleness_seconds: time without the control plane.
//   - <namespace>_sync_deliveries_total{kind="snapshot"|"changes",
//     result="applied"|"rejected"}: deliveries, all four series from the
//     start.
//   - <namespace>_sync_reconnects_total: streams opened after the first.
//
// Options.Keys, KeyCap and Buckets are not used.
type Sync struct {
	read                                       func() SyncState
	connected, revision, staleness, reconnects *prometheus.Desc
	deliveries                                 *prometheus.Desc
}

// NewSync returns a Sync collector that calls read at every scrape; read
// must be safe for concurrent use.
func NewSync(o Options, read func() SyncState) *Sync {
	if o.Namespace == "" {
		o.Namespace = "limitplane"
	}
	name := func(n string) string { return prometheus.BuildFQName(o.Namespace, "sync", n) }
	return &Sync{
		read:       read,
		connected:  prometheus.NewDesc(name("connected"), "1 while the gateway is connected to its control plane, else 0.", nil, nil),
		revision:   prometheus.NewDesc(name("applied_revision"), "Revision of the configuration the gateway runs.", nil, nil),
		staleness:  prometheus.NewDesc(name("staleness_seconds"), "Time the gateway has been without its control plane (0 while connected).", nil, nil),
		reconnects: prometheus.NewDesc(name("reconnects_total"), "Sync streams opened after the first.", nil, nil),
		deliveries: prometheus.NewDesc(name("deliveries_total"), "Deliveries from the control plane, by kind (snapshot, changes) and result (applied, rejected).", []string{"kind", "result"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (s *Sync) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{s.connected, s.revision, s.staleness, s.reconnects, s.deliveries} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (s *Sync) Collect(ch chan<- prometheus.Metric) {
	st := s.read()
	connected := 0.0
	if st.Connected {
		connected = 1
	}
	ch <- prometheus.MustNewConstMetric(s.connected, prometheus.GaugeValue, connected)
	ch <- prometheus.MustNewConstMetric(s.revision, prometheus.GaugeValue, float64(st.AppliedRevision))
	ch <- prometheus.MustNewConstMetric(s.staleness, prometheus.GaugeValue, st.Staleness.Seconds())
	ch <- prometheus.MustNewConstMetric(s.reconnects, prometheus.CounterValue, float64(st.Reconnects))
	for _, d := range []struct {
		kind, result string
		n            uint64
	}{
		{"snapshot", "applied", st.SnapshotsApplied}, {"snapshot", "rejected", st.SnapshotsRejected},
		{"changes", "applied", st.ChangesApplied}, {"changes", "rejected", st.ChangesRejected},
	} {
		ch <- prometheus.MustNewConstMetric(s.deliveries, prometheus.CounterValue, float64(d.n), d.kind, d.result)
	}
}

var _ prometheus.Collector = (*Sync)(nil)
