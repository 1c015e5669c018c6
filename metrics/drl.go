package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/limitplane/limitplane/core/drl"
)

// DRL exports a gateway's Distributed Rate Limiter (core/drl) state, its
// drl.Stats read from a function at every scrape (the pattern of Sync;
// drl.Store.Stats is the function). It is a
// prometheus.Collector exporting, under Options.Namespace (default
// "limitplane"):
//
//   - <namespace>_drl_epoch: the epoch of the table in force.
//   - <namespace>_drl_hot_keys: keys decided in memory.
//   - <namespace>_drl_share_rate: the sum of this gateway's rate shares
//     over its hot keys, requests/s.
//   - <namespace>_drl_allocator: 1 while this gateway holds the
//     allocator's lease, else 0.
//   - <namespace>_drl_fallbacks_total: keys that fell back to their floor
//     (a stale table: Redis down, the allocator gone), since start.
//   - <namespace>_drl_tables_total: tables applied since start.
//   - <namespace>_drl_runs_total: runs started since start (drl.Report's
//     Run): the first, then one each time the gateway was cut off from
//     Redis long enough that its report may have expired (2.5 intervals)
//     or a table listed it on another process's run. Each new run runs at
//     its floors until a table for it arrives.
//
// Options.Keys, KeyCap and Buckets are not used.
type DRL struct {
	read                                 func() drl.Stats
	epoch, hotKeys, shareRate, allocator *prometheus.Desc
	fallbacks, tables, runs              *prometheus.Desc
}

// NewDRL returns a DRL collector that calls read at every scrape; read
// must be safe for concurrent use.
func NewDRL(o Options, read func() drl.Stats) *DRL {
	if o.Namespace == "" {
		o.Namespace = "limitplane"
	}
	name := func(n string) string { return prometheus.BuildFQName(o.Namespace, "drl", n) }
	return &DRL{
		read:      read,
		epoch:     prometheus.NewDesc(name("epoch"), "Epoch of the Distributed Rate Limiter's allocation table in force (0: none yet).", nil, nil),
		hotKeys:   prometheus.NewDesc(name("hot_keys"), "Keys this gateway decides in memory against its share.", nil, nil),
		shareRate: prometheus.NewDesc(name("share_rate"), "Sum over the hot keys of this gateway's rate share, requests per second.", nil, nil),
		allocator: prometheus.NewDesc(name("allocator"), "1 while this gateway holds the allocator's lease, else 0.", nil, nil),
		fallbacks: prometheus.NewDesc(name("fallbacks_total"), "Times a key fell back to its floor (stale table: Redis down or the allocator gone).", nil, nil),
		tables:    prometheus.NewDesc(name("tables_total"), "Allocation tables this gateway applied.", nil, nil),
		runs:      prometheus.NewDesc(name("runs_total"), "Runs this gateway started: its first, then one each time it was cut off from Redis long enough for its report to expire.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (d *DRL) Describe(ch chan<- *prometheus.Desc) {
	for _, x := range []*prometheus.Desc{d.epoch, d.hotKeys, d.shareRate, d.allocator, d.fallbacks, d.tables, d.runs} {
		ch <- x
	}
}

// Collect implements prometheus.Collector.
func (d *DRL) Collect(ch chan<- prometheus.Metric) {
	st := d.read()
	alloc := 0.0
	if st.Allocator {
		alloc = 1
	}
	ch <- prometheus.MustNewConstMetric(d.epoch, prometheus.GaugeValue, float64(st.Epoch))
	ch <- prometheus.MustNewConstMetric(d.hotKeys, prometheus.GaugeValue, float64(st.HotKeys))
	ch <- prometheus.MustNewConstMetric(d.shareRate, prometheus.GaugeValue, st.ShareRate)
	ch <- prometheus.MustNewConstMetric(d.allocator, prometheus.GaugeValue, alloc)
	ch <- prometheus.MustNewConstMetric(d.fallbacks, prometheus.CounterValue, float64(st.Fallbacks))
	ch <- prometheus.MustNewConstMetric(d.tables, prometheus.CounterValue, float64(st.Tables))
	ch <- prometheus.MustNewConstMetric(d.runs, prometheus.CounterValue, float64(st.Runs))
}

var _ prometheus.Collector = (*DRL)(nil)
