package metrics

import "github.com/prometheus/client_golang/prometheus"

// ThresholdStats are a threshold webhook's event counts since it started
// (dataplane/threshold.Notifier.Stats has them).
type ThresholdStats struct {
	// Queued events went into the queue; Dropped found it full.
	Queued, Dropped int64
	// Delivered were answered 2xx; Duplicates were claimed already (by
	// another process, or before a restart) and not sent; Failed were
	// given up after their retries.
	Delivered, Duplicates, Failed int64
}

// Thresholds exports a threshold webhook's counts, read from a function
// at every scrape: <namespace>_threshold_events_total{outcome="queued"|
// "dropped"|"delivered"|"duplicate"|"failed"} (namespace: Options.Namespace,
// default "limitplane"), all five series from the start. Options.Keys,
// KeyCap and Buckets are not used.
type Thresholds struct {
	read   func() ThresholdStats
	events *prometheus.Desc
}

// NewThresholds returns a Thresholds collector that calls read at every
// scrape; read must be safe for concurrent use.
func NewThresholds(o Options, read func() ThresholdStats) *Thresholds {
	if o.Namespace == "" {
		o.Namespace = "limitplane"
	}
	return &Thresholds{read: read, events: prometheus.NewDesc(prometheus.BuildFQName(o.Namespace, "threshold", "events_total"),
		"Quota threshold events by outcome: queued, dropped (the queue full), delivered, duplicate (claimed already), failed (retries given up).",
		[]string{"outcome"}, nil)}
}

// Describe implements prometheus.Collector.
func (t *Thresholds) Describe(ch chan<- *prometheus.Desc) { ch <- t.events }

// Collect implements prometheus.Collector.
func (t *Thresholds) Collect(ch chan<- prometheus.Metric) {
	s := t.read()
	for _, o := range []struct {
		name string
		n    int64
	}{{"queued", s.Queued}, {"dropped", s.Dropped}, {"delivered", s.Delivered}, {"duplicate", s.Duplicates}, {"failed", s.Failed}} {
		ch <- prometheus.MustNewConstMetric(t.events, prometheus.CounterValue, float64(o.n), o.name)
	}
}
