// Package metrics exports limitplane's decisions as Prometheus metrics
// (github.com/prometheus/client_golang). A Collector is both a
// prometheus.Collector and a core.Observer: register it, and pass it as
// core.Options.Observer.
//
// Labels are bounded by configuration — api, policy, limit (rate, quota,
// none) and result (allowed, denied, shadow_denied, error, canceled: the
// caller's context was canceled while the store decided) — never one value
// per consumer. Store failures are counted apart, by ObserveStoreError
// (pass it as core.Options.OnStoreError): under the open and fallback
// failure policies a failed store call still ends in a decision without
// error, so decisions_total alone does not show an outage.
package metrics

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/limitplane/limitplane/core"
)

// Options configure a Collector.
type Options struct {
	// Namespace prefixes every metric name; default "limitplane".
	Namespace string
	// Keys, if set, reports the number of live limiter keys (for example
	// a *memory.Store) as the <namespace>_keys gauge.
	Keys interface{ Len() int }
	// KeyCap, if set, reports an in-process store's cap on keys and the
	// new keys it refused there (a *memory.Store with Options.MaxKeys) as
	// the <namespace>_keys_max gauge (0 when unbounded) and the
	// <namespace>_keys_refused_total counter: refusals mean new consumers
	// are being turned away while the store is full.
	KeyCap interface {
		MaxKeys() int
		KeysRefused() uint64
	}
	// Buckets are the decision-latency histogram buckets in seconds;
	// default from 10µs to 1s.
	Buckets []float64
}

// Collector counts decisions and their latency.
type Collector struct {
	decisions *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	keys      *Keys
	// storeErrors counts failed store calls.
	storeErrors prometheus.Counter

	// The children of decisions (decisionLabels → prometheus.Counter)
	// and of latency (api → prometheus.Observer) found so far, so that a
	// decision costs a map read instead of WithLabelValues' hashing and
	// locking. They hold what the vectors hold, one entry per label set
	// seen, bounded as the labels are.
	counters  sync.Map
	observers sync.Map
}

// decisionLabels are one child's labels of decisions_total.
type decisionLabels struct {
	api, policy string
	limit       core.Kind
	result      string
}

// New returns a Collector for o.
func New(o Options) *Collector {
	if o.Namespace == "" {
		o.Namespace = "limitplane"
	}
	if o.Buckets == nil {
		o.Buckets = []float64{1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.5, 1}
	}
	c := &Collector{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: o.Namespace, Name: "decisions_total",
			Help: "Rate-limit and quota decisions by API, policy, deciding limit and result (allowed, denied, shadow_denied, error, canceled).",
		}, []string{"api", "policy", "limit", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: o.Namespace, Name: "decision_duration_seconds",
			Help:    "Time to decide one request, store round trip included, by API.",
			Buckets: o.Buckets,
		}, []string{"api"}),
		storeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: o.Namespace, Name: "store_errors_total",
			Help: "Store calls that failed (unreachable, timed out, circuit breaker open), whatever the failure policy then decided.",
		}),
	}
	c.keys = NewKeys(o)
	return c
}

// Keys exports an in-process store's keys on their own: the
// <namespace>_keys gauge for Options.Keys, and for Options.KeyCap the
// <namespace>_keys_max gauge and <namespace>_keys_refused_total counter,
// as a Collector made with the same Options does. It is for a program that
// makes its Collector before it opens its store (the gateway); Options.Buckets
// is not used.
type Keys struct {
	keys    prometheus.GaugeFunc
	keysMax prometheus.GaugeFunc
	refused prometheus.CounterFunc
}

// NewKeys returns the Keys collector for o; with neither Keys nor KeyCap
// set it collects nothing.
func NewKeys(o Options) *Keys {
	if o.Namespace == "" {
		o.Namespace = "limitplane"
	}
	k := &Keys{}
	if o.Keys != nil {
		keys := o.Keys
		k.keys = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: o.Namespace, Name: "keys",
			Help: "Limiter keys currently held in process.",
		}, func() float64 { return float64(keys.Len()) })
	}
	if o.KeyCap != nil {
		kc := o.KeyCap
		k.keysMax = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: o.Namespace, Name: "keys_max",
			Help: "Most limiter keys the in-process store holds; 0 means unbounded.",
		}, func() float64 { return float64(kc.MaxKeys()) })
		k.refused = prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: o.Namespace, Name: "keys_refused_total",
			Help: "Requests refused because they would add a limiter key to a full in-process store.",
		}, func() float64 { return float64(kc.KeysRefused()) })
	}
	return k
}

// Describe implements prometheus.Collector.
func (k *Keys) Describe(ch chan<- *prometheus.Desc) {
	if k.keys != nil {
		k.keys.Describe(ch)
	}
	if k.keysMax != nil {
		k.keysMax.Describe(ch)
		k.refused.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (k *Keys) Collect(ch chan<- prometheus.Metric) {
	if k.keys != nil {
		k.keys.Collect(ch)
	}
	if k.keysMax != nil {
		k.keysMax.Collect(ch)
		k.refused.Collect(ch)
	}
}

// ObserveDecision implements core.Observer.
func (c *Collector) ObserveDecision(api string, d core.Decision, err error, took time.Duration) {
	result := "allowed"
	switch {
	case errors.Is(err, context.Canceled):
		result = "canceled" // the caller went away: no one's error
	case err != nil:
		result = "error"
	case d.Shadowed:
		result = "shadow_denied"
	case !d.Allowed:
		result = "denied"
	}
	k := decisionLabels{api, d.Policy, d.DecidedBy, result}
	n, ok := c.counters.Load(k)
	if !ok {
		// api and the policy may be memory the caller reuses: the key
		// kept has copies (the vector copies its label values too).
		k.api, k.policy = strings.Clone(api), strings.Clone(d.Policy)
		n, _ = c.counters.LoadOrStore(k, c.decisions.WithLabelValues(k.api, k.policy, d.DecidedBy.String(), result))
	}
	n.(prometheus.Counter).Inc()
	o, ok := c.observers.Load(api)
	if !ok {
		api = strings.Clone(api)
		o, _ = c.observers.LoadOrStore(api, c.latency.WithLabelValues(api))
	}
	o.(prometheus.Observer).Observe(took.Seconds())
}

// ObserveStoreError counts one failed store call, as
// <namespace>_store_errors_total; it has core.Options.OnStoreError's
// signature and is safe for concurrent use. err is not recorded (labels
// stay bounded).
func (c *Collector) ObserveStoreError(err error) { c.storeErrors.Inc() }

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	c.decisions.Describe(ch)
	c.latency.Describe(ch)
	c.storeErrors.Describe(ch)
	c.keys.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.decisions.Collect(ch)
	c.latency.Collect(ch)
	c.storeErrors.Collect(ch)
	c.keys.Collect(ch)
}

var (
	_ core.Observer        = (*Collector)(nil)
	_ prometheus.Collector = (*Collector)(nil)
	_ prometheus.Collector = (*Keys)(nil)
)
