package controlplane

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
)

// Metrics are the control plane's Prometheus metrics. Give the same
// Metrics to Admin (AdminOptions.Metrics) and NewSyncServer
// (SyncOptions.Metrics); each control plane has its own registry (no
// global one). Exported, all under limitplane_controlplane_:
//
//   - revision: the store's revision, set at start (SetRevision) and after
//     every admin write.
//   - admin_writes_total{result="ok"|"error"}: admin writes, by outcome.
//   - admin_write_duration_seconds: admin writes' latency, from the
//     request to the store's answer (a histogram).
//   - admin_refused_total: admin calls refused for a missing or wrong
//     bearer token.
//   - sync_streams: open sync streams, including those still waiting for
//     their Hello.
//   - sync_refused_total{reason}: sync streams refused or ended before
//     they were served: hello_timeout, not_hello, unauthenticated,
//     permission_denied, invalid, too_many_streams, too_many_hellos
//     (waiting for their Hello), shutdown.
//   - sync_deliveries_total{kind="snapshot"|"changes"}: deliveries sent.
//   - sync_acks_total, sync_nacks_total: Acks and Nacks received.
//   - gateways_connected{group}: gateways with an open stream, by group
//     (read from DataPlanes at every scrape).
//   - quota_leases_total{group,mode}, quota_leased_units_total{group,mode}:
//     global-quota leases granted (a repeated request not counted again)
//     and their units, by data-plane group and mode (QuotaServer).
//   - quota_reports_total{group,mode}: spend reports applied.
//   - quota_refusals_total{group,reason}: grant requests and reports
//     refused, reason stale_token or unknown_entry.
//   - quota_call_errors_total{code}: Lease calls failed as a whole, by
//     gRPC code (Unauthenticated, PermissionDenied, InvalidArgument,
//     Unavailable).
//   - quota_ledger_write_duration_seconds: one Lease call's ledger
//     transaction, until committed (a histogram).
//
// Labels are bounded: groups are the configured data-plane tokens',
// modes three; no label names a key or an entry.
//
// The zero Metrics is not usable; a nil *Metrics counts nothing.
type Metrics struct {
	revision       prometheus.Gauge
	writes         *prometheus.CounterVec
	writeSeconds   prometheus.Histogram
	adminRefused   prometheus.Counter
	streams        prometheus.Gauge
	streamsRefused *prometheus.CounterVec
	deliveries     *prometheus.CounterVec
	acks, nacks    prometheus.Counter

	quotaLeases, quotaUnits, quotaReports, quotaRefusals, quotaErrors *prometheus.CounterVec
	quotaWriteSeconds                                                 prometheus.Histogram
}

// Reasons of sync_refused_total.
const (
	refusedHelloTimeout     = "hello_timeout"
	refusedNotHello         = "not_hello"
	refusedUnauthenticated  = "unauthenticated"
	refusedPermissionDenied = "permission_denied"
	refusedInvalid          = "invalid"
	refusedTooManyStreams   = "too_many_streams"
	refusedTooManyHellos    = "too_many_hellos"
	refusedShutdown         = "shutdown"
)

// NewMetrics returns the control plane's metrics registered on reg, and
// gateways_connected read from dps (nil: not exported). It fails when reg
// is nil or refuses a metric (one already registered under the name).
func NewMetrics(reg prometheus.Registerer, dps *DataPlanes) (*Metrics, error) {
	if reg == nil {
		return nil, errors.New("controlplane: metrics: no registerer")
	}
	name := func(n string) string { return prometheus.BuildFQName("limitplane", "controlplane", n) }
	m := &Metrics{
		revision: prometheus.NewGauge(prometheus.GaugeOpts{Name: name("revision"), Help: "The store's revision."}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("admin_writes_total"),
			Help: "Admin API writes, by result (ok, error)."}, []string{"result"}),
		writeSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: name("admin_write_duration_seconds"),
			Help: "Latency of admin API writes until the store answered, seconds.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		adminRefused: prometheus.NewCounter(prometheus.CounterOpts{Name: name("admin_refused_total"),
			Help: "Admin API calls refused for a missing or wrong bearer token."}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: name("sync_streams"),
			Help: "Open sync streams, including those waiting for their Hello."}),
		streamsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("sync_refused_total"),
			Help: "Sync streams refused or ended before being served, by reason."}, []string{"reason"}),
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("sync_deliveries_total"),
			Help: "Deliveries sent to gateways, by kind (snapshot, changes)."}, []string{"kind"}),
		acks:  prometheus.NewCounter(prometheus.CounterOpts{Name: name("sync_acks_total"), Help: "Acks received from gateways."}),
		nacks: prometheus.NewCounter(prometheus.CounterOpts{Name: name("sync_nacks_total"), Help: "Nacks (rejected deliveries) received from gateways."}),
		quotaLeases: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("quota_leases_total"),
			Help: "Global-quota leases granted, by data-plane group and mode."}, []string{"group", "mode"}),
		quotaUnits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("quota_leased_units_total"),
			Help: "Units of global quotas leased, by data-plane group and mode."}, []string{"group", "mode"}),
		quotaReports: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("quota_reports_total"),
			Help: "Global-quota spend reports applied, by data-plane group and mode."}, []string{"group", "mode"}),
		quotaRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("quota_refusals_total"),
			Help: "Global-quota grant requests and reports refused, by data-plane group and reason (stale_token, unknown_entry)."}, []string{"group", "reason"}),
		quotaErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("quota_call_errors_total"),
			Help: "QuotaService.Lease calls failed as a whole, by gRPC code."}, []string{"code"}),
		quotaWriteSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: name("quota_ledger_write_duration_seconds"),
			Help: "Latency of one Lease call's ledger transaction until committed, seconds.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
	}
	for _, r := range []string{refusedHelloTimeout, refusedNotHello, refusedUnauthenticated, refusedPermissionDenied, refusedInvalid, refusedTooManyStreams, refusedTooManyHellos, refusedShutdown} {
		m.streamsRefused.WithLabelValues(r)
	}
	for _, k := range []string{"snapshot", "changes"} {
		m.deliveries.WithLabelValues(k)
	}
	for _, r := range []string{"ok", "error"} {
		m.writes.WithLabelValues(r)
	}
	cs := []prometheus.Collector{m.revision, m.writes, m.writeSeconds, m.adminRefused, m.streams, m.streamsRefused, m.deliveries, m.acks, m.nacks,
		m.quotaLeases, m.quotaUnits, m.quotaReports, m.quotaRefusals, m.quotaErrors, m.quotaWriteSeconds}
	if dps != nil {
		cs = append(cs, &gatewaysCollector{dps: dps, desc: prometheus.NewDesc(name("gateways_connected"),
			"Gateways with an open sync stream, by group.", []string{"group"}, nil)})
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("controlplane: metrics: %w", err)
		}
	}
	return m, nil
}

// SetRevision sets the revision gauge, in revisions.
func (m *Metrics) SetRevision(rev uint64) {
	if m != nil {
		m.revision.Set(float64(rev))
	}
}

// write records an admin write that took d and ended with err.
func (m *Metrics) write(d time.Duration, rev uint64, err error) {
	if m == nil {
		return
	}
	m.writeSeconds.Observe(d.Seconds())
	if err != nil {
		m.writes.WithLabelValues("error").Inc()
		return
	}
	m.writes.WithLabelValues("ok").Inc()
	m.revision.Set(float64(rev))
}

func (m *Metrics) refusedAdmin() {
	if m != nil {
		m.adminRefused.Inc()
	}
}

func (m *Metrics) streamOpened(delta float64) {
	if m != nil {
		m.streams.Add(delta)
	}
}

func (m *Metrics) refusedStream(reason string) {
	if m != nil {
		m.streamsRefused.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) delivered(snapshot bool) {
	if m == nil {
		return
	}
	if snapshot {
		m.deliveries.WithLabelValues("snapshot").Inc()
	} else {
		m.deliveries.WithLabelValues("changes").Inc()
	}
}

func (m *Metrics) acked(ok bool) {
	if m == nil {
		return
	}
	if ok {
		m.acks.Inc()
	} else {
		m.nacks.Inc()
	}
}

func (m *Metrics) quotaGranted(group, mode string, leases, units int64) {
	if m != nil {
		m.quotaLeases.WithLabelValues(group, mode).Add(float64(leases))
		m.quotaUnits.WithLabelValues(group, mode).Add(float64(units))
	}
}

func (m *Metrics) quotaReported(group, mode string, n int64) {
	if m != nil {
		m.quotaReports.WithLabelValues(group, mode).Add(float64(n))
	}
}

func (m *Metrics) quotaRefused(group, reason string, n int64) {
	if m != nil {
		m.quotaRefusals.WithLabelValues(group, reason).Add(float64(n))
	}
}

func (m *Metrics) quotaCallRefused(code codes.Code) {
	if m != nil {
		m.quotaErrors.WithLabelValues(code.String()).Inc()
	}
}

func (m *Metrics) quotaWrite(d time.Duration) {
	if m != nil {
		m.quotaWriteSeconds.Observe(d.Seconds())
	}
}

// gatewaysCollector exports gateways_connected from DataPlanes.
type gatewaysCollector struct {
	dps  *DataPlanes
	desc *prometheus.Desc
}

func (c *gatewaysCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *gatewaysCollector) Collect(ch chan<- prometheus.Metric) {
	n := map[string]int{}
	for _, dp := range c.dps.List() {
		if dp.Connected {
			n[dp.Group]++
		} else if _, ok := n[dp.Group]; !ok {
			n[dp.Group] = 0
		}
	}
	for g, v := range n {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(v), g)
	}
}
