package metrics_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/limitplane/limitplane/core"
	"github.com/limitplane/limitplane/core/memory"
	"github.com/limitplane/limitplane/metrics"
)

// downStore accepts every limit set and fails every request, as an
// unreachable store does.
type downStore struct{}

func (downStore) Prepare(s core.LimitSet) (*core.Rule, error) { return core.NewRule(s, nil) }
func (downStore) Take(context.Context, core.Request) (core.Decision, error) {
	return core.Decision{}, errors.New("down")
}
func (downStore) ResetQuota(context.Context, string, string, uint64) error { return nil }
func (downStore) Penalize(context.Context, core.Request, time.Duration) error {
	return errors.New("down")
}

func TestMetricsEndpointShowsExactCounts(t *testing.T) {
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour))})
	col := metrics.New(metrics.Options{Keys: store})
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)
	cfg := core.Config{Policies: []core.Policy{
		{ID: "gold", Rate: core.Limit{Rate: 3, Period: time.Minute}},
		{ID: "trial", Rate: core.Limit{Rate: 1, Period: time.Minute}, Shadow: true},
	}}
	eng, err := core.NewEngine(store, cfg, core.Options{Observer: col})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; i < 5; i++ { // 3 allowed, 2 denied
		eng.Decide(ctx, &core.Consumer{ID: "a", Policies: []string{"gold"}}, "orders", 1)
	}
	for i := 0; i < 4; i++ { // 1 allowed, 3 shadow-denied
		eng.Decide(ctx, &core.Consumer{ID: "b", Policies: []string{"trial"}}, "orders", 1)
	}
	down, _ := core.NewEngine(downStore{}, cfg, core.Options{Observer: col, FailurePolicy: core.FailClosed})
	down.Decide(ctx, &core.Consumer{ID: "c", Policies: []string{"gold"}}, "orders", 1)
	gone, cancel := context.WithCancel(ctx)
	cancel() // a client that went away while the store decided
	down.Decide(gone, &core.Consumer{ID: "c", Policies: []string{"gold"}}, "orders", 1)

	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	body := string(b)
	for _, line := range []string{
		`limitplane_decisions_total{api="orders",limit="rate",policy="gold",result="allowed"} 3`,
		`limitplane_decisions_total{api="orders",limit="rate",policy="gold",result="denied"} 2`,
		`limitplane_decisions_total{api="orders",limit="rate",policy="trial",result="allowed"} 1`,
		`limitplane_decisions_total{api="orders",limit="rate",policy="trial",result="shadow_denied"} 3`,
		`limitplane_decisions_total{api="orders",limit="none",policy="",result="error"} 1`,
		`limitplane_decisions_total{api="orders",limit="none",policy="",result="canceled"} 1`,
		`limitplane_decision_duration_seconds_count{api="orders"} 11`,
		`limitplane_keys 2`,
	} {
		if !strings.Contains(body, line+"\n") {
			t.Errorf("scrape lacks %q", line)
		}
	}
	if strings.Contains(body, `"a"`) || strings.Contains(body, `"b"`) {
		t.Error("a consumer ID leaked into a label")
	}
}

// TestKeyCapMetrics: a memory store at its MaxKeys shows its key count,
// its cap and the new keys it refused.
func TestKeyCapMetrics(t *testing.T) {
	store := memory.New(memory.Options{Clock: core.NewManualClock(int64(time.Hour)), MaxKeys: 2})
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.New(metrics.Options{Keys: store, KeyCap: store}))
	rule, err := store.Prepare(core.LimitSet{Rate: core.Limit{Rate: 1, Period: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"a", "b", "c", "d", "e"} {
		store.Take(context.Background(), core.Request{Consumer: c, Rule: rule, Cost: 1})
	}
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, line := range []string{"limitplane_keys 2", "limitplane_keys_max 2", "limitplane_keys_refused_total 3"} {
		if !strings.Contains(string(b), line+"\n") {
			t.Errorf("scrape lacks %q:\n%s", line, b)
		}
	}
}

// TestObserveDecisionConcurrent: 16 goroutines each observe 500
// decisions over two APIs and three outcomes, the label values in memory
// the caller overwrites after each call (as an adapter's reused buffers
// are): every series counts exactly its own, and no series is named by
// overwritten bytes.
func TestObserveDecisionConcurrent(t *testing.T) {
	col := metrics.New(metrics.Options{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)
	outcomes := []struct {
		d   core.Decision
		err error
	}{
		{core.Decision{Allowed: true, Policy: "gold", DecidedBy: core.KindRate}, nil},
		{core.Decision{Policy: "gold", DecidedBy: core.KindQuota}, nil},
		{core.Decision{}, errors.New("down")},
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			buf := []byte("orders")
			for i := range 500 {
				copy(buf, []string{"orders", "photos"}[(g+i)%2])
				o := outcomes[i%3]
				col.ObserveDecision(unsafe.String(&buf[0], len(buf)), o.d, o.err, time.Microsecond)
				copy(buf, "XXXXXX")
			}
		})
	}
	wg.Wait()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			v := m.GetCounter().GetValue()
			if h := m.GetHistogram(); h != nil {
				v = float64(h.GetSampleCount())
			}
			got[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = v
		}
	}
	// Per goroutine, i%3 picks the outcome and (g+i)%2 the API: every
	// API sees 4,000 calls, each (API, outcome) pair its share by the
	// residues, counted here the same way.
	want := map[string]float64{"limitplane_store_errors_total{}": 0}
	for g := range 16 {
		for i := range 500 {
			api := []string{"orders", "photos"}[(g+i)%2]
			name := []string{"api=%s,limit=rate,policy=gold,result=allowed", "api=%s,limit=quota,policy=gold,result=denied", "api=%s,limit=none,policy=,result=error"}[i%3]
			want["limitplane_decisions_total{"+strings.Replace(name, "%s", api, 1)+"}"]++
			want["limitplane_decision_duration_seconds{api="+api+"}"]++
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d series, want %d: %v", len(got), len(want), got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

// BenchmarkObserveDecision: one decision observed, its series known.
func BenchmarkObserveDecision(b *testing.B) {
	col := metrics.New(metrics.Options{})
	d := core.Decision{Allowed: true, Policy: "gold", DecidedBy: core.KindRate}
	b.ReportAllocs()
	for b.Loop() {
		col.ObserveDecision("orders", d, nil, time.Microsecond)
	}
}
